"""What the clients of one GPU ask of it, as pure logic: each client's DEMAND report (busy share,
burst and gap lengths, from the hook), how long its drains took, and from these who takes
exclusive turns, who co-runs, and whether a better holder's idle time may go to worse waiters
(auto_share: adaptive, and share classes; docs/design-scheduler.md "Adaptive sharing").

GpuState (gpustate.py) owns one GpuDemand per GPU and asks it; the grants and drops that follow
are GpuState's. The caller's clock, no I/O.
"""
from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field

from .policytypes import ClientInfo

# auto_share: adaptive. A client takes exclusive turns when it keeps the GPU busy most of the time
# (co-running two such costs ~8 % on an H100), or when its bursts and the gaps between them are
# long enough for an idle hand-over to fit in the gaps (W2-like jobs: turns 0.53x serial against
# co-location 0.66x). Shorter bursts co-run while they fit in each other's pauses.
TURN_BUSY = 0.8
TURN_BURST_SEC = 0.025
TURN_GAP_SEC = 0.025
# ... and keeps taking them until its figures fall below those lines by this factor: two bursty
# jobs alternating in each other's pauses (tests/hook/test_hook_adaptive.py) read one report of
# "busy 40 %" on a loaded CI machine, co-ran for that report's time and their kernels overlapped.
TURN_LEAVE = 0.75
# Unless it serves (issue 42): a client whose gaps vary as random arrivals do (mean deviation over
# mean: ~0.74 for exponential gaps, near 0 for a training's fixed pauses) serves requests. By its
# means alone it looked like a bursty training: on the H200 a CUDA-graph decoder's requests (busy
# 23 %, bursts 23-38 ms, gaps 62-140 ms) took turns with a PyTorch training and their p99 was 6.6x
# alone (co-located 2.0x). It co-runs, and its hook makes its requests prompt bursts whatever their
# length: the others yield and pace beside them (csrc/burst.c "Servers", the same 0.5 line there).
SERVE_SPREAD = 0.5
# ... and its mean burst is at most SERVE_BURST_SEC (the longest a prompt burst is held for), unless it
# served already (its class stays whatever its length: a request's length is the model's). On the H200
# a PyTorch training that stepped 2 s and paused 2 s in turn read busy 11 % after each pause with gaps
# as irregular as a server's, bursts of 440-720 ms: the hook ran its steps as prompt bursts and this
# policy let it co-run as a server (csrc/burst.c's SERVE_BURST_MAX_NS, the same line there).
SERVE_BURST_SEC = 0.2
# Sharing stretches a server's requests: its bursts merge and its gaps may read regular for a while.
# On the H200 a model.generate server beside a training read "busy 35 %, bursts 252 ms, gaps 54 ms"
# between reports that said it served, took turns with the training, and its p99 was 2.0x its p99
# alone (co-located 2.0x; 1.08x in a call where it kept its class). So a client whose report said it
# served stays one for SERVE_STAY_SEC while it is not busy most of the time (csrc/burst.c keeps the
# same rule for its prompt class).
SERVE_STAY_SEC = 5.0
# Until the spread is known (the hook measures it from 2 gaps on; spread None), long bursts and gaps
# alone do not make a turn-taker: a server's first gap is the wait after its warm-up, and with that
# one gap the graph decoder read "busy 24 %, bursts 26 ms, gaps 186 ms" and took turns through its
# first requests. A bursty training takes turns from its second pause.
# Co-running bursty clients whose busy shares add up past TURN_GROUP_BUSY cannot all fit in each
# other's pauses: their bursts overlap, and co-running equal jobs whose steps start together stay
# together (each slowed step pauses as long, or longer), so the overlap decides the result. On the
# H100 (issue 12, 5 ms bursts, 60 % busy each) one such pair ran at 1.00x serial co-run in one run
# and 0.76x in the next; in turns 0.73-0.74x. These then take turns until their sum falls below
# TURN_GROUP_LEAVE. That line is low because a job whose pause follows its step's length pauses
# longer in turns (the wait is part of the step): with 0.8 such a pair read 80-100 % in turns,
# went back to co-running, overlapped and came back, every second or two. Below
# TURN_GROUP_BURST_SEC a burst costs about what a hand-over costs: such clients (an interactive
# command, ~1 ms) co-run and are not counted. Pairs below the line keep co-running: a 10 %-busy
# pair with 5 ms bursts ran at 0.52x co-run, 0.67x in turns (every lock wait lengthened a step
# whose pause follows its length).
# A registered client that holds nothing now and whose bursts are prompt ones (csrc/burst.c's line:
# a mean burst of at most PROMPT_BURST_SEC and busy at most PROMPT_BUSY; or a server) makes a turn
# holder carry waits in its streams (YIELD) before it asks again (issue 42): its next burst is
# announced on the GPU's page, and the GPU holds what the holder queued at its next wait. Told only
# once the client asked, the holder's queue had no waits: on the H200 serve2's first request after
# the server's warm-up (an idle release) ran beside the training's unwaited 20 ms step, 8.7 ms at p99
# against 6.2 alone. The waits cost the holder about 1 % while such a client is there.
PROMPT_BURST_SEC = 0.012
PROMPT_BUSY = 0.4
# A client whose gaps are a second or more and its bursts a tenth of them at most (a server whose
# requests come seconds apart; one idle for a second now: the hook reports the idle stretch under
# way as its gap once it is longer than the mean) takes no turns: co-running one of its bursts
# costs the others a few per cent, and in turns each waits for a turn holder's switch interval.
# The busy share is no test here: it follows the last second, and lags. On the H200 a CUDA-graph
# decoder idle for 1.7 s after its warm-up (which read "busy 29 %, bursts 32 ms, gaps 46 ms": a
# bursty training) made the training beside it take exclusive turns, and its first request waited
# 170 ms for that turn to end and drain: 176 ms against 10 alone (issue 42).
RARE_GAP_SEC = 1.0
RARE_BURST_SHARE = 0.1
TURN_GROUP_BUSY = 1.0
TURN_GROUP_LEAVE = 0.6
TURN_GROUP_BURST_SEC = 0.004
# The cost rule (issue 27): a client that takes turns by its own demand only for its long bursts
# and gaps (busy below TURN_BUSY) waits in turns, after each burst, for the rotation of the
# other turn-takers it would queue behind (same class or better): a compute-bound one holds a full
# switch interval, a bursty one about its burst (it hands over in its pause). Its own gap hides
# part of that wait. Co-running instead stretches its burst: beside a busy turn holder the GPU
# time-slices the two contexts, so a burst takes about (1 + CORUN_STRETCH) times as long. It
# co-runs when the wait left over exceeds that stretch. Issue 27's bursty job (28 ms bursts, 43 ms
# gaps) beside three 100 ms turns: wait 257 ms a step against 28 ms co-running (it ran 2.45x its
# solo time in turns, 1.54x co-located); a W2 pair (35 ms bursts, 82 ms gaps) keeps its turns
# (the partner's burst fits in its gap: no wait).
CORUN_STRETCH = 1.0
# ... with a margin on the way in: a client co-runs by cost once the wait left over exceeds
# CORUN_ENTER times that stretch, and takes turns again below CORUN_STRETCH. Between two equal
# bursty jobs the wait left over is the partner's burst less its own gap, about its own burst
# less its gap, so one noisy report (a 1 ms gap read on a loaded CPU for a 4 ms one) tipped it
# over the line: it co-ran for a report's time and their kernels overlapped. Issue 27's case
# (214 ms left over against 28 ms) is far past either line.
CORUN_ENTER = 1.5
# A turn-taker that asked this long ago and has not reported yet counts as holding whole turns in
# the cost rule (_loses_in_turns).
UNREPORTED_SEC = 1.0
# Classes: a light client of a worse class co-runs beside a busy better one only below this busy
# share. Co-running kernels share the GPU's time, so such a client costs the better job at most
# about half its busy share (2.5 %, inside issue 14's 95 %); an interactive command (~1 ms every
# few hundred ms) stays far below it. A "light" client above it (short bursts, short gaps, busy
# up to 80 %) would take a third or more of a high job's time: it waits with the other worse ones.
CLASS_CORUN_BUSY = 0.05
# A client counts as busy when classes are compared (its class outranks worse ones) until it has
# reported for this long: a training's first reports read light (imports, model set-up, the first
# steps' host work; the busy share follows the last second). On the H200 a high-class training's
# start-up read light, and a low compute-bound job co-ran beside it for 1.8 s of its training: it
# kept 0.87 of its speed alone, where issue 27 asks 0.98.
CLASS_SETTLE_SEC = 5.0
# A better holder gives its idle time to worse waiters only when its pauses are this many times
# longer than the worst drain measured of those waiters (DROP_LOCK to release). On a real GPU a
# holder drains what it has queued (a PyTorch step: ~120 ms for W1 on an H100), and the better
# job, back from its pause, runs beside that drain at about half speed; with pauses 10x the drain
# it loses at most ~5 % of its time, the 95 % issue 14 promises.
CLASS_IDLE_DRAIN_FACTOR = 10.0
# Between equals (turnloan.py) the idle time of a turn is lent to the waiters (the lender, back,
# waits for the borrower's drain and takes its turn back), except to a busy one (TURN_BUSY) whose
# drain is more than this many of the lender's mean pauses: then it is kept for the lender a while.
# Lending is paid back only by a borrower that pauses too. Two bursty jobs whose 8 ms bursts fill
# each other's 4 ms pauses lend to each other by turns (a drain is the rest of a burst, up to
# 12 ms): kept, the pair took up to 1.93 s where it needs 1.28 s; lent, 1.36-1.39 s. But a training
# with 10 ms pauses that lent them to compute-bound jobs waited out their 40 ms queues at each
# return and never got that back: 1.41-2.5 s of kernels in 9 s against their 3.0-3.8 s.
LEND_DRAIN_PAUSES = 2.0
# A drain counts for this long after it was measured. Kept for good, one slow drain (or one a
# hostile low-class user made slow on purpose) denied every worse waiter the better holder's idle
# time for the client's lifetime, and a waiter that never holds again never measures a new one.
CLASS_DRAIN_MEMORY_SEC = 60.0


@dataclass(frozen=True)
class Demand:
    """What one client asks of this GPU lately (the hook's DEMAND report)."""
    busy: float               # 0..1: share of recent time with work launched or in flight
                              # (lock waits left out)
    burst: float              # seconds: mean busy stretch
    gap: float                # seconds: mean idle stretch between busy ones
    spread: float | None = 0.0   # the gaps' mean deviation over their mean (0 from older hooks;
                                 # None: fewer than 2 gaps measured yet)

    @property
    def irregular(self) -> bool:
        """Its gaps are as irregular as random arrivals (SERVE_SPREAD), and it is not busy most of
        the time: a server's, or one that served already and stays one (GpuDemand.report)."""
        return self.spread is not None and self.spread >= SERVE_SPREAD and self.busy < TURN_BUSY

    @property
    def serves(self) -> bool:
        """Its bursts begin at arrivals that do not wait for the GPU (a server's requests): its
        gaps are irregular, and its bursts no longer than a prompt burst is held for
        (SERVE_BURST_SEC). A burst then waits for a turn with no pause of its own to hide the wait
        in."""
        return self.irregular and self.burst <= SERVE_BURST_SEC

    @property
    def rare(self) -> bool:
        """Its gaps a second or more, its bursts a tenth of them at most (RARE_*): no turn-taker."""
        return self.gap >= RARE_GAP_SEC and self.burst <= RARE_BURST_SHARE * self.gap

    @property
    def takes_turns(self) -> bool:
        """A turn-taker by its own demand, whoever else uses the GPU."""
        if self.rare:
            return False
        return self.busy >= TURN_BUSY or (self.burst >= TURN_BURST_SEC and self.gap >= TURN_GAP_SEC
                                          and self.spread is not None and not self.serves)

    def keeps_turns(self) -> bool:
        """A client that takes turns by its own demand goes on taking them until its figures are
        clearly below the lines (TURN_LEAVE): one noisy report does not flip it. A server leaves
        them below TURN_BUSY itself: its first report (of its first 40 ms, a request under way)
        reads busy, and in turns its requests that wait for the others' turns run back to back
        when its own comes (a fake-driver server of 20 ms requests 60 ms apart read busy 73-79 %
        in turns and kept them)."""
        f = TURN_LEAVE
        if self.serves or self.rare:
            return False
        return self.busy >= f * TURN_BUSY \
            or (self.burst >= f * TURN_BURST_SEC and self.gap >= f * TURN_GAP_SEC
                and self.spread is not None and self.spread < f * SERVE_SPREAD)

    @property
    def bursty(self) -> bool:
        """Co-runs by its own demand, but its bursts are long enough to count towards overlap."""
        return not self.takes_turns and self.burst >= TURN_GROUP_BURST_SEC

    def describe(self) -> str:
        irregular = ", gaps irregular (a server)" if self.serves else ""
        return (f"busy {self.busy:.0%}, bursts {self.burst * 1000:.0f} ms, gaps "
                f"{self.gap * 1000:.0f} ms{irregular}")


def turn_length(demand: Demand | None, turn_sec: float) -> float:
    """How long a turn-taker holds its turn while others wait: a compute-bound (or unreported)
    one its switch interval, a bursty one its burst (it gives the GPU back in its pause)."""
    if demand is None or demand.busy >= TURN_BUSY:
        return turn_sec
    return min(turn_sec, demand.burst)


@dataclass
class GpuDemand:
    reports: dict[int, Demand] = field(default_factory=dict)   # each client's latest DEMAND
    corun_by_cost: set[int] = field(default_factory=set)   # turn-takers by demand that co-run
    group_turns: bool = False         # the bursty co-runners overlap: they take turns (TURN_GROUP_BUSY)
    # Longest DROP_LOCK-to-release of each client within CLASS_DRAIN_MEMORY_SEC: (seconds, when).
    drain: dict[int, tuple[float, float]] = field(default_factory=dict)
    asked: dict[int, float] = field(default_factory=dict)          # ever requested here: when first
    by_demand: set[int] = field(default_factory=set)    # turn-takers by their own reports (TURN_LEAVE)
    served: dict[int, float] = field(default_factory=dict)   # when each client's report last said it serves
    first_report: dict[int, float] = field(default_factory=dict)   # when each client first reported
    last_pass: float = float("-inf")                                # the policy's last pass

    def report(self, client_id: int, demand: Demand, now: float) -> None:
        self.reports[client_id] = demand
        self.first_report.setdefault(client_id, now)
        if demand.serves or (demand.irregular and self.still_serves(client_id, now)):
            self.served[client_id] = now
        if not self.still_serves(client_id, now) and (
                demand.takes_turns or (client_id in self.by_demand and demand.keeps_turns())):
            self.by_demand.add(client_id)
        else:
            self.by_demand.discard(client_id)

    def still_serves(self, client_id: int, now: float) -> bool:
        """Its last report, or one within SERVE_STAY_SEC, said it serves, and it is not busy most of
        the time now (TURN_BUSY): no turns for it."""
        demand, since = self.reports.get(client_id), self.served.get(client_id)
        return demand is not None and since is not None and now - since < SERVE_STAY_SEC \
            and demand.busy < TURN_BUSY

    def prompt_ready(self, client_ids: Iterable[int], now: float) -> bool:
        """Is one of these (registered clients that hold nothing now) a prompt one by its last
        report: a server, or short and rare bursts (PROMPT_*), and no turn-taker?"""
        for cid in client_ids:
            demand = self.reports.get(cid)
            if demand is None or self.takes_turns(cid):
                continue
            if self.still_serves(cid, now) or (demand.burst <= PROMPT_BURST_SEC
                                               and demand.busy <= PROMPT_BUSY):
                return True
        return False

    def requested(self, client_id: int, now: float) -> None:
        self.asked.setdefault(client_id, now)

    def deadlines(self) -> list[float]:
        """When a client that asked without reporting comes to count as holding whole turns,
        after the policy's last pass (GpuState sets last_pass): a bursty one may co-run from then."""
        return [t + UNREPORTED_SEC for cid, t in self.asked.items()
                if cid not in self.reports and t + UNREPORTED_SEC > self.last_pass]

    def drained(self, client_id: int, seconds: float, now: float) -> None:
        """The client released `seconds` after its DROP_LOCK (a drain, no swap)."""
        self.drain[client_id] = max(self.recent_drain(client_id, now), seconds), now

    def forget(self, client_id: int) -> None:
        self.reports.pop(client_id, None)
        self.corun_by_cost.discard(client_id)
        self.drain.pop(client_id, None)
        self.asked.pop(client_id, None)
        self.by_demand.discard(client_id)
        self.served.pop(client_id, None)
        self.first_report.pop(client_id, None)

    def settling(self, now: float) -> set[int]:
        """Clients whose reports do not tell yet what they are (asked without a report, or first
        reported within CLASS_SETTLE_SEC): their class counts as a busy one's."""
        return {cid for cid in self.asked if cid not in self.reports} | \
            {cid for cid, t in self.first_report.items() if now - t < CLASS_SETTLE_SEC}

    def best_class(self, takers: set[int], wanting: set[int], clients: Mapping[int, ClientInfo],
                   now: float) -> tuple[set[int], int | None]:
        """The clients that set the best class wanting the GPU (turn-takers, and those still
        settling: their class counts as a busy one's), and that class's rank (None: no such one)."""
        ranked = (takers | self.settling(now)) & wanting
        return ranked, min((clients[cid].rank for cid in ranked if cid in clients), default=None)

    def takes_turns(self, client_id: int) -> bool:
        """As the last pass decided (takers): by its own demand, unless turns cost it more."""
        return self._by_demand(client_id) and client_id not in self.corun_by_cost

    def _by_demand(self, client_id: int) -> bool:
        demand = self.reports.get(client_id)
        return demand is None or client_id in self.by_demand or (self.group_turns and demand.bursty)

    def takers(self, clients: Mapping[int, ClientInfo], turn_sec: float, now: float) -> set[int]:
        """The turn-takers: a busy client between two turns is still busy; one that has not
        reported yet counts as busy once it has asked for the lock. A bursty one among them that
        would wait longer for the others' turns than co-running costs it co-runs instead (the
        cost rule above, CORUN_STRETCH); compute-bound ones always take turns."""
        takers = {cid for cid in self.reports if cid in clients and self._by_demand(cid)}
        takers |= {cid for cid in self.asked if cid not in self.reports}
        self.corun_by_cost = {cid for cid in takers if self._loses_in_turns(cid, takers, clients,
                                                                              turn_sec, now)}
        return takers - self.corun_by_cost

    def _loses_in_turns(self, client_id: int, takers: set[int], clients: Mapping[int, ClientInfo],
                        turn_sec: float, now: float) -> bool:
        demand = self.reports.get(client_id)
        if demand is None or demand.busy >= TURN_BUSY:
            return False
        rank = clients[client_id].rank if client_id in clients else None
        ahead = [cid for cid in takers if cid != client_id and (rank is None or cid not in clients
                                                                 or clients[cid].rank <= rank)]
        # A turn-taker that has not reported yet may be a burst as short as this one's: until it
        # has, the wait is unknown and the turns stay (two bursty newcomers would otherwise co-run
        # for the ~40 ms before their first reports), for UNREPORTED_SEC; one still silent then
        # holds a whole turn (turn_length). A job whose memory waits in host memory for its turn
        # reports nothing until it runs: in issue 27's node on the H200 the bursty job took turns
        # behind such a 70 GiB job for 12 s, 1.7x slower than co-located.
        if any(cid not in self.reports and now - self.asked.get(cid, now) < UNREPORTED_SEC
               for cid in ahead):
            return False
        rotation = sum(turn_length(self.reports.get(cid), turn_sec) for cid in ahead)
        margin = 1.0 if client_id in self.corun_by_cost else CORUN_ENTER
        return rotation - demand.gap > margin * CORUN_STRETCH * demand.burst

    def any_bursty(self, client_ids: set[int]) -> bool:
        return any(self.reports[c].bursty for c in client_ids if c in self.reports)

    def _bursty_busy(self, clients: Container[int]) -> float:
        """The busy shares of the bursty co-runners added up; a client that asked for the GPU but
        has not reported yet counts as fully busy beside them (as it counts as a turn-taker), so
        a bursty job does not co-run with a newcomer for the ~40 ms until its first report."""
        bursty = [d.busy for cid, d in self.reports.items() if d.bursty and cid in clients]
        unknown = sum(1 for cid in self.asked if cid not in self.reports and cid in clients)
        return sum(bursty) + unknown if bursty and len(bursty) + unknown >= 2 else 0.0

    def update_group(self, burst_turns: bool, clients: Container[int]) -> float:
        """Do the bursty co-runners take turns? Their busy shares added up, with hysteresis (kept
        in group_turns, updated by each adaptive pass). Returns the sum. With burst_turns they
        never need to: their bursts take turns among themselves (burst.c)."""
        total = self._bursty_busy(clients)
        self.group_turns = not burst_turns and \
            total >= (TURN_GROUP_LEAVE if self.group_turns else TURN_GROUP_BUSY)
        return total

    def light_beside_better(self, client_id: int) -> bool:
        """May this light client of a worse class co-run beside a busy better one?"""
        demand = self.reports.get(client_id)
        return demand is not None and demand.busy < CLASS_CORUN_BUSY

    def recent_drain(self, client_id: int, now: float) -> float:
        seconds, when = self.drain.get(client_id, (0.0, now))
        return seconds if now - when < CLASS_DRAIN_MEMORY_SEC else 0.0

    def pause_to_keep(self, holder_id: int, waiters: list[int], now: float) -> float | None:
        """The holder's mean pause, where the idle time of its turn is better kept for it than
        lent to these waiters of its class: one of them is busy (it will not lend back) and its
        recent drain is more than LEND_DRAIN_PAUSES of those pauses. None (lend) otherwise, and
        where the holder has not reported."""
        demand = self.reports.get(holder_id)
        if demand is None:
            return None
        for cid in waiters:
            report = self.reports.get(cid)
            if report is not None and report.busy >= TURN_BUSY \
                    and self.recent_drain(cid, now) > LEND_DRAIN_PAUSES * demand.gap:
                return demand.gap
        return None

    def leaves_idle_time(self, holder: ClientInfo,
                         queue: Mapping[int, tuple[ClientInfo, float]], now: float) -> bool:
        """May a worse class waiting in `queue` have this holder's idle time? Only the long idle
        stretches of a holder that is not busy most of the time: once told LOCK_CONTENDED the
        hook gives the lock back after each idle threshold, even between two kernels, and taking
        it back waits for the worse job's kernel in flight. A holder that has not reported keeps
        the GPU, and so does one whose pauses are short against the worse waiters' drains
        (CLASS_IDLE_DRAIN_FACTOR)."""
        demand = self.reports.get(holder.client_id)
        if demand is None or not (demand.busy < TURN_BUSY or demand.gap >= TURN_GAP_SEC):
            return False
        drain = max((self.recent_drain(cid, now) for cid, (c, _) in queue.items()
                     if c.rank > holder.rank), default=0.0)
        return demand.gap >= CLASS_IDLE_DRAIN_FACTOR * drain
