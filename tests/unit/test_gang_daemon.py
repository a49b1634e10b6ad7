"""Gang turns and DRAIN_STUCK through the real nvshare-scheduler, with lockclient processes as the
ranks of two-GPU jobs (one process per GPU, like torchrun)."""
from __future__ import annotations

import io
import time

import pytest

from conftest import FAKE_GPUS
from lockclient import ClientProc
from nvshare_slurm import status as status_cli
from nvshare_slurm.wire.proto import C
from helpers_daemon import register, wait_for_log, wait_for_status

GPU0 = FAKE_GPUS[0]["uuid"]
GPU1 = FAKE_GPUS[1]["uuid"]


@pytest.fixture
def ranks():
    started: list[ClientProc] = []

    def make(sched, job_id, *options):
        proc = ClientProc(sched.socket, job_id, 0, *options)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.close()


def show_job(sched, job_id) -> str:
    out = io.StringIO()
    assert status_cli.main(["--socket", sched.socket, "show", "job", str(job_id)], out=out,
                           err=io.StringIO()) == 0
    return out.getvalue()


def test_two_jobs_on_the_same_two_gpus_never_each_hold_half(scheduler_factory, ranks):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=30)
    register(sched, 11, gpu_index=(0, 1))
    register(sched, 12, gpu_index=(0, 1))
    a0, a1, b0, b1 = ranks(sched, 11), ranks(sched, 11), ranks(sched, 12), ranks(sched, 12)
    a0.send(f"request {GPU0}")
    a0.expect("grant", gpu=GPU0)
    b1.send(f"request {GPU1}")                   # GPU 1 is free, but it is job 11's turn there
    a0.expect("contended", gpu=GPU0)
    b0.send(f"request {GPU0}")
    b1.absent("grant", 0.3)
    a1.send(f"request {GPU1}")
    assert a1.expect("grant", gpu=GPU1)["flags"] == C.NVSHARE_GRANT_SHARED
    text = show_job(sched, 12)
    assert "Gang=job 12 on 0,1" in text and "GangState=waiting" in text
    assert "GangWaitsFor=gang job 11 goes first on GPUs 0,1" in text
    assert "Gang=job 11 on 0,1 GangState=running" in show_job(sched, 11)
    gpu1 = wait_for_status(sched, lambda s: s["turn"] is not None, GPU1)
    assert gpu1["turn"] == {"job_id": 11, "state": "running"}
    # Job 11 gives both GPUs back; job 12 gets both.
    a0.send(f"release {GPU0}")
    b1.absent("grant", 0.2)
    a1.send(f"release {GPU1}")
    b0.expect("grant", gpu=GPU0)
    b1.expect("grant", gpu=GPU1)
    assert "job 11: a gang on GPUs 0,1" in sched.log()


def test_a_stuck_drain_gets_its_peer_rank_granted_and_is_not_unresponsive(scheduler_factory,
                                                                          ranks):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=0.3, drop_grace_sec=60,
                              unresponsive_holder="kill")
    register(sched, 21, gpu_index=(0, 1))
    register(sched, 22, gpu_index=(0, 1))
    a0 = ranks(sched, 21, "--on-drop", "ignore")    # its collective waits for rank 1
    a1 = ranks(sched, 21)
    b0 = ranks(sched, 22)
    a0.send(f"request {GPU0}")
    a0.expect("grant")
    a1.send(f"request {GPU1}")
    a1.expect("grant")
    b0.send(f"request {GPU0}")                      # job 22 waits: job 21's turn ends in 0.3 s
    a0.expect("drop", gpu=GPU0, timeout=5)
    a1.expect("drop", gpu=GPU1)                     # ... on both GPUs together
    a1.send(f"request {GPU1}")                      # while rank 0 drains: one step
    a1.expect("grant", gpu=GPU1, timeout=2)
    a1.expect("drop", gpu=GPU1)
    time.sleep(0.35)                                # steps end one interval after the end
    a1.send(f"request {GPU1}")                      # rank 1 must reach the collective again
    a1.absent("grant", 0.2)
    a0.send(f"stuck {GPU0} 250")
    a1.expect("grant", gpu=GPU1)
    wait_for_log(sched, "(DRAIN_STUCK); its gang (job 21 on GPUs 0,1) gets its waiting clients "
                        "granted")
    a0.send(f"release {GPU0}")                      # the collective finished: drained
    a1.expect("drop", gpu=GPU1)                     # its turn ends again, on what it holds
    b0.expect("grant", gpu=GPU0)
    assert "has not released the lock" not in sched.log() and a0.proc.poll() is None


def test_a_stuck_single_gpu_holder_keeps_its_turn_while_it_reports(scheduler_factory, ranks):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=0.2, drop_grace_sec=1.0,
                              unresponsive_holder="kill")
    register(sched, 31)
    register(sched, 32)
    holder = ranks(sched, 31, "--on-drop", "ignore")
    waiter = ranks(sched, 32)
    holder.send(f"request {GPU0}")
    holder.expect("grant")
    waiter.send(f"request {GPU0}")
    holder.expect("drop")
    for _ in range(3):                              # reports every 0.5 s: never killed
        holder.send(f"stuck {GPU0} 500")
        waiter.absent("grant", 0.5)
    wait_for_log(sched, "(DRAIN_STUCK); it keeps the GPU until its work finishes")
    assert holder.proc.poll() is None and "has not released the lock" not in sched.log()
    holder.send(f"release {GPU0}")
    waiter.expect("grant")


def test_gangs_come_back_after_a_daemon_restart(scheduler_factory, ranks):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=30)
    register(sched, 41, gpu_index=(0, 1))
    register(sched, 42, gpu_index=(0, 1))
    sched.restart()
    a0, b1 = ranks(sched, 41), ranks(sched, 42)
    a0.send(f"request {GPU0}")
    a0.expect("grant", gpu=GPU0)
    b1.send(f"request {GPU1}")
    b1.absent("grant", 0.3)                         # still job 41's turn on both GPUs
    assert "GangWaitsFor=gang job 41 goes first" in show_job(sched, 42)


def test_a_drain_that_never_reports_is_taken_as_stuck_after_about_a_turn(scheduler_factory,
                                                                         ranks):
    """A hook without DRAIN_STUCK: after one turn (here the 1 s floor) the gang's waiting rank is
    granted again, and the log says why."""
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=0.2, drop_grace_sec=60)
    register(sched, 51, gpu_index=(0, 1))
    register(sched, 52, gpu_index=(0, 1))
    a0, a1, b0 = ranks(sched, 51, "--on-drop", "ignore"), ranks(sched, 51), ranks(sched, 52)
    a0.send(f"request {GPU0}")
    a0.expect("grant")
    a1.send(f"request {GPU1}")
    a1.expect("grant")
    b0.send(f"request {GPU0}")
    dropped = a1.expect("drop", gpu=GPU1, timeout=5)["t"]
    a1.send(f"request {GPU1}")                       # one step while rank 0 drains ...
    a1.expect("grant", gpu=GPU1, timeout=2)
    a1.expect("drop", gpu=GPU1)
    time.sleep(0.25)                                 # ... and none once the steps are over
    a1.send(f"request {GPU1}")
    regrant = a1.expect("grant", gpu=GPU1, timeout=5)["t"]
    assert 0.9 <= regrant - dropped <= 3.0
    wait_for_log(sched, "after DROP_LOCK while its gang's other clients wait; taken as a stuck "
                        "drain")
    b0.absent("grant", 0.2)                          # job 51 still holds GPU 0
    a0.send(f"release {GPU0}")
    b0.expect("grant", timeout=5)
