"""A CUDA graph captured with torch.cuda.graph and replayed in a loop, re-captured now and then, the
way torch.compile(mode="reduce-overhead") and vLLM do; prints one JSON line: the replays' outputs'
checksums, whether each matched eager execution, and the capture failures (none expected)."""
from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--pause-in-capture", type=float, default=0.05,
                    help="host seconds inside each capture: long enough for an idle hand-over")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    w = torch.randn(args.width, args.width, device=dev) / args.width ** 0.5
    x_static = torch.randn(256, args.width, device=dev)
    failures, mismatches, sums, times = [], 0, [], []
    for r in range(args.rounds):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on a side stream, as the PyTorch docs ask
            for _ in range(2):
                _ = torch.tanh(x_static @ w) @ w
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                h = torch.tanh(x_static @ w)
                time.sleep(args.pause_in_capture)  # host work mid-capture (tokenizer, Python)
                y_static = h @ w
        except RuntimeError as exc:  # a broken capture: what issue 10 item 1 was about
            failures.append(f"round {r}: {exc}".splitlines()[0])
            torch.cuda.synchronize()
            continue
        for k in range(args.replays):
            x_static.copy_(torch.full_like(x_static, 0.001 * (r * args.replays + k)).sin_())
            graph.replay()
            eager = torch.tanh(x_static @ w) @ w
            if not torch.equal(eager, y_static):
                mismatches += 1
        torch.cuda.synchronize()
        sums.append(float(y_static.double().sum()))
        times.append(time.monotonic())
    print(json.dumps({"failures": failures, "mismatches": mismatches, "sums": sums, "times": times}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
