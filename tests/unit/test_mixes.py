"""Mixes of 3 to 8 clients on one GPU (issue 27), on a fake clock: the choice between co-running
and turns follows what each costs the client (demand.py's cost rule). A bursty client beside two
or more compute-bound ones co-runs instead of waiting for their full turns; compute-bound ones
still take turns among themselves, with equal time; memory that does not fit still takes turns.

Each simulated client behaves as a hook would: a heavy one holds until DROP_LOCK, drains in
2 ms and asks again at once; a bursty one asks, runs one burst once granted, lets go and asks
again after its host pause (or at once when dropped mid-burst); a swap (DROP_LOCK with bytes,
PREPARE_SWAP_OUT) moves its bytes in 1 ms and a grant brings its swapped memory back."""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from nvshare_slurm.policy.demand import Demand, turn_length
from nvshare_slurm.policy.gpustate import GpuState
from nvshare_slurm.policy.policytypes import DROP, GRANT, SWAP_OUT, ClientInfo, GpuSettings
from nvshare_slurm.wire.proto import C

G = 1 << 30
SHARED, EXCLUSIVE, SWAP_AHEAD = C.NVSHARE_GRANT_SHARED, C.NVSHARE_GRANT_EXCLUSIVE, C.NVSHARE_GRANT_SWAP_AHEAD
BUSY = Demand(0.97, 10.0, 0.0)                  # a compute-bound training
BURSTY = Demand(0.35, 0.028, 0.043)             # issue 27's bursty job: 28 ms bursts, 43 ms pauses
W2 = Demand(0.30, 0.035, 0.082)                 # 35 ms steps, 82 ms host pauses
LONG_PAUSES = Demand(0.30, 0.050, 0.117)        # 50 ms bursts, 117 ms pauses
LIGHT = Demand(0.002, 0.001, 0.3)               # an interactive step: 1 ms every 0.3 s
SHORT = Demand(0.35, 0.012, 0.022)              # short bursts: co-run by their own demand
DRAIN = 0.002


def gpu(memory: int = 16 * G, **settings) -> GpuState:
    return GpuState("GPU-mix", 0, memory, GpuSettings(memory_reserve_percent=0, **settings))


def client(n: int, share_class: str = "normal") -> ClientInfo:
    return ClientInfo(n, n, 0, 1000 + n, f"user{n}", 0, share_class)


class Sim:
    """The clients of one GPU against its policy on a fake clock (see the module's docstring)."""

    def __init__(self, g: GpuState, demands: dict[int, Demand], memory: dict[int, tuple[int, int]]
                 | None = None):
        self.g, self.demands, self.now = g, demands, 0.0
        self.clients = {n: client(n) for n in demands}
        self.mem = dict(memory or {})                       # cid -> (allocated, swapped)
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.held: dict[int, tuple[float, int, bool]] = {}  # cid -> (since, grant number, shared)
        self.asked: dict[int, float] = {}
        self.wanting: set[int] = set()                      # bursty: a burst waits for a grant
        self.in_burst: set[int] = set()
        self.chain: dict[int, int] = {}                     # bursty: its current burst or pause
        self.total = dict.fromkeys(demands, 0.0)            # time held
        self.steps = dict.fromkeys(demands, 0)              # bursts run
        self.waits: dict[int, list[float]] = {n: [] for n in demands}
        self.grant_flags: dict[int, list[tuple[int, bool]]] = {n: [] for n in demands}
        for n, d in demands.items():
            if n in self.mem:
                self.mem_update(n)
            self.handle(g.report_demand(self.clients[n], d, 0.0))
        for n, d in demands.items():
            if d.busy < 0.8:
                self.burst_start(n, self.chain.setdefault(n, next(self.seq)))
            else:
                self.request(n)

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self.timers, (self.now + delay, next(self.seq), fn))

    def mem_update(self, cid: int) -> None:
        allocated, swapped = self.mem[cid]
        self.handle(self.g.mem_update(self.clients[cid], self.now, allocated, 0, swapped)[0])

    def move(self, cid: int, out: int) -> None:
        if cid in self.mem:
            allocated, swapped = self.mem[cid]
            out = min(out, allocated)
            self.mem[cid] = (allocated - out, swapped + out)
            self.mem_update(cid)

    def request(self, cid: int) -> None:
        if cid not in self.held and cid not in self.asked:
            self.asked[cid] = self.now
            self.handle(self.g.request(self.clients[cid], self.now))

    def release(self, cid: int, number: int) -> None:
        if self.held.get(cid, (0.0, -1, False))[1] != number:
            return                                          # an older grant's timer
        since, _, _ = self.held.pop(cid)
        self.total[cid] += self.now - since
        self.handle(self.g.release(cid, self.now))

    # A bursty client: a burst runs once it holds; after it an exclusive holder lets go (the hook
    # gives the GPU back once idle), a SHARED one keeps its grant; the next burst after its pause.
    def burst_start(self, cid: int, chain: int) -> None:
        if self.chain.get(cid) != chain:
            return
        if cid in self.held:
            self.run_burst(cid)
        else:
            self.wanting.add(cid)
            self.request(cid)

    def run_burst(self, cid: int) -> None:
        chain = self.chain[cid] = next(self.seq)
        self.steps[cid] += 1
        self.in_burst.add(cid)
        self.later(self.demands[cid].burst, lambda: self.burst_end(cid, chain))

    def burst_end(self, cid: int, chain: int) -> None:
        if self.chain.get(cid) != chain:
            return
        self.in_burst.discard(cid)
        if cid in self.held and not self.held[cid][2]:
            self.release(cid, self.held[cid][1])
        self.later(self.demands[cid].gap, lambda: self.burst_start(cid, chain))

    def handle(self, actions) -> None:
        for a in actions:
            cid = a.client.client_id
            if a.kind == GRANT and cid in self.asked:
                self.waits[cid].append(self.now - self.asked.pop(cid))
                self.grant_flags[cid].append((a.flags, a.bursts))
                self.held[cid] = (self.now, next(self.seq), a.flags == SHARED)
                if cid in self.mem and self.mem[cid][1]:      # brings its memory back
                    self.mem[cid] = (sum(self.mem[cid]), 0)
                    self.later(0.001, lambda cid=cid: self.mem_update(cid))
                if cid in self.wanting:
                    self.wanting.discard(cid)
                    self.run_burst(cid)
            elif a.kind == GRANT and cid in self.held:        # the same grant, said again
                since, number, _ = self.held[cid]
                self.held[cid] = (since, number, a.flags == SHARED)
            elif a.kind == DROP and cid in self.held:
                self.later(DRAIN, lambda c=cid, n=self.held[cid][1], m=a.bytes: self.dropped(c, n, m))
            elif a.kind == SWAP_OUT:
                self.later(0.001, lambda c=cid, m=a.bytes: self.move(c, m))

    def dropped(self, cid: int, number: int, moved: int) -> None:
        self.move(cid, moved)
        self.release(cid, number)
        if self.demands[cid].busy >= 0.8:
            self.request(cid)                               # a heavy one asks again at once
        elif cid in self.in_burst:
            self.wanting.add(cid)                           # its burst starts again once granted
            self.request(cid)

    def run(self, until: float) -> Sim:
        while self.now < until:
            deadline = self.g.next_deadline()
            timer = self.timers[0][0] if self.timers else until
            if deadline is not None and deadline <= timer:
                self.now = max(self.now, deadline)
                self.handle(self.g.tick(self.now))
                continue
            if not self.timers:
                break
            self.now, _, fn = heapq.heappop(self.timers)
            fn()
        return self

    def share(self, cid: int) -> float:
        return self.total[cid] / self.now


# --- the cost rule -------------------------------------------------------------------------------

def test_turn_lengths_that_a_bursty_client_would_wait_for():
    assert turn_length(BUSY, 0.1) == 0.1 and turn_length(None, 0.1) == 0.1
    assert turn_length(W2, 0.1) == 0.035 and turn_length(W2, 0.02) == 0.02


def test_a_bursty_client_beside_two_heavy_ones_co_runs_at_once():
    """Issue 27: 28 ms bursts, 43 ms pauses beside two compute-bound jobs in 100 ms turns. In turns
    it waited for both heavy turns after each burst (2.45x its solo time on the H100); co-running it
    loses about one burst a step. Granted SHARED | BURSTS beside the holder, no turn-taker dropped."""
    g = gpu()
    a, b, x = client(1), client(2), client(3)
    for c, d in ((a, BUSY), (b, BUSY), (x, BURSTY)):
        g.report_demand(c, d, 0.0)
    g.request(a, 0.0)
    g.request(b, 0.0)
    actions = g.request(x, 0.01)
    assert [(y.kind, y.client.client_id, y.flags, y.bursts, y.yields) for y in actions] == \
        [(GRANT, 3, SHARED, True, False), (GRANT, 1, EXCLUSIVE, False, True)]   # the holder yields
    assert not g.takes_turns(3) and g.takes_turns(1) and g.takes_turns(2)
    assert g.status(0.01, [], [])["sharing_reason"] == "2 busy clients take turns, 1 light co-run"


def test_a_bursty_client_whose_pause_covers_the_rotation_keeps_its_turns():
    """Turns cost nothing when the pause is longer than the others' turns: 117 ms pauses beside one
    100 ms turn. A W2 pair keeps taking turns (the partner's burst fits in its pause)."""
    g = gpu()
    g.report_demand(client(1), BUSY, 0.0)
    g.report_demand(client(2), LONG_PAUSES, 0.0)
    g.request(client(1), 0.0)
    assert GRANT not in [y.kind for y in g.request(client(2), 0.01)] and g.takes_turns(2)
    g = gpu()
    for n in (1, 2):
        g.report_demand(client(n), W2, 0.0)
        g.request(client(n), 0.0)
    assert g.status(0.0, [], [])["sharing"] == "turns" and g.takes_turns(1) and g.takes_turns(2)


def test_an_equal_bursty_pair_keeps_its_turns_through_a_noisy_report():
    """Two equal jobs, 8 ms bursts and 4 ms pauses with burst_turns off (the group takes turns):
    waiting for the partner's burst costs 4 ms, co-running 8. A report read on a loaded CPU (the
    pause as 1 ms, the burst 9, the partner's burst 11) leaves 11 - 1 = 10 ms, past the 9 ms
    stretch: before the margin it co-ran for a report's time and the pair's kernels overlapped
    (CI). It co-runs only past CORUN_ENTER times
    the stretch, and one that co-runs by cost goes back to turns only below the stretch itself."""
    equal, noisy = Demand(0.67, 0.008, 0.004), Demand(0.55, 0.009, 0.001)
    g = gpu(burst_turns=False)
    for n in (1, 2):
        g.report_demand(client(n), equal, 0.0)
        g.request(client(n), 0.0)
    g.report_demand(client(1), Demand(0.60, 0.011, 0.004), 0.1)
    g.report_demand(client(2), noisy, 0.1)
    assert g.takes_turns(1) and g.takes_turns(2), g.status(0.1, [], [])["sharing_reason"]
    assert g.status(0.1, [], [])["sharing"] == "turns"
    # Past the margin (a 30 ms turn ahead of a 9 ms burst with 1 ms pauses: 29 > 13.5), it co-runs;
    # back to 18 ms ahead (17 ms left, between the stretch and the margin) it stays co-running.
    g.report_demand(client(1), Demand(0.70, 0.030, 0.004), 0.2)
    assert not g.takes_turns(2)
    g.report_demand(client(1), Demand(0.70, 0.018, 0.004), 0.3)
    assert not g.takes_turns(2)
    g.report_demand(client(1), Demand(0.70, 0.009, 0.004), 0.4)
    assert g.takes_turns(2)


def test_light_bursty_client_beside_two_and_three_heavy_ones_waits_at_most_a_millisecond():
    """30 simulated seconds: the bursty job is granted within 1 ms each time (before: up to two
    heavy turns, 200 ms) and runs a burst every 71 ms as alone; the heavies' time stays even."""
    for heavies in (2, 3):
        demands = {n: BUSY for n in range(1, heavies + 1)} | {heavies + 1: BURSTY}
        sim = Sim(gpu(), demands).run(30.0)
        x = heavies + 1
        assert max(sim.waits[x]) <= 0.001, max(sim.waits[x])
        assert sim.steps[x] >= 30.0 / 0.071 * 0.95, sim.steps[x]     # a burst every 71 ms
        shares = [sim.share(n) for n in range(1, heavies + 1)]
        assert min(shares) / max(shares) > 0.95 and sum(shares) > 0.95, shares
        assert all(f == (EXCLUSIVE, False) for n in range(1, heavies + 1)
                   for f in sim.grant_flags[n][1:])


def test_two_and_three_heavy_ones_still_alternate_turns():
    """Compute-bound jobs among themselves: exclusive turns of the switch interval, equal time,
    nobody co-runs."""
    for heavies in (2, 3):
        sim = Sim(gpu(), dict.fromkeys(range(1, heavies + 1), BUSY)).run(20.0)
        shares = [sim.share(n) for n in range(1, heavies + 1)]
        assert min(shares) / max(shares) > 0.97, shares
        assert all(len(sim.waits[n]) >= 20.0 / (0.1 * heavies) * 0.9 for n in sim.demands)
        assert all(f == (EXCLUSIVE, False) for n in sim.demands for f in sim.grant_flags[n][1:])
        assert max(max(w) for w in sim.waits.values()) <= 0.1 * (heavies - 1) + 0.01


def test_eight_clients_mixed_keep_heavy_fairness_and_bounded_light_waits():
    """Three compute-bound, two bursty as in issue 27, a short-burst job, two interactive steps:
    the three heavies share their turns evenly, every other client is granted within 1 ms."""
    demands = {1: BUSY, 2: BUSY, 3: BUSY, 4: BURSTY, 5: BURSTY, 6: SHORT, 7: LIGHT, 8: LIGHT}
    sim = Sim(gpu(), demands).run(30.0)
    shares = [sim.share(n) for n in (1, 2, 3)]
    assert min(shares) / max(shares) > 0.95, shares
    for n in range(4, 9):
        assert max(sim.waits[n]) <= 0.001, (n, max(sim.waits[n]))
        assert sim.steps[n] >= 30.0 / (demands[n].burst + demands[n].gap) * 0.95, n
    assert sim.g.status(sim.now, [], [])["sharing_reason"].startswith("3 busy clients take turns")


def test_classes_still_decide_before_the_cost_rule():
    """A worse-class bursty client beside two busy better ones waits (it would take a third of
    their time); a better-class one beside two worse heavy ones takes the GPU from them at once."""
    g = gpu()
    for n, d in ((1, BUSY), (2, BUSY)):
        g.report_demand(client(n), d, 0.0)
        g.request(client(n), 0.0)
    g.report_demand(client(3, "low"), BURSTY, 0.0)
    assert [y.kind for y in g.request(client(3, "low"), 0.01)] == [] and 3 in g.queue
    g = gpu()
    for n in (1, 2):
        g.report_demand(client(n, "low"), BUSY, 0.0)
        g.request(client(n, "low"), 0.0)
    g.report_demand(client(3, "high"), BURSTY, 0.0)
    actions = g.request(client(3, "high"), 0.01)
    assert (DROP, 1) in [(y.kind, y.client.client_id) for y in actions]
    assert g.takes_turns(3)


# --- memory that does not fit --------------------------------------------------------------------

def issue_mix() -> Sim:
    """Issue 27's node on a 76 GiB GPU: a training (8 GiB), two 40 GiB jobs that do not fit
    together, the bursty job (2 GiB) and an interactive step (1 GiB)."""
    demands = {1: BUSY, 2: BUSY, 3: BUSY, 4: BURSTY, 5: LIGHT}
    memory = {1: (8 * G, 0), 2: (40 * G, 0), 3: (0, 40 * G), 4: (2 * G, 0), 5: (1 * G, 0)}
    return Sim(gpu(76 * G), demands, memory=memory)


def test_memory_that_does_not_fit_still_takes_turns_but_resident_light_clients_co_run():
    """The two 40 GiB jobs take turns with swap (the switch interval grows with their bytes), the
    training takes its turns, and the bursty job and the interactive step, whose memory stays
    resident, co-run beside whoever holds: granted within 1 ms each time (before: FIFO behind
    turns of up to 40 s)."""
    sim = issue_mix().run(200.0)
    assert not sim.g.memory.fits()
    for n in (4, 5):
        assert max(sim.waits[n]) <= 0.001, (n, max(sim.waits[n]))
        assert all(f == (SHARED, True) for f in sim.grant_flags[n])
    for n in (1, 2, 3):
        assert sim.share(n) > 0.1 and all(f == (SWAP_AHEAD, False) for f in sim.grant_flags[n][1:]), n
    assert sim.g.status(sim.now, [], [])["sharing_reason"] == "memory does not fit: turns with swap"


def test_a_swapped_out_light_client_takes_its_turn_to_bring_it_back():
    """Its memory is in host memory: co-running, it would bring it in beside the holder's. It waits
    in the queue for a turn of its own; once its memory is resident again it co-runs."""
    g = gpu(76 * G)
    a, b, x = client(1), client(2), client(3)
    g.mem_update(a, 0.0, 40 * G, 0, 0)
    g.mem_update(b, 0.0, 0, 0, 40 * G)
    g.mem_update(x, 0.0, 0, 0, 2 * G)
    for c, d in ((a, BUSY), (b, BUSY), (x, BURSTY)):
        g.report_demand(c, d, 0.0)
    g.request(a, 0.0)
    g.request(b, 0.0)
    assert [y.kind for y in g.request(x, 0.01)] == [] and 3 in g.queue
    actions, _ = g.mem_update(x, 0.02, 2 * G, 0, 0)     # back in (restored by another process)
    assert [(y.kind, y.flags, y.bursts) for y in actions] == [(GRANT, SHARED, True)]


def turn_b_swapped(a_resident: int, x_resident: int, b_reports: bool = True):
    """A 76 GiB GPU: a (busy) and x (bursty) with memory resident, b (busy) with 40 GiB in host
    memory. Returns (GpuState, a, b, x)."""
    g = gpu(76 * G)
    a, b, x = client(1), client(2), client(3)
    g.mem_update(a, 0.0, a_resident, 0, 0)
    g.mem_update(b, 0.0, 0, 0, 40 * G)
    g.mem_update(x, 0.0, x_resident, 0, 0)
    for c, d in ((a, BUSY), (b, BUSY), (x, BURSTY)):
        if b_reports or c is not b:
            g.report_demand(c, d, 0.0)
    return g, a, b, x


def test_co_runners_whose_memory_would_crowd_a_turn_take_turns_too():
    """The largest turn-taker must fit beside every co-runner's resident memory, or the turns'
    swaps would need theirs: a bursty client with 40 GiB resident beside a 40 GiB job on 76 GiB
    waits for its turn."""
    g, a, b, x = turn_b_swapped(30 * G, 40 * G)
    g.request(a, 0.0)
    g.request(b, 0.0)
    assert [y.kind for y in g.request(x, 0.01)] == [] and 3 in g.queue


def test_a_co_runner_that_turns_busy_does_not_take_the_gpu_from_the_turn_holder():
    """Issue 27's node on the H200: the bursty job co-ran beside turns with swap, then read busy.
    Granted before the turn began, it was the oldest holder and kept the GPU, and the turn holder
    was dropped and asked to move all its memory (70 GiB) out, about 24 s before the other 70 GiB
    job could start (all done in 1.81x serial). The turn holder keeps its turn; the co-runner
    waits, its memory resident until a grant needs the room."""
    g, a, b, x = turn_b_swapped(40 * G, 2 * G)
    assert [(y.kind, y.flags) for y in g.request(x, 0.0)] == [(GRANT, SHARED)]
    assert [(y.kind, y.flags) for y in g.request(a, 0.01)] == [(GRANT, SWAP_AHEAD)]
    g.request(b, 0.02)
    actions = g.report_demand(x, BUSY, 0.05)
    assert [(y.kind, y.client.client_id, y.bytes) for y in actions if y.kind == DROP] == [(DROP, 3, 0)]
    assert g.holders[1].drop_at is None


def test_a_waiter_that_never_reports_counts_as_a_whole_turn_after_a_second():
    """A job whose memory waits in host memory for its turn reports nothing until it runs. While
    a turn-taker has not reported, a bursty client keeps its turns (its wait is unknown); on the
    H200 it took turns behind such a 70 GiB job for 12 s (1.7x slower than co-located). After
    UNREPORTED_SEC the silent waiter counts as a whole turn, and the bursty client co-runs."""
    g, a, b, x = turn_b_swapped(40 * G, 2 * G, b_reports=False)
    assert [y.kind for y in g.request(a, 0.0)] == [GRANT]
    g.request(b, 0.01)                                      # never reports
    assert [y.kind for y in g.request(x, 0.02)] == [] and 3 in g.queue
    assert g.next_deadline() == 1.01
    assert [(y.kind, y.client.client_id, y.flags, y.bursts) for y in g.tick(1.01)
            if y.kind == GRANT] == [(GRANT, 3, SHARED, True)]
