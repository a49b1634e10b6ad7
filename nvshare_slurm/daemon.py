"""nvshare-scheduler: the per-node daemon. One asyncio loop, one Unix socket, every GPU on its own.

This module is the wiring: message handlers, peer credentials, timers, signals, state saving.
The socket and the bounds on each peer are connection.py, the policy is gpustate.py (and gang.py),
placement is placement.py, jobs and persistence are registry.py.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import pwd
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import __version__, config, log, proto, slurm
from .accounting import UsageLedger, usage_line
from .burstpage import BurstPages
from .demand import Demand
from .gang import GangPolicy
from .gpustate import GpuState
from .policytypes import (
    CONTENDED,
    DROP,
    GRANT,
    HANDOFF,
    MEM_REPLY,
    SWAP_OUT,
    SWAP_UNANSWERED,
    UNRESPONSIVE,
    Action,
    ClientInfo,
    GpuSettings,
    MemDecision,
)
from .devices import DeviceRequest, GpuDevices, Refused, open_device
from .inventory import ConfiguredInventory, Inventory, InventoryError, from_config
from .placement import GpuLoad, PlacementError, place_job
from .priority import classify
from .proto import C
from .connection import (Connection, Limits, Listener, Violation, listening_socket, peer_pidfd,
                         prepare_socket_path, raise_fd_limit, remove_socket, signal_pidfd)
from .registry import Job, RegisteredClient, Registry
from .rogue import RogueTracker

_DROP_NAMES = {C.NVSHARE_DROP_TIMESLICE: "time slice over", C.NVSHARE_DROP_MAX_RUNTIME:
               "max runtime reached", C.NVSHARE_DROP_ADMIN: "admin update",
               C.NVSHARE_DROP_MEMORY: "memory no longer fits"}
_MODE_BY_CODE = {C.NVSHARE_MODE_AUTO: "auto", C.NVSHARE_MODE_CONCURRENT: "concurrent",
                 C.NVSHARE_MODE_SERIAL: "serial"}
_SWITCH_BY_CODE = {C.NVSHARE_SWITCH_AUTO: "auto", C.NVSHARE_SWITCH_FIXED: "fixed"}
_CLIENT_MESSAGES = {C.NVSHARE_MSG_LOCK_REQUEST, C.NVSHARE_MSG_LOCK_RELEASED,
                    C.NVSHARE_MSG_MEM_UPDATE, C.NVSHARE_MSG_DRAIN_STUCK,
                    C.NVSHARE_MSG_DEMAND}
# A hook that cannot bring its memory back gives the lock back and asks again every 250 ms: the
# warnings of that loop are repeated at most this often per client and GPU (debug in between).
REPEAT_WARNING_SEC = 60.0
# GPUs not placed for its job that one client may name; past it the rest are neither listed in
# status nor logged (NVSHARE_MAX_GPUS is what one process can see).
MAX_UNGATED = 16
UNGATED_MORE = "..."
# Status for non-root users is computed at most this often per kind of query (root's is always new).
STATUS_CACHE_SEC = 1.0
# Room for the STATUS_REPLY struct in front of the JSON.
STATUS_JSON_MAX = proto.MAX_PAYLOAD - proto.ffi.sizeof("struct nvshare_status_reply")
# Settings that only a restart can change (the socket is bound, the GPUs are enumerated).
_RESTART_ONLY = ("socket", "state_dir", "gpus", "metrics_port")


class Daemon:
    def __init__(self, cfg: config.Config, config_file: str | None = None,
                 inventory: Inventory | None = None):
        self.cfg = cfg
        self.config_file = config_file
        self.logger = log.get()
        self.inventory_error = ""
        if inventory is None:
            try:
                inventory = from_config(cfg)
            except InventoryError as exc:
                # Keep serving: registrations then get this reason instead of "daemon down".
                self.inventory_error = str(exc)
                self.logger.error(f"GPU inventory: {exc}")
                inventory = ConfiguredInventory(())
        self.inventory = inventory
        self.registry = Registry(cfg.state_dir)
        self.gpus: dict[str, GpuState] = {}
        for info in sorted(self.inventory.gpus(), key=lambda g: g.index):
            self.gpus[info.uuid] = GpuState(info.uuid, info.index, info.memory_total,
                                            GpuSettings.from_config(cfg), name=info.name)
        self.by_index = {g.index: g for g in self.gpus.values()}
        self.gangs = GangPolicy()
        self._work: list[tuple[GpuState, list[Action]]] | None = None   # while Actions go out
        self.rogues = RogueTracker()
        self.ledger = UsageLedger()
        self.burst_pages = BurstPages()
        self.devices = GpuDevices({g.uuid: g.device for g in self.inventory.gpus() if g.device})
        self._devices_logged: set[tuple[int, str]] = set()
        self._rogue_reported: set[tuple[str, int]] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._sharing: dict[str, tuple[str, str]] = {}   # GPU -> (sharing, reason) last logged
        self._warned: dict[tuple[str, int, str], float] = {}   # (gpu, client, what) -> when
        self.listener: Listener | None = None
        self._throttle = log.Throttle()
        self.state_incomplete = False
        self._state_dirty = False
        self._save_task: asyncio.Task | None = None
        self._rebuilding = False
        self._parked: list[tuple[Connection, proto.Frame]] = []
        self._rebuild_task: asyncio.Future | None = None
        self._status_cache: dict[tuple[int, int], tuple[float, int, bytes]] = {}
        self._stop: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._handlers: dict[int, Callable[[Connection, proto.Frame], None]] = {
            C.NVSHARE_MSG_CLIENT_REGISTER: self._on_client_register,
            C.NVSHARE_MSG_LOCK_REQUEST: self._on_lock_request,
            C.NVSHARE_MSG_LOCK_RELEASED: self._on_lock_released,
            C.NVSHARE_MSG_MEM_UPDATE: self._on_mem_update,
            C.NVSHARE_MSG_DRAIN_STUCK: self._on_drain_stuck,
            C.NVSHARE_MSG_DEMAND: self._on_demand,
            C.NVSHARE_MSG_JOB_REGISTER: self._on_job_register,
            C.NVSHARE_MSG_JOB_UNREGISTER: self._on_job_unregister,
            C.NVSHARE_MSG_JOB_QUERY: self._on_job_query,
            C.NVSHARE_MSG_STATUS_QUERY: self._on_status_query,
            C.NVSHARE_MSG_ADMIN_UPDATE: self._on_admin_update,
            C.NVSHARE_MSG_HEARTBEAT: self._on_heartbeat,
            C.NVSHARE_MSG_DEVICE_OPEN: self._on_device_open,
        }

    # --- time and GPU settings ---------------------------------------------------------------

    def now(self) -> float:
        return self.loop.time() if self.loop is not None else time.monotonic()

    def restore_state(self) -> None:
        result = self.registry.load(set(self.gpus))
        for uuid, gpu in self.gpus.items():
            overrides = self.registry.gpu_overrides.get(uuid)
            try:
                gpu.settings = GpuSettings.from_config(self.cfg, overrides)
            except (TypeError, ValueError, KeyError) as exc:
                self.logger.error(f"state: gpu {uuid}: admin overrides {log.escape(overrides)} "
                                  f"left out: {log.escape(exc)}")
                self.registry.gpu_overrides.pop(uuid, None)
                gpu.settings = GpuSettings.from_config(self.cfg)
        for job in self.registry.jobs.values():
            job.gpu_index = [self.gpus[u].index for u in job.gpus]
            self._add_gang(job)
        if self.registry.jobs:
            self.logger.info(f"state: restored {len(self.registry.jobs)} registered jobs from "
                             f"{self.registry.path}; their clients re-register when they reconnect")
        self.state_incomplete = not result.complete

    def _save(self) -> None:
        """Write state.json soon, off the event loop; saves asked for meanwhile become one."""
        self._state_dirty = True
        if self.loop is None or not self.loop.is_running():
            return self._save_now()
        if self._save_task is None or self._save_task.done():
            self._save_task = self.loop.create_task(self._save_soon())

    async def _save_soon(self) -> None:
        while self._state_dirty:
            self._state_dirty = False
            data = self.registry.snapshot()
            try:
                await asyncio.to_thread(self.registry.write, data)
            except OSError as exc:
                self.logger.error(f"state: cannot write {self.registry.path}: {exc}")

    def _save_now(self) -> None:
        self._state_dirty = False
        try:
            self.registry.save()
        except OSError as exc:
            self.logger.error(f"state: cannot write {self.registry.path}: {exc}")

    # --- lost state: rebuilt from Slurm --------------------------------------------------------

    def node_name(self) -> str:
        return socket.gethostname().split(".")[0] if self.cfg.node_name == "-" \
            else self.cfg.node_name

    async def rebuild_from_slurm(self) -> None:
        """Register the jobs Slurm runs on this node that the registry lacks. Meanwhile a client or
        a TaskProlog asking for a job not (yet) known waits for the answer instead of hearing
        "no such job" and running ungated."""
        node = self.node_name()
        self._rebuilding = True
        try:
            try:
                records = await asyncio.to_thread(slurm.jobs_on_node, node,
                                                  self.cfg.slurm_bin_dir)
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
            job = self._place(record.job_id, record.uid, record.gid, record.user or
                              _user_name(record.uid), record.name, gres.nvshare_slots, given, 0)
        except PlacementError as exc:
            self.logger.warning(f"job {record.job_id}: not rebuilt from Slurm: "
                                f"{log.escape(exc)}")
            return None
        job.rebuilt = True
        share = classify(self.cfg.priority_classes, record.qos, record.partition,
                         record.interactive, record.comment)
        job.share_class, job.class_reason = share.name, share.reason
        self.registry.add_job(job)
        self._add_gang(job)
        self._save()
        return job

    def _park(self, conn: Connection, frame: proto.Frame) -> bool:
        """While the registry is rebuilt, keep a question about an unknown job for later."""
        if not self._rebuilding:
            return False
        conn.hold()
        self._parked.append((conn, frame))
        return True

    # --- actions from the policy ---------------------------------------------------------------

    def after_event(self, gpu: GpuState, actions: list[Action]) -> None:
        """The one way Actions go out, after every event and timer: the event's Actions, then
        what sending them brought about (an unresponsive holder's release, a client cut off), then
        the gang pass over all GPUs and what its Actions bring about, then the GPUs' timers.

        Sending may cut a peer off (Connection.abort), which drops its client: that event's
        Actions join the work list here instead of going out in the middle of these."""
        if self._work is not None:
            self._work.append((gpu, actions))
            return
        work = self._work = [(gpu, actions)]
        touched: dict[str, GpuState] = {}
        try:
            self._drain(work, touched)
            # Again only while its Actions bring more about: each holder is reported unresponsive
            # once per drop and each client is dropped once, so this ends.
            while self.gangs.gangs:
                work.extend(self.gangs.schedule(self.now()))
                for note in self.gangs.notes:
                    self.logger.warning(note)
                self.gangs.notes.clear()
                touched.update(self.gpus)
                if not self._drain(work, touched):
                    break
        finally:
            self._work = None
        for armed in touched.values():
            self._arm(armed)

    def _drain(self, work: list[tuple[GpuState, list[Action]]],
               touched: dict[str, GpuState]) -> bool:
        """Send the work list in order; what sending brings about goes to its end. True when
        sending brought anything about."""
        followed = False
        while work:
            gpu, actions = work.pop(0)
            touched[gpu.uuid] = gpu
            left = len(work)
            work.extend(self._send(gpu, actions))
            followed = followed or len(work) > left
        return followed

    def _send(self, gpu: GpuState, actions: list[Action]) -> list[tuple[GpuState, list[Action]]]:
        """Send one GPU's Actions to their clients and log them; the Actions this brings about
        are returned, not sent."""
        follow_ups: list[tuple[GpuState, list[Action]]] = []
        for action in actions:
            client = self.registry.clients.get(action.client.client_id)
            conn = client.connection if client is not None else None
            where = f"gpu {gpu.uuid}: {action.client.label()}"
            if action.kind == GRANT:
                flags = action.flags
                if conn is not None and action.bursts and self._give_burst_page(conn, gpu.uuid):
                    flags |= C.NVSHARE_GRANT_BURSTS
                if conn is not None:
                    conn.send(C.NVSHARE_MSG_LOCK_GRANT, {"gpu_uuid": gpu.uuid,
                                                         "flags": flags,
                                                         "switch_ms": action.value})
                kind = "exclusive" if action.flags == C.NVSHARE_GRANT_EXCLUSIVE else \
                    "shared, bursts take turns" if flags & C.NVSHARE_GRANT_BURSTS else "shared"
                self.logger.debug(f"{where}: lock granted ({kind})")
                if action.bytes:
                    self._warn_now_and_then(
                        (gpu.uuid, action.client.client_id, "granted without room"),
                        f"{where}: lock granted although {_size(action.bytes)} of its swapped "
                        f"memory does not fit: nothing more can move to host memory")
            elif action.kind == CONTENDED:
                if conn is not None:
                    conn.send(C.NVSHARE_MSG_LOCK_CONTENDED, {"gpu_uuid": gpu.uuid})
                self.logger.debug(f"{where}: others wait, asked to release when idle")
            elif action.kind == DROP:
                if conn is not None:
                    conn.send(C.NVSHARE_MSG_DROP_LOCK, {"gpu_uuid": gpu.uuid,
                                                        "switch_ms": action.value,
                                                        "bytes": action.bytes})
                move = f"; asked to move {_size(action.bytes)} to host memory" \
                    if action.bytes else ""
                self.logger.info(f"{where}: lock dropped "
                                 f"({_DROP_NAMES.get(action.value, '?')}){move}")
            elif action.kind == SWAP_OUT:
                if conn is not None:
                    conn.send(C.NVSHARE_MSG_PREPARE_SWAP_OUT, {"gpu_uuid": gpu.uuid,
                                                               "bytes": action.bytes})
                self.logger.info(f"{where}: asked to move {_size(action.bytes)} to host memory")
            elif action.kind == SWAP_UNANSWERED:
                self.logger.warning(f"{where}: did not answer PREPARE_SWAP_OUT "
                                    f"({_size(action.bytes)}) within {self.cfg.drop_grace_sec:g}s")
            elif action.kind == MEM_REPLY and action.reply is not None:
                if conn is not None:
                    self._mem_reply(conn, gpu, action.reply, action.token)
                if action.reply.no_room:
                    self.logger.warning(f"{where}: allocation answered without the room it "
                                        f"waited for: nothing more moved to host memory (within "
                                        f"{self.cfg.drop_grace_sec:g}s); the driver decides")
                else:
                    self.logger.debug(f"{where}: allocation answered after waiting for room")
            elif action.kind == HANDOFF and action.source is not None:
                self._hand_over(gpu, action.source, action.client, conn)
            elif action.kind == UNRESPONSIVE:
                released = self._unresponsive(gpu, action.client)
                if released:
                    follow_ups.append((gpu, released))
        self.ledger.observe(gpu, self.now())
        self._log_sharing(gpu)
        return follow_ups

    def _hand_over(self, gpu: GpuState, holder: ClientInfo, successor: ClientInfo,
                   successor_conn: Connection | None) -> None:
        """HANDOFF: one new eventfd to the holder (before its DROP_LOCK) and to its successor, and
        to nobody else. The holder's hook writes it once its work is drained; the successor's
        hook, waiting for the lock, starts on it. Both messages are advice: where one cannot go
        (a peer's output is queued, it has gone), the successor waits for its grant as before."""
        entry = self.registry.clients.get(holder.client_id)
        holder_conn = entry.connection if entry is not None else None
        if holder_conn is None or successor_conn is None:
            return
        try:
            fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        except OSError as exc:
            self._warn_now_and_then((gpu.uuid, 0, "eventfd"), f"gpu {gpu.uuid}: cannot make an "
                                    f"eventfd ({log.escape(exc)}): turns pass through grants")
            return
        try:
            sent = holder_conn.send_with_fd(C.NVSHARE_MSG_HANDOFF, {
                "gpu_uuid": gpu.uuid, "flags": C.NVSHARE_HANDOFF_FROM}, fd) and \
                successor_conn.send_with_fd(C.NVSHARE_MSG_HANDOFF, {
                    "gpu_uuid": gpu.uuid, "flags": C.NVSHARE_HANDOFF_TO}, fd)
        finally:
            os.close(fd)
        self.logger.debug(f"gpu {gpu.uuid}: {holder.label()}: its turn passes to "
                          f"{successor.label()} {'by hand-over' if sent else 'by grant'}")

    def _give_burst_page(self, conn: Connection, uuid: str) -> bool:
        """Has this connection the GPU's burst page, or can it have it now? Without it the client
        co-runs as before, and the next such grant tries again."""
        if uuid in conn.burst_pages:
            return True
        try:
            fd = self.burst_pages.fd(uuid)
        except OSError as exc:
            self._warn_now_and_then((uuid, 0, "burst page"), f"gpu {uuid}: cannot make its burst "
                                    f"page ({log.escape(exc)}): co-runners' bursts overlap")
            return False
        if not conn.send_with_fd(C.NVSHARE_MSG_BURST_PAGE, {"gpu_uuid": uuid}, fd):
            return False
        conn.burst_pages.add(uuid)
        return True

    def _add_gang(self, job: Job) -> None:
        if self.gangs.add_job(job.job_id, [self.gpus[u] for u in job.gpus if u in self.gpus]):
            self.logger.info(f"job {job.job_id}: a gang on GPUs "
                             f"{','.join(map(str, job.gpu_index))}: it takes its turns on all "
                             f"of them together")

    def _log_sharing(self, gpu: GpuState) -> None:
        now = (gpu.sharing, gpu.sharing_reason)
        if gpu.sharing and self._sharing.get(gpu.uuid, ("", ""))[0] != now[0]:
            self.logger.info(f"gpu {gpu.uuid}: sharing: {now[0]} ({now[1]})")
        self._sharing[gpu.uuid] = now

    def _warn_now_and_then(self, key: tuple[str, int, str], text: str) -> None:
        now = self.now()
        last = self._warned.get(key)
        if last is None or now - last >= REPEAT_WARNING_SEC:
            self._warned[key] = now
            self.logger.warning(text)
        else:
            self.logger.debug(text)

    def _mem_reply(self, conn: Connection, gpu: GpuState, decision: MemDecision,
                   seq: int) -> None:
        conn.send(C.NVSHARE_MSG_MEM_REPLY, {"gpu_uuid": gpu.uuid, "status": decision.status,
                                            "flags": decision.flags,
                                            "available": decision.available,
                                            "total": decision.total}, seq)

    def _unresponsive(self, gpu: GpuState, info: ClientInfo) -> list[Action]:
        """A holder that ignored DROP_LOCK for drop_grace_sec loses the lock here, whatever the
        policy, so one client can never keep a GPU from the others; kill also signals it (and
        cutting its connection off drops it). The Actions of a release for it come back."""
        grace = self.cfg.drop_grace_sec
        where = f"gpu {gpu.uuid}: {info.label()}"
        client = self.registry.clients.get(info.client_id)
        conn = client.connection if client is not None else None
        if self.cfg.unresponsive_holder == "kill":
            self.logger.warning(f"{where}: has not released the lock {grace:g}s after DROP_LOCK; "
                                f"killing it (unresponsive_holder=kill)")
            pidfd = conn.pidfd if conn is not None else None
            if pidfd is None:
                self.logger.error(f"{where}: its process cannot be told apart from a reused pid; "
                                  f"not signalled")
            else:
                try:
                    signal_pidfd(pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    self.logger.warning(f"{where}: the process that registered has exited (a "
                                        f"child it forked holds the connection); not signalled")
                except OSError as exc:
                    self.logger.error(f"{where}: cannot kill: {exc}")
            if conn is not None:
                self.logger.warning(f"{where}: lock revoked, connection closed")
                conn.abort()          # drops its lock and queue place: the next waiter runs
            return []
        if not gpu.queue:
            self.logger.warning(f"{where}: has not released the lock {grace:g}s after DROP_LOCK "
                                f"(unresponsive; policy warn)")
            return []
        self.logger.warning(f"{where}: has not released the lock {grace:g}s after DROP_LOCK "
                            f"(unresponsive; policy warn): lock revoked and handed on; what it "
                            f"still runs there is not gated")
        return gpu.release(info.client_id, self.now())

    def _arm(self, gpu: GpuState) -> None:
        handle = self._timers.pop(gpu.uuid, None)
        if handle is not None:
            handle.cancel()
        deadline = gpu.next_deadline()
        if deadline is not None and self.loop is not None:
            self._timers[gpu.uuid] = self.loop.call_at(deadline, self._on_timer, gpu.uuid,
                                                       deadline)

    def _on_timer(self, uuid: str, deadline: float) -> None:
        self._timers.pop(uuid, None)
        gpu = self.gpus[uuid]
        self.after_event(gpu, gpu.tick(max(self.now(), deadline)))

    # --- connections ---------------------------------------------------------------------------

    def _limits(self) -> Limits:
        return Limits(per_uid=self.cfg.max_connections_per_uid)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """asyncio's own errors: one line each, now and then, never a traceback per event."""
        exc = context.get("exception")
        text = context.get("message", "error")
        if exc is not None:
            text += f": {type(exc).__name__}: {exc}"
        self._throttle(("loop", text[:80]), logging.ERROR, f"event loop: {log.escape(text, 256)}")

    def _on_frame(self, conn: Connection, frame: proto.Frame) -> None:
        handler = self._handlers.get(frame.type)
        if handler is None:
            raise Violation(f"{frame.name} is not a message a peer may send")
        handler(conn, frame)

    def _drop_client(self, conn: Connection) -> None:
        # conn.client stays: the connection's log lines still name the client.
        client = conn.client
        if client is None or self.registry.remove_client(client.client_id) is None:
            return
        for key in [k for k in self._warned if k[1] == client.client_id]:
            del self._warned[key]
        now = self.now()
        for uuid in client.gpus:
            gpu = self.gpus[uuid]
            self.after_event(gpu, gpu.remove_client(client.client_id, now))
        self.logger.debug(f"{conn.who()}: client disconnected")

    def _reply(self, conn: Connection, frame: proto.Frame, status: int, message: str) -> None:
        conn.send(C.NVSHARE_MSG_REPLY, {"status": status, "message": _fit(message)}, frame.seq)

    # --- client messages -----------------------------------------------------------------------

    def _on_client_register(self, conn: Connection, frame: proto.Frame) -> None:
        if conn.client is not None:
            raise Violation("CLIENT_REGISTER on a connection that is already registered")
        body = frame.body()
        job = self.registry.jobs.get(body.job_id)

        def refuse(status: int, message: str) -> None:
            self.logger.warning(f"job {body.job_id} pid {conn.pid} uid {conn.uid}: client "
                                f"refused: {message}")
            conn.send(C.NVSHARE_MSG_CLIENT_REGISTER_REPLY,
                      {"status": status, "message": _fit(message)}, frame.seq)
            conn.close()

        if job is None:
            if self._park(conn, frame):
                return None
            return refuse(C.NVSHARE_ERR_NOJOB, f"job {body.job_id} is not registered on this node")
        if conn.uid != 0 and conn.uid != job.uid:
            return refuse(C.NVSHARE_ERR_PERM, f"uid {conn.uid} may not attach to job "
                                              f"{job.job_id} of uid {job.uid}")
        if body.pid != conn.pid:
            return refuse(C.NVSHARE_ERR_PERM, f"pid {body.pid} in the message is not the "
                                              f"connecting process {conn.pid}")
        if self.cfg.unresponsive_holder == "kill":
            conn.pidfd = peer_pidfd(conn)
        client = self.registry.add_client(job.job_id, body.step_id, conn.pid, conn.uid, job.user,
                                          body.mem_limit or job.mem_limit, conn, job.share_class)
        conn.client = client
        conn.send(C.NVSHARE_MSG_CLIENT_REGISTER_REPLY,
                  {"status": C.NVSHARE_OK, "client_id": client.client_id,
                   "idle_release_us": int(self.cfg.idle_release_ms * 1000),
                   "message": "registered"}, frame.seq)
        self.logger.debug(f"{conn.who()}: client registered (client {client.client_id})")

    def _client_gpu(self, conn: Connection, frame: proto.Frame, body: Any) -> GpuState | None:
        """The GPU a client message names, if it is managed and placed for the client's job."""
        if conn.client is None:
            raise Violation(f"{frame.name} before CLIENT_REGISTER")
        uuid = proto.text(body.gpu_uuid)
        job = self.registry.jobs.get(conn.client.job_id)
        gpu = self.gpus.get(uuid)
        if gpu is not None and job is not None and job.rebuilt and uuid not in job.gpus:
            # Its processes were given GPUs before the state was lost: follow them, gated. A GPU
            # of the fresh placement that none of its clients uses gives way to this one.
            used = {u for c in self.registry.job_clients.get(job.job_id, {}).values()
                    for u in c.gpus}
            unused = [i for i, u in enumerate(job.gpus) if u not in used]
            gpus, index = list(job.gpus), list(job.gpu_index)
            if unused:
                gpus[unused[0]], index[unused[0]] = uuid, gpu.index
            else:
                gpus, index = gpus + [uuid], index + [gpu.index]
            job.gpus, job.gpu_index = gpus, index
            self.registry.job_changed(job)
            self.gangs.remove_job(job.job_id)      # now perhaps a gang over more GPUs
            self._add_gang(job)
            self._save()
            self.logger.info(f"job {job.job_id}: rebuilt from Slurm, its process uses gpu {uuid}: "
                             f"added to its placement")
        if gpu is None or job is None or uuid not in job.gpus:
            ungated = conn.client.ungated
            if uuid in ungated or len(ungated) > MAX_UNGATED:
                return None
            if len(ungated) == MAX_UNGATED:
                # One peer must not grow the daemon's memory, the log or status without bound.
                ungated.add(UNGATED_MORE)
                self.logger.warning(f"{conn.who()}: names more than {MAX_UNGATED} GPUs not "
                                    f"placed for its job; no more of them are listed or logged")
                return None
            ungated.add(uuid)
            self.logger.warning(f"gpu {log.escape(proto.raw(body.gpu_uuid)) or '?'}: {conn.who()}: "
                                f"not a GPU placed "
                                f"for this job; its work there is not gated")
            return None
        conn.client.gpus.add(uuid)
        return gpu

    def _on_lock_request(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        gpu = self._client_gpu(conn, frame, body)
        if gpu is None:
            return self._reply(conn, frame, C.NVSHARE_ERR_NOGPU,
                               f"GPU {log.escape(proto.text(body.gpu_uuid))} is not managed "
                               f"for this job")
        self.after_event(gpu, gpu.request(_info(conn), self.now()))

    def _on_lock_released(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        gpu = self._client_gpu(conn, frame, body)
        if gpu is None:
            return
        where = f"gpu {gpu.uuid}: {conn.who()}"
        if body.flags & C.NVSHARE_RELEASE_NO_ROOM:
            # Granted, but its swapped memory could not come back: it asks again later.
            self._warn_now_and_then((gpu.uuid, _info(conn).client_id, "no room"),
                                    f"{where}: lock given back: no room on the GPU to bring its "
                                    f"swapped memory back")
        elif body.flags & C.NVSHARE_RELEASE_SWAPPED:
            self.logger.info(f"{where}: lock released after moving {_size(int(body.bytes))} "
                             f"to host memory")
        else:
            self.logger.debug(f"{where}: lock released"
                              f"{' (idle)' if body.flags & C.NVSHARE_RELEASE_IDLE else ''}")
        self.after_event(gpu, gpu.release(_info(conn).client_id, self.now()))

    def _on_mem_update(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        gpu = self._client_gpu(conn, frame, body)
        if gpu is None:
            if body.request:
                conn.send(C.NVSHARE_MSG_MEM_REPLY, {"gpu_uuid": proto.raw(body.gpu_uuid),
                                                    "status": C.NVSHARE_ERR_NOGPU}, frame.seq)
            return
        request = int(body.request)
        actions, decision = gpu.mem_update(_info(conn), self.now(), int(body.allocated),
                                           int(body.fixed), int(body.swapped), request,
                                           int(body.flags), frame.seq)
        where = f"gpu {gpu.uuid}: {conn.who()}"
        if decision is not None:
            if decision.status != C.NVSHARE_OK:
                self.logger.info(f"{where}: allocation of {request} bytes refused (would pass "
                                 f"the job's limit or never fit)")
            elif decision.flags & C.NVSHARE_MEM_DEFERRED:
                self.logger.debug(f"{where}: allocation of {_size(request)} deferred: no room "
                                  f"now, resident at its next grant")
            self._mem_reply(conn, gpu, decision, frame.seq)
        elif request:
            self.logger.info(f"{where}: allocation of {_size(request)} waits for room")
        self.after_event(gpu, actions)

    def _on_drain_stuck(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        gpu = self._client_gpu(conn, frame, body)
        if gpu is None:
            return
        info = _info(conn)
        resolution = self.gangs.drain_stuck(gpu, info, self.now())
        self._warn_now_and_then(
            (gpu.uuid, info.client_id, "drain stuck"),
            f"gpu {gpu.uuid}: {info.label()}: its work there has not finished "
            f"{int(body.bytes)} ms after it was asked to release (DRAIN_STUCK); {resolution}")
        self.after_event(gpu, gpu.tick(self.now()))

    def _on_demand(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        gpu = self._client_gpu(conn, frame, body)
        if gpu is None:
            return
        demand = Demand(min(int(body.busy_ppm), 1_000_000) / 1e6, int(body.burst_us) / 1e6,
                        int(body.gap_us) / 1e6)
        info = _info(conn)
        before = gpu.takes_turns(info.client_id)
        actions = gpu.report_demand(info, demand, self.now())
        if gpu.takes_turns(info.client_id) != before:
            self.logger.debug(f"gpu {gpu.uuid}: {conn.who()}: "
                              f"{'takes turns' if not before else 'co-runs'} ({demand.describe()})")
        self.after_event(gpu, actions)

    # --- request/reply messages ----------------------------------------------------------------

    def _job_reply(self, conn: Connection, frame: proto.Frame, status: int, message: str,
                   job: Job | None = None) -> None:
        fields: dict[str, Any] = {"status": status, "message": _fit(message)}
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
        user = proto.text(body.user) or _user_name(int(body.uid))
        try:
            job = self._place(job_id, int(body.uid), int(body.gid), user, proto.text(body.name),
                              int(body.slots), given, int(body.mem_limit))
        except PlacementError as exc:
            reason = f"{exc} ({self.inventory_error})" if self.inventory_error else str(exc)
            self.logger.error(f"job {job_id}: cannot be placed: {reason}")
            return self._job_reply(conn, frame, exc.status, reason)
        job.share_class = share_class
        job.class_reason = proto.text(body.class_reason) or "default"
        self.registry.add_job(job)
        self._add_gang(job)
        self._save()
        self.logger.info(f"job {job_id}: registered for {log.escape(user)} (uid {job.uid}) on "
                         f"{', '.join(job.gpus)}, class {job.share_class} "
                         f"({log.escape(job.class_reason)})")
        self._job_reply(conn, frame, C.NVSHARE_OK, "registered", job)

    def _place(self, job_id: int, uid: int, gid: int, user: str, name: str, slots: int,
               given: list[int] | None, mem_limit: int) -> Job:
        """A new Job placed on this node's GPUs (not yet added); PlacementError when it cannot be."""
        jobs_on: dict[str, int] = {}
        for job in self.registry.jobs.values():
            for uuid in job.gpus:
                jobs_on[uuid] = jobs_on.get(uuid, 0) + 1
        loads = [GpuLoad(g.uuid, g.index, g.sum_allocated, jobs_on.get(g.uuid, 0))
                 for g in self.gpus.values()]
        placed = place_job(loads, slots, given, C.NVSHARE_ERR_NOGPU, C.NVSHARE_ERR_INVAL)
        return Job(job_id, uid, gid, user, name, slots, [g.uuid for g in placed],
                   [g.index for g in placed], mem_limit)

    def _on_job_unregister(self, conn: Connection, frame: proto.Frame) -> None:
        job_id = int(frame.body().job_id)
        if conn.uid != 0:
            self.logger.warning(f"job {job_id}: unregistration by uid {conn.uid} refused")
            return self._reply(conn, frame, C.NVSHARE_ERR_PERM, "only root unregisters jobs")
        if job_id not in self.registry.jobs:
            return self._reply(conn, frame, C.NVSHARE_OK, "not registered")
        clients = list(self.registry.job_clients.get(job_id, {}).values())
        for client in clients:
            client_conn = client.connection
            if client_conn is not None:
                self._drop_client(client_conn)
                client_conn.close()
        job = self.registry.remove_job(job_id)
        self.gangs.remove_job(job_id)
        for gpu in self.gpus.values():
            self.after_event(gpu, gpu.tick(self.now()))
        self._save()
        usage = usage_line(self.ledger.job_usage(job_id, self.now()),
                           {u: self.gpus[u].index for u in job.gpus if u in self.gpus}
                           if job is not None else None)
        self.ledger.forget_job(job_id)
        self._devices_logged = {k for k in self._devices_logged if k[0] != job_id}
        self.logger.info(f"job {job_id}: unregistered ({len(clients)} clients disconnected); "
                         f"GPU usage: {usage}")
        self._reply(conn, frame, C.NVSHARE_OK, "unregistered")

    def _on_job_query(self, conn: Connection, frame: proto.Frame) -> None:
        job_id = int(frame.body().job_id)
        job = self.registry.jobs.get(job_id)
        if job is None:
            if self._park(conn, frame):
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
            if self._park(conn, frame):
                return None
            return self._reply(conn, frame, C.NVSHARE_ERR_NOJOB,
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
            return self._reply(conn, frame, exc.status, str(exc))
        conn.hold()      # one request, one answer: nothing more is read meanwhile
        opening = self.loop.run_in_executor(None, open_device, path, int(body.access))
        opening.add_done_callback(lambda done: self._device_opened(conn, frame, job, path, done))

    def _device_opened(self, conn: Connection, frame: proto.Frame, job: Job, path: str,
                       done: asyncio.Future) -> None:
        try:
            fd = done.result()
        except OSError as exc:
            self._throttle(("device open", job.job_id, path), logging.ERROR,
                           f"job {job.job_id}: cannot open {path} for pid {conn.pid}: "
                           f"{log.escape(exc)}")
            self._reply(conn, frame, C.NVSHARE_ERR_INTERNAL, f"cannot open {path}: {exc}")
        else:
            try:
                passed = conn.send_with_fd(C.NVSHARE_MSG_REPLY, {
                    "status": C.NVSHARE_OK, "message": _fit(path)}, fd, frame.seq)
            finally:
                os.close(fd)
            if not passed:
                self._reply(conn, frame, C.NVSHARE_ERR_INTERNAL, "cannot pass the descriptor")
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
            status, tail = self.status(what, job_id)
        else:
            # A status of many jobs takes milliseconds of the loop: users share one per second.
            key, now = (what, job_id), self.now()
            cached = self._status_cache.get(key)
            if cached is None or now - cached[0] >= STATUS_CACHE_SEC:
                if len(self._status_cache) > 64:
                    self._status_cache.clear()
                cached = self._status_cache[key] = (now, *self.status(what, job_id))
            status, tail = cached[1], cached[2]
        conn.send(C.NVSHARE_MSG_STATUS_REPLY, {"status": status, "json_length": len(tail)},
                  frame.seq, tail)

    def status(self, what: int, job_id: int = 0) -> tuple[int, bytes]:
        """(status, tail): JSON on success, else the error message."""
        data: dict[str, Any] = {"node": socket.gethostname(), "time": time.time(),
                                "version": __version__, "daemon_pid": os.getpid()}
        now = self.now()
        if what == C.NVSHARE_STATUS_GPUS:
            placed: dict[str, list[int]] = {u: [] for u in self.gpus}
            for job in self.registry.jobs.values():
                for uuid in job.gpus:
                    placed.setdefault(uuid, []).append(job.job_id)
            data["gpus"] = [g.status(now, self.rogues.for_status(g.uuid), placed[g.uuid])
                            for g in self.gpus.values()]
        elif what == C.NVSHARE_STATUS_JOBS:
            data["jobs"] = [self._job_status(j) for j in self.registry.jobs.values()]
        elif what == C.NVSHARE_STATUS_JOB:
            found = self.registry.jobs.get(job_id)
            if found is None:
                return C.NVSHARE_ERR_NOJOB, f"job {job_id} is not registered on this node".encode()
            data["jobs"] = [self._job_status(found)]
        elif what == C.NVSHARE_STATUS_CONFIG:
            data["config"] = self.cfg.as_dict()
        else:
            return C.NVSHARE_ERR_INVAL, f"unknown status query {what}".encode()
        return C.NVSHARE_OK, _fit_status(data)

    def _job_status(self, job: Job) -> dict[str, Any]:
        clients = []
        for client in self.registry.job_clients.get(job.job_id, {}).values():
            gpus: dict[str, Any] = {}
            for uuid in sorted(client.gpus):
                gpu = self.gpus[uuid]
                use = gpu.usage.get(client.client_id)
                gpus[uuid] = {"allocated": use.allocated if use else 0,
                              "swapped": use.swapped if use else 0,
                              "state": gpu.client_state(client.client_id)}
            for uuid in sorted(client.ungated):
                gpus[uuid] = {"allocated": 0, "swapped": 0, "state": "ungated"}
            clients.append({"pid": client.pid, "step_id": client.step_id, "gpus": gpus})
        return {"job_id": job.job_id, "user": job.user, "uid": job.uid, "name": job.name,
                "slots": job.slots, "gpus": list(job.gpus), "gpu_index": list(job.gpu_index),
                "registered": job.registered, "clients": clients,
                "share_class": job.share_class, "class_reason": job.class_reason,
                "usage": self.ledger.job_usage(job.job_id, self.now()),
                "gang": self.gangs.status(job.job_id)}

    def _admin_allowed(self, uid: int) -> bool:
        if uid == 0:
            return True
        try:
            return pwd.getpwnam(self.cfg.slurm_user).pw_uid == uid
        except KeyError:
            return False

    def _on_admin_update(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        if not self._admin_allowed(conn.uid):
            self.logger.warning(f"admin update by uid {conn.uid} (pid {conn.pid}) refused: "
                                f"needs root or {self.cfg.slurm_user}")
            return self._reply(conn, frame, C.NVSHARE_ERR_PERM,
                               f"admin updates need root or the SlurmUser ({self.cfg.slurm_user})")
        try:
            targets = self._select_gpus(proto.text(body.gpu))
            changes = _admin_changes(body)
        except ValueError as exc:
            return self._reply(conn, frame, C.NVSHARE_ERR_INVAL, str(exc))
        if targets is None:
            return self._reply(conn, frame, C.NVSHARE_ERR_NOGPU,
                               f"no managed GPU {proto.text(body.gpu)!r}")
        if not changes:
            return self._reply(conn, frame, C.NVSHARE_ERR_INVAL, "nothing to change")
        now = self.now()
        for gpu in targets:
            overrides = self.registry.gpu_overrides.setdefault(gpu.uuid, {})
            overrides.update(changes)
            self.after_event(gpu, gpu.update_settings(GpuSettings.from_config(self.cfg, overrides), now))
        self._save()
        text = " ".join(f"{k}={v}" for k, v in changes.items())
        names = ", ".join(g.uuid for g in targets)
        self.logger.info(f"admin update by uid {conn.uid}: {names}: {text}")
        self._reply(conn, frame, C.NVSHARE_OK, f"{names}: {text}")

    def _select_gpus(self, selector: str) -> list[GpuState] | None:
        selector = selector.strip()
        if selector == "all":
            return list(self.gpus.values())
        if selector in self.gpus:
            return [self.gpus[selector]]
        if selector.isdigit() and int(selector) in self.by_index:
            return [self.by_index[int(selector)]]
        return None

    # --- config reload, rogue processes ----------------------------------------------------------

    def reload(self) -> None:
        try:
            new = config.load(self.config_file, require_file=self.config_file is not None)
        except config.ConfigError as exc:
            self.logger.error(f"reload: {exc}; keeping the running configuration")
            return
        kept = {k: getattr(self.cfg, k) for k in _RESTART_ONLY if getattr(new, k) != getattr(
            self.cfg, k)}
        if kept:
            self.logger.warning(f"reload: {', '.join(kept)} change only with a restart; "
                                f"keeping the running values")
            from dataclasses import replace
            new = replace(new, **kept)
        self.cfg = new
        self.logger.setLevel(new.log_level.upper())
        if self.listener is not None:
            self.listener.set_limits(self._limits())
        now = self.now()
        for uuid, gpu in self.gpus.items():
            settings = GpuSettings.from_config(new, self.registry.gpu_overrides.get(uuid))
            self.after_event(gpu, gpu.update_settings(settings, now))
        self.logger.info(f"reload: configuration reloaded from "
                         f"{self.config_file or config.config_path()}")

    async def check_rogues(self) -> None:
        """One look at every GPU's processes; report (and with policy kill, kill) rogue ones."""
        registered = self.registry.client_pids()
        for gpu in self.gpus.values():
            try:
                if isinstance(self.inventory, ConfiguredInventory):
                    procs = self.inventory.processes(gpu.uuid)
                else:
                    procs = await asyncio.to_thread(self.inventory.processes, gpu.uuid)
            except InventoryError as exc:
                self.logger.warning(f"gpu {gpu.uuid}: rogue check: {exc}")
                continue
            for proc in self.rogues.check(gpu.uuid, procs, registered, os.getpid()):
                if (gpu.uuid, proc.pid) in self._rogue_reported:
                    continue
                self._rogue_reported.add((gpu.uuid, proc.pid))
                if self.cfg.rogue_process == "kill":
                    self.logger.warning(f"gpu {gpu.uuid}: pid {proc.pid} uses {proc.memory} bytes "
                                        f"without nvshare (rogue); killing it")
                    try:
                        os.kill(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    except OSError as exc:
                        self.logger.error(f"gpu {gpu.uuid}: pid {proc.pid}: cannot kill: {exc}")
                else:
                    self.logger.warning(f"gpu {gpu.uuid}: pid {proc.pid} uses {proc.memory} bytes "
                                        f"without nvshare (rogue; policy warn)")

    async def _rogue_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.rogue_check_sec)
            try:
                await self.check_rogues()
            except Exception as exc:  # noqa: BLE001 - a failed check must never stop the daemon
                self.logger.error(f"rogue check failed: {exc!r}")

    # --- lifetime --------------------------------------------------------------------------------

    async def serve(self) -> int:
        self.loop = asyncio.get_running_loop()
        path = self.cfg.socket
        if not await prepare_socket_path(path):
            self.logger.error(f"another nvshare-scheduler answers on {path}; not starting")
            return 1
        # Before the socket appears: whoever sees the socket finds the metrics too.
        metrics = None
        if self.cfg.metrics_port:
            from .metrics import MetricsServer   # prometheus-client only where metrics are on
            metrics = MetricsServer(self, self.cfg.metrics_port)
            try:
                await metrics.start()
            except OSError as exc:
                self.logger.error(f"metrics: cannot listen on port {self.cfg.metrics_port}: "
                                  f"{exc}; serving without metrics")
                metrics = None
        self.listener = Listener(listening_socket(path), self._on_frame, self._drop_client,
                                 self._limits())
        self.loop.set_exception_handler(self._loop_error)
        if self.state_incomplete:
            self._rebuilding = True      # from the first connection on
            self._rebuild_task = asyncio.ensure_future(self.rebuild_from_slurm())
        self.listener.start()
        self._stop = asyncio.Event()
        self.loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        self.loop.add_signal_handler(signal.SIGINT, self._stop.set)
        self.loop.add_signal_handler(signal.SIGHUP, self.reload)
        rogue_task = asyncio.ensure_future(self._rogue_loop())
        modes = ", ".join(f"{g.uuid} ({g.settings.mode})" for g in self.gpus.values()) or "none"
        self.logger.info(f"listening on {path} (pid {os.getpid()}); GPUs: {modes}")
        await self._stop.wait()
        self.logger.info("stopping: SIGTERM")
        rogue_task.cancel()
        if metrics is not None:
            metrics.close()
        self.listener.close()
        self.burst_pages.close()
        for handle in self._timers.values():
            handle.cancel()
        if self._save_task is not None:
            await self._save_task
        self._save_now()
        remove_socket(path)
        return 0


def _admin_changes(body: Any) -> dict[str, Any]:
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
        if not 10 <= body.switch_time_ms <= 86_400_000:
            raise ValueError(f"switch_time {body.switch_time_ms} ms is outside 10 ms..1 day")
        changes["switch_time_fixed"] = body.switch_time_ms / 1000
        changes.setdefault("switch_time_mode", "fixed")
    if body.memory_reserve_percent != keep:
        if not 0 <= body.memory_reserve_percent <= 90:
            raise ValueError(f"memory_reserve_percent {body.memory_reserve_percent} is outside 0..90")
        changes["memory_reserve_percent"] = int(body.memory_reserve_percent)
    if body.max_runtime_sec != keep:
        if not 1 <= body.max_runtime_sec:
            raise ValueError(f"max_runtime_sec {body.max_runtime_sec} must be at least 1")
        changes["max_runtime_sec"] = int(body.max_runtime_sec)
    return changes


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _info(conn: Connection) -> RegisteredClient:
    """The client of a connection that _client_gpu found registered."""
    if conn.client is None:
        raise Violation("a client message before CLIENT_REGISTER")
    return conn.client


def _fit_status(data: dict[str, Any]) -> bytes:
    """The status JSON within one frame: when it does not fit, the longest prefix of its list
    ("gpus" or "jobs"; a lone job's "clients") that does, and "truncated" says what was left out."""
    text = json.dumps(data).encode()
    if len(text) <= STATUS_JSON_MAX:
        return text
    key = "gpus" if "gpus" in data else "jobs"
    items = data[key]
    if len(items) == 1 and "clients" in items[0]:
        job = dict(items[0])
        data[key] = [job]
        items, key, holder = job["clients"], "clients", job
    else:
        holder = data
    total = len(items)
    low, high = 0, total         # the most items that fit lies in [low, high)
    while high - low > 1:
        mid = (low + high) // 2
        holder[key] = items[:mid]
        data["truncated"] = {"list": key, "shown": mid, "total": total}
        if len(json.dumps(data).encode()) <= STATUS_JSON_MAX:
            low = mid
        else:
            high = mid
    holder[key] = items[:low]
    data["truncated"] = {"list": key, "shown": low, "total": total}
    return json.dumps(data).encode()


def _size(value: int) -> str:
    if value >= 1 << 30:
        return f"{value / (1 << 30):.1f} GiB"
    return f"{value / (1 << 20):.1f} MiB"


def _fit(message: str) -> str:
    raw = message.encode("utf-8", "replace")[: C.NVSHARE_TEXT_LEN - 1]
    return raw.decode("utf-8", "ignore")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvshare-scheduler",
                                     description="nvshare per-node GPU scheduler (foreground)")
    parser.add_argument("--config", metavar="PATH",
                        help=f"config file (default: $NVSHARE_CONFIG or {config.DEFAULT_PATH})")
    args = parser.parse_args(argv)
    log.setup("nvshare-scheduler")
    try:
        cfg = config.load(args.config, require_file=args.config is not None)
    except config.ConfigError as exc:
        log.get().error(f"config: {exc}")
        return 1
    logger = log.setup("nvshare-scheduler", cfg.log_level)
    raise_fd_limit()
    daemon = Daemon(cfg, args.config)
    if not daemon.gpus:
        logger.warning("no GPUs found: job registrations will be refused")
    daemon.restore_state()
    try:
        return asyncio.run(daemon.serve())
    except OSError as exc:
        logger.error(f"cannot serve on {cfg.socket}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
