"""Processes on a managed GPU that never registered with the daemon (the hook was bypassed).

A pid is reported only after two checks in a row see it unregistered: a process creates its CUDA
context a moment before its hook connects, and that moment must not get it killed. Both sightings
must be the same process (pid, start time, uid and job read from /proc): NVML names a pid, and a pid
is reused once its process exits. With `rogue_process: kill` the kill goes through
procinfo.signal_checked with the identity of those sightings, so a pid that now belongs to another
process, uid or job is never signalled.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..node.inventory import ConfiguredInventory, GpuProcess, Inventory, InventoryError
from .procinfo import ProcIdentity, read_identity, signal_checked

if TYPE_CHECKING:
    from .daemoncore import Core


class RogueTracker:
    def __init__(self, identify: Callable[[int], ProcIdentity | None] = read_identity) -> None:
        self._identify = identify
        self._suspects: dict[str, dict[int, ProcIdentity]] = {}
        self.rogue: dict[str, list[tuple[GpuProcess, ProcIdentity]]] = {}

    def check(self, uuid: str, processes: Iterable[GpuProcess],
              registered_pids: set[int], own_pid: int) -> list[tuple[GpuProcess, ProcIdentity]]:
        """Record one NVML look at a GPU; returns the processes now confirmed rogue there, each
        with the identity both sightings agree on."""
        before = self._suspects.get(uuid, {})
        suspects: dict[int, ProcIdentity] = {}
        confirmed = []
        for proc in processes:
            if proc.pid in registered_pids or proc.pid == own_pid:
                continue
            identity = self._identify(proc.pid)
            if identity is None:          # gone already
                continue
            suspects[proc.pid] = identity
            seen = before.get(proc.pid)
            if seen is not None and seen.same_process(identity):
                confirmed.append((proc, identity))
        self._suspects[uuid] = suspects
        self.rogue[uuid] = confirmed
        return confirmed

    def for_status(self, uuid: str) -> list[dict[str, int]]:
        return [{"pid": p.pid, "memory": p.memory} for p, _ in self.rogue.get(uuid, [])]


class RogueWatch:
    """The daemon's periodic look at every GPU's processes: reports rogue ones once, and with
    `rogue_process: kill` kills them, checked."""

    def __init__(self, core: Core, inventory: Inventory, tracker: RogueTracker):
        self.core = core
        self.inventory = inventory
        self.tracker = tracker
        self._reported: set[tuple[str, int, int]] = set()     # (gpu, pid, start)

    async def check(self) -> None:
        registered = self.core.registry.client_pids()
        still: set[tuple[str, int, int]] = set()
        for gpu in self.core.gpus.values():
            try:
                if isinstance(self.inventory, ConfiguredInventory):
                    procs = self.inventory.processes(gpu.uuid)
                else:
                    procs = await asyncio.to_thread(self.inventory.processes, gpu.uuid)
            except InventoryError as exc:
                self.core.logger.warning(f"gpu {gpu.uuid}: rogue check: {exc}")
                continue
            for proc, identity in self.tracker.check(gpu.uuid, procs, registered, os.getpid()):
                key = (gpu.uuid, proc.pid, identity.start)
                still.add(key)
                if key not in self._reported:
                    self._report(gpu.uuid, proc, identity, key)
        self._reported &= still           # an exited process is forgotten (bounded)

    def _report(self, uuid: str, proc: GpuProcess, identity: ProcIdentity,
                key: tuple[str, int, int]) -> None:
        job = f"job {identity.job_id}" if identity.job_id is not None else "no job"
        where = (f"gpu {uuid}: pid {proc.pid} (uid {identity.uid}, {job}) uses {proc.memory} "
                 f"bytes without nvshare (rogue")
        if self.core.cfg.rogue_process != "kill":
            self._reported.add(key)
            self.core.logger.warning(f"{where}; policy warn)")
            return
        why_not = signal_checked(identity)
        if not why_not:
            self._reported.add(key)
            self.core.logger.warning(f"{where}); killed")
        elif identity.stopped or "stopped" in why_not:
            self.core.logger.info(f"{where}); not killed now: {why_not}")   # again next look
        else:
            self._reported.add(key)
            self.core.logger.warning(f"{where}); not killed: {why_not}")
