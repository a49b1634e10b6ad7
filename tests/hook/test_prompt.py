"""Prompt bursts (csrc/burst.c, nvshare_slurm/policy/corunners.py; issue 27's serving member): a co-runner
whose bursts are short and rare (a request served, a command at a prompt) runs each burst at once,
and the compute-bound turn holder beside it, told YIELD with its grant, launches nothing new until
that burst ends. Its kernels then share the GPU only with what the holder had queued before.

On the fake driver kernels of different processes run side by side (no time-slicing), so what is
checked is the order: the holder's kernels start inside a prompt kernel in about half the prompt
bursts without it (the holder runs 2 ms kernels back to back), and almost never with it."""
from __future__ import annotations

import statistics

import pytest

from helpers_hook import GPU0, Job, finish, overlaps, read_trace, run_together, start_nvtest

# Whose work ran when, on a shared host: run once more if it fails (tests/conftest.py).
pytestmark = pytest.mark.timing

PROMPT_US, PROMPT_GAP_MS, HOLDER_US = 1000, 30, 2000


def holder_starts_inside_prompt_kernels(rows, holder_pid: int, prompt_pid: int,
                                        after_ns: int) -> tuple[int, int]:
    """(prompt kernels after `after_ns` with a holder kernel starting inside them, such kernels)."""
    holder = sorted(r[2] for r in rows if r[0] == holder_pid and r[1] == GPU0)
    prompt = sorted((r[2], r[3]) for r in rows if r[0] == prompt_pid and r[1] == GPU0 and r[2] > after_ns)
    slack = 100_000   # 0.1 ms: a launch that passed the gate just before the prompt burst began
    hit = sum(1 for s, e in prompt if any(s + slack < h < e - slack for h in holder))
    return hit, len(prompt)


def run_pair(sched, tmp_path, tag: str, hook_lib, procs) -> tuple[int, int, str]:
    trace = tmp_path / f"trace-{tag}"
    holder_job = Job(sched, 1, trace, gpu_index=[0])
    prompt_job = Job(sched, 2, trace, gpu_index=[0])
    holder = start_nvtest(hook_lib, ["init", "ctx:0", f"burst:{HOLDER_US}:1500:0"],
                          dict(holder_job.env, NVSHARE_LOG_LEVEL="debug"))
    procs.append(holder)
    prompt = start_nvtest(hook_lib, ["init", "ctx:0", "sleep:200", f"burst:{PROMPT_US}:60:{PROMPT_GAP_MS}"],
                          dict(prompt_job.env, NVSHARE_LOG_LEVEL="debug"))
    procs.append(prompt)
    finish(prompt, timeout=60)
    finish(holder, timeout=60)
    rows = read_trace(trace)
    first = min(r[2] for r in rows if r[0] == prompt.pid)
    # The first half second: the prompt job's demand is not measured yet (not prompt), and the
    # daemon has not yet seen it light (it co-runs once reported).
    hit, n = holder_starts_inside_prompt_kernels(rows, holder.pid, prompt.pid, first + 500_000_000)
    return hit, n, holder.stderr_text


@pytest.mark.parametrize("burst_turns", [True, False])
def test_a_turn_holder_launches_nothing_new_while_a_prompt_burst_runs(hook_lib, scheduler_factory, tmp_path,
                                                                    procs, burst_turns):
    sched = scheduler_factory(burst_turns=burst_turns)
    hit, n, holder_log = run_pair(sched, tmp_path, str(burst_turns), hook_lib, procs)
    print(f"burst_turns {burst_turns}: the holder started a kernel inside {hit} of {n} prompt kernels")
    assert n >= 30, n
    if burst_turns:
        assert "waits out prompt bursts" in holder_log, holder_log[-2000:]
        assert hit <= 0.1 * n, (hit, n)
    else:   # plain co-running: the holder's 2 ms kernels start inside about half of them
        assert "waits out prompt bursts" not in holder_log
        assert hit >= 0.25 * n, (hit, n)


@pytest.mark.parametrize("claim", ["prompt_until", "expect"])
def test_a_job_that_claims_prompt_bursts_forever_costs_the_holder_at_most_its_budget(hook_lib, scheduler,
                                                                                   tmp_path, procs, claim):
    """The page is not trusted: a co-runner that writes a prompt burst's end a second ahead, every
    millisecond, holds a yielding holder back at most half of each second (YIELD_BUDGET_NS) and at
    most 200 ms at a time (a server's longest hold); the holder's log says why it stopped waiting.
    The same for one that writes, every millisecond, a prompt burst expected in a millisecond that
    never comes (csrc/burst.c's expectations: the page's first slot)."""
    import math
    import struct
    import time

    from test_burst import squatted_page

    def claim_a_second(page):
        if claim == "expect":   # at, dev_us (the most heeded), token
            page[80:96] = struct.pack("QII", time.monotonic_ns() + 1_000_000, 1000, 0xBAD)
        else:
            page[16:24] = struct.pack("Q", time.monotonic_ns() + 1_000_000_000)   # prompt_until

    def holder_run(job_id: int, steps: int, squat=None) -> tuple[float, str]:
        """Seconds from its first kernel to its last, and its log."""
        trace = tmp_path / f"trace-{job_id}"
        job = Job(scheduler, job_id, trace, gpu_index=[0])
        proc = start_nvtest(hook_lib, ["init", "ctx:0", "sleep:300", f"burst:{HOLDER_US}:{steps}:0"],
                            dict(job.env, NVSHARE_LOG_LEVEL="debug"))
        procs.append(proc)
        if squat:
            squat()
        finish(proc, timeout=60)
        spans = sorted((r[2], r[3]) for r in read_trace(trace) if r[0] == proc.pid)
        return (spans[-1][1] - spans[0][0]) / 1e9, proc.stderr_text

    with squatted_page(scheduler, 3, claim_a_second) as squat:
        alone, _ = holder_run(4, 500)            # beside the same co-runner, which is quiet
        took, log = holder_run(5, 1000, squat)   # while it claims prompt bursts without end
    alone *= 2
    print(f"{took:.2f} s for {alone:.2f} s beside a quiet co-runner")
    assert "waits out prompt bursts" in log, log[-2000:]
    assert "not waiting for them until it ends" in log, log[-2000:]
    # At most 0.5 s of each second it ran (the wait comes first in each: a last, partial second
    # costs a whole budget), and 10 % for a loaded machine; it did wait (the page counts) but the
    # budget, not the page, bounded it.
    seconds = math.ceil(took)
    assert took - alone <= 0.5 * seconds + 0.1 * alone, (took, alone)
    assert took - alone >= 0.3 * (seconds - 1), (took, alone)


def test_two_jobs_with_prompt_bursts_still_take_turns_burst_by_burst(hook_lib, scheduler, tmp_path, procs):
    """Two jobs of 5 ms bursts and 10 ms pauses (a third busy each: both prompt) started together.
    A prompt burst that finds another under way takes turns with it through the owner word, so
    their kernels do not overlap (beyond the first half second, before their first reports): run
    at once, both would co-run as plain co-location does."""
    rows = run_together(scheduler, hook_lib, procs, tmp_path / "trace", ["burst:5000:150:10"])
    start = min(r[2] for r in rows) + 500_000_000
    late = [r for r in rows if r[2] > start]
    bad = overlaps(late, GPU0)
    print(f"{len(bad)} overlaps among {len(late)} kernels")
    assert len(late) >= 150 and len(bad) <= 0.05 * len(late), (len(bad), len(late))


def holder_backlog_ms(launches, holder_pid: int, prompt_pid: int, after_ns: int) -> list[float]:
    """At each prompt kernel's start (after `after_ns`, while the holder still ran): how much of the
    holder's work launched before it runs on from then without a pause, in ms: what the prompt
    kernel shares the GPU with. Work the GPU held (csrc/hold.c: a wait in the holder's stream) waits
    for the prompt burst's end, and the pause before it ends the run."""
    holder = sorted((r for r in launches if r[0] == holder_pid and r[1] == GPU0), key=lambda r: r[2])
    last = max(r[3] for r in holder)
    prompts = sorted(r[2] for r in launches
                     if r[0] == prompt_pid and r[1] == GPU0 and after_ns < r[2] < last)
    pause = 200_000   # 0.2 ms: more than a wait's settling on the fake driver
    backlog = []
    for p in prompts:
        total, reach = 0, p
        for _, _, start, end, launched in holder:
            if launched >= p or end <= p:
                continue
            if start > reach + pause:
                break   # held (or not launched yet when the one before ended)
            total += end - max(start, p)
            reach = max(reach, end)
        backlog.append(total / 1e6)
    return backlog


def beside_prompt(scheduler, hook_lib, procs, trace, jobs: list[tuple[str, dict]], rounds: int,
                  launch_times: bool = True, prompt_env: dict | None = None):
    """Runs each (nvtest action, extra env) as a job, and a prompt job (1 ms kernels every 30 ms,
    `rounds` of them, started 0.1-0.2 s later, `prompt_env` added; none with 0 rounds) beside them,
    debug logs on; waits for all. Returns (the jobs' processes, the prompt job's or None)."""
    extra = {"NVSHARE_LOG_LEVEL": "debug", **({"FAKE_CUDA_TRACE_LAUNCH": "1"} if launch_times else {})}
    started = []
    for i, (action, env) in enumerate(jobs, start=1):
        started.append(start_nvtest(hook_lib, ["init", "ctx:0", action],
                                    dict(Job(scheduler, i, trace, gpu_index=[0]).env, **extra, **env)))
        procs.append(started[-1])
    prompt = None
    if rounds:
        action = f"burst:{PROMPT_US}:{rounds}:{PROMPT_GAP_MS}"
        prompt = start_nvtest(hook_lib, ["init", "ctx:0", "sleep:150", action],
                              dict(Job(scheduler, len(jobs) + 1, trace, gpu_index=[0]).env, **extra,
                                   **(prompt_env or {})))
        procs.append(prompt)
        finish(prompt, timeout=60)
    for proc in started:
        finish(proc, timeout=60)
    return started, prompt


@pytest.mark.parametrize("queue", ["off", "default", "host", "driver without waits",
                                   "no device address for the word"])
def test_a_yielding_holder_keeps_little_work_queued_while_prompt_bursts_are_about(
        hook_lib, scheduler, tmp_path, procs, queue):
    """A training queues whole steps (40 kernels of 0.5 ms, then a synchronise: a held kernel waits
    past the 1 ms prompt kernel, where one of 2 ms would still run when the hold ends, and the
    pause would not show in the trace). Yielding alone stops
    it launching during a prompt burst, but what it queued runs beside the request: about half a
    step (off: NVSHARE_PROMPT_QUEUE_MS=off). By default its queue stays whole and the GPU holds it
    at a wait in its stream while a prompt burst runs (csrc/hold.c); with NVSHARE_PROMPT_HOLD=host
    its launches wait on the host while prompt bursts are about, until under a cap of 1 ms is
    queued; so it does where the driver refuses a wait on the GPU (FAKE_CUDA_NO_WAIT_VALUE=1, as a
    driver without stream memory operations), and says so, and where the driver registers the word
    but gives it no address on the GPU (the registration is undone). Either way a request shares the
    GPU with at most one of its kernels."""
    import statistics

    from helpers_hook import read_launches

    trace = tmp_path / "trace"
    env = {"off": {"NVSHARE_PROMPT_QUEUE_MS": "off"}, "host": {"NVSHARE_PROMPT_HOLD": "host"},
           "driver without waits": {"FAKE_CUDA_NO_WAIT_VALUE": "1"},
           "no device address for the word": {"FAKE_CUDA_NO_HOST_DEVICE_POINTER": "1",
                                              "FAKE_CUDA_REPORT_HOST_REGISTERED": "1"}}.get(queue, {})
    (holder,), prompt = beside_prompt(scheduler, hook_lib, procs, trace, [("train:500:40:120:0:0", env)], 60)
    launches = read_launches(trace)
    first = min(r[2] for r in launches if r[0] == prompt.pid)
    backlog = holder_backlog_ms(launches, holder.pid, prompt.pid, first + 500_000_000)
    median, worst = statistics.median(backlog), max(backlog)
    print(f"queue {queue}: the holder's work still queued at {len(backlog)} prompt kernels: median "
          f"{median:.1f} ms, max {worst:.1f} ms")
    assert len(backlog) >= 20, len(backlog)
    held = "held on the GPU until it ends" in holder.stderr_text
    assert held == (queue == "default"), holder.stderr_text[-3000:]
    if queue == "off":
        assert median >= 5.0, backlog
    else:
        if queue == "host":
            assert "prompt bursts are about: at most" in holder.stderr_text, holder.stderr_text[-3000:]
        if queue == "driver without waits":
            assert "the driver refused a wait on the GPU" in holder.stderr_text, holder.stderr_text[-3000:]
        if queue == "no device address for the word":   # registered, then undone
            said = holder.stderr_text
            assert "the driver maps no host word for the GPU" in said, said[-3000:]
            assert "fake_cuda: 0 host range(s) registered at exit" in said, said[-3000:]
        # The turn holder counts its running kernel too (a co-runner would keep one more); held,
        # the kernel under way and the watcher's look (microseconds).
        assert median <= 2.0, backlog
        assert sorted(backlog)[int(0.9 * len(backlog))] <= 3.0, backlog


def test_a_paced_bursty_job_is_not_taken_for_a_prompt_one(hook_lib, scheduler, tmp_path, procs):
    """A bursty co-runner (20 ms bursts of 5 ms kernels, 40 ms pauses: a third busy) paced beside a
    prompt job waits up to a kernel's length before each launch. Those waits are for its own work:
    counted as idle, they cut each burst into 5 ms pieces, short enough to pass for prompt ones,
    and the bursty job then ran at once while everyone else yielded to it (seen on the H200)."""
    (bursty,), prompt = beside_prompt(scheduler, hook_lib, procs, tmp_path / "trace",
                                      [("train:5000:4:70:0:40", {})], 100, launch_times=False)
    log, prompt_log = bursty.stderr_text, prompt.stderr_text
    assert "its bursts are prompt" in prompt_log, prompt_log[-2000:]
    assert "co-runners' prompt bursts are about" in log, log[-3000:]   # it was paced
    assert "its bursts are prompt" not in log, log[-3000:]


@pytest.mark.parametrize("hold", ["host", "gpu"])
def test_holders_taking_turns_are_paced_from_a_turns_first_launch(hook_lib, scheduler, tmp_path, procs, hold):
    """Two trainings (40 kernels of 0.5 ms a step: see the test above) take turns beside a prompt
    job. A turn passed on by hand-over begins before its grant arrives; disarmed until then, the
    incoming holder sent its first step out whole, and a prompt kernel shared the GPU with up to
    13 ms of it (4 of 64 here; on the H200 a server's slowest requests all came just after
    hand-overs). It yields as its last grant said until the new one comes: under the cap plus the
    running kernel for each holder (two at a hand-over: the outgoing one's last and the incoming
    one's first), checked at every prompt kernel with host waits (NVSHARE_PROMPT_HOLD=host). Held
    on the GPU, a holder's queue runs on until its watcher thread wakes: on a loaded CPU that can
    be after a 1 ms prompt burst has ended (1.9 ms late on CI's 2 cores beside two busy loops), so
    there the median and the 90th percentile are checked."""
    import statistics

    from helpers_hook import read_launches

    trace = tmp_path / "trace"
    env = {"NVSHARE_PROMPT_HOLD": "host"} if hold == "host" else {}
    holders, prompt = beside_prompt(scheduler, hook_lib, procs, trace, [("train:500:40:100:0:0", env)] * 2,
                                    80)
    launches = read_launches(trace)
    first = min(r[2] for r in launches if r[0] == prompt.pid)
    per_holder = [holder_backlog_ms(launches, h.pid, prompt.pid, first + 500_000_000) for h in holders]
    backlog = [sum(pair) for pair in zip(*per_holder, strict=True)]
    handovers = sum(h.stderr_text.count("lock passed on by hand-over") for h in holders)
    print(f"{handovers} hand-overs; the holders' work queued at {len(backlog)} prompt kernels: median "
          f"{statistics.median(backlog):.1f} ms, max {max(backlog):.1f} ms")
    assert handovers >= 5 and len(backlog) >= 40, (handovers, len(backlog))
    assert statistics.median(backlog) <= 2.0, sorted(backlog)[-5:]
    if hold == "host":
        assert max(backlog) <= 4.5, sorted(backlog)[-5:]
    else:
        assert sorted(backlog)[int(0.9 * len(backlog))] <= 3.0, sorted(backlog)[-8:]


SERVER_GAP_MS = 20


def start_server(scheduler, hook_lib, procs, trace):
    """A prompt job as a server: 120 requests of one 4 ms kernel, SERVER_GAP_MS apart."""
    server = start_nvtest(hook_lib, ["init", "ctx:0", f"burst:4000:120:{SERVER_GAP_MS}"],
                          dict(Job(scheduler, 1, trace, gpu_index=[0]).env, NVSHARE_LOG_LEVEL="debug"))
    procs.append(server)
    return server


def burst_waits(trace, pid: int, gap_ms: float, after_ns: int = 0) -> list[tuple[int, float]]:
    """Each of pid's bursts (one kernel and a synchronise, then gap_ms on the host) whose kernel
    started after `after_ns`: that start, and how long the burst waited in the hook, from the burst
    before's end plus the gap to its kernel's start (ms)."""
    rows = sorted((r[2], r[3]) for r in read_trace(trace) if r[0] == pid and r[1] == GPU0)
    return [(s, (s - e) / 1e6 - gap_ms) for (_, e), (s, _) in zip(rows, rows[1:], strict=False)
            if s > after_ns]


def request_waits(trace, pid: int, after_ns: int = 0,
                  over_ms: float = 2.5) -> tuple[list[float], list[float]]:
    """Each request's wait in the hook (those starting after `after_ns`, burst_waits), in ms; and those
    over `over_ms`, rounded."""
    waits = [w for _, w in burst_waits(trace, pid, SERVER_GAP_MS, after_ns)]
    late = [round(w, 1) for w in waits if w > over_ms]
    print(f"{len(waits)} requests; waits over {over_ms:g} ms: {sorted(late)}")
    return waits, late


def test_a_prompt_burst_that_finds_another_waits_for_it_not_for_a_bursty_owner(hook_lib, scheduler, tmp_path,
                                                                            procs):
    """A server (4 ms requests every 20 ms) beside a co-runner that stands for two others: a
    bursty job that holds the page's owner word (through its whole burst, as bursts do) and a probe
    whose 1 ms prompt bursts run every 5 ms. A request that finds the probe's burst under way waits
    for that burst, about a millisecond. It waited for the owner word instead, up to 1.5 of its own
    mean (on the H200 a server's slowest requests waited 7-15 ms so, behind a bursty job's 28 ms
    bursts)."""
    import struct
    import time

    from test_burst import squatted_page

    def bursty_owner_and_probe(page):
        page[:4] = struct.pack("I", 0xBAD0BAD)   # the owner word: a bursty job's burst runs
        now = time.monotonic_ns()
        cycle = now - now % 5_000_000
        if now - cycle < 1_000_000:   # the probe's burst, announced as prompt_until
            page[16:24] = struct.pack("Q", cycle + 1_000_000)
        elif struct.unpack("Q", page[16:24])[0]:   # ended: cleared, prompt_seq bumped
            page[16:24] = struct.pack("Q", 0)
            page[24:28] = struct.pack("I", (struct.unpack("I", page[24:28])[0] + 1) & 0xFFFFFFFF)

    trace = tmp_path / "trace"
    with squatted_page(scheduler, 2, bursty_owner_and_probe) as squat:
        squat()
        server = start_server(scheduler, hook_lib, procs, trace)
        finish(server, timeout=60)
    assert "its bursts are prompt" in server.stderr_text, server.stderr_text[-2000:]
    first = min(r[2] for r in read_trace(trace) if r[0] == server.pid)
    # prompt from here on
    waits, late = request_waits(trace, server.pid, first + 500_000_000, over_ms=5.0)
    assert len(waits) >= 80, len(waits)
    # Waiting for the owner word (held for good here), about a fifth of the requests (those that find
    # the probe's burst) would wait to the cap, 1.5 of the server's 4 ms mean: 6 ms. Waiting for the
    # probe's burst, about 1 ms. A loaded 2-core machine adds its sleeps' overshoot: over 2.5 ms, 8-9 of
    # 99 in a quarter of the runs of one afternoon (of the build before this test's line too), over 5 ms
    # one 6.2 in 60 runs.
    assert len(late) <= 3, sorted(late)


def test_a_page_that_claims_a_prompt_burst_forever_costs_a_prompt_job_a_few_waits_a_second(
        hook_lib, scheduler, tmp_path, procs):
    """A hostile co-runner announces a prompt burst a second ahead, every millisecond, and never
    ends it. A prompt job (4 ms requests every 20 ms) waits for it at most its own bound (1.5 of its
    mean burst) three times in a row, then does not look at the page for a second: a few slow
    requests a second, not every one, and its log says why."""
    import struct
    import time

    from test_burst import squatted_page

    def claim_a_second(page):
        page[16:24] = struct.pack("Q", time.monotonic_ns() + 1_000_000_000)   # prompt_until

    trace = tmp_path / "trace"
    with squatted_page(scheduler, 2, claim_a_second) as squat:
        server = start_server(scheduler, hook_lib, procs, trace)
        time.sleep(0.5)   # its first requests: not prompt yet (they would wait for nothing)
        squat()
        finish(server, timeout=60)
    waits, late = request_waits(trace, server.pid)
    assert "waited in vain for 3 prompt bursts in a row" in server.stderr_text, server.stderr_text[-2000:]
    # The hook says each wait of a millisecond or more: three in a row, then none for a second (about
    # 2 s of requests here), where waiting every time would be some 90.
    said = server.stderr_text.count("for another prompt burst (")
    assert 3 <= said <= 12, server.stderr_text[-3000:]
    # The requests' waits: those, and a loaded 2-core machine's oversleeps, up to a tenth of them (15
    # over 2.5 ms in a CI run on a fresh machine, against 12 allowed by the count alone before).
    assert len(waits) >= 100 and 3 <= len(late) <= said + 12, sorted(late)


def test_a_page_that_claims_a_long_prompt_burst_makes_a_prompt_job_run_beside_it_not_wait(
        hook_lib, scheduler, tmp_path, procs):
    """The cut-in's side of an untrusted page: a hostile co-runner announces, every millisecond, a prompt
    burst a second ahead that began just now and whose job's bursts span 10 s (prompt_until,
    prompt_began_ns, prompt_span_ns). A prompt job (4 ms requests every 20 ms) takes its own requests
    for the much shorter and runs each beside that "burst" (as with prompt bursts off): it neither
    waits for it nor gives up on the page, and its requests' waits stay as alone."""
    import struct
    import time

    from test_burst import squatted_page

    def claim_a_long_one(page):
        now = time.monotonic_ns()
        page[16:24] = struct.pack("Q", now + 1_000_000_000)   # prompt_until
        page[40:48] = struct.pack("Q", now)                   # prompt_began_ns
        page[72:80] = struct.pack("Q", 10_000_000_000)        # prompt_span_ns

    trace = tmp_path / "trace"
    with squatted_page(scheduler, 2, claim_a_long_one) as squat:
        server = start_server(scheduler, hook_lib, procs, trace)
        time.sleep(0.5)   # its first requests: not prompt yet
        squat()
        finish(server, timeout=60)
    waits, late = request_waits(trace, server.pid)
    assert "runs beside a prompt burst of a 10000.0 ms span" in server.stderr_text, server.stderr_text[-2000:]
    assert "waited in vain" not in server.stderr_text, server.stderr_text[-2000:]
    # The hook says each wait for another's prompt burst (6-7 ms each here, with the cut-in off): none.
    assert "for another prompt burst" not in server.stderr_text, server.stderr_text[-2000:]
    # Its requests' waits as alone, but for the host: a loaded 2-core machine oversleeps a sleep now
    # and then, up to a tenth of them over 2.5 ms (7 of 119 in one run on a fresh CI-like machine,
    # three of them before the page's claims began).
    assert len(waits) >= 100 and statistics.median(waits) < 1.0 and len(late) <= 12, sorted(late)


def test_a_job_whose_first_bursts_look_prompt_does_not_wait_for_the_owner_word(hook_lib, scheduler, tmp_path,
                                                                            procs):
    """Its class is known only after 4 bursts. A server (4 ms requests every 20 ms) whose first
    burst read short and rare runs its next ones at once, as it will once prompt, beside a page
    whose owner word a bursty co-runner holds: it waited up to 1.5 of its mean for that word on
    each of its first bursts (on the H200 a server's first 4-6 requests were its slowest). Only its
    first burst, of unknown length, waits (and none at all if it ran in an exclusive turn)."""
    import struct

    from test_burst import squatted_page

    def own_the_page(page):
        page[:4] = struct.pack("I", 0xBAD0BAD)   # the owner word

    with squatted_page(scheduler, 2, own_the_page) as squat:
        squat()
        server = start_server(scheduler, hook_lib, procs, tmp_path / "trace")
        finish(server, timeout=60)
    log = server.stderr_text
    waits = log.count("for a co-runner's burst (the owner word)")
    print(f"{waits} waits for the owner word")
    assert "its bursts are prompt" in log, log[-2000:]
    assert "bursts take turns" in log, log[-2000:]   # it co-ran beside the page's owner
    assert waits <= 1, log[-3000:]


@pytest.mark.parametrize("early", ["hold", "pace"])
def test_a_jobs_first_bursts_are_announced_as_prompt_ones_for_a_bounded_time(hook_lib, scheduler, tmp_path,
                                                                           procs, early):
    """A job's class is known after 4 bursts; before, pacing alone let a held training's queue run
    through a server's first requests (on the H200 they made its p99). With NVSHARE_PROMPT_EARLY=
    hold (the default) a first burst that may be prompt is announced on the page (prompt_until,
    prompt_early set: prompt jobs do not wait for it), so that the others hold their queues: for
    4 ms at most the first, 8 ms the next, 4 such bursts at most. A co-runner reads the page every
    0.1 ms. With pace (the rule before) nothing is announced until the job is known prompt."""
    import struct
    import time

    from test_burst import squatted_page

    seen: list[tuple[int, int, int]] = []   # (now, prompt_until, prompt_early) while an announcement runs

    def read(page):
        for _ in range(10):
            now = time.monotonic_ns()
            until, early_flag = struct.unpack("Q", page[16:24])[0], struct.unpack("I", page[12:16])[0]
            if until > now:
                seen.append((now, until, early_flag))
            time.sleep(0.0001)

    with squatted_page(scheduler, 2, read) as squat:
        squat()
        job = Job(scheduler, 1, tmp_path / "trace", gpu_index=[0])
        server = start_nvtest(hook_lib, ["init", "ctx:0", "sleep:100", f"burst:3000:12:{SERVER_GAP_MS}"],
                              dict(job.env, NVSHARE_LOG_LEVEL="debug", NVSHARE_PROMPT_EARLY=early))
        procs.append(server)
        finish(server, timeout=60)
    log = server.stderr_text
    early_seen = [(until - now) / 1e6 for now, until, flag in seen if flag]
    print(f"early={early}: {len(early_seen)} looks at an early announcement, at most "
          f"{max(early_seen, default=0):.1f} ms ahead; {len(seen) - len(early_seen)} at a prompt one")
    assert "its bursts are prompt" in log, log[-2000:]
    if early == "hold":
        assert "its first bursts are announced as prompt ones" in log, log[-2000:]
        assert early_seen and max(early_seen) <= 8.0, early_seen
    else:
        assert "announced as prompt ones" not in log and not early_seen, (log[-2000:], early_seen)


def test_a_page_woken_without_end_costs_a_held_holder_little_cpu(hook_lib, scheduler, tmp_path, procs):
    """The burst page is any co-runner's to write and to wake. A hostile one that bumps prompt_seq
    and wakes its futex in a loop would make a holder's watcher thread (csrc/hold.c) look at the
    page as often: a core of the holder's CPU. Its looks are limited (50 in 10 ms, then one a
    millisecond while that lasts): over the holder's run its watcher uses a few per cent of one
    CPU, and the holder's log says why."""
    import ctypes
    import mmap
    import os
    import threading
    import time

    from test_burst import PAGE_BYTES, bursty_client, page_of, until_grant

    futex = {"x86_64": 202, "aarch64": 98}.get(os.uname().machine)
    if futex is None:
        pytest.skip("the futex syscall number of this machine is not listed here")
    libc = ctypes.CDLL(None, use_errno=True)
    tick = os.sysconf("SC_CLK_TCK")

    def watcher_cpu(pid: int) -> float:
        """CPU seconds of pid's thread named nvshare-hold (0 when it has none)."""
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                if f.read().strip() != "nvshare-hold":
                    continue
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick
        return 0.0

    hostile = bursty_client(scheduler, 3)
    fd = page_of(until_grant(hostile))
    page = mmap.mmap(fd, PAGE_BYTES)
    word = [ctypes.c_uint32.from_buffer(page, 24)]       # prompt_seq (nvshare_burst_page)
    address = ctypes.c_void_p(ctypes.addressof(word[0]))
    stop, wakes = threading.Event(), [0]

    def flood():
        while not stop.is_set():
            word[0].value += 1
            libc.syscall(futex, address, 1, 0x7FFFFFFF, None, None, 0)   # FUTEX_WAKE, all
            wakes[0] += 1

    job = Job(scheduler, 4, tmp_path / "trace", gpu_index=[0])
    holder = start_nvtest(hook_lib, ["init", "ctx:0", "sleep:200", "train:2000:10:100:0:0"],
                          dict(job.env, NVSHARE_LOG_LEVEL="debug"))
    procs.append(holder)
    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    started, used = time.monotonic(), 0.0
    try:
        while holder.poll() is None:
            try:
                used = max(used, watcher_cpu(holder.pid))
            except OSError:
                break
            time.sleep(0.05)
        ran = time.monotonic() - started
        finish(holder, timeout=60)
    finally:
        stop.set()
        flooder.join()
        word.clear()   # the mmap closes once nothing points into it
        page.close()
        os.close(fd)
        hostile.close()
    print(f"{wakes[0]} wakes in {ran:.1f} s; the holder's watcher used {used:.2f} s of CPU")
    assert wakes[0] >= 20_000 * ran, wakes[0]        # a flood: far past 50 in 10 ms
    assert "queued work is held on the GPU while one runs" in holder.stderr_text, holder.stderr_text[-3000:]
    assert "the burst page woke this job 50 times in 10 ms" in holder.stderr_text, holder.stderr_text[-3000:]
    assert used <= 0.05 * ran + 0.05, (used, ran)


def test_a_holder_told_to_yield_while_a_prompt_burst_runs_holds_its_queue_at_once(hook_lib, scheduler,
                                                                                 tmp_path, procs):
    """A turn passed on by hand-over, or a grant that says YIELD again, can come while a co-runner's
    prompt burst runs. The hold's watcher looked at that burst while the job did not yield, and slept
    until the burst's end (or its 100 ms look): on the H200 a turn that began just as a request did
    ran 7.7 ms of its kernels beside it (mix8's slowest request). Here a co-runner leaves (the
    training yields no more), the page claims a prompt burst, and a co-runner comes: the training's
    grant says YIELD again, and its queue must be held from then, three times over."""
    import mmap
    import os
    import struct
    import time

    from helpers_hook import read_launches
    from test_burst import PAGE_BYTES, bursty_client, page_of, until_grant

    def claim(page, ns: int) -> None:
        page[16:24] = struct.pack("Q", ns)   # prompt_until (csrc/burst.h)

    trace = tmp_path / "trace"
    holder = start_nvtest(hook_lib, ["init", "ctx:0", "train:1000:20:250:0:0"],
                          dict(Job(scheduler, 1, trace, gpu_index=[0]).env, NVSHARE_LOG_LEVEL="debug",
                               FAKE_CUDA_TRACE_LAUNCH="1"))
    procs.append(holder)
    time.sleep(0.5)
    co = bursty_client(scheduler, 2)
    fd = page_of(until_grant(co))      # the training yields beside it: its watcher starts
    page = mmap.mmap(fd, PAGE_BYTES)
    rearmed = []
    try:
        for job in (3, 4, 5):
            time.sleep(0.3)
            co.close()                 # the training yields no more
            time.sleep(0.3)
            claim(page, time.monotonic_ns() + 1_000_000_000)
            time.sleep(0.15)           # the watcher has looked: no yield, no hold
            co = bursty_client(scheduler, job)
            for _, fds in until_grant(co):
                for d in fds:
                    os.close(d)
            rearmed.append(time.monotonic_ns())   # the training's grant says YIELD again now
            time.sleep(0.4)
            claim(page, 0)
    finally:
        co.close()
        page.close()
        os.close(fd)
    finish(holder, timeout=60)
    launches = read_launches(trace)
    # The training's GPU work that ran from 25 ms after each grant for 100 ms (the watcher's longest
    # sleep): the step it had launched before the grant carries no waits (20 ms at most), those
    # after do. Before, the queue ran on as long as the watcher slept (0-100 ms).
    a, b = 25_000_000, 125_000_000
    ran = [sum((min(e, t + b) - max(s, t + a)) / 1e6 for p, g, s, e, _ in launches
               if p == holder.pid and g == GPU0 and e > t + a and s < t + b)
           for t in rearmed]
    print(f"the training's work 25-125 ms after each YIELD grant during a prompt burst: "
          f"{[round(r, 1) for r in ran]} ms")
    assert holder.stderr_text.count("waits out prompt bursts") >= 4, holder.stderr_text[-3000:]
    assert max(ran) <= 3.0, ran


def bursts_of(launches, pid: int, gap_ns: int = 5_000_000) -> list[tuple[int, int]]:
    """A process's kernels grouped into bursts (a pause over gap_ns ends one): (first start, last end)."""
    out: list[tuple[int, int]] = []
    for _, _, s, e, _ in sorted((r for r in launches if r[0] == pid and r[1] == GPU0), key=lambda r: r[2]):
        if out and s - out[-1][1] <= gap_ns:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


@pytest.mark.parametrize("case", ["on", "off", "no prompt job"])
def test_the_turn_holder_gives_way_to_a_co_runners_burst_while_prompt_bursts_are_about(
        hook_lib, scheduler, tmp_path, procs, case):
    """A training (1 ms kernels back to back) holds the turn; a bursty job co-runs beside it (14 ms
    bursts, 18 ms pauses: longer than a prompt job's 12 ms, and pauses under the policy's 25 ms line for
    turns: beside the holder's kernels the fake GPU stretched 20 ms bursts to 30-58 ms, and with 60 ms
    pauses the job took exclusive turns, none of the holder's kernels inside them); a prompt job runs 1 ms
    bursts every 30 ms. The hardware time-slices the training's and the bursty job's kernels, and a prompt
    kernel that arrives meanwhile waits for a kernel of each (on the H200 a 1 ms probe read 2.9-3.4 ms at
    p99 so, 1.1 alone). While prompt bursts are about, the training holds its queue on the GPU through
    each of the bursty job's bursts (NVSHARE_CORUN_HOLD=on, the default): its kernels start inside almost
    none of them. With `off`, and with no prompt job (the holder pays nothing then), they start all
    through them, as before."""
    from helpers_hook import read_launches

    trace = tmp_path / "trace"
    env = {"NVSHARE_CORUN_HOLD": "off"} if case == "off" else {}
    jobs, prompt = beside_prompt(scheduler, hook_lib, procs, trace,
                                 [("train:1000:20:150:0:0", env), ("train:1000:14:70:0:18", env)],
                                 0 if case == "no prompt job" else 70, prompt_env=env)
    holder, bursty = jobs
    launches = read_launches(trace)
    begin = min(r[2] for r in launches if r[0] == bursty.pid) + 700_000_000   # demand measured, co-running
    end = min(max(r[3] for r in launches if r[0] == p.pid) for p in jobs) - 100_000_000
    if prompt is not None:
        end = min(end, max(r[3] for r in launches if r[0] == prompt.pid))
    spans = [(s, e) for s, e in bursts_of(launches, bursty.pid) if s >= begin and e <= end]
    starts = sorted(r[2] for r in launches if r[0] == holder.pid and r[1] == GPU0)
    # The holder's kernel under way when a burst begins ends in it; later starts are what counts.
    inside = [sum(1 for t in starts if s + 1_500_000 < t < e) for s, e in spans]
    ms = sum(e - s for s, e in spans) / 1e6
    print(f"{case}: {len(spans)} bursts of the bursty job ({ms:.0f} ms), the holder's kernels started "
          f"inside them {sum(inside)} times: {inside}")
    assert "shared, bursts take turns" in bursty.stderr_text, bursty.stderr_text[-2000:]
    assert len(spans) >= 10, spans
    said = "a co-runner's burst runs while prompt bursts are about" in holder.stderr_text
    if case == "on":
        assert said, holder.stderr_text[-3000:]
        assert sum(inside) <= 0.05 * ms, inside
    else:
        assert not said, holder.stderr_text[-3000:]
        assert sum(inside) >= 0.5 * ms, inside


@pytest.mark.parametrize("squat", ["owner kept", "a burst ends every ms",
                                   "owner kept, a prompt burst every 30 ms"])
def test_a_page_that_claims_a_co_runners_burst_forever_costs_the_holder_at_most_half(
        hook_lib, scheduler, tmp_path, procs, squat):
    """A hostile co-runner keeps the page's owner word and says a prompt burst began just now, every
    millisecond. The turn holder gives way to one co-runner burst for at most 50 ms (a co-runner's
    longest wait for another's burst): with the owner word never let go it then runs on, also when
    5 ms prompt bursts come and go meanwhile (the same burst's 50 ms are not counted afresh after
    each). One that also ends a burst every millisecond (the page's seq) makes each look a new
    burst: the holder gives way at most half of each second, then runs on until the second ends,
    and its log says so."""
    import ctypes
    import struct
    import time

    from helpers_hook import read_launches
    from test_burst import squatted_page

    libc = ctypes.CDLL(None, use_errno=True)

    def wake(page):
        """Bumps prompt_seq and wakes its futex, as a prompt burst's begin and end do."""
        page[24:28] = struct.pack("I", (struct.unpack("I", page[24:28])[0] + 1) & 0xFFFFFFFF)
        word = ctypes.addressof(ctypes.c_char.from_buffer(page, 24))
        libc.syscall(202, ctypes.c_void_p(word), 1, 0x7FFFFFFF, None, None, 0)   # SYS_futex, FUTEX_WAKE

    def write(page):
        now = time.monotonic_ns()
        page[:4] = struct.pack("I", 0xBAD0BAD)                       # the owner word
        page[40:48] = struct.pack("Q", now)                          # prompt_began_ns: prompt bursts about
        if squat == "a burst ends every ms":
            page[4:8] = struct.pack("I", (struct.unpack("I", page[4:8])[0] + 1) & 0xFFFFFFFF)   # seq
        if squat.endswith("every 30 ms"):
            cycle = now - now % 30_000_000
            claimed = struct.unpack("Q", page[16:24])[0]
            if now - cycle < 5_000_000 and claimed != cycle + 5_000_000:   # a prompt burst begins,
                page[16:24] = struct.pack("Q", cycle + 5_000_000)          # then ends: prompt_until,
                wake(page)                                                 # prompt_seq bumped, woken
            elif now - cycle >= 5_000_000 and claimed:
                page[16:24] = struct.pack("Q", 0)
                wake(page)

    trace = tmp_path / "trace"
    with squatted_page(scheduler, 2, write) as start:
        holder = start_nvtest(hook_lib, ["init", "ctx:0", "train:1000:20:100:0:0"],
                              dict(Job(scheduler, 1, trace, gpu_index=[0]).env, NVSHARE_LOG_LEVEL="debug",
                                   FAKE_CUDA_TRACE_LAUNCH="1"))
        procs.append(holder)
        time.sleep(0.5)
        start()
        squat_from = time.monotonic_ns()
        finish(holder, timeout=60)
    rows = sorted((r[2], r[3]) for r in read_launches(trace) if r[0] == holder.pid and r[1] == GPU0)
    last = rows[-1][1]
    window = last - squat_from
    ran = sum(min(e, last) - max(s, squat_from) for s, e in rows if e > squat_from) / window
    print(f"{squat}: the holder ran {ran:.2f} of {window / 1e9:.2f} s")
    assert window >= 1.0e9, window
    said = holder.stderr_text
    assert "a co-runner's burst runs while prompt bursts are about" in said, said[-3000:]
    if squat == "a burst ends every ms":
        assert "for co-runners' bursts; not holding for them until it ends" in said, said[-3000:]
        assert ran >= 0.3, ran
    elif squat == "owner kept":   # 0.93 here, 0.85 on a loaded CI host; giving way each second: 0.5
        assert ran >= 0.75, ran
    else:   # held for the prompt bursts (5 of every 30 ms), and the co-runner's burst's 50 ms once
        assert ran >= 0.7, ran


def test_a_prompt_job_waiting_its_turn_keeps_the_others_held_until_its_own_burst(hook_lib, scheduler,
                                                                             tmp_path, procs):
    """A prompt job that finds another's prompt burst under way waits for it (at most its own bound),
    and meanwhile claims the others' hold until its wait's end (the page's prompt_next_until): from
    the one burst's end to its own the turn holder stays held. Before, the holder's watcher let go at
    the first burst's end and the GPU started the holder's next kernel before the waiting job's burst
    was announced (on the H200, 10 of mix8's 118 probe requests met a kernel started so). Here a
    hostile co-runner announces a prompt burst a second ahead, always: the prompt job's claims are
    seen on the page, each ends within its bound (1.5 of its mean burst, a few ms) and a margin."""
    import struct
    import time

    from test_burst import squatted_page

    claims: list[tuple[int, int]] = []

    def burst_under_way(page):
        now = time.monotonic_ns()
        page[16:24] = struct.pack("Q", now + 1_000_000_000)   # prompt_until: a second ahead
        nxt = struct.unpack("Q", page[48:56])[0]            # prompt_next_until
        if nxt:
            claims.append((now, nxt))

    trace = tmp_path / "trace"
    with squatted_page(scheduler, 2, burst_under_way) as start:
        prompt = start_nvtest(hook_lib, ["init", "ctx:0", "burst:1000:400:5"],
                              dict(Job(scheduler, 1, trace, gpu_index=[0]).env, NVSHARE_LOG_LEVEL="debug"))
        procs.append(prompt)
        time.sleep(0.3)   # its class is known: prompt
        start()
        finish(prompt, timeout=60)
    assert "its bursts are prompt" in prompt.stderr_text, prompt.stderr_text[-2000:]
    ahead = sorted((nxt - now) / 1e6 for now, nxt in claims)
    print(f"{len(claims)} looks saw a claim; how far ahead, ms: {[round(a, 1) for a in ahead]}")
    assert len(claims) >= 3, claims
    assert ahead[-1] <= 20.0, ahead


@pytest.mark.parametrize("cut_in", ["on", "off", "always"])
def test_a_much_shorter_prompt_burst_runs_beside_a_long_one_rather_than_after_it(
        hook_lib, scheduler, tmp_path, procs, cut_in):
    """A server (4 ms requests every 20 ms) and a probe (1 ms commands every 6 ms), both prompt. A
    command that begins while a request has more than 1 ms to go runs beside it (the server's mean
    span is 4 times the probe's: NVSHARE_PROMPT_CUT_IN); one near a request's end, or any with
    `off`, waits for the request's end (on the H200 mix8's 1 ms probes waited 3.2 ms so at their
    slowest tenth, beside 3 ms requests); with `always` one near a request's end runs beside it too.
    The fake driver runs the two side by side, so the wait is the hook's alone."""
    trace = tmp_path / "trace"
    env = {"NVSHARE_LOG_LEVEL": "debug", "NVSHARE_PROMPT_CUT_IN": cut_in}
    server = start_nvtest(hook_lib, ["init", "ctx:0", "burst:4000:150:20"],
                          dict(Job(scheduler, 1, trace, gpu_index=[0]).env, **env))
    procs.append(server)
    probe = start_nvtest(hook_lib, ["init", "ctx:0", "sleep:150", "burst:1000:400:6"],
                         dict(Job(scheduler, 2, trace, gpu_index=[0]).env, **env))
    procs.append(probe)
    finish(probe, timeout=60)
    finish(server, timeout=60)
    for job in (server, probe):
        assert "its bursts are prompt" in job.stderr_text, job.stderr_text[-2000:]
    server_rows = sorted((r[2], r[3]) for r in read_trace(trace) if r[0] == server.pid and r[1] == GPU0)
    first = min(r[2] for r in read_trace(trace) if r[0] == probe.pid)
    # from half a second on both are prompt; only the commands that began inside a request count
    inside, near_end = [], []
    for s, w in burst_waits(trace, probe.pid, 6.0, first + 500_000_000):
        began = s - w * 1e6   # when the command began (its kernel's start less its wait)
        if any(a + 200_000 < began < b - 1_500_000 for a, b in server_rows):
            inside.append(round(w, 2))
        if any(b - 900_000 < began < b - 500_000 for a, b in server_rows):
            near_end.append(round(w, 2))   # less than the command's own span left of the request
    long_waits = [w for w in inside if w > 1.0]
    print(f"{cut_in}: {len(inside)} commands began early in a request; waits over 1 ms: "
          f"{sorted(long_waits)}; {len(near_end)} began near its end, waits {sorted(near_end)}")
    assert len(inside) >= 20, inside
    if near_end and cut_in != "off":   # the request's last 0.9-0.5 ms: `on` waits it out, `always` not
        waited = [w for w in near_end if w >= 0.4]
        assert len(waited) >= 0.6 * len(near_end) if cut_in == "on" else len(waited) <= 0.3 * len(near_end), \
            near_end
    if cut_in in ("on", "always"):
        # A loaded 2-core machine oversleeps a sleep now and then: a few.
        assert len(long_waits) <= 0.15 * len(inside), sorted(inside)
    else:
        assert len(long_waits) >= 0.5 * len(inside), sorted(inside)


def test_a_prompt_job_that_gave_its_lock_back_in_its_warm_up_runs_its_next_bursts_without_asking(
        hook_lib, scheduler, tmp_path, procs):
    """Issue 42, mix3 on the H200: a probe that asks while a training holds has not reported yet,
    so it takes a turn as a turn-taker, is told LOCK_CONTENDED (the training waits) and gives the
    GPU back in its warm-up's pause. Once it reads prompt the daemon grants it again unasked
    (policy/promptidle.py), so its first probe does not wait a round trip for the lock: its hook
    asks for the lock no more after its warm-up. Before, it asked again at its first probe."""
    from helpers_daemon import wait_for_log

    trace = tmp_path / "trace"
    holder = start_nvtest(hook_lib, ["init", "ctx:0", "burst:2000:900:0"],
                          dict(Job(scheduler, 1, trace, gpu_index=[0]).env, NVSHARE_LOG_LEVEL="debug"))
    procs.append(holder)
    wait_for_log(scheduler, f"pid {holder.pid}: lock granted", timeout=30)
    probe = start_nvtest(hook_lib, ["init", "ctx:0", "burst:1000:3:5", "sleep:1200", "burst:1000:8:100"],
                         dict(Job(scheduler, 2, trace, gpu_index=[0]).env, NVSHARE_LOG_LEVEL="debug"))
    procs.append(probe)
    finish(probe, timeout=60)
    finish(holder, timeout=60)
    log, daemon = probe.stderr_text, scheduler.log()
    assert "lock released (idle" in log, log[-3000:]              # its warm-up's: it was contended
    assert f"pid {probe.pid}: lock granted (shared, bursts take turns, unasked" in daemon, daemon[-4000:]
    after = log[log.rindex("lock released (idle"):]                # from its warm-up's last release
    assert "lock requested" not in after and "lock granted (shared, bursts take turns" in after, log[-3000:]
    assert "its bursts are prompt" in after, log[-3000:]          # its 8 probes came after it


def server_beside_probe(hook_lib, scheduler, tmp_path, procs, shorter: str, job: int):
    """A server (3 ms requests, busy 20 %) and a probe (a 1 ms burst every 50 ms) with
    NVSHARE_PROMPT_SHORTER=shorter: (the probe's kernels on time that met a server kernel, those on
    time, the server's log, the probe's log). On time: after its first second, its gap within 0.8 ms of
    the median (the window closes a millisecond and three deviations after the burst is due): a
    loaded host's late ones come after it."""
    trace = tmp_path / f"trace-{shorter}"
    env = {"NVSHARE_LOG_LEVEL": "debug", "NVSHARE_PROMPT_SHORTER": shorter}
    server = start_nvtest(hook_lib, ["init", "ctx:0", "serve:1000:3:300:15:7"],
                          dict(Job(scheduler, job, trace, gpu_index=[0]).env, **env))
    procs.append(server)
    probe = start_nvtest(hook_lib, ["init", "ctx:0", "burst:1000:80:49"],
                         dict(Job(scheduler, job + 1, trace, gpu_index=[0]).env, **env))
    procs.append(probe)
    finish(probe, timeout=60)
    finish(server, timeout=60)
    rows = read_trace(trace)
    kernels = sorted((r[2], r[3]) for r in rows if r[0] == probe.pid)
    gaps = [b[0] - a[1] for a, b in zip(kernels, kernels[1:], strict=False)]
    median = statistics.median(gaps)
    on_time = [k for k, gap in zip(kernels[1:], gaps, strict=True) if k[0] > kernels[0][0] + 1_000_000_000
               and abs(gap - median) < 800_000]
    served = [(r[2], r[3]) for r in rows if r[0] == server.pid]
    slack = 50_000   # 0.05 ms
    beside = sum(1 for s, e in on_time if any(a < e - slack and b > s + slack for a, b in served))
    print(f"shorter {shorter}: {beside} of {len(on_time)} probe kernels on time met a server kernel "
          f"({len(kernels)} in all)")
    return beside, len(on_time), server.stderr_text, probe.stderr_text


def test_a_server_holds_its_queue_ahead_of_a_much_shorter_probes_expected_bursts(hook_lib, scheduler,
                                                                                 tmp_path, procs):
    """NVSHARE_PROMPT_SHORTER (issue 42, mix8 on the H200: 17 of the probes' 18 slow requests arrived
    inside a server's request of three 1 ms kernels). With it on, the server, a prompt job itself,
    holds its queue on the GPU ahead of the expected bursts of a probe whose span is much shorter than
    its own, as a training does, so a probe that comes on time meets almost none of its kernels: 0-2 of
    45-57 here, on a host loaded by another run of the tests (its watcher thread may wake late); off
    (the default), the server's kernels run beside 3-13 of them, those that cut into a request under
    way."""
    off, n_off, log_off, _ = server_beside_probe(hook_lib, scheduler, tmp_path, procs, "off", 1)
    on, n_on, log, said = server_beside_probe(hook_lib, scheduler, tmp_path, procs, "on", 3)
    assert min(n_off, n_on) >= 30 and "its prompt bursts come on time" in said, (n_off, n_on, said[-2000:])
    assert "its bursts are prompt" in log, log[-2000:]
    assert "a co-runner's prompt burst is due soon" in log, log[-3000:]
    assert "a co-runner's prompt burst is due soon" not in log_off
    assert off >= 3 and on <= 2, (off, on)
