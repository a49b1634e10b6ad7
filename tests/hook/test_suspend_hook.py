"""Suspend with the hook (issue 28): a job Slurm suspends moves its GPU memory to host memory through
libnvshare.so's swap, another job uses the GPU meanwhile, and on resume the memory comes back before
the job's next GPU call, its data intact. The program's own signal handling is untouched.

The fake driver's device memory is shared between processes (FAKE_CUDA_SHARED_MEMORY), so the freed
memory is really free; Slurm's word comes from a stand-in squeue in the daemon's slurm_bin_dir."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers_daemon import gpu_status, wait_for
from helpers_hook import BUILD, GPU0, Job, finish, read_copies, read_trace, start_nvtest

MiB = 1 << 20
JOB_BYTES = 600 * MiB          # the small GPU holds one such job, not two



def suspend_fed_scheduler(small_gpu, tmp_path):
    """A started scheduler that learns of Slurm's suspensions from the file `suspended` (its
    squeue prints it; empty: none): (scheduler, suspended)."""
    sched = small_gpu(start=False, suspend_slurm_poll_sec=0.2, suspend_check_sec=0.1)
    suspended = tmp_path / "suspended"
    suspended.write_text("")
    squeue = Path(sched.workdir) / "squeue"
    squeue.write_text(f"#!/bin/sh\ncat {suspended}\n")
    squeue.chmod(0o755)
    sched.start()
    return sched, suspended


def test_a_suspended_job_frees_the_gpu_and_resumes_with_its_data(hook_lib, small_gpu, tmp_path,
                                                                 procs):
    sched, suspended = suspend_fed_scheduler(small_gpu, tmp_path)
    trace = tmp_path / "trace"
    low = Job(sched, 401, trace, gpu_index=[0], **sched.fake_env)
    high = Job(sched, 402, trace, gpu_index=[0], **sched.fake_env)
    hold = tmp_path / "resume-check"
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", f"pattern:{JOB_BYTES}:2:1000:{hold}"],
                              low.env))
    wait_for(lambda: gpu_status(sched)["memory_used"] >= JOB_BYTES, what="the low job's memory")

    suspended.write_text("401\n")
    gpu = wait_for(lambda: (g := gpu_status(sched))["memory_swapped"] == JOB_BYTES and g,
                   what="the low job's memory in host memory")
    assert gpu["memory_used"] < JOB_BYTES and gpu["holders"] == []

    # Meanwhile another job gets the GPU's memory and runs to its end.
    other = start_nvtest(hook_lib, ["init", "ctx:0", f"pattern:{JOB_BYTES}:2:1000", "freeall"],
                         high.env)
    assert "pattern ok rounds=2" in finish(other, timeout=60)
    # The low job's next GPU call (the check after its hold) waits while it is suspended ...
    hold.write_text("")
    time.sleep(1.0)
    assert procs[0].poll() is None
    assert gpu_status(sched)["memory_swapped"] == JOB_BYTES
    # ... and goes ahead with its memory back once Slurm resumes it.
    suspended.write_text("")
    out = finish(procs[0], timeout=60)
    assert "pattern held ok" in out and "pattern ok rounds=2" in out, out
    log = sched.log()
    assert "suspended (its job is suspended by Slurm)" in log
    assert "runs again after" in log


CHUNK = 256 * MiB              # the hook's swap chunk (csrc/swap.c)
SLOW_JOB_BYTES = 900 * MiB     # four chunks: 256, 256, 256 and 132 MiB
COPY_MS = 1000                 # each chunk's copy to host memory or back, on the fake driver


def copies(log: Path, way: str) -> list[tuple[int, int]]:
    """(start_ns, end_ns) of each slow copy `way` (dtoh: swap-out, htod: swap-in), CLOCK_MONOTONIC."""
    return [(start, end) for _, w, start, end in read_copies(log) if w == way]


def slow_swap_job(small_gpu, tmp_path, job_id: int):
    """suspend_fed_scheduler's, and a job whose swap copies take COPY_MS each: (scheduler,
    suspended, job, copy log)."""
    sched, suspended = suspend_fed_scheduler(small_gpu, tmp_path)
    copy_log = tmp_path / "copies"
    job = Job(sched, job_id, tmp_path / "trace", gpu_index=[0],
              FAKE_CUDA_SWAP_COPY_MS=str(COPY_MS), FAKE_CUDA_COPY_LOG=str(copy_log),
              **sched.fake_env)
    return sched, suspended, job, copy_log


@pytest.mark.parametrize("order", ["resume-then-thaw", "thaw-then-resume", "thaw-out-parked-resume"])
def test_a_swap_out_the_freeze_caught_stops_when_the_job_resumes(hook_lib, small_gpu, tmp_path,
                                                                 procs, order):
    """The H100 run (docs/gpu-results.md, 2026-11-25): the daemon asked a holder to move its memory
    out for a suspend, Slurm froze it half-way, and after the resume the hook first finished the
    swap-out and then brought everything back. Now the daemon says RESUMED and the swap-out stops
    between chunks: what is still on the GPU stays, what moved comes back with the grant.
    resume-then-thaw is Slurm's order (RUNNING, then the thaw). In the other two the process runs
    while Slurm still says SUSPENDED, so the daemon keeps it suspended and its swap-out goes on:
    thaw-then-resume resumes it during the swap-out (which stops); in thaw-out-parked-resume the
    swap-out ends, the hook releases, its lock request is parked, and only then does the job
    resume: RESUMED finds nothing to stop, and the grant brings all of it back."""
    sched, suspended, job, copy_log = slow_swap_job(small_gpu, tmp_path, 404)
    hold = tmp_path / "resume-check"
    proc = start_nvtest(hook_lib, ["init", "ctx:0", f"pattern:{SLOW_JOB_BYTES}:2:1000:{hold}"],
                        job.env)
    procs.append(proc)
    wait_for(lambda: gpu_status(sched)["memory_used"] >= SLOW_JOB_BYTES, what="the job's memory")

    suspended.write_text("404\n")
    # The first chunk is out; the freeze catches the swap-out in the second one.
    wait_for(lambda: copies(copy_log, "dtoh"), timeout=15, what="the first chunk in host memory")
    os.kill(proc.pid, signal.SIGSTOP)
    wait_for(lambda: "suspended (stopped (state T))" in sched.log(), what="the daemon sees it stopped")
    hold.write_text("")              # its next GPU call, the check, comes right after the thaw
    if order == "resume-then-thaw":
        suspended.write_text("")
        resumed_ns = time.monotonic_ns()
        os.kill(proc.pid, signal.SIGCONT)
    elif order == "thaw-then-resume":
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.3)              # running, still SUSPENDED for Slurm: the swap-out goes on
        suspended.write_text("")
        resumed_ns = time.monotonic_ns()
    else:
        os.kill(proc.pid, signal.SIGCONT)
        wait_for(lambda: "lock released after moving 900.0 MiB" in sched.log(), timeout=15,
                 what="all of it out and the lock released")
        time.sleep(0.5)              # its request (the check after the hold) waits in the watch
        suspended.write_text("")
        resumed_ns = time.monotonic_ns()
    out = finish(proc, timeout=60)
    assert "pattern held ok" in out and "pattern ok rounds=2" in out, out

    out_copies, in_copies = copies(copy_log, "dtoh"), copies(copy_log, "htod")
    chunks = -(-SLOW_JOB_BYTES // CHUNK)
    log = sched.log()
    assert "told to stop moving memory out" in log, log
    # Only what moved came back (the grant's swap-in), once, after the last chunk went out.
    assert len(in_copies) == len(out_copies)
    assert min(start for start, _ in in_copies) >= max(end for _, end in out_copies)
    if order == "thaw-out-parked-resume":
        assert len(out_copies) == chunks and all(end < resumed_ns for _, end in out_copies)
        assert "its lock requests go ahead" in log, log
        assert "swap-out stopped" not in proc.stderr_text
        return
    # Before: every chunk went out after the resume, and every one came back.
    assert len(out_copies) < chunks, (out_copies, proc.stderr_text)
    # After the resume: the chunk under way, and one more begun before RESUMED arrived.
    assert sum(end > resumed_ns for _, end in out_copies) <= 2, out_copies
    assert "swap-out stopped after" in proc.stderr_text, proc.stderr_text


def test_a_suspend_that_ends_while_the_holder_drains_moves_nothing(hook_lib, small_gpu, tmp_path,
                                                                   procs):
    """DROP_LOCK(SUSPEND) comes while the holder's kernel runs; the job resumes (a short suspend,
    or gang time slices) before the drain ends. The swap-out that would follow the drain is
    dropped: nothing moves out only to come back."""
    sched, suspended, job, copy_log = slow_swap_job(small_gpu, tmp_path, 405)
    trace = tmp_path / "trace"
    proc = start_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{SLOW_JOB_BYTES}", "fill:0:5a",
                                   "launch:4000000", "check:0:5a"], job.env)
    procs.append(proc)
    wait_for(lambda: trace.exists() and trace.read_text(), what="its 4 s kernel launched")
    suspended.write_text("405\n")
    wait_for(lambda: "suspended (its job is suspended by Slurm)" in sched.log(),
             what="the daemon's DROP_LOCK(SUSPEND)")
    suspended.write_text("")         # resumed while the kernel still runs
    wait_for(lambda: "told to stop moving memory out" in sched.log(), what="RESUMED")
    out = finish(proc, timeout=60)
    assert f"check 0 rc=0 bytes={SLOW_JOB_BYTES} bad=0" in out, out
    assert copies(copy_log, "dtoh") == [], proc.stderr_text      # before: all four chunks, and back
    assert "no more memory moves out for its suspend" in proc.stderr_text


STOPPED_BYTES = 768 * MiB      # most of the 1 GiB GPU (972.8 MiB usable)
WAITER_BYTES = 512 * MiB       # made in host memory beside it: its grant lacks ~300 MiB of room


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return fh.read().rsplit(b")", 1)[1].split()[0].decode()


def test_a_stopped_holder_moves_its_memory_out_for_a_waiter_and_stays_stopped(
        hook_lib, small_gpu, tmp_path, procs):
    """Issue 39, as measured with Slurm 22.05 under proctrack/linuxproc (scontrol suspend stops the
    job's processes at once) or with kill -STOP: before, the waiter was granted and gave the grant
    back NO_ROOM 161 times in 40 s and ran nothing until the stopped job resumed. Now the daemon
    lets the stopped process run (SIGCONT) only for its move-out and stops it again: the waiter
    runs within seconds, the stopped job is stopped (T) again without the test continuing it, and
    after the test's SIGCONT it finds its data where it was."""
    sched = small_gpu(suspend_check_sec=0.1)
    trace = tmp_path / "trace"
    first = Job(sched, 501, trace, gpu_index=[0], **sched.fake_env)
    second = Job(sched, 502, trace, gpu_index=[0], **sched.fake_env)
    hold = tmp_path / "resume-check"
    stopped = start_nvtest(hook_lib, ["init", "ctx:0", f"pattern:{STOPPED_BYTES}:1:1000:{hold}"],
                           first.env)
    procs.append(stopped)
    wait_for(lambda: gpu_status(sched)["memory_used"] >= STOPPED_BYTES, what="the first job's memory")
    os.kill(stopped.pid, signal.SIGSTOP)
    wait_for(lambda: "suspended (stopped (state T))" in sched.log(), what="the daemon sees it stopped")

    started = time.monotonic_ns()
    waiter = start_nvtest(hook_lib, ["init", "ctx:0", f"pattern:{WAITER_BYTES}:2:1000", "freeall"],
                          second.env)
    procs.append(waiter)
    try:
        out = finish(waiter, timeout=30)
    finally:
        log = sched.log()
    assert "pattern ok rounds=2" in out, out
    kernels = [r for r in read_trace(trace) if r[0] == waiter.pid]
    # Target: within 10 s plus the copies (about 1 GB/s on the fake driver).
    assert kernels and min(r[2] for r in kernels) - started < 12e9, (kernels, log[-3000:])
    assert "is let run (SIGCONT) to move it to host memory" in log, log[-3000:]
    assert "stopped again (SIGSTOP)" in log, log[-3000:]
    # Not a grant after grant given back: before, "no room on the GPU to bring its swapped
    # memory back" every 250 ms.
    assert "no room on the GPU" not in log, log[-3000:]
    # Stopped again by the daemon; the test has not continued it.
    wait_for(lambda: proc_state(stopped.pid) == "T", timeout=5, what="the first job stopped again")
    time.sleep(0.5)
    assert proc_state(stopped.pid) == "T"
    assert gpu_status(sched)["memory_swapped"] > 0            # its memory out of the way
    os.kill(stopped.pid, signal.SIGCONT)
    hold.write_text("")
    out = finish(stopped, timeout=60)
    assert "pattern held ok" in out and "pattern ok rounds=1" in out, out


SIGTSTP_PROGRAM = """
import ctypes, os, signal
cuda = ctypes.CDLL("libcuda.so.1")
print("cuInit", cuda.cuInit(0), flush=True)
seen = []
signal.signal(signal.SIGTSTP, lambda sig, frame: seen.append(sig))
os.kill(os.getpid(), signal.SIGTSTP)
print("handler saw", seen, flush=True)
# An allocation the hook asks the daemon for: the program does not exit before the hook's lazily
# started connection has registered (CI once saw it exit first, and no registration came).
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
print("cuMemAlloc", cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(256 << 20)), flush=True)
"""


def test_a_program_with_its_own_sigtstp_handler_still_sees_it(hook_lib, small_gpu, tmp_path):
    sched = small_gpu()
    job = Job(sched, 403, tmp_path / "trace", gpu_index=[0], **sched.fake_env)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVSHARE_", "FAKE_CUDA_"))}
    env.update(job.env, LD_LIBRARY_PATH=str(BUILD), LD_PRELOAD=str(hook_lib))
    result = subprocess.run([sys.executable, "-c", SIGTSTP_PROGRAM], env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "cuInit 0" in result.stdout
    assert f"handler saw [{int(__import__('signal').SIGTSTP)}]" in result.stdout, result.stdout
    assert "cuMemAlloc 0" in result.stdout, result.stdout + result.stderr
    # The hook was there: it registered with the daemon (whose log line may follow the program's
    # quick exit: CI read the log once before it was written).
    wait_for(lambda: "client registered" in sched.log(), timeout=10, what="the daemon's 'client registered'")


GRAPH_MS = 800                 # the low job's CUDA graph: eight 100 ms kernels, one replay


def test_a_graph_launch_caught_by_a_stop_runs_to_its_end_beside_the_next_holder(
        hook_lib, small_gpu, tmp_path, procs):
    """A limit (docs/design-scheduler.md "Suspend"): work a process queued before it was stopped
    or frozen stays in flight on the GPU. Here the low job's graph replay is under way when it is
    stopped; its turns go at once, the next job runs beside the rest of the graph, and after
    SIGCONT the low job finishes, its data intact."""
    sched = small_gpu(suspend_check_sec=0.1)
    trace = tmp_path / "trace"
    low = Job(sched, 404, trace, gpu_index=[0], **sched.fake_env)
    high = Job(sched, 405, trace, gpu_index=[0], **sched.fake_env)
    proc = start_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{64 * MiB}", "fill:0:a5",
                                   f"capture:{GRAPH_MS * 1000 // 8}:8:0", "check:0:a5"], low.env)
    procs.append(proc)

    def graph():
        rows = read_trace(trace) if trace.exists() else []
        return next((r for r in rows if r[0] == proc.pid and r[3] - r[2] >= GRAPH_MS * 1e6 * 0.9), None)

    replay = wait_for(graph, what="the low job's graph replay on the GPU")
    proc.send_signal(signal.SIGSTOP)
    stopped_ns = time.monotonic_ns()
    try:
        out = finish(start_nvtest(hook_lib, ["init", "ctx:0", "launch:1000", "sync"], high.env), timeout=20)
        assert "sync ok" in out
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGCONT)
    out = finish(proc, timeout=30)
    assert "capture rc=0 replayed" in out and f"check 0 rc=0 bytes={64 * MiB} bad=0" in out, out
    high_rows = [r for r in read_trace(trace) if r[0] != proc.pid and r[1] == GPU0]
    assert high_rows and all(r[2] >= stopped_ns for r in high_rows)
    # The stopped job's graph was still on the GPU when the next job's kernel ran (the limit).
    assert min(r[2] for r in high_rows) < replay[3], (high_rows, replay)
    log = sched.log()
    assert "job 404 step 0" in log and "suspended (stopped (state T)): holds no lock until it runs " \
        "again; its lock goes to others now" in log, log[-3000:]


def test_a_collective_caught_by_a_stop_waits_on_the_gpu_and_completes_after_the_resume(
        hook_lib, scheduler_factory, tmp_path, procs):
    """A limit: a two-rank job (a gang, one rank per GPU) stopped in the middle of its 400 NCCL-like
    collectives (the fake driver's barrier kernel runs until every rank launched its own). Its
    turns go on both GPUs: another job runs on GPU 1 while the gang is stopped, whatever
    collective it left in flight waiting there for the other rank. After SIGCONT every round
    completes."""
    sched = scheduler_factory(suspend_check_sec=0.1)
    trace = tmp_path / "trace"
    group = f"/nvshare-test-{os.getpid()}-suspend-barrier"
    gang = Job(sched, 406, trace, gpu_index=[0, 1], FAKE_CUDA_BARRIER=group)
    other = Job(sched, 407, trace, gpu_index=[1])
    ranks = [start_nvtest(hook_lib, ["init", f"ctx:{r}", f"barrier:2000:400:2:{r}"], gang.env)
             for r in (0, 1)]
    procs.extend(ranks)
    try:
        wait_for(lambda: trace.exists() and len(read_trace(trace)) >= 20, what="the gang's collectives")
        for proc in ranks:
            proc.send_signal(signal.SIGSTOP)
        try:
            out = finish(start_nvtest(hook_lib, ["init", "ctx:1", "launch:1000", "sync"], other.env),
                         timeout=20)
            assert "sync ok" in out
            assert all(p.poll() is None for p in ranks)
        finally:
            for proc in ranks:
                proc.send_signal(signal.SIGCONT)
        for proc in ranks:
            assert "barrier ok rounds=400" in finish(proc, timeout=60)
    finally:
        try:
            os.unlink(f"/dev/shm{group}")
        except FileNotFoundError:
            pass
    log = sched.log()
    assert log.count("suspended (stopped (state T)): holds no lock until it runs again") >= 2, log[-3000:]
