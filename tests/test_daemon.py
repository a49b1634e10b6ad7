"""The real nvshare-scheduler over its socket, with several real client processes (tests/lockclient.py)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import FAKE_GPUS
from lockclient import ClientProc, connect_and_register, gpu_frame
from nvshare_slurm import proto
from nvshare_slurm.client import RequestFailed
from nvshare_slurm.proto import C

GPU0 = FAKE_GPUS[0]["uuid"]
GPU1 = FAKE_GPUS[1]["uuid"]
G = 1 << 30


@pytest.fixture
def clients():
    started: list[ClientProc] = []

    def make(sched, job_id, *options, step=0):
        proc = ClientProc(sched.socket, job_id, step, *options)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.close()


def register(sched, job_id, gpu_index=(0,), **kw):
    return sched.client().register_job(job_id, uid=0, gid=0, gpu_index=list(gpu_index), **kw)


def gpu_status(sched, uuid=GPU0):
    return next(g for g in sched.client().status()["gpus"] if g["uuid"] == uuid)


def test_fcfs_hand_over_order(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=30)
    for job in (1, 2, 3):
        register(sched, job)
    a, b, c = clients(sched, 1), clients(sched, 2), clients(sched, 3)
    a.send(f"request {GPU0}")
    assert a.expect("grant", gpu=GPU0)["flags"] == C.NVSHARE_GRANT_EXCLUSIVE
    c.send(f"request {GPU0}")
    time.sleep(0.1)
    b.send(f"request {GPU0}")
    a.expect("contended", gpu=GPU0)
    waiting = [w["job_id"] for w in gpu_status(sched)["waiting"]]
    assert waiting == [3, 2]
    a.send(f"release {GPU0}")
    c.expect("grant", gpu=GPU0)
    b.absent("grant", 0.3)
    c.send(f"release {GPU0}")
    b.expect("grant", gpu=GPU0)


def test_disconnect_of_holder_grants_next(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent")
    register(sched, 1)
    register(sched, 2)
    a, b = clients(sched, 1), clients(sched, 2)
    a.send(f"request {GPU0}")
    a.expect("grant")
    b.send(f"request {GPU0}")
    b.absent("grant", 0.2)
    a.close()
    b.expect("grant", gpu=GPU0, timeout=2)
    assert [h["job_id"] for h in gpu_status(sched)["holders"]] == [2]
