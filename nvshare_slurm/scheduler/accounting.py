"""What each job got from each shared GPU, and what each GPU spent on switching: the numbers behind
"how much GPU did my job get?", the epilog's usage line and the Prometheus metrics.

The ledger watches GpuState rather than being told about each event: the daemon calls observe()
once after every change to a GPU's state (daemon.apply), and the ledger compares the GPU's holders,
queue and memory with what it saw last time. So no message handler can forget to account, and this
module stays pure (a clock is passed in) like gpustate.py.

Per job and GPU: seconds during which at least one of the job's processes held the GPU's lock
(held), seconds during which at least one waited for it and none held it (wait), the peak of the
job's memory there (resident + swapped out), bytes moved to host memory, and turns granted. Per
job: seconds suspended (suspend.py says when a suspension starts and ends); a suspended client's
requests wait outside the queue, so that time is never counted as waiting.
Per GPU: hand-overs (grants), drains (a DROP_LOCK answered, with how long it took), bytes moved out
and back in, and the seconds of drains that moved memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..node.render import human_size

if TYPE_CHECKING:       # a type only: the epilog, which prints usage_line, loads no policy
    from ..policy.gpustate import GpuState


@dataclass
class JobGpuUsage:
    held_sec: float = 0.0
    wait_sec: float = 0.0
    peak_memory: int = 0
    swapped_out: int = 0          # bytes of this job moved to host memory, over its life
    turns: int = 0                # lock grants to its processes
    holding_since: float | None = None
    waiting_since: float | None = None

    def totals(self, now: float) -> tuple[float, float]:
        """(held, wait) seconds including a turn or a wait still under way."""
        held = self.held_sec + (now - self.holding_since if self.holding_since is not None else 0)
        wait = self.wait_sec + (now - self.waiting_since if self.waiting_since is not None else 0)
        return held, wait


@dataclass
class GpuCounters:
    handovers: int = 0            # lock grants
    drains: int = 0               # DROP_LOCKs answered by a release
    drain_sec: float = 0.0        # DROP_LOCK to release, summed
    swap_sec: float = 0.0         # the same, for drains that moved memory to host memory
    swap_out_bytes: int = 0
    swap_in_bytes: int = 0


@dataclass
class _Seen:
    """What observe() saw of one GPU last time."""
    holders: dict[int, tuple[int, float | None]] = field(default_factory=dict)  # client: job, drop_at
    holding_jobs: set[int] = field(default_factory=set)
    waiting_jobs: set[int] = field(default_factory=set)      # waiting, none of its clients holding
    swapped: dict[int, tuple[int, int]] = field(default_factory=dict)           # client: job, bytes


class UsageLedger:
    def __init__(self) -> None:
        self.jobs: dict[int, dict[str, JobGpuUsage]] = {}
        self.gpus: dict[str, GpuCounters] = {}
        self._seen: dict[str, _Seen] = {}
        self.suspended_sec: dict[int, float] = {}       # job -> seconds suspended, ended ones
        self.suspended_since: dict[int, float] = {}     # job -> since when, while suspended

    def _job(self, job_id: int, uuid: str) -> JobGpuUsage:
        return self.jobs.setdefault(job_id, {}).setdefault(uuid, JobGpuUsage())

    def observe(self, gpu: GpuState, now: float) -> None:
        """Account for every change of `gpu` since the last call."""
        seen = self._seen.setdefault(gpu.uuid, _Seen())
        counters = self.gpus.setdefault(gpu.uuid, GpuCounters())
        holders = {cid: (h.client.job_id, h.drop_at) for cid, h in gpu.holders.items()}
        swapped = {cid: (gpu.clients[cid].job_id if cid in gpu.clients else 0, use.swapped)
                   for cid, use in gpu.memory.usage.items() if use.swapped}

        moved = 0
        for cid, (job_id, before) in seen.swapped.items():
            after = swapped.get(cid, (job_id, 0))[1]
            if after < before and cid in gpu.memory.usage:  # brought back, not gone with its client
                counters.swap_in_bytes += before - after
        for cid, (job_id, after) in swapped.items():
            before = seen.swapped.get(cid, (job_id, 0))[1]
            if after > before:
                moved += after - before
                counters.swap_out_bytes += after - before
                self._job(job_id, gpu.uuid).swapped_out += after - before

        for cid, (_job_id, drop_at) in seen.holders.items():
            if cid not in holders and drop_at is not None:
                counters.drains += 1
                counters.drain_sec += now - drop_at
                if moved:
                    counters.swap_sec += now - drop_at
        for cid, (job_id, _) in holders.items():
            if cid not in seen.holders:
                counters.handovers += 1
                self._job(job_id, gpu.uuid).turns += 1

        holding_jobs = {job_id for job_id, _ in holders.values()}
        waiting_jobs = {info.job_id for info, _ in gpu.queue.values()} - holding_jobs
        self._intervals(gpu.uuid, seen, holding_jobs, waiting_jobs, now)
        memory = gpu.memory
        for job_id, allocated in memory.job_allocated.items():
            usage = self._job(job_id, gpu.uuid)
            usage.peak_memory = max(usage.peak_memory,
                                    allocated + memory.job_swapped.get(job_id, 0))
        for job_id, swapped_bytes in memory.job_swapped.items():
            if job_id not in memory.job_allocated:
                usage = self._job(job_id, gpu.uuid)
                usage.peak_memory = max(usage.peak_memory, swapped_bytes)
        seen.holders, seen.swapped = holders, swapped
        seen.holding_jobs, seen.waiting_jobs = holding_jobs, waiting_jobs

    def _intervals(self, uuid: str, seen: _Seen, holding_jobs: set[int], waiting_jobs: set[int],
                   now: float) -> None:
        """Open and close the held and wait intervals of the jobs whose state changed."""
        changed = (holding_jobs ^ seen.holding_jobs) | (waiting_jobs ^ seen.waiting_jobs)
        for job_id in changed:
            usage = self._job(job_id, uuid)
            if job_id in holding_jobs and usage.holding_since is None:
                usage.holding_since = now
            elif job_id not in holding_jobs and usage.holding_since is not None:
                usage.held_sec += now - usage.holding_since
                usage.holding_since = None
            if job_id in waiting_jobs and usage.waiting_since is None:
                usage.waiting_since = now
            elif job_id not in waiting_jobs and usage.waiting_since is not None:
                usage.wait_sec += now - usage.waiting_since
                usage.waiting_since = None

    def suspend(self, job_id: int, now: float) -> None:
        """The job is suspended from now (a second call while it is changes nothing)."""
        self.suspended_since.setdefault(job_id, now)

    def resume(self, job_id: int, now: float) -> None:
        since = self.suspended_since.pop(job_id, None)
        if since is not None:
            self.suspended_sec[job_id] = self.suspended_sec.get(job_id, 0.0) + now - since

    def job_usage(self, job_id: int, now: float) -> dict[str, dict[str, Any]]:
        """Per GPU uuid: held_sec, wait_sec, suspended_sec (the job's, on each of its GPUs),
        peak_memory, swapped_out, turns (JSON-ready)."""
        out: dict[str, dict[str, Any]] = {}
        since = self.suspended_since.get(job_id)
        suspended = self.suspended_sec.get(job_id, 0.0) + (now - since if since is not None else 0)
        for uuid, usage in self.jobs.get(job_id, {}).items():
            held, wait = usage.totals(now)
            out[uuid] = {"held_sec": round(held, 3), "wait_sec": round(wait, 3),
                         "suspended_sec": round(suspended, 3),
                         "peak_memory": usage.peak_memory, "swapped_out": usage.swapped_out,
                         "turns": usage.turns}
        return out

    def forget_job(self, job_id: int) -> None:
        self.jobs.pop(job_id, None)
        self.suspended_sec.pop(job_id, None)
        self.suspended_since.pop(job_id, None)


def usage_line(usage: dict[str, dict[str, Any]], index_of: dict[str, int] | None = None) -> str:
    """One line for logs and AdminComment: `gpu0 held=12.3s wait=0.4s peak=3.2G swapped=0B ...`."""
    if not usage:
        return "no GPU work"
    parts = []
    for uuid, u in usage.items():
        label = f"gpu{index_of[uuid]}" if index_of and uuid in index_of else uuid
        suspended = float(u.get("suspended_sec") or 0)
        parts.append(f"{label} held={u['held_sec']:.1f}s wait={u['wait_sec']:.1f}s "
                     f"{f'suspended={suspended:.1f}s ' if suspended else ''}"
                     f"peak={human_size(int(u['peak_memory']))} "
                     f"swapped={human_size(int(u['swapped_out']))} turns={u['turns']}")
    return "; ".join(parts)

