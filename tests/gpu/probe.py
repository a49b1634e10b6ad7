"""An interactive user at a Python prompt beside batch jobs: every --every seconds, a small GPU
command (a matmul of about 1 ms on an H100, then a synchronise), timed from issue to result.

Prints one JSON document: every command's latency in milliseconds ("latencies_ms") and when each
was issued ("starts", epoch seconds, as time.time()).

  python probe.py --seconds 10 --every 0.5 [--size 4096] [--start-delay 3]
"""
import argparse
import json
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--every", type=float, default=0.5)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--start-delay", type=float, default=0.0, help="idle before the first command")
    args = ap.parse_args()
    a = torch.randn(args.size, args.size, device="cuda")
    b = torch.randn(args.size, args.size, device="cuda")
    (a @ b).sum().item()                      # warm-up: context, cuBLAS handle, kernel choice
    time.sleep(args.start_delay)
    latencies, starts = [], []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        starts.append(time.time())
        t0 = time.perf_counter()
        (a @ b).sum().item()
        latencies.append((time.perf_counter() - t0) * 1000)
        time.sleep(args.every)
    print(json.dumps({"latencies_ms": latencies, "starts": starts}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
