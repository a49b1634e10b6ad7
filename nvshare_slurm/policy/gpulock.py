"""Who holds one GPU's lock and who waits for it, as a record: the holders, the FIFO queue (best
class first, FIFO within a class), the clients attached here, and a gang's turn here.

Its methods change the record and return or append the Action that tells a client (DROP_LOCK,
LOCK_CONTENDED, UNRESPONSIVE); when to call them is the policy's (gpustate.py). gang.py changes a
GPU's part of a gang turn only through the turn methods below. No clock, no I/O.

Fairness between users (issue 25): the FIFO is round robin over owners (a client's uid) within a
class, so one user's many clients take one turn per round, not one each. An owner whose holder
does not release within its drain grace after DROP_LOCK loses its place: its clients here wait
benched, granted nothing, for drop_grace_sec after its first miss, doubling with each further
miss within MISS_MEMORY_SEC (at most PENALTY_MAX_SEC), and an owner with recent misses gets a
shorter grace (halved per miss, at least MIN_GRACE_SEC). So a user's unresponsive clients cost the
others one grace now and then, however many they are. A holder asked to move memory out with its
DROP_LOCK has longer, by what it moves (policytypes.move_grace).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..base.priority import RANK
from .policytypes import CONTENDED, DROP, UNRESPONSIVE, Action, ClientInfo, Holder, Turn, move_grace

MISS_MEMORY_SEC = 3600.0        # misses older than this are forgotten
PENALTY_MAX_SEC = 3600.0        # the longest an owner waits benched
MIN_GRACE_SEC = 1.0             # the shortest drain grace of an owner with recent misses
MAX_OWNERS_KEPT = 4096          # owners with a miss remembered, at most


def owner(client: ClientInfo) -> object:
    """Whose a client is, for fairness: its uid (the daemon's RegisteredClient); a ClientInfo
    without one (the policy's tests) is its own owner."""
    uid = getattr(client, "uid", None)
    return uid if uid is not None else ("client", client.client_id)


@dataclass
class GpuLock:
    holders: dict[int, Holder] = field(default_factory=dict)
    queue: dict[int, tuple[ClientInfo, float]] = field(default_factory=dict)   # FIFO by insertion
    clients: dict[int, ClientInfo] = field(default_factory=dict)              # attached here
    attached: dict[int, dict[int, ClientInfo]] = field(default_factory=dict)   # job -> clients here
    gang_jobs: set[int] = field(default_factory=set)        # jobs that take gang turns here
    outside_jobs: set[int] = field(default_factory=set)     # gangs whose drains wait on other nodes
    gang_queue: dict[int, tuple[ClientInfo, float]] = field(default_factory=dict)  # their waiters
    turn: Turn | None = None
    # Unresponsive owners: their clients' requests wait here, never granted, until penalty_until.
    benched: dict[int, tuple[ClientInfo, float]] = field(default_factory=dict)
    misses: dict[object, list[float]] = field(default_factory=dict)   # owner -> missed drops
    penalty_until: dict[object, float] = field(default_factory=dict)
    # Gave their last lock back idle, undropped: a prompt one is granted again unasked (promptidle.py)
    gave_back_idle: set[int] = field(default_factory=set)

    # --- clients -------------------------------------------------------------------------------

    def attach(self, client: ClientInfo) -> None:
        self.attached.setdefault(client.job_id, {})[client.client_id] = client
        self.clients[client.client_id] = client

    def enqueue(self, client: ClientInfo, now: float) -> None:
        """The client waits: a gang's client in gang_queue, anyone else in the FIFO; a client
        whose owner is benched waits benched."""
        cid = client.client_id
        self.gave_back_idle.discard(cid)       # it asks: granted as any waiter
        if self.penalty_until.get(owner(client), 0.0) > now:
            if cid not in self.benched and cid not in self.queue and cid not in self.gang_queue:
                self.benched[cid] = (client, now)
            return
        waiting = self.gang_queue if client.job_id in self.gang_jobs else self.queue
        if cid not in waiting:
            if waiting is self.queue:
                self._enqueue_fair(client, now)
            else:
                waiting[cid] = (client, now)

    def _enqueue_fair(self, client: ClientInfo, now: float) -> None:
        """Into the FIFO by (class, how many of its owner's clients hold or wait ahead of it): a
        better class ahead of worse ones, and round robin over owners within a class (FIFO among
        the clients of one owner, and among owners' clients of the same round)."""
        self.queue[client.client_id] = (client, now)
        if len(self.queue) == 1:
            return
        counts: dict[object, int] = {}
        for holder in self.holders.values():
            who = owner(holder.client)
            counts[who] = counts.get(who, 0) + 1
        keys: dict[int, tuple[int, int]] = {}
        for cid, (c, _) in self.queue.items():
            who = owner(c)
            keys[cid] = (c.rank, counts.get(who, 0))
            counts[who] = counts.get(who, 0) + 1
        ordered = list(keys.values())
        if all(a <= b for a, b in zip(ordered, ordered[1:], strict=False)):
            return                                     # already in order: no sort
        self.queue = dict(sorted(self.queue.items(), key=lambda item: keys[item[0]]))

    def forget(self, client_id: int) -> tuple[bool, ClientInfo | None]:
        """The client is gone: its lock, queue place and attachment. Returns whether it held the
        lock, and the client when it was attached."""
        held = self.holders.pop(client_id, None) is not None
        self.gave_back_idle.discard(client_id)
        self.queue.pop(client_id, None)
        self.gang_queue.pop(client_id, None)
        self.benched.pop(client_id, None)
        client = self.clients.pop(client_id, None)
        if client is not None:
            clients = self.attached.get(client.job_id, {})
            clients.pop(client_id, None)
            if not clients:
                self.attached.pop(client.job_id, None)
        return held, client

    def withdraw(self, client_id: int) -> bool:
        """The client waits no more (its job is suspended): out of every queue, still attached.
        Whether it waited."""
        waited = False
        self.gave_back_idle.discard(client_id)    # granted nothing unasked while suspended
        for waiting in (self.queue, self.gang_queue, self.benched):
            waited = waiting.pop(client_id, None) is not None or waited
        return waited

    def released(self, client_id: int, idle: bool) -> Holder | None:
        """LOCK_RELEASED: it holds no more (its Holder, None when it did not hold). Given back
        `idle` (its IDLE flag), undropped and asked for, it may hold a standing grant next; a
        standing grant given back idle is not renewed (no grant and release in a loop)."""
        holder = self.holders.pop(client_id, None)
        if holder is not None and idle and holder.drop_at is None and not holder.standing:
            self.gave_back_idle.add(client_id)
        else:
            self.gave_back_idle.discard(client_id)
        return holder

    def put_first(self, order: list[int]) -> None:
        """Those of `order` that wait go first in the queue, in that order, behind only the
        waiters of a better class (turnloan.py: a lender back within its turn, then borrowers)."""
        firsts = [cid for cid in order if cid in self.queue]
        if not firsts:
            return
        rank = min(self.queue[cid][0].rank for cid in firsts)
        ahead = [cid for cid, (c, _) in self.queue.items() if c.rank < rank and cid not in firsts]
        rest = [cid for cid in self.queue if cid not in firsts and cid not in ahead]
        self.queue = {cid: self.queue[cid] for cid in ahead + firsts + rest}

    def head(self) -> ClientInfo | None:
        return next(iter(self.queue.values()))[0] if self.queue else None

    def job_rank(self, job: int) -> int:
        """The class rank of a job's clients here (one class per job), also while they neither
        hold nor wait; normal when none is known."""
        return next((c.rank for c in self.attached.get(job, {}).values()), RANK["normal"])

    def client_state(self, client_id: int) -> str:
        holder = self.holders.get(client_id)
        if holder is not None:
            return "dropping" if holder.drop_at is not None else "holding"
        return "waiting" if client_id in self.queue or client_id in self.gang_queue \
            or client_id in self.benched else "idle"

    # --- holders -------------------------------------------------------------------------------

    def add_holder(self, client: ClientInfo, now: float, shared: bool, bursts: bool,
                   yields: bool = False) -> None:
        """The client holds the lock now (its GRANT is the caller's: it carries the switch
        interval from after this change)."""
        self.queue.pop(client.client_id, None)
        self.gang_queue.pop(client.client_id, None)
        self.holders[client.client_id] = Holder(client, now, shared, bursts, yields)

    def drop(self, holder: Holder, now: float, reason: int, out: list[Action],
             move: int = 0) -> None:
        holder.drop_at, holder.drop_reason, holder.drop_bytes = now, reason, move
        out.append(Action(DROP, holder.client, 0, reason, move))

    def contend(self, holder: Holder, out: list[Action]) -> None:
        """LOCK_CONTENDED, once per turn: give the GPU back once idle."""
        if not holder.contended:
            holder.contended = True
            out.append(Action(CONTENDED, holder.client))

    def job_holders(self, job_id: int) -> list[Holder]:
        return [h for h in self.holders.values() if h.client.job_id == job_id]

    def contend_job(self, job_id: int) -> list[Action]:
        """LOCK_CONTENDED to the job's holders not told yet: give the GPU back once idle."""
        out: list[Action] = []
        for holder in self.job_holders(job_id):
            if holder.drop_at is None:
                self.contend(holder, out)
        return out

    def mark_stuck(self, client_id: int, now: float) -> bool:
        """DRAIN_STUCK from a holder: its grace restarts (it is not unresponsive while it says
        so). False when the client holds nothing here."""
        holder = self.holders.get(client_id)
        if holder is None:
            return False
        holder.stuck_at = now
        holder.unresponsive_reported = False
        return True

    def presume_stuck(self, client_id: int, now: float) -> None:
        """A gang's holder that has not released long after DROP_LOCK while its peers wait (a
        hook that never sends DRAIN_STUCK): its drain counts as stuck from now, as if it had
        said so (unlike mark_stuck, an unresponsive report already made stands)."""
        self.holders[client_id].stuck_at = now

    def report_unresponsive(self, now: float, grace: float, out: list[Action]) -> None:
        """UNRESPONSIVE, once, for each holder not released within its grace (grace_for) after
        its DROP_LOCK (or its latest DRAIN_STUCK); its owner loses its place (penalize)."""
        for holder in self.holders.values():
            since = holder.grace_from()
            if holder.client.job_id in self.outside_jobs:
                continue    # its drain waits for its ranks on other nodes: revoked, it would run
            #                 ungated beside the next holder (docs/design-scheduler.md)
            if since is not None and not holder.unresponsive_reported \
                    and now >= since + self.holder_grace(holder, grace):
                holder.unresponsive_reported = True
                self.penalize(holder.client, now, grace)
                out.append(Action(UNRESPONSIVE, holder.client, 0, holder.drop_reason))

    def grace_for(self, client: ClientInfo, grace: float) -> float:
        """The drain grace of a client: drop_grace_sec, halved for each recent miss of its owner
        (at least MIN_GRACE_SEC, never more than drop_grace_sec)."""
        missed = len(self.misses.get(owner(client), ()))
        return grace if not missed else min(grace, max(MIN_GRACE_SEC, grace / (1 << min(missed, 30))))

    def holder_grace(self, holder: Holder, grace: float) -> float:
        """How long a holder may take to release after its DROP_LOCK: its owner's grace, and
        the time to move out what that DROP_LOCK asked (move_grace)."""
        return self.grace_for(holder.client, grace) + move_grace(holder.drop_bytes)

    def penalize(self, client: ClientInfo, now: float, grace: float) -> float:
        """A missed drop of client's owner: bench its waiting clients for drop_grace_sec, doubled
        for each earlier miss within MISS_MEMORY_SEC (at most PENALTY_MAX_SEC). The seconds."""
        who = owner(client)
        recent = [t for t in self.misses.get(who, []) if now - t < MISS_MEMORY_SEC][-16:]
        recent.append(now)
        if who not in self.misses and len(self.misses) >= MAX_OWNERS_KEPT:
            self.forget_misses(now)
        self.misses[who] = recent
        period = min(PENALTY_MAX_SEC, max(grace, MIN_GRACE_SEC) * (1 << (len(recent) - 1)))
        self.penalty_until[who] = max(self.penalty_until.get(who, 0.0), now + period)
        for waiting in (self.queue, self.gang_queue):
            for cid, entry in [(c, e) for c, e in waiting.items() if owner(e[0]) == who]:
                del waiting[cid]
                self.benched[cid] = entry
        return period

    def penalty_left(self, client: ClientInfo, now: float) -> float:
        return max(0.0, self.penalty_until.get(owner(client), 0.0) - now)

    def unbench(self, now: float) -> None:
        """Owners whose penalty is over: their benched clients wait in the queue again (at its
        end, in the order they asked)."""
        over = [who for who, until in self.penalty_until.items() if until <= now]
        for who in over:
            del self.penalty_until[who]
        if not over or not self.benched:
            return
        back = [e for e in self.benched.values() if owner(e[0]) in over]
        for client, _ in back:
            del self.benched[client.client_id]
            self.enqueue(client, now)

    def forget_misses(self, now: float) -> None:
        """Drop the misses older than MISS_MEMORY_SEC (and owners left with none)."""
        for who in list(self.misses):
            kept = [t for t in self.misses[who] if now - t < MISS_MEMORY_SEC]
            if kept:
                self.misses[who] = kept
            else:
                del self.misses[who]

    def deadlines(self, grace: float) -> list[float]:
        """When a holder's drain grace runs out, when a benched owner may wait in the queue
        again, and when gang.py next needs a pass."""
        found = [since + self.holder_grace(h, grace) for h in self.holders.values()
                 if (since := h.grace_from()) is not None and not h.unresponsive_reported]
        if self.benched:
            found.extend(until for who, until in self.penalty_until.items()
                         if any(owner(c) == who for c, _ in self.benched.values()))
        if self.turn is not None and self.turn.deadline is not None:
            found.append(self.turn.deadline)
        return found

    # --- a gang's turn here (gang.py's decisions, made on all the gang's GPUs together) ---------

    def join_gang(self, job_id: int, waits_outside: bool = False) -> None:
        """The job takes gang turns here: its clients wait in gang_queue, never in the FIFO.
        waits_outside: a multi-node job, whose drains wait for its ranks on other nodes: its
        holders are never taken as unresponsive (report_unresponsive)."""
        self.gang_jobs.add(job_id)
        if waits_outside:
            self.outside_jobs.add(job_id)

    def leave_gang(self, job_id: int) -> None:
        """The job is gone: no more gang turns here, and its turn, if it has one, is over."""
        self.gang_jobs.discard(job_id)
        self.outside_jobs.discard(job_id)
        if self.turn is not None and self.turn.job_id == job_id:
            self.turn = None

    def claim_turn(self, job_id: int) -> None:
        """The gang claims this GPU: from its first work here nobody else is granted here."""
        self.turn = Turn(job_id)

    def start_turn(self) -> None:
        """The gang runs: its waiters here are granted, and a request of its own drops others."""
        assert self.turn is not None
        self.turn.started = True

    def stop_grants(self) -> None:
        """The gang's turn ends: no more grants here until resume_turn() or its next turn."""
        assert self.turn is not None
        self.turn.grants = False

    def resume_turn(self) -> None:
        """A drain of the gang is stuck: its waiters here are granted again until it finishes."""
        assert self.turn is not None
        self.turn.grants = True

    def allow_steps_until(self, until: float | None) -> None:
        """The turn ends while a rank still drains: until then a request of the gang here is
        granted and dropped again at once (a step). None: no steps."""
        assert self.turn is not None
        self.turn.steps_until = until

    def set_turn_deadline(self, deadline: float | None) -> None:
        """When gang.py next needs a pass (its turn's end, a stuck drain): see deadlines()."""
        assert self.turn is not None
        self.turn.deadline = deadline

    def release_turn(self) -> None:
        """Every holder of the gang has released: the GPU is nobody's turn."""
        self.turn = None

    def job_waiters(self, job_id: int) -> list[tuple[ClientInfo, float]]:
        return [entry for entry in self.gang_queue.values() if entry[0].job_id == job_id]

    def turn_here(self) -> bool:
        """Does the gang whose turn it is have work on this GPU (so that nobody else may)?"""
        turn = self.turn
        if turn is None:
            return False
        return turn.used or any(h.client.job_id == turn.job_id for h in self.holders.values()) \
            or any(c.job_id == turn.job_id for c, _ in self.gang_queue.values())

    # --- status --------------------------------------------------------------------------------

    def status(self, now: float) -> dict[str, Any]:
        """Holders, waiters and the turn, for the GPU's status."""
        return {
            "holders": [{"job_id": h.client.job_id, "step_id": h.client.step_id,
                         "pid": h.client.pid, "user": h.client.user,
                         "held_sec": round(now - h.since, 3), "shared": h.shared,
                         "class": h.client.share_class}
                        for h in self.holders.values()],
            "waiting": [{"job_id": c.job_id, "step_id": c.step_id, "pid": c.pid, "user": c.user,
                         "waiting_sec": round(now - since, 3), "class": c.share_class}
                        for c, since in [*self.queue.values(), *self.gang_queue.values()]] + [
                        {"job_id": c.job_id, "step_id": c.step_id, "pid": c.pid, "user": c.user,
                         "waiting_sec": round(now - since, 3), "class": c.share_class,
                         "penalty_sec": round(self.penalty_left(c, now), 3)}
                        for c, since in self.benched.values()],
            "turn": None if self.turn is None else {
                "job_id": self.turn.job_id,
                "state": "ending" if not self.turn.grants else
                         "running" if self.turn.started else "claiming"},
        }
