"""A PyTorch inference server for bench/bench_mixes.py (issue 42): real models, not burst.c's FMA loops.

  python3 bench/serve_torch.py --model gen|gen-graphs|cnn [--device cuda|cpu] [--mean-ms 30] [--seed 1]
                               [--seconds 6] [--warmup 10] [--tokens 8] [--prompt 32] [--layers 4]
                               [--hidden 768] [--heads 12] [--vocab 32000] [--image 224] [--width 64]
                               [--hold-file F] [--ready-file F] [--wait-file F] [--wait-timeout 30]
                               [--kernel-trace FILE] [--out -]

Models, weights initialised at random from a seed (nothing is downloaded: HF_HUB_OFFLINE=1, the model is
built from its config):
  gen         a small decoder (transformers' LlamaConfig: --layers, --hidden, --heads, --vocab; fp16 on
              a GPU, SDPA attention), batch 1: each request is model.generate(prompt, max_new_tokens=
              --tokens, do_sample=False) from a --prompt-token prompt (min_new_tokens too and no EOS, so
              every request makes exactly --tokens tokens)
  gen-graphs  the same model and requests, decoded as vLLM does: the prompt's prefill runs eagerly into a
              transformers StaticCache, then each further token is one replay of a torch.cuda.CUDAGraph
              captured once of a one-token decode step (static input id, position, attention mask and
              cache; the step writes its greedy token back as the next step's input, so a request is
              --tokens - 1 replays and no host work in between). On the CPU the same step runs eagerly.
              One request before the warm-up is also made with model.generate: "tokens_match_generate"
  cnn         a ResNet-18-like network in plain torch.nn (BasicBlocks [2, 2, 2, 2], --width 64 channels
              first, 1000 classes, eval-mode BatchNorm; fp16 and channels-last on a GPU), batch 1: each
              request copies one --image x --image picture to the device and runs one forward to its class

Requests arrive open-loop at exponential intervals of mean --mean-ms (seeded by --seed: every arm of a
benchmark sees the same arrivals), one at a time: a request that arrives while the last one is served
waits. Its latency is from its arrival to its result on the host (the GPU synchronised). Once the
model is built (on the device), --hold-file holds the rest until that file appears. Then --warmup
requests are served, back to back, outside the numbers (after gen-graphs' capture; cuDNN/cuBLAS
autotuning, the allocator). Then --ready-file is written, and with --wait-file the server waits (at most
--wait-timeout s) for that file to appear (bench_mixes: the training beside it has made its first 10
steps) before its window of --seconds starts; requests arriving in the window are served and counted.

Prints one JSON line with the keys bench_mixes reads from burst.c's serve member: "step_starts" (each
request's service start), "times" (its end), "latencies_ms" (arrival to result), "startup_s" and
"start" (epoch seconds, as time.time()); and "startup_phases_s", "arrivals", "window_start",
"window_end", "service_ms_warm" (the median service time of the warm-up's second half: the load is
that over --mean-ms), "waited_s", "wait_timed_out", "graphs", "tokens_match_generate", the
model's settings, "cpu_ms" (each request's CPU time in the serving thread: a host-bound request slower
for its host shows it) and "steal_s" (the machine's CPU time stolen by a hypervisor in the window).
--kernel-trace FILE records the window's kernels, copies and sets and the CUDA calls
that made them (kernel_trace.py: bench/kernel_overlap.py lays them beside another job's) and adds
"kernel_trace": FILE.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import statistics
import sys
import time

T_LAUNCH = time.time()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402  (after the settings above)
from kernel_trace import KernelTrace  # noqa: E402  (bench/, this script's folder)

MODELS = ("gen", "gen-graphs", "cnn")


# --- the CNN: a ResNet-18-like network, plain torch.nn ----------------------------------------------

class BasicBlock(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            torch.nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(torch.nn.Module):
    def __init__(self, width: int = 64, classes: int = 1000):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, width, 7, 2, 3, bias=False),
                                        torch.nn.BatchNorm2d(width), torch.nn.ReLU(inplace=True),
                                        torch.nn.MaxPool2d(3, 2, 1))
        layers, cin = [], width
        for i in range(4):
            cout = width * 2 ** i
            layers += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = torch.nn.Sequential(*layers)
        self.fc = torch.nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


class CnnServer:
    def __init__(self, args, dev: torch.device, dtype: torch.dtype):
        self.dev = dev
        model = ResNet18(args.width).eval()
        with torch.no_grad():   # BatchNorm statistics that keep activations in range
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_var.uniform_(0.5, 1.5)
                    m.running_mean.normal_(0, 0.1)
        self.model = model.to(dev, dtype)
        gen = torch.Generator().manual_seed(args.seed)
        self.images = torch.randn((8, 1, 3, args.image, args.image), generator=gen).to(dtype)
        if dev.type == "cuda":
            self.model = self.model.to(memory_format=torch.channels_last)
            self.images = self.images.pin_memory()
            torch.backends.cudnn.benchmark = True   # batch 1, one shape: tuned once in the warm-up
        self.n = 0
        self.settings = {"width": args.width, "image": args.image, "dtype": str(dtype).replace("torch.", "")}

    def prepare(self) -> None:
        pass

    def request(self) -> int:
        x = self.images[self.n % len(self.images)].to(self.dev, non_blocking=True)
        if self.dev.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        self.n += 1
        return int(self.model(x).argmax(-1).item())   # .item(): the result on the host


# --- the decoder: transformers, weights from a seed -------------------------------------------------

def load_transformers():
    try:
        import transformers
        from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        raise SystemExit(f"serve_torch: --model gen and gen-graphs need transformers ({exc})") from exc
    transformers.logging.set_verbosity_error()
    return transformers, GenerationConfig, LlamaConfig, LlamaForCausalLM


def static_cache_class():
    """transformers' StaticCache (transformers.cache_utils; older releases also export it at the top)."""
    try:
        from transformers.cache_utils import StaticCache
        return StaticCache
    except ImportError:
        pass
    try:
        from transformers import StaticCache
        return StaticCache
    except ImportError as exc:
        import transformers
        raise SystemExit(f"serve_torch: --model gen-graphs needs transformers' StaticCache, which "
                         f"transformers {transformers.__version__} does not have ({exc})") from exc


def make_static_cache(cls, config, max_len: int, dev: torch.device, dtype: torch.dtype):
    """StaticCache(config, max_cache_len): transformers 5 allocates it lazily on the first update (the
    prefill); 4.x wants the batch size, device and dtype up front, under names that changed."""
    params = inspect.signature(cls.__init__).parameters
    kwargs: dict = {"max_cache_len": max_len}
    if "max_batch_size" in params:
        kwargs["max_batch_size"] = 1
    elif "batch_size" in params:
        kwargs["batch_size"] = 1
    if "device" in params:
        kwargs["device"] = dev
    if "dtype" in params:
        kwargs["dtype"] = dtype
    try:
        return cls(config=config, **kwargs)
    except TypeError as exc:
        raise SystemExit(f"serve_torch: this transformers' StaticCache takes none of the arguments "
                         f"tried ({', '.join(kwargs)}): {exc}") from exc


class GenServer:
    def __init__(self, args, dev: torch.device, dtype: torch.dtype):
        _tf, GenerationConfig, LlamaConfig, LlamaForCausalLM = load_transformers()
        self.dev, self.dtype, self.graphs = dev, dtype, args.model == "gen-graphs" and dev.type == "cuda"
        config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                             intermediate_size=(args.hidden * 8 // 3 + 63) // 64 * 64,
                             num_hidden_layers=args.layers, num_attention_heads=args.heads,
                             num_key_value_heads=args.heads,
                             max_position_embeddings=4 * (args.prompt + args.tokens),
                             bos_token_id=None, eos_token_id=None, pad_token_id=0, use_cache=True)
        config._attn_implementation = "sdpa"
        torch.manual_seed(args.seed)
        with dev:   # initialised where it runs: seconds less than on the host and a copy
            self.model = LlamaForCausalLM(config).to(dev, dtype).eval()
        self.prompt_len, self.tokens = args.prompt, args.tokens
        self.gen_config = GenerationConfig(max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                                           do_sample=False, num_beams=1, eos_token_id=None, pad_token_id=0,
                                           bos_token_id=None)
        self.prompts = torch.Generator().manual_seed(args.seed)
        self.vocab = args.vocab
        self.settings = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                         "vocab": args.vocab, "prompt": args.prompt, "tokens": args.tokens,
                         "dtype": str(dtype).replace("torch.", ""),
                         "params_M": round(sum(p.numel() for p in self.model.parameters()) / 1e6, 1)}
        self.match: bool | None = None
        self.static: StaticDecoder | None = None
        self.model_name = args.model

    def prepare(self) -> None:
        """gen-graphs: the static cache, the graph's capture, and one request both ways."""
        if self.model_name == "gen-graphs":
            self.static = StaticDecoder(self.model, self.prompt_len, self.tokens, self.dev, self.dtype,
                                        self.graphs)
            prompt = self.prompt()
            self.match = bool(torch.equal(self.static.generate(prompt).cpu(), self.generate(prompt).cpu()))

    def prompt(self) -> torch.Tensor:
        return torch.randint(0, self.vocab, (1, self.prompt_len), generator=self.prompts).to(self.dev)

    def generate(self, prompt: torch.Tensor) -> torch.Tensor:
        return self.model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                   generation_config=self.gen_config)

    def request(self) -> int:
        prompt = self.prompt()
        out = self.static.generate(prompt) if self.static is not None else self.generate(prompt)
        return int(out[0, -1].item())   # .item(): the last token on the host


class StaticDecoder:
    """Greedy decoding into a StaticCache: an eager prefill, then one-token decode steps, each a replay
    of one CUDA graph (graphs=False: the same step, run eagerly). The step's inputs live in static
    tensors: the token id, its position, the attention mask over the cache (computed in the step from
    the position) and the sequence so far; the step writes its token into the sequence and as the next
    step's input, and advances the position, so replays follow each other with nothing in between."""

    def __init__(self, model, prompt_len: int, tokens: int, dev, dtype, graphs: bool):
        self.model, self.prompt_len, self.tokens = model, prompt_len, tokens
        length = prompt_len + tokens
        self.cache = make_static_cache(static_cache_class(), model.config, length, dev, dtype)
        # transformers 4 places a step's keys and values at cache_position; 5 counts them in the cache
        self.cache_position = "cache_position" in inspect.signature(model.forward).parameters
        self.ids = torch.zeros((1, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((1, 1), dtype=torch.long, device=dev)
        self.mask = torch.zeros((1, 1, 1, length), dtype=torch.bool, device=dev)
        self.arange = torch.arange(length, device=dev).view(1, 1, 1, length)
        self.seq = torch.zeros((1, length), dtype=torch.long, device=dev)
        self.graph = None
        if graphs:
            self.capture()

    def step(self) -> None:
        torch.le(self.arange, self.pos.view(1, 1, 1, 1), out=self.mask)   # attend to positions <= pos
        extra = {"cache_position": self.pos.view(1)} if self.cache_position else {}
        logits = self.model(input_ids=self.ids, position_ids=self.pos, attention_mask=self.mask,
                            past_key_values=self.cache, use_cache=True, **extra).logits
        token = logits[:, -1:].argmax(-1)
        self.seq.scatter_(1, self.pos + 1, token)
        self.ids.copy_(token)
        self.pos.add_(1)

    def prefill(self, prompt: torch.Tensor) -> None:
        self.cache.reset()
        n = prompt.shape[1]
        positions = torch.arange(n, device=prompt.device)
        extra = {"cache_position": positions} if self.cache_position else {}
        logits = self.model(input_ids=prompt, position_ids=positions.view(1, n), past_key_values=self.cache,
                            use_cache=True, **extra).logits
        token = logits[:, -1:].argmax(-1)
        self.seq[:, :n].copy_(prompt)
        self.seq[:, n:n + 1].copy_(token)
        self.ids.copy_(token)
        self.pos.fill_(n)

    def generate(self, prompt: torch.Tensor) -> torch.Tensor:
        self.prefill(prompt)
        for _ in range(self.tokens - 1):
            if self.graph is None:
                self.step()
            else:
                self.graph.replay()
        return self.seq[:, :self.prompt_len + self.tokens]

    def capture(self) -> None:
        warm = torch.zeros((1, self.prompt_len), dtype=torch.long, device=self.ids.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):   # warm-up off the capture stream, as torch.cuda.graphs asks
            for _ in range(2):
                self.prefill(warm)
                for _ in range(3):
                    self.step()
        torch.cuda.current_stream().wait_stream(side)
        self.prefill(warm)   # the cache allocated and filled; the replays start from any prefill
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()
        torch.cuda.synchronize()


# --- the server loop ---------------------------------------------------------------------------------

def steal_s() -> float | None:
    """The machine's stolen CPU time so far (/proc/stat: a hypervisor running others on its CPUs), in
    seconds, or None where it cannot be read."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" else None
    except (OSError, IndexError, ValueError):
        return None


def wait_for(path: str, timeout: float) -> tuple[float, bool]:
    """Wait until path exists, at most timeout seconds: (seconds waited, whether it timed out)."""
    t = time.perf_counter()
    while not os.path.exists(path):
        if time.perf_counter() - t > timeout:
            return time.perf_counter() - t, True
        time.sleep(0.02)
    return time.perf_counter() - t, False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS, required=True)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to check this script without a GPU")
    ap.add_argument("--mean-ms", type=float, default=30.0, help="mean interval between arrivals")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=6.0, help="the measured window")
    ap.add_argument("--warmup", type=int, default=10, help="requests served before the window")
    ap.add_argument("--tokens", type=int, default=8, help="gen: new tokens per request")
    ap.add_argument("--prompt", type=int, default=32, help="gen: prompt tokens")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--image", type=int, default=224, help="cnn: picture side")
    ap.add_argument("--width", type=int, default=64, help="cnn: channels of the first stage")
    ap.add_argument("--hold-file", default="", help="once the model is built, wait for this file before "
                    "the warm-up (bench_mixes' serial arm: the training alone has ended)")
    ap.add_argument("--hold-timeout", type=float, default=600.0)
    ap.add_argument("--ready-file", default="", help="written once the warm-up is done")
    ap.add_argument("--wait-file", default="", help="start the window once this file exists")
    ap.add_argument("--wait-timeout", type=float, default=30.0)
    ap.add_argument("--kernel-trace", default="", metavar="FILE",
                    help="the window's GPU work and CUDA calls, times since the epoch (kernel_trace.py)")
    ap.add_argument("--out", default="-")
    args = ap.parse_args()
    if args.mean_ms <= 0 or args.seconds <= 0 or args.tokens < 1 or args.prompt < 1 or args.warmup < 1:
        ap.error("--mean-ms and --seconds must be above 0, --tokens, --prompt and --warmup at least 1")

    t_import = time.time()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("serve_torch: no CUDA device (--device cpu checks this script without one)")
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.set_grad_enabled(False)
    with torch.inference_mode():
        server = CnnServer(args, dev, dtype) if args.model == "cnn" else GenServer(args, dev, dtype)
        t_model = time.time()
        held = wait_for(args.hold_file, args.hold_timeout)[0] if args.hold_file else 0.0
        t_held = time.time()
        server.prepare()
        warm = []
        for _ in range(args.warmup):
            t = time.perf_counter()
            server.request()
            sync()
            warm.append((time.perf_counter() - t) * 1000)
        t_ready = time.time()
        if args.ready_file:
            with open(args.ready_file + ".tmp", "w") as fh:
                fh.write(f"{t_ready}\n")
            os.replace(args.ready_file + ".tmp", args.ready_file)
        waited, timed_out = wait_for(args.wait_file, args.wait_timeout) if args.wait_file else (0.0, False)

        rng = random.Random(args.seed)
        trace = KernelTrace(args.kernel_trace if dev.type == "cuda" else "", host=True)
        trace.start()
        offset = time.time() - time.perf_counter()   # perf_counter -> epoch seconds
        w0 = time.perf_counter()
        w1 = w0 + args.seconds
        arrival = w0
        arrivals, starts, ends, lat, cpu = [], [], [], [], []
        steal0 = steal_s()
        while True:
            arrival += rng.expovariate(1.0 / args.mean_ms) / 1000
            if arrival >= w1:
                break
            now = time.perf_counter()
            if arrival > now:
                time.sleep(arrival - now)
            t0, c0 = time.perf_counter(), time.thread_time()
            server.request()
            sync()
            t1 = time.perf_counter()
            cpu.append((time.thread_time() - c0) * 1000)
            arrivals.append(arrival)
            starts.append(t0)
            ends.append(t1)
            lat.append((t1 - arrival) * 1000)
        w_end = max(w1, ends[-1]) if ends else w1
        steal1 = steal_s()
        trace.stop()

    half = warm[len(warm) // 2:]
    result = {"model": args.model, "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
              "pid": os.getpid(), "start": T_LAUNCH, "startup_s": t_ready - T_LAUNCH,
              "startup_phases_s": {"import": round(t_import - T_LAUNCH, 3),
                                   "model": round(t_model - t_import, 3), "held": round(held, 3),
                                   "warmup": round(t_ready - t_held, 3)},   # gen-graphs: the capture too
              "window_start": round(w0 + offset, 6), "window_end": round(w_end + offset, 6),
              "seconds": args.seconds,
              "mean_ms": args.mean_ms, "seed": args.seed, "waited_s": waited, "wait_timed_out": timed_out,
              "service_ms_warm": statistics.median(half), "warmup_ms": [round(x, 3) for x in warm],
              "graphs": bool(getattr(getattr(server, "static", None), "graph", None) is not None),
              "tokens_match_generate": getattr(server, "match", None),
              "settings": server.settings, "torch": torch.__version__,
              "arrivals": [round(a + offset, 6) for a in arrivals],
              "step_starts": [round(s + offset, 6) for s in starts],
              "times": [round(e + offset, 6) for e in ends],
              "latencies_ms": [round(x, 3) for x in lat], "cpu_ms": [round(x, 3) for x in cpu],
              "steal_s": None if steal0 is None or steal1 is None else round(steal1 - steal0, 3)}
    if args.kernel_trace and dev.type == "cuda":
        result["kernel_trace"] = args.kernel_trace
    if args.model != "cnn":
        import transformers
        result["transformers"] = transformers.__version__
    text = json.dumps(result)
    if args.out == "-":
        print(text)
    else:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
