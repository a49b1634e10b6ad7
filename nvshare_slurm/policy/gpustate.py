"""Per-GPU state and the scheduling policy, as pure logic.

A GpuState is one GPU's turn policy. It owns the GPU's lock record (GpuLock, gpulock.py: holders,
FIFO queue, a gang's turn), its memory accounting (GpuMemory, gpumemory.py: usage sums,
admission, held allocations, swap-outs) and what its clients ask of it (GpuDemand, demand.py),
and decides from them who holds the GPU when. Every event (request, release, memory update,
disconnect, settings change, timer tick) takes `now` from the caller and returns a list of
Actions (grant, contended, drop, swap out, memory reply...) for the daemon to send. No sockets
and no clock here, so tests drive the policy with a fake clock.

Modes (docs/protocol.md "Scheduling modes"):
- concurrent: one exclusive holder, FIFO; LOCK_CONTENDED as soon as someone waits; DROP_LOCK
  (TIMESLICE) after one switch interval of holding while others wait; nobody dropped otherwise.
- serial: the lock belongs to one job (SHARED grants to all its clients); the next job gets it when
  the holder job's clients are all gone, or after max_runtime_sec of holding while others wait.
- auto: while the memory of every client fits the usable memory, auto_share decides:
  adaptive (default): from each client's demand (DEMAND reports of the hook: busy share, burst and
  gap lengths; GpuDemand, demand.py) the clients that gain from exclusive turns take them (busy
  most of the time, or long bursts with long gaps: two compute-bound jobs measured 1.005x serial
  in turns against 1.085x co-running on an H100); every other client co-runs with whoever holds
  the GPU (the hardware time-slices contexts), so an interactive step or a short-burst job never
  waits for a turn. With at most one turn-taker everyone co-runs. A client that has not reported
  yet counts as a turn-taker; a bursty one co-runs when the others' turns would cost it more
  than co-running (demand.py's cost rule). turns: the concurrent rules for all (switch interval
  floor switch_time_min); corun: SHARED grants to all. Once memory does not fit: the concurrent
  rules with swap (co-runners beyond the oldest get DROP_LOCK(MEMORY)); in adaptive, clients
  that gain nothing by turns and whose memory is resident co-run beside them (turn_holders).

Share classes (priority.py; docs/design-scheduler.md "Priority classes"): the FIFO is ordered by
class, FIFO within one. A better class at the head takes the GPU from a worse exclusive holder at
once; in adaptive only the best class among the turn-takers that want the GPU takes turns, worse
ones (light ones too, unless busy below CLASS_CORUN_BUSY) wait and a holder among them is dropped
at once. A holder with only worse waiters is never
time-sliced; it is told LOCK_CONTENDED only when its demand shows long pauses. Swap candidates are
taken lowest class first.

Gangs (gang.py): the clients of a job placed on several GPUs wait in the lock's `gang_queue`,
never in the FIFO, and are granted only during their gang's turn (the lock's `turn`), which
gang.py claims, starts and ends on all of the gang's GPUs together (GpuLock's turn methods, and
end_turn here for the drops). While the gang has work here, nobody else is granted here.

Swap (docs/protocol.md "Swap"): a grant waits until the grantee's swapped memory fits the room
(GpuMemory makes it, and in turns offers it to the next waiter: PREFETCH). The holder's DROP_LOCK
carries the bytes it must move out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..wire.proto import C
from .corunners import regrant, yields_beside
from .demand import Demand, GpuDemand
from .gpulock import GpuLock
from .gpumemory import GpuMemory, MemUsage
from .policytypes import (GANG_STEP_AFTER, GRANT, HANDOFF, Action, ClientInfo, GpuSettings,
                          Holder, MemDecision)
from .promptidle import grant_standing, prompt_idle
from .stoppedroom import StoppedRoom
from .turnloan import TurnLoans, keep_for


@dataclass
class GpuState:
    uuid: str
    index: int
    memory_total: int
    settings: GpuSettings = field(default_factory=GpuSettings)
    name: str = ""
    lock: GpuLock = field(default_factory=GpuLock)          # who holds it, who waits, a gang's turn
    contention_since: float | None = None   # when "held while others wait" began for this turn
    serial_job: int | None = None
    serial_expired: bool = False
    demand: GpuDemand = field(default_factory=GpuDemand)   # what each client asks of this GPU
    sharing: str = ""                      # how the GPU is shared now (status, metrics, log)
    sharing_reason: str = ""
    # (holder, next): the holder's DROP_LOCK came with a HANDOFF to that waiter, which may run as
    # soon as the holder is drained, before the daemon hears of it; so it is granted next.
    handoff: tuple[int, int] | None = None
    loans: TurnLoans = field(default_factory=TurnLoans)   # the rest of a turn given back idle
    stopped: StoppedRoom = field(default_factory=StoppedRoom)   # stopped clients' memory (issue 39)
    memory: GpuMemory = field(init=False, repr=False)    # reads this GpuState as its LockView

    def __post_init__(self) -> None:
        self.memory = GpuMemory(self)

    # --- read by the policy below, GpuMemory, gang.py, daemon.py and the tests ------------------

    @property
    def holders(self) -> dict[int, Holder]:
        return self.lock.holders

    @property
    def queue(self) -> dict[int, tuple[ClientInfo, float]]:
        return self.lock.queue

    @property
    def clients(self) -> dict[int, ClientInfo]:
        return self.lock.clients

    @property
    def usage(self) -> dict[int, MemUsage]:
        return self.memory.usage

    @property
    def sum_allocated(self) -> int:
        return self.memory.sum_allocated

    def client_state(self, client_id: int) -> str:
        return self.lock.client_state(client_id)

    def switch_interval(self) -> float:
        """Seconds an exclusive holder may keep the GPU while others wait."""
        s = self.settings
        if s.switch_time_mode == "fixed":
            return s.switch_time_fixed
        moved = self.memory.moved_by_switch()
        return max(s.switch_time_min, s.switch_time_multiplier * moved / s.swap_bandwidth)

    def mem_update(self, client: ClientInfo, now: float, allocated: int, fixed: int,
                   swapped: int, request: int = 0, flags: int = 0, token: int = 0,
                   driver_free: int = 0) -> tuple[list[Action], MemDecision | None]:
        """A MEM_UPDATE: record the usage; with request > 0 also decide the allocation. The
        decision is None for a report, and for a holder's request that waits for room: its
        answer comes later as a MEM_REPLY action carrying `token`."""
        self.lock.attach(client)
        decision = self.memory.update(client, now, allocated, fixed, swapped, request, flags, token,
                                      driver_free)
        return self._schedule(now), decision

    # --- lock events ---------------------------------------------------------------------------

    def request(self, client: ClientInfo, now: float) -> list[Action]:
        self.lock.attach(client)
        cid = client.client_id
        holder = self.holders.get(cid)
        if holder is not None:
            if holder.drop_at is None:   # it lost track of its grant: say it again
                return [Action(GRANT, client, C.NVSHARE_GRANT_SHARED if holder.shared
                               else C.NVSHARE_GRANT_EXCLUSIVE, self._switch_ms(),
                               bursts=holder.bursts, yields=holder.yields)]
            return []
        self.lock.enqueue(client, now)
        self.demand.requested(cid, now)
        out: list[Action] = []
        loan = self.loans.lender_back(cid, now)
        if loan is not None and loan.lent:
            recall_loan(self, client, now, out)
        if cid in self.loans.first:
            self.lock.put_first(self.loans.first)
        return out + self._schedule(now)

    def release(self, client_id: int, now: float, idle: bool = False) -> list[Action]:
        """LOCK_RELEASED, whatever its flags (a NO_ROOM release too: the client asks again).
        `idle`: the hook gave it back idle (its IDLE flag): the rest of an exclusive turn is lent."""
        self.loans.released(client_id, now)
        holder = self.lock.released(client_id, idle)
        if holder is None:      # late (taken back); a stopped holder let run may now be asked
            return self._schedule(now) if self.stopped.released(client_id, self.memory) else []
        if idle:
            lend_rest_of_turn(self, holder, now)
        if holder.drop_at is not None and not holder.drop_bytes:   # a drain, not a swap
            self.demand.drained(client_id, now - holder.drop_at, now)
        if not self.holders:
            self.contention_since = None
        out = self._hand_over(client_id, now)
        return out + self._schedule(now)

    def remove_client(self, client_id: int, now: float) -> list[Action]:
        """The client is gone (disconnect, unregister): drop its lock, queue place and memory."""
        held, client = self.lock.forget(client_id)
        self.demand.forget(client_id)
        self.loans.forget(client_id)
        self.memory.forget(client_id, client, now)
        self.stopped.forget(client_id)
        if not self.holders:
            self.contention_since = None
        out = self._hand_over(client_id, now) if held else []
        if self.handoff is not None and client_id in self.handoff:
            self.handoff = None
        return out + self._schedule(now)

    def driver_seen(self, used: int, processes: dict[int, int], now: float) -> list[Action]:
        """A look at the driver's memory (NVML): used bytes, and each process's (pid -> bytes).
        Memory of an ended client counts until the driver releases it (drivermemory.py)."""
        out: list[Action] = []
        self.memory.driver_seen(used, processes, now, out)
        return out + self._schedule(now)

    def report_demand(self, client: ClientInfo, demand: Demand, now: float) -> list[Action]:
        """A DEMAND report: the client's share of turns may change (auto_share: adaptive)."""
        self.lock.attach(client)
        self.demand.report(client.client_id, demand, now)
        return self._schedule(now)

    def takes_turns(self, client_id: int) -> bool:
        return self.demand.takes_turns(client_id)

    def _bursts_note(self, corunners: set[int]) -> str:
        return ", their bursts take turns" if self.settings.burst_turns and len(corunners) >= 2 else ""

    def update_settings(self, settings: GpuSettings, now: float) -> list[Action]:
        self.settings = settings
        if settings.mode != "serial":
            self.serial_job, self.serial_expired = None, False
        return self._schedule(now, admin=True)

    def tick(self, now: float) -> list[Action]:
        return self._schedule(now)

    def next_deadline(self) -> float | None:
        """When tick() next has something to do (switch timer, max runtime, drop grace)."""
        s = self.settings
        deadlines = self.lock.deadlines(s.drop_grace_sec)
        turn = self.lock.turn
        if turn is not None and self.lock.turn_here():      # turn_here() is False without a turn
            others = any(h.client.job_id != turn.job_id and h.drop_at is None
                         for h in self.holders.values())
            if others and self.contention_since is not None:
                deadlines.append(self.contention_since + self.switch_interval())
        deadlines.extend(self.memory.deadlines())
        if s.adaptive and not self.lock.turn_here():
            deadlines.extend(self.demand.deadlines())   # the cost rule's silent waiters
        kept = self.loans.deadline()
        if kept is not None:
            deadlines.append(kept)
        if self.contention_since is not None and self.queue and not self.lock.turn_here():
            if s.mode == "serial":
                if not self.serial_expired:
                    deadlines.append(self.contention_since + s.max_runtime_sec)
            elif self.holders and not self._shared_ok() \
                    and not any(h.drop_at is not None for h in self.holders.values()):
                deadlines.append(self.contention_since + self.switch_interval())
        return min(deadlines) if deadlines else None

    # --- the policy ----------------------------------------------------------------------------

    def _switch_ms(self) -> int:
        return min(int(self.switch_interval() * 1000), 0xFFFFFFFF)

    def _shared_ok(self) -> bool:
        return self.settings.mode == "auto" and self.settings.auto_share == "corun" \
            and self.memory.fits()

    def _adaptive_ok(self) -> bool:
        return self.settings.adaptive and self.memory.fits()

    def _grant(self, client: ClientInfo, now: float, shared: bool, out: list[Action],
               no_room: int = 0, bursts: bool = False) -> None:
        bursts = bursts and shared and self.settings.burst_turns
        yields = not bursts and self.settings.burst_turns and \
            yields_beside(self.holders, client.client_id, prompt_idle(self, now))
        self.lock.add_holder(client, now, shared, bursts, yields)
        self.memory.granted(client.client_id)
        self.loans.granted(client.client_id, not shared, now, self.switch_interval())
        self.contention_since = None
        # Turns with swap: its memory is likely asked out at the end of this turn (SWAP_AHEAD).
        flags = C.NVSHARE_GRANT_SHARED if shared else 0 if self.memory.fits() else C.NVSHARE_GRANT_SWAP_AHEAD
        ahead = self.memory.overcommit(client.client_id) if flags == C.NVSHARE_GRANT_SWAP_AHEAD else 0
        out.append(Action(GRANT, client, flags, self._switch_ms(), no_room, bursts=bursts, yields=yields,
                          ahead=ahead))

    def _try_grant(self, client: ClientInfo, now: float, shared: bool,
                   out: list[Action]) -> bool:
        """Grant when the client's swapped memory fits the room, or when nothing more can move
        (stopped clients' memory counts as movable: stoppedroom.py). Otherwise withhold it (the
        rest of the pass makes room) and return False."""
        short = self.memory.short_of_room(client.client_id)
        if short > 0 and (self.memory.room_can_grow({client.client_id}, stopped=False)
                          or self.stopped.blocks(self.memory, self.clients, client, short)):
            self.memory.withhold(client.client_id, short)
            return False
        self._grant(client, now, shared, out, max(0, short))
        return True

    def _pass_turn(self, holder: Holder, successor: ClientInfo, now: float, out: list[Action],
                   move: int = 0) -> None:
        """DROP_LOCK(TIMESLICE): an exclusive turn passes to `successor`. When the switch moves no
        memory, both first hear of a HANDOFF: the holder's hook signals the successor's the moment
        its work is drained, so the GPU does not sit idle through the daemon's round trip
        (release, grant: about half a millisecond a turn on an H100)."""
        if self.settings.turn_handoff and not move and successor.client_id in self.queue \
                and not self.memory.use(successor.client_id).swapped:
            self.handoff = (holder.client.client_id, successor.client_id)
            out.append(Action(HANDOFF, successor, source=holder.client))
        self.lock.drop(holder, now, C.NVSHARE_DROP_TIMESLICE, out, move)

    def _may_take_turn(self, client_id: int, now: float) -> bool:
        """May this waiter be granted an exclusive turn now? Not while the GPU is kept for a
        holder that gave it back idle (turnloan.py), unless it is that holder."""
        kept = self.loans.kept_for(now)
        return kept is None or kept == client_id

    def _turn_clock(self, holder: Holder, now: float) -> float:
        """When the turn of `holder` began, for "held while others wait": now, or where a turn
        it was granted from a loan began (turnloan.py)."""
        began = self.loans.turn_began(holder.client.client_id)
        return now if began is None else began

    def _hand_over(self, client_id: int, now: float) -> list[Action]:
        """The holder whose turn passed by a HANDOFF let go (or is gone): its successor may run
        already, so it holds next, whatever changed meanwhile; a better class then takes the GPU
        from it as from any holder. A successor with memory in host memory never starts early
        (its hook waits for the grant), so it is left to the pass."""
        if self.handoff is None or self.handoff[0] != client_id:
            return []
        successor = self.handoff[1]
        self.handoff = None
        entry = self.queue.get(successor)
        if entry is None or self.memory.use(successor).swapped:
            return []
        out: list[Action] = []
        self._grant(entry[0], now, False, out)
        return out

    def _schedule(self, now: float, admin: bool = False) -> list[Action]:
        out: list[Action] = []
        self.demand.last_pass = now
        self.lock.unbench(now)          # penalties that are over: back in the queue (gpulock.py)
        self.memory.begin_pass()
        self.stopped.begin_pass(self.memory)
        self.memory.expire(now, out)
        # Holders run: their waiting allocations get the room before a new grant does.
        self.memory.answer_allocations(now, out)
        self.stopped.for_allocations(self.memory, self.clients)
        if self.lock.turn_here():
            self._schedule_turn(now, out)
            turn = self.lock.turn
            self._share("gang", f"job {turn.job_id}'s gang turn" if turn else "gang turn")
        elif self.settings.mode == "serial":
            schedule_serial(self, now, out, admin)
            self._share("serial", "mode serial: one job at a time")
        elif self._shared_ok():
            self._corun(now, out)
            self._share("corun", "auto_share corun, memory fits")
        elif self._adaptive_ok():
            self._schedule_adaptive(now, out)
        else:
            self._schedule_exclusive(now, out, admin)
            self.memory.prefetch(now, out)
            if self.settings.mode == "auto":
                self._share("turns", "auto_share turns" if self.memory.fits()
                            else "memory does not fit: turns with swap")
            else:
                self._share("turns", "mode concurrent")
        for holder, move in self.memory.make_room(now, out):
            self.lock.drop(holder, now, C.NVSHARE_DROP_MEMORY, out, move)
        self.stopped.end_pass(self.memory, self.clients)
        self.lock.report_unresponsive(now, self.settings.drop_grace_sec, out)
        return out

    # --- gang turns (the cross-GPU decisions are gang.py's) ------------------------------------

    def _schedule_turn(self, now: float, out: list[Action]) -> None:
        """The gang's GPU: others give way (at once when the gang already runs, else at the end
        of their switch interval); the gang's waiters here are granted SHARED together."""
        turn = self.lock.turn
        assert turn is not None
        others = [h for h in self.holders.values() if h.client.job_id != turn.job_id]
        mine = [c for c, _ in self.lock.gang_queue.values() if c.job_id == turn.job_id]
        if others:
            if not mine:
                return
            swapped = sum(self.memory.use(c.client_id).swapped for c in mine)
            need = max(0, swapped - self.memory.room())
            if self.contention_since is None:
                self.contention_since = now
            for holder in others:
                if holder.drop_at is not None:
                    continue
                if turn.started:
                    self.lock.drop(holder, now, C.NVSHARE_DROP_TIMESLICE, out, need)
                    continue
                self.lock.contend(holder, out)
                if now >= self.contention_since + self.switch_interval():
                    self.lock.drop(holder, now, C.NVSHARE_DROP_TIMESLICE, out, need)
            return
        self.contention_since = None
        if turn.started and not turn.grants and turn.steps_until is not None \
                and now < turn.steps_until:
            mine = [c for c, since in self.lock.gang_queue.values()
                    if c.job_id == turn.job_id and now >= since + GANG_STEP_AFTER]
        elif not (turn.started and turn.grants):
            return
        for client in mine:
            if not self._try_grant(client, now, True, out):
                break
            turn.used = True
            if not turn.grants:
                # One step: the gate opens for what the rank waited to launch (its half of the
                # collective), then closes behind it. It moves no memory out: a rank catching up
                # op by op would otherwise swap in and out at every step. Room for whoever comes
                # next is made at the hand-over, as for any idle client.
                self.lock.drop(self.holders[client.client_id], now, C.NVSHARE_DROP_TIMESLICE, out)

    # What gang.py asks of this GPU's policy (the turn's record is self.lock's).

    def waits_for_room(self) -> bool:
        """Did this GPU's last pass withhold a grant until memory moves out?"""
        return self.memory.withheld is not None

    def end_turn(self, now: float) -> list[Action]:
        """The end of the gang's turn: no more grants here, and DROP_LOCK(TIMESLICE) to its
        holders, each with its share of what the waiting single-GPU clients' swapped memory
        lacks. The GPU stays the gang's until gang.py releases the turn."""
        turn = self.lock.turn
        assert turn is not None
        self.lock.stop_grants()
        holders = [h for h in self.lock.job_holders(turn.job_id) if h.drop_at is None]
        moves = self.memory.holder_moves(self.memory.holder_must_move(), holders)
        out: list[Action] = []
        for holder in holders:
            self.lock.drop(holder, now, C.NVSHARE_DROP_TIMESLICE, out,
                           moves.get(holder.client.client_id, 0))
        return out

    def _corun(self, now: float, out: list[Action], skip: set[int] | None = None,
               takers: set[int] | None = None) -> None:
        """Grant every waiter SHARED. With `takers` (adaptive), the others' bursts take turns."""
        # Everything fits, swapped memory included: each grantee brings its own back.
        for client, _ in list(self.queue.values()):
            if not skip or client.client_id not in skip:
                self._grant(client, now, True, out,
                            bursts=takers is not None and client.client_id not in takers)
        self.contention_since = None

    def _share(self, sharing: str, reason: str) -> None:
        self.sharing, self.sharing_reason = sharing, reason

    def _schedule_adaptive(self, now: float, out: list[Action]) -> None:
        """Memory fits: turn-takers take exclusive turns among themselves, the rest co-run.

        Classes: only the best class among the turn-takers that want the GPU takes turns; worse
        clients wait (a holder among them is dropped at once) until no better one wants it, except
        light ones below CLASS_CORUN_BUSY, which co-run whatever their class."""
        bursty_busy = self.demand.update_group(self.settings.burst_turns, self.clients)
        wanting = set(self.queue) | set(self.holders)
        takers = self.demand.takers(self.clients, self.switch_interval(), now)
        ranked, best = self.demand.best_class(takers, wanting, self.clients, now)
        outranked = {cid for cid in wanting
                     if best is not None and cid in self.clients and self.clients[cid].rank > best
                     and (cid in takers or not self.demand.light_beside_better(cid))}
        for cid in outranked:
            holder = self.holders.get(cid)
            if holder is not None and holder.drop_at is None:
                self.lock.drop(holder, now, C.NVSHARE_DROP_TIMESLICE, out)
        takers -= outranked
        wanting |= grant_standing(self, takers, best, now, out)   # prompt ones that gave it back idle
        wait_note = f", {len(outranked)} of a lower class wait" if outranked else ""
        co_runners = wanting - takers - outranked
        if len(takers) <= 1:
            self._corun(now, out, skip=outranked, takers=takers)
            self._regrant_co_runners(takers, now, out)
            # The best class holding: a turn-taker, or one still settling that reads light (the
            # worse ones wait for it, so it too gives them its idle time).
            running = [h for cid, h in self.holders.items() if h.drop_at is None and cid in self.clients
                       and (cid in takers or (cid in ranked and self.clients[cid].rank == best))]
            if running and outranked & set(self.queue) \
                    and self.demand.leaves_idle_time(running[0].client, self.queue, now):
                self.lock.contend(running[0], out)   # it gives the GPU back once idle
            self._share("corun", ("at most one busy client" if wanting else "idle")
                        + self._bursts_note(co_runners) + wait_note)
            return
        light = len(co_runners)
        overlap = (f", bursts busy {bursty_busy:.0%} together" if self.demand.group_turns
                   and self.demand.any_bursty(takers) else "")
        self._share("turns", f"{len(takers)} busy clients take turns" + overlap
                             + (f", {light} light co-run" if light else "")
                             + self._bursts_note(co_runners) + wait_note)
        turn_began = self.contention_since    # a co-runner's grant does not restart the turn
        for cid, (client, _) in list(self.queue.items()):
            if cid not in takers and cid not in outranked:
                self._grant(client, now, True, out, bursts=True)
        self.contention_since = turn_began
        turn_holders = [h for cid, h in self.holders.items() if cid in takers]
        running = [h for h in turn_holders if h.drop_at is None]
        for holder in running[1:]:
            # A co-runner that became busy while another busy one holds: the oldest keeps its turn.
            self.lock.drop(holder, now, C.NVSHARE_DROP_TIMESLICE, out)
        self._regrant_co_runners(takers, now, out)
        rivals = [cid for cid in self.queue if cid in takers]
        if not turn_holders and rivals and self._may_take_turn(rivals[0], now):
            self._try_grant(self.queue[rivals[0]][0], now, False, out)
            turn_holders = [h for cid, h in self.holders.items() if cid in takers]
            running = [h for h in turn_holders if h.drop_at is None]
            rivals = [cid for cid in self.queue if cid in takers]
        if not running or not self.queue:
            self.contention_since = None
            return
        holder = running[0]
        if not rivals:        # only lower classes wait: no timeslice, it gives way once idle
            if self.demand.leaves_idle_time(holder.client, self.queue, now):
                self.lock.contend(holder, out)
            self.contention_since = None
            return
        self.lock.contend(holder, out)
        if self.contention_since is None:
            self.contention_since = self._turn_clock(holder, now)
        if now >= self.contention_since + self.switch_interval():
            self._pass_turn(holder, self.queue[rivals[0]][0], now, out)

    def _regrant_co_runners(self, takers: set[int], now: float, out: list[Action]) -> None:
        if self.settings.burst_turns:     # corunners.py: BURSTS for co-runners, YIELD beside them
            regrant(self.holders, takers, self._switch_ms(), out, prompt_idle(self, now))

    def _schedule_exclusive(self, now: float, out: list[Action], admin: bool) -> None:
        holders = turn_holders(self, now, out)      # adaptive: who gains nothing by turns co-runs
        if len(holders) > 1:
            # Co-runners no longer fit (or the mode changed): the turn holder keeps it, else the oldest
            # that does not give way for its own allocation (gpumemory._gives_way); the rest requeue,
            # beside a turn holder with their memory resident (make_room moves it).
            holders.sort(key=lambda h: (h.shared, self.memory.yielding(h.client.client_id)))
            memory = not admin and self.settings.mode == "auto"
            reason = C.NVSHARE_DROP_MEMORY if memory else C.NVSHARE_DROP_ADMIN
            moves = memory and holders[0].shared
            for holder in holders[1:]:
                if holder.drop_at is None:
                    move = self.memory.use(holder.client.client_id).swappable if moves else 0
                    self.lock.drop(holder, now, reason, out, move)
        head = None if holders else self.memory.first_to_run(lambda c: self._may_take_turn(c, now))
        if head is not None and self._may_take_turn(head.client_id, now) \
                and self._try_grant(head, now, False, out):
            holders = [self.holders[head.client_id]]
        if not holders or not self.queue:
            self.contention_since = None
            return
        if self.contention_since is None:
            self.contention_since = self._turn_clock(holders[0], now)
        if len(holders) == 1:
            holder = holders[0]
            if holder.drop_at is None:
                head = next(iter(self.queue.values()))[0]
                if head.rank > holder.client.rank:
                    # Only worse classes wait: they get the time it leaves idle, never a timeslice
                    # (nor that time when it would cost a swap each way).
                    if not self.memory.switch_moves_memory() \
                            and self.demand.leaves_idle_time(holder.client, self.queue, now):
                        self.lock.contend(holder, out)
                    self.contention_since = None
                    return
                if not self.memory.switch_moves_memory():
                    self.lock.contend(holder, out)
                if head.rank < holder.client.rank \
                        or now >= self.contention_since + self.switch_interval():
                    self._pass_turn(holder, head, now, out, self.memory.holder_must_move())

    # --- status --------------------------------------------------------------------------------

    def status(self, now: float, rogue: list[dict[str, int]], jobs: list[int]) -> dict[str, Any]:
        s = self.settings
        return {
            "index": self.index, "uuid": self.uuid, "name": self.name,
            **self.memory.status(),
            "mode": s.mode,
            "switch_time": "auto" if s.switch_time_mode == "auto" else float(s.switch_time_fixed),
            "switch_interval_sec": round(self.switch_interval(), 3),
            "max_runtime_sec": int(s.max_runtime_sec),
            "memory_reserve_percent": int(s.memory_reserve_percent),
            "co_running": sum(1 for h in self.holders.values() if h.drop_at is None) > 1,
            "sharing": sharing_now(self)[0], "sharing_reason": sharing_now(self)[1],
            **self.lock.status(now), "jobs": jobs, "rogue": rogue, **self.stopped.status(),
        }


def turn_holders(gpu: GpuState, now: float, out: list[Action]) -> list[Holder]:
    """Memory does not fit (auto, adaptive): turns with swap, but a client that gains nothing by
    them co-runs beside whoever holds, as while memory fits (SHARED | BURSTS): light by its own
    demand, or bursty and losing more by waiting for the others' turns than by co-running
    (demand.py's cost rule), with its memory resident (one swapped out takes its turn to bring it
    back), not outranked (a worse class co-runs only below CLASS_CORUN_BUSY), and only while
    the largest turn-taker's memory fits beside all the co-runners' (no turn's swap ever needs
    theirs). Grants those that wait; returns the other holders, who take the turns."""
    s, mem, clients = gpu.settings, gpu.memory, gpu.clients
    if not s.adaptive:
        return list(gpu.holders.values())
    takers = gpu.demand.takers(clients, gpu.switch_interval(), now)
    wanting = set(gpu.queue) | set(gpu.holders)
    best = gpu.demand.best_class(takers, wanting, clients, now)[1]
    beside = {cid for cid in wanting - takers if cid in clients and not mem.use(cid).swapped
              and (best is None or clients[cid].rank <= best or gpu.demand.light_beside_better(cid))}
    largest = max((mem.use(cid).allocated + mem.use(cid).swapped
                   for cid in (takers | wanting) - beside), default=0)
    if beside and sum(mem.use(cid).allocated for cid in beside) + largest > mem.usable:
        beside = set()
    if beside:
        gpu._regrant_co_runners(set(gpu.holders) - beside, now, out)
        turn_began = gpu.contention_since    # a co-runner's grant does not restart the turn
        for cid in [cid for cid in gpu.queue if cid in beside]:
            gpu._grant(gpu.queue[cid][0], now, True, out, bursts=True)
        gpu.contention_since = turn_began
    return [h for cid, h in gpu.holders.items() if cid not in beside]


def sharing_now(gpu: GpuState) -> tuple[str, str]:
    """(corun | turns | gang | serial, why); before the first decision, what the policy would
    choose for the next client, never the mode's name (status and metrics show this)."""
    if gpu.sharing:
        return gpu.sharing, gpu.sharing_reason
    s = gpu.settings
    if s.mode == "serial":
        return "serial", "mode serial: one job at a time"
    if s.mode == "concurrent":
        return "turns", "mode concurrent"
    if s.auto_share == "turns":
        return "turns", "auto_share turns"
    return "corun", "idle"


def schedule_serial(gpu: GpuState, now: float, out: list[Action], admin: bool) -> None:
    """Mode serial: the lock belongs to one job at a time (see the module's docstring)."""
    job = gpu.serial_job
    if job is not None and not gpu.lock.attached.get(job):
        job = None
    if job is not None and gpu.serial_expired and not gpu.holders:
        job = None
    if job is None:
        gpu.serial_expired = False
        gpu.contention_since = None
        if gpu.holders:      # mode just changed to serial: the oldest holder's job keeps it
            job = next(iter(gpu.holders.values())).client.job_id
        elif gpu.queue:
            job = next(iter(gpu.queue.values()))[0].job_id
        gpu.serial_job = job
        if job is None:
            return
    for holder in list(gpu.holders.values()):
        if holder.client.job_id != job and holder.drop_at is None:
            gpu.lock.drop(holder, now, C.NVSHARE_DROP_ADMIN, out)
    if not gpu.serial_expired:
        for client, _ in [entry for entry in gpu.queue.values() if entry[0].job_id == job]:
            if not gpu._try_grant(client, now, True, out):
                break
    # Classes, as in the other modes: only worse jobs waiting never end the job's turn; a
    # better one ends it at once (the queue is ordered by class, so it is the next job).
    rank = gpu.lock.job_rank(job)
    waiting = [entry[0].rank for entry in gpu.queue.values() if entry[0].job_id != job]
    if not any(r <= rank for r in waiting):
        gpu.contention_since = None
        return
    if gpu.contention_since is None:
        gpu.contention_since = now
    better_waits = any(r < rank for r in waiting)
    if not gpu.serial_expired and (better_waits or now >= gpu.contention_since
                                    + gpu.settings.max_runtime_sec):
        gpu.serial_expired = True
        holders = [h for h in gpu.holders.values() if h.drop_at is None]
        moves = gpu.memory.holder_moves(gpu.memory.next_job_needs(job), holders)
        for holder in holders:
            gpu.lock.drop(holder, now, C.NVSHARE_DROP_MAX_RUNTIME, out,
                           moves.get(holder.client.client_id, 0))
        if not gpu.holders:
            # Attached, holding nothing: no release or deadline will hand the GPU on. Begin now.
            schedule_serial(gpu, now, out, admin)



def lend_rest_of_turn(gpu: GpuState, holder: Holder, now: float) -> None:
    """An exclusive holder gave the GPU back idle while others of its class wait: the rest of its
    turn stays its own, lent or kept for it (turnloan.py, demand.py's pause_to_keep). Not in
    serial mode or a gang's turn, nor where memory must move at a switch or a better class waits."""
    cid, rank = holder.client.client_id, holder.client.rank
    if holder.shared or holder.drop_at is not None or gpu.contention_since is None \
            or gpu.settings.mode == "serial" or gpu.lock.turn_here() \
            or holder.client.job_id in gpu.lock.gang_jobs or not gpu.memory.fits() \
            or gpu.loans.active(now) is not None:    # a borrower's: the turn stays lent
        return
    until = gpu.contention_since + gpu.switch_interval()
    rivals = [c for c, (info, _) in gpu.queue.items() if c != cid and info.rank == rank]
    if until > now and rivals and all(info.rank >= rank for info, _ in gpu.queue.values()):
        pause = gpu.demand.pause_to_keep(cid, rivals, now)
        gpu.loans.give_back(cid, now, until, None if pause is None else keep_for(pause))


def recall_loan(gpu: GpuState, lender: ClientInfo, now: float, out: list[Action]) -> None:
    """The lender asks again within its turn: the borrowers that still run are dropped (with
    a HANDOFF to it where no memory moves) and it holds next. A lender that co-runs now
    (adaptive: it no longer takes turns) needs nobody dropped."""
    if gpu._adaptive_ok() and not gpu.takes_turns(lender.client_id):
        return
    loan = gpu.loans.active(now)
    if loan is None or not loan.lent:
        return
    for cid in sorted(loan.borrowers):
        holder = gpu.holders.get(cid)
        if holder is not None and not holder.shared and holder.drop_at is None:
            gpu._pass_turn(holder, lender, now, out)
