"""One GPU's memory as the driver sees it, beside what the clients report: pure logic, the caller's
clock (issue 39, "the scheduler's memory picture follows the driver").

The hook reports what a process allocated. The driver holds more, and for longer:
- a process that ended keeps its memory until the driver has torn its context down, which takes
  a while after the process is gone (on the H200, a 72.6 GiB process's memory was still held when
  the next grant's allocation reached the driver, and that job died of out-of-memory);
- a live process holds its context, cuBLAS and cuDNN workspaces, NCCL buffers and the like beyond
  its allocations (`overhead`);
- a process that never registered (a rogue one, or one whose hook has not connected yet) holds
  memory nobody reported (`other`).
All three count against the room (GpuMemory.room) until the driver's view (NVML's per-process
used memory) shows them gone. A client that disconnects leaves its resident memory
here as `ended` until NVML stops listing its pid, or ENDED_RELEASE_SEC passes (then a warning).
Without a driver view (a configured inventory: `gpus:` in the config) nothing is kept: the memory
of a client counts free when it disconnects, as the hook retries a driver's out-of-memory anyway.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .policytypes import ENDED_MEMORY, Action, ClientInfo

# The driver refused an allocation nvshare admitted (the hook's NVSHARE_MEM_DRIVER_OOM): what it
# lacked beyond nvshare's count is held off the room this long, or until a look at the driver.
REFUSED_HOLD_SEC = 1.0
# An ended process whose memory the driver still shows after this long is counted free anyway,
# with a warning: a process that NVML lists for ever (a zombie, a hung teardown) must not shrink
# the GPU for good.
ENDED_RELEASE_SEC = 20.0


@dataclass
class _Ended:
    client: ClientInfo
    bytes: int
    since: float


@dataclass
class DriverAccount:
    watching: bool = False                 # a driver view was seen: ended memory waits for it
    ended: dict[int, _Ended] = field(default_factory=dict)      # pid -> its memory at the end
    overhead: dict[int, int] = field(default_factory=dict)      # client -> beyond its report
    _last_overhead: dict[int, int] = field(default_factory=dict)
    other: int = 0                         # processes that are no client here
    driver_used: int | None = None         # the device's used memory, NVML's last figure
    sum_ended: int = 0
    sum_overhead: int = 0
    refused: int = 0                       # what a driver's refusal showed missing, held for now
    refused_until: float = 0.0

    def held(self) -> int:
        """Bytes the driver holds that no client's report counts."""
        return self.sum_ended + self.sum_overhead + self.other + self.refused

    def driver_refused(self, room: int, driver_free: int, now: float) -> None:
        """A hook's NVSHARE_MEM_DRIVER_OOM: the driver had `driver_free` where nvshare counted
        `room`. The difference is held off the room for REFUSED_HOLD_SEC (a look at the driver
        replaces it sooner)."""
        missing = max(0, room - driver_free)
        self.refused = max(self.refused if now < self.refused_until else 0, missing)
        self.refused_until = now + REFUSED_HOLD_SEC

    def client_gone(self, client: ClientInfo, resident: int, now: float) -> None:
        """The client disconnected: its resident memory (and context) stays counted until the
        driver shows it released."""
        overhead = self.overhead.pop(client.client_id, 0)
        self._last_overhead.pop(client.client_id, None)
        self.sum_overhead -= overhead
        held = resident + overhead
        if self.watching and held > 0:
            old = self.ended.pop(client.pid, None)
            self.sum_ended += held - (old.bytes if old else 0)
            self.ended[client.pid] = _Ended(client, held, now)

    def _release(self, pid: int) -> _Ended | None:
        gone = self.ended.pop(pid, None)
        if gone is not None:
            self.sum_ended -= gone.bytes
        return gone

    def seen(self, used: int, processes: dict[int, int], counted: dict[int, tuple[int, int]],
             now: float, out: list[Action]) -> bool:
        """One look at the driver: the device's used bytes, each process's (pid -> bytes), and
        for each live client's pid (client id, bytes its reports and promises count). Returns
        whether the room grew."""
        self.watching = True
        self.driver_used = used
        before = self.held()
        self.refused = 0                       # the driver's own figures say it now
        for pid in list(self.ended):
            if pid in counted:                 # alive after all (it reconnected): counted again
                self._release(pid)
            elif processes.get(pid, 0) <= 0:
                gone = self._release(pid)
                if gone is not None:
                    out.append(Action(ENDED_MEMORY, gone.client, value=0, bytes=gone.bytes,
                                      flags=int((now - gone.since) * 1000)))
            else:                              # the driver's figure, context included
                entry = self.ended[pid]
                self.sum_ended += processes[pid] - entry.bytes
                entry.bytes = processes[pid]
        overhead: dict[int, int] = {}
        other = 0
        for pid, nbytes in processes.items():
            if pid in counted:
                cid, reported = counted[pid]
                # The smaller of two looks in a row: an allocation made between a report and a
                # look counts once, not twice.
                extra = max(0, nbytes - reported)
                overhead[cid] = min(extra, self._last_overhead.get(cid, extra))
                self._last_overhead[cid] = extra
            elif pid not in self.ended:
                other += nbytes
        self._last_overhead = {cid: b for cid, b in self._last_overhead.items() if cid in overhead}
        self.overhead = overhead
        self.sum_overhead = sum(overhead.values())
        self.other = other
        return self.held() < before

    def expire(self, now: float, out: list[Action]) -> None:
        if self.refused and now >= self.refused_until:
            self.refused = 0
        for pid, entry in list(self.ended.items()):
            if now >= entry.since + ENDED_RELEASE_SEC:
                self._release(pid)
                out.append(Action(ENDED_MEMORY, entry.client, value=1, bytes=entry.bytes,
                                  flags=int((now - entry.since) * 1000)))

    def deadlines(self) -> list[float]:
        return [e.since + ENDED_RELEASE_SEC for e in self.ended.values()] + \
            ([self.refused_until] if self.refused else [])

    def status(self, counted: int) -> dict[str, int]:
        """memory_ended: held by processes that have ended; memory_overhead: by live clients
        beyond their reports; memory_other: by processes that are no client; memory_gap: NVML's
        used memory less all of these and the clients' reports (-1: no driver view)."""
        gap = -1 if self.driver_used is None else self.driver_used - counted - self.held()
        return {"memory_ended": self.sum_ended, "memory_overhead": self.sum_overhead,
                "memory_other": self.other, "memory_gap": gap}
