"""The per-GPU policy (nvshare_slurm/policy/gpustate.py) driven with a fake clock: no sockets, no sleeps."""
from __future__ import annotations

import pytest

from nvshare_slurm.policy.gpustate import GpuState
from nvshare_slurm.policy.policytypes import (CONTENDED, DROP, GRANT, HANDOFF, MEM_REPLY, PREFETCH,
                                              SWAP_OUT, SWAP_UNANSWERED, UNRESPONSIVE, ClientInfo,
                                              GpuSettings)
from nvshare_slurm.wire.proto import C

G = 1 << 30
MiB = 1 << 20
DEFER = C.NVSHARE_MEM_CAN_DEFER


def gpu(**settings) -> GpuState:
    base = dict(mode="concurrent", auto_share="turns", switch_time_mode="fixed",
                switch_time_fixed=10.0, memory_reserve_percent=0, max_runtime_sec=100,
                drop_grace_sec=5.0)
    base.update(settings)
    return GpuState("GPU-test", 0, 16 * G, GpuSettings(**base))


def client(n: int, job: int | None = None, limit: int = 0) -> ClientInfo:
    return ClientInfo(n, job if job is not None else n, 0, 1000 + n, "user", limit)


def kinds(actions):
    return [(a.kind, a.client.client_id) for a in actions]


def moves(actions):
    """(kind, client, bytes): what each action asks to move (or, for a grant, what did not fit)."""
    return [(a.kind, a.client.client_id, a.bytes) for a in actions]


def test_concurrent_fifo_contention_and_timeslice():
    g = gpu()
    a, b, c = client(1), client(2), client(3)
    assert kinds(g.request(a, 0.0)) == [(GRANT, 1)]
    assert kinds(g.request(b, 1.0)) == [(CONTENDED, 1)]        # contended as soon as one waits
    assert kinds(g.request(c, 2.0)) == []                      # told once
    assert g.next_deadline() == 11.0                           # one interval from the first wait
    assert g.tick(10.9) == []
    drop = g.tick(11.0)
    assert kinds(drop) == [(HANDOFF, 2), (DROP, 1)] and drop[1].value == C.NVSHARE_DROP_TIMESLICE
    assert drop[0].source is a                                 # b starts when a is drained
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


def test_auto_mode_takes_short_turns_while_memory_fits():
    """The default (auto_share: turns): exclusive turns of switch_time_min that move no memory,
    handed over early when the holder idles; no co-running."""
    g = gpu(mode="auto", switch_time_mode="auto", switch_time_min=2.0)
    a, b = client(1), client(2)
    g.mem_update(a, 0, 4 * G, 0, 0)
    g.mem_update(b, 0, 4 * G, 0, 0)
    assert [(x.kind, x.flags) for x in g.request(a, 0)] == [(GRANT, C.NVSHARE_GRANT_EXCLUSIVE)]
    assert kinds(g.request(b, 1.0)) == [(CONTENDED, 1)]        # give it back as soon as idle
    assert g.next_deadline() == pytest.approx(3.0)             # 2 s: no bytes to move
    assert g.status(1.0, [], [])["co_running"] is False
    assert [(x.kind, x.flags) for x in g.release(1, 1.5)] == [(GRANT, C.NVSHARE_GRANT_EXCLUSIVE)]


def test_auto_corun_shares_while_memory_fits_then_falls_back():
    g = gpu(mode="auto", auto_share="corun", switch_time_mode="fixed", switch_time_fixed=3.0)
    a, b = client(1), client(2)
    g.mem_update(a, 0, 8 * G, 8 * G, 0)
    g.mem_update(b, 0, 8 * G, 8 * G, 0)
    assert [x.flags for x in g.request(a, 0)] == [C.NVSHARE_GRANT_SHARED]
    assert [x.flags for x in g.request(b, 0)] == [C.NVSHARE_GRANT_SHARED]
    actions, _ = g.mem_update(b, 1, 9 * G, 4 * G, 0)            # 17G > 16G
    assert kinds(actions) == [(DROP, 2)] and actions[0].value == C.NVSHARE_DROP_MEMORY
    assert actions[0].bytes == 5 * G                             # all its swappable memory
    assert g.release(2, 1.1) == []
    assert kinds(g.request(b, 1.2)) == [(CONTENDED, 1)]
    assert g.next_deadline() == pytest.approx(4.2)
    actions, _ = g.mem_update(b, 2, 7 * G, 4 * G, 0)            # fits again: waiter shares now
    assert [(x.kind, x.flags) for x in actions] == [(GRANT, C.NVSHARE_GRANT_SHARED)]


def test_auto_switch_interval_formula():
    # moved = what the holder must move out for the head + the head's swapped bytes (protocol.md
    # "Swap" 5); the holder's swappable memory alone no longer counts, since a switch to a head
    # that fits the room moves none of it.
    g = gpu(mode="concurrent", switch_time_mode="auto", switch_time_min=2.0,
            switch_time_multiplier=20.0, swap_bandwidth=10 * G,
            drop_grace_sec=60.0)   # b's PREFETCH offer (not answered here) runs out after that
    a, b = client(1), client(2)
    g.request(a, 0)
    assert g.switch_interval() == 2.0                            # nothing to move: the floor
    g.mem_update(a, 0, 6 * G, 1 * G, 0)                          # 5G swappable, room 10G
    g.request(b, 0)
    assert g.switch_interval() == 2.0                            # b has nothing to bring back
    g.mem_update(b, 0, 0, 0, 3 * G)                              # 3G in host memory: it fits
    assert g.switch_interval() == pytest.approx(20 * 3 / 10)     # multiplier x 3G / 10G/s
    assert g.next_deadline() == pytest.approx(6.0)
    g.mem_update(b, 0, 0, 0, 13 * G)                             # room 10G: a must move 3G out
    assert g.switch_interval() == pytest.approx(20 * 16 / 10)    # (3G + 13G) / 10G/s x 20
    assert g.next_deadline() == pytest.approx(32.0)


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
    g = gpu(mode="auto", auto_share="corun")
    g.request(client(1), 0)
    g.request(client(2), 0)
    actions = g.update_settings(GpuSettings(mode="concurrent", switch_time_mode="fixed",
                                            memory_reserve_percent=0), 1)
    assert kinds(actions) == [(DROP, 2)] and actions[0].value == C.NVSHARE_DROP_ADMIN


def test_switch_to_auto_grants_waiters_shared():
    g = gpu()
    g.request(client(1), 0)
    g.request(client(2), 0)
    actions = g.update_settings(GpuSettings(mode="auto", auto_share="corun",
                                            memory_reserve_percent=0), 1)
    assert [(x.kind, x.client.client_id, x.flags) for x in actions] == \
        [(GRANT, 2, C.NVSHARE_GRANT_SHARED)]


# --- memory with swap (docs/protocol.md "Memory", "Swap") ---------------------------------------

def test_admission_counts_own_swapped_memory_and_others_fixed():
    g = gpu(memory_reserve_percent=25)                           # usable 12G
    a = client(1, limit=6 * G)
    b, c = client(2), client(3)
    # the job's usage against its limit is resident + swapped: 2G + 3G + 2G > 6G
    _, d = g.mem_update(a, 0, 2 * G, 0, 3 * G, 2 * G)
    assert (d.status, d.total, d.available) == (C.NVSHARE_ERR_NOMEM, 6 * G, 1 * G)
    _, d = g.mem_update(a, 0, 2 * G, 0, 3 * G, 1 * G)
    assert d.status == C.NVSHARE_OK
    g.mem_update(b, 0, 4 * G, 4 * G, 0)                          # 4G that can never move
    # 4G + own 1G resident + own 4G swapped + b's fixed 4G = 13G > 12G; a's 2G swappable is no
    # obstacle (it can move), and neither is a's swapped memory
    _, d = g.mem_update(c, 0, 1 * G, 0, 4 * G, 4 * G)
    assert d.status == C.NVSHARE_ERR_NOMEM
    _, d = g.mem_update(c, 0, 1 * G, 0, 4 * G, 3 * G)
    assert (d.status, d.available) == (C.NVSHARE_OK, 7 * G)      # 12G - its own 5G


def test_grant_waits_until_the_heads_swapped_memory_fits():
    g = gpu()                                                     # 16G, no reserve
    head, idle = client(1), client(2)
    g.mem_update(idle, 0, 12 * G, 2 * G, 0)                      # room 4G, 10G of it can move
    g.mem_update(head, 0, 0, 0, 10 * G)
    actions = g.request(head, 1)
    # the shortfall, no grant yet; the head brings back what fits meanwhile
    assert moves(actions) == [(PREFETCH, 1, 4 * G), (SWAP_OUT, 2, 6 * G)]
    assert list(g.queue) == [1] and not g.holders
    # re-evaluated on every event, but asked once
    assert g.tick(2) == []
    assert g.mem_update(head, 2, 0, 0, 10 * G)[0] == []
    assert g.next_deadline() == 6.0                              # its answer's grace
    actions, _ = g.mem_update(idle, 3, 6 * G, 2 * G, 6 * G)      # moved 6G: room 10G
    assert moves(actions) == [(GRANT, 1, 0)]
    # exclusive, and the memory does not fit: its hook pins its host copies ahead
    assert actions[0].flags == C.NVSHARE_GRANT_SWAP_AHEAD


def test_a_grant_says_swap_ahead_only_while_the_memory_does_not_fit():
    g = gpu()                                                     # 16G
    a, b = client(1), client(2)
    g.mem_update(a, 0, 6 * G, 0, 0)
    g.mem_update(b, 0, 6 * G, 0, 0)                              # 12G: fits
    grant = g.request(a, 1)[0]
    assert (grant.kind, grant.flags) == (GRANT, C.NVSHARE_GRANT_EXCLUSIVE)
    g.release(1, 2)
    g.mem_update(b, 2, 6 * G, 0, 6 * G)                          # 18G: turns with swap
    grant = g.request(a, 3)[0]
    assert (grant.kind, grant.flags) == (GRANT, C.NVSHARE_GRANT_SWAP_AHEAD)


def test_a_free_gpu_goes_to_a_waiter_that_fits_before_a_head_that_needs_a_swap_once():
    """first_to_run (gpumemory.py): the head's memory is in host memory and does not fit; the
    waiter behind it has all its memory here. Granting the head would leave the GPU idle while
    the waiter's memory moves out (10 s for 14 GiB on the H100); the waiter runs first, and the
    head has the turn after it, before anyone who came later."""
    g = gpu()
    a, b, c, d = client(1), client(2), client(3), client(4)
    g.request(c, 0)                                    # holds, no memory
    g.mem_update(a, 0, 12 * G, 0, 0)                   # resident, waits behind b
    g.mem_update(b, 0, 0, 0, 10 * G)                   # the head: 10G in host memory, room 4G
    assert kinds(g.request(b, 0.1)) == [(PREFETCH, 2)]  # what fits comes back meanwhile
    assert g.request(a, 0.2) == []
    assert moves(g.release(3, 1)) == [(GRANT, 1, 0)]   # a runs, nothing is asked to move
    assert list(g.queue) == [2]
    assert g.request(d, 2) == []                       # fits too, but came after b was passed over
    # a's turn ends: it moves out what b lacks (b's 3.7G on its way count as b's)
    assert moves(g.tick(11.5)) == [(DROP, 1, 6 * G)]
    g.mem_update(a, 12, 6 * G, 0, 6 * G)
    assert moves(g.release(1, 12.1)) == [(GRANT, 2, 0), (CONTENDED, 2, 0)]
    assert list(g.queue) == [4]


def test_prepare_swap_out_goes_once_to_non_holders_with_movable_memory():
    g = gpu()
    holder, head, idle_big, idle_small, waiter_near, waiter_far, pinned = (
        client(n) for n in range(1, 8))
    g.request(holder, 0)
    g.mem_update(head, 0, 1 * G, 0, 8 * G)            # its own 1G moving would not help it
    g.mem_update(idle_big, 0, 4 * G, 1 * G, 0)         # 3G movable
    g.mem_update(idle_small, 0, 2 * G, 1 * G, 0)       # 1G movable
    g.mem_update(waiter_near, 0, 3 * G, 0, 0)          # runs right after the head: asked last
    g.mem_update(waiter_far, 0, 2 * G, 0, 0)
    g.mem_update(pinned, 0, 2 * G, 2 * G, 0)           # nothing movable: never asked
    for waiter in (head, waiter_near, waiter_far):
        g.request(waiter, 0)
    g.memory.skipped_head = head.client_id   # its one turn behind a waiter that fits is spent
    # 14G resident, room 2G, the head needs 8G: 6G short once the holder (no memory) is gone
    actions = g.release(1, 1)
    assert moves(actions) == [(SWAP_OUT, 3, 3 * G), (SWAP_OUT, 4, 1 * G), (SWAP_OUT, 6, 2 * G)]
    assert g.tick(2) == []
    assert g.mem_update(idle_big, 2, 1 * G, 1 * G, 3 * G)[0] == []    # 5G room: others pending
    assert g.mem_update(idle_small, 2, 1 * G, 1 * G, 1 * G)[0] == []
    actions, _ = g.mem_update(waiter_far, 3, 0, 0, 2 * G)
    assert moves(actions) == [(GRANT, 2, 0), (CONTENDED, 2, 0)]  # the next one fits: no swap
    # the shortfall episode is over: a new one asks again, even those asked before
    g.mem_update(head, 4, 9 * G, 0, 0)                 # it brought its memory back
    g.mem_update(waiter_near, 4, 3 * G, 0, 4 * G)      # 16G resident: room 0, needs 4G
    actions = g.release(2, 5)
    assert moves(actions) == [(SWAP_OUT, 2, 4 * G)]   # the old head, now idle, 9G movable


def test_holder_that_released_without_moving_enough_is_asked_like_others():
    g = gpu()
    a, b = client(1), client(2)
    g.request(a, 0)
    g.mem_update(a, 0, 10 * G, 2 * G, 0)
    g.mem_update(b, 0, 0, 0, 10 * G)
    g.request(b, 0)
    assert moves(g.release(1, 1)) == [(SWAP_OUT, 1, 4 * G)]
    assert moves(g.mem_update(a, 2, 6 * G, 2 * G, 4 * G)[0]) == [(GRANT, 2, 0)]


def test_grant_anyway_when_nothing_can_move():
    g = gpu()
    pinned, head = client(1), client(2)
    g.mem_update(pinned, 0, 12 * G, 12 * G, 0)
    g.mem_update(head, 0, 0, 0, 8 * G)
    actions = g.request(head, 0)
    assert moves(actions) == [(GRANT, 2, 4 * G)]       # granted, 4G short (the daemon warns)


@pytest.mark.parametrize("answer", [(12 * G, 12 * G), (12 * G, 0)])
def test_grant_anyway_when_the_asked_clients_could_not_move(answer):
    g = gpu()
    idle, head = client(1), client(2)
    g.mem_update(idle, 0, 12 * G, 0, 0)
    g.mem_update(head, 0, 0, 0, 8 * G)
    assert moves(g.request(head, 0)) == [(PREFETCH, 2, 4 * G), (SWAP_OUT, 1, 4 * G)]
    # its report says it moved nothing: everything fixed now (its cgroup cannot hold the swap),
    # or unchanged (its gate was open); either way it was asked once and answered
    actions, _ = g.mem_update(idle, 1, *answer, 0)
    assert moves(actions) == [(GRANT, 2, 4 * G)]


def test_unanswered_prepare_swap_out_is_given_up_after_grace():
    g = gpu(drop_grace_sec=5.0)
    idle, head, other = client(1), client(2), client(3)
    g.mem_update(idle, 0, 6 * G, 0, 0)
    g.mem_update(other, 0, 4 * G, 0, 0)
    g.mem_update(head, 0, 0, 0, 10 * G)                  # room 6G, 4G short
    # the head's hook never answers its PREFETCH either (one without it): it runs out at 5 s too
    assert moves(g.request(head, 0)) == [(PREFETCH, 2, 6 * G), (SWAP_OUT, 1, 4 * G)]
    _, d = g.mem_update(idle, 1, 6 * G, 0, 0, 7 * G, DEFER)   # an allocation: not its answer
    assert d.flags == C.NVSHARE_MEM_DEFERRED
    assert g.next_deadline() == 5.0
    assert g.tick(5.0) == []
    # no answer within the grace and a second per GiB asked: the next one is asked, and when it
    # does not answer either, the grant goes out
    assert g.next_deadline() == 9.0
    assert g.tick(8.9) == []
    assert moves(g.tick(9.0)) == [(SWAP_UNANSWERED, 1, 4 * G), (SWAP_OUT, 3, 4 * G)]
    assert moves(g.tick(18.0)) == [(SWAP_UNANSWERED, 3, 4 * G), (GRANT, 2, 4 * G)]


def test_hand_over_drop_carries_the_bytes_and_no_contention_notice():
    g = gpu(switch_time_fixed=10.0)
    a, b = client(1), client(2)
    g.request(a, 0)
    g.mem_update(a, 0, 10 * G, 2 * G, 0)
    g.mem_update(b, 0, 0, 0, 10 * G)
    # an idle release would cost a swap each time: a keeps its turn, told nothing; b may bring
    # back what fits beside a's running turn, less the headroom left for a's allocations (2 %)
    back = 6 * G - 16 * G * 2 // 100
    assert moves(g.request(b, 1)) == [(PREFETCH, 2, back)]
    g.mem_update(b, 1.2, back, 0, 10 * G - back, flags=C.NVSHARE_MEM_PREFETCH_DONE)
    assert g.next_deadline() == 11.0
    actions = g.tick(11.0)
    # b's 10G - room 6G; a is leaving, so b may take the headroom it had left a
    headroom = 16 * G * 2 // 100
    assert moves(actions) == [(DROP, 1, 4 * G), (PREFETCH, 2, headroom)]
    assert actions[0].value == C.NVSHARE_DROP_TIMESLICE
    g.mem_update(b, 11.1, 6 * G, 0, 4 * G, flags=C.NVSHARE_MEM_PREFETCH_DONE)
    # a reports as it moves out; b brings the rest back meanwhile
    assert moves(g.mem_update(a, 11.5, 6 * G, 2 * G, 4 * G)[0]) == [(PREFETCH, 2, 4 * G)]
    assert moves(g.release(1, 11.6)) == [(GRANT, 2, 0)]


def test_contention_notice_when_the_swapped_head_fits_anyway():
    g = gpu()
    a, b = client(1), client(2)
    g.request(a, 0)
    g.mem_update(a, 0, 4 * G, 0, 0)
    g.mem_update(b, 0, 0, 0, 4 * G)                      # 8G together: no swap at the switch
    assert kinds(g.request(b, 1)) == [(CONTENDED, 1), (PREFETCH, 2)]
    assert moves(g.tick(11)) == [(DROP, 1, 0)]


def test_auto_mode_grants_swapped_clients_shared_while_all_fits():
    g = gpu(mode="auto", auto_share="corun")
    a, b = client(1), client(2)
    g.mem_update(a, 0, 6 * G, 0, 0)
    g.request(a, 0)
    g.mem_update(b, 0, 0, 0, 10 * G)                     # 16G in all: fits, b brings its own back
    assert [(x.kind, x.flags) for x in g.request(b, 1)] == [(GRANT, C.NVSHARE_GRANT_SHARED)]
    assert g.memory.room() == 0
    actions, _ = g.mem_update(b, 2, 11 * G, 1 * G, 0)   # 17G: b is the newer co-runner
    assert moves(actions) == [(DROP, 2, 10 * G)] and actions[0].value == C.NVSHARE_DROP_MEMORY


def test_allocation_without_room_is_deferred_for_a_non_holder_that_can_defer():
    g = gpu()
    holder, other = client(1), client(2)
    g.request(holder, 0)
    g.mem_update(holder, 0, 12 * G, 0, 0)                # room 4G
    _, d = g.mem_update(other, 0, 0, 0, 0, 6 * G, DEFER)
    assert (d.status, d.flags) == (C.NVSHARE_OK, C.NVSHARE_MEM_DEFERRED)
    _, d = g.mem_update(other, 0, 0, 0, 0, 6 * G)        # cannot defer: the driver decides
    assert (d.status, d.flags) == (C.NVSHARE_OK, 0)
    _, d = g.mem_update(other, 0, 0, 0, 0, 4 * G, DEFER)  # fits the room: resident now
    assert (d.status, d.flags) == (C.NVSHARE_OK, 0)
    _, d = g.mem_update(other, 0, 0, 0, 6 * G, 1, DEFER)  # cuMemGetInfo's probe: never deferred
    assert (d.status, d.flags, d.available) == (C.NVSHARE_OK, 0, 10 * G)


def test_holder_allocation_waits_for_the_room_it_makes():
    g = gpu()
    a, idle, waiter = client(1), client(2), client(3)
    g.request(a, 0)
    g.mem_update(a, 0, 6 * G, 6 * G, 0)
    g.mem_update(idle, 0, 8 * G, 0, 0)                    # room 2G
    actions, d = g.mem_update(a, 1, 6 * G, 6 * G, 0, 6 * G, DEFER, token=77)
    assert d is None                                      # its MEM_REPLY waits
    assert moves(actions) == [(SWAP_OUT, 2, 4 * G)]
    assert g.next_deadline() == 6.0
    assert g.tick(2) == []
    actions, _ = g.mem_update(idle, 3, 4 * G, 0, 4 * G)   # room 6G now
    assert kinds(actions) == [(MEM_REPLY, 1)]
    reply = actions[0].reply
    assert (actions[0].token, reply.status, reply.flags, reply.no_room) == \
        (77, C.NVSHARE_OK, 0, False)
    # the promised room is taken until a reports the allocation
    _, d = g.mem_update(waiter, 4, 0, 0, 0, 4 * G, DEFER)
    assert d.flags == C.NVSHARE_MEM_DEFERRED
    g.mem_update(a, 5, 12 * G, 6 * G, 0)
    assert g.memory.room() == 0 and g.memory.promised == {}


def test_holder_allocation_answered_after_grace_without_room():
    g = gpu(drop_grace_sec=5.0)
    a, idle = client(1), client(2)
    g.request(a, 0)
    g.mem_update(a, 0, 6 * G, 6 * G, 0)
    g.mem_update(idle, 0, 8 * G, 0, 0)
    actions, d = g.mem_update(a, 1, 6 * G, 6 * G, 0, 6 * G, 0, token=9)
    assert d is None and moves(actions) == [(SWAP_OUT, 2, 4 * G)]
    assert g.tick(5.9) == []
    actions = g.tick(6.0)
    assert kinds(actions) == [(MEM_REPLY, 1)]
    assert (actions[0].token, actions[0].reply.status, actions[0].reply.no_room) == \
        (9, C.NVSHARE_OK, True)
    # its own wait is drop_grace_sec (the ask to move 4 GiB had 4 s more: it ends with the need)
    assert g.next_deadline() == 11.0                      # the promise lapses unless reported


def test_holder_allocation_answered_once_nothing_more_can_move():
    g = gpu()
    a, idle = client(1), client(2)
    g.request(a, 0)
    g.mem_update(a, 0, 6 * G, 6 * G, 0)
    g.mem_update(idle, 0, 8 * G, 0, 0)
    actions, d = g.mem_update(a, 1, 6 * G, 6 * G, 0, 6 * G, DEFER, token=4)
    assert d is None and moves(actions) == [(SWAP_OUT, 2, 4 * G)]
    # it could move only 2G (room 4G); nobody else to ask: answer now, not after the grace
    actions, _ = g.mem_update(idle, 2, 6 * G, 0, 2 * G)
    assert kinds(actions) == [(MEM_REPLY, 1)] and actions[0].reply.no_room
    assert g.memory.pending_allocs == []


def test_holder_allocation_drops_the_newer_co_runner_with_the_bytes_it_must_move():
    g = gpu(mode="auto", auto_share="corun")
    a, b, idle = client(1), client(2), client(3)
    g.mem_update(a, 0, 4 * G, 4 * G, 0)
    g.mem_update(b, 0, 6 * G, 0, 0)
    g.mem_update(idle, 0, 4 * G, 0, 0)                    # room 2G
    g.request(a, 0)
    g.request(b, 0)
    actions, d = g.mem_update(a, 1, 4 * G, 4 * G, 0, 8 * G, DEFER, token=3)
    # 22G wanted no longer fits: b stops co-running and moves its 6G; that covers the 6G short,
    # so the idle client is left alone
    assert d is None and moves(actions) == [(DROP, 2, 6 * G)]
    assert actions[0].value == C.NVSHARE_DROP_MEMORY
    actions, _ = g.mem_update(b, 2, 0, 0, 6 * G)
    assert kinds(actions) == [(MEM_REPLY, 1)] and actions[0].token == 3
    assert g.release(2, 3) == []
    assert g.request(b, 4) == []               # a keeps the GPU; b waits, no idle hand-over
    assert list(g.queue) == [2]


def test_serial_holder_allocation_drops_another_client_of_the_job():
    g = gpu(mode="serial")
    a1, a2 = client(1, job=1), client(2, job=1)
    g.request(a1, 0)
    g.request(a2, 0)
    g.mem_update(a1, 0, 4 * G, 4 * G, 0)
    g.mem_update(a2, 0, 8 * G, 0, 0)                      # room 4G
    actions, d = g.mem_update(a1, 1, 4 * G, 4 * G, 0, 8 * G, DEFER, token=1)
    assert d is None and moves(actions) == [(DROP, 2, 4 * G)]
    assert actions[0].value == C.NVSHARE_DROP_MEMORY


def test_serial_max_runtime_drop_carries_the_next_jobs_shortfall():
    g = gpu(mode="serial", max_runtime_sec=100)
    a, b = client(1), client(2)
    g.mem_update(a, 0, 12 * G, 2 * G, 0)
    g.mem_update(b, 0, 0, 0, 8 * G)
    g.request(a, 0)
    g.request(b, 1)
    actions = g.tick(101)
    assert moves(actions) == [(DROP, 1, 4 * G)]
    assert actions[0].value == C.NVSHARE_DROP_MAX_RUNTIME
    g.mem_update(a, 102, 8 * G, 2 * G, 4 * G)
    assert moves(g.release(1, 102)) == [(GRANT, 2, 0)]


def test_disconnect_ends_asks_and_frees_the_room():
    g = gpu()
    idle, head = client(1), client(2)
    g.mem_update(idle, 0, 10 * G, 0, 0)
    g.mem_update(head, 0, 0, 0, 10 * G)
    assert moves(g.request(head, 0)) == [(PREFETCH, 2, 6 * G), (SWAP_OUT, 1, 4 * G)]
    # the asked client exits, taking its memory with it: the head fits now
    assert moves(g.remove_client(1, 1)) == [(GRANT, 2, 0)]
    assert g.memory.swap_asked == {} and g.memory.job_allocated == {}
    assert g.memory.job_swapped == {2: 10 * G}


# --- hand-over between exclusive turns (HANDOFF) -------------------------------------------------

def test_a_turn_that_moves_no_memory_passes_by_hand_over_and_the_successor_holds_next():
    g = gpu()
    a, b, c = client(1), client(2), client(3)
    g.request(a, 0.0)
    g.request(b, 1.0)
    g.request(c, 2.0)
    actions = g.tick(11.0)
    assert kinds(actions) == [(HANDOFF, 2), (DROP, 1)]       # told before the holder's DROP_LOCK
    assert actions[0].source is a and g.handoff == (1, 2)
    assert kinds(g.release(1, 11.001)) == [(GRANT, 2), (CONTENDED, 2)]
    assert g.handoff is None and g.next_deadline() == pytest.approx(21.001)


def test_the_successor_holds_next_even_when_a_better_class_came_meanwhile():
    # b may run already (a's hook signalled it when drained): the daemon's view must say so, and
    # the better class then takes the GPU from b as from any holder.
    g = gpu()
    a, b = client(1), client(2)
    high = ClientInfo(3, 3, 0, 1003, "user", 0, "high")
    g.request(a, 0.0)
    g.request(b, 1.0)
    assert kinds(g.tick(11.0)) == [(HANDOFF, 2), (DROP, 1)]
    g.request(high, 11.0005)
    assert next(iter(g.queue)) == 3                          # queued ahead of b
    actions = g.release(1, 11.001)
    assert kinds(actions)[0] == (GRANT, 2) and actions[0].flags == C.NVSHARE_GRANT_EXCLUSIVE
    assert (DROP, 2) in kinds(actions) and (HANDOFF, 3) in kinds(actions)


def test_a_holder_that_dies_after_its_hand_over_still_passes_the_turn():
    g = gpu()
    a, b, c = client(1), client(2), client(3)
    g.request(a, 0.0)
    g.request(b, 1.0)
    g.request(c, 1.5)
    g.tick(11.0)
    assert kinds(g.remove_client(1, 11.001)) == [(GRANT, 2), (CONTENDED, 2)]
    assert g.handoff is None


def test_a_successor_that_leaves_cancels_the_hand_over():
    g = gpu()
    a, b, c = client(1), client(2), client(3)
    g.request(a, 0.0)
    g.request(b, 1.0)
    g.tick(11.0)
    g.request(c, 11.0)
    assert g.remove_client(2, 11.0005) == [] and g.handoff is None
    assert kinds(g.release(1, 11.001)) == [(GRANT, 3)]


def test_no_hand_over_when_the_switch_moves_memory_or_it_is_off():
    g = gpu()                                                 # a must move 4G out for b
    a, b = client(1), client(2)
    g.request(a, 0)
    g.mem_update(a, 0, 10 * G, 2 * G, 0)
    g.mem_update(b, 0, 0, 0, 10 * G)
    g.request(b, 1)
    assert kinds(g.tick(11.0)) == [(DROP, 1)] and g.handoff is None
    g = gpu(turn_handoff=False)
    g.request(a, 0)
    g.request(b, 1)
    assert kinds(g.tick(11.0)) == [(DROP, 1)] and g.handoff is None
    assert kinds(g.release(1, 11.001)) == [(GRANT, 2)]


def test_a_growing_holder_has_others_move_more_than_each_request_in_one_ask():
    """On the H200 a PyTorch job's 30 allocations of 16-240 MiB in its first 3 s each waited
    50-60 ms for the other job to move that much out, one ask each: an 8 s training took 12 s in
    its turn. A holder that asks again within HOLDER_GROWTH_SEC has others move out room for its
    next ones too: 4x its largest recent request, between 2 % and 5 % of the usable memory."""
    from nvshare_slurm.policy.gpumemory import GROWTH_ASK_MAX_PERCENT
    g = gpu()                                            # 16 GiB, no reserve
    a, idle = client(1), client(2)
    g.request(a, 0)
    g.mem_update(a, 0, 4 * G, 0, 0)
    g.mem_update(idle, 0, 12 * G, 0, 0)                  # no room
    actions, d = g.mem_update(a, 1, 4 * G, 0, 0, 240 * MiB, DEFER)
    assert d is None and moves(actions) == [(SWAP_OUT, 2, 240 * MiB)]   # a first request: as asked
    actions, _ = g.mem_update(idle, 1.1, 12 * G - 240 * MiB, 0, 240 * MiB)
    assert kinds(actions) == [(MEM_REPLY, 1)]
    g.mem_update(a, 1.2, 4 * G + 240 * MiB, 0, 0)
    actions, d = g.mem_update(a, 1.3, 4 * G + 240 * MiB, 0, 0, 240 * MiB, DEFER)
    growth = min(4 * 240 * MiB, 16 * G * GROWTH_ASK_MAX_PERCENT // 100)   # 819 MiB: 5 %
    assert growth > 16 * G * 2 // 100
    assert d is None and moves(actions) == [(SWAP_OUT, 2, 240 * MiB + growth)]
    actions, _ = g.mem_update(idle, 1.4, 12 * G - 480 * MiB - growth, 0, 480 * MiB + growth)
    assert kinds(actions) == [(MEM_REPLY, 1)]
    g.mem_update(a, 1.5, 4 * G + 480 * MiB, 0, 0)
    # its next ones find the room made in that one ask: answered at once
    for n, t in enumerate((1.6, 1.7, 1.8)):
        _, d = g.mem_update(a, t, 4 * G + (480 + 240 * n) * MiB, 0, 0, 240 * MiB, DEFER)
        assert d is not None and d.status == C.NVSHARE_OK and not d.flags
        g.mem_update(a, t + 0.05, 4 * G + (720 + 240 * n) * MiB, 0, 0)


@pytest.mark.parametrize("requester_granted_first", [False, True])
def test_a_co_runner_whose_allocation_would_take_a_running_holders_room_gives_the_gpu_up(
        requester_granted_first):
    """Two jobs co-run at start; the second one's large allocation no longer fits beside the
    first one's memory, and only the first (running) could make room. On the H200 the first was
    dropped 1.5 s into its training and waited out the other's 8 s turn. The bytes weigh it: the
    requester holds less here than the other would move out, so it gives the GPU up itself
    (dropped, moving at most its own little) and, once released, its allocation is born in host memory
    (DEFERRED, no copy): the first one runs on. Before, deferring while it still held the GPU made
    67 GiB resident and then moved it to host memory (30 s)."""
    g = gpu(mode="auto", auto_share="corun")
    old, new = client(1), client(2)
    # granted 3 ms apart on the H200, either way round: the older grant is no reason to keep it
    for c, t in ((new, 0), (old, 0.003)) if requester_granted_first else ((old, 0), (new, 0.003)):
        assert (GRANT, c.client_id) in kinds(g.request(c, t))
    g.mem_update(old, 0.1, 10 * G, 0, 0)
    g.mem_update(new, 0.1, 256 * MiB, 0, 0)
    actions, d = g.mem_update(new, 1.5, 256 * MiB, 0, 0, 10 * G, DEFER)
    assert d is None                                         # held, not answered in place
    assert g.memory.yielding(2)
    assert kinds(actions) == [(DROP, 2)]                     # it gives way: nothing asked of 1
    assert actions[0].bytes <= 256 * MiB                     # its own resident memory at most
    assert g.holders[1].drop_at is None
    actions = g.release(2, 1.6)
    replies = [a for a in actions if a.kind == MEM_REPLY]
    assert [a.client.client_id for a in replies] == [2]
    assert replies[0].reply.status == C.NVSHARE_OK and replies[0].reply.flags == C.NVSHARE_MEM_DEFERRED
    assert (DROP, 1) not in kinds(actions) and g.holders[1].drop_at is None


def test_a_co_runner_that_holds_more_than_it_would_take_has_the_other_give_way():
    """The other way round: the requester holds 10 GiB here and needs 1 GiB that only a small
    co-runner can make. Giving way would strand its 10 GiB; the small one moves 1 GiB out."""
    g = gpu(mode="auto", auto_share="corun")
    big, small = client(1), client(2)
    g.request(big, 0)
    g.request(small, 0.003)
    g.mem_update(big, 0.1, 10 * G, 0, 0)
    g.mem_update(small, 0.1, 6 * G - 512 * MiB, 0, 0)
    actions, d = g.mem_update(big, 1, 10 * G, 0, 0, 1 * G, DEFER)
    assert d is None and not g.memory.yielding(1)
    assert (DROP, 2) in kinds(actions) and (DROP, 1) not in kinds(actions)


def test_a_co_runner_of_a_better_class_does_not_give_way():
    g = gpu(mode="auto", auto_share="corun")
    low = ClientInfo(1, 1, 0, 1001, "user", 0, "low")
    high = ClientInfo(2, 2, 0, 1002, "user", 0, "high")
    g.request(low, 0)
    g.request(high, 0.003)
    g.mem_update(low, 0.1, 10 * G, 0, 0)
    actions, d = g.mem_update(high, 1, 0, 0, 0, 10 * G, DEFER)
    assert d is None and not g.memory.yielding(2)
    assert (DROP, 1, 10 * G - (16 * G - 10 * G)) in moves(actions)   # the low one makes its room
