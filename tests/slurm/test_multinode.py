"""Multi-node jobs through real Slurm (issue 40): two `sbatch -N2 --gres=nvshare:2` jobs over the
session's two nodes, one rank per node (srun), each rank an NCCL-like collective loop on the fake
driver (its barrier kernel: the ranks of a job meet at every round, across the nodes). Each node's
prolog registers the job as multi-node from slurmctld's record; both nodes then run the lower job
id first. Before, each node's scheduler turned on its own and the ranks hung at the collective."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from .cluster import BIN
from .helpers import BUILD

ROUNDS = 40
KERNEL_US = 3000


def two_node_job(cluster, nvtest, jobdir: Path) -> int:
    rank = (f"FAKE_CUDA_TRACE={shlex.quote(str(jobdir))}/trace-$SLURM_JOB_ID-$SLURMD_NODENAME "
            f"exec {shlex.quote(str(nvtest))} init ctx:0 barrier:{KERNEL_US}:{ROUNDS}:2:$SLURM_PROCID")
    script = (f"#!/bin/sh\nexport LD_LIBRARY_PATH={shlex.quote(str(BUILD))}\n"
              f"export FAKE_CUDA_BARRIER=/nvshare-slurm-mn-$SLURM_JOB_ID\n"
              f"{BIN}/srun -N2 -n2 sh -c {shlex.quote(rank)}\n"
              f"status=$?\nrm -f /dev/shm/nvshare-slurm-mn-$SLURM_JOB_ID\nexit $status\n")
    return cluster.sbatch(script, "-N2", "-w", "n1,n2", "--ntasks-per-node=1", "--gres=nvshare:2")


def kernels(jobdir: Path, job: int) -> list[tuple[int, str, str, int, int]]:
    out = []
    for path in jobdir.glob(f"trace-{job}-*"):
        node = path.name.rsplit("-", 1)[1]
        for line in path.read_text().splitlines():
            _, gpu, start, end = line.split()
            out.append((job, node, gpu, int(start), int(end)))
    return out


def test_two_two_node_jobs_finish_and_take_the_same_turns_on_both_nodes(healthy, jobdir, nvtest):
    jobs = [two_node_job(healthy, nvtest, jobdir) for _ in range(2)]
    for job in jobs:
        assert healthy.wait_job(job, 120) == "COMPLETED", healthy.diagnostics()
    rows = [r for job in jobs for r in kernels(jobdir, job)]
    assert len(rows) == 2 * 2 * ROUNDS
    for x in rows:
        for y in rows:
            if x[0] != y[0] and x[1] == y[1] and x[2] == y[2]:
                assert x[4] <= y[3] or y[4] <= x[3], f"jobs overlap on {x[1]} {x[2]}: {x} {y}"
    first, second = sorted(jobs)
    for node in ("n1", "n2"):
        log = healthy.nodes[node].log_path.read_text(errors="replace")
        for job in jobs:
            assert re.search(rf"job {job}: a multi-node job, here on GPUs", log), log[-3000:]
        assert "unresponsive" not in log.split(f"job {first}: a multi-node job")[-1]
        # the lower id ran first on both nodes: its last kernel before the other's first
        mine = [r for r in rows if r[1] == node]
        assert max(r[4] for r in mine if r[0] == first) <= min(r[3] for r in mine if r[0] == second)
