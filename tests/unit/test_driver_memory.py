"""The scheduler's memory picture follows the driver's (issue 39; nvshare_slurm/policy/drivermemory.py): an
ended client's memory counts until the driver (NVML) shows it released, a live client's memory
beyond its reports (context, workspaces) and unregistered processes' memory count against the
room. Fake clock, no sockets; tests/hook/test_exit_release.py has the same race with the hook, the
daemon and the fake driver's release delay."""
from __future__ import annotations

from nvshare_slurm.policy.drivermemory import ENDED_RELEASE_SEC, REFUSED_HOLD_SEC
from nvshare_slurm.policy.gpustate import GpuState
from nvshare_slurm.policy.policytypes import ENDED_MEMORY, GRANT, MEM_REPLY, ClientInfo, GpuSettings
from nvshare_slurm.wire.proto import C

G = 1 << 30


def gpu() -> GpuState:
    settings = GpuSettings(mode="concurrent", auto_share="turns", switch_time_mode="fixed",
                           switch_time_fixed=10.0, memory_reserve_percent=0, max_runtime_sec=100,
                           drop_grace_sec=30.0)
    return GpuState("GPU-test", 0, 16 * G, settings)


def client(n: int) -> ClientInfo:
    return ClientInfo(n, 500 + n, 0, 1000 + n, "user")


def kinds(actions):
    return [(a.kind, a.client.client_id) for a in actions]


def ended_holder_and_waiter(g: GpuState):
    """A (pid 1001) holds 12 GiB of 16 and the GPU; B (pid 1002) waits with 12 GiB in host
    memory; the driver has been looked at once."""
    a, b = client(1), client(2)
    g.mem_update(a, 0, 12 * G, 0, 0)
    assert kinds(g.request(a, 0)) == [(GRANT, 1)]
    g.mem_update(b, 0, 0, 0, 12 * G)
    g.request(b, 0.1)
    g.driver_seen(12 * G, {1001: 12 * G}, 0.2)
    return a, b


def test_an_ended_holders_memory_counts_until_the_driver_releases_it():
    """The H200's mix4-mem: a 70 GiB job ended, the swapped waiter was granted within 30 ms and
    brought its memory back, and the next job's allocation met the driver still holding the ended
    one's memory. Now the waiter's grant waits until the driver no longer lists the pid."""
    g = gpu()
    ended_holder_and_waiter(g)
    actions = g.remove_client(1, 1.0)
    assert GRANT not in [a.kind for a in actions]
    assert g.memory.driver.sum_ended == 12 * G
    # What the driver has free (4 GiB) may come back ahead of the turn (PREFETCH), no more.
    assert g.memory.room() + g.memory.prefetch_outstanding(2) == 4 * G
    status = g.status(1.0, [], [])
    assert status["memory_ended"] == 12 * G
    assert g.driver_seen(12 * G, {1001: 12 * G}, 1.1) == []          # still held: still waits
    actions = g.driver_seen(0, {}, 1.6)                               # released
    assert kinds(actions) == [(ENDED_MEMORY, 1), (GRANT, 2)]
    assert actions[0].value == 0 and actions[0].bytes == 12 * G and actions[0].flags == 600
    assert g.memory.driver.sum_ended == 0


def test_an_ended_process_the_driver_lists_for_ever_counts_free_at_the_deadline():
    g = gpu()
    ended_holder_and_waiter(g)
    g.remove_client(1, 1.0)
    assert g.next_deadline() <= 1.0 + ENDED_RELEASE_SEC
    assert GRANT not in [a.kind for a in g.tick(1.0 + ENDED_RELEASE_SEC - 0.1)]
    actions = g.tick(1.0 + ENDED_RELEASE_SEC)
    assert kinds(actions) == [(ENDED_MEMORY, 1), (GRANT, 2)]
    assert actions[0].value == 1


def test_without_a_driver_view_a_disconnected_clients_memory_counts_free_at_once():
    """A configured inventory (`gpus:`, no NVML): nothing to wait for, as before."""
    g = gpu()
    a, b = client(1), client(2)
    g.mem_update(a, 0, 12 * G, 0, 0)
    g.request(a, 0)
    g.mem_update(b, 0, 0, 0, 12 * G)
    g.request(b, 0.1)
    assert kinds(g.remove_client(1, 1.0)) == [(GRANT, 2)]


def test_a_holders_allocation_waits_for_an_ended_process_instead_of_meeting_the_drivers_oom():
    """A holds the GPU with 4 GiB and asks for 8 GiB more while 8 GiB of an ended client (C) are
    still the driver's: the request is held (no answer yet), and answered once the driver lists
    C's pid no more."""
    g = gpu()
    a, c = client(1), client(3)
    g.mem_update(a, 0, 4 * G, 0, 0)
    g.request(a, 0)
    g.mem_update(c, 0, 8 * G, 0, 0)
    g.driver_seen(12 * G, {1001: 4 * G, 1003: 8 * G}, 0.1)
    g.remove_client(3, 0.2)
    _, decision = g.mem_update(a, 0.3, 4 * G, 0, 0, 8 * G)
    assert decision is None                                # held: 4 GiB room, 8 on its way
    assert g.driver_seen(12 * G, {1001: 4 * G, 1003: 8 * G}, 0.4) == []
    actions = g.driver_seen(4 * G, {1001: 4 * G}, 0.9)
    assert kinds(actions) == [(ENDED_MEMORY, 3), (MEM_REPLY, 1)]
    reply = actions[1].reply
    assert reply.status == C.NVSHARE_OK and not reply.no_room


def test_context_memory_and_unregistered_processes_count_against_the_room():
    """What the driver holds beyond the reports: a client's context and workspaces (the smaller of
    two looks, so an allocation between report and look is not counted twice) and a process that
    is no client. The gap to NVML's device figure is in the status."""
    g = gpu()
    a = client(1)
    g.mem_update(a, 0, 4 * G, 0, 0)
    g.driver_seen(6 * G, {1001: 4 * G + (512 << 20), 77: G}, 0.1)
    assert g.memory.driver.sum_overhead == 512 << 20 and g.memory.driver.other == G
    assert g.memory.room() == 16 * G - 4 * G - (512 << 20) - G
    g.driver_seen(6 * G, {1001: 6 * G}, 0.2)               # an allocation not yet reported
    assert g.memory.driver.sum_overhead == 512 << 20        # the smaller of the two looks
    g.mem_update(a, 0.3, 6 * G - (256 << 20), 0, 0)
    g.driver_seen(6 * G, {1001: 6 * G}, 0.4)
    assert g.memory.driver.sum_overhead == 256 << 20
    status = g.status(0.4, [], [])
    assert status["memory_overhead"] == 256 << 20 and status["memory_other"] == 0
    assert status["memory_gap"] == 0


def test_a_client_that_reconnects_is_not_counted_twice():
    """The connection closed but the process lives (a daemon restart, say): its new client's
    reports count its memory, the ended entry goes."""
    g = gpu()
    a = client(1)
    g.mem_update(a, 0, 4 * G, 0, 0)
    g.driver_seen(4 * G, {1001: 4 * G}, 0.1)
    g.remove_client(1, 0.2)
    assert g.memory.driver.sum_ended == 4 * G
    again = ClientInfo(9, 501, 0, 1001, "user")
    g.mem_update(again, 0.3, 4 * G, 0, 0)
    g.driver_seen(4 * G, {1001: 4 * G}, 0.4)
    assert g.memory.driver.sum_ended == 0 and g.memory.room() == 12 * G


def test_a_drivers_refusal_holds_a_holders_request_until_the_missing_memory_is_explained_or_gone():
    """The hook's NVSHARE_MEM_DRIVER_OOM (the driver refused what nvshare admitted): what the driver
    lacked is held off the room for REFUSED_HOLD_SEC, so the holder's request waits instead of
    being admitted into room the driver does not have, and a waiter's allocation is deferred."""
    g = gpu()
    a, b = client(1), client(2)
    g.mem_update(a, 0, 4 * G, 0, 0)
    g.request(a, 0)
    _, decision = g.mem_update(a, 1.0, 4 * G, 0, 0, 6 * G, C.NVSHARE_MEM_DRIVER_OOM,
                               driver_free=2 * G)
    assert decision is None                       # 12 GiB counted, 2 GiB the driver's: it waits
    assert g.memory.driver.refused == 10 * G
    _, decision = g.mem_update(b, 1.1, 0, 0, 0, 4 * G, C.NVSHARE_MEM_CAN_DEFER)
    assert decision.flags == C.NVSHARE_MEM_DEFERRED   # no room now: made in host memory
    assert g.next_deadline() <= 1.0 + REFUSED_HOLD_SEC
    actions = g.tick(1.0 + REFUSED_HOLD_SEC)
    assert kinds(actions) == [(MEM_REPLY, 1)] and actions[0].reply.status == C.NVSHARE_OK
    assert g.memory.driver.refused == 0


def test_a_look_at_the_driver_replaces_what_a_refusal_held():
    g = gpu()
    a = client(1)
    g.mem_update(a, 0, 4 * G, 0, 0)
    g.request(a, 0)
    g.mem_update(a, 1.0, 4 * G, 0, 0, 6 * G, C.NVSHARE_MEM_DRIVER_OOM, driver_free=2 * G)
    actions = g.driver_seen(4 * G, {1001: 4 * G}, 1.1)   # the driver's own figures: all free
    assert kinds(actions) == [(MEM_REPLY, 1)]
