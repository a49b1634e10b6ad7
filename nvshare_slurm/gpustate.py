"""Per-GPU state and the scheduling policy, as pure logic.

A GpuState knows its holders, its FIFO queue, its memory accounting and its settings. Every event
(request, release, memory update, disconnect, settings change, timer tick) takes `now` from the
caller and returns a list of Actions (grant, contended, drop, unresponsive) for the daemon to send.
No sockets and no clock here, so tests drive the policy with a fake clock.

Modes (docs/protocol.md "Scheduling modes"):
- concurrent: one exclusive holder, FIFO; LOCK_CONTENDED as soon as someone waits; DROP_LOCK
  (TIMESLICE) after one switch interval of holding while others wait; nobody dropped otherwise.
- serial: the lock belongs to one job (SHARED grants to all its clients); the next job gets it when
  the holder job's clients are all gone, or after max_runtime_sec of holding while others wait.
- auto: SHARED grants while the memory of every client fits the usable memory; otherwise the
  concurrent rules (co-runners beyond the oldest get DROP_LOCK(MEMORY)).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .proto import C

MODES = ("auto", "concurrent", "serial")

GRANT = "grant"
CONTENDED = "contended"
DROP = "drop"
UNRESPONSIVE = "unresponsive"


@dataclass(frozen=True)
class GpuSettings:
    """The knobs of one GPU: config defaults overlaid with admin overrides."""
    mode: str = "auto"
    switch_time_mode: str = "auto"
    switch_time_fixed: float = 10.0
    switch_time_multiplier: float = 20.0
    switch_time_min: float = 2.0
    swap_bandwidth: int = 10 << 30
    memory_reserve_percent: int = 5
    max_runtime_sec: int = 300
    drop_grace_sec: float = 30.0

    OVERRIDABLE = ("mode", "switch_time_mode", "switch_time_fixed", "memory_reserve_percent",
                   "max_runtime_sec")

    @classmethod
    def from_config(cls, cfg: Any, overrides: dict[str, Any] | None = None) -> "GpuSettings":
        base = cls(mode=cfg.scheduling_mode, switch_time_mode=cfg.switch_time_mode,
                   switch_time_fixed=cfg.switch_time_fixed,
                   switch_time_multiplier=cfg.switch_time_multiplier,
                   switch_time_min=cfg.switch_time_min, swap_bandwidth=cfg.swap_bandwidth,
                   memory_reserve_percent=cfg.memory_reserve_percent,
                   max_runtime_sec=cfg.max_runtime_sec, drop_grace_sec=cfg.drop_grace_sec)
        return replace(base, **{k: v for k, v in (overrides or {}).items()
                                if k in cls.OVERRIDABLE})


@dataclass
class ClientInfo:
    """What the policy needs to know about one connected client process."""
    client_id: int
    job_id: int
    step_id: int
    pid: int
    user: str = ""
    mem_limit: int = 0        # NVSHARE_MEM_LIMIT of this process, else the job's mem_limit; 0 = none

    def label(self) -> str:
        return f"job {self.job_id} step {self.step_id} pid {self.pid}"


@dataclass(frozen=True)
class Action:
    kind: str                 # GRANT, CONTENDED, DROP, UNRESPONSIVE
    client: ClientInfo
    flags: int = 0            # GRANT: NVSHARE_GRANT_*
    value: int = 0            # GRANT: switch_ms; DROP: NVSHARE_DROP_*


@dataclass
class MemUsage:
    allocated: int = 0
    fixed: int = 0
    swapped: int = 0


@dataclass
class _Holder:
    client: ClientInfo
    since: float
    shared: bool
    contended: bool = False
    drop_at: float | None = None      # when DROP_LOCK was sent
    drop_reason: int = 0
    unresponsive_reported: bool = False


@dataclass
class MemDecision:
    status: int               # NVSHARE_OK or NVSHARE_ERR_NOMEM
    available: int
    total: int


@dataclass
class GpuState:
    uuid: str
    index: int
    memory_total: int
    settings: GpuSettings = field(default_factory=GpuSettings)
    name: str = ""
    holders: dict[int, _Holder] = field(default_factory=dict)
    queue: dict[int, tuple[ClientInfo, float]] = field(default_factory=dict)   # FIFO by insertion
    usage: dict[int, MemUsage] = field(default_factory=dict)
    attached: dict[int, dict[int, ClientInfo]] = field(default_factory=dict)   # job -> clients here
    job_allocated: dict[int, int] = field(default_factory=dict)
    sum_allocated: int = 0
    sum_fixed: int = 0
    sum_swapped: int = 0
    contention_since: float | None = None   # when "held while others wait" began for this turn
    serial_job: int | None = None
    serial_expired: bool = False

    # --- memory --------------------------------------------------------------------------------

    @property
    def memory_usable(self) -> int:
        return self.memory_total * (100 - self.settings.memory_reserve_percent) // 100

    def fits(self) -> bool:
        """Do all clients' memory (resident plus swapped out) fit the usable memory together?"""
        return self.sum_allocated + self.sum_swapped <= self.memory_usable

    def switch_interval(self) -> float:
        """Seconds an exclusive holder may keep the GPU while others wait."""
        s = self.settings
        if s.switch_time_mode == "fixed":
            return s.switch_time_fixed
        moved = 0
        if self.holders:
            holder = next(iter(self.holders.values())).client
            use = self.usage.get(holder.client_id)
            if use:
                moved += max(0, use.allocated - use.fixed)
        if self.queue:
            waiter = next(iter(self.queue.values()))[0]
            use = self.usage.get(waiter.client_id)
            if use:
                moved += use.swapped
        return max(s.switch_time_min, s.switch_time_multiplier * moved / s.swap_bandwidth)

    def _set_usage(self, client: ClientInfo, allocated: int, fixed: int, swapped: int) -> None:
        use = self.usage.setdefault(client.client_id, MemUsage())
        self.sum_allocated += allocated - use.allocated
        self.sum_fixed += fixed - use.fixed
        self.sum_swapped += swapped - use.swapped
        self.job_allocated[client.job_id] = (self.job_allocated.get(client.job_id, 0)
                                             + allocated - use.allocated)
        use.allocated, use.fixed, use.swapped = allocated, fixed, swapped

    def mem_update(self, client: ClientInfo, now: float, allocated: int, fixed: int,
                   swapped: int, request: int = 0) -> tuple[list[Action], MemDecision | None]:
        """A MEM_UPDATE: record the usage; with request > 0 also decide the allocation."""
        self._attach(client)
        fixed = min(fixed, allocated)
        self._set_usage(client, allocated, fixed, swapped)
        decision = self.admit(client, request) if request > 0 else None
        return self._schedule(now), decision

    def admit(self, client: ClientInfo, request: int) -> MemDecision:
        usable = self.memory_usable
        limit = client.mem_limit
        total = min(limit, usable) if limit else usable
        job_alloc = self.job_allocated.get(client.job_id, 0)
        own = self.usage.get(client.client_id, MemUsage())
        ok = True
        if limit and job_alloc + request > limit:
            ok = False
        if request + own.allocated + (self.sum_fixed - own.fixed) > usable:
            ok = False
        status = C.NVSHARE_OK if ok else C.NVSHARE_ERR_NOMEM
        return MemDecision(status, max(0, total - job_alloc), total)

    # --- lock events ---------------------------------------------------------------------------

    def _attach(self, client: ClientInfo) -> None:
        self.attached.setdefault(client.job_id, {})[client.client_id] = client

    def request(self, client: ClientInfo, now: float) -> list[Action]:
        self._attach(client)
        cid = client.client_id
        holder = self.holders.get(cid)
        if holder is not None:
            if holder.drop_at is None:   # it lost track of its grant: say it again
                return [Action(GRANT, client, C.NVSHARE_GRANT_SHARED if holder.shared
                               else C.NVSHARE_GRANT_EXCLUSIVE, self._switch_ms())]
            return []
        if cid not in self.queue:
            self.queue[cid] = (client, now)
        return self._schedule(now)

    def release(self, client_id: int, now: float) -> list[Action]:
        if self.holders.pop(client_id, None) is None:
            return []
        if not self.holders:
            self.contention_since = None
        return self._schedule(now)

    def remove_client(self, client_id: int, now: float) -> list[Action]:
        """The client is gone (disconnect, unregister): drop its lock, queue place and memory."""
        self.holders.pop(client_id, None)
        self.queue.pop(client_id, None)
        use = self.usage.pop(client_id, None)
        for job_id, clients in list(self.attached.items()):
            client = clients.pop(client_id, None)
            if client is not None:
                if use:
                    self.sum_allocated -= use.allocated
                    self.sum_fixed -= use.fixed
                    self.sum_swapped -= use.swapped
                    left = self.job_allocated.get(job_id, 0) - use.allocated
                    if left:
                        self.job_allocated[job_id] = left
                    else:
                        self.job_allocated.pop(job_id, None)
                if not clients:
                    del self.attached[job_id]
                break
        if not self.holders:
            self.contention_since = None
        return self._schedule(now)

    def update_settings(self, settings: GpuSettings, now: float) -> list[Action]:
        self.settings = settings
        if settings.mode != "serial":
            self.serial_job, self.serial_expired = None, False
        return self._schedule(now, admin=True)

    def tick(self, now: float) -> list[Action]:
        return self._schedule(now)

    def next_deadline(self) -> float | None:
        """When tick() next has something to do (switch timer, max runtime, drop grace)."""
        deadlines = []
        for holder in self.holders.values():
            if holder.drop_at is not None and not holder.unresponsive_reported:
                deadlines.append(holder.drop_at + self.settings.drop_grace_sec)
        if self.contention_since is not None and self.queue:
            if self.settings.mode == "serial":
                if not self.serial_expired:
                    deadlines.append(self.contention_since + self.settings.max_runtime_sec)
            elif self.holders and not self._shared_ok() \
                    and not any(h.drop_at is not None for h in self.holders.values()):
                deadlines.append(self.contention_since + self.switch_interval())
        return min(deadlines) if deadlines else None

    # --- the policy ----------------------------------------------------------------------------

    def _switch_ms(self) -> int:
        return min(int(self.switch_interval() * 1000), 0xFFFFFFFF)

    def _shared_ok(self) -> bool:
        return self.settings.mode == "auto" and self.fits()

    def _grant(self, client: ClientInfo, now: float, shared: bool, out: list[Action]) -> None:
        self.queue.pop(client.client_id, None)
        self.holders[client.client_id] = _Holder(client, now, shared)
        self.contention_since = None
        out.append(Action(GRANT, client, C.NVSHARE_GRANT_SHARED if shared
                          else C.NVSHARE_GRANT_EXCLUSIVE, self._switch_ms()))

    def _drop(self, holder: _Holder, now: float, reason: int, out: list[Action]) -> None:
        holder.drop_at, holder.drop_reason = now, reason
        out.append(Action(DROP, holder.client, 0, reason))

    def _schedule(self, now: float, admin: bool = False) -> list[Action]:
        out: list[Action] = []
        if self.settings.mode == "serial":
            self._schedule_serial(now, out, admin)
        elif self._shared_ok():
            while self.queue:
                self._grant(next(iter(self.queue.values()))[0], now, True, out)
            self.contention_since = None
        else:
            self._schedule_exclusive(now, out, admin)
        for holder in self.holders.values():
            if holder.drop_at is not None and not holder.unresponsive_reported \
                    and now >= holder.drop_at + self.settings.drop_grace_sec:
                holder.unresponsive_reported = True
                out.append(Action(UNRESPONSIVE, holder.client, 0, holder.drop_reason))
        return out

    def _schedule_exclusive(self, now: float, out: list[Action], admin: bool) -> None:
        if len(self.holders) > 1:
            # Co-runners no longer fit (or the mode changed): the oldest keeps it, the rest requeue.
            reason = C.NVSHARE_DROP_ADMIN if admin or self.settings.mode != "auto" \
                else C.NVSHARE_DROP_MEMORY
            for holder in list(self.holders.values())[1:]:
                if holder.drop_at is None:
                    self._drop(holder, now, reason, out)
        if not self.holders and self.queue:
            self._grant(next(iter(self.queue.values()))[0], now, False, out)
        if not self.holders or not self.queue:
            self.contention_since = None
            return
        if self.contention_since is None:
            self.contention_since = now
        if len(self.holders) == 1:
            holder = next(iter(self.holders.values()))
            if not holder.contended and holder.drop_at is None:
                holder.contended = True
                out.append(Action(CONTENDED, holder.client))
            if holder.drop_at is None and now >= self.contention_since + self.switch_interval():
                self._drop(holder, now, C.NVSHARE_DROP_TIMESLICE, out)

    def _schedule_serial(self, now: float, out: list[Action], admin: bool) -> None:
        job = self.serial_job
        if job is not None and not self.attached.get(job):
            job = None
        if job is not None and self.serial_expired and not self.holders:
            job = None
        if job is None:
            self.serial_expired = False
            self.contention_since = None
            if self.holders:      # mode just changed to serial: the oldest holder's job keeps it
                job = next(iter(self.holders.values())).client.job_id
            elif self.queue:
                job = next(iter(self.queue.values()))[0].job_id
            self.serial_job = job
            if job is None:
                return
        for holder in list(self.holders.values()):
            if holder.client.job_id != job and holder.drop_at is None:
                self._drop(holder, now, C.NVSHARE_DROP_ADMIN, out)
        if not self.serial_expired:
            for client, _ in [entry for entry in self.queue.values() if entry[0].job_id == job]:
                self._grant(client, now, True, out)
        others_wait = any(entry[0].job_id != job for entry in self.queue.values()) \
            if self.queue else False
        if not others_wait:
            self.contention_since = None
            return
        if self.contention_since is None:
            self.contention_since = now
        if not self.serial_expired and now >= self.contention_since + self.settings.max_runtime_sec:
            self.serial_expired = True
            for holder in self.holders.values():
                if holder.drop_at is None:
                    self._drop(holder, now, C.NVSHARE_DROP_MAX_RUNTIME, out)

    # --- status --------------------------------------------------------------------------------

    def client_state(self, client_id: int) -> str:
        holder = self.holders.get(client_id)
        if holder is not None:
            return "dropping" if holder.drop_at is not None else "holding"
        return "waiting" if client_id in self.queue else "idle"

    def status(self, now: float, rogue: list[dict[str, int]], jobs: list[int]) -> dict[str, Any]:
        s = self.settings
        return {
            "index": self.index, "uuid": self.uuid, "name": self.name,
            "memory_total": self.memory_total, "memory_usable": self.memory_usable,
            "memory_used": self.sum_allocated, "memory_fixed": self.sum_fixed,
            "memory_swapped": self.sum_swapped,
            "memory_reserved": self.memory_total - self.memory_usable,
            "mode": s.mode,
            "switch_time": "auto" if s.switch_time_mode == "auto" else float(s.switch_time_fixed),
            "switch_interval_sec": round(self.switch_interval(), 3),
            "max_runtime_sec": int(s.max_runtime_sec),
            "memory_reserve_percent": int(s.memory_reserve_percent),
            "co_running": self._shared_ok() and len(self.holders) > 1,
            "holders": [{"job_id": h.client.job_id, "step_id": h.client.step_id,
                         "pid": h.client.pid, "user": h.client.user,
                         "held_sec": round(now - h.since, 3), "shared": h.shared}
                        for h in self.holders.values()],
            "waiting": [{"job_id": c.job_id, "step_id": c.step_id, "pid": c.pid, "user": c.user,
                         "waiting_sec": round(now - since, 3)} for c, since in self.queue.values()],
            "jobs": jobs, "rogue": rogue,
        }
