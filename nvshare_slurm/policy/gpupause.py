"""What suspending and resuming one client does to one GPU's policy (suspend.py decides when: a job
suspended by Slurm, a process stopped or frozen), and letting a stopped one run for the move-out
of memory a waiter needs (moveout.py decides when, from the GPU's StoppedRoom: stoppedroom.py).
Pure, like gpustate.py: Actions out."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..wire.proto import C
from .policytypes import SWAP_OUT, Action

if TYPE_CHECKING:
    from .gpustate import GpuState


def suspend_client(gpu: GpuState, client_id: int, now: float, stopped: bool, move: int,
                   why: str = "its process is stopped", may_run: bool = False) -> list[Action]:
    """The client's job is suspended, or its process stopped or frozen (suspend.py): it waits in
    no queue on `gpu`. A holder that still runs hears DROP_LOCK(SUSPEND) with `move` bytes to
    move to host memory (a holder already dropping, PREPARE_SWAP_OUT) and releases as any holder
    does; a stopped one cannot answer, so it holds nothing from now on (it reads its DROP_LOCK
    when it runs again), and is asked to move no memory until resume_client (what it was asked
    is no longer on its way out) or let_run. Another client's turn starts at once either way.
    `why`: a stopped client's state in words (status); `may_run`: stopped by a signal, so it may
    be let run for a move-out."""
    out: list[Action] = []
    gpu.lock.withdraw(client_id)
    gpu.loans.forget(client_id)
    holder = gpu.holders.get(client_id)
    if stopped:
        gpu.memory.freeze(client_id)
        gpu.stopped.stop(client_id, why, may_run, holder is not None)
    client = gpu.clients.get(client_id)
    if holder is None:
        if move and client is not None:
            out.append(Action(SWAP_OUT, client, 0, 0, move))
        return out + gpu.tick(now)
    if holder.drop_at is None:
        gpu.lock.drop(holder, now, C.NVSHARE_DROP_SUSPEND, out, move)
    elif move:
        out.append(Action(SWAP_OUT, holder.client, 0, 0, move))
    if not stopped:
        return out + gpu.tick(now)
    return out + gpu.release(client_id, now)


def resume_client(gpu: GpuState, client_id: int, now: float) -> list[Action]:
    """The client runs again (thawed, or its job resumed): its memory may be asked to move."""
    gpu.memory.thaw(client_id)
    gpu.stopped.runs_again(client_id)
    return gpu.tick(now)


def let_run(gpu: GpuState, client_id: int, now: float) -> list[Action]:
    """The stopped client runs (SIGCONT) to move out memory a waiter needs: the pass asks it
    (PREPARE_SWAP_OUT) once its hook holds nothing; its answer ends the move-out (StoppedRoom
    `done`)."""
    gpu.stopped.let_run(client_id, gpu.memory)
    return gpu.tick(now)


def cannot_run(gpu: GpuState, client_id: int, now: float) -> list[Action]:
    """The stopped client cannot be let run (moveout.py says why): its memory stays, and a waiter
    that needs it waits until it runs again."""
    gpu.stopped.refused(client_id)
    return gpu.tick(now)


def stopped_again(gpu: GpuState, client_id: int, now: float) -> list[Action]:
    """Its move-out is over (answered, or its deadline passed) and it is stopped again: nothing
    more is asked of it; an ask still open is no longer memory on its way out."""
    gpu.stopped.stopped_again(client_id, gpu.memory)
    return gpu.tick(now)


def move_out_over(gpu: GpuState, client_id: int) -> None:
    """It was resumed (Slurm, a SIGCONT) while it moved memory out: it runs, not stopped again
    (resume_client follows when the watch sees it running)."""
    gpu.stopped.running.discard(client_id)
    gpu.stopped.done.discard(client_id)
