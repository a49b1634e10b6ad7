"""Prompt clients (a server, or short and rare bursts: demand.py's prompt_ready) that hold nothing
on one GPU, under adaptive sharing with burst turns: whether one is registered (the turn holder
then waits out its next burst before it comes: corunners.py's YIELD), and which of them are granted
again unasked after giving their lock back idle (a standing grant). Pure: GpuState's record in,
decisions out; gpustate.py calls these in its pass.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .gpulock import owner
from .policytypes import Action, ClientInfo

if TYPE_CHECKING:
    from .gpustate import GpuState


def standing_grants(gpu: GpuState, takers: set[int], best: int | None, now: float) -> list[ClientInfo]:
    """Memory fits (adaptive, burst turns): the clients to grant SHARED | BURSTS although they did
    not ask. A prompt client (demand.py's prompt_ready: a server, or short and rare bursts) that
    gave its lock back idle, undropped, holds nothing and waits for nothing: told LOCK_CONTENDED
    while it had not reported yet (so it counted as a turn-taker), it gave the GPU back in its
    warm-up's pause, and its next burst, a command or a request, waited a round trip for the
    lock (0.6-0.8 ms on the H200 in mix3). Co-running, it keeps the grant as any co-runner does,
    and its hook takes an unasked grant as any other (docs/protocol.md "Standing grant"). Not a
    turn-taker, one of a class worse than `best` (the turn-takers' best) unless light beside it,
    one stopped, benched or of a gang, one with memory in host memory (its grant would first bring
    it back), nor one whose standing grant it gave back idle (gpulock.py's `released`)."""
    if not gpu.settings.burst_turns:
        return []
    lock = gpu.lock
    out = []
    for cid in sorted(lock.gave_back_idle):
        client = lock.clients.get(cid)
        if client is None or cid in takers or lock.client_state(cid) != "idle" \
                or client.job_id in lock.gang_jobs \
                or lock.penalty_until.get(owner(client), 0.0) > now \
                or cid in gpu.stopped.why or cid in gpu.stopped.unreleased \
                or (best is not None and client.rank > best and not gpu.demand.light_beside_better(cid)) \
                or gpu.memory.use(cid).swapped or not gpu.demand.prompt_ready((cid,), now):
            continue
        lock.gave_back_idle.discard(cid)
        out.append(client)
    return out


def prompt_idle(gpu: GpuState, now: float) -> bool:
    """Is a prompt client registered on this GPU that holds nothing now, and is not stopped?"""
    return gpu.demand.prompt_ready((cid for cid in gpu.clients if cid not in gpu.holders
                                    and cid not in gpu.stopped.why), now)


def grant_standing(gpu: GpuState, takers: set[int], best: int | None, now: float,
                   out: list[Action]) -> set[int]:
    """Grant `standing_grants` SHARED | BURSTS, marked so (Holder.standing, Action.unasked), in
    GpuState's adaptive pass; returns them. A co-runner's grant does not restart a turn."""
    turn_began = gpu.contention_since
    granted = set()
    for client in standing_grants(gpu, takers, best, now):
        gpu._grant(client, now, True, out, bursts=True)
        gpu.holders[client.client_id].standing = True
        out[-1] = replace(out[-1], unasked=True)
        granted.add(client.client_id)
    gpu.contention_since = turn_began
    return granted
