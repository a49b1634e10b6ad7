"""Multi-GPU jobs through libnvshare.so, the fake driver's collective and the real scheduler.

Each rank is its own nvtest process on one GPU of its job's two (torchrun's layout), running
`barrier:` rounds: the fake driver's barrier kernel runs until every rank of its job launched it,
like an NCCL all-reduce. Without gang turns two such jobs deadlock: each holds one GPU with a
collective in flight that waits for its other rank, which waits for the GPU the other job holds.
"""
from __future__ import annotations

import itertools
import time

import pytest

from helpers_hook import GPU0, GPU1, Job, finish, overlaps, read_trace, start_nvtest

ROUNDS = 15
KERNEL_US = 3000


@pytest.fixture
def gang_sched(scheduler_factory):
    # Short turns, so that the jobs switch many times; half the grace is how long a hook without
    # DRAIN_STUCK may look stuck before its gang's ranks are granted again.
    return scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                             switch_time_fixed=0.05, drop_grace_sec=2.0)


def rank_args(rank: int, ranks: int = 2, rounds: int = ROUNDS) -> list[str]:
    return ["init", f"ctx:{rank}", f"barrier:{KERNEL_US}:{rounds}:{ranks}:{rank}"]


def start_ranks(hook_lib, procs, order, jobs, stagger=0.03):
    """Start the (job, rank) processes in `order`, each `stagger` seconds after the previous."""
    started = {}
    for job_id, rank in order:
        job = jobs[job_id]
        started[(job_id, rank)] = proc = start_nvtest(hook_lib, rank_args(rank), job.env)
        procs.append(proc)
        time.sleep(stagger)
    return started


def assert_no_two_jobs_overlap(trace, pid_job):
    rows = read_trace(trace)
    for gpu in (GPU0, GPU1):
        bad = [(a, b) for a, b in overlaps(rows, gpu) if pid_job[a[0]] != pid_job[b[0]]]
        assert bad == [], f"two jobs' kernels overlap on {gpu}: {bad[:3]}"
    return rows


@pytest.mark.parametrize("order", list(itertools.permutations(
    [(1, 0), (1, 1), (2, 0), (2, 1)])), ids=lambda o: "-".join(f"j{j}r{r}" for j, r in o))
def test_two_two_rank_jobs_complete_in_every_start_order(hook_lib, gang_sched, tmp_path, procs,
                                                        groups, order):
    trace = tmp_path / "trace"
    jobs = {j: Job(gang_sched, 500 + j, trace, gpu_index=[0, 1], FAKE_CUDA_BARRIER=groups(j))
            for j in (1, 2)}
    started = start_ranks(hook_lib, procs, order, jobs)
    for proc in started.values():
        assert f"barrier ok rounds={ROUNDS}" in finish(proc, timeout=60)
    rows = assert_no_two_jobs_overlap(trace, {p.pid: j for (j, _), p in started.items()})
    assert len(rows) == 4 * ROUNDS
    log = gang_sched.log()
    assert "job 501: a gang on GPUs 0,1" in log and "job 502: a gang on GPUs 0,1" in log


def test_a_two_rank_job_beside_single_gpu_jobs_on_both_gpus(hook_lib, gang_sched, tmp_path,
                                                           procs, groups):
    trace = tmp_path / "trace"
    gang = Job(gang_sched, 511, trace, gpu_index=[0, 1], FAKE_CUDA_BARRIER=groups(511))
    singles = [Job(gang_sched, 512, trace, gpu_index=[0]), Job(gang_sched, 513, trace,
                                                              gpu_index=[1])]
    pid_job = {}
    for gpu, job in enumerate(singles):
        proc = start_nvtest(hook_lib, ["init", f"ctx:{gpu}", "burst:3000:25:0"], job.env)
        procs.append(proc)
        pid_job[proc.pid] = job
    time.sleep(0.05)
    ranks = [start_nvtest(hook_lib, rank_args(r), gang.env) for r in (0, 1)]
    procs.extend(ranks)
    pid_job.update({p.pid: gang for p in ranks})
    for proc in procs:
        finish(proc, timeout=60)
    rows = assert_no_two_jobs_overlap(trace, pid_job)
    assert len(rows) == 2 * 25 + 2 * ROUNDS
    # The single-GPU jobs were not starved: they ran while the gang still had work left.
    gang_end = max(r[3] for r in rows if pid_job[r[0]] is gang)
    for proc in procs[:2]:
        assert min(r[2] for r in rows if r[0] == proc.pid) < gang_end


def test_two_jobs_of_one_process_on_two_gpus_each_complete(hook_lib, gang_sched, tmp_path, procs,
                                                          groups):
    """One process driving both GPUs (a thread per GPU, the collective across them), twice."""
    trace = tmp_path / "trace"
    pid_job = {}
    for job_id in (521, 522):
        job = Job(gang_sched, job_id, trace, gpu_index=[0, 1], FAKE_CUDA_BARRIER=groups(job_id))
        args = ["init", *(f"tbarrier:{r}:{KERNEL_US}:{ROUNDS}:2:{r}" for r in (0, 1)), "join"]
        proc = start_nvtest(hook_lib, args, job.env)
        procs.append(proc)
        pid_job[proc.pid] = job_id
        time.sleep(0.03)
    for proc in procs:
        assert finish(proc, timeout=60).count(f"barrier ok rounds={ROUNDS}") == 2
    rows = read_trace(trace)
    assert len(rows) == 4 * ROUNDS
    for gpu in (GPU0, GPU1):
        assert overlaps(rows, gpu) == [], f"two jobs' kernels overlap on {gpu}"


def test_an_end_of_turn_between_two_collectives_costs_no_stuck_drain(hook_lib, scheduler_factory,
                                                                    tmp_path, procs, groups):
    """Issue 15's stall. An end of turn can find rank 0 just past collective k (its sync
    returned, nothing in flight: it releases at once) while rank 1 has launched k+1, whose drain
    waits for rank 0. Rank 0 asks again at once to launch k+1; it gets one step (a grant, the
    DROP_LOCK behind it) and both drain. Before, it waited for the next turn and rank 1's drain
    was taken as stuck a second later (stuck_after): 3-7 such stalls in four runs of this test,
    which took 4-8 s; with steps none, in about 1.05 s."""
    # 20 ms turns: many ends of turn (about 45), each a chance to catch the ranks apart.
    gang_sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                                   switch_time_fixed=0.02, drop_grace_sec=2.0)
    rounds = 150
    trace = tmp_path / "trace"
    jobs = {j: Job(gang_sched, 530 + j, trace, gpu_index=[0, 1], FAKE_CUDA_BARRIER=groups(j))
            for j in (1, 2)}
    began = time.monotonic()
    started = {}
    for job_id, rank in [(1, 0), (1, 1), (2, 0), (2, 1)]:
        started[(job_id, rank)] = proc = start_nvtest(hook_lib, rank_args(rank, rounds=rounds),
                                                      jobs[job_id].env)
        procs.append(proc)
    for proc in started.values():
        assert f"barrier ok rounds={rounds}" in finish(proc, timeout=120)
    elapsed = time.monotonic() - began
    rows = assert_no_two_jobs_overlap(trace, {p.pid: j for (j, _), p in started.items()})
    assert len(rows) == 4 * rounds
    log = gang_sched.log()
    assert log.count("lock dropped (time slice over)") >= 40     # many ends of turn
    assert "taken as a stuck drain" not in log and "DRAIN_STUCK" not in log
    # Two jobs of 150 rounds of 3 ms, one after the other: 0.9 s of collectives.
    assert elapsed < 2.5, elapsed
