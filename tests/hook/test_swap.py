"""Swap: jobs whose memory does not fit together take turns, their memory moving to host memory.

The fake driver's device memory is shared between processes here (FAKE_CUDA_SHARED_MEMORY), so a
second job that allocates what the first one holds really gets CUDA_ERROR_OUT_OF_MEMORY without
nvshare, as on a real GPU. Under the hook and the real nvshare-scheduler both jobs finish, their
data intact at the addresses they were given.
"""
from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers_daemon import gpu_status
from helpers_hook import GPU0, NVTEST, Job, finish, overlaps, read_trace, start_nvtest

MiB = 1 << 20
GPU_MEMORY = "1G"          # usable at the default 5 % reserve: 972.8 MiB
JOB_BYTES = 600 * MiB      # one job fits, two do not: 1200 MiB
FIXED_BYTES = 1 * MiB      # below the 2 MiB granularity: a fixed allocation


def swapped_out(stderr: str) -> list[float]:
    return [float(m) for m in re.findall(r"swapped out ([\d.]+) MiB", stderr)]


class StatusSampler(threading.Thread):
    """Samples the GPU's status while a test runs: what nvshare-status would have shown."""

    def __init__(self, sched):
        super().__init__(daemon=True)
        self.sched = sched
        self.samples: list[dict] = []
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            try:
                t = time.monotonic_ns()  # CLOCK_MONOTONIC, as nvtest's stamp
                self.samples.append({**gpu_status(self.sched), "t": t})
            except Exception:
                pass
            time.sleep(0.02)

    def stop(self) -> list[dict]:
        self.done.set()
        self.join(5)
        return self.samples


def test_without_nvshare_the_second_job_runs_out_of_memory(hook_lib, tmp_path):
    """The control: the same two allocations alone on the same (shared) fake GPU."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVSHARE_", "FAKE_CUDA_"))}
    env.update(LD_LIBRARY_PATH=str(NVTEST.parent), FAKE_CUDA_DEVICES=f"{GPU0}:{GPU_MEMORY}",
               FAKE_CUDA_SHARED_MEMORY=str(tmp_path / "device-memory"))
    first = subprocess.Popen([str(NVTEST), "init", "ctx:0", f"alloc:{JOB_BYTES}", "sleep:3000"],
                             env=env, stdout=subprocess.PIPE, text=True)
    try:
        lines = [first.stdout.readline() for _ in range(3)]
        assert lines[2].strip() == f"alloc {JOB_BYTES} rc=0", lines
        second = subprocess.run([str(NVTEST), "init", "ctx:0", f"alloc:{JOB_BYTES}"], env=env,
                                capture_output=True, text=True, timeout=30)
        assert f"alloc {JOB_BYTES} rc=2" in second.stdout  # CUDA_ERROR_OUT_OF_MEMORY
    finally:
        first.kill()
        first.wait()


def test_jobs_that_do_not_fit_together_take_turns_and_keep_their_data(hook_lib, small_gpu,
                                                                      tmp_path, procs):
    sched = small_gpu()
    trace = tmp_path / "trace"
    a = Job(sched, 301, trace, gpu_index=[0], **sched.fake_env)
    b = Job(sched, 302, trace, gpu_index=[0], **sched.fake_env)
    actions = ["init", "ctx:0", f"alloc:{FIXED_BYTES}", f"pattern:{JOB_BYTES}:4:50000", "freeall"]
    sampler = StatusSampler(sched)
    sampler.start()
    procs.append(start_nvtest(hook_lib, actions, a.env))
    time.sleep(0.3)
    # b's driver refuses cuMemHostRegister (some do, in containers): its host copies come from
    # cuMemHostAlloc instead (hostpin.c), a's are its own pages registered.
    procs.append(start_nvtest(hook_lib, actions, dict(b.env, FAKE_CUDA_NO_HOST_REGISTER="1")))
    outs = [finish(p, timeout=120) for p in procs]
    samples = sampler.stop()
    for out, p in zip(outs, procs, strict=True):
        assert "pattern ok rounds=4" in out, out + p.stderr_text
    fallback = "cuMemHostAlloc instead"
    assert fallback not in procs[0].stderr_text, procs[0].stderr_text[-2000:]
    assert fallback in procs[1].stderr_text, procs[1].stderr_text[-2000:]
    # They never ran at once, and each gave memory up to the other at least once.
    assert overlaps(read_trace(trace), GPU0) == []
    moved = [swapped_out(p.stderr_text) for p in procs]
    assert all(m and max(m) > 0 for m in moved), moved
    # A hand-over moves what the next job needs, not everything: some moves were partial.
    assert any(0 < x < JOB_BYTES / MiB for m in moved for x in m), moved
    # Fixed memory stayed: while both were attached, the GPU's fixed bytes were their 1 MiB each,
    # and resident memory never passed what the GPU has.
    both = [s for s in samples if s["memory_fixed"] == 2 * FIXED_BYTES]
    assert both, "the 1 MiB fixed allocations were never reported as fixed"
    assert max(s["memory_used"] for s in samples) <= 1 << 30
    assert any(s["memory_swapped"] > 0 for s in samples)


def test_host_copies_pinned_ahead_leave_nothing_to_pin_at_a_swap(hook_lib, small_gpu, tmp_path, procs):
    """NVSHARE_SWAP_PREPIN=1 (job a): its host copies are pinned while it runs, so none of its
    swap-outs pins first (on the H100 a first swap-out ran at 1.6 GB/s for the pinning, 53 GB/s
    into copies pinned before: bench/bench_pinning.py). Job b, with it off, pins at its first
    swap-out. Both keep their data."""
    sched = small_gpu()
    trace = tmp_path / "trace"
    a = Job(sched, 311, trace, gpu_index=[0], **sched.fake_env)
    b = Job(sched, 312, trace, gpu_index=[0], **sched.fake_env)
    actions = ["init", "ctx:0", f"pattern:{JOB_BYTES}:4:50000", "freeall"]
    procs.append(start_nvtest(hook_lib, actions, dict(a.env, NVSHARE_SWAP_PREPIN="1")))
    time.sleep(1.0)
    procs.append(start_nvtest(hook_lib, actions, dict(b.env, NVSHARE_SWAP_PREPIN="off")))
    outs = [finish(p, timeout=120) for p in procs]
    for out, p in zip(outs, procs, strict=True):
        assert "pattern ok rounds=4" in out, out + p.stderr_text
    pinned_first = [[int(n) for n in re.findall(r"(\d+) chunks pinned first", p.stderr_text)]
                    for p in procs]
    assert pinned_first[0] and max(pinned_first[0]) == 0, (pinned_first, procs[0].stderr_text[-2000:])
    assert "of host copies pinned ahead" in procs[0].stderr_text
    assert pinned_first[1] and pinned_first[1][0] > 0, pinned_first
    assert "pinned ahead" not in procs[1].stderr_text


def test_with_prepin_ahead_a_job_pins_its_host_copies_once_turns_need_swap(hook_lib, small_gpu, tmp_path,
                                                                           procs):
    """NVSHARE_SWAP_PREPIN=ahead: job a is granted alone (its memory fits: nothing pinned), then b
    comes and the memory no longer fits. Each grant from then on says SWAP_AHEAD, and each hook
    starts pinning its host copies during its turn, so its next swap-out runs at bus speed (on
    the H100 two 45 GiB jobs moved 14.5 GiB in 2.9-3.6 s at a first swap-out, 0.3 s later; c,
    with the setting off, pins nothing ahead)."""
    sched = small_gpu()
    trace = tmp_path / "trace"
    a = Job(sched, 321, trace, gpu_index=[0], **sched.fake_env, NVSHARE_SWAP_PREPIN="ahead")
    b = Job(sched, 322, trace, gpu_index=[0], **sched.fake_env, NVSHARE_SWAP_PREPIN="ahead")
    c = Job(sched, 323, trace, gpu_index=[0], **sched.fake_env, NVSHARE_SWAP_PREPIN="off")
    actions = ["init", "ctx:0", f"pattern:{JOB_BYTES}:4:50000", "freeall"]
    for job in (a, b, c):
        procs.append(start_nvtest(hook_lib, actions, job.env))
        time.sleep(0.5)
    outs = [finish(p, timeout=180) for p in procs]
    for out, p in zip(outs, procs, strict=True):
        assert "pattern ok rounds=4" in out, out + p.stderr_text
    for p in procs[:2]:
        assert "turns with swap: the newest" in p.stderr_text, p.stderr_text[-3000:]
        assert "of host copies pinned ahead" in p.stderr_text, p.stderr_text[-3000:]
    assert "pinned ahead" not in procs[2].stderr_text
    assert overlaps(read_trace(trace), GPU0) == []


def test_prepin_ahead_pins_only_what_the_gpu_lacks_room_for(hook_lib, small_gpu, tmp_path, procs):
    """Two jobs of 600 MiB on 972.8 MiB: the GPU lacks room for 227 MiB of either beside the other,
    so a SWAP_AHEAD grant says that much and each hook pins its newest chunks up to it (88 + 256
    MiB: the chunks a swap-out moves first), not all 600 MiB. Pinning all of it, two 45 GiB jobs on
    the H100 pinned 90 GiB of host memory, and the first one's exit slowed the other's last swap-in
    from 0.3 s to 4 s. The second job leaves the setting unset: ahead is the default."""
    sched = small_gpu()
    trace = tmp_path / "trace"
    jobs = [Job(sched, 331, trace, gpu_index=[0], **sched.fake_env, NVSHARE_SWAP_PREPIN="ahead"),
            Job(sched, 332, trace, gpu_index=[0], **sched.fake_env)]
    actions = ["init", "ctx:0", f"pattern:{JOB_BYTES}:6:50000", "freeall"]
    for job in jobs:
        procs.append(start_nvtest(hook_lib, actions, job.env))
        time.sleep(0.5)
    outs = [finish(p, timeout=180) for p in procs]
    for out, p in zip(outs, procs, strict=True):
        assert "pattern ok rounds=6" in out, out + p.stderr_text
    logs = "".join(p.stderr_text for p in procs)
    told = [float(m) for m in re.findall(r"the newest ([\d.]+) MiB of host copies pinned ahead", logs)]
    pinned = [float(m) for m in re.findall(r"([\d.]+) MiB of host copies pinned ahead\n", logs)]
    assert len(told) >= 2 and all(220 < t < 235 for t in told), told
    assert all("the newest" in p.stderr_text for p in procs)
    assert pinned and max(pinned) == 344.0, pinned     # one pass pinned 88 + 256 MiB, the next 256
    assert sum(pinned) < 2 * 600, pinned               # never all of both jobs' memory
    assert overlaps(read_trace(trace), GPU0) == []


def test_an_allocation_that_can_never_fit_is_refused_clearly(hook_lib, small_gpu, tmp_path, procs):
    """A job with swap off holds 700 MiB fixed; 400 MiB more can never fit beside it (972 usable)."""
    sched = small_gpu()
    trace = tmp_path / "trace"
    holder = Job(sched, 311, trace, gpu_index=[0], NVSHARE_SWAP="off", **sched.fake_env)
    asker = Job(sched, 312, trace, gpu_index=[0], **sched.fake_env)
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{700 * MiB}", "sleep:2000",
                                         "freeall"], holder.env))
    deadline = time.monotonic() + 10
    while gpu_status(sched)["memory_fixed"] < 700 * MiB and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gpu_status(sched)["memory_fixed"] == 700 * MiB
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{400 * MiB}",
                                         f"alloc:{200 * MiB}"], asker.env))
    out = finish(procs[1], timeout=30)
    assert f"alloc {400 * MiB} rc=2" in out          # CUDA_ERROR_OUT_OF_MEMORY, not a hang
    assert f"alloc {200 * MiB} rc=0" in out          # what can fit still does
    assert "refused by nvshare-scheduler" in procs[1].stderr_text
    finish(procs[0], timeout=30)


def test_without_virtual_memory_management_allocations_are_fixed(hook_lib, small_gpu, tmp_path):
    sched = small_gpu()
    job = Job(sched, 321, tmp_path / "trace", gpu_index=[0], FAKE_CUDA_NO_VMM="1", **sched.fake_env)
    from test_hook import run_nvtest
    out = run_nvtest(hook_lib, ["init", "ctx:0", f"pattern:{8 * MiB}:2:1000", "copy"], env=job.env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "pattern ok rounds=2" in out.stdout and "copy ok" in out.stdout
    assert "no virtual memory management" in out.stderr


def _memory_cgroup(tmp_path: Path, limit: int) -> Path | None:
    """A child memory cgroup (v1 or v2) with `limit` bytes, or None where this machine has none."""
    if os.geteuid() != 0:
        return None
    for root, limit_file in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes"),
                             ("/sys/fs/cgroup", "memory.max")):
        own = ""
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if ("memory" in controllers.split(",") and root.endswith("memory")) or \
                    (controllers == "" and not root.endswith("memory")):
                own = path
        base = Path(root + own)
        if not (base / limit_file).exists():
            continue
        child = base / f"nvshare-test-{os.getpid()}-{tmp_path.name}"[:60]
        try:
            child.mkdir()
            (child / limit_file).write_text(str(limit))
        except OSError:
            continue
        return child
    return None


def test_a_job_whose_memory_limit_cannot_hold_its_swap_keeps_running(hook_lib, small_gpu, tmp_path,
                                                                     procs):
    """The fake GPU's memory is host memory of the process (600 MiB); its cgroup allows 800 MiB, so
    the 350+ MiB that a swap would pin do not fit: the hook moves nothing and says why, and is not
    killed by the OOM killer; the other job runs once the first is done."""
    cgroup = _memory_cgroup(tmp_path, 800 * MiB)
    if cgroup is None:
        pytest.skip("no writable memory cgroup here (needs root and cgroup v1 or v2 memory)")
    try:
        sched = small_gpu()
        trace = tmp_path / "trace"
        limited = Job(sched, 331, trace, gpu_index=[0], **sched.fake_env)
        other = Job(sched, 332, trace, gpu_index=[0], **sched.fake_env)
        env = dict(limited.env)
        procs_file = cgroup / "cgroup.procs"
        wrapper = ["/bin/sh", "-c", f'echo $$ > "{procs_file}" && exec "$0" "$@"', str(NVTEST)]
        full_env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("NVSHARE_", "SLURM_", "FAKE_CUDA_"))}
        full_env.update({"LD_LIBRARY_PATH": str(NVTEST.parent), "LD_PRELOAD": str(hook_lib)}, **env)
        first = subprocess.Popen([*wrapper, "init", "ctx:0", f"pattern:{JOB_BYTES}:4:200000"],
                                 env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        procs.append(first)
        time.sleep(0.5)
        procs.append(start_nvtest(hook_lib, ["init", "ctx:0", f"pattern:{JOB_BYTES}:2:1000"],
                                  other.env))
        out_first = finish(first, timeout=120)
        out_other = finish(procs[1], timeout=120)
        assert "pattern ok rounds=4" in out_first
        assert "pattern ok rounds=2" in out_other
        assert "memory limit" in first.stderr_text and "stays on the GPU" in first.stderr_text
        assert not swapped_out(first.stderr_text) or max(swapped_out(first.stderr_text)) == 0
    finally:
        try:
            cgroup.rmdir()
        except OSError:
            pass


# ---- the driver refuses to unmap ------------------------------------------------------------------

def test_a_free_the_driver_cannot_unmap_fails_and_stays_tracked(hook_lib, small_gpu, tmp_path, procs):
    """cuMemFree of swappable memory unmaps its chunks: when the driver refuses, the free reports the
    error, the memory stays counted (it is still on the GPU), and a retry frees it."""
    sched = small_gpu()
    job = Job(sched, 331, tmp_path / "trace", gpu_index=[0], FAKE_CUDA_UNMAP_FAIL="1", **sched.fake_env)
    sampler = StatusSampler(sched)
    sampler.start()
    stamped = []

    def timed(proc):
        out = finish(proc)
        stamped.extend(int(line.split()[1]) for line in out.splitlines() if line.startswith("stamp "))
        return out
    proc = start_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{64 * MiB}", "free:0", "stamp", "sleep:600",
                                   "stamp", "free:0", "stamp", "sleep:600", "stamp"], job.env)
    procs.append(proc)
    out = timed(proc)
    samples = sampler.stop()
    assert out.count("free rc=") == 2 and "free rc=1\n" in out and "free rc=0\n" in out, out
    assert "would not unmap them" in proc.stderr_text, proc.stderr_text
    # The hook's memory report follows its free: samples from 100 ms after each stamp (CI's loaded
    # machine once sampled 64 MiB just after the retry had freed it, before the report arrived).
    lag = 100_000_000
    after_failure = [s for s in samples if stamped[0] + lag <= s["t"] <= stamped[1]]
    after_retry = [s for s in samples if stamped[2] + lag <= s["t"] <= stamped[3]]
    assert after_failure and all(s["memory_used"] == 64 * MiB for s in after_failure), after_failure
    assert after_retry and all(s["memory_used"] == 0 for s in after_retry), after_retry


def test_a_swap_out_the_driver_cannot_unmap_keeps_the_data(hook_lib, small_gpu, tmp_path, procs):
    """The first unmap of a swap-out fails: that chunk stays on the GPU with its data, the job goes
    on, and both jobs still finish with their data intact."""
    sched = small_gpu()
    trace = tmp_path / "trace"
    a = Job(sched, 341, trace, gpu_index=[0], FAKE_CUDA_UNMAP_FAIL="1", **sched.fake_env)
    b = Job(sched, 342, trace, gpu_index=[0], **sched.fake_env)
    actions = ["init", "ctx:0", f"pattern:{JOB_BYTES}:3:50000"]
    # a keeps its memory until b has finished: b can only run once a's memory went out, so the
    # failing unmap is the swap-out's, never a's own cuMemFree (a fast a once finished first).
    released = tmp_path / "b-finished"
    procs.append(start_nvtest(hook_lib, actions[:2] + [f"{actions[2]}:{released}"], a.env))
    deadline = time.monotonic() + 60
    while not (trace.exists() and f"{procs[0].pid} " in trace.read_text()):
        assert time.monotonic() < deadline and procs[0].poll() is None, "job a never ran on the GPU"
        time.sleep(0.02)
    procs.append(start_nvtest(hook_lib, actions, b.env))
    try:
        out_b = finish(procs[1], timeout=60)
    except AssertionError as exc:
        procs[0].kill()
        raise AssertionError(procs[0].communicate()[1]) from exc
    released.touch()
    out_a = finish(procs[0], timeout=120)
    assert "pattern held ok" in out_a, out_a + procs[0].stderr_text
    for out, p in ((out_a, procs[0]), (out_b, procs[1])):
        assert "pattern ok rounds=3" in out, out + p.stderr_text
    err_a = procs[0].stderr_text
    assert "they stay on the GPU" in err_a and "would not unmap" not in err_a, err_a
    assert err_a.index("drop requested") < err_a.index("they stay on the GPU"), err_a
    assert overlaps(read_trace(trace), GPU0) == []
