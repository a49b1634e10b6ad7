"""Adaptive sharing through real Slurm (issue 12): an interactive `srun --gres=nvshare...` step
beside a busy `sbatch` job runs its GPU commands at once (co-running), not a turn later. The fake
driver's trace shows when each of the step's kernels started against its own rhythm."""
from __future__ import annotations

import statistics

from .cluster import BIN, wait_until
from .helpers import BUILD, kernels, submit

STEP_PERIOD_NS = (1 + 100) * 1_000_000       # burst:1000:N:100 = a 1 ms kernel every 101 ms


def test_an_srun_step_beside_a_busy_batch_job_waits_for_no_turn(healthy, jobdir, nvtest):
    trace = jobdir / "trace"
    batch = submit(healthy, nvtest, trace, "burst:20000:400:0")     # 8 s of back-to-back kernels
    wait_until(lambda: trace.exists() and len(kernels(trace)) >= 10, 60, "the batch job computes",
               healthy.diagnostics)
    env = dict(healthy.env, LD_LIBRARY_PATH=str(BUILD), FAKE_CUDA_TRACE=str(trace))
    step = healthy.run([BIN / "srun", "-w", "n2", "--gres=nvshare:gpu0:1", str(nvtest), "init",
                        "ctx:0", "burst:1000:30:100"], timeout=90, env=env)
    assert step.returncode == 0 and "done" in step.stdout, step.stdout + step.stderr
    assert healthy.wait_job(batch, 60) == "COMPLETED", healthy.diagnostics()
    rows = kernels(trace)
    batch_pid = rows[0][0]
    batch_rows = [r for r in rows if r[0] == batch_pid]
    step_starts = sorted(r[1] for r in rows if r[0] != batch_pid)
    assert len(step_starts) == 30
    # Only the step's kernels that fell inside the batch job's busy time count.
    busy_until = max(r[2] for r in batch_rows)
    inside = [s for s in step_starts if s < busy_until]
    waits_ms = [max(0, b - a - STEP_PERIOD_NS) / 1e6 for a, b in zip(inside, inside[1:], strict=False)][3:]
    assert len(waits_ms) >= 10, f"the step ran mostly after the batch job: {len(inside)} kernels"
    assert statistics.median(waits_ms) <= 10, waits_ms
    log = healthy.nodes["n2"].log_path.read_text()
    assert "co-runs (busy " in log, log[-3000:]
