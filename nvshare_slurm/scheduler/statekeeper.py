"""The daemon's state across restarts: state.json restored at start and saved off the event
loop after each change to jobs or overrides (registry.py writes it), and the registry rebuilt
from Slurm when that state was lost or incomplete, with questions about unknown jobs parked until
the rebuild ends.

Lost state is never "run unshared". While Slurm cannot be asked, the rebuild asks again (backing
off to once a minute) for as long as it takes, and questions about unknown jobs stay parked. A
process of an unknown job that re-registers meanwhile is accepted provisionally when the kernel
vouches for it: its cgroup places it in that very job (`job_<id>`, proctrack/task cgroup) and its
uid is the connection's. The job is then placed on the GPUs its TaskProlog gave it (the process's
NVSHARE_MANAGED_GPUS) and gated at once; Slurm's answer later confirms it (or says it is not
there, logged). Without such a cgroup (proctrack/linuxproc) the process waits for Slurm.
"""
from __future__ import annotations

import asyncio
from typing import Any

from ..base import log
from ..base.priority import classify
from ..node import slurm
from ..policy.placement import PlacementError
from ..policy.policytypes import GpuSettings
from ..wire import proto
from ..wire.proto import C
from .connection import Connection
from .daemoncore import Core, user_name
from .procinfo import read_identity
from .registry import Job

# Seconds between attempts to ask Slurm while it does not answer; the last one repeats.
REBUILD_RETRY_SEC = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


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
        self.registry.on_job_added = self._job_known

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
        return self.core.cfg.slurm_node()

    async def rebuild_from_slurm(self) -> None:
        """Register the jobs Slurm runs on this node that the registry lacks. Meanwhile a client or
        a TaskProlog asking for a job not (yet) known waits for the answer instead of hearing
        "no such job" and running ungated."""
        node = self.node_name()
        self._rebuilding = True
        try:
            attempt = 0
            while True:
                try:
                    records = await asyncio.to_thread(slurm.jobs_on_node, node,
                                                      self.core.cfg.slurm_bin_dir)
                    break
                except slurm.SlurmError as exc:
                    delay = REBUILD_RETRY_SEC[min(attempt, len(REBUILD_RETRY_SEC) - 1)]
                    if attempt == 0:
                        self.logger.error(
                            f"state: cannot rebuild the registry from Slurm: "
                            f"{log.escape(exc, 256)}; asking again until it answers (every "
                            f"{REBUILD_RETRY_SEC[-1]:g}s at most). Meanwhile a process of an "
                            f"unknown job is accepted provisionally where its cgroup shows its "
                            f"job, and waits otherwise")
                    else:
                        self.logger.debug(f"state: Slurm still not answering: "
                                          f"{log.escape(exc, 256)}")
                    attempt += 1
                    await asyncio.sleep(delay)
            added = []
            for record in records:
                job = self._rebuild_job(record, node)
                if job is not None:
                    added.append(job.job_id)
            self._check_provisional({r.job_id: r for r in records}, node)
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
        known = self.registry.jobs.get(record.job_id)
        if known is not None or record.uid is None or record.gid is None:
            return None
        if not gres.holds_nvshare and not gres.gpu_index:
            return None
        given = list(gres.nvshare_gpus) or (list(gres.gpu_index) if not gres.holds_nvshare
                                            else None)
        try:
            job = self.core.place(record.job_id, record.uid, record.gid, record.user or
                                  user_name(record.uid), record.name, gres.nvshare_slots, given)
        except PlacementError as exc:
            self.logger.warning(f"job {record.job_id}: not rebuilt from Slurm: "
                                f"{log.escape(exc)}")
            return None
        job.rebuilt = True
        job.multinode = record.multinode()
        share = classify(self.core.cfg.priority_classes, record.qos, record.partition,
                         record.interactive, record.comment)
        job.share_class, job.class_reason = share.name, share.reason
        self.registry.add_job(job)
        self.core.add_gang(job)
        self.save()
        return job

    def _check_provisional(self, records: dict[int, slurm.JobRecord], node: str) -> None:
        """Slurm has answered: each provisionally accepted job is confirmed with its record (its
        name, group, class), or reported when Slurm says it does not run here."""
        for job in [j for j in self.registry.jobs.values() if j.provisional]:
            record = records.get(job.job_id)
            job.provisional = False
            if record is None or record.uid != job.uid:
                self.logger.warning(
                    f"job {job.job_id}: accepted provisionally from its processes, but Slurm "
                    f"{'does not run it on ' + log.escape(node) if record is None else 'names another uid'}"
                    f"; kept gated until its epilog or an admin removes it")
                self.registry.job_changed(job)
                continue
            job.gid = record.gid if record.gid is not None else job.gid
            job.user, job.name = record.user or job.user, record.name
            job.slots = max(record.on_node(node).nvshare_slots, 1)
            share = classify(self.core.cfg.priority_classes, record.qos, record.partition,
                             record.interactive, record.comment)
            job.share_class, job.class_reason = share.name, share.reason
            if record.multinode() and not job.multinode:
                job.multinode = True        # its turns take the multi-node order from now on
                self.core.add_gang(job)
            self.registry.job_changed(job)
            self.logger.info(f"job {job.job_id}: accepted provisionally, now confirmed by Slurm")
        self.save()

    def _job_known(self, job_id: int) -> None:
        """A job registered (its prolog, a provisional acceptance) while the rebuild waits for
        Slurm: the questions parked about it are answered now, not when Slurm answers."""
        if not self._parked:
            return
        ready = [(c, f) for c, f in self._parked if int(f.body().job_id) == job_id]
        if not ready:
            return
        self._parked = [(c, f) for c, f in self._parked if int(f.body().job_id) != job_id]
        loop = self.core.loop
        for conn, frame in ready:
            if loop is not None and not conn.closed:
                loop.call_soon(self._answer_parked, conn, frame)

    @staticmethod
    def _answer_parked(conn: Connection, frame: proto.Frame) -> None:
        if not conn.closed:
            conn.dispatch(frame)
            conn.unhold()

    def park(self, conn: Connection, frame: proto.Frame) -> bool:
        """While the registry is rebuilt, keep a question about an unknown job for later; a
        re-registering process that its cgroup places in its job is accepted at once."""
        if not self._rebuilding:
            return False
        if frame.type == C.NVSHARE_MSG_CLIENT_REGISTER and self._adopt(conn, frame.body()):
            conn.dispatch(frame)          # its job is known now: registered as usual
            return True
        conn.hold()
        self._parked.append((conn, frame))
        return True

    def _adopt(self, conn: Connection, body: Any) -> bool:
        """A job, registered provisionally, for a process whose kernel-kept cgroup puts it in
        job_<id> with the connection's uid; False when the kernel does not vouch for it."""
        job_id = int(body.job_id)
        if job_id in self.registry.jobs or int(body.pid) != conn.pid:
            return False          # (a container's PID namespace: it waits for Slurm)
        identity = read_identity(conn.pid)
        if identity is None or identity.job_id != job_id or identity.uid != conn.uid:
            return False
        gpus = [u for u in self._given_gpus(conn.pid) if u in self.gpus]
        job = Job(job_id, identity.uid, identity.gid, user_name(identity.uid), "", len(gpus) or 1,
                  gpus, [self.gpus[u].index for u in gpus], rebuilt=True, provisional=True)
        self.registry.add_job(job)
        self.core.add_gang(job)
        self.save()
        self.logger.warning(
            f"job {job_id}: not known (state lost, Slurm not answering): accepted provisionally "
            f"from its process pid {conn.pid} (cgroup job_{job_id}, uid {identity.uid}), gated on "
            f"{','.join(map(str, job.gpu_index)) or 'the GPUs it uses'}; confirmed when Slurm "
            f"answers")
        return True

    @staticmethod
    def _given_gpus(pid: int) -> list[str]:
        """The GPUs the job's TaskProlog gave the process (NVSHARE_MANAGED_GPUS in its
        environment), in order; [] when it cannot be read."""
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environ = fh.read(1 << 20).split(b"\0")
        except OSError:
            return []
        for item in environ:
            if item.startswith(b"NVSHARE_MANAGED_GPUS="):
                value = item.split(b"=", 1)[1].decode("ascii", "replace")
                return list(dict.fromkeys(u for u in value.split(",") if u))[:64]
        return []
