"""Adaptive sharing end to end: libnvshare.so measures each process's demand (demand.c) and the
real scheduler decides from it; the fake driver's trace shows who waited."""
from __future__ import annotations

import statistics

import pytest

from helpers_hook import GPU0, Job, finish, overlaps, read_trace, run_together, start_nvtest

# Whose work ran when, on a shared host: run once more if it fails (tests/conftest.py).
pytestmark = pytest.mark.timing

LIGHT_PERIOD_NS = (1 + 100) * 1_000_000     # burst:1000:N:100 = a 1 ms kernel every 101 ms
# The overlapping pair's time over the GPU time it needs, at most: what took twice was the fault; the
# rest is the host's wake-ups at each hand-over (1.05-1.10 on an idle 2-core machine, 1.35-1.43 in a
# slow phase of a fresh CI-like one, both tries).
MAKESPAN_MAX = 1.6


def kernel_starts(trace, pid: int) -> list[int]:
    return sorted(r[2] for r in trace if r[0] == pid and r[1] == GPU0)


def waits_ms(starts: list[int]) -> list[float]:
    """How much later than its own rhythm each kernel started: time spent waiting at the gate."""
    return [max(0, b - a - LIGHT_PERIOD_NS) / 1e6 for a, b in zip(starts, starts[1:], strict=False)]


def test_an_interactive_client_beside_busy_ones_is_not_held_back(hook_lib, scheduler, tmp_path,
                                                                  procs):
    """Two compute-bound jobs take turns; a light job's 1 ms kernels every 100 ms run at once
    (co-running) instead of waiting for a turn: its median wait stays within a few ms."""
    trace = tmp_path / "trace"
    busy = [Job(scheduler, n, trace, gpu_index=[0]) for n in (1, 2)]
    light = Job(scheduler, 3, trace, gpu_index=[0])
    for job in busy:
        procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "burst:20000:150:0"], job.env))
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "sleep:300", "burst:1000:30:100"],
                              light.env))
    for proc in procs:
        finish(proc, timeout=90)
    rows = read_trace(trace)
    busy_pids = {p.pid for p in procs[:2]}
    assert overlaps([r for r in rows if r[0] in busy_pids], GPU0) == []   # busy ones: turns
    waits = waits_ms(kernel_starts(rows, procs[2].pid))[5:]   # after its demand is known
    assert len(waits) >= 20
    assert statistics.median(waits) <= 5, waits
    log = scheduler.log()
    assert "sharing: turns (2 busy clients take turns" in log, log[-3000:]
    light_pid = procs[2].pid
    assert f"job 3 step 0 pid {light_pid}: co-runs (busy " in log, log[-3000:]


def overlapping_pair(hook_lib, scheduler, tmp_path, procs):
    """Two equal bursty jobs (8 ms of kernels, then 4 ms on the host: 67 % busy each, 133 %
    together) started together: they cannot both fit in each other's pauses. Returns the trace
    rows, each job's span and GPU time needed."""
    trace = tmp_path / "trace"
    steps, burst_ms, pause_ms = 80, 8, 4
    jobs = [Job(scheduler, n, trace, gpu_index=[0]) for n in (1, 2)]
    for job in jobs:
        procs.append(start_nvtest(hook_lib, ["init", "ctx:0", f"burst:{burst_ms * 1000}:{steps}:{pause_ms}"],
                                  dict(job.env, NVSHARE_LOG_LEVEL="debug")))
    for proc in procs:
        finish(proc, timeout=90)
    rows = read_trace(trace)
    firsts, lasts = [], []
    for proc in procs:
        starts = kernel_starts(rows, proc.pid)
        firsts.append(starts[0])
        lasts.append(starts[-1])
    spans = [(b - a) / 1e9 for a, b in zip(firsts, lasts, strict=True)]
    makespan = (max(lasts) - min(firsts)) / 1e9
    needed = max(steps * (burst_ms + pause_ms), 2 * steps * burst_ms) / 1000
    print(f"spans {spans[0]:.2f} s and {spans[1]:.2f} s, together {makespan:.2f} s, GPU time {needed:.2f} s")
    return rows, spans, makespan, needed


def test_two_overlapping_bursty_clients_take_turns_burst_by_burst(hook_lib, scheduler,
                                                                  tmp_path, procs):
    """The default (burst_turns): the pair co-runs, and each burst waits for the other's to end
    through the GPU's page (a futex, no daemon round trip): after the first 150 ms (the grants
    before the first DEMAND reports: 1-4 overlaps there) at most 8 of their 160 kernels (5 %)
    overlap another's (a wait is bounded by 1.5 of the waiter's mean burst, which a loaded machine
    passes at times: 0-5 such per run in 30 runs), both finish within 15 % of each other, and the
    pair takes well under twice the GPU time it needs. Each of the 160 hand-overs costs the host's
    wake-ups: 5-10 % in all on an idle 2-core machine, 35-43 % in a slow phase of a CI-like one."""
    rows, spans, makespan, needed = overlapping_pair(hook_lib, scheduler, tmp_path, procs)
    start = min(r[2] for r in rows)
    bad = overlaps(rows, GPU0)
    late = [(a, b) for a, b in bad if b[2] > start + 150_000_000]
    print(f"{len(bad)} overlaps, {len(late)} after the first 150 ms")
    # Once in CI (357bba2) the pair did not take turns at all (101 late overlaps): what each job
    # said of its grants and bursts comes with a failure.
    said = "\n".join(line for proc in procs for line in proc.stderr_text.splitlines()
                     if any(w in line for w in ("granted", "burst", "yield", "prompt", "held")))
    assert len(late) <= 8 and len(bad) <= 12, (bad[:8], said[-6000:])
    assert max(spans) / min(spans) <= 1.15, spans
    assert makespan <= MAKESPAN_MAX * needed, (makespan, needed)
    for proc in procs:
        assert "bursts take turns" in proc.stderr_text, proc.stderr_text[-2000:]   # granted, or again
    status = next(g for g in scheduler.client().status()["gpus"] if g["uuid"] == GPU0)
    assert status["sharing"] == "corun"


def test_two_overlapping_bursty_clients_alternate_in_each_others_pauses(hook_lib, scheduler_factory,
                                                                         tmp_path, procs):
    """burst_turns off: the pair takes turns of the lock, and the holder gives the GPU back early
    in each pause (an eighth of its pauses), so each burst runs in the other's pause. Their bursts
    never overlap, both finish within 15 % of each other, and the pair takes about the GPU time it
    needs (as above: well under twice). With the adaptive threshold alone it doubled past the pauses
    (each early release was followed by a request soon after), holders kept 100 ms turns and the pair
    took about twice its time alone."""
    scheduler = scheduler_factory(burst_turns=False)
    rows, spans, makespan, needed = overlapping_pair(hook_lib, scheduler, tmp_path, procs)
    log = scheduler.log()
    assert overlaps(rows, GPU0) == [], log[-6000:]
    assert max(spans) / min(spans) <= 1.15, spans
    assert makespan <= MAKESPAN_MAX * needed, (makespan, needed)
    assert "sharing: turns" in log, log[-3000:]
    for proc in procs:   # turn-takers from their first report on (unreported ones take turns too)
        assert f"pid {proc.pid}: co-runs (" not in log, log[-3000:]


def test_two_tiny_burst_clients_co_run_and_both_progress(hook_lib, scheduler, tmp_path,
                                                         procs):
    """1 ms bursts with short pauses: a hand-over would cost about as much as a burst, so they
    co-run; neither waits every step for the other, and they finish within 15 % of each other."""
    rows = run_together(scheduler, hook_lib, procs, tmp_path / "trace", ["burst:1000:300:4"])
    spans = []
    for proc in procs:
        starts = kernel_starts(rows, proc.pid)
        spans.append(starts[-1] - starts[0])
    assert max(spans) / min(spans) <= 1.15, spans
    log = scheduler.log()
    for proc in procs:
        changes = [ln for ln in log.splitlines()
                   if f"pid {proc.pid}: co-runs (" in ln or f"pid {proc.pid}: takes turns (" in ln]
        assert changes and "co-runs (" in changes[-1], log[-3000:]


def test_waiting_for_the_lock_is_not_reported_as_busy(hook_lib, scheduler_factory, tmp_path,
                                                      procs):
    """In plain turns a light client waits for a compute-bound one most of the time. Its DEMAND
    describes its own work (2 ms kernels every 20 ms: ~10 % busy), not the waits: counted as busy,
    waiting made jobs in turns look compute-bound and keep turns that leave the GPU idle."""
    scheduler = scheduler_factory(scheduling_mode="concurrent")
    trace = tmp_path / "trace"
    heavy, light = (Job(scheduler, n, trace, gpu_index=[0]) for n in (1, 2))
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "burst:20000:100:0"], heavy.env))
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "sleep:100", "burst:2000:60:18"], light.env))
    for proc in procs:
        finish(proc, timeout=90)
    rows = read_trace(trace)
    light_starts = kernel_starts(rows, procs[1].pid)
    heavy_starts = kernel_starts(rows, procs[0].pid)
    assert light_starts[0] < heavy_starts[-1], "the light client never had to wait"
    line = next((ln for ln in scheduler.log().splitlines()
                 if f"pid {procs[1].pid}: co-runs (busy " in ln), None)
    assert line is not None, scheduler.log()[-3000:]
    busy = int(line.split("co-runs (busy ")[1].split("%")[0])
    assert busy <= 40, line


def test_compute_bound_turns_last_the_switch_interval_not_one_synchronise(hook_lib, scheduler,
                                                                         tmp_path, procs):
    """Two compute-bound clients whose steps are 40 ms of kernels and a synchronise take turns.
    While a thread waits in cuCtxSynchronize its kernels still run: that is not idle, so a holder
    keeps the GPU until its turn ends (switch_time_min, 100 ms) instead of handing it over in every
    step's synchronise (each hand-over leaves the GPU idle for a round trip)."""
    trace = tmp_path / "trace"
    steps = 50
    jobs = [Job(scheduler, n, trace, gpu_index=[0]) for n in (1, 2)]
    for job in jobs:
        procs.append(start_nvtest(hook_lib, ["init", "ctx:0", f"burst:40000:{steps}:0"], job.env))
    for proc in procs:
        finish(proc, timeout=90)
    rows = read_trace(trace)
    assert overlaps(rows, GPU0) == []
    log = scheduler.log()
    assert "sharing: turns (2 busy clients take turns" in log, log[-3000:]
    grants = log.count("lock granted (exclusive)")
    # 2 x 50 steps of 40 ms: a turn of 100 ms ends after the third step (~35 hand-overs); a
    # hand-over in every step's synchronise (longer than the 20 ms idle threshold's cap) gives ~100.
    print(f"{grants} exclusive grants for {2 * steps} steps")
    assert grants <= 0.75 * 2 * steps, f"{grants} exclusive grants for {2 * steps} steps"
