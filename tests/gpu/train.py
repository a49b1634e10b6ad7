"""A deterministic PyTorch training loop for the GPU tests and benchmarks.

Prints one JSON document: the loss of every step as a float.hex() string (bit-exact comparison) and
each step's end time (time.time()), so a test can compare losses and read a timeline.
  python train.py --steps 200 --width 1024 [--sleep-ms 0] [--mem-gb 0] [--out FILE]
"""
import argparse
import json
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--sleep-ms", type=float, default=0.0, help="host think time per step (bursty job)")
    ap.add_argument("--mem-gb", type=float, default=0.0, help="extra device memory to hold (ballast)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", default="-")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    layers = []
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    ballast = None
    if args.mem_gb > 0:
        ballast = torch.ones(int(args.mem_gb * (1 << 30)) // 4, dtype=torch.float32, device=dev)
    losses, times = [], []
    start = time.time()
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.width, generator=gen).to(dev)
        y = torch.randint(0, 10, (args.batch,), generator=gen).to(dev)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if ballast is not None:
            ballast.add_(0.0)  # touch the ballast so it must be resident
        losses.append(float(loss.item()).hex())
        times.append(time.time())
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000.0)
    result = {"pid": os.getpid(), "start": start, "end": time.time(), "losses": losses,
              "times": times, "device": torch.cuda.get_device_name(0)}
    text = json.dumps(result)
    if args.out == "-":
        print(text)
    else:
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
