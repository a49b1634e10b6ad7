"""The scheduler's memory picture follows the driver's (issue 39): memory of a process that ended
counts until the driver has released it.

On the H200 (mix4-mem), a 70 GiB job ended, the scheduler counted its memory free when its socket
closed, granted another job, and that job's allocation met the driver still holding the ended
process's 72.6 GiB: CUDA out-of-memory, the job lost, in 2 of 2 runs. Here the fake driver releases
an ended process's memory FAKE_CUDA_EXIT_RELEASE_MS after it ends, as the real one does some time
after, and the daemon reads the GPU's processes through NVML (the fake NVML, which lists what the
fake driver's processes hold, an ended one's until its release). The hook's own retry of a driver's
out-of-memory is off (NVSHARE_OOM_WAIT_SEC=0), so only the scheduler's accounting is tested.
"""
from __future__ import annotations

import re
import time

from conftest import SMALL_GPU, SMALL_GPU_MEMORY
from helpers_daemon import gpu_status, wait_for
from helpers_hook import BUILD, Job, finish, start_nvtest

MiB = 1 << 20
JOB_BYTES = 700 * MiB      # the 1 GiB GPU holds one such job, not two
RELEASE_MS = 1500


def driver_daemon(scheduler_factory, tmp_path):
    """A daemon on the fake 1 GiB GPU that asks NVML (the fake one) about the GPU's memory."""
    shared = tmp_path / "device-memory"
    fake = {"FAKE_CUDA_DEVICES": f"{SMALL_GPU}:{SMALL_GPU_MEMORY}",
            "FAKE_CUDA_SHARED_MEMORY": str(shared), "FAKE_CUDA_EXIT_RELEASE_MS": str(RELEASE_MS)}
    sched = scheduler_factory(start=False, gpus=[], scheduling_mode="concurrent")
    sched.extra_env = {"LD_LIBRARY_PATH": str(BUILD), "FAKE_NVML_FROM_CUDA": "1", **fake}
    sched.start()
    return sched, dict(fake, NVSHARE_LOG_LEVEL="debug", NVSHARE_OOM_WAIT_SEC="0")


def test_a_job_started_as_another_ends_waits_for_the_drivers_release(
        hook_lib, scheduler_factory, tmp_path, procs):
    sched, env = driver_daemon(scheduler_factory, tmp_path)
    assert gpu_status(sched, SMALL_GPU)["memory_total"] == 1 << 30     # NVML's inventory
    trace = tmp_path / "trace"
    go = tmp_path / "go"
    first = Job(sched, 401, trace, gpu_index=[0], **env)
    second = Job(sched, 402, trace, gpu_index=[0], **env)
    ender = start_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{JOB_BYTES}", "launch:20000"],
                         first.env)
    procs.append(ender)
    follower = start_nvtest(hook_lib, ["init", "ctx:0", f"waitfile:{go}", f"alloc:{JOB_BYTES}",
                                       "launch:20000", "sync", "freeall"], second.env)
    procs.append(follower)
    finish(ender)          # it ended holding its memory: the driver keeps it RELEASE_MS more
    ended_at = time.monotonic()
    go.touch()             # the second job allocates now, while the driver still holds it
    held = []              # what nvshare-status says is held by ended processes meanwhile
    while follower.poll() is None and time.monotonic() < ended_at + 30:
        held.append(gpu_status(sched, SMALL_GPU).get("memory_ended", 0))
        time.sleep(0.05)
    out = finish(follower, timeout=1)
    assert f"alloc {JOB_BYTES} rc=0" in out, out + follower.stderr_text   # rc=2 before
    assert max(held) >= JOB_BYTES, (held, out, follower.stderr_text[-3000:])
    released = re.search(r"job 401 .*the driver released its (\S+ \S+) (\S+)s after its process "
                         r"ended", sched.log())
    assert released, sched.log()
    assert float(released.group(2)) >= RELEASE_MS / 1000 - 0.3
    assert time.monotonic() - ended_at >= RELEASE_MS / 1000 - 0.3
    # The second job freed everything before it ended: nothing of it is held after it.
    wait_for(lambda: gpu_status(sched, SMALL_GPU)["memory_ended"] == 0, timeout=2.0,
             what="no memory of ended processes held")
