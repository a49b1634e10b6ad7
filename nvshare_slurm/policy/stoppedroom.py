"""Room held by the memory of stopped clients (issue 39), as pure logic: which of them a waiter's
swapped memory needs moved out, and why that waiter waits.

A stopped or frozen client cannot move memory: GpuMemory asks nothing of it (`frozen`), so a
waiter whose swapped memory lacks the room it holds was granted anyway, "nothing more can move",
and its hook gave the grant back (NO_ROOM) and asked again every 250 ms. Measured with Slurm 22.05
(proctrack/linuxproc, whose `scontrol suspend` stops a job's processes at once) on a 1 GiB GPU:
161 such grants in 40 s, and the waiter ran nothing until the stopped job resumed.

Now such a grant is withheld while the room it lacks is in stopped clients' memory, and those
stopped by a signal (state T) that the room needs are `wanted`: the suspend watch (moveout.py)
lets each run for its move-out, once per shortfall, and stops it again. Running, it is thawed in
GpuMemory, so the pass asks it (PREPARE_SWAP_OUT) like any idle client and takes its report as the
answer. A client that cannot be let run (a debugger's, a frozen cgroup, a --mem limit) keeps its
memory, and the waiter waits for it to run again instead of being granted in a loop. A shortfall
beyond all stopped memory (others' fixed memory) is granted anyway, as before.

GpuState owns one StoppedRoom per GPU; gpupause.py changes it when a client stops, runs again or
is let run. No clock, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .policytypes import ClientInfo

if TYPE_CHECKING:
    from .gpumemory import GpuMemory


@dataclass
class StoppedRoom:
    why: dict[int, str] = field(default_factory=dict)    # stopped or frozen client -> in words
    may_run: set[int] = field(default_factory=set)       # stopped by a signal: may be let run
    unreleased: set[int] = field(default_factory=set)    # stopped holding: its hook still holds
    wanted: dict[int, int] = field(default_factory=dict)  # per pass: client -> bytes to move out
    running: set[int] = field(default_factory=set)       # let run for a move-out
    done: set[int] = field(default_factory=set)          # its move-out is over: to stop again
    tried: set[int] = field(default_factory=set)         # let run (or refused) in this shortfall
    waiter: ClientInfo | None = None                     # per pass: whose grant waits for this room
    reason: str = ""                                     # and why, for status

    def stop(self, client_id: int, why: str, may_run: bool, held: bool) -> None:
        """The client is stopped or frozen; `held`: it held the lock, which the daemon took back
        (its hook releases when it runs again, and is asked nothing before that)."""
        self.why[client_id] = why
        (self.may_run.add if may_run else self.may_run.discard)(client_id)
        if held:
            self.unreleased.add(client_id)
        self.tried.discard(client_id)

    def runs_again(self, client_id: int) -> None:
        """Thawed, or its job resumed (its hook may still hold: `unreleased` stays)."""
        for records in (self.may_run, self.running, self.done, self.tried):
            records.discard(client_id)
        self.why.pop(client_id, None)
        self.wanted.pop(client_id, None)

    def forget(self, client_id: int) -> None:
        self.runs_again(client_id)
        self.unreleased.discard(client_id)

    def released(self, client_id: int, memory: GpuMemory) -> bool:
        """A LOCK_RELEASED from a client that holds nothing: a stopped holder's hook let go. When
        it runs for a move-out, it may be asked from now on (True: a pass is due)."""
        self.unreleased.discard(client_id)
        if client_id in self.running and client_id in memory.frozen:
            memory.thaw(client_id)
            return True
        return False

    def let_run(self, client_id: int, memory: GpuMemory) -> None:
        """The watch let it run for its move-out. Its hook still holding, it is asked nothing
        until it releases (released()): a PREPARE_SWAP_OUT read while it holds would be lost in
        the release it is making."""
        self.wanted.pop(client_id, None)
        self.tried.add(client_id)
        self.running.add(client_id)
        if client_id not in self.unreleased:
            memory.thaw(client_id)

    def refused(self, client_id: int) -> None:
        """It cannot be let run: its memory stays until it runs again."""
        self.wanted.pop(client_id, None)
        self.may_run.discard(client_id)
        self.tried.add(client_id)

    def stopped_again(self, client_id: int, memory: GpuMemory) -> None:
        self.running.discard(client_id)
        self.done.discard(client_id)
        if client_id in self.why:
            memory.freeze(client_id)

    def begin_pass(self, memory: GpuMemory) -> None:
        self.wanted, self.waiter, self.reason = {}, None, ""
        # Stopped clients with memory to move that may be let run for it in this shortfall: room
        # that can grow (a holder's allocation waits for it rather than being answered without).
        memory.stopped_movable = {cid for cid in self.may_run - self.tried
                                  if cid in memory.frozen and memory.use(cid).swappable > 0}

    def for_allocations(self, memory: GpuMemory, clients: dict[int, ClientInfo]) -> None:
        """Holders' allocations wait for room that nothing but stopped clients' memory can make:
        those are wanted for it, as for a waiter's grant (blocks)."""
        waiting = {p.client.client_id for p in memory.pending_allocs}
        if memory.alloc_need > 0 and not memory.room_can_grow(waiting, other_holders=True,
                                                              stopped=False):
            self.blocks(memory, clients, memory.pending_allocs[0].client, memory.alloc_need)

    def blocks(self, memory: GpuMemory, clients: dict[int, ClientInfo], waiter: ClientInfo,
               short: int) -> bool:
        """The waiter's swapped memory lacks `short` bytes of room and nothing else can move:
        is that room in stopped clients' memory? Then its grant waits, and those that may be let
        run and were not yet in this shortfall are `wanted` for their share (lowest class first,
        then largest: fewest processes run)."""
        held = {cid: memory.use(cid).swappable for cid in self.why}
        if sum(size for size in held.values() if size > 0) < short:
            return False               # beyond all of it: others' fixed memory, granted anyway
        self.waiter = waiter
        need = short - sum(held[cid] for cid in self.running if held.get(cid, 0) > 0)
        for cid in sorted(held, key=lambda c: (-clients[c].rank if c in clients else 0, -held[c])):
            if need > 0 and held[cid] > 0 and cid in self.may_run and cid not in self.tried \
                    and cid in memory.frozen:
                self.wanted[cid] = min(need, held[cid])
                need -= self.wanted[cid]
        return True

    def end_pass(self, memory: GpuMemory, clients: dict[int, ClientInfo]) -> None:
        """After the pass: a move-out answered (or no longer asked) is over; a shortfall that
        ended ends `tried`; and the reason a withheld waiter waits, while stopped memory is in
        its way."""
        for cid in list(self.running):
            if cid not in memory.frozen and cid not in memory.swap_asked:
                self.running.discard(cid)
                self.done.add(cid)
        if memory.withheld is None and memory.alloc_need <= 0:
            self.tried.clear()
            return
        if self.waiter is None and not any(c in self.running for c in self.why):
            return                     # it waits for others' memory, not for stopped clients'
        parts = []
        for cid in sorted(self.why):
            size = memory.use(cid).swappable
            client = clients.get(cid)
            if size <= 0 or client is None:
                continue
            moving = cid in self.wanted or cid in self.running or cid in memory.swap_asked
            parts.append(f"job {client.job_id}'s {_size(size)} is on the GPU and "
                         f"{self.why[cid]}; "
                         f"{'moving it out' if moving else 'it stays there until it runs again'}")
        if parts:
            self.waiter = self.waiter or (clients.get(memory.withheld)
                                          if memory.withheld is not None else None)
            self.reason = "waits for room: " + "; ".join(parts)

    def status(self) -> dict[str, Any]:
        """`waits_for_room`: the waiter whose grant waits for stopped clients' memory, and why."""
        waiter = self.waiter
        if waiter is None or not self.reason:
            return {"waits_for_room": None}
        return {"waits_for_room": {"job_id": waiter.job_id, "step_id": waiter.step_id,
                                   "pid": waiter.pid, "reason": self.reason}}


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"
