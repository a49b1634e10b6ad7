"""The request-reply messages: job registration, unregistration and queries (root's prolog and
epilog, a job's TaskProlog), DEVICE_OPEN, status queries, admin updates and heartbeats. Each is
answered by one reply; a question about a job not yet known while the registry is rebuilt from
Slurm waits (Core.park) instead of hearing "no such job".
"""
from __future__ import annotations

import asyncio
import logging
import os
import pwd
from typing import Any

from ..base import log
from ..base.config import OVERRIDABLE
from ..node import slurm
from ..policy.gpustate import GpuState
from ..policy.placement import PlacementError
from ..policy.policytypes import GpuSettings
from ..wire import proto
from ..wire.proto import C
from . import admincomment
from .accounting import usage_line
from .connection import Connection
from .daemoncore import Core, Handler, fit, reply, user_name
from .devices import DeviceRequest, GpuDevices, Refused, open_device
from .registry import Job
from .statusreply import status_reply

_MODE_BY_CODE = {C.NVSHARE_MODE_AUTO: "auto", C.NVSHARE_MODE_CONCURRENT: "concurrent",
                 C.NVSHARE_MODE_SERIAL: "serial"}
_SWITCH_BY_CODE = {C.NVSHARE_SWITCH_AUTO: "auto", C.NVSHARE_SWITCH_FIXED: "fixed"}
# Status for non-root users is computed at most this often per kind of query (root's is always new).
STATUS_CACHE_SEC = 1.0


class RequestHandlers:
    """The handlers of request-reply messages, by message type (handlers())."""

    def __init__(self, core: Core, devices: GpuDevices):
        self.core = core
        self.logger = core.logger
        self.registry = core.registry
        self.gpus = core.gpus
        self.gangs = core.gangs
        self.ledger = core.ledger
        self.devices = devices
        self._devices_logged: set[tuple[int, str]] = set()
        self._throttle = log.Throttle()
        self._comments: set[asyncio.Future[None]] = set()   # AdminComment writes under way
        self._status_cache: dict[tuple[int, int], tuple[float, int, bytes]] = {}

    def handlers(self) -> dict[int, Handler]:
        return {C.NVSHARE_MSG_JOB_REGISTER: self._on_job_register,
                C.NVSHARE_MSG_JOB_UNREGISTER: self._on_job_unregister,
                C.NVSHARE_MSG_JOB_QUERY: self._on_job_query,
                C.NVSHARE_MSG_STATUS_QUERY: self._on_status_query,
                C.NVSHARE_MSG_ADMIN_UPDATE: self._on_admin_update,
                C.NVSHARE_MSG_HEARTBEAT: self._on_heartbeat,
                C.NVSHARE_MSG_DEVICE_OPEN: self._on_device_open}

    def _job_reply(self, conn: Connection, frame: proto.Frame, status: int, message: str,
                   job: Job | None = None) -> None:
        fields: dict[str, Any] = {"status": status, "message": fit(message)}
        if job is not None:
            fields.update(n_gpus=len(job.gpus), gpu_uuid=job.gpus, gpu_index=job.gpu_index)
        conn.send(C.NVSHARE_MSG_JOB_REPLY, fields, frame.seq)

    def _on_job_register(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        job_id = int(body.job_id)
        if conn.uid != 0:
            self.logger.warning(f"job {job_id}: registration by uid {conn.uid} (pid {conn.pid}) "
                                f"refused: only root registers jobs")
            return self._job_reply(conn, frame, C.NVSHARE_ERR_PERM, "only root registers jobs")
        existing = self.registry.jobs.get(job_id)
        if existing is not None:
            return self._job_reply(conn, frame, C.NVSHARE_OK, "already registered", existing)
        given = None
        if body.flags & C.NVSHARE_JOB_GPUS_GIVEN:
            if not 0 < body.n_gpus <= C.NVSHARE_MAX_GPUS:
                return self._job_reply(conn, frame, C.NVSHARE_ERR_INVAL,
                                       f"n_gpus {body.n_gpus} is outside 1..{C.NVSHARE_MAX_GPUS}")
            given = [int(body.gpu_index[i]) for i in range(body.n_gpus)]
        share_class = proto.class_of_flags(int(body.flags))
        if share_class is None:
            return self._job_reply(conn, frame, C.NVSHARE_ERR_INVAL,
                                   f"flags {body.flags:#x}: no such share class")
        user = proto.text(body.user) or user_name(int(body.uid))
        try:
            job = self.core.place(job_id, int(body.uid), int(body.gid), user, proto.text(body.name),
                                  int(body.slots), given)
        except PlacementError as exc:
            known = self.core.inventory_error
            reason = f"{exc} ({known})" if known else str(exc)
            self.logger.error(f"job {job_id}: cannot be placed: {reason}")
            return self._job_reply(conn, frame, exc.status, reason)
        job.share_class = share_class
        job.class_reason = proto.text(body.class_reason) or "default"
        job.multinode = bool(body.flags & C.NVSHARE_JOB_MULTINODE)
        self.registry.add_job(job)
        self.core.add_gang(job)
        self.core.save()
        self.core.suspends.job_started()
        self.logger.info(f"job {job_id}: registered for {log.escape(user)} (uid {job.uid}) on "
                         f"{', '.join(job.gpus)}, class {job.share_class} "
                         f"({log.escape(job.class_reason)})")
        self._job_reply(conn, frame, C.NVSHARE_OK, "registered", job)

    def _on_job_unregister(self, conn: Connection, frame: proto.Frame) -> None:
        job_id = int(frame.body().job_id)
        if conn.uid != 0:
            self.logger.warning(f"job {job_id}: unregistration by uid {conn.uid} refused")
            return reply(conn, frame, C.NVSHARE_ERR_PERM, "only root unregisters jobs")
        if job_id not in self.registry.jobs:
            return reply(conn, frame, C.NVSHARE_OK, "not registered")
        clients = list(self.registry.job_clients.get(job_id, {}).values())
        for client in clients:
            client_conn = client.connection
            if client_conn is not None:
                self.core.drop_client(client_conn)
                client_conn.close()
        job = self.registry.remove_job(job_id)
        self.gangs.remove_job(job_id)
        for gpu in self.gpus.values():
            self.core.after_event(gpu, gpu.tick(self.core.now()))
        self.core.save()
        usage = usage_line(self.ledger.job_usage(job_id, self.core.now()),
                           {u: self.gpus[u].index for u in job.gpus if u in self.gpus}
                           if job is not None else None)
        self.ledger.forget_job(job_id)
        self._devices_logged = {k for k in self._devices_logged if k[0] != job_id}
        self.logger.info(f"job {job_id}: unregistered ({len(clients)} clients disconnected); "
                         f"GPU usage: {usage}")
        if self.core.cfg.usage_admin_comment and job is not None:
            task = asyncio.ensure_future(self._write_admin_comment(job_id, usage))
            self._comments.add(task)
            task.add_done_callback(self._comments.discard)
        reply(conn, frame, C.NVSHARE_OK, "unregistered")

    async def _write_admin_comment(self, job_id: int, usage: str) -> None:
        """usage_admin_comment: the usage line into the job's AdminComment (admincomment.py), in a
        worker thread (scontrol and sacctmgr take up to 10 s each); the outcome is logged here."""
        cfg = self.core.cfg
        try:
            how = await asyncio.to_thread(admincomment.write, job_id, cfg.slurm_node(), usage,
                                          cfg.slurm_bin_dir)
        except slurm.SlurmError as exc:
            self.logger.warning(f"job {job_id}: GPU usage not written to its AdminComment: "
                                f"{log.escape(str(exc), 400)}")
        else:
            self.logger.info(f"job {job_id}: GPU usage written to its AdminComment ({how})")

    def _on_job_query(self, conn: Connection, frame: proto.Frame) -> None:
        job_id = int(frame.body().job_id)
        job = self.registry.jobs.get(job_id)
        if job is None:
            if self.core.park(conn, frame):
                return None
            return self._job_reply(conn, frame, C.NVSHARE_ERR_NOJOB,
                                   f"job {job_id} is not registered on this node")
        self._job_reply(conn, frame, C.NVSHARE_OK, "", job)

    def _on_device_open(self, conn: Connection, frame: proto.Frame) -> None:
        """A job's process that Slurm's device cgroup keeps from its GPU's device file gets the
        daemon's descriptor of it (devices.py says why and who may)."""
        body = frame.body()
        job = self.registry.jobs.get(int(body.job_id))
        if job is None:
            if self.core.park(conn, frame):
                return None
            return reply(conn, frame, C.NVSHARE_ERR_NOJOB,
                         f"job {body.job_id} is not registered on this node")
        request = DeviceRequest(job.job_id, conn.uid, conn.pid, int(body.dev_major),
                                int(body.dev_minor))
        try:
            path = self.devices.path_for(request, job.uid, job.gpus,
                                         (C.NVSHARE_ERR_PERM, C.NVSHARE_ERR_NOGPU))
        except Refused as exc:
            self._throttle(("device", job.job_id, str(exc)[:60]), logging.WARNING,
                           f"job {job.job_id} pid {conn.pid} uid {conn.uid}: device "
                           f"{request.major}:{request.minor} refused: {exc}")
            return reply(conn, frame, exc.status, str(exc))
        conn.hold()      # one request, one answer: nothing more is read meanwhile
        loop = self.core.loop
        assert loop is not None         # set before the listener opens: requests come after it
        opening = loop.run_in_executor(None, open_device, path, int(body.access))
        opening.add_done_callback(lambda done: self._device_opened(conn, frame, job, path, done))

    def _device_opened(self, conn: Connection, frame: proto.Frame, job: Job, path: str,
                       done: asyncio.Future) -> None:
        try:
            fd = done.result()
        except OSError as exc:
            self._throttle(("device open", job.job_id, path), logging.ERROR,
                           f"job {job.job_id}: cannot open {path} for pid {conn.pid}: "
                           f"{log.escape(exc)}")
            reply(conn, frame, C.NVSHARE_ERR_INTERNAL, f"cannot open {path}: {exc}")
        else:
            try:
                passed = conn.send_with_fd(C.NVSHARE_MSG_REPLY, {
                    "status": C.NVSHARE_OK, "message": fit(path)}, fd, frame.seq)
            finally:
                os.close(fd)
            if not passed:
                reply(conn, frame, C.NVSHARE_ERR_INTERNAL, "cannot pass the descriptor")
            elif (job.job_id, path) not in self._devices_logged:
                self._devices_logged.add((job.job_id, path))
                self.logger.info(f"job {job.job_id}: {path} opened for its processes (Slurm's "
                                 f"device cgroup denies it to them)")
        conn.unhold()

    def _on_heartbeat(self, conn: Connection, frame: proto.Frame) -> None:
        conn.send(C.NVSHARE_MSG_HEARTBEAT, {"timestamp_ns": frame.body().timestamp_ns}, frame.seq)

    def _on_status_query(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        what, job_id = int(body.what), int(body.job_id)
        if conn.uid == 0:
            status, tail = status_reply(self.core, what, job_id)
        else:
            # A status of many jobs takes milliseconds of the loop: users share one per second.
            key, now = (what, job_id), self.core.now()
            cached = self._status_cache.get(key)
            if cached is None or now - cached[0] >= STATUS_CACHE_SEC:
                if len(self._status_cache) > 64:
                    self._status_cache.clear()
                cached = self._status_cache[key] = (now, *status_reply(self.core, what, job_id))
            status, tail = cached[1], cached[2]
        conn.send(C.NVSHARE_MSG_STATUS_REPLY, {"status": status, "json_length": len(tail)},
                  frame.seq, tail)

    def _admin_allowed(self, uid: int) -> bool:
        if uid == 0:
            return True
        try:
            return pwd.getpwnam(self.core.cfg.slurm_user).pw_uid == uid
        except KeyError:
            return False

    def _on_admin_update(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        if not self._admin_allowed(conn.uid):
            self.logger.warning(f"admin update by uid {conn.uid} (pid {conn.pid}) refused: "
                                f"needs root or {self.core.cfg.slurm_user}")
            return reply(conn, frame, C.NVSHARE_ERR_PERM,
                         f"admin updates need root or the SlurmUser ({self.core.cfg.slurm_user})")
        try:
            targets = self._select_gpus(proto.text(body.gpu))
            changes = _admin_changes(body)
        except ValueError as exc:
            return reply(conn, frame, C.NVSHARE_ERR_INVAL, str(exc))
        if targets is None:
            return reply(conn, frame, C.NVSHARE_ERR_NOGPU,
                         f"no managed GPU {proto.text(body.gpu)!r}")
        if not changes:
            return reply(conn, frame, C.NVSHARE_ERR_INVAL, "nothing to change")
        now = self.core.now()
        for gpu in targets:
            overrides = self.registry.gpu_overrides.setdefault(gpu.uuid, {})
            overrides.update(changes)
            settings = GpuSettings.from_config(self.core.cfg, overrides)
            self.core.after_event(gpu, gpu.update_settings(settings, now))
        self.core.save()
        text = " ".join(f"{k}={v}" for k, v in changes.items())
        names = ", ".join(g.uuid for g in targets)
        self.logger.info(f"admin update by uid {conn.uid}: {names}: {text}")
        reply(conn, frame, C.NVSHARE_OK, f"{names}: {text}")

    def _select_gpus(self, selector: str) -> list[GpuState] | None:
        selector = selector.strip()
        if selector == "all":
            return list(self.gpus.values())
        if selector in self.gpus:
            return [self.gpus[selector]]
        if selector.isdigit() and int(selector) in self.core.by_index:
            return [self.core.by_index[int(selector)]]
        return None


def _admin_changes(body: Any) -> dict[str, Any]:
    """The overrides an ADMIN_UPDATE asks for, checked against config.OVERRIDABLE (the limits of the
    config file and of nvshare-status update); ValueError says what is refused."""
    changes: dict[str, Any] = {}
    keep = C.NVSHARE_KEEP
    if body.mode != keep:
        if body.mode not in _MODE_BY_CODE:
            raise ValueError(f"mode {body.mode} is not one of auto, concurrent, serial")
        changes["mode"] = _MODE_BY_CODE[body.mode]
    if body.switch_mode != keep:
        if body.switch_mode not in _SWITCH_BY_CODE:
            raise ValueError(f"switch_mode {body.switch_mode} is not auto or fixed")
        changes["switch_time_mode"] = _SWITCH_BY_CODE[body.switch_mode]
    if body.switch_time_ms != keep:
        fixed = OVERRIDABLE["switch_time_fixed"]      # seconds; the wire says milliseconds
        low_ms, high_ms = round(fixed.low * 1000), round(fixed.high * 1000)
        if not low_ms <= body.switch_time_ms <= high_ms:
            raise ValueError(f"switch_time {body.switch_time_ms} ms is outside "
                             f"{_duration(fixed.low)}..{_duration(fixed.high)}")
        changes["switch_time_fixed"] = body.switch_time_ms / 1000
        changes.setdefault("switch_time_mode", "fixed")
    if body.memory_reserve_percent != keep:
        reserve = OVERRIDABLE["memory_reserve_percent"]
        if not reserve.low <= body.memory_reserve_percent <= reserve.high:
            raise ValueError(f"memory_reserve_percent {body.memory_reserve_percent} is outside "
                             f"{reserve.low}..{reserve.high}")
        changes["memory_reserve_percent"] = int(body.memory_reserve_percent)
    if body.max_runtime_sec != keep:
        runtime = OVERRIDABLE["max_runtime_sec"]
        if not runtime.low <= body.max_runtime_sec:
            raise ValueError(f"max_runtime_sec {body.max_runtime_sec} must be at least {runtime.low}")
        if not body.max_runtime_sec <= runtime.high:
            raise ValueError(f"max_runtime_sec {body.max_runtime_sec} is outside "
                             f"{runtime.low}..{runtime.high}")
        changes["max_runtime_sec"] = int(body.max_runtime_sec)
    return changes


def _duration(seconds: float) -> str:
    """A limit of the switch time as the refusal names it: 10 ms, 30 s, 1 day."""
    if seconds < 1:
        return f"{seconds * 1000:g} ms"
    if seconds % 86400 == 0:
        days = int(seconds // 86400)
        return f"{days} day" if days == 1 else f"{days} days"
    return f"{seconds:g} s"
