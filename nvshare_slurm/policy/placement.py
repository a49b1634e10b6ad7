"""Which GPUs of the node a job gets (docs/protocol.md "Job registration").

`slots` spreads over min(slots, GPUs) distinct GPUs, least loaded first: memory used by the
registered jobs' clients, then number of jobs, then NVML index. With Slurm's own choice
(typed GRES, gpu/shard GRES) the daemon follows it.
"""
from __future__ import annotations

from dataclasses import dataclass


class PlacementError(Exception):
    """The job cannot be placed; `status` is the NVSHARE_ERR_* code for the reply."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class GpuLoad:
    uuid: str
    index: int
    memory_used: int
    jobs: int


def place_job(gpus: list[GpuLoad], slots: int, given_index: list[int] | None,
              err_nogpu: int, err_inval: int) -> list[GpuLoad]:
    """The GPUs for a job, in placement order (that order becomes CUDA_VISIBLE_DEVICES)."""
    if not gpus:
        raise PlacementError(err_nogpu, "this node has no GPU managed by nvshare-scheduler")
    if given_index:
        by_index = {g.index: g for g in gpus}
        chosen = []
        for index in given_index:
            if index not in by_index:
                raise PlacementError(err_nogpu, f"GPU index {index} (from Slurm) is not managed "
                                                f"here; managed: {sorted(by_index)}")
            if by_index[index] not in chosen:
                chosen.append(by_index[index])
        return chosen
    if slots <= 0:
        raise PlacementError(err_inval, "slots must be at least 1 when no GPU index is given")
    ranked = sorted(gpus, key=lambda g: (g.memory_used, g.jobs, g.index))
    return ranked[:min(slots, len(gpus))]
