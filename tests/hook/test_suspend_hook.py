"""Suspend with the hook (issue 28): a job Slurm suspends moves its GPU memory to host memory through
libnvshare.so's swap, another job uses the GPU meanwhile, and on resume the memory comes back before
the job's next GPU call, its data intact. The program's own signal handling is untouched.

The fake driver's device memory is shared between processes (FAKE_CUDA_SHARED_MEMORY), so the freed
memory is really free; Slurm's word comes from a stand-in squeue in the daemon's slurm_bin_dir."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from helpers_daemon import gpu_status, wait_for
from helpers_hook import BUILD, Job, finish, start_nvtest

MiB = 1 << 20
JOB_BYTES = 600 * MiB          # the small GPU holds one such job, not two



def test_a_suspended_job_frees_the_gpu_and_resumes_with_its_data(hook_lib, small_gpu, tmp_path,
                                                                 procs):
    sched = small_gpu(start=False, suspend_slurm_poll_sec=0.2, suspend_check_sec=0.1)
    suspended = tmp_path / "suspended"
    suspended.write_text("")
    squeue = Path(sched.workdir) / "squeue"
    squeue.write_text(f"#!/bin/sh\ncat {suspended}\n")
    squeue.chmod(0o755)
    sched.start()
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


SIGTSTP_PROGRAM = """
import ctypes, os, signal
cuda = ctypes.CDLL("libcuda.so.1")
print("cuInit", cuda.cuInit(0), flush=True)
seen = []
signal.signal(signal.SIGTSTP, lambda sig, frame: seen.append(sig))
os.kill(os.getpid(), signal.SIGTSTP)
print("handler saw", seen, flush=True)
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
    # The hook was there: it registered with the daemon.
    assert "client registered" in sched.log()
