"""Equal jobs sharing a GPU get about equal GPU time (issue 27). On the H100 three equal PyTorch
trainings in 1 s turns held the GPU 10.7 s, 3.2 s and 2.4 s of the same 15.4 s: one kept whole
turns, the two others gave the GPU back within milliseconds of each grant. Here on the fake driver:
three equal training-like jobs (a bursty start-up, then steps of many asynchronous launches and one
synchronise), concurrent turns with a 1 s switch interval as in that run (scripts/demo.sh)."""
from __future__ import annotations

import pytest

from helpers_hook import GPU0, Job, finish, overlaps, read_trace, start_nvtest

# Whose work ran when, on a shared host: run once more if it fails (tests/conftest.py).
pytestmark = pytest.mark.timing

# train:US:K:N:HOSTUS:PAUSEMS: 100 kernels of 0.5 ms launched 0.1 ms apart (the host runs ahead),
# one synchronise, no pause: 50 ms of GPU work a step. Start-up: 40 bursts of 1 ms, 5 ms apart.
START_UP = "burst:1000:40:5"
TRAIN = "train:500:100:150:100:0"
SWITCH_S = 1.0
SKIP_S = 3.0                  # the start-up and the first rotation
WINDOW_S = 3 * 3 * SWITCH_S   # three whole rotations of the three jobs' turns


def gpu_time_in(rows, pid: int, lo: int, hi: int) -> float:
    """Seconds of pid's kernels on GPU0 inside [lo, hi]."""
    return sum(max(0, min(e, hi) - max(s, lo)) for p, g, s, e in rows if p == pid and g == GPU0) / 1e9


def three_jobs(hook_lib, scheduler_factory, tmp_path, procs, works):
    """Three jobs on GPU0 in concurrent turns with a 1 s switch interval, each a start-up and then
    its work. Returns the scheduler, each job's kernel time over three whole rotations after the
    first one, and whether each job was still running at the window's end. The jobs log at the
    default level: a chatty hook would fill the stderr pipe that finish() reads only at the end."""
    scheduler = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                                  switch_time_fixed=SWITCH_S)
    trace = tmp_path / "trace"
    jobs = [Job(scheduler, n, trace, gpu_index=[0]) for n in (1, 2, 3)]
    for job, work in zip(jobs, works, strict=True):
        procs.append(start_nvtest(hook_lib, ["init", "ctx:0", START_UP, work], job.env))
    for proc in procs:
        finish(proc, timeout=180)
    rows = read_trace(trace)
    pids = [p.pid for p in procs]
    lo = max(min(s for p, g, s, e in rows if p == pid) for pid in pids) + int(SKIP_S * 1e9)
    hi = lo + int(WINDOW_S * 1e9)
    times = [gpu_time_in(rows, pid, lo, hi) for pid in pids]
    running = [max(e for p, g, s, e in rows if p == pid) > hi for pid in pids]
    print(f"GPU time of each job in {WINDOW_S:.0f} s: {[round(t, 2) for t in times]}")
    assert overlaps(rows, GPU0) == []
    return scheduler, times, running


def test_equal_trainings_get_equal_gpu_time(hook_lib, scheduler_factory, tmp_path, procs):
    """Over three whole rotations after the start-up each job's kernels ran within 25 % of each
    other's time, and no two jobs' kernels overlapped. Before: a job that got only short turns
    kept giving the GPU back in host hiccups (its start-up demand, 35 % busy, never caught up
    while lock waits are left out of it), and in the 0.2 ms between a step's synchronise and its
    next launch: 1.2x to 3.4x between jobs."""
    scheduler, times, running = three_jobs(hook_lib, scheduler_factory, tmp_path, procs, [TRAIN] * 3)
    assert all(running), "a job ended early"
    assert max(times) <= 1.25 * min(times), (times, scheduler.log()[-4000:])


# 10 kernels of 2 ms launched 0.2 ms apart, one synchronise, then a 10 ms host pause: 67 % busy,
# so its hook gives the GPU back in every pause while the others wait.
PAUSING = "train:2000:10:300:200:10"


def test_a_training_that_pauses_keeps_its_turns(hook_lib, scheduler_factory, tmp_path, procs):
    """A training with a host pause in every step, beside two compute-bound ones in 1 s turns. Its
    hook gives the GPU back in each pause and asks again 10 ms later. The rest of its turn stays
    its own (turnloan.py): here, where the compute-bound ones drain their queues long, the GPU is
    kept for it through such a pause, and lent only past it. Over three whole rotations its
    kernels ran at least 0.4 of a compute-bound job's time (two thirds of its 1 s turn is kernels):
    1.72-2.32 s against 2.25-3.26 s. Before, it got one step per rotation of the others' whole
    turns: 0.08 s against 3.94 and 4.92 s."""
    scheduler, times, running = three_jobs(hook_lib, scheduler_factory, tmp_path, procs,
                                           [TRAIN, TRAIN, PAUSING])
    assert all(running[:2]), "a compute-bound job ended early"
    assert times[2] >= 0.4 * min(times[:2]), (times, scheduler.log()[-4000:])
