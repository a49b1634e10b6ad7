"""Tier 4 on a real GPU: two PyTorch trainings that each need ~60 % of GPU memory share it by swap.

Their memory cannot fit together, so without nvshare the second one runs out of memory. Under the
hook they take turns, the paused one's memory in pinned host memory, and both produce exactly the
losses they produce alone. Swap throughput is compared with pinned copy bandwidth in the same run.
"""
from __future__ import annotations

import re
import statistics
import subprocess
import sys

from .conftest import finish, train_cmd

PINNED_COPY = """
import time, torch
n = 4 << 30
dev = torch.empty(n, dtype=torch.uint8, device="cuda")
host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
for direction in ("out", "in", "out", "in"):
    torch.cuda.synchronize()
    t = time.perf_counter()
    (host.copy_(dev) if direction == "out" else dev.copy_(host))
    torch.cuda.synchronize()
    print(direction, n / (time.perf_counter() - t) / 1e9)
"""


def _pinned_bandwidth() -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", PINNED_COPY], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    best: dict[str, float] = {}
    for line in out.splitlines():
        direction, gbs = line.split()
        best[direction] = max(best.get(direction, 0.0), float(gbs))
    return best


def _swap_rates(stderr: str, direction: str) -> list[tuple[float, float]]:
    """(MiB, GB/s) of each swap the hook logged in one direction, in order."""
    return [(float(m), float(r)) for m, r in
            re.findall(rf"swapped {direction} ([\d.]+) MiB in [\d.]+ ms \(([\d.]+) GB/s[,)]", stderr)]


def test_two_trainings_of_60_percent_share_by_swap_with_identical_losses(gpu_jobs, tmp_path):
    import pynvml
    pynvml.nvmlInit()
    total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    pynvml.nvmlShutdown()
    ballast_gb = f"{0.6 * total / (1 << 30):.1f}"
    args = ("--steps", "400", "--width", "2048", "--batch", "512", "--mem-gb", ballast_gb)
    pinned = _pinned_bandwidth()

    jobs = gpu_jobs(scheduling_mode="concurrent", switch_time_mode="fixed", switch_time_fixed=4.0)
    (ja, ua), (jb, ub) = jobs.register(), jobs.register()
    assert ua == ub
    alone = finish(jobs.popen(train_cmd(*args), ja, ua, hooked=False))

    env_a, env_b = jobs.env(ja, ua), jobs.env(jb, ub)
    for env in (env_a, env_b):
        env["NVSHARE_LOG_LEVEL"] = "debug"
    procs = [subprocess.Popen(train_cmd(*args, "--seed", "1234"), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for env in (env_a, env_b)]
    results, errors = [], []
    for p in procs:
        out, err = p.communicate(timeout=540)
        assert p.returncode == 0, f"exit {p.returncode}\n{err[-4000:]}"
        import json
        results.append(json.loads(out.strip().splitlines()[-1]))
        errors.append(err)
    for res in results:
        assert res["losses"] == alone["losses"], "losses under swap differ from the job alone"
    outs = [_swap_rates(e, "out") for e in errors]
    ins = [_swap_rates(e, "in") for e in errors]
    assert all(outs) and all(ins), "both jobs should have swapped out and in"
    # The first swap-out of a process also pins its host buffers; later ones are pure copies.
    later_out = [r for o in outs for _, r in o[1:] if _ > 1024]
    later_in = [r for i in ins for _, r in i if _ > 1024]
    report = {"pinned_gbs": pinned, "swap_out_gbs": later_out, "swap_in_gbs": later_in,
              "swaps": [len(o) for o in outs]}
    print("swap report", report)
    (tmp_path / "swap-report.txt").write_text(repr(report))
    assert later_out and later_in, report
    assert statistics.median(later_out) >= 0.8 * pinned["out"], report
    assert statistics.median(later_in) >= 0.8 * pinned["in"], report
