"""The daemon's state across restarts: state.json restored at start and saved off the event
loop after each change to jobs or overrides (registry.py writes it), and the registry rebuilt
from Slurm when that state was lost or incomplete, with questions about unknown jobs parked until
the rebuild ends.
"""
from __future__ import annotations

import asyncio
import socket

from . import log, proto, slurm
from .connection import Connection
from .daemoncore import Core, user_name
from .placement import PlacementError
from .policytypes import GpuSettings
from .priority import classify
from .registry import Job


class StateKeeper:
    """Restores, saves and rebuilds the core's registry."""

    def __init__(self, core: Core):
        self.core = core
        self.logger = core.logger
        self.registry = core.registry
        self.gpus = core.gpus
        self.incomplete = False           # restore() found state missing or partly bad
        self._state_dirty = False
        self._save_task: asyncio.Task | None = None
        self._rebuilding = False
        self._parked: list[tuple[Connection, proto.Frame]] = []
        self._rebuild_task: asyncio.Future | None = None

    def restore(self) -> None:
        result = self.registry.load(set(self.gpus))
        for uuid, gpu in self.gpus.items():
            overrides = self.registry.gpu_overrides.get(uuid)
            try:
                gpu.settings = GpuSettings.from_config(self.core.cfg, overrides)
            except (TypeError, ValueError, KeyError) as exc:
                self.logger.error(f"state: gpu {uuid}: admin overrides {log.escape(overrides)} "
                                  f"left out: {log.escape(exc)}")
                self.registry.gpu_overrides.pop(uuid, None)
                gpu.settings = GpuSettings.from_config(self.core.cfg)
        for job in self.registry.jobs.values():
            job.gpu_index = [self.gpus[u].index for u in job.gpus]
            self.core.add_gang(job)
        if self.registry.jobs:
            self.logger.info(f"state: restored {len(self.registry.jobs)} registered jobs from "
                             f"{self.registry.path}; their clients re-register when they reconnect")
        self.incomplete = not result.complete

    def save(self) -> None:
        """Write state.json soon, off the event loop; saves asked for meanwhile become one."""
        self._state_dirty = True
        if self.core.loop is None or not self.core.loop.is_running():
            return self.save_now()
        if self._save_task is None or self._save_task.done():
            self._save_task = self.core.loop.create_task(self._save_soon())

    async def _save_soon(self) -> None:
        while self._state_dirty:
            self._state_dirty = False
            data = self.registry.snapshot()
            try:
                await asyncio.to_thread(self.registry.write, data)
            except OSError as exc:
                self.logger.error(f"state: cannot write {self.registry.path}: {exc}")

    def save_now(self) -> None:
        self._state_dirty = False
        try:
            self.registry.save()
        except OSError as exc:
            self.logger.error(f"state: cannot write {self.registry.path}: {exc}")

    async def flush(self) -> None:
        """At the end: the save under way, then the last changes, written now."""
        if self._save_task is not None:
            await self._save_task
        self.save_now()

    # --- lost state: rebuilt from Slurm --------------------------------------------------------

    def start_rebuild(self) -> None:
        """Rebuild from Slurm in the background, questions about unknown jobs parked meanwhile
        (from the first connection on)."""
        self._rebuilding = True
        self._rebuild_task = asyncio.ensure_future(self.rebuild_from_slurm())

    def node_name(self) -> str:
        return socket.gethostname().split(".")[0] if self.core.cfg.node_name == "-" \
            else self.core.cfg.node_name

    async def rebuild_from_slurm(self) -> None:
        """Register the jobs Slurm runs on this node that the registry lacks. Meanwhile a client or
        a TaskProlog asking for a job not (yet) known waits for the answer instead of hearing
        "no such job" and running ungated."""
        node = self.node_name()
        self._rebuilding = True
        try:
            try:
                records = await asyncio.to_thread(slurm.jobs_on_node, node,
                                                  self.core.cfg.slurm_bin_dir)
            except slurm.SlurmError as exc:
                self.logger.error(f"state: cannot rebuild the registry from Slurm: "
                                  f"{log.escape(exc, 256)}; jobs it lacks are unknown until "
                                  f"their prolog runs again")
                return
            added = []
            for record in records:
                job = self._rebuild_job(record, node)
                if job is not None:
                    added.append(job.job_id)
            self.logger.info(f"state: rebuilt from Slurm on node {log.escape(node)}: "
                             f"{len(added)} jobs added {added[:20]}"
                             f"{' ...' if len(added) > 20 else ''}")
        finally:
            self._rebuilding = False
            parked, self._parked = self._parked, []
            for conn, frame in parked:
                if not conn.closed:
                    conn.dispatch(frame)
                    conn.unhold()

    def _rebuild_job(self, record: slurm.JobRecord, node: str) -> Job | None:
        gres = record.on_node(node)
        if record.job_id in self.registry.jobs or record.uid is None or record.gid is None:
            return None
        if not gres.holds_nvshare and not gres.gpu_index:
            return None
        given = list(gres.nvshare_gpus) or (list(gres.gpu_index) if not gres.holds_nvshare
                                            else None)
        try:
            job = self.core.place(record.job_id, record.uid, record.gid, record.user or
                                  user_name(record.uid), record.name, gres.nvshare_slots, given, 0)
        except PlacementError as exc:
            self.logger.warning(f"job {record.job_id}: not rebuilt from Slurm: "
                                f"{log.escape(exc)}")
            return None
        job.rebuilt = True
        share = classify(self.core.cfg.priority_classes, record.qos, record.partition,
                         record.interactive, record.comment)
        job.share_class, job.class_reason = share.name, share.reason
        self.registry.add_job(job)
        self.core.add_gang(job)
        self.save()
        return job

    def park(self, conn: Connection, frame: proto.Frame) -> bool:
        """While the registry is rebuilt, keep a question about an unknown job for later."""
        if not self._rebuilding:
            return False
        conn.hold()
        self._parked.append((conn, frame))
        return True
