"""nvshare-scheduler: the per-node daemon. One asyncio loop, one Unix socket, every GPU on its own.

This module is the core: it owns the loop, the listener, the GPUs' policy objects and their
timers, and wires the parts together. Every event's Actions go out through after_event, the one
way into sending (sender.py), so sending never re-enters itself. The messages are
clienthandlers.py's (a registered hook) and requesthandlers.py's (prolog, epilog, TaskProlog,
status, admins); state.json and the rebuild from Slurm are statekeeper.py's. Each part sees the
core only through daemoncore.Core. The socket and the bounds on each peer are connection.py, the
policy is gpustate.py (and gang.py), placement is placement.py, jobs and clients are registry.py.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from typing import Any

from .base import config, log
from .node.inventory import ConfiguredInventory, Inventory, InventoryError, from_config
from .policy.gang import GangPolicy
from .policy.gpustate import GpuState
from .policy.placement import GpuLoad, place_job
from .policy.policytypes import Action, GpuSettings
from .scheduler.accounting import UsageLedger
from .scheduler.burstpage import BurstPages
from .scheduler.clienthandlers import ClientHandlers
from .scheduler.connection import (Connection, Limits, Listener, Violation, listening_socket,
                                   prepare_socket_path, raise_fd_limit, remove_socket)
from .scheduler.daemoncore import Handler, RepeatedWarnings
from .scheduler.devices import GpuDevices
from .scheduler.driverwatch import DriverWatch
from .scheduler.hookwatch import HookWatch
from .scheduler.registry import Job, Registry
from .scheduler.requesthandlers import RequestHandlers
from .scheduler.rogue import RogueTracker, RogueWatch
from .scheduler.sender import ActionSender
from .scheduler.statekeeper import StateKeeper
from .scheduler.statusreply import status_reply
from .scheduler.suspend import SuspendWatch
from .wire import proto
from .wire.proto import C

# Settings that only a restart can change (the socket is bound, the GPUs are enumerated).
_RESTART_ONLY = ("socket", "state_dir", "gpus", "metrics_port")


class Daemon:
    """The core (daemoncore.Core to the parts it wires)."""

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
        self.rogues = RogueTracker()
        self.rogue_watch = RogueWatch(self, self.inventory, self.rogues)
        self.driver_watch = DriverWatch(self, self.inventory)
        self.hooks = HookWatch(self)
        self.suspends = SuspendWatch(self)
        self.ledger = UsageLedger()
        self.warnings = RepeatedWarnings(self.logger, self.now)
        self.burst_pages = BurstPages()
        self._work: list[tuple[GpuState, list[Action]]] | None = None   # while Actions go out
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.listener: Listener | None = None
        self._throttle = log.Throttle()
        self._stop: asyncio.Event | None = None
        self.stopping = False       # SIGTERM came: nothing is granted, nothing more is served
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sender = ActionSender(self, self.burst_pages)
        self.state = StateKeeper(self)
        devices = GpuDevices({g.uuid: g.device for g in self.inventory.gpus() if g.device})
        self._handlers: dict[int, Handler] = {
            **ClientHandlers(self).handlers(), **RequestHandlers(self, devices).handlers()}

    # --- what the parts ask of the core --------------------------------------------------------

    def now(self) -> float:
        return self.loop.time() if self.loop is not None else time.monotonic()

    def save(self) -> None:
        self.state.save()

    def park(self, conn: Connection, frame: proto.Frame) -> bool:
        return self.state.park(conn, frame)

    def add_gang(self, job: Job) -> None:
        gpus = [self.gpus[u] for u in job.gpus if u in self.gpus]
        if not self.gangs.add_job(job.job_id, gpus, multinode=job.multinode):
            return
        if job.multinode:
            self.logger.info(f"job {job.job_id}: a multi-node job, here on GPUs "
                             f"{','.join(map(str, job.gpu_index))}: it takes its turns as a gang, "
                             f"after any multi-node job of a lower id on them (the same order on "
                             f"every node)")
        else:
            self.logger.info(f"job {job.job_id}: a gang on GPUs "
                             f"{','.join(map(str, job.gpu_index))}: it takes its turns on all "
                             f"of them together")

    def place(self, job_id: int, uid: int, gid: int, user: str, name: str, slots: int,
              given: list[int] | None) -> Job:
        """A new Job placed on this node's GPUs (not yet added); PlacementError if it cannot be."""
        jobs_on: dict[str, int] = {}
        for job in self.registry.jobs.values():
            for uuid in job.gpus:
                jobs_on[uuid] = jobs_on.get(uuid, 0) + 1
        loads = [GpuLoad(g.uuid, g.index, g.sum_allocated, jobs_on.get(g.uuid, 0))
                 for g in self.gpus.values()]
        placed = place_job(loads, slots, given, C.NVSHARE_ERR_NOGPU, C.NVSHARE_ERR_INVAL)
        return Job(job_id, uid, gid, user, name, slots, [g.uuid for g in placed],
                   [g.index for g in placed])

    # --- actions from the policy ---------------------------------------------------------------

    def after_event(self, gpu: GpuState, actions: list[Action]) -> None:
        """The one way Actions go out, after every event and timer: the event's Actions, then
        what sending them brought about (an unresponsive holder's release, a client cut off), then
        the gang pass over all GPUs and what its Actions bring about, then the GPUs' timers.

        Sending may cut a peer off (Connection.abort), which drops its client: that event's
        Actions join the work list here instead of going out in the middle of these.

        A stopping daemon sends nothing: closing its connections must not grant their waiters
        (a grant to one while a closed holder's process still runs is an overlap)."""
        if self.stopping:
            return
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
            work.extend(self.sender.send(gpu, actions))
            followed = followed or len(work) > left
        return followed

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

    def status(self, what: int, job_id: int = 0) -> tuple[int, bytes]:
        """(status, tail) of a STATUS_QUERY: JSON on success, else the error message."""
        return status_reply(self, what, job_id)

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

    def begin_stop(self) -> None:
        """SIGTERM or SIGINT: from this moment no frame is served and no Action goes out (no
        grant, no drop), and no policy timer fires; then serve() closes the connections."""
        self.stopping = True
        if self.listener is not None:
            self.listener.stopping = True
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._stop is not None:
            self._stop.set()

    def _on_frame(self, conn: Connection, frame: proto.Frame) -> None:
        handler = self._handlers.get(frame.type)
        if handler is None:
            raise Violation(f"{frame.name} is not a message a peer may send")
        handler(conn, frame)

    def drop_client(self, conn: Connection) -> None:
        """The client of conn is gone (its connection closed, or its job unregistered)."""
        # conn.client stays: the connection's log lines still name the client.
        client = conn.client
        if client is None or self.registry.remove_client(client.client_id) is None:
            return
        self.warnings.forget_client(client.client_id)
        now = self.now()
        for uuid in client.gpus:
            gpu = self.gpus[uuid]
            self.after_event(gpu, gpu.remove_client(client.client_id, now))
        self.logger.debug(f"{conn.who()}: client disconnected")

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
        """One look at every GPU's processes (rogue.py), then at every managed job's processes
        for a missing hook (hookwatch.py); each reports, and kills only with policy kill, checked."""
        await self.rogue_watch.check()
        await self.hooks.scan()

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
            from .scheduler.metrics import MetricsServer   # prometheus-client only where metrics are on
            metrics = MetricsServer(self, self.cfg.metrics_port, self.cfg.metrics_bind,
                                    self.cfg.metrics_user_labels)
            try:
                await metrics.start()
            except OSError as exc:   # asked for and not served: an error now, not a silent run
                why = os.strerror(exc.errno) if exc.errno else exc
                self.logger.error(f"metrics: cannot listen on {self.cfg.metrics_bind} port "
                                  f"{self.cfg.metrics_port}: {why}; not starting "
                                  f"(metrics_port, metrics_bind)")
                return 1
        self.listener = Listener(listening_socket(path), self._on_frame, self.drop_client,
                                 self._limits())
        self.loop.set_exception_handler(self._loop_error)
        if self.state.incomplete:
            self.state.start_rebuild()
        self.listener.start()
        self._stop = asyncio.Event()
        self.loop.add_signal_handler(signal.SIGTERM, self.begin_stop)
        self.loop.add_signal_handler(signal.SIGINT, self.begin_stop)
        self.loop.add_signal_handler(signal.SIGHUP, self.reload)
        rogue_task = asyncio.ensure_future(self._rogue_loop())
        suspend_task = asyncio.ensure_future(self.suspends.run())
        driver_task = asyncio.ensure_future(self.driver_watch.run())
        modes = ", ".join(f"{g.uuid} ({g.settings.mode})" for g in self.gpus.values()) or "none"
        self.logger.info(f"listening on {path} (pid {os.getpid()}); GPUs: {modes}")
        await self._stop.wait()
        self.logger.info("stopping: SIGTERM; no more grants")
        rogue_task.cancel()
        suspend_task.cancel()
        driver_task.cancel()
        if metrics is not None:
            metrics.close()
        self.listener.close()
        self.burst_pages.close()
        await self.state.flush()
        remove_socket(path)
        return 0


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
    daemon.state.restore()
    from .scheduler.sitecheck import admin_comment_problem
    problem = admin_comment_problem(cfg)
    if problem:
        logger.warning(problem)
    try:
        return asyncio.run(daemon.serve())
    except OSError as exc:
        logger.error(f"cannot serve on {cfg.socket}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
