"""Helpers of the tests that talk to a real nvshare-scheduler (tests/conftest.py's scheduler fixtures),
shared by the test modules that need them."""
from __future__ import annotations

import os
import time

from conftest import FAKE_GPUS, become
from lockclient import connect_and_register, gpu_frame
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C

GPU0 = FAKE_GPUS[0]["uuid"]
GPU1 = FAKE_GPUS[1]["uuid"]
G = 1 << 30
NOBODY, OTHER = 65534, 65533


def register(sched, job_id, gpu_index=(0,), **kw):
    return sched.client().register_job(job_id, uid=0, gid=0, gpu_index=list(gpu_index), **kw)


def gpu_status(sched, uuid=GPU0):
    return next(g for g in sched.client().status()["gpus"] if g["uuid"] == uuid)


def wait_for(predicate, timeout: float = 10.0, what: str = "condition", interval: float = 0.05):
    """predicate()'s first true value, polled every `interval` seconds; AssertionError naming `what`
    after `timeout` seconds. (tests/slurm/cluster.py's wait_until is the Slurm tier's.)"""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(interval)


def wait_for_status(sched, predicate, uuid=GPU0, timeout=5.0):
    """The GPU's status once predicate(status) holds: the daemon has handled what was sent."""
    deadline = time.monotonic() + timeout
    while True:
        status = gpu_status(sched, uuid)
        if predicate(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"GPU status never matched: {status}")
        time.sleep(0.02)


def wait_for_log(sched, text, timeout=5.0):
    deadline = time.monotonic() + timeout
    while text not in sched.log():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} in the scheduler log:\n{sched.log()[-3000:]}")
        time.sleep(0.02)


def wait_for_waiters(sched, count, uuid=GPU0, timeout=5.0):
    """The GPU's FIFO once it holds `count` waiters: client processes send on their own schedule."""
    deadline = time.monotonic() + timeout
    while True:
        waiting = [w["job_id"] for w in gpu_status(sched, uuid)["waiting"]]
        if len(waiting) >= count or time.monotonic() > deadline:
            return waiting
        time.sleep(0.02)


def as_uid(uid: int, action) -> int:
    """Run action() in a forked child with that uid; its return value (an int < 256) comes back."""
    pid = os.fork()
    if pid == 0:
        code = 255
        try:
            become(uid)
            code = action()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def healthy(sched, job_id: int = 1) -> None:
    """Another client still registers and gets the lock."""
    sock, body = connect_and_register(sched.socket, job_id)
    with sock:
        assert body.status == C.NVSHARE_OK
        sock.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0))
        frame = proto.recv_frame(sock)
        assert frame.type == C.NVSHARE_MSG_LOCK_GRANT
