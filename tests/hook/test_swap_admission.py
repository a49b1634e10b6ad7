"""Admission of memory that does not fit beside another job's: it is swapped, never refused.

Two jobs each allocate what fits the GPU alone but not beside the other, the second while the
first's allocation is still being made (a large allocation takes tens of milliseconds on a real
GPU: FAKE_CUDA_CREATE_MS stands for it). The daemon has admitted the first one but not yet heard
that it was made; it must not give the same room to the second (on the H100 the second job's
cuMemAlloc then failed with CUDA_ERROR_OUT_OF_MEMORY, bench_mixes mix4-mem), but admit it deferred:
made in host memory, resident at its turn. Both finish, their data intact.
"""
from __future__ import annotations

import re
import struct
import time

from helpers_daemon import gpu_status
from helpers_hook import Job, finish, start_nvtest

MiB = 1 << 20
JOB_BYTES = 600 * MiB      # the small_gpu's 1 GiB, 972.8 MiB usable: one job fits, two do not
CREATE_MS = 4000           # the first job's allocation is under way this long


def device_used(path) -> int:
    """Device 0's used bytes on the fake driver's shared count (FAKE_CUDA_SHARED_MEMORY)."""
    try:
        return struct.unpack("<Q", path.read_bytes()[:8])[0]
    except (OSError, struct.error):
        return 0


def test_an_allocation_made_while_another_is_under_way_is_deferred_not_failed(
        hook_lib, small_gpu, tmp_path, procs):
    sched = small_gpu(scheduling_mode="auto")
    trace = tmp_path / "trace"
    shared = tmp_path / "device-memory"
    actions = ["init", "ctx:0", f"pattern:{JOB_BYTES}:4:50000"]
    first = Job(sched, 321, trace, gpu_index=[0], FAKE_CUDA_CREATE_MS=str(CREATE_MS),
                **sched.fake_env)
    second = Job(sched, 322, trace, gpu_index=[0], **sched.fake_env)
    procs.append(start_nvtest(hook_lib, actions, first.env))
    deadline = time.monotonic() + 20
    while device_used(shared) < 256 * MiB and time.monotonic() < deadline:
        time.sleep(0.01)
    # The first job's memory is being taken on the device (its first 256 MiB chunk) and its
    # allocation is not made yet: the daemon has admitted it and not heard back. The second job
    # asks now.
    assert device_used(shared) >= 256 * MiB
    assert gpu_status(sched)["memory_used"] < JOB_BYTES
    procs.append(start_nvtest(hook_lib, actions, second.env))
    outs = [finish(p, timeout=120) for p in procs]
    for out, p in zip(outs, procs, strict=True):
        assert "pattern alloc rc=" not in out, out + p.stderr_text   # rc=2 before the fix
        assert "pattern ok rounds=4" in out, out + p.stderr_text
    # The daemon deferred the second job's allocation (it asked while the first was under way).
    assert re.search(r"job 322 .*allocation of .* deferred", sched.log()), sched.log()
