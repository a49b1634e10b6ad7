"""Share classes through the real daemon: the class arrives with the registration (root only),
survives a restart, shows in status, and a high job's request takes the GPU from a low holder at
once, not after the switch interval."""
from __future__ import annotations

import time

import pytest

from nvshare_slurm.wire import proto
from nvshare_slurm.wire.client import RequestFailed
from nvshare_slurm.wire.proto import C
from helpers_daemon import GPU0, gpu_status, register, wait_for_waiters


def job_status(sched, job_id):
    return sched.client().status(C.NVSHARE_STATUS_JOB, job_id)["jobs"][0]


def test_class_and_reason_are_registered_shown_and_kept_over_a_restart(scheduler_factory):
    sched = scheduler_factory()
    register(sched, 1, share_class="high", class_reason="qos prod")
    register(sched, 2, share_class="low", class_reason="partition scavenge")
    register(sched, 3)
    assert (job_status(sched, 1)["share_class"], job_status(sched, 1)["class_reason"]) == \
        ("high", "qos prod")
    assert job_status(sched, 2)["share_class"] == "low"
    assert (job_status(sched, 3)["share_class"], job_status(sched, 3)["class_reason"]) == \
        ("normal", "default")
    assert "job 1: registered for" in sched.log() and "class high (qos prod)" in sched.log()
    sched.restart()
    assert job_status(sched, 1)["class_reason"] == "qos prod"
    assert job_status(sched, 2)["share_class"] == "low"


def test_the_reserved_class_value_is_refused(scheduler_factory):
    sched = scheduler_factory()
    assert proto.class_of_flags(C.NVSHARE_JOB_CLASS_MASK) is None
    client = sched.client()
    fields = {"job_id": 5, "uid": 0, "gid": 0, "slots": 1, "n_gpus": 0, "gpu_index": [],
              "flags": C.NVSHARE_JOB_CLASS_MASK, "name": "", "user": "root",
              "class_reason": ""}
    with pytest.raises(RequestFailed) as info:
        client._job_reply(client.request(C.NVSHARE_MSG_JOB_REGISTER, fields))
    assert info.value.status == C.NVSHARE_ERR_INVAL
    assert "share class" in str(info.value)


def test_a_high_request_drops_a_low_holder_at_once(scheduler_factory, clients):
    # A switch interval of 30 s: only the class can explain a hand-over within a second.
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=30)
    register(sched, 1, share_class="low", class_reason="partition scavenge")
    register(sched, 2, share_class="high", class_reason="partition prod")
    low, high = clients(sched, 1), clients(sched, 2)
    low.send(f"request {GPU0}")
    low.expect("grant", gpu=GPU0)
    asked = time.monotonic()
    high.send(f"request {GPU0}")
    drop = low.expect("drop", gpu=GPU0)
    assert drop["reason"] == C.NVSHARE_DROP_TIMESLICE
    high.expect("grant", gpu=GPU0)
    assert time.monotonic() - asked < 5.0
    # Now the low job waits; the high holder, busy as far as the scheduler knows, keeps the GPU
    # until its demand shows pauses worth handing over.
    low.send(f"request {GPU0}")
    low_waits = wait_for_waiters(sched, 1)
    assert low_waits == [1]
    status = gpu_status(sched)
    assert [h["class"] for h in status["holders"]] == ["high"]
    assert [w["class"] for w in status["waiting"]] == ["low"]
    high.send(f"demand {GPU0} 500000 300000 200000")
    high.expect("contended", gpu=GPU0)
