"""The per-GPU policy (nvshare_slurm/gpustate.py) driven with a fake clock: no sockets, no sleeps."""
from __future__ import annotations

import pytest

from nvshare_slurm.gpustate import (CONTENDED, DROP, GRANT, UNRESPONSIVE, ClientInfo, GpuSettings,
                                    GpuState)
from nvshare_slurm.proto import C

G = 1 << 30


def gpu(**settings) -> GpuState:
    base = dict(mode="concurrent", switch_time_mode="fixed", switch_time_fixed=10.0,
                memory_reserve_percent=0, max_runtime_sec=100, drop_grace_sec=5.0)
    base.update(settings)
    return GpuState("GPU-test", 0, 16 * G, GpuSettings(**base))


def client(n: int, job: int | None = None, limit: int = 0) -> ClientInfo:
    return ClientInfo(n, job if job is not None else n, 0, 1000 + n, "user", limit)


def kinds(actions):
    return [(a.kind, a.client.client_id) for a in actions]


def test_concurrent_fifo_contention_and_timeslice():
    g = gpu()
    a, b, c = client(1), client(2), client(3)
    assert kinds(g.request(a, 0.0)) == [(GRANT, 1)]
    assert kinds(g.request(b, 1.0)) == [(CONTENDED, 1)]        # contended as soon as one waits
    assert kinds(g.request(c, 2.0)) == []                      # told once
    assert g.next_deadline() == 11.0                           # one interval from the first wait
    assert g.tick(10.9) == []
    drop = g.tick(11.0)
    assert kinds(drop) == [(DROP, 1)] and drop[0].value == C.NVSHARE_DROP_TIMESLICE
    grant = g.release(1, 11.5)
    assert kinds(grant) == [(GRANT, 2), (CONTENDED, 2)]        # FIFO: b before c; c still waits
    assert grant[0].flags == C.NVSHARE_GRANT_EXCLUSIVE and grant[0].value == 10_000
    assert g.next_deadline() == 21.5


def test_no_preemption_without_waiters():
    g = gpu(switch_time_fixed=1.0)
    g.request(client(1), 0.0)
    assert g.next_deadline() is None
    assert g.tick(1000.0) == []


def test_early_release_grants_next_at_once():
    g = gpu()
    g.request(client(1), 0.0)
    g.request(client(2), 0.1)
    assert kinds(g.release(1, 0.2)) == [(GRANT, 2)]
    assert g.next_deadline() is None


def test_disconnect_drops_lock_queue_place_and_memory():
    g = gpu()
    a, b, c = client(1), client(2), client(3)
    g.request(a, 0)
    g.request(b, 0)
    g.request(c, 0)
    g.mem_update(b, 0, 2 * G, 2 * G, 0)
    assert g.remove_client(2, 1) == []              # a waiter leaves: nothing to send
    assert g.sum_allocated == 0 and 2 not in g.queue
    assert kinds(g.remove_client(1, 2)) == [(GRANT, 3)]


def test_unresponsive_holder_reported_once_after_grace():
    g = gpu(drop_grace_sec=5.0)
    g.request(client(1), 0)
    g.request(client(2), 0)
    g.tick(10)
    assert g.next_deadline() == 15
    assert g.tick(14.9) == []
    assert kinds(g.tick(15)) == [(UNRESPONSIVE, 1)]
    assert g.tick(100) == []


def test_auto_mode_shares_while_memory_fits_then_falls_back():
    g = gpu(mode="auto", switch_time_mode="fixed", switch_time_fixed=3.0)
    a, b = client(1), client(2)
    g.mem_update(a, 0, 8 * G, 8 * G, 0)
    g.mem_update(b, 0, 8 * G, 8 * G, 0)
    assert [x.flags for x in g.request(a, 0)] == [C.NVSHARE_GRANT_SHARED]
    assert [x.flags for x in g.request(b, 0)] == [C.NVSHARE_GRANT_SHARED]
    actions, _ = g.mem_update(b, 1, 9 * G, 4 * G, 0)            # 17G > 16G
    assert kinds(actions) == [(DROP, 2)] and actions[0].value == C.NVSHARE_DROP_MEMORY
    assert g.release(2, 1.1) == []
    assert kinds(g.request(b, 1.2)) == [(CONTENDED, 1)]
    assert g.next_deadline() == pytest.approx(4.2)
    actions, _ = g.mem_update(b, 2, 7 * G, 4 * G, 0)            # fits again: waiter shares now
    assert [(x.kind, x.flags) for x in actions] == [(GRANT, C.NVSHARE_GRANT_SHARED)]


def test_auto_switch_interval_formula():
    g = gpu(mode="concurrent", switch_time_mode="auto", switch_time_min=2.0,
            switch_time_multiplier=20.0, swap_bandwidth=10 * G)
    a, b = client(1), client(2)
    g.request(a, 0)
    assert g.switch_interval() == 2.0                            # nothing to move: the floor
    g.mem_update(a, 0, 6 * G, 1 * G, 0)                          # 5G swappable
    g.request(b, 0)
    g.mem_update(b, 0, 0, 0, 3 * G)                              # 3G swapped out, to come back
    assert g.switch_interval() == pytest.approx(20 * 8 / 10)     # multiplier x 8G / 10G/s
    assert g.next_deadline() == pytest.approx(16.0)


def test_serial_mode_one_job_at_a_time():
    g = gpu(mode="serial", max_runtime_sec=100)
    a1, a2, b = client(1, job=1), client(2, job=1), client(3, job=3)
    assert [(x.kind, x.flags) for x in g.request(a1, 0)] == [(GRANT, C.NVSHARE_GRANT_SHARED)]
    assert kinds(g.request(b, 1)) == []                          # no contention notice in serial
    assert kinds(g.request(a2, 2)) == [(GRANT, 2)]               # same job joins
    assert g.release(1, 3) == [] and g.release(2, 3) == []       # idle, but the job still owns it
    assert g.remove_client(1, 4) == []
    assert kinds(g.remove_client(2, 5)) == [(GRANT, 3)]          # every client of job 1 gone


def test_serial_max_runtime_forces_switch_and_requeues():
    g = gpu(mode="serial", max_runtime_sec=100)
    a, b = client(1), client(2)
    g.request(a, 0)
    g.request(b, 50)
    assert g.next_deadline() == 150                              # counted while others wait
    drop = g.tick(150)
    assert kinds(drop) == [(DROP, 1)] and drop[0].value == C.NVSHARE_DROP_MAX_RUNTIME
    assert kinds(g.release(1, 151)) == [(GRANT, 2)]
    assert g.request(a, 151.5) == []                             # dropped job goes to the back
    assert list(g.queue) == [1]
    assert g.next_deadline() == 251.5


def test_memory_admission_limits_and_views():
    g = gpu(memory_reserve_percent=25)                           # usable 12G
    a = client(1, limit=4 * G)
    b = client(2)
    _, d = g.mem_update(a, 0, 0, 0, 0, 3 * G)
    assert (d.status, d.total, d.available) == (C.NVSHARE_OK, 4 * G, 4 * G)
    _, d = g.mem_update(a, 0, 3 * G, 3 * G, 0, 2 * G)
    assert (d.status, d.available) == (C.NVSHARE_ERR_NOMEM, 1 * G)
    _, d = g.mem_update(b, 0, 0, 0, 0, 10 * G)                   # 10G + a's fixed 3G > 12G
    assert d.status == C.NVSHARE_ERR_NOMEM
    _, d = g.mem_update(b, 0, 0, 0, 0, 9 * G)
    assert (d.status, d.total) == (C.NVSHARE_OK, 12 * G)
    _, d = g.mem_update(a, 0, 3 * G, 0, 0, 1 * G)                # swappable memory does not block
    _, d = g.mem_update(b, 0, 0, 0, 0, 12 * G)
    assert d.status == C.NVSHARE_OK


def test_admin_mode_change_drops_extra_co_runners():
    g = gpu(mode="auto")
    g.request(client(1), 0)
    g.request(client(2), 0)
    actions = g.update_settings(GpuSettings(mode="concurrent", switch_time_mode="fixed",
                                            memory_reserve_percent=0), 1)
    assert kinds(actions) == [(DROP, 2)] and actions[0].value == C.NVSHARE_DROP_ADMIN


def test_switch_to_auto_grants_waiters_shared():
    g = gpu()
    g.request(client(1), 0)
    g.request(client(2), 0)
    actions = g.update_settings(GpuSettings(mode="auto", memory_reserve_percent=0), 1)
    assert [(x.kind, x.client.client_id, x.flags) for x in actions] == \
        [(GRANT, 2, C.NVSHARE_GRANT_SHARED)]
