"""What suspending and resuming one client does to one GPU's policy (suspend.py decides when: a job
suspended by Slurm, a process stopped or frozen). Pure, like gpustate.py: Actions out."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .policytypes import SWAP_OUT, Action
from .proto import C

if TYPE_CHECKING:
    from .gpustate import GpuState


def suspend_client(gpu: GpuState, client_id: int, now: float, stopped: bool,
                   move: int) -> list[Action]:
    """The client's job is suspended, or its process stopped or frozen (suspend.py): it waits in
    no queue on `gpu`. A holder that still runs hears DROP_LOCK(SUSPEND) with `move` bytes to
    move to host memory (a holder already dropping, PREPARE_SWAP_OUT) and releases as any holder
    does; a stopped one cannot answer, so it holds nothing from now on (it reads its DROP_LOCK
    when it runs again), and is asked to move no memory until resume_client (what it was asked
    is no longer on its way out). Another client's turn starts at once either way."""
    out: list[Action] = []
    gpu.lock.withdraw(client_id)
    gpu.loans.forget(client_id)
    if stopped:
        gpu.memory.freeze(client_id)
    holder = gpu.holders.get(client_id)
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
    return gpu.tick(now)
