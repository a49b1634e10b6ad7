"""A deterministic PyTorch training loop for the GPU tests and benchmarks.

Every batch is drawn on the GPU from a seeded CUDA generator (--data gpu, the default): the host
only launches work, so a compute-bound job keeps the GPU saturated and a bursty job's busy fraction
is set by its sleep, not by the CPU making data. --data cpu makes each batch on the host and copies
it over, as a CPU data loader would (and as the tier-4 tests were timed). Same seed and arguments,
same losses, bit for bit (deterministic algorithms, no TF32, a fixed cuBLAS workspace). A ballast
(--mem-gb) is rewritten every step, so the job really uses that memory. --grow-gb G --grow-steps K
adds G GiB more in K pieces, one at each of the first K steps, as a caching allocator's memory grows
while a training warms up (issue 39: a holder's allocations must not wait for a waiter's prefetch).

Prints one JSON document: the loss of every step as a float.hex() string (bit-exact comparison),
each step's start and end time (time.time()), and what the run measured of itself.

  python train.py --steps 200 --width 1024 [--model mlp|transformer] [--depth 4] [--batch 256]
                  [--sleep-ms 0 | --busy-fraction F] [--mem-gb 0] [--seed 1234] [--out FILE]
                  [--data gpu|cpu] [--max-seconds S] [--progress FILE] [--grow-gb G --grow-steps K]
                  [--precision fp32|tf32|bf16] [--duty RUN:IDLE]

--precision: fp32 (the default: no TF32, every GEMM in full fp32, bit-exact), tf32 (TF32 tensor cores for
matmuls and convolutions) or bf16 (the forward pass and loss under torch.autocast in bfloat16, the weights
and optimizer in fp32: mixed precision as most trainings run). The GEMMs of one model are several times
shorter in tf32 and bf16 (issue 42: what a command typed beside the training waits for).

--busy-fraction F runs the first steps without sleeping, takes their median time as the GPU time of
a step, then sleeps after every step so that the GPU is busy about F of the time; the JSON says
which sleep that was and which fraction it reached.

Milestones for the benchmarks that time a job's start (scripts/gpu-suspend-bench.sh): t_launch
(the script started, before torch is imported), t_cuda (the model is on the GPU: its first copies
and kernels done) and t_ballast (the ballast allocated and filled: the job has its memory and has
run a kernel on it; null without --mem-gb), all time.time(). --progress FILE: the number of steps
done and the time, rewritten every 10 steps, so that a caller can act while the job trains.
--duty RUN:IDLE (seconds) trains in phases: RUN seconds of steps, then IDLE seconds with no GPU work
(its memory kept), again and again; the JSON's "idle" lists each idle phase's [begin, end] (time.time()).
A server measured beside it has requests beside the training and beside the idle training in the same
run, interleaved (bench_mixes.py --duty): slow and fast stretches of the host fall on both alike.
--kernel-trace FILE records the GPU work from step 10 on (bench/kernel_trace.py; bench/kernel_overlap.py
lays it beside a server's).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

T_LAUNCH = time.time()

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402  (after the cuBLAS setting)
import torch.nn.functional as F  # noqa: E402


class Block(torch.nn.Module):
    """A pre-norm transformer block. Attention is spelled out because the fused kernels'
    backward passes are not deterministic."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.fc1 = torch.nn.Linear(width, 4 * width)
        self.fc2 = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(torch.nn.Module):
    def __init__(self, width: int, depth: int, heads: int):
        super().__init__()
        self.blocks = torch.nn.Sequential(*[Block(width, heads) for _ in range(depth)])
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


def build_model(args) -> torch.nn.Module:
    if args.model == "transformer":
        return Transformer(args.width, args.depth, args.heads)
    layers = []
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10))


def ballast_intact(ballast, grown=()) -> bool | None:
    """Whether the ballast (and what grew) still holds its 1.0s (it may have been swapped out and
    back)."""
    pieces = ([ballast] if ballast is not None else []) + list(grown)
    if not pieces:
        return None
    for piece in pieces:
        lo, hi = torch.aminmax(piece)  # no ballast-sized temporary, unlike ballast == 1.0
        if not (lo.item() == 1.0 and hi.item() == 1.0):
            return False
    return True


def parse_duty(text: str) -> tuple | None:
    """--duty RUN:IDLE as (run_s, idle_s); () for none; None if malformed."""
    if not text:
        return ()
    try:
        run, idle = (float(x) for x in text.split(":"))
    except ValueError:
        return None
    return (run, idle) if run > 0 and idle > 0 and math.isfinite(run + idle) else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256, help="transformer: tokens per sample")
    ap.add_argument("--heads", type=int, default=16, help="transformer: attention heads")
    ap.add_argument("--sleep-ms", type=float, default=0.0, help="host think time per step (bursty job)")
    ap.add_argument("--busy-fraction", type=float, default=0.0,
                    help="sleep so that the GPU is busy this fraction of the time (0 < F < 1)")
    ap.add_argument("--mem-gb", type=float, default=0.0, help="extra device memory to hold (ballast)")
    ap.add_argument("--grow-gb", type=float, default=0.0, help="more memory, grown over --grow-steps")
    ap.add_argument("--grow-steps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--data", choices=("gpu", "cpu"), default="gpu",
                    help="where batches are drawn: on the GPU, or on the host and copied over")
    ap.add_argument("--max-seconds", type=float, default=0.0,
                    help="stop after this many seconds of training even if steps remain (0: never)")
    ap.add_argument("--device", default="cuda", help="cuda (cpu only to smoke-test this script)")
    ap.add_argument("--progress", default="", help="rewrite 'STEPS TIME' in this file every 10 steps")
    ap.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default="fp32",
                    help="fp32, TF32 matmuls, or bf16 autocast (mixed precision)")
    ap.add_argument("--kernel-trace", default="", metavar="FILE",
                    help="the GPU work from step 10 on, times since the epoch (bench/kernel_trace.py)")
    ap.add_argument("--duty", default="", metavar="RUN:IDLE",
                    help="seconds of steps, then seconds idle, in turn (a server's A/B in one run)")
    ap.add_argument("--out", default="-")
    args = ap.parse_args()
    if not 0.0 <= args.busy_fraction < 1.0:
        ap.error("--busy-fraction must be in [0, 1)")
    duty = parse_duty(args.duty)
    if duty is None:
        ap.error(f"--duty {args.duty!r} is not RUN:IDLE, two positive numbers of seconds")

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    dev = torch.device(args.device)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    model = build_model(args).to(dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t_cuda = time.time()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    gen = torch.Generator(device=dev if args.data == "gpu" else "cpu")
    gen.manual_seed(args.seed)
    data_dev = gen.device
    shape = (args.batch, args.seq, args.width) if args.model == "transformer" else (args.batch, args.width)
    ballast = None
    if args.mem_gb > 0:
        ballast = torch.full((int(args.mem_gb * (1 << 30)) // 4,), 1.0, dtype=torch.float32, device=dev)
        sync()
    t_ballast = time.time() if ballast is not None else None
    # --busy-fraction times steps warm..calib; the first steps pay for cuBLAS, the allocator and
    # lazily loaded kernels (the optimizer's momentum path starts on the second step).
    warm = 3
    calib = warm + min(max(3, args.steps // 10), 10) if args.busy_fraction else 0
    sleep_s = args.sleep_ms / 1000.0
    losses, starts, times, durations = [], [], [], []
    grown: list = []
    piece = int(args.grow_gb * (1 << 30)) // max(1, args.grow_steps) // 4
    trace = None
    if args.kernel_trace and dev.type == "cuda":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
        from kernel_trace import KernelTrace
        trace = KernelTrace(args.kernel_trace)
    start = time.time()
    idle: list = []   # --duty: each idle phase's [begin, end]
    phase_from = None
    for step in range(args.steps):
        t0 = time.time()
        if piece and step < args.grow_steps:
            grown.append(torch.full((piece,), 1.0, dtype=torch.float32, device=dev))
        x = torch.randn(shape, generator=gen, device=data_dev).to(dev)
        y = torch.randint(0, 10, (args.batch,), generator=gen, device=data_dev).to(dev)
        with autocast:
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if ballast is not None:
            ballast.mul_(1.0)  # the job keeps using its memory, so it must be resident
        for g in grown:
            g.mul_(1.0)
        losses.append(float(loss.item()).hex())  # .item() waits for the step's GPU work
        t1 = time.time()
        starts.append(t0)
        times.append(t1)
        durations.append(t1 - t0)
        if args.progress and (step + 1) % 10 == 0:
            with open(args.progress + ".tmp", "w") as fh:
                fh.write(f"{step + 1} {t1}\n")
            os.replace(args.progress + ".tmp", args.progress)
        if trace is not None and step + 1 == 10:   # a server's window starts at the 10th step
            trace.start()
        if calib and step + 1 == calib:
            busy = statistics.median(durations[warm:])
            sleep_s = busy * (1.0 - args.busy_fraction) / args.busy_fraction
        if args.max_seconds and t1 - starts[0] >= args.max_seconds:
            break
        if sleep_s and step + 1 < args.steps:
            time.sleep(sleep_s)
        phase_from = phase_from or t0
        if duty and time.time() - phase_from >= duty[0] and step + 1 < args.steps:
            begin = time.time()   # the step's .item() waited for its GPU work: nothing is queued
            time.sleep(duty[1])
            phase_from = time.time()
            idle.append([begin, phase_from])
    if trace is not None:
        trace.stop()
    measured = slice(calib, None) if calib < len(times) else slice(0, None)
    span = times[-1] - starts[measured][0] if times else 0.0
    result = {"pid": os.getpid(), "start": start, "end": time.time(), "losses": losses, "times": times,
              "t_launch": T_LAUNCH, "t_cuda": t_cuda, "t_ballast": t_ballast,
              "step_starts": starts,
              "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else str(dev),
              "precision": args.precision, "sleep_ms": sleep_s * 1000.0,
              "step_ms_median": statistics.median(durations) * 1000.0 if durations else 0.0,
              "busy_fraction": sum(durations[measured]) / span if span > 0 else 1.0, "idle": idle,
              "ballast_ok": ballast_intact(ballast, grown)}
    if trace is not None:
        result["kernel_trace"] = args.kernel_trace
    text = json.dumps(result)
    if args.out == "-":
        print(text)
    else:
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
