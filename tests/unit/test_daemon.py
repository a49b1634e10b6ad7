"""The real nvshare-scheduler over its socket, with several real client processes (tests/lockclient.py)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from helpers_daemon import (G, GPU0, GPU1, gpu_status, register, wait_for_log, wait_for_status,
                            wait_for_waiters)
from nvshare_slurm.wire.client import RequestFailed
from nvshare_slurm.wire.proto import C


def test_fcfs_hand_over_order(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=30)
    for job in (1, 2, 3):
        register(sched, job)
    a, b, c = clients(sched, 1), clients(sched, 2), clients(sched, 3)
    a.send(f"request {GPU0}")
    assert a.expect("grant", gpu=GPU0)["flags"] == C.NVSHARE_GRANT_EXCLUSIVE
    c.send(f"request {GPU0}")
    assert wait_for_waiters(sched, 1) == [3]
    b.send(f"request {GPU0}")
    a.expect("contended", gpu=GPU0)
    assert wait_for_waiters(sched, 2) == [3, 2]
    a.send(f"release {GPU0}")
    c.expect("grant", gpu=GPU0)
    b.absent("grant", 0.3)
    c.send(f"release {GPU0}")
    b.expect("grant", gpu=GPU0)


def test_disconnect_of_holder_grants_next(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=30)
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


def test_early_release_on_contention(scheduler_factory, clients):
    # A long fixed slice: only the idle hand-over can explain a quick switch.
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=60)
    register(sched, 1)
    register(sched, 2)
    a = clients(sched, 1, "--on-contended", "release")
    b = clients(sched, 2)
    a.send(f"request {GPU0} 0.2")      # busy 0.2 s after the grant, then idle
    a.expect("grant")
    b.send(f"request {GPU0}")
    a.expect("contended")
    released = a.expect("released", timeout=2)
    grant = b.expect("grant", timeout=2)
    assert grant["t"] - released["t"] < 0.5
    a.absent("drop", 0.1)


def test_lone_holder_is_never_preempted(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=0.2)
    register(sched, 1)
    a = clients(sched, 1)
    a.send(f"request {GPU0}")
    a.expect("grant")
    a.absent("drop", 1.0)               # five switch intervals, nobody waits
    a.absent("contended", 0.01)
    assert gpu_status(sched)["holders"][0]["held_sec"] >= 1.0


def test_concurrent_mode_alternates_with_fixed_switch_time(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=0.3)
    register(sched, 1)
    register(sched, 2)
    a, b = clients(sched, 1), clients(sched, 2)   # busy holders: ignore LOCK_CONTENDED
    order = []
    a.send(f"request {GPU0}")
    a.expect("grant")
    order.append(1)
    b.send(f"request {GPU0}")
    for turn in range(4):
        holder, waiter = (a, b) if turn % 2 == 0 else (b, a)
        drop = holder.expect("drop", timeout=2)
        assert drop["reason"] == C.NVSHARE_DROP_TIMESLICE
        holder.send(f"request {GPU0}")           # wants it again: back of the queue
        grant = waiter.expect("grant", timeout=2)
        assert grant["switch_ms"] == 300
        order.append(1 if waiter is a else 2)
    assert order == [1, 2, 1, 2, 1]


def test_serial_mode_waits_for_holder_job_then_max_runtime(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="serial", max_runtime_sec=60)
    register(sched, 1)
    register(sched, 2)
    a1, a2 = clients(sched, 1), clients(sched, 1, step=1)
    b = clients(sched, 2)
    a1.send(f"request {GPU0}")
    assert a1.expect("grant")["flags"] == C.NVSHARE_GRANT_SHARED
    a2.send(f"request {GPU0}")
    assert a2.expect("grant")["flags"] == C.NVSHARE_GRANT_SHARED   # same job shares it
    b.send(f"request {GPU0}")
    a1.send(f"release {GPU0}")
    a2.send(f"release {GPU0}")
    b.absent("grant", 0.4)            # job 1 still has clients: the lock stays with it
    a1.close()
    b.absent("grant", 0.2)
    a2.close()
    b.expect("grant", timeout=2)

    # max_runtime forces a switch while others wait
    sched.client().admin_update("0", max_runtime_sec=1)
    register(sched, 3)
    c = clients(sched, 3)
    c.send(f"request {GPU0}")
    drop = b.expect("drop", timeout=3)
    assert drop["reason"] == C.NVSHARE_DROP_MAX_RUNTIME
    c.expect("grant", timeout=2)


def test_auto_mode_co_runs_then_time_slices_when_memory_does_not_fit(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="auto", auto_share="corun", switch_time_mode="fixed",
                              switch_time_fixed=0.3, memory_reserve_percent=0)
    register(sched, 1)
    register(sched, 2)
    a, b = clients(sched, 1), clients(sched, 2)
    a.send(f"mem {GPU0} {6 * G} {6 * G} 0 0")
    b.send(f"mem {GPU0} {6 * G} {6 * G} 0 0")
    a.send(f"request {GPU0}")
    assert a.expect("grant")["flags"] == C.NVSHARE_GRANT_SHARED
    b.send(f"request {GPU0}")
    assert b.expect("grant")["flags"] == C.NVSHARE_GRANT_SHARED
    assert gpu_status(sched)["co_running"] is True
    # 6G + 12G (10G of it swappable) no longer fits 16G: the newer co-runner is dropped
    b.send(f"mem {GPU0} {12 * G} {2 * G} 0 0")
    drop = b.expect("drop", timeout=2)
    assert (drop["reason"], drop["bytes"]) == (C.NVSHARE_DROP_MEMORY, 10 * G)   # all it can move
    b.send(f"request {GPU0}")
    a.expect("contended", timeout=2)
    assert a.expect("drop", timeout=2)["reason"] == C.NVSHARE_DROP_TIMESLICE
    assert b.expect("grant", timeout=2)["flags"] == C.NVSHARE_GRANT_SWAP_AHEAD   # exclusive, with swap
    status = gpu_status(sched)
    assert status["co_running"] is False and len(status["holders"]) == 1
    # it fits again: the waiter is granted shared at once
    b.send(f"mem {GPU0} {4 * G} {4 * G} 0 0")
    a.send(f"request {GPU0}")
    assert a.expect("grant", timeout=2)["flags"] == C.NVSHARE_GRANT_SHARED


def test_gpus_are_independent(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=30)
    register(sched, 1, gpu_index=(0,))
    register(sched, 2, gpu_index=(0,))
    register(sched, 3, gpu_index=(1,))
    a, b, c = clients(sched, 1), clients(sched, 2), clients(sched, 3)
    a.send(f"request {GPU0}")
    a.expect("grant")
    b.send(f"request {GPU0}")
    c.send(f"request {GPU1}")
    assert c.expect("grant", timeout=1)["gpu"] == GPU1
    b.absent("grant", 0.2)
    # a GPU not placed for the job is answered NOGPU (ungated), not queued
    c.send(f"request {GPU0}")
    assert c.expect("reply", timeout=1)["status"] == C.NVSHARE_ERR_NOGPU


def test_memory_admission(scheduler_factory, clients):
    sched = scheduler_factory(memory_reserve_percent=0)
    register(sched, 1)
    register(sched, 2)
    a = clients(sched, 1, "--mem-limit", str(4 * G))     # the process's NVSHARE_MEM_LIMIT
    b = clients(sched, 2)
    a.send(f"mem {GPU0} 0 0 0 {3 * G}")
    reply = a.expect("mem_reply")
    assert (reply["status"], reply["total"], reply["available"]) == (C.NVSHARE_OK, 4 * G, 4 * G)
    a.send(f"mem {GPU0} {3 * G} {3 * G} 0 {2 * G}")          # 3G + 2G passes the 4G job limit
    reply = a.expect("mem_reply")
    assert (reply["status"], reply["available"]) == (C.NVSHARE_ERR_NOMEM, G)
    b.send(f"mem {GPU0} 0 0 0 {14 * G}")                      # 14G + a's fixed 3G > 16G
    assert b.expect("mem_reply")["status"] == C.NVSHARE_ERR_NOMEM
    b.send(f"mem {GPU0} 0 0 0 {13 * G}")
    reply = b.expect("mem_reply")
    assert (reply["status"], reply["total"], reply["available"]) == (C.NVSHARE_OK, 16 * G, 16 * G)
    b.send(f"mem {GPU0} 0 0 0 {17 * G}")                      # can never fit
    assert b.expect("mem_reply")["status"] == C.NVSHARE_ERR_NOMEM
    assert gpu_status(sched)["memory_used"] == 3 * G


def test_restart_with_clients_connected(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=30)
    placed = register(sched, 7, gpu_index=(1,))
    register(sched, 8, gpu_index=(1,))
    sched.client().admin_update(GPU1, mode=C.NVSHARE_MODE_SERIAL)
    a = clients(sched, 7, "--reconnect")
    b = clients(sched, 8, "--reconnect")
    a.send(f"request {GPU1}")
    a.expect("grant")
    b.send(f"request {GPU1}")
    sched.restart()
    a.expect("reconnected", timeout=10)
    b.expect("reconnected", timeout=10)
    assert sched.client().query_job(7) == placed
    status = gpu_status(sched, GPU1)
    assert status["mode"] == "serial"            # the admin override survived
    deadline = time.monotonic() + 5
    while not gpu_status(sched, GPU1)["waiting"] and time.monotonic() < deadline:
        time.sleep(0.05)
    # the queue re-forms from the reconnecting clients' requests, in their arrival order
    status = gpu_status(sched, GPU1)
    holder = status["holders"][0]["job_id"]
    assert len(status["holders"]) == 1
    assert [w["job_id"] for w in status["waiting"]] == [{7: 8, 8: 7}[holder]]
    (a if holder == 7 else b).expect("grant", timeout=2)
    assert sorted(j["job_id"] for j in sched.client().status(C.NVSHARE_STATUS_JOBS)["jobs"]) \
        == [7, 8]


def test_job_unregister_closes_clients_and_is_idempotent(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent")
    register(sched, 1)
    register(sched, 2)
    a, b = clients(sched, 1), clients(sched, 2)
    a.send(f"request {GPU0}")
    a.expect("grant")
    b.send(f"request {GPU0}")
    assert sched.client().unregister_job(1) == "unregistered"
    a.expect("closed", timeout=2)
    b.expect("grant", timeout=2)
    assert sched.client().unregister_job(1) == "not registered"
    with pytest.raises(RequestFailed) as err:
        sched.client().query_job(1)
    assert err.value.status == C.NVSHARE_ERR_NOJOB


def test_register_is_idempotent_and_spreads_slots(scheduler_factory):
    sched = scheduler_factory()
    client = sched.client()
    first = client.register_job(1, uid=0, gid=0, slots=1)
    assert client.register_job(1, uid=0, gid=0, slots=1) == first
    second = client.register_job(2, uid=0, gid=0, slots=1)
    assert second["gpu_uuid"] != first["gpu_uuid"]           # least loaded first
    wide = client.register_job(3, uid=0, gid=0, slots=4)
    assert sorted(wide["gpu_uuid"]) == sorted([GPU0, GPU1])   # min(slots, GPUs) distinct GPUs
    with pytest.raises(RequestFailed) as err:
        client.register_job(4, uid=0, gid=0, gpu_index=[5])
    assert err.value.status == C.NVSHARE_ERR_NOGPU


def test_no_gpu_registration_is_refused_clearly(scheduler_factory, tmp_path):
    sched = scheduler_factory(gpus=[])
    # gpus: [] means NVML, which this machine lacks: the daemon serves and says why it has no GPU
    with pytest.raises(RequestFailed) as err:
        sched.client().register_job(1, uid=0, gid=0, slots=1)
    assert err.value.status == C.NVSHARE_ERR_NOGPU
    assert "no GPU" in err.value.message and "NVML" in err.value.message
    assert sched.client().status()["gpus"] == []


def test_sighup_reloads_config_and_survives_a_broken_one(scheduler_factory):
    import yaml
    sched = scheduler_factory(scheduling_mode="concurrent")
    sched.client().admin_update(GPU1, max_runtime_sec=77)
    config = yaml.safe_load(sched.config_path.read_text())
    config["scheduling_mode"] = "serial"
    sched.config_path.write_text(yaml.safe_dump(config))
    sched.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 5
    while gpu_status(sched)["mode"] != "serial" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gpu_status(sched)["mode"] == "serial"
    assert gpu_status(sched, GPU1)["max_runtime_sec"] == 77          # admin override stays
    sched.config_path.write_text("scheduling_mode: sometimes\n")
    sched.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 5
    while "keeping the running configuration" not in sched.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "scheduling_mode" in sched.log()
    assert gpu_status(sched)["mode"] == "serial"
    assert sched.stop() == 0


def test_second_daemon_on_the_same_socket_refuses_to_start(scheduler):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "nvshare_slurm.daemon"], env=scheduler.env,
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 1
    assert "another nvshare-scheduler answers" in proc.stderr
    assert scheduler.client().status()["gpus"]     # the first one still serves


def test_sigterm_persists_and_exits_zero(scheduler):
    register(scheduler, 5)
    assert scheduler.stop() == 0
    assert not os.path.exists(scheduler.socket)
    scheduler.start()
    assert scheduler.client().query_job(5)["gpu_uuid"] == [GPU0]


# --- swap (docs/protocol.md "Memory", "Swap"); --swap clients move memory as the hook does -----

def test_hand_over_asks_the_holder_to_move_what_the_next_one_needs(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=0.3, memory_reserve_percent=0)
    register(sched, 1)
    register(sched, 2)
    a, b = clients(sched, 1, "--swap"), clients(sched, 2, "--swap")
    a.send(f"mem {GPU0} {10 * G} {2 * G} 0 0")
    a.send(f"request {GPU0}")
    a.expect("grant")
    b.send(f"mem {GPU0} 0 0 {10 * G} 0")             # 10G in host memory; room is 6G
    b.send(f"request {GPU0}")
    drop = a.expect("drop", timeout=3)
    assert (drop["reason"], drop["bytes"]) == (C.NVSHARE_DROP_TIMESLICE, 4 * G)
    # a switch that moves memory is not offered for an idle hand-over
    assert not [e for e in a.events if e["event"] == "contended"]
    released = a.expect("released")
    assert (released["flags"], released["bytes"]) == \
        (C.NVSHARE_RELEASE_DROPPED | C.NVSHARE_RELEASE_SWAPPED, 4 * G)
    assert b.expect("grant", timeout=2)["flags"] == C.NVSHARE_GRANT_SWAP_AHEAD   # exclusive, with swap
    assert b.expect("swapped_in")["bytes"] == 10 * G
    status = wait_for_status(sched, lambda g: g["memory_used"] == 16 * G)
    assert (status["memory_swapped"], status["memory_fixed"]) == (4 * G, 2 * G)
    wait_for_log(sched, f"gpu {GPU0}: job 1 step 0 pid {a.pid}: lock dropped (time slice over); "
                        f"asked to move 4.0 GiB to host memory")
    job = sched.client().status(C.NVSHARE_STATUS_JOB, 1)["jobs"][0]
    assert job["clients"][0]["gpus"][GPU0] == {"allocated": 6 * G, "swapped": 4 * G,
                                               "state": "idle"}
    # and back: a needs its 4G, b holds 10G movable with no room left
    a.send(f"request {GPU0}")
    assert b.expect("drop", timeout=3)["bytes"] == 4 * G
    assert a.expect("grant", timeout=2) and a.expect("swapped_in")["bytes"] == 4 * G


def test_idle_client_is_asked_once_to_make_room_before_the_grant(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", memory_reserve_percent=0)
    register(sched, 1)
    register(sched, 2)
    idle, head = clients(sched, 1, "--swap"), clients(sched, 2, "--swap")
    idle.send(f"mem {GPU0} {12 * G} {2 * G} 0 0")
    wait_for_status(sched, lambda g: g["memory_used"] == 12 * G)
    head.send(f"mem {GPU0} 0 0 {10 * G} 0")
    head.send(f"request {GPU0}")
    ask = idle.expect("prepare_swap_out", timeout=2)
    assert ask["bytes"] == 6 * G
    grant = head.expect("grant", timeout=2)
    assert grant["t"] > ask["t"]                      # granted only once the room was made
    wait_for_status(sched, lambda g: (g["memory_used"], g["memory_swapped"]) == (16 * G, 6 * G))
    idle.absent("prepare_swap_out", 0.2)
    wait_for_log(sched, f"gpu {GPU0}: job 1 step 0 pid {idle.pid}: asked to move 6.0 GiB to "
                        f"host memory")


def test_grant_goes_out_anyway_when_nothing_can_move(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", memory_reserve_percent=0)
    register(sched, 1)
    register(sched, 2)
    pinned, head = clients(sched, 1), clients(sched, 2)
    pinned.send(f"mem {GPU0} {12 * G} {12 * G} 0 0")
    wait_for_status(sched, lambda g: g["memory_fixed"] == 12 * G)
    head.send(f"mem {GPU0} 0 0 {8 * G} 0")
    head.send(f"request {GPU0}")
    head.expect("grant", timeout=2)
    pinned.absent("prepare_swap_out", 0.1)
    wait_for_log(sched, f"gpu {GPU0}: job 2 step 0 pid {head.pid}: lock granted although 4.0 GiB "
                        f"of its swapped memory does not fit: nothing more can move")


def test_allocation_of_a_non_holder_without_room_is_deferred(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", memory_reserve_percent=0)
    register(sched, 1)
    register(sched, 2)
    holder, other = clients(sched, 1), clients(sched, 2)
    holder.send(f"mem {GPU0} {12 * G} 0 0 0")
    holder.send(f"request {GPU0}")
    holder.expect("grant")
    other.send(f"mem {GPU0} 0 0 0 {6 * G} {C.NVSHARE_MEM_CAN_DEFER}")
    reply = other.expect("mem_reply")
    assert (reply["status"], reply["flags"], reply["seq"]) == \
        (C.NVSHARE_OK, C.NVSHARE_MEM_DEFERRED, 1)
    other.send(f"mem {GPU0} 0 0 0 {6 * G} 0")        # cannot defer: the driver decides
    reply = other.expect("mem_reply")
    assert (reply["status"], reply["flags"], reply["seq"]) == (C.NVSHARE_OK, 0, 2)
    # the deferred bytes come back as swapped: they count against the job, not the room
    other.send(f"mem {GPU0} 0 0 {6 * G} 1")
    reply = other.expect("mem_reply")
    assert (reply["flags"], reply["available"]) == (0, 10 * G)
    assert gpu_status(sched)["memory_swapped"] == 6 * G


def test_holder_allocation_is_answered_once_room_is_made(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", memory_reserve_percent=0)
    register(sched, 1)
    register(sched, 2)
    holder, idle = clients(sched, 1), clients(sched, 2, "--swap")
    idle.send(f"mem {GPU0} {8 * G} 0 0 0")
    holder.send(f"mem {GPU0} {6 * G} {6 * G} 0 0")
    holder.send(f"request {GPU0}")
    holder.expect("grant")
    wait_for_status(sched, lambda g: g["memory_used"] == 14 * G)      # room 2G
    holder.send(f"mem {GPU0} {6 * G} {6 * G} 0 {6 * G} {C.NVSHARE_MEM_CAN_DEFER}")
    ask = idle.expect("prepare_swap_out", timeout=2)
    assert ask["bytes"] == 4 * G
    reply = holder.expect("mem_reply", timeout=2)
    assert (reply["status"], reply["flags"], reply["seq"]) == (C.NVSHARE_OK, 0, 2)
    assert reply["t"] > ask["t"]
    assert gpu_status(sched)["memory_used"] == 10 * G


def test_holder_allocation_is_answered_after_grace_without_room(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", memory_reserve_percent=0,
                              drop_grace_sec=0.5)
    register(sched, 1)
    register(sched, 2)
    holder, idle = clients(sched, 1), clients(sched, 2)      # idle never moves anything
    idle.send(f"mem {GPU0} {8 * G} 0 0 0")
    holder.send(f"mem {GPU0} {6 * G} {6 * G} 0 0")
    holder.send(f"request {GPU0}")
    holder.expect("grant")
    wait_for_status(sched, lambda g: g["memory_used"] == 14 * G)
    sent = time.monotonic()
    holder.send(f"mem {GPU0} {6 * G} {6 * G} 0 {6 * G} {C.NVSHARE_MEM_CAN_DEFER}")
    idle.expect("prepare_swap_out", timeout=2)
    reply = holder.expect("mem_reply", timeout=5)
    assert reply["status"] == C.NVSHARE_OK and reply["t"] - sent >= 0.5
    wait_for_log(sched, f"gpu {GPU0}: job 1 step 0 pid {holder.pid}: allocation answered "
                        f"without the room it waited for")


def test_no_room_release_is_a_release_and_is_logged(scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=30)
    register(sched, 1)
    register(sched, 2)
    a, b = clients(sched, 1), clients(sched, 2)
    a.send(f"request {GPU0}")
    a.expect("grant")
    b.send(f"request {GPU0}")
    a.expect("contended")
    a.send(f"release {GPU0} no_room")
    b.expect("grant", timeout=2)
    wait_for_log(sched, f"gpu {GPU0}: job 1 step 0 pid {a.pid}: lock given back: no room on "
                        f"the GPU to bring its swapped memory back")
    a.send(f"request {GPU0}")                       # it asks again later and queues as usual
    assert wait_for_waiters(sched, 1) == [1]
