"""GPU work of real Slurm jobs under the hook: the fake CUDA driver's trace shows who ran when.

Jobs run tests/c/build/nvtest, which reaches the fake libcuda.so.1 through LD_LIBRARY_PATH; the
TaskProlog gives them LD_PRELOAD and the rest, as for any job. All jobs here ask for n2's typed GRES
`nvshare:gpu0:1`, so they share GPU 0 (the fake driver's device 0).
"""
from __future__ import annotations

import shlex
import time

import pytest

from nvshare_slurm.wire.proto import C

from .cluster import BIN, client, wait_until
from .helpers import BUILD, GPU0, kernels, submit

@pytest.fixture
def gpu0_mode(healthy):
    """Set n2's GPU 0 to a mode for one test; back to the config's auto afterwards."""
    n2 = healthy.nodes["n2"]

    def set_mode(mode: int, switch_ms: int | None = None) -> None:
        changes = {"mode": mode}
        if switch_ms is not None:
            changes.update(switch_mode=C.NVSHARE_SWITCH_FIXED, switch_time_ms=switch_ms)
        client(n2).admin_update(GPU0, **changes)

    yield set_mode
    client(n2).admin_update(GPU0, mode=C.NVSHARE_MODE_AUTO, switch_mode=C.NVSHARE_SWITCH_AUTO)


def overlapping(rows) -> list[tuple]:
    return [(a, b) for a, b in zip(rows, rows[1:], strict=False) if a[0] != b[0] and b[1] < a[2]]


def turns(rows) -> int:
    return 1 + sum(1 for a, b in zip(rows, rows[1:], strict=False) if a[0] != b[0])


def test_serial_mode_runs_two_jobs_one_after_the_other(healthy, jobdir, nvtest, gpu0_mode):
    gpu0_mode(C.NVSHARE_MODE_SERIAL)
    trace = jobdir / "trace"
    jobs = [submit(healthy, nvtest, trace, "burst:50000:10:1") for _ in range(2)]
    for job in jobs:
        assert healthy.wait_job(job, 60) == "COMPLETED", healthy.diagnostics()
    rows = kernels(trace)
    assert len(rows) == 20 and len({r[0] for r in rows}) == 2
    assert overlapping(rows) == [] and turns(rows) == 2, rows


def test_concurrent_mode_makes_two_jobs_alternate(healthy, jobdir, nvtest, gpu0_mode):
    gpu0_mode(C.NVSHARE_MODE_CONCURRENT, switch_ms=300)
    trace, go = jobdir / "trace", jobdir / "go"
    jobs = [submit(healthy, nvtest, trace, f"waitfile:{go} burst:50000:20:1") for _ in range(2)]
    # Both start their kernels once both are clients: on a loaded machine Slurm may start the
    # second job after the first has run its whole second of kernels, and then nothing alternates.
    n2 = healthy.nodes["n2"]

    def clients() -> int:
        jobs_now = client(n2).status(C.NVSHARE_STATUS_JOBS)["jobs"]
        return sum(len(j["clients"]) for j in jobs_now if j["job_id"] in jobs)

    wait_until(lambda: clients() == 2, 60, "both jobs connected", healthy.diagnostics)
    go.touch()
    for job in jobs:
        assert healthy.wait_job(job, 60) == "COMPLETED", healthy.diagnostics()
    rows = kernels(trace)
    assert len(rows) == 40 and overlapping(rows) == []
    assert turns(rows) >= 4, f"{turns(rows)} turns: the jobs did not alternate"


def test_srun_steps_of_a_job_are_separate_clients(healthy, jobdir, nvtest):
    trace = jobdir / "trace"
    step = (f"{BIN}/srun --overlap -n1 {shlex.quote(str(nvtest))} init ctx:0 launch:1000 sync "
            f"sleep:4000")
    script = (f"#!/bin/sh\nexport LD_LIBRARY_PATH={shlex.quote(str(BUILD))}\n"
              f"export FAKE_CUDA_TRACE={shlex.quote(str(trace))}\n{step} &\n{step} &\nwait\n")
    job = healthy.sbatch(script, "-w", "n2", "--gres=nvshare:gpu0:1")
    n2 = healthy.nodes["n2"]

    def steps() -> set[int]:
        jobs = client(n2).status(C.NVSHARE_STATUS_JOBS)["jobs"]
        return {c["step_id"] for j in jobs if j["job_id"] == job for c in j["clients"]}

    seen = wait_until(lambda: steps() if len(steps()) == 2 else None, 30, "both steps connected",
                      healthy.diagnostics)
    assert seen == {0, 1}
    assert healthy.wait_job(job, 60) == "COMPLETED"


def test_scancel_of_the_holder_lets_the_next_job_run(healthy, jobdir, nvtest, gpu0_mode):
    gpu0_mode(C.NVSHARE_MODE_SERIAL)
    trace = jobdir / "trace"
    holder = submit(healthy, nvtest, trace, "burst:100000:300:0")       # 30 s of GPU work
    wait_until(lambda: trace.exists() and kernels(trace), 30, "the holder runs", healthy.diagnostics)
    waiter = submit(healthy, nvtest, trace, "launch:1000:3 sync")
    n2 = healthy.nodes["n2"]
    wait_until(lambda: any(w["job_id"] == waiter for g in client(n2).status()["gpus"]
                           for w in g["waiting"]), 30, "the second job waits", healthy.diagnostics)
    cancelled = time.monotonic_ns()
    healthy.run([BIN / "scancel", str(holder)])
    assert healthy.wait_job(waiter, 30) == "COMPLETED", healthy.diagnostics()
    theirs = [r for r in kernels(trace) if r[0] != kernels(trace)[0][0]]
    assert len(theirs) == 3
    assert theirs[0][1] - cancelled < 5e9, "the waiter started long after the holder was cancelled"


def test_a_prod_job_keeps_the_gpu_beside_a_scavenge_job(healthy, jobdir, nvtest):
    """Partitions map to share classes (cluster.PRIORITY_CLASSES: prod high, scavenge low). A
    compute-bound prod job beside a compute-bound scavenge job on one GPU: the prod job's kernels
    wait at most one short turn (the scavenge kernel in flight), never the scavenge job's turn."""
    trace = jobdir / "trace"
    kernel_us = 20000
    low = submit(healthy, nvtest, trace, f"burst:{kernel_us}:250:0", "-p", "scavenge")
    wait_until(lambda: trace.exists() and kernels(trace), 30, "the scavenge job runs",
               healthy.diagnostics)
    high = submit(healthy, nvtest, trace, f"burst:{kernel_us}:60:0", "-p", "prod")
    assert healthy.wait_job(high, 60) == "COMPLETED", healthy.diagnostics()
    log = healthy.nodes["n2"].log_path.read_text()
    assert f"job {high}: registered for" in log
    assert "class high (partition prod)" in log.split(f"job {high}: registered for")[1].split("\n")[0]
    assert "class low (partition scavenge)" in log.split(f"job {low}: registered for")[1].split("\n")[0]
    assert healthy.wait_job(low, 90) == "COMPLETED", healthy.diagnostics()
    rows = kernels(trace)
    low_pid = rows[0][0]
    high_rows = [r for r in rows if r[0] != low_pid]
    assert len(high_rows) == 60
    gaps_ms = [(b[1] - a[2]) / 1e6 for a, b in zip(high_rows, high_rows[1:], strict=False)]
    assert max(gaps_ms) <= 50, gaps_ms         # one short turn (switch_time_min) at most
    assert sorted(gaps_ms)[len(gaps_ms) // 2] <= 5, gaps_ms
    low_inside = [r for r in rows if r[0] == low_pid and high_rows[0][1] < r[1] < high_rows[-1][2]]
    assert len(low_inside) <= 1, low_inside
