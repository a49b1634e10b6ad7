"""Multi-node jobs that share GPUs (issue 40): each node's nvshare-scheduler decides turns for its
own GPUs, and the ranks of a multi-node job meet at every step (NCCL all-reduce).

Two schedulers stand for two nodes (n1, n2), one fake GPU each; each job has one rank on each,
every rank its own nvtest process running `barrier:` rounds: the fake driver's barrier kernel runs
until both ranks of its job launched it. Before, the two nodes' turns drifted apart within one
switch: one node gave the GPU to job X while the other gave it to Y, each rank spun in its
collective waiting for its peer, the holders' drains never ended, and a revoked holder ran ungated
beside the other job (0 of 2 jobs finished in 120 s). Now the clients of a multi-node job
(registered with NVSHARE_JOB_MULTINODE) take their turns in the job-id order of multi-node jobs on
every node: the lowest id runs on all its nodes, the others wait.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from conftest import become
from helpers_daemon import NOBODY
from helpers_hook import Job, finish, read_trace, start_nvtest

ROUNDS = 60
KERNEL_US = 2000


def nodes(scheduler_factory, n: int, **settings):
    return [scheduler_factory(**settings) for _ in range(n)]


def start_job(hook_lib, procs, scheds, job_id, trace, group, rank_nodes, rounds=ROUNDS,
              stagger=0.0, uid=None):
    """One rank of job_id on each node in rank_nodes (indices into scheds), registered there as a
    multi-node job (of `uid`, its ranks running as that user); returns {pid: (job_id, node)}."""
    ranks = len(rank_nodes)
    started = {}
    for rank, node in enumerate(rank_nodes):
        job = Job(scheds[node], job_id, trace, gpu_index=[0], multinode=True, uid=uid,
                  FAKE_CUDA_BARRIER=group)
        proc = start_nvtest(hook_lib, ["init", "ctx:0", f"barrier:{KERNEL_US}:{rounds}:{ranks}:{rank}"],
                            job.env, preexec_fn=(lambda: become(uid)) if uid else None)
        procs.append(proc)
        started[proc.pid] = (job_id, node)
        time.sleep(stagger)
    return started


def finish_jobs(procs, pid_where, scheds, timeout=60):
    """Wait for every job's ranks, in job-id order, and unregister each job on all its nodes once
    its ranks have ended, as Slurm's epilog does: a multi-node job keeps its place in the order
    from its prolog to its epilog, so that ranks which start late never find another multi-node
    job's rank in a collective on their GPU."""
    for job_id in sorted({job for job, _ in pid_where.values()}):
        for proc in (p for p in procs if pid_where[p.pid][0] == job_id):
            try:
                out = finish(proc, timeout=timeout)
            except AssertionError as exc:
                logs = "\n".join(f"--- node {n}:\n{s.log()[-4000:]}" for n, s in enumerate(scheds))
                raise AssertionError(f"{exc}\n{logs}") from None
            assert "barrier ok rounds=" in out
        for node in {n for job, n in pid_where.values() if job == job_id}:
            scheds[node].client().unregister_job(job_id)


def overlapping(rows, pid_where):
    """Kernels of two different jobs that ran at the same time on the same node's GPU."""
    bad = []
    by_node: dict[int, list] = {}
    for row in rows:
        by_node.setdefault(pid_where[row[0]][1], []).append(row)
    for node_rows in by_node.values():
        node_rows.sort(key=lambda r: r[2])
        for i, a in enumerate(node_rows):
            for b in node_rows[i + 1:]:
                if b[2] >= a[3]:
                    break
                if pid_where[a[0]][0] != pid_where[b[0]][0]:
                    bad.append((a, b))
    return bad


@pytest.mark.parametrize("settings", [{}, {"scheduling_mode": "concurrent",
                                           "switch_time_mode": "fixed", "switch_time_fixed": 0.05,
                                           "drop_grace_sec": 2.0}],
                         ids=["defaults", "concurrent-50ms"])
@pytest.mark.parametrize("order", ["same", "opposite"])
@pytest.mark.parametrize("users", ["one-uid", "two-uids"])
def test_two_two_node_jobs_finish_without_overlap(hook_lib, scheduler_factory, procs, groups,
                                                  settings, order, users):
    """Both jobs of one user, or the second of another (nobody): before, a revoked holder's user
    was benched for 30 s, then 60 s, which with one user stopped both jobs."""
    scheds = nodes(scheduler_factory, 2, **settings)
    shared = Path(tempfile.mkdtemp(prefix="nvs-mn-", dir="/tmp"))   # the ranks of both users write
    shared.chmod(0o777)
    traces = [shared / "trace-601", shared / "trace-602"]
    for trace in traces:
        trace.touch(mode=0o666)
        trace.chmod(0o666)
    began = time.monotonic()
    pid_where = {}
    # "opposite": X's rank starts first on n1, Y's first on n2 (each node sees the other first).
    pid_where |= start_job(hook_lib, procs, scheds, 601, traces[0], groups(601), [0, 1])
    pid_where |= start_job(hook_lib, procs, scheds, 602, traces[1], groups(602),
                           [0, 1] if order == "same" else [1, 0],
                           uid=NOBODY if users == "two-uids" else None)
    finish_jobs(procs, pid_where, scheds)
    elapsed = time.monotonic() - began
    rows = read_trace(traces[0]) + read_trace(traces[1])
    shutil.rmtree(shared, ignore_errors=True)
    assert len(rows) == 4 * ROUNDS
    assert overlapping(rows, pid_where) == []
    # one job alone: ROUNDS collectives of 2 ms; two one after the other, with the processes'
    # start: well within 2.5 s on a loaded machine (before: no end in 60 s)
    assert elapsed < 2.5 + 4 * ROUNDS * KERNEL_US / 1e6, elapsed
    for sched in scheds:
        log = sched.log()
        assert "UNRESPONSIVE" not in log and "unresponsive" not in log, log[-2000:]


def test_four_two_node_jobs_on_the_same_two_nodes(hook_lib, scheduler_factory, tmp_path, procs,
                                                 groups):
    scheds = nodes(scheduler_factory, 2)
    trace = tmp_path / "trace"
    pid_where = {}
    for n, job_id in enumerate((611, 612, 613, 614)):
        pid_where |= start_job(hook_lib, procs, scheds, job_id, trace, groups(job_id),
                               [0, 1] if n % 2 else [1, 0], rounds=30)
    finish_jobs(procs, pid_where, scheds)
    rows = read_trace(trace)
    assert len(rows) == 8 * 30 and overlapping(rows, pid_where) == []


def test_two_four_node_jobs(hook_lib, scheduler_factory, tmp_path, procs, groups):
    scheds = nodes(scheduler_factory, 4)
    trace = tmp_path / "trace"
    pid_where = start_job(hook_lib, procs, scheds, 621, trace, groups(621), [0, 1, 2, 3], rounds=30)
    pid_where |= start_job(hook_lib, procs, scheds, 622, trace, groups(622), [3, 2, 1, 0], rounds=30)
    finish_jobs(procs, pid_where, scheds)
    rows = read_trace(trace)
    assert len(rows) == 8 * 30 and overlapping(rows, pid_where) == []


def test_a_two_node_job_beside_single_node_jobs_on_one_of_its_nodes(hook_lib, scheduler_factory,
                                                                    tmp_path, procs, groups):
    """The multi-node job takes turns with the node's own jobs there (they wait on nothing outside
    the node, so its rank's drains always end): every job finishes, no two jobs' kernels overlap,
    and the single-node jobs run while the multi-node job still has work left."""
    scheds = nodes(scheduler_factory, 2, scheduling_mode="concurrent", switch_time_mode="fixed",
                   switch_time_fixed=0.05, drop_grace_sec=2.0)
    trace = tmp_path / "trace"
    pid_where = start_job(hook_lib, procs, scheds, 631, trace, groups(631), [0, 1])
    for job_id in (632, 633):
        job = Job(scheds[0], job_id, trace, gpu_index=[0])
        proc = start_nvtest(hook_lib, ["init", "ctx:0", "burst:3000:25:0"], job.env)
        procs.append(proc)
        pid_where[proc.pid] = (job_id, 0)
    for proc in procs:
        finish(proc, timeout=60)
    rows = read_trace(trace)
    assert len(rows) == 2 * ROUNDS + 2 * 25
    assert overlapping(rows, pid_where) == []
    multinode_end = max(r[3] for r in rows if pid_where[r[0]][0] == 631)
    for job_id in (632, 633):
        assert min(r[2] for r in rows if pid_where[r[0]][0] == job_id) < multinode_end
    assert "unresponsive" not in scheds[0].log()


def test_the_order_survives_a_restart_of_one_nodes_scheduler(hook_lib, scheduler_factory,
                                                             tmp_path, procs, groups):
    """A node's scheduler restarts while two 2-node jobs are registered: state.json keeps which
    jobs are multi-node, so the restarted node keeps the job-id order and nothing hangs."""
    scheds = nodes(scheduler_factory, 2)
    trace = tmp_path / "trace"
    for job_id in (641, 642):        # registered (the prologs ran) before the restart
        for sched in scheds:
            sched.client().register_job(job_id, uid=os.getuid(), gid=os.getgid(), gpu_index=[0],
                                        multinode=True)
    scheds[1].restart()
    from nvshare_slurm.wire.proto import C
    status = scheds[1].client().status(C.NVSHARE_STATUS_JOB, job_id=642)
    assert status["jobs"][0]["multinode"] is True, status
    pid_where = start_job(hook_lib, procs, scheds, 642, trace, groups(642), [1, 0])
    pid_where |= start_job(hook_lib, procs, scheds, 641, trace, groups(641), [0, 1])
    finish_jobs(procs, pid_where, scheds)
    rows = read_trace(trace)
    assert overlapping(rows, pid_where) == []
    first_642 = min(r[2] for r in rows if pid_where[r[0]][0] == 642)
    assert first_642 >= max(r[3] for r in rows if pid_where[r[0]][0] == 641)   # 641 first
