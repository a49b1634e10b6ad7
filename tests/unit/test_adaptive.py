"""auto_share: adaptive (nvshare_slurm/policy/gpustate.py) with a fake clock: who takes turns and who
co-runs follows each client's reported demand; the defaults are what a new site gets."""
from __future__ import annotations

import pytest

from nvshare_slurm.policy.demand import Demand
from nvshare_slurm.policy.gpupause import suspend_client
from nvshare_slurm.policy.gpustate import GpuState
from nvshare_slurm.policy.policytypes import CONTENDED, DROP, GRANT, HANDOFF, ClientInfo, GpuSettings
from nvshare_slurm.wire.proto import C

G = 1 << 30
SHARED, EXCLUSIVE = C.NVSHARE_GRANT_SHARED, C.NVSHARE_GRANT_EXCLUSIVE
BUSY = Demand(0.97, 10.0, 0.0)                 # a compute-bound training
LIGHT = Demand(0.002, 0.001, 1.5)              # an interactive step: 1 ms of work every 1.5 s
SHORT_BURSTS = Demand(0.35, 0.012, 0.022)      # bursty, 12 ms steps and 22 ms host pauses
TINY_BURSTS = Demand(0.30, 0.002, 0.005)       # 2 ms bursts: a hand-over costs about as much
LONG_BURSTS = Demand(0.30, 0.035, 0.082)       # W2: 35 ms steps, 82 ms host pauses
# issue 42: a CUDA-graph decoder serving requests at random arrivals, as the H200 read it
SERVER = Demand(0.23, 0.038, 0.089, 0.74)


def gpu(**settings) -> GpuState:
    """The defaults a site gets (auto, adaptive, auto switch interval), on a 16 GiB GPU."""
    return GpuState("GPU-adapt", 0, 16 * G, GpuSettings(memory_reserve_percent=0, **settings))


def gpu_lock_turns(**settings) -> GpuState:
    """burst_turns off: bursty co-runners whose bursts overlap take turns of the lock instead."""
    return gpu(burst_turns=False, **settings)


def client(n: int) -> ClientInfo:
    return ClientInfo(n, n, 0, 1000 + n, "user", 0)


def grants(actions):
    return [(a.client.client_id, a.flags) for a in actions if a.kind == GRANT]


def told_to_yield(actions):
    """The holders whose grant says YIELD: they wait out the co-runners' prompt bursts."""
    return [a.client.client_id for a in actions if a.kind == GRANT and a.yields]


def kinds(actions):
    return [(a.kind, a.client.client_id) for a in actions]


def test_defaults_are_adaptive_with_turns_of_tens_of_milliseconds():
    g = gpu()
    assert g.settings.mode == "auto" and g.settings.auto_share == "adaptive"
    busy_a, busy_b = client(1), client(2)
    g.request(busy_a, 0.0)
    g.request(busy_b, 0.0)
    assert g.switch_interval() <= 0.1            # memory fits: a turn is never seconds
    assert g.next_deadline() == pytest.approx(0.1)   # switch_time_min, the shipped config's
    assert kinds(g.tick(0.1)) == [(HANDOFF, 2), (DROP, 1)]   # b starts once a is drained


def test_an_interactive_client_beside_a_busy_holder_is_granted_at_once():
    g = gpu()
    batch, step = client(1), client(2)
    g.report_demand(batch, BUSY, 0.0)
    assert grants(g.request(batch, 0.0)) == [(1, SHARED)]    # alone: nothing to take turns with
    # A prompt client registered beside it: the holder carries waits before the client asks.
    assert told_to_yield(g.report_demand(step, LIGHT, 0.5)) == [1]
    actions = g.request(step, 1.0)
    assert grants(actions) == [(2, SHARED)]                  # no wait for the batch job's turn,
    assert g.holders[1].yields                               # which waits out its prompt bursts
    assert not [a for a in actions if a.kind in (DROP, CONTENDED)]   # the batch job runs on
    assert g.next_deadline() is None
    assert g.status(1.0, [], [])["sharing"] == "corun"
    assert g.status(1.0, [], [])["sharing_reason"] == "at most one busy client"


def test_busy_clients_take_exclusive_turns_and_light_ones_co_run_beside_them():
    g = gpu()
    a, b, light = client(1), client(2), client(3)
    for c in (a, b):
        g.report_demand(c, BUSY, 0.0)
    g.report_demand(light, LIGHT, 0.0)
    assert grants(g.request(a, 0.0)) == [(1, EXCLUSIVE)]     # b is busy too, between turns
    actions = g.request(b, 0.1)                              # b asks: a's turn is contended
    assert grants(actions) == [] and (CONTENDED, 1) in kinds(actions)
    actions = g.request(light, 0.12)
    assert grants(actions) == [(3, SHARED)]                  # the light one never waits,
    assert g.holders[1].yields                               # the turn holder yields to it
    status = g.status(0.12, [], [])
    assert status["sharing"] == "turns"
    assert status["sharing_reason"] == "2 busy clients take turns, 1 light co-run"
    drop = g.tick(0.1 + g.switch_interval())
    assert kinds(drop) == [(HANDOFF, 2), (DROP, 1)] and drop[1].value == C.NVSHARE_DROP_TIMESLICE
    assert grants(g.release(1, 0.16)) == [(2, EXCLUSIVE)]    # busy b: the next turn
    actions = g.request(a, 0.17)                             # a wants its next turn
    assert grants(actions) == [] and (CONTENDED, 2) in kinds(actions)
    assert 3 in g.holders                                    # still co-running


def test_a_co_runner_that_becomes_busy_gets_its_turn_after_the_current_one():
    g = gpu()
    a, b = client(1), client(2)
    g.report_demand(a, BUSY, 0.0)
    g.report_demand(b, LIGHT, 0.0)
    assert told_to_yield(g.request(a, 0.0)) == [1]           # b is a prompt client beside it
    actions = g.request(b, 0.0)
    assert grants(actions) == [(2, SHARED)] and g.holders[1].yields
    actions = g.report_demand(b, BUSY, 2.0)                  # started training from the REPL
    assert kinds(actions) == [(DROP, 2), (GRANT, 1)]         # the newer busy one gives way; the
    assert told_to_yield(actions) == []                      # holder no longer yields to it
    assert grants(g.release(2, 2.01)) == []
    assert grants(g.request(b, 2.02)) == [] and 2 in g.queue
    assert kinds(g.tick(g.next_deadline())) == [(HANDOFF, 2), (DROP, 1)]   # then b's turn


def test_a_waiter_whose_demand_turns_light_is_granted_at_once():
    g = gpu()
    a, b = client(1), client(2)
    g.request(a, 0.0)                                        # no reports yet: both take turns
    g.request(b, 0.0)
    assert 2 in g.queue
    actions = g.report_demand(b, LIGHT, 0.01)
    assert grants(actions) == [(2, SHARED), (1, SHARED)] and told_to_yield(actions) == [1]


@pytest.mark.parametrize("demand,turns", [(BUSY, True), (LONG_BURSTS, True), (SHORT_BURSTS, False),
                                          (TINY_BURSTS, False), (LIGHT, False), (SERVER, False),
                                          (Demand(0.9, 0.038, 0.004, 0.74), True),
                                          # gaps' spread not known yet (fewer than 2 gaps)
                                          (Demand(0.30, 0.035, 0.082, None), False),
                                          (Demand(0.97, 10.0, 0.0, None), True)])
def test_which_demand_takes_turns_by_itself(demand, turns):
    assert demand.takes_turns is turns


def sharing_of(*demands: Demand, g: GpuState | None = None) -> str:
    g = g or gpu()
    for n, demand in enumerate(demands, 1):
        g.report_demand(client(n), demand, 0.0)
        g.request(client(n), 0.0)
    return g.status(0.0, [], [])["sharing"]


def test_short_bursts_co_run_while_they_fit_in_each_others_pauses():
    """burst_turns off: two 35 %-busy clients with 12 ms bursts (70 % together) co-run; three take
    turns (105 %: their bursts must overlap). Long bursts take turns by themselves."""
    assert sharing_of(SHORT_BURSTS, SHORT_BURSTS, g=gpu_lock_turns()) == "corun"
    assert sharing_of(SHORT_BURSTS, SHORT_BURSTS, SHORT_BURSTS, g=gpu_lock_turns()) == "turns"
    assert sharing_of(LONG_BURSTS, LONG_BURSTS, g=gpu_lock_turns()) == "turns"


def test_bursty_co_runners_take_turns_burst_by_burst_instead_of_the_lock():
    """The default (burst_turns): three 35 %-busy clients, or a 60 %-busy pair, 105-120 %
    together, keep co-running, and every grant tells them to take turns burst by burst (the hook
    does that through the GPU's page, microseconds a hand-over instead of a daemon round trip).
    Long bursts with long pauses still take turns of the lock by themselves."""
    g = gpu()
    assert sharing_of(SHORT_BURSTS, SHORT_BURSTS, SHORT_BURSTS, g=g) == "corun"
    assert g.status(0.0, [], [])["sharing_reason"] == "at most one busy client, their bursts take turns"
    assert all(h.shared and h.bursts for h in g.holders.values()) and len(g.holders) == 3
    g = gpu()
    heavy = Demand(0.6, 0.005, 0.0033)
    for n in (1, 2):
        g.report_demand(client(n), heavy, 0.0)
        actions = g.request(client(n), 0.0)
        assert [(a.kind, a.flags, a.bursts) for a in actions] == [(GRANT, SHARED, True)]
        assert not g.takes_turns(n)
    assert not [a for a in g.tick(1.0) if a.kind in (DROP, CONTENDED)]
    assert sharing_of(LONG_BURSTS, LONG_BURSTS) == "turns"


def test_only_adaptive_co_runners_take_turns_by_burst():
    """Exclusive turns need no page (the lock is theirs); a light client beside them co-runs
    with it, and the turn holder then hears its grant again, YIELD (prompt bursts: the page comes
    with it). auto_share corun and burst_turns off keep plain co-running."""
    g = gpu()
    a, b, light = client(1), client(2), client(3)
    for c in (a, b):
        g.report_demand(c, BUSY, 0.0)
    g.report_demand(light, LIGHT, 0.0)
    first = g.request(a, 0.0)     # the light client holds nothing yet: a's turn carries waits
    assert [(x.flags, x.bursts, x.yields) for x in first if x.kind == GRANT] == [(EXCLUSIVE, False, True)]
    g.request(b, 0.0)
    actions = g.request(light, 0.0)
    assert [(x.flags, x.bursts, x.yields) for x in actions if x.kind == GRANT] == [(SHARED, True, False)]
    assert g.holders[1].yields
    for other in (gpu(auto_share="corun"), gpu_lock_turns()):
        other.report_demand(light, LIGHT, 0.0)
        assert [(x.flags, x.bursts) for x in other.request(light, 0.0)] == [(SHARED, False)]


def test_holders_hear_their_grant_again_when_their_share_changes():
    """Granted before its first report, a client holds the grant of a turn-taker; once it reports
    bursts it hears SHARED | BURSTS (on the H100 without this, the holder of the exclusive grant
    never took part and a 30 %-busy pair ran in step at 0.92x serial). A co-runner that turns
    compute-bound hears SHARED alone: its bursts never end, and a light client would wait for them."""
    g = gpu()
    a, b = client(1), client(2)
    g.request(a, 0.0)
    g.request(b, 0.0)                            # neither has reported: turns, a holds
    assert not g.holders[1].bursts
    actions = g.report_demand(a, SHORT_BURSTS, 0.05)   # b, not reported, co-runs beside a
    assert sorted((x.client.client_id, x.flags, x.bursts) for x in actions if x.kind == GRANT) == \
        [(1, SHARED, True), (2, SHARED, False)]
    actions = g.report_demand(b, SHORT_BURSTS, 0.06)
    assert [(x.client.client_id, x.flags, x.bursts) for x in actions if x.kind == GRANT] == \
        [(2, SHARED, True)]
    actions = g.report_demand(a, BUSY, 1.0)
    assert [(x.client.client_id, x.flags, x.bursts) for x in actions if x.kind == GRANT] == \
        [(1, SHARED, False)]
    assert not g.report_demand(b, SHORT_BURSTS, 1.5)   # nothing changed: nothing said again


def test_tiny_bursts_are_not_counted_towards_overlap():
    """2 ms bursts cost about what a hand-over costs: four of them, 120 % together, still co-run."""
    assert sharing_of(TINY_BURSTS, TINY_BURSTS, TINY_BURSTS, TINY_BURSTS, g=gpu_lock_turns()) == "corun"


def test_overlapping_bursty_pair_takes_turns_with_hysteresis_and_the_reason_says_so():
    """burst_turns off: a 60 %-busy pair with 5 ms bursts (120 % together) takes turns. In turns
    a job whose pause follows its step's length reads less busy (the wait lengthens the step); the
    pair goes back to co-running only below 60 % together, not at once below 100 %."""
    g = gpu_lock_turns()
    a, b = client(1), client(2)
    heavy = Demand(0.6, 0.005, 0.0033)
    assert sharing_of(heavy, heavy, g=g) == "turns"
    assert g.takes_turns(1) and g.takes_turns(2)
    assert "bursts busy 120% together" in g.status(0.0, [], [])["sharing_reason"]
    g.report_demand(a, Demand(0.4, 0.005, 0.0075), 1.0)          # 100 %, then 80 %: still turns
    g.report_demand(b, Demand(0.4, 0.005, 0.0075), 1.0)
    assert g.status(1.0, [], [])["sharing"] == "turns"
    g.report_demand(a, Demand(0.3, 0.005, 0.012), 2.0)           # 70 %: still turns
    assert g.status(2.0, [], [])["sharing"] == "turns"
    actions = g.report_demand(b, Demand(0.25, 0.005, 0.015), 3.0)   # 55 %: co-run
    assert g.status(3.0, [], [])["sharing"] == "corun"
    assert not g.takes_turns(1) and not g.takes_turns(2)
    assert set(g.holders) == {1, 2} and (GRANT, 2) in kinds(actions)   # the waiter joins at once
    g.report_demand(a, Demand(0.7, 0.005, 0.002), 4.0)           # 95 %: below the entry line
    assert g.status(4.0, [], [])["sharing"] == "corun"
    g.report_demand(b, Demand(0.35, 0.005, 0.009), 5.0)          # 105 %: turns again
    assert g.status(5.0, [], [])["sharing"] == "turns"


def test_one_leaving_ends_the_overlap():
    g = gpu_lock_turns()
    heavy = Demand(0.6, 0.005, 0.0033)
    assert sharing_of(heavy, heavy, g=g) == "turns"
    g.remove_client(2, 1.0)
    assert not g.takes_turns(1)
    assert g.status(1.0, [], [])["sharing"] == "corun"


def test_memory_that_does_not_fit_ends_co_running():
    g = gpu()
    a, b = client(1), client(2)
    for c in (a, b):
        g.report_demand(c, LIGHT, 0.0)
        g.mem_update(c, 0.0, 6 * G, 0, 0)
        g.request(c, 0.0)
    assert set(g.holders) == {1, 2}
    actions, _ = g.mem_update(b, 1.0, 6 * G, 0, 5 * G)      # b's memory no longer fits with a's
    assert (DROP, 2) in kinds(actions)
    assert next(a for a in actions if a.kind == DROP).value == C.NVSHARE_DROP_MEMORY
    assert g.status(1.0, [], [])["sharing_reason"] == "memory does not fit: turns with swap"


def test_equal_busy_clients_get_equal_gpu_time():
    """Two busy clients that always want the GPU: each holds until dropped, drains in 2 ms and
    asks again at once. Over 60 simulated seconds their held time is equal within 2 %."""
    g = gpu()
    a, b = client(1), client(2)
    for c in (a, b):
        g.report_demand(c, BUSY, 0.0)
    held = {1: 0.0, 2: 0.0}
    since: dict[int, float] = {}

    def take(actions, now):
        for cid, _ in grants(actions):
            since[cid] = now
        return [x.client.client_id for x in actions if x.kind == DROP]

    now = 0.0
    dropped = take(g.request(a, now), now) + take(g.request(b, now), now)
    while now < 60.0:
        deadline = g.next_deadline()
        now = deadline if deadline is not None else now + 0.01
        dropped += take(g.tick(now), now)
        for cid in dropped:
            now += 0.002
            held[cid] += now - since.pop(cid)
            take(g.release(cid, now), now)
            take(g.request(a if cid == 1 else b, now), now)
        dropped = []
    assert min(held.values()) / max(held.values()) > 0.98, held


# --- the real daemon ------------------------------------------------------------------------------

def test_daemon_grants_a_light_client_beside_a_busy_holder_and_shows_why(scheduler, tmp_path):
    """Through the socket: a busy job holds GPU 0; an interactive client that reported light
    demand is granted at once, and status and the log say why."""
    import time
    from conftest import FAKE_GPUS
    from lockclient import ClientProc
    gpu0 = FAKE_GPUS[0]["uuid"]
    for job in (1, 2, 3):
        scheduler.client().register_job(job, uid=0, gid=0, gpu_index=[0])
    procs = [ClientProc(scheduler.socket, job, 0) for job in (1, 2, 3)]
    try:
        busy, other, step = procs
        busy.send(f"demand {gpu0} 970000 10000000 0")
        busy.send(f"request {gpu0}")
        busy.expect("grant", gpu=gpu0)
        other.send(f"demand {gpu0} 970000 10000000 0")
        other.send(f"request {gpu0}")
        busy.expect("contended", gpu=gpu0)          # two busy ones: turns
        step.send(f"demand {gpu0} 2000 1000 1500000")
        sent = time.monotonic()
        step.send(f"request {gpu0}")
        grant = step.expect("grant", gpu=gpu0)
        assert grant["flags"] == C.NVSHARE_GRANT_SHARED | C.NVSHARE_GRANT_BURSTS
        assert time.monotonic() - sent < 1.0        # not a turn later: at once
        gpus = scheduler.client().status()["gpus"]
        status = next(g for g in gpus if g["uuid"] == gpu0)
        assert status["sharing"] == "turns"
        assert status["sharing_reason"] == "2 busy clients take turns, 1 light co-run"
        assert f"gpu {gpu0}: sharing: turns (2 busy clients take turns" in scheduler.log()
    finally:
        for proc in procs:
            proc.close()


def test_daemon_reads_a_spread_not_known_yet_and_then_a_servers(scheduler):
    """Through the socket: DEMAND's gap_spread_ppm NVSHARE_SPREAD_UNKNOWN (fewer than 2 gaps) is
    not a spread of 4295: long bursts and gaps so reported co-run beside a busy holder; the same
    with a training's regular gaps (spread 0.05) take turns; a server's (0.74) co-run again."""
    from helpers_daemon import GPU0 as gpu0
    from helpers_daemon import gpu_status, wait_for_status
    from lockclient import ClientProc
    for job in (1, 2):
        scheduler.client().register_job(job, uid=0, gid=0, gpu_index=[0])
    procs = [ClientProc(scheduler.socket, job, 0) for job in (1, 2)]
    try:
        busy, newcomer = procs
        busy.send(f"demand {gpu0} 970000 10000000 0")
        busy.send(f"request {gpu0}")
        busy.expect("grant", gpu=gpu0)
        newcomer.send(f"demand {gpu0} 240000 26000 186000 unknown")
        newcomer.send(f"request {gpu0}")
        grant = newcomer.expect("grant", gpu=gpu0)
        assert grant["flags"] == C.NVSHARE_GRANT_SHARED | C.NVSHARE_GRANT_BURSTS
        sharing = gpu_status(scheduler, gpu0)["sharing_reason"]
        assert sharing == "at most one busy client", sharing
        newcomer.send(f"demand {gpu0} 240000 26000 186000 50000")
        wait_for_status(scheduler, lambda s: "2 busy clients" in s["sharing_reason"], gpu0)
        newcomer.send(f"demand {gpu0} 240000 26000 186000 740000")
        wait_for_status(scheduler, lambda s: s["sharing_reason"] == "at most one busy client", gpu0)
        log = scheduler.log()
        assert "bursts 26 ms, gaps 186 ms, gaps irregular (a server)" in log, log[-3000:]
    finally:
        for proc in procs:
            proc.close()


def test_a_turn_taker_by_demand_is_not_flipped_by_one_noisy_report():
    """TURN_LEAVE: two W2-like jobs take turns; one report of each reads its burst short and its
    busy share low (a loaded CPU), still above three quarters of the lines: they keep their turns.
    A report clearly below them (an interactive step's) makes a co-runner of it."""
    g = gpu_lock_turns()
    a, b = client(1), client(2)
    for c in (a, b):
        g.report_demand(c, LONG_BURSTS, 0.0)
    g.request(a, 0.0)
    g.request(b, 0.01)
    assert g.takes_turns(1) and g.takes_turns(2)
    noisy = Demand(0.25, 0.020, 0.030)            # 20 ms bursts: below TURN_BURST_SEC, above 3/4 of it
    assert not noisy.takes_turns
    g.report_demand(a, noisy, 0.1)
    assert g.takes_turns(1)
    assert g.status(0.1, [], [])["sharing"] == "turns"
    g.report_demand(a, SHORT_BURSTS, 0.2)         # 12 ms bursts: clearly a co-runner now
    assert not g.takes_turns(1)
    # and a newcomer with that noisy report never took turns: it co-runs from its first report
    c = client(3)
    g.report_demand(c, noisy, 0.3)
    assert not g.takes_turns(3)


def test_a_server_beside_a_training_co_runs_where_a_bursty_training_takes_turns():
    """Issue 42: by their means a server (requests at random arrivals) and a bursty training look
    alike; on the H200 a CUDA-graph decoder's requests took turns with a PyTorch training and their
    p99 was 6.6x alone. Irregular gaps tell the server apart: it co-runs, and the training's grant
    says YIELD (it waits out the server's prompt bursts). A bursty training keeps its turns."""
    g = gpu()
    training, server = client(1), client(2)
    g.report_demand(training, BUSY, 0.0)
    g.report_demand(server, SERVER, 0.0)
    assert told_to_yield(g.request(training, 0.0)) == [1]   # a server is registered beside it
    actions = g.request(server, 0.05)
    assert grants(actions) == [(2, SHARED)] and g.holders[1].yields
    assert SERVER.describe().endswith("gaps irregular (a server)")   # what the log says
    g = gpu()
    g.report_demand(training, BUSY, 0.0)
    g.report_demand(server, LONG_BURSTS, 0.0)
    g.request(training, 0.0)
    assert grants(g.request(server, 0.05)) == [] and 2 in g.queue


def test_long_bursts_and_gaps_take_turns_only_once_the_gaps_spread_is_known():
    """Issue 42: a server's first gap is the wait after its warm-up. With that one gap the graph
    decoder read "busy 24 %, bursts 26 ms, gaps 186 ms" and took turns through its first requests.
    Until the hook has measured the gaps' spread (None) long bursts and gaps co-run; then a bursty
    training takes turns, and a server keeps co-running."""
    g = gpu()
    training, newcomer = client(1), client(2)
    g.report_demand(training, BUSY, 0.0)
    g.request(training, 0.0)
    early = Demand(0.24, 0.026, 0.186, None)
    assert not early.takes_turns and not early.serves
    g.report_demand(newcomer, early, 0.04)
    actions = g.request(newcomer, 0.05)
    assert grants(actions) == [(2, SHARED), (1, SHARED)] and told_to_yield(actions) == [1]
    g.report_demand(newcomer, LONG_BURSTS, 0.5)              # its second gap: a bursty training
    assert g.takes_turns(2)
    g.report_demand(newcomer, SERVER, 1.0)                   # ... or a server: co-runs on
    assert not g.takes_turns(2)


def test_a_turn_taker_whose_spread_reads_unknown_leaves_turns():
    """keeps_turns never holds on to turns by bursts and gaps whose spread is not known."""
    assert LONG_BURSTS.keeps_turns()
    assert not Demand(0.30, 0.035, 0.082, None).keeps_turns()
    assert Demand(0.97, 10.0, 0.0, None).keeps_turns()


def test_a_turn_taker_idle_for_a_second_co_runs_its_next_burst_at_once():
    """Issue 42: a server's warm-up (requests back to back) read as a bursty training, "busy 29 %,
    bursts 32 ms, gaps 46 ms"; idle for 1.7 s after it, it still took turns, and the training
    beside it held an exclusive turn: the server's first request waited 170 ms for it (H200). Once
    its gap reads a second or more (the hook reports the idle stretch under way) and its bursts a
    tenth of that at most, it is no turn-taker: its next request is granted at once, beside the
    training. A job of long bursts with second-long pauses between them keeps its turns."""
    warm_up = Demand(0.30, 0.035, 0.082, 0.3)     # as W2 (LONG_BURSTS): its turns cost it no wait
    assert warm_up.takes_turns and warm_up.keeps_turns()
    idle = Demand(0.05, 0.035, 1.7, 0.3)
    assert idle.rare and not idle.takes_turns and not idle.keeps_turns()
    assert not Demand(0.05, 0.032, 0.9, 0.3).rare                 # under a second
    assert not Demand(0.40, 0.5, 1.2, 0.0).rare                   # bursts of 0.5 s every 1.2 s
    assert Demand(0.40, 0.5, 1.2, 0.0).takes_turns
    for report, at_once in ((warm_up, False), (idle, True)):
        g = gpu()
        training, server = client(1), client(2)
        g.report_demand(training, BUSY, 0.0)
        g.report_demand(server, report, 0.0)
        g.request(training, 0.0)
        actions = g.request(server, 0.05)
        assert ((2, SHARED) in grants(actions)) == at_once and (2 in g.queue) != at_once, (report, actions)


def test_a_server_whose_bursts_merge_under_sharing_stays_a_server_for_a_while():
    """Issue 42: sharing stretches a server's requests; on the H200 a model.generate server beside
    a training read "busy 35 %, bursts 252 ms, gaps 54 ms" between reports that said it served (its
    bursts merged, its gaps read regular), took turns with the training, and its p99 was 2.0x its
    p99 alone. A client whose report said it served stays one for SERVE_STAY_SEC, unless it is busy
    most of the time; a training never said so and takes turns on such figures at once."""
    from nvshare_slurm.policy.demand import SERVE_STAY_SEC

    merged = Demand(0.35, 0.252, 0.054, 0.3)
    assert merged.takes_turns and not merged.serves
    g = gpu()
    training, server = client(1), client(2)
    g.report_demand(training, BUSY, 0.0)
    g.request(training, 0.0)
    g.report_demand(server, SERVER, 0.0)
    g.request(server, 0.05)
    assert not g.takes_turns(2)
    g.report_demand(server, merged, 1.0)
    assert not g.takes_turns(2) and 2 in g.holders                  # still co-runs beside the training
    g.report_demand(server, Demand(0.85, 0.252, 0.054, 0.3), 1.5)  # busy most of the time: turns
    assert g.takes_turns(2)
    g.report_demand(server, SERVER, 2.0)
    g.report_demand(server, merged, 2.0 + SERVE_STAY_SEC + 0.1)     # no report said so for that long
    assert g.takes_turns(2)
    other = gpu()
    other.report_demand(client(3), merged, 0.0)                     # never a server: turns at once
    assert other.takes_turns(3)


def test_a_training_that_pauses_is_no_server_but_a_server_with_long_requests_stays_one():
    """Issue 42: on the H200 a PyTorch training that stepped 2 s and paused 2 s in turn read busy 11 %
    after each pause, its gaps as irregular as a server's, its bursts 440-720 ms: it co-ran as a server
    and its hook ran its steps as prompt bursts. A client becomes a server only while its mean burst
    is at most SERVE_BURST_SEC (0.2 s, the longest a prompt burst is held for); one that served
    already stays one while its gaps are irregular, however long its requests grow."""
    from nvshare_slurm.policy.demand import SERVE_BURST_SEC, SERVE_STAY_SEC

    paused = Demand(0.11, 0.6, 0.5, 1.5)
    assert paused.irregular and not paused.serves and paused.takes_turns
    assert Demand(0.11, SERVE_BURST_SEC, 0.5, 1.5).serves
    g = gpu()
    training, server = client(1), client(2)
    g.report_demand(training, BUSY, 0.0)
    g.request(training, 0.0)
    g.report_demand(server, paused, 0.0)
    assert g.takes_turns(2)                                          # a pausing training: turns
    other = gpu()
    other.report_demand(client(1), BUSY, 0.0)
    other.request(client(1), 0.0)
    other.report_demand(client(3), SERVER, 0.0)
    long_requests = Demand(0.30, 0.25, 0.6, 0.74)
    for i in range(1, 4):                       # long after SERVE_STAY_SEC, its gaps still irregular
        other.report_demand(client(3), long_requests, i * SERVE_STAY_SEC * 0.9)
        assert not other.takes_turns(3), i
    other.report_demand(client(3), Demand(0.30, 0.25, 0.6, 0.3), 4 * SERVE_STAY_SEC)   # gaps regular
    other.report_demand(client(3), Demand(0.30, 0.25, 0.6, 0.3), 5.1 * SERVE_STAY_SEC)
    assert other.takes_turns(3)


def test_a_holder_carries_waits_while_a_prompt_client_that_holds_nothing_is_registered():
    """Issue 42: a server that gave the GPU back idle (after its warm-up, or a pause) asks again at
    its next request, and the holder's YIELD came with that grant: its queue then had no waits in
    it, and on the H200 serve2's first request ran beside the training's whole 20 ms step (8.7 ms
    at p99, 6.2 alone). A registered prompt client (a server, or short and rare bursts) that holds
    nothing makes the holder yield from its report on; a busy one, a stopped one or one that left
    does not, and a holder alone never yields."""
    g = gpu()
    training, server, other = client(1), client(2), client(3)
    g.report_demand(training, BUSY, 0.0)
    assert told_to_yield(g.request(training, 0.0)) == []            # alone
    assert told_to_yield(g.report_demand(server, SERVER, 0.1)) == [1]   # registered, holds nothing
    assert grants(g.request(server, 0.1)) == [(2, SHARED)] and g.holders[1].yields
    actions = g.release(2, 0.2, idle=True)                           # the warm-up's idle release:
    assert grants(actions) == [(2, SHARED)] and g.holders[2].standing    # granted again unasked
    assert grants(g.release(2, 0.3, idle=True)) == []                # that one given back: not renewed
    assert 2 not in g.holders and g.holders[1].yields                # it still waits out the next
    actions = g.request(server, 1.2)                                 # the first request: no new grant
    assert grants(actions) == [(2, SHARED)] and told_to_yield(actions) == []
    g.release(2, 1.3, idle=True)
    actions = g.report_demand(server, BUSY, 1.4)                     # now a training: no waits
    assert [(a.client.client_id, a.yields) for a in actions if a.kind == GRANT] == [(1, False)]
    g.report_demand(other, LIGHT, 1.5)
    assert g.holders[1].yields                                       # an interactive step's
    g.stopped.stop(3, "stopped (SIGSTOP)", may_run=True, held=False)
    actions = g.tick(1.6)                                            # stopped: asks nothing now
    assert [(a.client.client_id, a.yields) for a in actions if a.kind == GRANT] == [(1, False)]
    g.stopped.runs_again(3)
    assert told_to_yield(g.tick(1.7)) == [1]
    actions = g.remove_client(3, 1.8)                                # it left
    assert [(a.client.client_id, a.yields) for a in actions if a.kind == GRANT] == [(1, False)]
    assert g.demand.prompt_ready([2], 1.8) is False                  # the busy one


def test_a_prompt_client_that_gave_its_lock_back_idle_is_granted_again_unasked():
    """Issue 42, mix3 on the H200: a probe asked first, was told LOCK_CONTENDED while it had not
    reported (a turn-taker until then) and gave the GPU back in its warm-up's pause; its first
    probe then waited a round trip for the lock (0.6-0.8 ms of a 1.1 ms request). Known to be
    prompt, it now holds a standing grant (SHARED, bursts take turns) and the training yields
    beside it. Not a busy client, a dropped one, a stopped or suspended one, one outranked, nor
    one that gives the standing grant back idle again (no grant and release in a loop)."""
    g = gpu()
    probe, training = client(2), client(1)
    assert grants(g.request(probe, 0.0)) == [(2, SHARED)]            # alone
    actions = g.request(training, 0.01)                              # neither has reported: turns
    assert kinds(actions) == [(CONTENDED, 2)]
    actions = g.release(2, 0.02, idle=True)                          # its warm-up's pause
    assert grants(actions) == [(1, EXCLUSIVE)] and 2 in g.lock.gave_back_idle
    actions = g.report_demand(probe, LIGHT, 0.05)                    # known: a prompt client
    granted = [a for a in actions if a.kind == GRANT]
    assert [(a.client.client_id, a.flags, a.bursts, a.unasked) for a in granted if a.client.client_id == 2] \
        == [(2, SHARED, True, True)]
    assert g.holders[2].standing and g.holders[1].yields             # the training waits out its bursts
    assert grants(g.request(probe, 1.0)) == [(2, SHARED)]            # its next burst: already holds
    assert not g.queue
    # Given back idle again (it should not be: a co-runner is never contended): not renewed.
    assert [a for a in g.release(2, 1.1, idle=True) if a.kind == GRANT and a.client.client_id == 2] == []
    assert 2 not in g.holders and 2 not in g.lock.gave_back_idle

    # A client whose report says busy, or dropped, or stopped, or suspended: no standing grant.
    g = gpu()
    g.report_demand(training, BUSY, 0.0)
    g.request(training, 0.0)
    busy, dropped, stopped, suspended = client(2), client(3), client(4), client(5)
    g.report_demand(busy, BUSY, 0.1)
    g.lock.gave_back_idle.add(2)                                          # as if it had given one back
    g.report_demand(dropped, LIGHT, 0.1)
    assert grants(g.request(dropped, 0.1)) == [(3, SHARED)]
    g.lock.drop(g.holders[3], 0.2, C.NVSHARE_DROP_TIMESLICE, [])
    assert 3 not in g.lock.gave_back_idle
    g.report_demand(stopped, LIGHT, 0.1)
    g.stopped.stop(4, "stopped (SIGSTOP)", may_run=True, held=False)
    g.lock.gave_back_idle.add(4)
    g.report_demand(suspended, LIGHT, 0.1)
    g.lock.gave_back_idle.add(5)
    suspend_client(g, 5, 0.25, stopped=False, move=0)
    actions = g.release(3, 0.3, idle=True) + g.tick(0.4)
    assert [a.client.client_id for a in actions if a.kind == GRANT and a.client.client_id != 1] == []
    assert set(g.holders) == {1} and g.lock.gave_back_idle == {2, 4}      # kept: granted once light, running

    # One of a worse class beside a better class's turn-taker: it waits, so it is granted nothing.
    g = gpu()
    low = ClientInfo(7, 7, 0, 1007, "user", 0, share_class="low")
    g.report_demand(training, BUSY, 0.0)
    g.request(training, 0.0)
    g.report_demand(low, SHORT_BURSTS, 0.1)
    g.lock.attach(low)
    g.lock.gave_back_idle.add(7)
    assert [a for a in g.tick(0.2) if a.kind == GRANT and a.client.client_id == 7] == []
