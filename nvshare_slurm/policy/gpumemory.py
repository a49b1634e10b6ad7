"""Memory accounting of one GPU, as pure logic: what each client has resident and in host memory,
whether an allocation is admitted, holders' allocations that wait for room, and the swap-outs
that make room.

GpuState (gpustate.py) owns one GpuMemory and calls it from its events and from each scheduling
pass. It reads who holds the lock and who waits through `LockView` (its GpuState) and never
changes either: the co-running holders it wants dropped for a holder's allocation go back to the
caller, which drops them. Like the policy: the caller's clock, no sockets.

Swap (docs/protocol.md "Swap"): a grant waits until the grantee's swapped memory fits the room.
With no holder left to move its memory, clients that hold no lock get PREPARE_SWAP_OUT, each at
most once while the room is short (one "episode"); when nothing more can move, the grant goes
out anyway. A holder's allocation without room waits for its MEM_REPLY while room is made, at
most drop_grace_sec.

The driver's view (DriverAccount, drivermemory.py): memory the driver holds that no report counts
(an ended process's until the driver has released it, contexts, unregistered processes) is taken
off the room, so that no grant, swap-in or allocation counts on memory the driver does not have.

Prefetch (protocol "Swap" 8): in turns, the next waiter with swapped memory is offered the room
there is (PREFETCH), one offer at a time per GPU, and brings that much back before its turn. A
holder moving memory out reports as it goes, so the next holder's copies in run beside its copies
out. An offer counts as memory on its way in until the client says it is done.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from ..wire.proto import C
from .drivermemory import DriverAccount
from .policytypes import (MEM_REPLY, PREFETCH, SWAP_OUT, SWAP_UNANSWERED, Action, ClientInfo,
                          GpuSettings, Holder, MemDecision, move_grace)

# Requests below this are answered at once, never deferred nor held for room: cuMemGetInfo's
# one-byte probe must not wait, and the hook makes only allocations of 2 MiB and more swappable.
SMALL_REQUEST = 2 << 20
# The hook brings memory back in whole chunks (at most 256 MiB each, csrc/swap.c): smaller offers
# than this are not made. An offer that brought nothing back (every chunk was larger) is not made
# again to that client until the room grows past it.
PREFETCH_MIN = 32 << 20
# While a holder runs, a prefetch leaves this much of the usable memory free for its allocations,
# or twice the largest allocation a running holder asked for in the last HOLDER_GROWTH_SEC if more.
PREFETCH_HEADROOM_PERCENT = 2
HOLDER_GROWTH_SEC = 30.0
# The holder's own allocations come first (issue 39): no offer while a running holder has asked for
# memory within this long. On the H200 a PyTorch job's caching allocator grew in 11 steps of 32-256
# MiB in its first 3 s, each waiting ~90 ms while the waiter was asked to move its prefetched memory
# back out; the job ran 1.27x its solo time.
PREFETCH_QUIET_SEC = 2.0
# A running holder that grows (a second request within HOLDER_GROWTH_SEC) gets room for more than
# its request when others must move memory out for it: 4x its largest recent request, at least 2 %
# of the usable memory, at most 5 %. On the H200 a PyTorch job's 30 allocations of 16-240 MiB in
# its first 3 s each waited 50-60 ms for the other job to move that much out, one ask each (an 8 s
# training took 12 s in its turn).
GROWTH_ASK_MIN_PERCENT, GROWTH_ASK_MAX_PERCENT = 2, 5
# A client that was just given room for an allocation is about to use it: it is not asked to move
# that memory out for a waiter until this long after, unless it is waiting itself. On the H100 a
# 45 GiB job was asked to move 14 GiB out 20 ms after its allocation, before its first kernel,
# because the other job (its memory born in host memory) had asked for the GPU first.
SETTLE_SEC = 1.0


class LockView(Protocol):
    """What memory accounting reads of its GPU (the GpuState that owns it), never changes."""
    @property
    def memory_total(self) -> int: ...
    @property
    def settings(self) -> GpuSettings: ...
    @property
    def holders(self) -> dict[int, Holder]: ...
    @property
    def queue(self) -> dict[int, tuple[ClientInfo, float]]: ...   # FIFO, best class first
    @property
    def clients(self) -> dict[int, ClientInfo]: ...               # attached here


@dataclass
class MemUsage:
    allocated: int = 0        # resident on the GPU
    fixed: int = 0            # the part of allocated that can never move
    swapped: int = 0          # in host memory (or born there), resident again at the next grant

    @property
    def swappable(self) -> int:
        return self.allocated - self.fixed


_NO_USAGE = MemUsage()


@dataclass
class _PendingAlloc:
    """A holder's allocation request that waits for room (its MEM_REPLY is held back)."""
    client: ClientInfo
    request: int
    flags: int
    token: int
    since: float
    yields: bool = False      # its client gives the GPU up rather than take a co-runner's room


@dataclass
class _SwapAsk:
    bytes: int
    at: float

    def due(self, grace: float) -> float:
        """When it counts as unanswered: drop_grace_sec, longer by what it moves."""
        return self.at + grace + move_grace(self.bytes)


@dataclass
class _Prefetch:
    bytes: int          # offered
    swapped_at: int     # the client's swapped bytes when offered
    at: float


@dataclass
class GpuMemory:
    gpu: LockView = field(repr=False, compare=False)
    usage: dict[int, MemUsage] = field(default_factory=dict)
    job_allocated: dict[int, int] = field(default_factory=dict)
    job_swapped: dict[int, int] = field(default_factory=dict)
    sum_allocated: int = 0
    sum_fixed: int = 0
    sum_swapped: int = 0
    pending_allocs: list[_PendingAlloc] = field(default_factory=list)
    # Room given to a holder's waiting request, counted until its next MEM_UPDATE reports it.
    promised: dict[int, tuple[int, float]] = field(default_factory=dict)
    # The current shortfall episode: PREPARE_SWAP_OUT not yet answered, and those answered.
    swap_asked: dict[int, _SwapAsk] = field(default_factory=dict)
    swap_answered: set[int] = field(default_factory=set)
    # Stopped or frozen clients (a suspended job, suspend.py): they cannot move memory now. Asked,
    # one kept a held allocation of the job that preempted it waiting 30 s twice on the H100.
    frozen: set[int] = field(default_factory=set)
    # The PREFETCH on its way (one per GPU), and clients whose last one stopped short (no room on
    # the GPU, or its hook cannot): nothing more is offered to them before their next grant.
    prefetching: dict[int, _Prefetch] = field(default_factory=dict)
    prefetch_stalled: set[int] = field(default_factory=set)
    prefetch_fruitless: dict[int, int] = field(default_factory=dict)   # client -> the offer
    prefetch_offered: set[int] = field(default_factory=set)   # offered one since its last grant
    holder_asked: list[tuple[float, int]] = field(default_factory=list)  # (when, bytes), recent
    pass_at: float = 0.0                   # the latest pass (expire): deadlines are after it
    skipped_head: int | None = None        # the queue head a waiter whose memory is here went before
    settling: dict[int, float] = field(default_factory=dict)   # client -> its allocation admitted at
    withheld: int | None = None            # per pass: the waiter whose grant waits for room
    grant_need: int = 0                    # per pass: room the withheld grant lacks
    alloc_need: int = 0                    # per pass: room waiting requests lack
    driver: DriverAccount = field(default_factory=DriverAccount)   # what only the driver shows
    # Per pass (GpuState, stoppedroom.py): stopped clients that may be let run for a move-out and
    # were not yet in this shortfall: room that can grow for a holder's allocation.
    stopped_movable: set[int] = field(default_factory=set)

    # --- figures -------------------------------------------------------------------------------

    @property
    def usable(self) -> int:
        return self.gpu.memory_total * (100 - self.gpu.settings.memory_reserve_percent) // 100

    def use(self, client_id: int) -> MemUsage:
        return self.usage.get(client_id, _NO_USAGE)

    def wanted(self) -> int:
        """Bytes holders are about to allocate: requests waiting for room, and room promised."""
        return sum(p.request for p in self.pending_allocs) + \
            sum(size for size, _ in self.promised.values())

    def fits(self) -> bool:
        """Do all clients' memory (resident, swapped out, about to be allocated) fit together?"""
        return self.sum_allocated + self.sum_swapped + self.wanted() + self.driver.held() \
            <= self.usable

    def overcommit(self, client_id: int) -> int:
        """What of this client's memory the GPU lacks room for beside everyone else's: the bytes its
        turn's end is likely to move out (a SWAP_AHEAD grant's, pinned ahead)."""
        u = self.use(client_id)
        over = self.sum_allocated + self.sum_swapped + self.wanted() + self.driver.held() \
            - self.usable
        return max(0, min(u.allocated + u.swapped, over))

    def room(self) -> int:
        """Usable memory that nobody holds resident or is about to: holders bring their swapped
        memory back at their grant (unless dropped meanwhile), waiting or promised allocations
        are on their way, and the driver holds what no report counts (drivermemory.py)."""
        coming_in = sum(self.use(cid).swapped for cid, h in self.gpu.holders.items()
                        if h.drop_at is None)
        prefetched = sum(self.prefetch_outstanding(cid) for cid in self.prefetching)
        return self.usable - self.sum_allocated - coming_in - self.wanted() - prefetched \
            - self.driver.held()

    def prefetch_outstanding(self, client_id: int) -> int:
        """Bytes of a PREFETCH offer that have not come back yet."""
        offer = self.prefetching.get(client_id)
        if offer is None:
            return 0
        back = offer.swapped_at - self.use(client_id).swapped
        return max(0, offer.bytes - max(0, back))

    def room_for(self, client_id: int) -> int:
        """The room as the client's own grant sees it: its prefetch on the way is its own."""
        return self.room() + self.prefetch_outstanding(client_id)

    # --- what a switch to the queue head moves -------------------------------------------------

    def _head(self) -> ClientInfo | None:
        return next(iter(self.gpu.queue.values()))[0] if self.gpu.queue else None

    def first_to_run(self, may_run: Callable[[int], bool]) -> ClientInfo | None:
        """Who a free GPU goes to in turns: the queue head, unless its memory must come back into
        room that only a swap-out can make while a waiter of its class behind it fits as it is.
        That one runs first, once per head: the GPU works instead of idling through the copies,
        and a job that ends within that turn costs no swap at all (on the H100 two 45 GiB jobs
        started together spent 10 s moving 14 GiB out before either ran)."""
        head = self._head()
        if head is None or head.client_id == self.skipped_head or self._fits_now(head.client_id):
            return head
        for client, _ in self.gpu.queue.values():
            cid = client.client_id
            if client.rank == head.rank and cid != head.client_id and self._fits_now(cid) \
                    and cid not in self.frozen and cid not in self.swap_asked and may_run(cid):
                self.skipped_head = head.client_id
                return client
        return head

    def short_of_room(self, client_id: int) -> int:
        """What the client's swapped memory lacks of the room its grant would see (<= 0: fits)."""
        return self.use(client_id).swapped - self.room_for(client_id)

    def _fits_now(self, client_id: int) -> bool:
        return self.short_of_room(client_id) <= 0

    def holder_must_move(self) -> int:
        """What the exclusive holder must move out so that the queue head's swapped memory fits."""
        head = self._head()
        if head is None:
            return 0
        return max(0, self.short_of_room(head.client_id))

    def moved_by_switch(self) -> int:
        """Bytes a switch to the queue head moves: its swapped memory coming back, and what the
        holder must move out for it (the auto switch interval grows with them)."""
        head = self._head()
        moved = 0
        if head is not None:
            moved = self.use(head.client_id).swapped
            if self.gpu.holders:
                moved += self.holder_must_move()
        return moved

    def switch_moves_memory(self) -> bool:
        """Would handing the GPU to the queue head move memory? Then an early (idle) release
        would cost a swap each time, so the holder keeps its full turn."""
        head = self._head()
        return head is not None and self.use(head.client_id).swapped > 0 and not self.fits()

    def next_job_needs(self, job: int) -> int:
        """Room the next waiting job's swapped memory lacks (serial mode's hand-over)."""
        queue = self.gpu.queue
        nxt = next((c.job_id for c, _ in queue.values() if c.job_id != job), None)
        swapped = sum(self.use(c.client_id).swapped for c, _ in queue.values() if c.job_id == nxt)
        return max(0, swapped - self.room())

    def holder_moves(self, need: int, holders: list[Holder]) -> dict[int, int]:
        """`need` bytes split over the holders' swappable memory, in their order: what each
        holder's DROP_LOCK asks it to move out (client id -> bytes)."""
        return {c.client_id: move for c, move in _shares(
            need, [(h.client, self.use(h.client.client_id).swappable) for h in holders])}

    def status(self) -> dict[str, int]:
        """Its figures, for the GPU's status."""
        return {"memory_total": self.gpu.memory_total, "memory_usable": self.usable,
                "memory_used": self.sum_allocated, "memory_fixed": self.sum_fixed,
                "memory_swapped": self.sum_swapped,
                "memory_reserved": self.gpu.memory_total - self.usable,
                **self.driver.status(self.sum_allocated)}

    def deadlines(self) -> list[float]:
        """When a held request, a PREPARE_SWAP_OUT or a promise runs out of drop_grace_sec."""
        grace = self.gpu.settings.drop_grace_sec
        return [p.since + grace for p in self.pending_allocs] + \
            [ask.due(grace) for ask in self.swap_asked.values()] + \
            [at + grace for _, at in self.promised.values()] + \
            [offer.at + grace for offer in self.prefetching.values()] + \
            [at + SETTLE_SEC for at in self.settling.values()] + self.driver.deadlines() + \
            self._quiet_until()

    # --- reports and requests ------------------------------------------------------------------

    def _set_usage(self, client: ClientInfo, allocated: int, fixed: int, swapped: int) -> None:
        use = self.usage.setdefault(client.client_id, MemUsage())
        self.sum_allocated += allocated - use.allocated
        self.sum_fixed += fixed - use.fixed
        self.sum_swapped += swapped - use.swapped
        _add(self.job_allocated, client.job_id, allocated - use.allocated)
        _add(self.job_swapped, client.job_id, swapped - use.swapped)
        use.allocated, use.fixed, use.swapped = allocated, fixed, swapped

    def update(self, client: ClientInfo, now: float, allocated: int, fixed: int, swapped: int,
               request: int, flags: int, token: int, driver_free: int = 0) -> MemDecision | None:
        """A MEM_UPDATE: record the usage; with request > 0 also decide the allocation (None for
        a report, and for a holder's request that waits for room). With NVSHARE_MEM_DRIVER_OOM
        the driver refused it with `driver_free` bytes free: what it lacked is held off the room
        for a while, so the request waits (a holder's), is deferred, or is tried again."""
        cid = client.client_id
        fixed = min(fixed, allocated)
        old = self.use(cid)
        if cid in self.swap_asked and not flags & C.NVSHARE_MEM_MOVING \
                and (request == 0 or allocated < old.allocated or allocated == fixed):
            # Its answer to PREPARE_SWAP_OUT: a report after moving what it could (maybe nothing).
            # A request moving nothing is an allocation made meanwhile, not the answer; a report
            # in the middle of the swap-out (MOVING, after each chunk) is not one either.
            del self.swap_asked[cid]
            self.swap_answered.add(cid)
        self.promised.pop(cid, None)   # what it was promised is in `allocated` now (or failed)
        self._set_usage(client, allocated, fixed, swapped)
        if request and flags & C.NVSHARE_MEM_DRIVER_OOM:
            self.driver.driver_refused(self.room(), driver_free, now)
        offer = self.prefetching.get(cid)
        if request == 0 and flags & C.NVSHARE_MEM_PREFETCH_DONE and offer is not None:
            del self.prefetching[cid]
            if flags & C.NVSHARE_MEM_PREFETCH_SHORT:
                self.prefetch_stalled.add(cid)
            elif swapped >= offer.swapped_at:
                self.prefetch_fruitless[cid] = offer.bytes
        decision = self.admit(client, request) if request > 0 else None
        if decision is None or decision.status != C.NVSHARE_OK or request < SMALL_REQUEST:
            return decision
        if cid in self.gpu.holders:
            self.holder_asked = [(at, n) for at, n in self.holder_asked
                                 if at > now - HOLDER_GROWTH_SEC] + [(now, request)]
        if request > self.room():
            if cid in self.gpu.holders:
                if self.room_can_grow(self._requesters() | {cid}, other_holders=True):
                    yields = bool(flags & C.NVSHARE_MEM_CAN_DEFER) \
                        and _gives_way(self, cid, request - self.room())
                    self.pending_allocs.append(_PendingAlloc(client, request, flags, token, now,
                                                             yields))
                    return None
            elif flags & C.NVSHARE_MEM_CAN_DEFER:
                return replace(decision, flags=C.NVSHARE_MEM_DEFERRED)
        # Admitted resident: the room is taken until the client reports the allocation made (its
        # next MEM_UPDATE). A large allocation takes a while; a request meanwhile must not be
        # given the same room (two 40 GiB jobs on an 80 GB GPU: the second one's driver
        # allocation ran out of memory).
        self.promised[cid] = (request, now)
        self.settling[cid] = now
        return decision

    def yielding(self, client_id: int) -> bool:
        """Its allocation waits while it gives the GPU up (_gives_way)."""
        return any(p.yields for p in self.pending_allocs if p.client.client_id == client_id)

    def _recent_asks(self, now: float) -> list[int]:
        """The bytes of the running holders' requests of the last HOLDER_GROWTH_SEC."""
        return [n for at, n in self.holder_asked if at > now - HOLDER_GROWTH_SEC]

    def admit(self, client: ClientInfo, request: int) -> MemDecision:
        usable = self.usable
        limit = client.mem_limit
        total = min(limit, usable) if limit else usable
        job_used = self.job_allocated.get(client.job_id, 0) + self.job_swapped.get(client.job_id, 0)
        own = self.use(client.client_id)
        ok = True
        if limit and job_used + request > limit:
            ok = False
        # Others' swappable memory can always be moved out of the way; their fixed memory cannot.
        if request + own.allocated + own.swapped + (self.sum_fixed - own.fixed) > usable:
            ok = False
        status = C.NVSHARE_OK if ok else C.NVSHARE_ERR_NOMEM
        return MemDecision(status, max(0, total - job_used), total)

    def forget(self, client_id: int, client: ClientInfo | None, now: float) -> None:
        """The client is gone: its held request, promise and swap ask with it; its memory is
        counted on until the driver shows it released (DriverAccount.client_gone)."""
        self.pending_allocs = [p for p in self.pending_allocs if p.client.client_id != client_id]
        self.promised.pop(client_id, None)
        self.swap_asked.pop(client_id, None)
        self.swap_answered.discard(client_id)
        self.frozen.discard(client_id)
        self.settling.pop(client_id, None)
        self.granted(client_id)        # no offer stands for it any more
        use = self.usage.pop(client_id, None)
        if client is not None:
            self.driver.client_gone(client, use.allocated if use else 0, now)
        if client is not None and use:
            self.sum_allocated -= use.allocated
            self.sum_fixed -= use.fixed
            self.sum_swapped -= use.swapped
            _add(self.job_allocated, client.job_id, -use.allocated)
            _add(self.job_swapped, client.job_id, -use.swapped)

    # --- a scheduling pass ---------------------------------------------------------------------

    def begin_pass(self) -> None:
        self.withheld, self.grant_need, self.alloc_need = None, 0, 0

    def withhold(self, client_id: int, short: int) -> None:
        """This pass withholds the waiter's grant: its swapped memory lacks `short` bytes."""
        self.withheld, self.grant_need = client_id, short

    def driver_seen(self, used: int, processes: dict[int, int], now: float,
                    out: list[Action]) -> None:
        """A look at the driver (NVML): its used memory and each process's."""
        counted = {c.pid: (cid, self.use(cid).allocated + self.promised.get(cid, (0, 0.0))[0])
                   for cid, c in self.gpu.clients.items()}
        self.driver.seen(used, processes, counted, now, out)

    def expire(self, now: float, out: list[Action]) -> None:
        self.pass_at = now
        self.driver.expire(now, out)
        grace = self.gpu.settings.drop_grace_sec
        for cid, ask in list(self.swap_asked.items()):
            if now >= ask.due(grace):   # count it as answered so that the grant is not stuck
                del self.swap_asked[cid]
                self.swap_answered.add(cid)
                client = self.gpu.clients.get(cid)
                if client is not None:
                    out.append(Action(SWAP_UNANSWERED, client, 0, 0, ask.bytes))
        for cid, (_, at) in list(self.promised.items()):
            if now >= at + grace:       # never reported: the allocation failed
                del self.promised[cid]
        for cid, offer in list(self.prefetching.items()):
            if now >= offer.at + grace:  # never answered (a hook without PREFETCH): offer no more
                del self.prefetching[cid]
                self.prefetch_stalled.add(cid)
        # settled: the time is up, or it asked for the GPU (its deadline must not stay behind)
        self.settling = {cid: at for cid, at in self.settling.items()
                         if now < at + SETTLE_SEC and cid not in self.gpu.queue}

    def answer_allocations(self, now: float, out: list[Action]) -> None:
        """Answer holders' requests that now have room, lost their lock, or waited too long."""
        if not self.pending_allocs:
            return
        room = self.room() + sum(p.request for p in self.pending_allocs)
        grace = self.gpu.settings.drop_grace_sec
        requesters = self._requesters()
        waiting: list[_PendingAlloc] = []
        for pending in self.pending_allocs:
            cid = pending.client.client_id
            if pending.request <= room:
                room -= pending.request
                self._answer(pending, now, out)
            elif cid not in self.gpu.holders:
                # Released meanwhile (dropped): now it is a non-holder's request.
                deferred = pending.flags & C.NVSHARE_MEM_CAN_DEFER
                self._answer(pending, now, out, C.NVSHARE_MEM_DEFERRED if deferred else 0)
            elif now >= pending.since + grace \
                    or not self.room_can_grow(requesters, other_holders=True):
                self._answer(pending, now, out, no_room=True)
            else:
                waiting.append(pending)
        self.pending_allocs = waiting
        # a requester that gives the GPU up needs no room now: at its release it is deferred
        self.alloc_need = max(0, sum(p.request for p in waiting if not p.yields) - max(room, 0))

    def _answer(self, pending: _PendingAlloc, now: float, out: list[Action], flags: int = 0,
                no_room: bool = False) -> None:
        decision = replace(self.admit(pending.client, pending.request), flags=flags,
                           no_room=no_room)
        out.append(Action(MEM_REPLY, pending.client, reply=decision, token=pending.token))
        cid = pending.client.client_id
        if decision.status == C.NVSHARE_OK and not flags:
            size, _ = self.promised.get(cid, (0, now))
            self.promised[cid] = (size + pending.request, now)

    def granted(self, client_id: int) -> None:
        """Its grant brings all its swapped memory back: no offer stands for it any more."""
        self.prefetching.pop(client_id, None)
        self.prefetch_stalled.discard(client_id)
        self.prefetch_fruitless.pop(client_id, None)
        self.prefetch_offered.discard(client_id)

    def _quiet_until(self) -> list[float]:
        """When the running holder's last request stops holding offers back (a pass is due)."""
        if not self.holder_asked or not self.prefetch_wanted():
            return []
        end = self.holder_asked[-1][0] + PREFETCH_QUIET_SEC
        return [end] if end > self.pass_at else []

    def prefetch_wanted(self) -> bool:
        head = self._head()
        return head is not None and self.use(head.client_id).swapped > 0 and head.prefetch \
            and head.client_id not in self.prefetch_stalled

    def prefetch(self, now: float, out: list[Action]) -> None:
        """In turns: offer the next waiter (the queue head) the room there is for its swapped
        memory, so that it comes back before its turn (PREFETCH). Not while a holder's allocation
        waits for room or a running holder grows (PREFETCH_QUIET_SEC), nor to a client asked to
        move memory out, stopped, or stalled; the offer leaves the running holder headroom."""
        head = self._head()
        if head is None or self.prefetching or self.alloc_need > 0:
            return
        cid = head.client_id
        swapped = self.use(cid).swapped
        if not swapped or not head.prefetch or cid in self.gpu.holders or cid in self.frozen or \
                cid in self.prefetch_stalled or cid in self.swap_asked:
            return
        running = any(h.drop_at is None for h in self.gpu.holders.values())
        recent = self._recent_asks(now)
        if running and recent and now < self.holder_asked[-1][0] + PREFETCH_QUIET_SEC:
            return
        headroom = max(self.usable * PREFETCH_HEADROOM_PERCENT // 100,
                       2 * max(recent, default=0)) if running else 0
        offer = min(swapped, self.room() - headroom)
        if offer < min(swapped, PREFETCH_MIN) or offer <= self.prefetch_fruitless.get(cid, 0):
            return
        self.prefetching[cid] = _Prefetch(offer, swapped, now)
        self.prefetch_offered.add(cid)
        out.append(Action(PREFETCH, head, 0, 0, offer))

    def freeze(self, client_id: int) -> None:
        """The client cannot run (stopped, frozen): nothing is asked of it, and what it was asked
        is no longer on its way out."""
        self.frozen.add(client_id)
        self.swap_asked.pop(client_id, None)
        self.prefetching.pop(client_id, None)

    def thaw(self, client_id: int) -> None:
        self.frozen.discard(client_id)

    def _requesters(self) -> set[int]:
        return {p.client.client_id for p in self.pending_allocs}

    def room_can_grow(self, exclude: set[int], other_holders: bool = False,
                      stopped: bool = True) -> bool:
        """Is some memory still on its way out, or someone left to ask (with other_holders, for
        a holder's allocation: a co-running holder that can be dropped)? An allocation admitted
        resident and not yet reported counts: once made, its memory can be asked to move (a grant
        that went out meanwhile would take the room the allocation is being made in). So does a
        PREFETCH on its way: once back, that memory can be asked to move again. And memory of
        an ended process: the driver releases it. With `stopped`, stopped clients that may be let
        run for a move-out (stoppedroom.py) count too."""
        if self.swap_asked or self._swap_candidates(exclude) or set(self.promised) - exclude \
                or set(self.prefetching) - exclude or self.driver.sum_ended \
                or self.driver.refused or (stopped and self.stopped_movable - exclude):
            return True
        for cid, holder in self.gpu.holders.items():
            if holder.drop_at is not None and holder.drop_bytes > 0:
                return True
            if other_holders and holder.drop_at is None and cid not in exclude \
                    and self.use(cid).swappable > 0:
                return True
        return False

    def _swap_candidates(self, exclude: set[int], settled: bool = False) -> list[tuple[ClientInfo, int]]:
        """Clients without a lock whose resident memory can move and that were not asked in this
        episode: lower classes first; within a class idle ones (largest first), then waiters from
        the back of the queue. With `settled`, not one still settling (SETTLE_SEC, expire())."""
        place = {cid: n for n, cid in enumerate(self.gpu.queue)}
        found = []
        for cid, use in self.usage.items():
            client = self.gpu.clients.get(cid)
            if client is None or use.swappable <= 0 or cid in self.gpu.holders or cid in exclude \
                    or cid in self.swap_asked or cid in self.swap_answered or cid in self.frozen \
                    or cid in self.prefetching or (settled and cid in self.settling):
                continue
            found.append((client, use.swappable))
        found.sort(key=lambda item: (-item[0].rank, item[0].client_id in place,
                                     -place.get(item[0].client_id, 0), -item[1]))
        return found

    def _growth_ask(self, now: float) -> int:
        """More than a growing holder's request, asked of others in one go (GROWTH_ASK_*); 0
        for a holder's first request in a while (one large allocation is not a growth)."""
        recent = self._recent_asks(now)
        if len(recent) < 2:
            return 0
        low = self.usable * GROWTH_ASK_MIN_PERCENT // 100
        return min(max(4 * max(recent), low), self.usable * GROWTH_ASK_MAX_PERCENT // 100)

    def on_its_way_out(self) -> int:
        """Memory already asked to move out (swap asks, dropped holders' moves) or that the driver
        releases (ended processes')."""
        return sum(ask.bytes for ask in self.swap_asked.values()) + self.driver.sum_ended \
            + sum(h.drop_bytes for h in self.gpu.holders.values() if h.drop_at is not None)

    def make_room(self, now: float, out: list[Action]) -> list[tuple[Holder, int]]:
        """PREPARE_SWAP_OUT for what this pass's withheld grant and waiting requests lack.
        Returns the co-running holders the caller must drop (DROP_LOCK(MEMORY)) for the rest of
        a holder's allocation, with the bytes each must move out; first the requesters that give
        the GPU up for theirs (_gives_way)."""
        giving = [self.gpu.holders[cid] for cid in self._requesters()
                  if self.yielding(cid) and cid in self.gpu.holders
                  and self.gpu.holders[cid].drop_at is None]
        dropped: list[tuple[Holder, int]] = [(h, 0) for h in giving]
        need = self.grant_need + self.alloc_need
        if need <= 0:
            self.swap_asked.clear()      # the shortfall episode is over
            self.swap_answered.clear()
            return dropped
        if self.alloc_need > 0:          # room for the holder's next allocations too
            need += self._growth_ask(now)
        need -= self.on_its_way_out()
        if need <= 0:
            return dropped
        requesters = self._requesters()
        exclude = requesters | ({self.withheld} if self.withheld is not None else set())
        for client, move in _shares(need, self._swap_candidates(exclude, settled=True)):
            self.swap_asked[client.client_id] = _SwapAsk(move, now)
            out.append(Action(SWAP_OUT, client, 0, 0, move))
            need -= move
            # Its prefetch came too early: no more. A waiter offered none yet (its memory moved out
            # for the holder's allocation while it waited) still gets one when room comes back.
            if client.client_id in self.gpu.queue and client.client_id in self.prefetch_offered:
                self.prefetch_stalled.add(client.client_id)
        if need <= 0 or self.alloc_need <= 0:
            return dropped
        # A running holder's allocation: other co-running holders make the rest, lower classes
        # first, then newest first.
        others = sorted((h for h in reversed(self.gpu.holders.values())
                         if h.drop_at is None and h.client.client_id not in requesters),
                        key=lambda h: -h.client.rank)
        moves = self.holder_moves(min(need, self.alloc_need), others)
        return dropped + [(h, moves[h.client.client_id]) for h in others
                          if moves.get(h.client.client_id)]


def why_refused(mem: GpuMemory, client: ClientInfo, request: int) -> str:
    """Why mem.admit() refuses `request` of the client now, in words for the log."""
    limit = client.mem_limit
    job_used = mem.job_allocated.get(client.job_id, 0) + mem.job_swapped.get(client.job_id, 0)
    if limit and job_used + request > limit:
        return (f"the job would hold {_size(job_used + request)}, over its memory limit of "
                f"{_size(limit)} (NVSHARE_MEM_LIMIT)")
    own = mem.use(client.client_id)
    others_fixed = mem.sum_fixed - own.fixed
    return (f"it can never fit: this process holds {_size(own.allocated + own.swapped)}, other "
            f"processes hold {_size(others_fixed)} that cannot move to host memory, and the "
            f"GPU has {_size(mem.usable)} usable ({_size(mem.gpu.memory_total)} less "
            f"memory_reserve_percent {mem.gpu.settings.memory_reserve_percent})")


def _gives_way(mem: GpuMemory, cid: int, short: int) -> bool:
    """A co-running holder's allocation lacks `short` bytes that only another running holder
    can make (by giving the GPU up and moving that much out): does the requester give the GPU
    up instead? The bytes weigh it: a drop moves the rest out of the running holder now and
    back at its next turn, while the requester that gives way moves nothing (its allocation is
    born in host memory, NVSHARE_MEM_DEFERRED) and only keeps what it has resident. So it
    gives way unless it holds more here than the others would move, or outranks one of them.
    On the H200 two 75 GiB PyTorch jobs co-ran at start; the second one's 67 GiB allocation
    dropped the first 1.5 s into its training, which then waited out the other's 8 s turn."""
    mine = mem.gpu.holders[cid]
    others = [h for c, h in mem.gpu.holders.items() if c != cid and h.drop_at is None]
    if mem.gpu.settings.mode == "serial" or not others \
            or any(h.client.rank > mine.client.rank or h.client.job_id == mine.client.job_id
                   for h in others):
        return False    # one job at a time; a worse class or its own job's process gives way
    coming = sum(size for _, size in mem._swap_candidates(mem._requesters() | {cid})) \
        + mem.on_its_way_out()
    taken = short - coming          # what running co-holders would have to move out
    return taken > 0 and mem.use(cid).allocated <= taken


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _add(sums: dict[int, int], key: int, delta: int) -> None:
    """Per-job sums without entries for jobs that hold nothing."""
    total = sums.get(key, 0) + delta
    if total:
        sums[key] = total
    else:
        sums.pop(key, None)


def _shares(need: int, candidates: list[tuple[ClientInfo, int]]) -> list[tuple[ClientInfo, int]]:
    """Split `need` bytes over candidates (client, movable bytes) in their order."""
    out = []
    for client, movable in candidates:
        if need <= 0:
            break
        move = min(need, movable)
        if move > 0:
            out.append((client, move))
            need -= move
    return out
