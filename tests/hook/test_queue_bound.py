"""Issue 42's bounded queue (csrc/pace.c, csrc/burst.c's servers): while a prompt client is present, a
holder keeps little GPU work queued ahead of its requests; with none present it is never throttled.

A server whose requests are longer than the 12 ms line for short prompt bursts (4 kernels of 5 ms,
arriving at random, 60 ms apart on average) is told apart by its irregular gaps. Before issue 42
its 20 ms requests were no prompt bursts: the training beside it neither yielded nor paced, and
each request began behind about half a step of the training's queued work (here 10 of its 20 ms).
On the fake driver kernels of different processes run side by side, so what is checked is how much
of the holder's GPU work ran while each request ran (helpers: test_prompt.py's). By default the
holder's work stays queued and the GPU holds it at a wait in its stream while a request runs
(csrc/hold.c; the fake driver's waits on a host word); with NVSHARE_PROMPT_HOLD=host its launches
wait on the host instead, and its queue is kept short (csrc/pace.c).
"""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys

import pytest

from helpers_hook import GPU0, Job, finish, read_launches, start_nvtest

# Whose work ran when, on a shared host: run once more if it fails (tests/conftest.py).
pytestmark = pytest.mark.timing

SERVER = "serve:5000:4:{n}:60:7"            # 20 ms requests, Poisson arrivals 60 ms apart on average
STEP_KERNELS = 20
TRAINING = f"train:1000:{STEP_KERNELS}:{{n}}:0:0"   # steps of 20 kernels of 1 ms, launched at once
WARMUP_IDLE_MS = 1500
WARMUP_LAUNCHES = 40                        # a server's warm-up: 40 kernels of 5 ms, back to back


def start(scheduler, hook_lib, procs, trace, job: int, action: str, env: dict | None = None, delay_ms=0,
          warmup=False, cpu: int | None = None):
    """A job of nvtest actions (separated by spaces); with `warmup`, as a server starts
    (bench/serve_torch.py): after `delay_ms`, a warm-up of 10 requests back to back, then
    WARMUP_IDLE_MS idle, then the actions; with `cpu`, on that CPU alone."""
    args = ["init", "ctx:0"] + ([f"sleep:{delay_ms}"] if delay_ms else []) \
        + ([f"launch:5000:{WARMUP_LAUNCHES}", "sync", f"sleep:{WARMUP_IDLE_MS}"] if warmup else []) \
        + action.split()
    proc = start_nvtest(hook_lib, args, dict(Job(scheduler, job, trace, gpu_index=[0]).env,
                                             NVSHARE_LOG_LEVEL="debug", FAKE_CUDA_TRACE_LAUNCH="1",
                                             **(env or {})),
                        preexec_fn=None if cpu is None else lambda: os.sched_setaffinity(0, {cpu}))
    procs.append(proc)
    return proc


def holder_and_step(scheduler, hook_lib, procs, tmp_path, action: str, env: dict, commands: str,
                    cpu: int | None = None):
    """A holder (job 1: nvtest `action`, with `env`) and an interactive step beside it (job 2: the
    nvtest `burst` commands, from 150 ms on), with `cpu` both on that CPU alone, both run to their
    end: the two processes, the trace's launches and the step's kernels' starts."""
    trace = tmp_path / "trace"
    holder = start(scheduler, hook_lib, procs, trace, 1, action, env, cpu=cpu)
    probe = start(scheduler, hook_lib, procs, trace, 2, commands, delay_ms=150, cpu=cpu)
    finish(probe, timeout=90)
    finish(holder, timeout=120)
    launches = read_launches(trace)
    return holder, probe, launches, sorted(r[2] for r in launches if r[0] == probe.pid)


def step_backlog(scheduler, hook_lib, procs, tmp_path, action: str, env: dict, commands: str, label: str,
                 cpu: int | None = None) -> list[float]:
    """holder_and_step, then the holder's work that runs on at each of the step's commands from the
    sixth on (the first four make its class, prompt from the fifth: checked), in ms."""
    from test_prompt import holder_backlog_ms

    holder, probe, launches, starts = holder_and_step(scheduler, hook_lib, procs, tmp_path, action, env,
                                                      commands, cpu)
    backlog = holder_backlog_ms(launches, holder.pid, probe.pid, starts[4] + 1)
    print(f"{label}the holder's work that runs on at {len(backlog)} commands' starts: "
          f"{[round(b, 1) for b in backlog]}")
    assert "its bursts are prompt" in probe.stderr_text, probe.stderr_text[-3000:]
    return backlog


def request_starts(launches, pid: int) -> list[int]:
    """The start of each request's first kernel: launched after the one before it had ended."""
    rows = sorted((r for r in launches if r[0] == pid and r[1] == GPU0), key=lambda r: r[4])
    return [r[2] for before, r in zip([None, *rows], rows, strict=False)
            if before is None or r[4] > before[3]]


def request_spans(launches, pid: int) -> list[tuple[int, int]]:
    """Each request's first kernel's start and its last kernel's end."""
    rows = sorted((r for r in launches if r[0] == pid and r[1] == GPU0), key=lambda r: r[4])
    spans: list[list[int]] = []
    for before, r in zip([None, *rows], rows, strict=False):
        if before is None or r[4] > before[3]:
            spans.append([r[2], r[3]])
        spans[-1][1] = max(spans[-1][1], r[3])
    return [(a, b) for a, b in spans]


def ran_ms(launches, pid: int, a: int, b: int) -> float:
    """pid's GPU work that ran between a and b, in ms."""
    return sum(max(0, min(end, b) - max(start, a)) for p, gpu, start, end, _ in launches
               if p == pid and gpu == GPU0) / 1e6


def queued_ms(launches, pid: int, at: int) -> float:
    """How much of pid's work launched before `at` was still to run at `at`, in ms."""
    return sum(max(0, end - max(start, at)) for p, gpu, start, end, launched in launches
               if p == pid and gpu == GPU0 and launched < at) / 1e6


def last_end(launches, pid: int) -> int:
    """When pid's last kernel ended."""
    return max(r[3] for r in launches if r[0] == pid)


def served_while_held(launches, holder_pid: int, spans, skip: int = 0) -> list[tuple[int, int]]:
    """A server's requests (`spans`) after its warm-up and idle second, but the first `skip`, that
    ended while the holder still ran."""
    holder_end = last_end(launches, holder_pid)
    after = [s for s in spans if s[0] > spans[0][0] + WARMUP_IDLE_MS * 1_000_000][skip:]
    return [(a, b) for a, b in after if b < holder_end]


def holder_during_requests(launches, holder_pid: int, spans) -> tuple[list[float], list[float]]:
    """The holder's work that ran during each of a server's requests (`spans`) after its warm-up and
    idle second, but the first two (the gaps' spread needs two gaps, the second request's begin ends
    the second, and the first is the wait after the warm-up), while the holder still ran; and each
    such request's length, in ms."""
    served = served_while_held(launches, holder_pid, spans, skip=2)
    return [ran_ms(launches, holder_pid, a, b) for a, b in served], [(b - a) / 1e6 for a, b in served]


@pytest.mark.parametrize("how", ["gpu", "host", "short"])
def test_a_holder_keeps_its_queue_bounded_beside_a_server_of_long_requests(
        hook_lib, scheduler, tmp_path, procs, how):
    """gpu (the default): the holder's work is held on the GPU while a request runs; host
    (NVSHARE_PROMPT_HOLD=host): its launches wait on the host, its queue capped; short
    (NVSHARE_PROMPT_BURSTS=short on the server: the rule before issue 42, only bursts up to 12 ms are
    prompt): about half of the holder's step runs beside each request."""
    trace = tmp_path / "trace"
    holder = start(scheduler, hook_lib, procs, trace, 1, TRAINING.format(n=300),
                   {"NVSHARE_PROMPT_HOLD": "host"} if how == "host" else {})
    server = start(scheduler, hook_lib, procs, trace, 2, SERVER.format(n=50),
                   {"NVSHARE_PROMPT_BURSTS": "short"} if how == "short" else {}, delay_ms=150, warmup=True)
    finish(server, timeout=90)
    finish(holder, timeout=90)
    launches = read_launches(trace)
    measured, _ = holder_during_requests(launches, holder.pid, request_spans(launches, server.pid))
    median = statistics.median(measured)
    p90 = sorted(measured)[int(0.9 * len(measured))]
    print(f"{how}: the holder's work that ran during {len(measured)} requests of 20 ms: median "
          f"{median:.1f} ms, p90 {p90:.1f} ms")
    assert len(measured) >= 25, len(measured)
    if how == "short":
        assert "its bursts are prompt" not in server.stderr_text, server.stderr_text[-3000:]
        assert median >= 5.0, sorted(measured)
        return
    assert "its bursts are prompt" in server.stderr_text and ": a server)" in server.stderr_text, \
        server.stderr_text[-3000:]
    if how == "gpu":
        assert "queued work is held on the GPU while one runs" in holder.stderr_text, \
            holder.stderr_text[-3000:]
        assert "held on the GPU until it ends" in holder.stderr_text, holder.stderr_text[-3000:]
        # The kernel under way at the request's start (1 ms), and the watcher's and the fake GPU's
        # look at the word (microseconds), with room for a loaded machine.
        assert median <= 1.5 and p90 <= 2.5, sorted(measured)
        return
    # The cap follows the requests' length as the server measures it (20 ms and the sampling's
    # 2 ms steps): a tenth of it, over the 1 ms default.
    said = r"prompt bursts are about: at most ([0-9.]+) ms"
    caps = [float(m) for m in re.findall(said, holder.stderr_text)]
    assert caps and 1.9 <= max(caps) <= 4.0, (caps, holder.stderr_text[-3000:])
    # The cap (2-2.4 ms) and the kernel that runs (the holder counts it: it holds turns), with
    # room for a loaded machine's late looks at the queue.
    assert median <= 3.5 and p90 <= 5.0, sorted(measured)


@pytest.mark.parametrize("beside", ["nobody", "a server that left"])
def test_a_lone_holder_is_never_throttled(hook_lib, scheduler, tmp_path, procs, beside):
    """A training alone queues each whole step (20 ms), the first step after a server left too (once
    the last request is a second old, prompt bursts are no longer about); its log never says it is
    paced when nobody else ran."""
    trace = tmp_path / "trace"
    n = 250
    holder = start(scheduler, hook_lib, procs, trace, 1, TRAINING.format(n=n))
    server = start(scheduler, hook_lib, procs, trace, 2, SERVER.format(n=20), delay_ms=150, warmup=True) \
        if beside != "nobody" else None
    if server is not None:
        finish(server, timeout=90)
    finish(holder, timeout=90)
    launches = read_launches(trace)
    after = 0
    if server is not None:
        assert "its bursts are prompt" in server.stderr_text, server.stderr_text[-3000:]
        assert "co-runners' prompt bursts are about" in holder.stderr_text, holder.stderr_text[-3000:]
        after = last_end(launches, server.pid) + 1_200_000_000
    else:
        assert "prompt bursts are about" not in holder.stderr_text, holder.stderr_text[-3000:]
        # The hook says each wait of 1 ms or more for others' bursts.
        assert not re.search(r"waited [0-9.]+ ms", holder.stderr_text), holder.stderr_text[-3000:]
    # The most queued in each step: TRAINING's 20 launches in the order made. Not told apart by the
    # GPU going idle: without the hook too, now and then the host's second launch of a step came
    # 1.2 ms late, after the first kernel had ended (1 step in 7500 on the fake driver, no hook).
    mine = sorted((r for r in launches if r[0] == holder.pid and r[1] == GPU0), key=lambda r: r[4])
    assert len(mine) == n * STEP_KERNELS, len(mine)
    steps = [mine[i:i + STEP_KERNELS] for i in range(0, len(mine), STEP_KERNELS)]
    steps = [step for step in steps[1:-1] if step[0][4] > after]
    depth = [max(queued_ms(launches, holder.pid, r[4] + 1) for r in step) for step in steps]
    # A step whose launches the hook held back (waits for prompt bursts left announced): one launch
    # 1 ms after the one before, which the host alone did in 1 step of 7500.
    late = [step for step in steps
            if any(b[4] - a[4] > 1_000_000 for a, b in zip(step, step[1:], strict=False))]
    print(f"beside {beside}: {len(depth)} steps; queued at a step's last launch: median "
          f"{statistics.median(depth):.1f} ms, least {min(depth):.1f} ms; {len(late)} with a late launch")
    assert len(depth) >= 20, len(depth)
    assert statistics.median(depth) >= 15.0 and min(depth) >= 10.0, sorted(depth)[:5]
    assert len(late) <= max(1, len(depth) // 50), [[round((r[4] - step[0][4]) / 1e6, 2) for r in step]
                                                  for step in late[:3]]


def test_a_job_is_no_server_in_its_first_second(hook_lib, scheduler, tmp_path, procs):
    """Random gaps and a low busy share from a job's start are no server yet: a training's start-up
    looks so on a GPU (irregular gaps, busy 42 %) and is past 50 % busy half a second later (taken
    for a server then, its bursts most likely held one for 200 ms). A job of 15 ms requests (not
    short prompt ones) at random 100 ms intervals from its first launch is a server only once a
    second of its work is sampled."""
    trace = tmp_path / "trace"
    holder = start(scheduler, hook_lib, procs, trace, 1, TRAINING.format(n=150))
    server = start(scheduler, hook_lib, procs, trace, 2, "serve:15000:1:30:100:3",
                   {"NVSHARE_LOG_TIME": "1"}, delay_ms=150)
    finish(server, timeout=90)
    finish(holder, timeout=90)
    first = min(r[2] for r in read_launches(trace) if r[0] == server.pid) / 1e9   # CLOCK_MONOTONIC
    lines = [line for line in server.stderr_text.splitlines() if ": a server)" in line]
    assert lines, server.stderr_text[-3000:]
    # NVSHARE_LOG_TIME stamps the wall clock, the trace the monotonic one: shifted by their
    # difference now.
    import time
    offset = time.time() - time.monotonic()
    said = float(re.search(r"@([0-9.]+)", lines[0]).group(1))
    print(f"a server {said - (first + offset):.2f} s after its first kernel")
    assert said - (first + offset) >= 0.95, lines[0]


@pytest.mark.parametrize("how", ["gpu", "host"])
def test_an_interactive_step_a_second_apart_finds_the_holders_queue_held(hook_lib, scheduler, tmp_path, procs,
                                                                       how):
    """Issue 42's interactive srun step: a small kernel every second or so, from a shell. Its bursts
    are prompt ones (short, rare), but more than a second apart: with host waits prompt bursts are
    "about" for a second after one was seen, and a command 1.2 s after the last finds the
    training's queue unpaced (steps of 20 ms launched at once: about half of one ahead of it).
    Held on the GPU, the waits stay in the training's stream for ten seconds after a prompt burst
    (they cost no queue depth), and the GPU holds the queue behind the kernel under way."""
    backlog = step_backlog(scheduler, hook_lib, procs, tmp_path, "train:500:40:1050:0:0",
                           {"NVSHARE_PROMPT_HOLD": "host"} if how == "host" else {}, "burst:1000:16:1200",
                           f"{how}: ")
    assert len(backlog) >= 10, backlog
    if how == "host":
        assert statistics.median(backlog) >= 3.0, backlog
    else:
        # The 0.5 ms kernel under way, and the watcher's look (microseconds). One command may find
        # the queue unheld: the watcher is a thread of the holder, and on this machine (2 CPUs)
        # about 1 command in 240 found it descheduled for 3 ms, its futex wake-up and its 100 ms
        # timeout both that late, by when the 1 ms command had ended (a prompt burst it never saw).
        assert statistics.median(backlog) <= 1.5 and sorted(backlog)[-2] <= 3.0, backlog


@pytest.mark.parametrize("expect", ["on", "off"])
def test_a_command_that_comes_on_time_finds_the_holders_kernel_under_way_ended(hook_lib, scheduler, tmp_path,
                                                                              procs, expect):
    """Without preemption a command meets the kernel under way: beside an fp32 training's 1.0-1.4 ms
    GEMMs the H200's interactive step read 0.4-0.8 ms over its target. A command every 300 ms (its
    gaps hardly vary), after a warm-up of 5 commands 20 ms apart, says at each end when the next is
    due (csrc/burst.c's expectations), and the holder (2 ms kernels, each with waits of its own)
    holds its queue from its longest kernel before that: from the third command of the steady pace on
    (its last two gaps steady, judged by tighter bounds than four; a running deviation kept the
    warm-up's gaps for most of a 30 s window on the H200, and waiting for four steady gaps left the
    step's first four commands its slowest) none finds a holder kernel under way. With
    NVSHARE_PROMPT_EXPECT=off most find one (on the fake driver, where kernels run side by side, a
    command that ends before that kernel lets the held queue run on behind it: the long figures of
    that arm)."""
    from test_prompt import holder_backlog_ms

    env = {"NVSHARE_PROMPT_EXPECT": expect}   # both jobs': the step says, the holder heeds
    trace = tmp_path / "trace"
    holder = start(scheduler, hook_lib, procs, trace, 1, "train:2000:10:400:0:0", env)
    # a warm-up of 5 commands 20 ms apart first, as a Python step's first calls come
    probe = start(scheduler, hook_lib, procs, trace, 2, "burst:1000:5:20 burst:1000:24:300", env,
                  delay_ms=150)
    finish(probe, timeout=90)
    finish(holder, timeout=120)
    launches = read_launches(trace)
    starts = sorted(r[2] for r in launches if r[0] == probe.pid)

    assert "its bursts are prompt" in probe.stderr_text, probe.stderr_text[-3000:]
    backlog = holder_backlog_ms(launches, holder.pid, probe.pid, starts[7] + 1)   # 5 warm-up, 2 steady
    ended = [b for b in backlog if b <= 0.1]
    print(f"{expect}: the holder's work under way at {len(backlog)} commands' starts: "
          f"{[round(b, 2) for b in backlog]}")
    assert len(backlog) >= 15, backlog
    if expect == "on":
        said = re.search(r"held its queue ahead of prompt bursts expected (\d+) times: the burst began while "
                         r"held (\d+) times", holder.stderr_text)
        assert "its prompt bursts come on time" in probe.stderr_text, probe.stderr_text[-3000:]
        assert said, holder.stderr_text[-3000:]
        print(said.group(0))
        # A loaded 2-core machine oversleeps a sleep now and then: a command late past its window.
        assert len(ended) >= 0.8 * len(backlog), backlog
        assert int(said.group(2)) >= 0.8 * int(said.group(1)), said.group(0)
    else:
        assert "come on time" not in probe.stderr_text, probe.stderr_text[-3000:]
        assert "ahead of prompt bursts expected" not in holder.stderr_text, holder.stderr_text[-3000:]
        assert len(ended) <= 0.3 * len(backlog), backlog
        assert statistics.median(backlog) >= 0.4, backlog


def test_a_servers_random_arrivals_claim_few_windows_ahead(hook_lib, scheduler, tmp_path, procs):
    """Expectations cost the co-runners a window each: a server whose requests arrive at random (150
    of them, 30 ms apart on average) must not be taken for one that comes on time, though two of its
    gaps agree now and then (csrc/burst.c's on_pace: about 2 % of such requests by the bounds on two
    gaps). The holder beside it, which yields to its requests, held ahead of an expected one for at
    most 6 % of them."""
    trace = tmp_path / "trace"
    holder = start(scheduler, hook_lib, procs, trace, 1, "train:2000:10:300:0:0", {})
    server = start(scheduler, hook_lib, procs, trace, 2, "serve:1000:1:150:30:5", {}, delay_ms=150)
    finish(server, timeout=90)
    finish(holder, timeout=120)
    assert "its bursts are prompt" in server.stderr_text, server.stderr_text[-3000:]
    assert "held its queue" in holder.stderr_text, holder.stderr_text[-3000:]   # it did yield to the server
    said = re.search(r"held its queue ahead of prompt bursts expected (\d+) times", holder.stderr_text)
    windows = int(said.group(1)) if said else 0
    print(f"windows held ahead of the server's requests: {windows} of 150")
    assert windows <= 0.06 * 150, said.group(0) if said else ""


def test_a_command_on_a_busy_cpu_is_held_for_its_whole_burst(hook_lib, scheduler, tmp_path, procs):
    """The interactive step, the training and a busy loop share one CPU (a node whose CPUs are
    oversubscribed, a CI machine of 2 cores): the step's thread is preempted now and then between
    announcing a command's burst and launching its kernel. The demand sampler, which ends a burst
    it finds idle (a job that polls ends its bursts so), read that as the end, and the holder let
    its queue go before the kernel ran: this test failed 2 runs of 4 so (8.9 and 19.5 ms of the
    holder's work beside a command), and the test above failed in CI (4.8 ms). A burst whose first
    launch is on its way into the gate is not ended (gate.h: `beginning`): at most 0.5 ms in 6
    runs."""
    cpus = sorted(os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                               preexec_fn=lambda: os.sched_setaffinity(0, {cpus[0]}))
    procs.append(spinner)
    try:
        backlog = step_backlog(scheduler, hook_lib, procs, tmp_path, "train:500:40:550:0:0", {},
                               "burst:1000:100:100", "", cpu=cpus[0])
    finally:
        spinner.kill()
        spinner.wait()
    assert len(backlog) >= 80, backlog
    assert max(backlog) <= 3.0, backlog


def long_begun_inside(launches, holder_pid: int, prompt_pid: int, after_ns: int, grace_ns: int,
                      long_ns: int) -> list[int]:
    """For each prompt kernel (after `after_ns`): how many of the holder's kernels of `long_ns` or
    more began more than `grace_ns` after it began and before it ended. On the fake driver the two
    run side by side; on a GPU the prompt kernel would wait for each such one."""
    holder = [r for r in launches if r[0] == holder_pid and r[1] == GPU0 and r[3] - r[2] >= long_ns]
    return [sum(1 for _, _, start, _, _ in holder if p0 + grace_ns < start < p1)
            for _, _, p0, p1, _ in sorted(r for r in launches
                                          if r[0] == prompt_pid and r[1] == GPU0 and r[2] > after_ns)]


@pytest.mark.parametrize("shapes", ["on", "off"])
def test_a_long_kernel_among_short_ones_gets_a_wait_of_its_own(hook_lib, scheduler, tmp_path, procs, shapes):
    """A training whose long kernels (GEMMs) hide among many short ones (elementwise): 60 kernels of
    20 us, then 2 of 2 ms, per step. Their mean launch is 0.08 ms, so a segment of 0.2 ms between two
    waits held three launches, and both long kernels could fall in one: on the H200 an interactive
    step beside an fp32 PyTorch training (kernels of about 1.4 ms) waited up to 3.7 ms more than
    alone (bench/interactive_step.py). A launch whose kernel and grid ran long before now gets a wait
    before it and one after it, so a prompt command waits for one long kernel at most: the holder's
    long kernels begin inside almost none of the prompt kernels (the fake driver runs them side by
    side): 0-1 of 27 here beside a CI run, 3-12 of 27 with NVSHARE_HOLD_SHAPES=off, which keeps
    segments of the mean launch only (the rule before; the long shape is neither measured nor said)."""
    holder, probe, launches, starts = holder_and_step(
        scheduler, hook_lib, procs, tmp_path, "mixtrain:20:60:2000:2:1400",
        {"NVSHARE_HOLD_SHAPES": "off"} if shapes == "off" else {}, "burst:2500:32:230")
    # From the sixth command on (the first four make its class), while the holder still runs.
    last = last_end(launches, holder.pid)
    inside = long_begun_inside(launches, holder.pid, probe.pid, starts[4] + 1, 400_000, 1_500_000)
    inside = inside[:sum(1 for s in starts[5:] if s < last)]
    print(f"{shapes}: the holder's long kernels begun inside {len(inside)} prompt kernels: {inside}")
    assert "its bursts are prompt" in probe.stderr_text, probe.stderr_text[-3000:]
    assert "its queued work is held on the GPU" in holder.stderr_text, holder.stderr_text[-3000:]
    assert len(inside) >= 20, inside
    if shapes == "off":
        assert "a launch shape runs" not in holder.stderr_text, holder.stderr_text[-3000:]
        return
    assert "a launch shape runs 2.00 ms on the GPU" in holder.stderr_text, holder.stderr_text[-3000:]
    # A watcher that wakes late on a loaded machine lets a long kernel through its wait now and
    # then (once in CI's 11 commands): at most one in ten.
    assert sum(inside) <= len(inside) // 10, inside


def test_a_long_kernels_length_is_measured_without_the_holds_between_its_events(
        hook_lib, scheduler, tmp_path, procs):
    """The same holder (2 ms kernels among 20 us ones) beside a server of 20 ms requests, held a
    third of the time. A launch's length is learned from the elapsed time of two events of its
    stream. Where a segment's wait held the queue between them, that time was the request's too (a
    2 ms kernel read 61 ms in one run of five here); where the stream had run dry before the later
    one, the host's gap too (a 20 us kernel read 0.68 ms); and a launch shape so measured is waited
    around long after (its longest length counts at once). Now no measurement spans a hold (hold.c
    counts them), the earlier event must still be queued when the later is recorded, and a launch
    measured alone is measured from an event after the wait put in before it."""
    trace = tmp_path / "trace"
    holder = start(scheduler, hook_lib, procs, trace, 1, "mixtrain:20:60:2000:2:1000")
    server = start(scheduler, hook_lib, procs, trace, 2, SERVER.format(n=30), delay_ms=150, warmup=True)
    finish(server, timeout=120)
    finish(holder, timeout=120)
    launches = read_launches(trace)
    spans = request_spans(launches, server.pid)
    holder_end = last_end(launches, holder.pid)
    assert sum(1 for a, _ in spans if a < holder_end) >= 20, spans
    assert "its bursts are prompt" in server.stderr_text, server.stderr_text[-3000:]
    assert "a co-runner's prompt burst runs: this job's queued work is held" in holder.stderr_text, \
        holder.stderr_text[-3000:]
    said = [float(x) for x in re.findall(r"a launch shape runs ([0-9.]+) ms on the GPU", holder.stderr_text)]
    # The 2 ms shape alone is said to be long. A 20 us one after a long kernel read up to 2 ms in 2
    # runs of 10 under two busy loops: measured from the event after the long kernel, across the
    # wait before it, which the fake driver passes when its polling thread next looks.
    assert said and all(1.9 <= ms <= 3.0 for ms in said), said


def test_a_server_that_grows_busier_under_load_stays_prompt(hook_lib, scheduler, tmp_path, procs):
    """Sharing stretches a server's requests (on the H200 a model.generate server, 28 % busy alone,
    read 54-55 % beside a training): its class must hold. The server here is prompt at 20 ms
    requests 60 ms apart, then its requests come 36 ms apart (busy about 55 %, over the 50 % a prompt
    job may stay at): a server stays prompt up to 80 % busy, and the holder's work stays held
    during its requests. Before, its requests became ordinary bursts, each beside about half of the
    holder's step."""
    trace = tmp_path / "trace"
    holder = start(scheduler, hook_lib, procs, trace, 1, TRAINING.format(n=400))
    busier = "serve:5000:4:50:36:8"
    server = start(scheduler, hook_lib, procs, trace, 2, f"{SERVER.format(n=30)} {busier}", delay_ms=150,
                   warmup=True)
    finish(server, timeout=120)
    finish(holder, timeout=120)
    launches = read_launches(trace)
    spans = request_spans(launches, server.pid)
    holder_end = last_end(launches, holder.pid)
    busy_phase = [s for s in spans[-40:] if s[1] < holder_end]     # the busier requests but the first 10
    measured = [ran_ms(launches, holder.pid, a, b) for a, b in busy_phase]
    busy = [int(m) for m in re.findall(r"busy ([0-9]+)%", server.stderr_text)]
    median = statistics.median(measured)
    print(f"the holder's work during {len(measured)} busier requests: median {median:.1f} ms; "
          f"the server's busy shares said: {busy}")
    assert len(measured) >= 25, len(measured)
    assert "its bursts are prompt" in server.stderr_text, server.stderr_text[-3000:]
    assert "its bursts are not prompt" not in server.stderr_text, server.stderr_text[-3000:]
    assert median <= 1.5, sorted(measured)


def test_a_servers_first_request_after_an_idle_release_finds_the_holders_queue_held(
        hook_lib, scheduler, tmp_path, procs):
    """A server warms up while a training holds the GPU, gives it back idle, and asks again at its
    first request; its YIELD reached the training with that grant before, so the training's queue
    had no waits in it and the request ran beside what was left of a whole step (on the H200 the
    first request of serve2 read 8.7 ms, 6.2 alone at p99). Now the daemon tells the holder to
    yield once a registered prompt client holds nothing, and a holder that yields keeps waits in
    its streams: the GPU holds the queue at the first request too. Three servers one after the
    other (the holder yields no more once each has left), their first request each."""
    from test_prompt import holder_backlog_ms

    trace = tmp_path / "trace"
    holder = start(scheduler, hook_lib, procs, trace, 1, TRAINING.format(n=600))
    firsts, servers = [], []
    for i in range(3):
        server = start(scheduler, hook_lib, procs, trace, 2 + i,
                       f"launch:1000:1 sync sleep:{WARMUP_IDLE_MS} serve:1000:3:4:60:{7 + i}",
                       delay_ms=300)
        finish(server, timeout=60)
        servers.append(server)
    finish(holder, timeout=120)
    launches = read_launches(trace)
    for server in servers:
        starts = request_starts(launches, server.pid)   # the warm-up's kernel, then the requests
        first = min(t for t in starts if t > starts[0] + WARMUP_IDLE_MS * 1_000_000 // 2)
        assert "lock released (idle" in server.stderr_text, server.stderr_text[-3000:]
        firsts += holder_backlog_ms(launches, holder.pid, server.pid, first - 1)[:1]
    print(f"the holder's work that ran on at each server's first request: {[round(b, 1) for b in firsts]}")
    assert len(firsts) == 3, firsts
    assert "waits out prompt bursts" in holder.stderr_text, holder.stderr_text[-3000:]
    # The 1 ms kernel under way, and the watcher's and the fake GPU's looks at the word.
    assert max(firsts) <= 2.0, firsts


def launch_groups(launches, pid: int, kernels: int, warmup: int = WARMUP_LAUNCHES) -> list[list]:
    """pid's launches after a warm-up of `warmup`, in launch order, `kernels` at a time (a request's,
    or a token's, kernels are its own whether or not it came right after the one before)."""
    rows = sorted((r for r in launches if r[0] == pid and r[1] == GPU0), key=lambda r: r[4])[warmup:]
    return [rows[i:i + kernels] for i in range(0, len(rows) - kernels + 1, kernels)]


def requests_by_count(launches, pid: int, kernels: int,
                      warmup: int = WARMUP_LAUNCHES) -> list[tuple[int, int, int]]:
    """A server's requests of `kernels` kernels each after a warm-up of `warmup` (launch_groups): each
    one's first launch, first kernel's start and last kernel's end."""
    return [(g[0][4], g[0][2], max(r[3] for r in g)) for g in launch_groups(launches, pid, kernels, warmup)]


def request_spans_by_launch(launches, pid: int, action: str) -> list[tuple[int, int]]:
    """Each request's first kernel's start and its last kernel's end, the warm-up's first, for a server
    started by `start` with `warmup` and the nvtest action `action` (serve:US:K:N:MEANMS:SEED[:HOSTUS
    [:TOKENS]]): a request is K x TOKENS launches (requests_by_count). Told by count, not by the gaps
    between launches: on a loaded host a request's launches can be more than a few ms apart (CI's once
    split 50 requests of 6 ms into 87 of 4.4)."""
    fields = action.split(":")
    assert fields[0] == "serve", action
    per_request = int(fields[2]) * (int(fields[7]) if len(fields) > 7 else 1)
    rows = sorted((r for r in launches if r[0] == pid and r[1] == GPU0), key=lambda r: r[4])
    assert (len(rows) - WARMUP_LAUNCHES) % per_request == 0, (len(rows), per_request)
    warm_up = (rows[0][2], max(r[3] for r in rows[:WARMUP_LAUNCHES]))
    return [warm_up] + [(a, b) for _, a, b in requests_by_count(launches, pid, per_request)]


def beside_a_host_bound_server(scheduler, hook_lib, procs, tmp_path, holder_action: str, env: dict,
                               server_action: str = "serve:20:40:50:60:7:100"):
    """A holder of holder_action (with `env`) beside a host-bound server (by default 40 kernels of 20 us,
    each after 100 us of host work, about 6 ms a request): the holder's work that ran during each
    request, the requests' lengths, and both processes."""
    trace = tmp_path / "trace"
    holder = start(scheduler, hook_lib, procs, trace, 1, holder_action, env)
    server = start(scheduler, hook_lib, procs, trace, 2, server_action, delay_ms=150, warmup=True)
    finish(server, timeout=90)
    finish(holder, timeout=90)
    launches = read_launches(trace)
    spans = request_spans_by_launch(launches, server.pid, server_action)
    measured, lengths = holder_during_requests(launches, holder.pid, spans)
    return measured, lengths, holder, server


def held_beside(measured: list[float], holder, server) -> None:
    """beside_a_host_bound_server's pair ran as meant: 25 requests or more measured, the server's bursts
    prompt, the holder's queue held for them."""
    assert len(measured) >= 25, len(measured)
    assert "its bursts are prompt" in server.stderr_text, server.stderr_text[-3000:]
    assert "held on the GPU until it ends" in holder.stderr_text, holder.stderr_text[-3000:]


@pytest.mark.parametrize("leak", ["on", "off"])
def test_a_host_bound_servers_requests_let_the_holders_work_pass_a_segment_at_a_time(
        hook_lib, scheduler, tmp_path, procs, leak):
    """A server bound by its host's launches (model.generate's tokens: on the H200 the GPU idles
    most of each request, and the training held for the whole of it kept 0.83-0.89 of its
    co-located steps/s): 40 kernels of 20 us, each after 100 us of host work, about 6 ms a request.
    By default (NVSHARE_PROMPT_LEAK_MS=0.5) the holder lets its queue pass while such a request
    launches (for NVSHARE_PROMPT_LEAK_OPEN_MS, 2 ms: here its 1 ms kernels, each with waits of its
    own), then holds it 0.5 ms, from 0.5 ms into the request. Off, none but the kernel under way at
    the request's start. A server that waits in a synchronise gets no leaks: the
    bounded-queue test above (4 kernels of 5 ms launched at once, then a synchronise) checks that
    its requests still run beside at most 1.5 ms of the holder's work at the median."""
    measured, lengths, holder, server = beside_a_host_bound_server(
        scheduler, hook_lib, procs, tmp_path, TRAINING.format(n=300),
        {} if leak == "on" else {"NVSHARE_PROMPT_LEAK_MS": "off"})
    median = statistics.median(measured)
    print(f"leak {leak}: the holder's work that ran during {len(measured)} requests of "
          f"{statistics.median(lengths):.1f} ms (median): median {median:.1f} ms, "
          f"least {min(measured):.1f}, most {max(measured):.1f}")
    held_beside(measured, holder, server)
    said = re.search(r"leaks into prompt bursts: ([0-9]+) let a segment pass", holder.stderr_text)
    if leak == "off":
        assert said is None, said
        assert median <= 1.5, sorted(measured)
        return
    assert said and int(said.group(1)) >= 50, holder.stderr_text[-3000:]
    assert median >= 2.5, sorted(measured)


@pytest.mark.parametrize("open_ms", ["segment", "1"])
def test_a_leak_open_for_a_while_lets_a_holders_short_kernels_pass_together(
        hook_lib, scheduler, tmp_path, procs, open_ms):
    """A training's short kernels (elementwise, between its GEMMs) make segments of 0.2 ms beside a
    host-bound server's requests: one segment a leak, then 0.5 ms held, they ran a fraction of each
    leak's period. With NVSHARE_PROMPT_LEAK_OPEN_MS=1 every segment passes for 1 ms from the first,
    until the server waits in a synchronise (2 ms, the default). A holder of 100 us kernels beside
    the host-bound server of the test above: its work that ran during each request (the requests'
    lengths read the same in both: 6.1-6.6 ms at the median here)."""
    measured, lengths, holder, _ = beside_a_host_bound_server(
        scheduler, hook_lib, procs, tmp_path, "train:100:200:250:0:0",
        {"NVSHARE_PROMPT_LEAK_OPEN_MS": open_ms})
    median, length = statistics.median(measured), statistics.median(lengths)
    print(f"open {open_ms}: the holder's work that ran during {len(measured)} requests of {length:.1f} ms "
          f"(median): median {median:.1f} ms, least {min(measured):.1f}, most {max(measured):.1f}")
    assert len(measured) >= 25, len(measured)
    assert "held on the GPU until it ends" in holder.stderr_text, holder.stderr_text[-3000:]
    said = re.search(r"leaks into prompt bursts: ([0-9]+) let a segment pass \(open ([0-9.]+) ms",
                     holder.stderr_text)
    assert said and int(said.group(1)) >= 50, holder.stderr_text[-3000:]
    if open_ms == "segment":
        assert float(said.group(2)) == 0, said.group(0)
        assert median <= 3.0, sorted(measured)   # 2.2-2.4 ms in runs here
        return
    assert float(said.group(2)) >= 50, said.group(0)
    assert median >= 3.3, sorted(measured)       # 3.8-4.1 ms


@pytest.mark.parametrize("linger", ["on", "off"])
def test_a_train_of_prompt_bursts_keeps_the_holders_queue_held_between_them(
        hook_lib, scheduler, tmp_path, procs, linger):
    """model.generate's tokens are bursts of their own, each ended by a synchronise, with a little
    host work between them (0.6-1.6 ms on the H200). Let go at each token's end, the training ran a
    kernel between two tokens (a 1.0-1.4 ms GEMM there) that the next token waited for. A prompt job
    whose bursts come in trains keeps the others held for 1.5 of its short gaps after each
    (NVSHARE_PROMPT_LINGER, on by default). Requests of 8 tokens (a 2 ms kernel after 1 ms of host
    work, a synchronise), no leaks (NVSHARE_PROMPT_LEAK_MS=off): the holder's work during a request
    is the 1 ms kernel under way at its start with the linger, and a kernel or more in each of its 7
    gaps without."""
    trace = tmp_path / "trace"
    env = {"NVSHARE_PROMPT_LEAK_MS": "off"}
    holder = start(scheduler, hook_lib, procs, trace, 1, TRAINING.format(n=450), env)
    action = "serve:2000:1:50:80:7:1000:8"
    server = start(scheduler, hook_lib, procs, trace, 2, action,
                   {**env, **({} if linger == "on" else {"NVSHARE_PROMPT_LINGER": "off"})}, delay_ms=150,
                   warmup=True)
    finish(server, timeout=90)
    finish(holder, timeout=90)
    launches = read_launches(trace)
    spans = request_spans_by_launch(launches, server.pid, action)
    measured, lengths = holder_during_requests(launches, holder.pid, spans)
    median = statistics.median(measured)
    print(f"linger {linger}: the holder's work that ran during {len(measured)} requests of "
          f"{statistics.median(lengths):.1f} ms (median): median {median:.1f} ms, most {max(measured):.1f}")
    assert len(measured) >= 15, len(measured)   # requests that came close together merge
    assert "its bursts are prompt" in server.stderr_text, server.stderr_text[-3000:]
    if linger == "on":
        assert median <= 2.0, sorted(measured)
    else:
        assert median >= 4.0, sorted(measured)


LEAK_SETTINGS = {   # what a malformed value is said to be not, and the default used
    "NVSHARE_PROMPT_LEAK_MS": "not off nor a number of milliseconds from 0.05 to 1000; using 0.5",
    "NVSHARE_PROMPT_LEAK_OPEN_MS": "not segment nor a number of milliseconds from 0.05 to 100; using 2.0",
    "NVSHARE_PROMPT_LEAK_LONG": "not fit or always; using always",
    "NVSHARE_PROMPT_LEAK_QUEUED": "neither 'on' nor 'off'; using 'off'",
    "NVSHARE_HOLD_COPIES": "not off, trains or always; using trains",
    "NVSHARE_PROMPT_HOLD": "not host or gpu; using gpu",
    "NVSHARE_PROMPT_EARLY": "not pace or hold; using hold"}


@pytest.mark.parametrize("name, value, said", [
    *[("NVSHARE_PROMPT_LEAK_MS", v, said) for v, said in [
        ("abc", True), ("-1", True), ("0.01", True), ("5000", True), ("0.5x", True), ("segment", True),
        ("0.5", False), ("2", False), ("off", False), ("0", False)]],
    *[("NVSHARE_PROMPT_LEAK_OPEN_MS", v, said) for v, said in [
        ("abc", True), ("0.01", True), ("101", True), ("1ms", True), ("off", True), ("0", True),
        ("1", False), ("0.5", False), ("segment", False), ("SEGMENT", False)]],
    *[("NVSHARE_PROMPT_LEAK_LONG", v, said) for v, said in [
        ("fits", True), ("1", True), ("off", True), ("fit", False), ("FIT", False), ("always", False)]],
    *[("NVSHARE_PROMPT_LEAK_QUEUED", v, said) for v, said in [
        ("maybe", True), ("2", True), ("offf", True), ("off", False), ("OFF", False), ("on", False),
        ("no", False)]],
    *[("NVSHARE_HOLD_COPIES", v, said) for v, said in [
        ("on", True), ("train", True), ("1", True), ("trains", False), ("ALWAYS", False), ("off", False)]],
    *[("NVSHARE_PROMPT_HOLD", v, said) for v, said in [
        ("cpu", True), ("hosts", True), ("host", False), ("GPU", False)]],
    *[("NVSHARE_PROMPT_EARLY", v, said) for v, said in [
        ("on", True), ("paced", True), ("pace", False), ("Hold", False)]]])
def test_a_malformed_leak_setting_is_said_and_the_default_used(
        hook_lib, scheduler, tmp_path, procs, name, value, said):
    """NVSHARE_PROMPT_LEAK_MS: off (or 0), or 0.05 to 1000 ms; NVSHARE_PROMPT_LEAK_OPEN_MS: segment, or
    0.05 to 100 ms; NVSHARE_PROMPT_LEAK_LONG: always or fit; NVSHARE_PROMPT_LEAK_QUEUED: on or off;
    NVSHARE_HOLD_COPIES: trains, always or off; NVSHARE_PROMPT_HOLD: gpu or host; NVSHARE_PROMPT_EARLY:
    hold or pace (case aside); anything else is said once and the default used (the job runs on)."""
    proc = start(scheduler, hook_lib, procs, tmp_path / "trace", 1, "launch:100:1 sync", {name: value})
    assert "sync ok" in finish(proc, timeout=60)
    text = f"{name}={value} is {LEAK_SETTINGS[name]}"
    assert (text in proc.stderr_text) == said, proc.stderr_text[-2000:]


@pytest.mark.parametrize("rule, requests", [("fit", "single"), ("always", "single"), ("fit", "train")])
def test_a_leak_lets_a_long_kernel_pass_only_into_a_prompt_burst_it_fits(
        hook_lib, scheduler, tmp_path, procs, rule, requests):
    """A leak into a batch-1 CNN's single 3.5 ms requests let an fp32 training's 1.0-1.4 ms GEMMs pass
    whole (on the H200 its p99 read 1.2-1.7x alone, its median request 0.4-0.7 ms longer than with no
    leaks). With NVSHARE_PROMPT_LEAK_LONG=fit a long kernel's wait (pace.c: a kernel of a segment or
    longer) waits on a word of its own that a leak lets go only into a prompt burst 4 times that
    kernel's length, or into a train of bursts (model.generate's tokens, each ended by a
    synchronise); the short kernels still pass. A holder of 20 kernels of 50 us and one of 4 ms per
    step, beside a host-bound server of single 6 ms requests (40 kernels of 20 us, each after 100 us
    of host work; its mean burst reads 8-12 ms here, under 16) or of trains (4 rounds of 30 such
    kernels, each ended by a synchronise): how many of the holder's 4 ms kernels began more than 1 ms
    into each request, from the 16th on (a warm-up's long burst counts in the mean before)."""
    trace = tmp_path / "trace"
    env = {"NVSHARE_PROMPT_LEAK_LONG": rule}
    holder = start(scheduler, hook_lib, procs, trace, 1, "mixtrain:50:20:4000:1:1200", env)
    action = "serve:20:40:50:60:7:100" if requests == "single" else "serve:20:30:40:80:7:100:4"
    server = start(scheduler, hook_lib, procs, trace, 2, action, env, delay_ms=150, warmup=True)
    finish(server, timeout=90)
    finish(holder, timeout=120)
    launches = read_launches(trace)
    spans = request_spans_by_launch(launches, server.pid, action)
    served = served_while_held(launches, holder.pid, spans)
    longs = [r[2] for r in launches if r[0] == holder.pid and r[1] == GPU0 and r[3] - r[2] >= 3_500_000]
    inside = [sum(1 for start in longs if a + 1_000_000 < start < b) for a, b in served][15:]
    said = re.search(r"leaks into prompt bursts: ([0-9]+) let a segment pass.* ([0-9]+) kept long kernels "
                     r"held", holder.stderr_text)
    print(f"{rule}, {requests}: the holder's long kernels begun inside {len(inside)} requests: {inside}; "
          f"{said and said.group(0)}")
    assert "its bursts are prompt" in server.stderr_text, server.stderr_text[-3000:]
    assert said and int(said.group(1)) >= 20, holder.stderr_text[-3000:]
    assert len(inside) >= 8, inside
    if rule == "fit" and requests == "single":
        assert int(said.group(2)) >= 50, said.group(0)
        assert sum(inside) <= len(inside) // 4, inside   # 2-5 in 26-35 in runs here
        return
    assert int(said.group(2)) == 0, said.group(0)
    assert sum(inside) >= len(inside) // 2, inside       # one or more in nearly every request


# The holder's debug count at exit: leaks made, and the queued requests it held without leaks.
QUEUED_SAID = re.compile(r"leaks into prompt bursts: ([0-9]+) let a segment pass.*; ([0-9]+) of ([0-9]+) "
                         r"requests that queued held without leaks")


def holder_beside_server(scheduler, hook_lib, procs, tmp_path, action: str, env: dict | None = None):
    """A holder of 1 ms kernels (job 1) beside a server of nvtest `action` (job 2, after a warm-up),
    both with `env`, run to their end: both processes, the trace's launches, and when the holder's last
    kernel ended."""
    trace = tmp_path / "trace"
    holder = start(scheduler, hook_lib, procs, trace, 1, TRAINING.format(n=300), env)
    server = start(scheduler, hook_lib, procs, trace, 2, action, env, delay_ms=150, warmup=True)
    finish(server, timeout=90)
    finish(holder, timeout=120)
    launches = read_launches(trace)
    return holder, server, launches, last_end(launches, holder.pid)


@pytest.mark.parametrize("rule", ["on", "off"])
def test_a_request_that_queued_is_not_leaked_into_with_the_setting_off(
        hook_lib, scheduler, tmp_path, procs, rule):
    """A batch-1 CNN's p99 beside a training is made by requests that queued behind another (on the H200,
    11-15 % of its requests arrive while one is served), each waiting for the one before and for its own
    service, both stretched by the training's leaked GEMMs. With NVSHARE_PROMPT_LEAK_QUEUED=off (the
    default) a prompt burst that began less than 1 ms after its job's burst before (and whose job's bursts
    do not come in trains) gets no leaks: the holder's work during it is what ran on at its start. A
    holder of 1 ms kernels beside a host-bound server of 6 ms requests (40 kernels of 20 us, each after
    100 us of host work) arriving 30 ms apart on average: the holder's work during the requests that began
    within 0.6 ms of the one before's end, and during the requests that began 3 ms or more after it, from
    the fourth request on."""
    holder, server, launches, holder_end = holder_beside_server(
        scheduler, hook_lib, procs, tmp_path, "serve:20:40:100:30:11:100",
        {"NVSHARE_PROMPT_LEAK_QUEUED": rule})
    requests = requests_by_count(launches, server.pid, 40)
    queued, single = [], []
    for before, (launched, a, b) in list(zip(requests, requests[1:], strict=False))[2:]:
        if b >= holder_end:
            break
        gap = launched - before[2]
        if gap < 600_000:
            queued.append(ran_ms(launches, holder.pid, a, b))
        elif gap >= 3_000_000:
            single.append(ran_ms(launches, holder.pid, a, b))
    said = QUEUED_SAID.search(holder.stderr_text)
    print(f"{rule}: the holder's work during {len(queued)} requests that queued: "
          f"{sorted(round(x, 1) for x in queued)}; during {len(single)} others: median "
          f"{statistics.median(single):.1f} ms; {said and said.group(0)}")
    assert "its bursts are prompt" in server.stderr_text, server.stderr_text[-3000:]
    assert said and int(said.group(1)) >= 20, holder.stderr_text[-3000:]
    assert len(queued) >= 6 and len(single) >= 20, (queued, single)
    assert statistics.median(single) >= 2.5, sorted(single)   # leaks either way
    if rule == "off":
        assert int(said.group(2)) == int(said.group(3)) >= 6, said.group(0)
        assert statistics.median(queued) <= 1.5, sorted(queued)
        return
    assert int(said.group(2)) == 0 and int(said.group(3)) >= 6, said.group(0)
    assert statistics.median(queued) >= 2.5, sorted(queued)


def test_a_request_of_two_bursts_still_gets_leaks_into_its_second(hook_lib, scheduler, tmp_path, procs):
    """A request made of two bursts less than 1 ms apart (a synchronise in a server's preprocessing)
    is not taken for two requests, the second queued: half its job's gaps are short, so its bursts
    come in trains (burst.c's lingering), and with NVSHARE_PROMPT_LEAK_QUEUED=off (the default) the
    holder still leaks into the second burst. A holder of 1 ms kernels beside a host-bound server whose
    requests are two rounds of 30 kernels of 20 us (each after 100 us of host work, a synchronise after
    each round), arriving 30 ms apart on average: the holder's work during each request's second round,
    from the fourth request on."""
    holder, server, launches, holder_end = holder_beside_server(
        scheduler, hook_lib, procs, tmp_path, "serve:20:30:80:30:11:100:2")
    seconds = [(a, b) for _, a, b in requests_by_count(launches, server.pid, 30)[1::2][3:] if b < holder_end]
    during = [ran_ms(launches, holder.pid, a, b) for a, b in seconds]
    said = QUEUED_SAID.search(holder.stderr_text)
    print(f"the holder's work during {len(during)} second rounds of "
          f"{statistics.median((b - a) / 1e6 for a, b in seconds):.1f} ms (median): median "
          f"{statistics.median(during):.1f} ms, least {min(during):.1f}; {said and said.group(0)}")
    assert "its bursts are prompt" in server.stderr_text, server.stderr_text[-3000:]
    assert len(during) >= 30, len(during)
    assert said and int(said.group(1)) >= 20, holder.stderr_text[-3000:]
    assert statistics.median(during) >= 2.0, sorted(during)


# The holder's waits on the host for co-runners' prompt bursts (burst.c's yield point), 1 ms or longer.
HOST_WAITS = re.compile(r"waited ([0-9.]+) ms for co-runners' prompt bursts")


# A host-bound server of single requests (40 kernels of 20 us, each after 100 us of host work: 6 ms), or of
# trains (3 tokens of 30 such kernels, 100 us apart: model.generate's), arriving 60 ms apart on average.
COPY_SERVERS = {"single": "serve:20:40:50:60:7:100", "trains": "serve:20:30:50:60:7:100:3"}


@pytest.mark.parametrize("server, copies", [("trains", "trains"), ("trains", "off"), ("single", "trains"),
                                            ("single", "always")])
def test_a_holders_copies_are_held_on_the_gpu_beside_a_train_of_prompt_bursts(
        hook_lib, scheduler, tmp_path, procs, server, copies):
    """A PyTorch training begins each step with a copy of its batch to the GPU and ends it with a copy of
    its loss back (.item()). Every call that enters the gate waited on the host while a co-runner's prompt
    burst ran, launches held on the GPU aside: so beside model.generate (requests of many bursts) the
    training's host stood through whole requests at its steps' copies, with nothing queued for the leaks
    (on the H200, 3.2 s of such waits in a 20 s window, and 1423 leaks that found nothing waiting). With
    NVSHARE_HOLD_COPIES=trains (the default) a copy into a stream goes behind a wait of its own on the GPU,
    as a launch does, while the prompt job's bursts come in trains, and the holder's work goes on through
    leaks; beside single requests it still waits on the host (a batch-1 CNN's 3 ms: on the H200 its
    requests were served faster so, the training as fast); `always` holds it on the GPU for any. A holder
    of steps of 4 kernels of 1 ms between a copy in and a copy out (then a synchronise) beside a host-bound
    server (COPY_SERVERS): the holder's work during each request, and its waits on the host."""
    measured, lengths, holder, served = beside_a_host_bound_server(
        scheduler, hook_lib, procs, tmp_path, "copytrain:1000:4:1500", {"NVSHARE_HOLD_COPIES": copies},
        COPY_SERVERS[server])
    median, length = statistics.median(measured), statistics.median(lengths)
    waits = [float(w) for w in HOST_WAITS.findall(holder.stderr_text)]
    print(f"{server} requests, copies {copies}: the holder's work during {len(measured)} requests of "
          f"{length:.1f} ms (median): median {median:.1f} ms, least {min(measured):.1f}; "
          f"{len(waits)} waits on the host of 1 ms or more, {sum(waits):.0f} ms in all")
    held_beside(measured, holder, served)
    held = copies == "always" or (copies == "trains" and server == "trains")
    if not held:
        assert len(waits) >= 10, holder.stderr_text[-3000:]
        assert median <= 0.55 * length, sorted(measured)
        return
    assert len(waits) <= 3, waits   # the server's first requests, before its bursts are known as trains
    # Beside the trains the holder's work ran 0.55-0.80 of a request at the median (0.62 and 0.55 in two
    # loaded CI runs: the leaks' watcher shares 2 cores with both jobs and the daemon), 0.06-0.20 not
    # held. Beside single requests, held (`always`), it read 0.28-0.78 on one machine in one afternoon,
    # with the leaks into requests that did not queue: only its host waits tell the rule there.
    if server == "trains":
        assert median > 0.4 * length, sorted(measured)


def token_ends(launches, pid: int, kernels: int, tokens: int) -> list[int]:
    """A server's tokens (`kernels` kernels each, `tokens` a request, after a warm-up), past its first four
    requests: when each token's last kernel was launched (its synchronise begins then)."""
    return [g[-1][4] for g in launch_groups(launches, pid, kernels)[4 * tokens:]]


def ran_on_ms(launches, pid: int, at: int) -> float:
    """pid's work that began before `at` and ran on after it, in ms (what a synchronise at `at` waits for
    on a GPU that runs one context at a time)."""
    return sum(end - at for p, gpu, start, end, _ in launches
               if p == pid and gpu == GPU0 and start < at < end) / 1e6


@pytest.mark.parametrize("fit", ["on", "off"])
def test_a_leak_into_a_train_of_prompt_bursts_ends_before_its_synchronise(
        hook_lib, scheduler, tmp_path, procs, fit):
    """model.generate's tokens each end with a synchronise 2-3.5 ms after they begin, and a leak that let an
    fp32 training's GEMM (1.0-2.0 ms) pass late in a token made the synchronise wait for it: on the H200
    generate's host waited 5.5-11.5 ms a request in its synchronises beside the training (0.2 alone). With
    NVSHARE_PROMPT_LEAK_FIT=on a leak into a train's burst begins only where what it lets pass, as long as
    the longest its leaks ran on after their window shut, ends by 3/4 of the prompt job's mean burst. A
    holder of 1 ms kernels beside a host-bound server of 3 tokens a request (30 kernels of 20 us, each
    after 100 us of host work, then a synchronise), requests 60 ms apart on average: the holder's work
    that ran on past each token's last launch (the fake GPU runs both at once; a real one runs the
    token's kernels after it), and its work during each request."""
    action = "serve:20:30:50:60:7:100:3"
    env = {"NVSHARE_PROMPT_LEAK_FIT": fit}
    trace = tmp_path / "trace"
    holder = start(scheduler, hook_lib, procs, trace, 1, TRAINING.format(n=300), env)
    server = start(scheduler, hook_lib, procs, trace, 2, action, delay_ms=150, warmup=True)
    finish(server, timeout=90)
    finish(holder, timeout=120)
    launches = read_launches(trace)
    holder_end = last_end(launches, holder.pid)
    at_sync = [ran_on_ms(launches, holder.pid, t) for t in token_ends(launches, server.pid, 30, 3)
               if t < holder_end]
    spans = request_spans_by_launch(launches, server.pid, action)
    measured, lengths = holder_during_requests(launches, holder.pid, spans)
    late = re.search(r"([0-9]+) not made \(too late to end before its synchronise was due; "
                     r"ran on ([0-9.]+) ms", holder.stderr_text)
    some = sum(1 for w in at_sync if w > 0.1) / len(at_sync)
    print(f"fit {fit}: the holder's work ran on past {some:.0%} of {len(at_sync)} tokens' last launches "
          f"(median {statistics.median(at_sync):.2f} ms, mean {statistics.mean(at_sync):.2f}); its work "
          f"during {len(measured)} requests of {statistics.median(lengths):.1f} ms: median "
          f"{statistics.median(measured):.1f} ms; {late and late.group(0)}")
    held_beside(measured, holder, server)
    assert len(at_sync) >= 60, len(at_sync)
    assert late, holder.stderr_text[-3000:]
    if fit == "off":
        assert int(late.group(1)) == 0, late.group(0)
        assert some >= 0.3, sorted(at_sync)
        return
    assert int(late.group(1)) >= 20, late.group(0)
    # Most of a 1 ms kernel, and the looks; the longest of them, so a loaded host's late looks add to it
    # (2.1-7.7 ms in 3 of 6 runs here beside a Slurm test run, on this build and the one before).
    assert 0.5 <= float(late.group(2)) <= 10.0, late.group(0)
    assert some <= 0.2, sorted(at_sync)   # off: 0.3 or more (a clean-clone CI run here read 0.159)
    # Leaks still go in: from each token's begin until a kernel would run past 3/4 of it.
    assert statistics.median(measured) >= 0.2 * statistics.median(lengths), sorted(measured)


def test_a_training_that_pauses_is_not_taken_for_a_server(hook_lib, scheduler, tmp_path, procs):
    """A training that steps and pauses in turn (on the H200 2 s of steps, 2 s idle) reads little busy
    after each pause, its gaps as irregular as a server's: its steps, bursts of hundreds of ms, ran as
    prompt ones until its busy share passed 80 %, the server beside it waited for them and its queue
    was not held (burst.c's SERVE_BURST_MAX_NS: a server's bursts become prompt only while their mean
    is at most 50 ms). A holder of 5 phases of 60 steps of 20 kernels of 1 ms, each followed by 1.5 s
    idle, beside a host-bound server of 3 tokens a request: the holder is never a prompt job by the
    server rule and holds its queue for the server's requests; the server's bursts are prompt."""
    trace = tmp_path / "trace"
    phases = " ".join(["train:1000:20:60:0:0 sleep:1500"] * 5)
    holder = start(scheduler, hook_lib, procs, trace, 1, phases)
    server = start(scheduler, hook_lib, procs, trace, 2, "serve:20:30:200:60:7:100:3", delay_ms=150,
                   warmup=True)
    finish(server, timeout=90)
    finish(holder, timeout=120)
    classes = re.findall(r"its bursts are (prompt|not prompt)[^\n]*", holder.stderr_text)
    held = re.search(r"held its queue ([0-9]+) times for prompt bursts", holder.stderr_text)
    print(f"the holder's classes: {classes}; {held and held.group(0)}")
    assert "its bursts are prompt" in server.stderr_text, server.stderr_text[-3000:]
    as_server = [line for line in re.findall(r"its bursts are prompt[^\n]*", holder.stderr_text)
                 if ": a server)" in line]
    assert not as_server, as_server
    assert held and int(held.group(1)) >= 20, holder.stderr_text[-3000:]
