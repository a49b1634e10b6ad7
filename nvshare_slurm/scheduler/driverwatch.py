"""The daemon's looks at the memory the driver holds on each GPU (NVML: the device's used memory and
each process's), handed to each GpuState (drivermemory.py). Every WATCH_SEC, and every ENDED_SEC
while a GPU counts memory of a client that ended: a grant that waits for that memory should not
wait longer than the driver takes to release it. With a configured inventory (no driver to ask)
there is nothing to look at.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..node.inventory import ConfiguredInventory, Inventory, InventoryError

if TYPE_CHECKING:
    from .daemoncore import Core

WATCH_SEC = 2.0       # contexts, workspaces and unregistered processes change slowly
ENDED_SEC = 0.1       # the driver released an ended process's memory: the next grant may use it


class DriverWatch:
    def __init__(self, core: Core, inventory: Inventory):
        self.core = core
        self.inventory = inventory
        self._last = -WATCH_SEC

    def _due(self, now: float) -> bool:
        if now >= self._last + WATCH_SEC:
            return True
        return any(g.memory.driver.sum_ended for g in self.core.gpus.values()) \
            and now >= self._last + ENDED_SEC

    async def look(self) -> None:
        """One look at every GPU; each GPU's Actions go out at once."""
        self._last = self.core.now()
        for gpu in list(self.core.gpus.values()):
            try:
                view = await asyncio.to_thread(self.inventory.driver_memory, gpu.uuid)
            except InventoryError as exc:
                self.core.warnings.warn((gpu.uuid, 0, "driver memory"),
                                        f"gpu {gpu.uuid}: memory check: {exc}")
                continue
            if view is not None:
                self.core.after_event(gpu, gpu.driver_seen(view.used, view.processes,
                                                           self.core.now()))

    async def run(self) -> None:
        if isinstance(self.inventory, ConfiguredInventory):
            return
        while True:
            if self._due(self.core.now()):
                try:
                    await self.look()
                except Exception as exc:   # never let the watch die: log, look again later
                    self.core.logger.error(f"memory check failed: {exc!r}")
            await asyncio.sleep(ENDED_SEC)
