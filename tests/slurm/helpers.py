"""Helpers of the real-Slurm tests whose jobs run tests/c/build/nvtest against the fake CUDA driver,
shared by the test modules that submit them (the nvtest fixture: conftest.py)."""
from __future__ import annotations

import shlex
from pathlib import Path

REPO_C = Path(__file__).resolve().parents[1] / "c"
BUILD = REPO_C / "build"
GPU0 = "GPU-fa4e0000-0000-0000-0000-000000000000"


def submit(cluster, nvtest, trace, actions: str, *extra: str) -> int:
    script = (f"#!/bin/sh\nexport LD_LIBRARY_PATH={shlex.quote(str(BUILD))}\n"
              f"export FAKE_CUDA_TRACE={shlex.quote(str(trace))}\n"
              f"exec {shlex.quote(str(nvtest))} init ctx:0 {actions}\n")
    return cluster.sbatch(script, "-w", "n2", "--gres=nvshare:gpu0:1", *extra)


def kernels(trace) -> list[tuple[int, int, int]]:
    """(pid, start_ns, end_ns) of every kernel on GPU 0, in start order."""
    rows = []
    for line in trace.read_text().splitlines():
        pid, gpu, start, end = line.split()
        if gpu == GPU0:
            rows.append((int(pid), int(start), int(end)))
    return sorted(rows, key=lambda r: r[1])
