"""Share classes in the per-GPU policy (gpustate.py) and in gang order (gang.py), with a fake clock:
a high job keeps its speed, low jobs run in the time it leaves idle, equal classes stay fair."""
from __future__ import annotations

import pytest

from nvshare_slurm.policy.demand import CLASS_DRAIN_MEMORY_SEC, CLASS_SETTLE_SEC, Demand
from nvshare_slurm.policy.gang import GangPolicy
from nvshare_slurm.policy.gpustate import GpuState
from nvshare_slurm.policy.policytypes import CONTENDED, DROP, GRANT, SWAP_OUT, ClientInfo, GpuSettings
from nvshare_slurm.wire.proto import C

G = 1 << 30
SHARED, EXCLUSIVE = C.NVSHARE_GRANT_SHARED, C.NVSHARE_GRANT_EXCLUSIVE
BUSY = Demand(0.97, 10.0, 0.0)
LIGHT = Demand(0.002, 0.001, 1.5)
BURSTY = Demand(0.30, 0.035, 0.082)       # long bursts, long gaps: a turn-taker
PAUSES = Demand(0.85, 0.5, 0.1)           # busy, with pauses long enough to hand over


def gpu(memory: int = 16 * G, **settings) -> GpuState:
    return GpuState("GPU-class", 0, memory, GpuSettings(memory_reserve_percent=0, **settings))


def client(n: int, share_class: str = "normal") -> ClientInfo:
    return ClientInfo(n, n, 0, 1000 + n, "user", 0, share_class)


def high_and_low(high_demand: Demand = BUSY, low_demand: Demand = BUSY):
    """A GPU with a high and a low client (ids 1 and 2) whose demand is known."""
    g = gpu()
    high, low = client(1, "high"), client(2, "low")
    g.report_demand(high, high_demand, 0.0)
    g.report_demand(low, low_demand, 0.0)
    return g, high, low


def grants(actions):
    return [(a.client.client_id, a.flags) for a in actions if a.kind == GRANT]


def told_to_yield(actions):
    """The holders whose grant says YIELD: they wait out the co-runners' prompt bursts."""
    return [a.client.client_id for a in actions if a.kind == GRANT and a.yields]


def kinds(actions):
    return [(a.kind, a.client.client_id) for a in actions]


def drops(actions):
    return [(a.client.client_id, a.value) for a in actions if a.kind == DROP]


# --- adaptive (the default) ------------------------------------------------------------------------

def test_a_busy_low_holder_gives_way_at_once_when_a_busy_high_job_asks():
    g, high, low = high_and_low()
    assert grants(g.request(low, 0.0)) == [(2, EXCLUSIVE)]    # the high job is idle: low runs
    actions = g.request(high, 1.0)
    assert drops(actions) == [(2, C.NVSHARE_DROP_TIMESLICE)]   # not after a switch interval
    # Memory fits: the high job starts at once, beside the low job's last kernels as they drain.
    assert grants(actions) == [(1, SHARED)]
    assert grants(g.release(2, 1.002)) == []                  # and then it runs alone
    assert kinds(g.request(low, 1.01)) == []   # busy without pauses: it keeps the GPU
    status = g.status(1.01, [], [])
    assert status["sharing"] == "corun"
    assert status["sharing_reason"] == "at most one busy client, 1 of a lower class wait"


def test_a_high_holder_is_never_timesliced_for_low_waiters_and_gives_back_only_when_idle():
    g, high, low = high_and_low()
    g.request(high, 0.0)
    actions = g.request(low, 0.1)
    assert actions == []             # busy: no LOCK_CONTENDED (the hook would give the GPU back
    #                                  between two kernels, and wait for low's kernel to get it back)
    assert g.next_deadline() is None                          # no turn end, ever
    assert drops(g.tick(1000.0)) == []
    assert 1 in g.holders and 2 in g.queue
    # Its demand shows long pauses: now it gives the GPU back in them.
    assert kinds(g.report_demand(high, PAUSES, 999.0)) == [(CONTENDED, 1)]
    # It goes idle and gives the GPU back: the low job gets the leftover...
    assert grants(g.release(1, 1000.5)) == [(2, EXCLUSIVE)]
    # ...until the high job wants it again.
    actions = g.request(high, 1000.52)
    assert drops(actions) == [(2, C.NVSHARE_DROP_TIMESLICE)] and grants(actions) == [(1, SHARED)]
    assert grants(g.release(2, 1000.521)) == []


def test_low_waiters_never_go_ahead_of_a_high_waiter():
    g = gpu()
    a, b, high = client(1, "normal"), client(2, "low"), client(3, "high")
    for c in (a, b, high):
        g.report_demand(c, BUSY, 0.0)
    g.request(a, 0.0)
    g.request(b, 0.01)
    actions = g.request(high, 0.02)           # came last, a better class than both
    assert drops(actions) == [(1, C.NVSHARE_DROP_TIMESLICE)]   # the normal holder gives way
    assert grants(actions) == [(3, SHARED)]
    assert list(g.queue) == [2]
    assert grants(g.release(1, 0.03)) == []   # b still waits behind the high job


def test_a_high_waiter_is_queued_ahead_of_earlier_low_ones():
    g = gpu(mode="concurrent")
    holder, low, high = client(1, "high"), client(2, "low"), client(3, "high")
    g.request(holder, 0.0)
    g.request(low, 0.01)
    g.request(high, 0.02)
    assert list(g.queue) == [3, 2]
    g.tick(0.02 + g.switch_interval())
    assert grants(g.release(1, 0.1)) == [(3, EXCLUSIVE)]


def test_two_high_jobs_take_turns_and_a_low_one_waits_for_both_to_be_idle():
    g = gpu()
    h1, h2, low = client(1, "high"), client(2, "high"), client(3, "low")
    for c in (h1, h2, low):
        g.report_demand(c, BUSY, 0.0)
    assert grants(g.request(h1, 0.0)) == [(1, EXCLUSIVE)]
    g.request(h2, 0.0)
    g.request(low, 0.0)
    assert list(g.queue) == [2, 3]
    status = g.status(0.0, [], [])
    assert status["sharing_reason"] == "2 busy clients take turns, 1 of a lower class wait"
    # Equal classes: the adaptive turns, one switch interval each.
    assert drops(g.tick(g.switch_interval())) == [(1, C.NVSHARE_DROP_TIMESLICE)]
    assert grants(g.release(1, 0.06)) == [(2, EXCLUSIVE)]
    g.request(h1, 0.07)
    assert drops(g.tick(0.07 + g.switch_interval())) == [(2, C.NVSHARE_DROP_TIMESLICE)]
    assert grants(g.release(2, 0.12)) == [(1, EXCLUSIVE)]
    assert 3 in g.queue                       # never squeezed in between high turns


def test_light_low_clients_still_co_run_beside_a_high_holder():
    g, high, light = high_and_low(low_demand=LIGHT)
    assert told_to_yield(g.request(high, 0.0)) == [1]   # the high job waits out the light one's
    actions = g.request(light, 0.1)                      # prompt bursts, from before it asks
    assert grants(actions) == [(2, SHARED)] and drops(actions) == []
    assert g.holders[1].yields


# Light by the adaptive rules (3 ms bursts), yet busy 60 % of the time.
SHORT_BURSTS = Demand(0.6, 0.003, 0.002)


def test_a_low_client_with_short_bursts_waits_beside_a_busy_high_one_and_runs_in_its_idle_time():
    g, high, low = high_and_low(low_demand=SHORT_BURSTS)
    g.request(high, 0.0)
    # Co-running it would time-slice the high job's kernels with its own 60 % of the time.
    assert grants(g.request(low, 0.1)) == []
    assert drops(g.tick(100.0)) == [] and 2 in g.queue
    assert g.status(100.0, [], [])["sharing_reason"] == "at most one busy client, 1 of a lower class wait"
    assert grants(g.release(1, 100.5)) == [(2, SHARED)]       # the high job idle: it runs
    # The high job wants the GPU back: the low holder is dropped at once, the high one granted.
    actions = g.request(high, 100.6)
    assert drops(actions) == [(2, C.NVSHARE_DROP_TIMESLICE)] and grants(actions) == [(1, SHARED)]


def test_a_low_holder_with_short_bursts_is_dropped_when_a_high_one_turns_busy():
    g, high, low = high_and_low(high_demand=LIGHT, low_demand=SHORT_BURSTS)
    t = CLASS_SETTLE_SEC          # both have reported long enough to be known light
    assert grants(g.request(low, t)) == [(2, SHARED)]
    assert grants(g.request(high, t + 0.1)) == [(1, SHARED)]       # both light: they co-run
    assert drops(g.report_demand(high, BUSY, t + 0.5)) == [(2, C.NVSHARE_DROP_TIMESLICE)]


def test_a_settling_high_holder_that_reads_light_gives_its_idle_time_to_the_low_job_it_outranks():
    """While it settles, a light high holder makes a busy low job wait; it must then give it its
    idle time as a busy one does (LOCK_CONTENDED), or the low job waits out the whole settle time
    (a fake-driver test saw the low job get nothing in the high job's 300 ms pause)."""
    g = gpu()
    high, low = client(1, "high"), client(2, "low")
    g.report_demand(low, SHORT_BURSTS, 0.0)
    g.report_demand(high, LIGHT, 10.0)
    assert grants(g.request(high, 10.0)) == [(1, SHARED)]
    actions = g.request(low, 10.1)
    assert grants(actions) == [] and (CONTENDED, 1) in kinds(actions) and 2 in g.queue


def test_a_high_newcomer_that_reads_light_outranks_a_low_one_until_its_reports_settle():
    """A training's first reports read light (its start-up): on the H200 a low compute-bound job
    co-ran beside such a high training for 1.8 s and it kept 0.87 of its speed alone. Until the
    high client has reported for CLASS_SETTLE_SEC its class counts as a busy one's: the low holder
    is dropped at once and waits; later, known light, the high one lets it co-run again."""
    g = gpu()
    high, low = client(1, "high"), client(2, "low")
    g.report_demand(low, SHORT_BURSTS, 0.0)
    assert grants(g.request(low, 10.0)) == [(2, SHARED)]
    g.report_demand(high, LIGHT, 10.0)                     # its first report: light
    actions = g.request(high, 10.1)
    assert drops(actions) == [(2, C.NVSHARE_DROP_TIMESLICE)] and grants(actions) == [(1, SHARED)]
    g.release(2, 10.2)
    assert grants(g.request(low, 10.3)) == [] and 2 in g.queue
    assert grants(g.report_demand(high, LIGHT, 12.0)) == [] and 2 in g.queue   # still settling
    assert grants(g.report_demand(high, LIGHT, 10.0 + CLASS_SETTLE_SEC + 0.1)) == [(2, SHARED)]


def test_short_bursts_of_equal_classes_still_co_run_beside_a_busy_holder():
    g = gpu()
    busy, short = client(1, "normal"), client(2, "normal")
    g.report_demand(busy, BUSY, 0.0)
    g.report_demand(short, SHORT_BURSTS, 0.0)
    g.request(busy, 0.0)
    actions = g.request(short, 0.1)
    assert grants(actions) == [(2, SHARED), (1, SHARED)] and told_to_yield(actions) == [1]


def test_a_bursty_low_job_beside_a_busy_high_one_runs_only_in_its_idle_time():
    g, high, low = high_and_low(low_demand=BURSTY)
    g.request(high, 0.0)
    assert grants(g.request(low, 0.0)) == []


def test_equal_classes_keep_the_adaptive_fairness():
    for share_class in ("high", "normal", "low"):
        g = gpu()
        a, b = client(1, share_class), client(2, share_class)
        g.report_demand(a, BUSY, 0.0)
        g.report_demand(b, BUSY, 0.0)
        assert grants(g.request(a, 0.0)) == [(1, EXCLUSIVE)]
        assert (CONTENDED, 1) in kinds(g.request(b, 0.0))
        assert g.next_deadline() == pytest.approx(0.1)     # switch_time_min
        assert drops(g.tick(0.1)) == [(1, C.NVSHARE_DROP_TIMESLICE)]


# --- concurrent and serial ----------------------------------------------------------------------

def test_concurrent_a_high_waiter_drops_a_low_holder_at_once():
    g = gpu(mode="concurrent")
    high, low = client(1, "high"), client(2, "low")
    assert grants(g.request(low, 0.0)) == [(2, EXCLUSIVE)]
    actions = g.request(high, 0.5)
    assert (CONTENDED, 2) in kinds(actions)
    assert drops(actions) == [(2, C.NVSHARE_DROP_TIMESLICE)]
    assert grants(g.release(2, 0.505)) == [(1, EXCLUSIVE)]   # drained in 5 ms
    actions = g.request(low, 0.6)
    assert actions == [] and g.next_deadline() is None      # no demand known: it keeps the GPU
    assert drops(g.tick(100.0)) == []
    # Back once idle: its 100 ms pauses are long against the low job's 5 ms drain.
    assert kinds(g.report_demand(high, PAUSES, 100.0)) == [(CONTENDED, 1)]
    assert g.next_deadline() is None


def test_serial_a_high_job_goes_first_when_the_gpu_is_handed_on():
    g = gpu(mode="serial")
    normal, low, high = client(1), client(2, "low"), client(3, "high")
    assert grants(g.request(normal, 0.0)) == [(1, SHARED)]
    g.request(low, 1.0)
    g.request(high, 2.0)
    assert grants(g.remove_client(1, 3.0)) == [(3, SHARED)]


# --- memory -------------------------------------------------------------------------------------

def test_low_clients_memory_is_swapped_out_first():
    g = gpu(memory=10 * G, mode="concurrent")
    high, low, normal, holder = client(1, "high"), client(2, "low"), client(3), client(4)
    for c, size in ((high, 3 * G), (low, 3 * G), (normal, 3 * G)):
        g.mem_update(c, 0.0, size, 0, 0)
    g.request(holder, 0.0)
    actions, decision = g.mem_update(holder, 0.1, 0, 0, 0, request=3 * G)
    assert decision is None                                   # waits for room
    assert [(a.client.client_id, a.bytes) for a in actions if a.kind == SWAP_OUT] == [(2, 2 * G)]


# --- gangs --------------------------------------------------------------------------------------

def gang_node(classes: dict[int, str]):
    """Two GPUs (concurrent, 1 s turns), a gang per job in `classes`, and an event helper."""
    settings = GpuSettings(mode="concurrent", switch_time_mode="fixed", switch_time_fixed=1.0,
                           memory_reserve_percent=0)
    gpus = [GpuState(f"GPU-{i}", i, 16 * G, settings) for i in range(2)]
    policy = GangPolicy()
    for job in classes:
        policy.add_job(job, gpus)
    members = {job: [ClientInfo(job * 10 + i, job, 0, 100 * job + i, "user", 0, share_class)
                     for i in range(2)] for job, share_class in classes.items()}

    def everywhere(job, now, what):
        for gpu, client in zip(gpus, members[job], strict=True):
            if what == "request":
                gpu.request(client, now)
            else:
                gpu.release(client.client_id, now)
        policy.schedule(now)

    return gpus, policy, everywhere


def end_turn_of(job, gpus, policy, everywhere, now):
    for g in gpus:
        g.tick(now)
    policy.schedule(now)                      # the turn ends: its clients are dropped
    everywhere(job, now + 0.1, "release")


def test_a_high_gang_claims_before_a_low_gang_that_waited_longer():
    gpus, policy, everywhere = gang_node({4: "normal", 1: "low", 2: "high"})
    everywhere(4, 0.0, "request")
    assert gpus[0].lock.turn.job_id == 4
    everywhere(1, 1.0, "request")
    everywhere(2, 2.0, "request")
    end_turn_of(4, gpus, policy, everywhere, 3.5)
    turn = gpus[0].lock.turn
    assert turn is not None and turn.job_id == 2          # high, though low waited longer


@pytest.mark.parametrize("single_class,first", [("high", True), ("low", False)])
def test_a_high_single_gpu_job_goes_before_a_low_gang_that_waited_longer(single_class, first):
    gpus, policy, everywhere = gang_node({4: "normal", 1: "low"})
    everywhere(4, 0.0, "request")
    everywhere(1, 1.0, "request")
    single = ClientInfo(50, 5, 0, 500, "user", 0, single_class)
    gpus[0].request(single, 2.0)
    policy.schedule(2.0)
    end_turn_of(4, gpus, policy, everywhere, 3.5)
    # A high single-GPU job gets GPU 0 first and the low gang's turn starts after it; one of the
    # gang's class that came later waits for the gang's turn.
    assert (50 in gpus[0].holders) == first
    assert gpus[0].lock.turn.job_id == 1 and gpus[0].lock.turn.started != first


def test_serial_a_high_job_is_not_cut_short_for_low_jobs_however_long_it_runs():
    g = gpu(mode="serial", max_runtime_sec=300)
    high, low = client(1, "high"), client(2, "low")
    assert grants(g.request(high, 0.0)) == [(1, SHARED)]
    g.request(low, 1.0)
    assert g.next_deadline() is None
    assert drops(g.tick(10_000.0)) == [] and 1 in g.holders and 2 in g.queue
    # Its job is done with the GPU: the low job gets it.
    assert grants(g.remove_client(1, 10_001.0)) == [(2, SHARED)]


def test_serial_a_high_waiter_ends_a_low_jobs_turn_at_once():
    g = gpu(mode="serial", max_runtime_sec=300)
    high, low = client(1, "high"), client(2, "low")
    assert grants(g.request(low, 0.0)) == [(2, SHARED)]
    assert drops(g.request(high, 5.0)) == [(2, C.NVSHARE_DROP_MAX_RUNTIME)]
    assert grants(g.release(2, 5.1)) == [(1, SHARED)]


def test_serial_equal_classes_still_hand_on_after_max_runtime():
    g = gpu(mode="serial", max_runtime_sec=300)
    a, b = client(1, "low"), client(2, "low")
    g.request(a, 0.0)
    g.request(b, 1.0)
    assert g.next_deadline() == 301.0
    assert drops(g.tick(200.0)) == []
    assert drops(g.tick(301.0)) == [(1, C.NVSHARE_DROP_MAX_RUNTIME)]


def test_a_high_holder_keeps_its_short_pauses_when_a_low_job_drains_slowly():
    """A low holder dropped for the high job took 120 ms to drain (a PyTorch step's queue on a
    GPU): the high job's 100 ms pauses are too short to give away, since each return would run
    beside such a drain. Pauses ten times the drain are given away."""
    g, high, low = high_and_low(high_demand=BUSY)
    assert grants(g.request(low, 0.0)) == [(2, EXCLUSIVE)]
    actions = g.request(high, 1.0)
    assert drops(actions) == [(2, C.NVSHARE_DROP_TIMESLICE)]
    g.release(2, 1.12)                                   # drained in 120 ms
    g.request(low, 1.13)
    assert kinds(g.report_demand(high, PAUSES, 2.0)) == []          # 100 ms pauses: kept
    assert 1 in g.holders and 2 in g.queue
    long_pauses = Demand(0.6, 0.5, 1.5)
    assert kinds(g.report_demand(high, long_pauses, 3.0)) == [(CONTENDED, 1)]


def test_a_slow_drain_is_forgotten_after_a_while():
    """One slow drain (a hostile low user can make one) does not deny the high job's pauses to
    the worse waiters for good: after CLASS_DRAIN_MEMORY_SEC they get them again, and a new slow
    drain is remembered anew."""
    g, high, low = high_and_low(high_demand=BUSY)
    g.request(low, 0.0)
    g.request(high, 1.0)
    g.release(2, 11.0)                                   # drained in 10 s
    g.request(low, 11.01)
    long_pauses = Demand(0.6, 0.5, 1.5)
    assert kinds(g.report_demand(high, long_pauses, 12.0)) == []             # 1.5 s < 10 x 10 s
    later = 11.0 + CLASS_DRAIN_MEMORY_SEC + 1
    assert kinds(g.report_demand(high, long_pauses, later)) == [(CONTENDED, 1)]


def test_a_quick_drain_lets_the_high_holder_give_its_pauses_away():
    g, high, low = high_and_low(high_demand=BUSY)
    g.request(low, 0.0)
    g.request(high, 1.0)
    g.release(2, 1.005)                                  # drained in 5 ms
    g.request(low, 1.01)
    assert kinds(g.report_demand(high, PAUSES, 2.0)) == [(CONTENDED, 1)]   # 100 ms >= 10 x 5 ms


@pytest.mark.parametrize("later", ["high", "normal"])
def test_serial_a_better_job_gets_the_gpu_of_an_idle_low_job_at_once(later):
    """The low job's client released (it is attached but holds nothing): a better job that asks
    is granted at once. Before, the low job's class was taken from its holders and waiters only
    (none: counted as normal), and once its turn was over nothing handed the GPU on: the high
    job waited with no deadline, the normal one until max_runtime_sec and one more event."""
    g = gpu(mode="serial", max_runtime_sec=300)
    low, better = client(1, "low"), client(2, later)
    assert grants(g.request(low, 0.0)) == [(1, SHARED)]
    assert g.release(1, 1.0) == []
    assert grants(g.request(better, 2.0)) == [(2, SHARED)]
    assert g.serial_job == 2


def test_serial_an_equal_job_gets_the_gpu_of_an_idle_one_at_max_runtime():
    g = gpu(mode="serial", max_runtime_sec=300)
    a, b = client(1, "low"), client(2, "low")
    g.request(a, 0.0)
    g.release(1, 1.0)
    assert grants(g.request(b, 2.0)) == [] and g.next_deadline() == 302.0
    assert grants(g.tick(302.0)) == [(2, SHARED)]                  # not only at a later event
