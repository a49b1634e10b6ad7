"""Admission of allocations (nvshare_slurm/policy/gpumemory.py) while another one is still being made:
the room an admitted allocation takes is counted from the answer, not from its report. Fake clock,
no sockets (tests/hook/test_swap_admission.py has the same with the hook and the fake driver)."""
from __future__ import annotations

from nvshare_slurm.policy.gpumemory import SETTLE_SEC, why_refused
from nvshare_slurm.policy.gpustate import GpuState
from nvshare_slurm.policy.policytypes import GRANT, ClientInfo, GpuSettings
from nvshare_slurm.wire.proto import C

G = 1 << 30
DEFER = C.NVSHARE_MEM_CAN_DEFER


def gpu(**settings) -> GpuState:
    base = dict(mode="concurrent", auto_share="turns", switch_time_mode="fixed",
                switch_time_fixed=10.0, memory_reserve_percent=5, max_runtime_sec=100,
                drop_grace_sec=5.0)
    base.update(settings)
    return GpuState("GPU-test", 0, 80 * G, GpuSettings(**base))   # 76 GiB usable


def client(n: int, limit: int = 0) -> ClientInfo:
    return ClientInfo(n, 500 + n, 0, 1000 + n, "user", limit)


def test_a_second_large_allocation_is_deferred_while_the_first_is_being_made():
    """Two 40 GiB jobs ask back to back, neither holding the lock (bench_mixes mix4-mem on an H100):
    the second one is deferred (made in host memory) instead of admitted into the same room."""
    g = gpu()
    first, second = client(3), client(4)
    _, d = g.mem_update(first, 0, 0, 0, 0, 40 * G, DEFER)
    assert (d.status, d.flags) == (C.NVSHARE_OK, 0)        # resident now: being made
    assert g.memory.room() == 36 * G
    _, d = g.mem_update(second, 0.01, 0, 0, 0, 40 * G, DEFER)
    assert (d.status, d.flags) == (C.NVSHARE_OK, C.NVSHARE_MEM_DEFERRED)
    g.mem_update(second, 0.02, 0, 0, 40 * G)               # made in host memory
    g.mem_update(first, 0.05, 40 * G, 0, 0)                # made: reported, no longer promised
    assert g.memory.promised == {} and g.memory.room() == 36 * G


def test_a_grant_waits_for_an_allocation_being_made_rather_than_taking_its_room():
    """The deferred job asks for the GPU while the first job's allocation is still being made:
    its grant waits until that memory is reported and can be asked to move, and the first job
    is given SETTLE_SEC to ask for the GPU itself before it is asked."""
    g = gpu()
    first, second = client(3), client(4)
    g.mem_update(first, 0, 0, 0, 0, 40 * G, DEFER)
    g.mem_update(second, 0, 0, 0, 40 * G)
    # 40 GiB coming back, 36 GiB room: it may bring that much back now
    assert [(a.kind, a.bytes) for a in g.request(second, 0.01)] == [("prefetch", 36 * G)]
    actions, _ = g.mem_update(first, 0.05, 40 * G, 0, 0)   # made: it could move now, but settles
    assert actions == []
    assert g.next_deadline() == SETTLE_SEC
    actions = g.tick(SETTLE_SEC)                            # it did not ask for the GPU: asked now
    assert [(a.kind, a.client.client_id, a.bytes) for a in actions] == \
        [("swap_out", 3, 4 * G)]
    assert g.memory.settling == {}                          # no deadline left behind in the past
    actions, _ = g.mem_update(first, 1.5, 36 * G, 0, 4 * G)
    assert [(a.kind, a.client.client_id) for a in actions] == [(GRANT, 4)]


def test_a_job_that_asks_for_the_gpu_right_after_its_allocation_runs_before_one_that_needs_a_swap():
    """As above, but the first job asks for the GPU 0.3 s after its allocation (its first
    kernel): nothing has been asked of it, its memory is all here, and the second job's needs a
    swap. It runs first; on the H100 the pair spent 4.6-10 s moving 14 GiB out before either ran."""
    g = gpu()
    first, second = client(3), client(4)
    g.mem_update(first, 0, 0, 0, 0, 40 * G, DEFER)
    g.mem_update(second, 0, 0, 0, 40 * G)
    g.request(second, 0.01)
    g.mem_update(first, 0.05, 40 * G, 0, 0)
    actions = g.request(first, 0.3)
    assert [(a.kind, a.client.client_id) for a in actions] == [(GRANT, 3)]
    assert list(g.queue) == [4] and g.memory.swap_asked == {}
    assert g.memory.settling == {} and (g.next_deadline() or 1e9) > 0.3   # it asked: settled


def test_a_promise_that_is_never_reported_runs_out():
    """An allocation the driver failed is never reported: its room comes back after drop_grace."""
    g = gpu()
    first, second = client(3), client(4)
    g.mem_update(first, 0, 0, 0, 0, 40 * G, DEFER)
    g.mem_update(second, 0, 0, 0, 40 * G)
    assert [a.kind for a in g.request(second, 0.01)] == ["prefetch"]
    assert [(a.kind, a.client.client_id) for a in g.tick(5.0)] == [(GRANT, 4)]
    assert g.memory.promised == {}


def test_refusals_say_why():
    g = gpu()
    limited, fixed, asker = client(1, limit=10 * G), client(2), client(3)
    _, d = g.mem_update(limited, 0, 8 * G, 0, 0, 4 * G)
    assert d.status == C.NVSHARE_ERR_NOMEM
    assert why_refused(g.memory, limited, 4 * G) == \
        "the job would hold 12.0 GiB, over its memory limit of 10.0 GiB (NVSHARE_MEM_LIMIT)"
    g.mem_update(fixed, 0, 50 * G, 50 * G, 0)
    _, d = g.mem_update(asker, 0, 0, 0, 0, 30 * G, DEFER)
    assert d.status == C.NVSHARE_ERR_NOMEM
    assert why_refused(g.memory, asker, 30 * G) == (
        "it can never fit: this process holds 0.0 MiB, other processes hold 50.0 GiB that cannot "
        "move to host memory, and the GPU has 76.0 GiB usable (80.0 GiB less "
        "memory_reserve_percent 5)")
