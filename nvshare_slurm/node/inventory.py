"""The node's GPUs: NVML (nvidia-ml-py) by default, or the `gpus:` list of the config.

Also lists the compute processes on each GPU, which the daemon compares with its registered
clients to find processes that bypassed the hook (rogue processes), and the memory the driver
holds for each (drivermemory.py: an ended process's memory counts until the driver released it).
NVML failures become InventoryError with a message that says what to check.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol


class InventoryError(Exception):
    """The GPU inventory cannot be read (no driver, NVML failure)."""


@dataclass(frozen=True)
class GpuInfo:
    uuid: str
    index: int
    name: str
    memory_total: int
    device: str = ""    # the GPU's device file (/dev/nvidia<minor>); what a job opens to reach it


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    memory: int


@dataclass(frozen=True)
class DriverMemory:
    """What the driver holds on one GPU now: the device's used bytes, and each process's."""
    used: int
    processes: dict[int, int]      # pid -> bytes


class Inventory(Protocol):
    def gpus(self) -> list[GpuInfo]: ...
    def processes(self, uuid: str) -> list[GpuProcess]: ...
    def driver_memory(self, uuid: str) -> DriverMemory | None: ...


class ConfiguredInventory:
    """GPUs named in the config (machines without NVIDIA GPUs); they never show processes."""

    def __init__(self, specs: Any):
        self._gpus = [GpuInfo(s.uuid, s.index, "", s.memory, s.device_path)
                      for s in specs]

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def processes(self, uuid: str) -> list[GpuProcess]:
        return []

    def driver_memory(self, uuid: str) -> DriverMemory | None:
        return None    # no driver to ask: a disconnected client's memory counts free at once


def _nvml_error(exc: Exception, what: str) -> InventoryError:
    return InventoryError(f"NVML: {what} failed: {exc} (is the NVIDIA driver loaded and "
                          f"nvidia-smi working? Without NVIDIA GPUs set `gpus:` in the config)")


class NvmlInventory:
    """Real GPUs through NVML. Calls are serialised: NVML handles are shared by threads."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise InventoryError("the nvidia-ml-py package (pynvml) is not installed") from exc
        self._nvml = pynvml
        self._lock = threading.Lock()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise _nvml_error(exc, "nvmlInit") from None
        self._handles: dict[str, Any] = {}
        self._gpus = self._scan()

    def _scan(self) -> list[GpuInfo]:
        nv = self._nvml
        out = []
        try:
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = nv.nvmlDeviceGetUUID(handle)
                name = nv.nvmlDeviceGetName(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                name = name.decode() if isinstance(name, bytes) else name
                memory = int(nv.nvmlDeviceGetMemoryInfo(handle).total)
                device = f"/dev/nvidia{int(nv.nvmlDeviceGetMinorNumber(handle))}"
                self._handles[uuid] = handle
                out.append(GpuInfo(uuid, index, name, memory, device))
        except nv.NVMLError as exc:
            raise _nvml_error(exc, "listing the GPUs") from None
        return out

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def processes(self, uuid: str) -> list[GpuProcess]:
        nv = self._nvml
        handle = self._handles.get(uuid)
        if handle is None:
            return []
        with self._lock:
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
            except nv.NVMLError as exc:
                raise _nvml_error(exc, f"listing the processes of {uuid}") from None
        return [GpuProcess(int(p.pid), int(p.usedGpuMemory or 0)) for p in procs]

    def driver_memory(self, uuid: str) -> DriverMemory | None:
        """The device's used memory and each compute process's (MPS and graphics processes are
        not listed here: they are not jobs' CUDA processes)."""
        nv = self._nvml
        handle = self._handles.get(uuid)
        if handle is None:
            return None
        with self._lock:
            try:
                used = int(nv.nvmlDeviceGetMemoryInfo(handle).used)
            except nv.NVMLError as exc:
                raise _nvml_error(exc, f"reading the memory of {uuid}") from None
        per_pid: dict[int, int] = {}
        for proc in self.processes(uuid):
            per_pid[proc.pid] = per_pid.get(proc.pid, 0) + proc.memory
        return DriverMemory(used, per_pid)


def from_config(cfg: Any) -> Inventory:
    return ConfiguredInventory(cfg.gpus) if cfg.gpus else NvmlInventory()
