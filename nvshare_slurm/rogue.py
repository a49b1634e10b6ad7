"""Processes on a managed GPU that never registered with the daemon (the hook was bypassed).

A pid is reported only after two checks in a row see it unregistered: a process creates its CUDA
context a moment before its hook connects, and that moment must not get it killed.
"""
from __future__ import annotations

from collections.abc import Iterable

from .inventory import GpuProcess


class RogueTracker:
    def __init__(self) -> None:
        self._suspects: dict[str, set[int]] = {}
        self.rogue: dict[str, list[GpuProcess]] = {}

    def check(self, uuid: str, processes: Iterable[GpuProcess],
              registered_pids: set[int], own_pid: int) -> list[GpuProcess]:
        """Record one NVML look at a GPU; returns the processes now confirmed rogue there."""
        unknown = [p for p in processes if p.pid not in registered_pids and p.pid != own_pid]
        before = self._suspects.get(uuid, set())
        confirmed = [p for p in unknown if p.pid in before]
        self._suspects[uuid] = {p.pid for p in unknown}
        self.rogue[uuid] = confirmed
        return confirmed

    def for_status(self, uuid: str) -> list[dict[str, int]]:
        return [{"pid": p.pid, "memory": p.memory} for p in self.rogue.get(uuid, [])]
