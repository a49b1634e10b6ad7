"""Two multi-GPU jobs through real Slurm: `sbatch -n2 --gres=nvshare:2`, one rank per GPU (srun),
each rank an NCCL-like collective loop on the fake driver (its barrier kernel). Without gang turns
they deadlock; with them both complete, and the trace shows whole-job turns."""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from nvshare_slurm.wire.proto import C

from .cluster import BIN, client
from .helpers import BUILD, GPU0

GPU1 = "GPU-fa4e0000-0000-0000-0000-000000000001"
ROUNDS = 40
KERNEL_US = 5000


@pytest.fixture
def short_turns(healthy):
    """n1's GPUs in concurrent mode with 100 ms turns, so the jobs switch often; auto afterwards."""
    n1 = client(healthy.nodes["n1"])
    n1.admin_update("all", mode=C.NVSHARE_MODE_CONCURRENT, switch_mode=C.NVSHARE_SWITCH_FIXED,
                    switch_time_ms=100)
    yield
    n1.admin_update("all", mode=C.NVSHARE_MODE_AUTO, switch_mode=C.NVSHARE_SWITCH_AUTO)


def two_rank_job(cluster, nvtest, trace: Path, started: Path) -> int:
    """A job of two ranks; each rank begins once `started` holds a file of all four ranks of the two
    jobs (it writes its own, and waits 60 s at most): a job's 200 ms of kernels would otherwise end
    before the other job's ranks began where Slurm starts those late (once in CI, under Slurm 24.11:
    one switch on GPU 0)."""
    d = shlex.quote(str(started))
    rank = (f"touch {d}/$SLURM_JOB_ID.$SLURM_PROCID; i=0; "
            f"while [ $(ls {d} | wc -l) -lt 4 ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "
            f"exec {shlex.quote(str(nvtest))} init ctx:$SLURM_PROCID "
            f"barrier:{KERNEL_US}:{ROUNDS}:2:$SLURM_PROCID")
    script = (f"#!/bin/sh\nexport LD_LIBRARY_PATH={shlex.quote(str(BUILD))}\n"
              f"export FAKE_CUDA_TRACE={shlex.quote(str(trace))}\n"
              f"export FAKE_CUDA_BARRIER=/nvshare-slurm-test-$SLURM_JOB_ID\n"
              f"{BIN}/srun -n2 sh -c {shlex.quote(rank)}\n"
              f"status=$?\nrm -f /dev/shm/nvshare-slurm-test-$SLURM_JOB_ID\nexit $status\n")
    return cluster.sbatch(script, "-w", "n1", "-n2", "--gres=nvshare:2")


def rows(trace: Path, job: int) -> list[tuple[int, str, int, int]]:
    out = []
    for line in trace.read_text().splitlines():
        pid, gpu, start, end = line.split()
        out.append((job, gpu, int(start), int(end)))
    return out


def test_two_two_gpu_jobs_of_two_tasks_complete_in_gang_turns(healthy, jobdir, nvtest,
                                                              short_turns):
    traces = {}
    started = jobdir / "started"
    started.mkdir()
    started.chmod(0o777)
    for n in (1, 2):
        trace = jobdir / f"trace{n}"
        traces[two_rank_job(healthy, nvtest, trace, started)] = trace
    for job in traces:
        assert healthy.wait_job(job, 120) == "COMPLETED", healthy.diagnostics()
    kernels = [r for job, trace in traces.items() for r in rows(trace, job)]
    assert len(kernels) == 2 * 2 * ROUNDS
    a, b = traces
    # A gang turn: while a job runs on one GPU, the other job runs on neither GPU.
    for x in kernels:
        for y in kernels:
            if x[0] != y[0]:
                assert x[3] <= y[2] or y[3] <= x[2], f"jobs {a} and {b} overlap: {x} {y}"
    # Each job ran on both GPUs at once (its collectives), and the jobs took turns.
    on0 = sorted((r for r in kernels if r[1] == GPU0), key=lambda r: r[2])
    switches = sum(1 for p, q in zip(on0, on0[1:], strict=False) if p[0] != q[0])
    assert switches >= 2, f"{switches} switches on GPU 0: the jobs did not take turns"
    for job in traces:
        mine = [r for r in kernels if r[0] == job]
        assert {r[1] for r in mine} == {GPU0, GPU1}
    log = healthy.nodes["n1"].log_path.read_text(errors="replace")
    # Both GPUs, in placement order (least loaded first: the second job may get "1,0").
    for job in (a, b):
        assert re.search(rf"job {job}: a gang on GPUs (0,1|1,0)\b", log), log
    assert not [p for p in os.listdir("/dev/shm") if p.startswith("nvshare-slurm-test-")]
