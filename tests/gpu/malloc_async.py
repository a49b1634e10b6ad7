"""PyTorch with backend:cudaMallocAsync (set PYTORCH_CUDA_ALLOC_CONF before start): allocates and
frees GiBs so the pool keeps them, prints "ready <pid>" and waits for a line on stdin."""
from __future__ import annotations

import os
import sys

import torch


def main() -> int:
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    print(f"baseline {os.getpid()}", flush=True)
    sys.stdin.readline()
    gib = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    kept = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(4 * gib)]
    dropped = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(2 * gib)]
    del dropped  # back in the pool, which keeps it (PyTorch sets the release threshold high)
    torch.cuda.synchronize()
    print(f"ready {os.getpid()} {torch.cuda.memory_reserved()}", flush=True)
    sys.stdin.readline()
    del kept
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
