"""What the daemon's parts share: the view of the daemon core they are given (`Core`), the
warnings a looping client would repeat, and the small helpers of their replies and log lines.

daemon.py builds the core and hands it to each part (sender.py, clienthandlers.py,
requesthandlers.py, statekeeper.py, statusreply.py); a part calls the core only through `Core` and
imports neither daemon.py nor another part, so calls flow one way.
"""
from __future__ import annotations

import asyncio
import logging
import pwd
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..wire import proto
from ..wire.proto import C

if TYPE_CHECKING:
    from ..base.config import Config
    from ..policy.gang import GangPolicy
    from ..policy.gpustate import GpuState
    from ..policy.policytypes import Action, MemDecision
    from .accounting import UsageLedger
    from .connection import Connection
    from .hookwatch import HookWatch
    from .registry import Job, Registry
    from .rogue import RogueTracker
    from .suspend import SuspendWatch

# A hook that cannot bring its memory back gives the lock back and asks again every 250 ms: the
# warnings of that loop are repeated at most this often per client and GPU (debug in between).
REPEAT_WARNING_SEC = 60.0

# A message handler: one frame from one connection; it raises Violation to close that connection.
Handler = Callable[["Connection", proto.Frame], None]


class Core(Protocol):
    """The daemon core as its parts see it: its records, its clock, and the few things only it
    does (send Actions and arm timers, save state, place a job, drop a client)."""
    cfg: Config
    logger: logging.Logger
    registry: Registry
    gpus: dict[str, GpuState]
    by_index: dict[int, GpuState]
    gangs: GangPolicy
    ledger: UsageLedger
    rogues: RogueTracker
    hooks: HookWatch
    suspends: SuspendWatch
    warnings: RepeatedWarnings
    inventory_error: str
    loop: asyncio.AbstractEventLoop | None

    def now(self) -> float: ...

    def after_event(self, gpu: GpuState, actions: list[Action]) -> None:
        """Send an event's Actions, then what they bring about and the gang pass; arm timers."""

    def add_gang(self, job: Job) -> None: ...

    def save(self) -> None:
        """Write state.json soon."""

    def park(self, conn: Connection, frame: proto.Frame) -> bool:
        """While the registry is rebuilt from Slurm, answer this question about an unknown job
        later; False when nothing is being rebuilt."""

    def place(self, job_id: int, uid: int, gid: int, user: str, name: str, slots: int,
              given: list[int] | None) -> Job:
        """A new Job placed on this node's GPUs (not yet added); PlacementError if it cannot be."""

    def drop_client(self, conn: Connection) -> None:
        """The client of conn is gone: out of the registry and off its GPUs."""


class RepeatedWarnings:
    """Warnings about one client on one GPU that it can repeat every 250 ms: one a minute, debug
    in between."""

    def __init__(self, logger: logging.Logger, clock: Any):
        self.logger = logger
        self.clock = clock
        self._warned: dict[tuple[str, int, str], float] = {}   # (gpu, client, what) -> when

    def warn(self, key: tuple[str, int, str], text: str) -> None:
        now = self.clock()
        last = self._warned.get(key)
        if last is None or now - last >= REPEAT_WARNING_SEC:
            self._warned[key] = now
            self.logger.warning(text)
        else:
            self.logger.debug(text)

    def forget_client(self, client_id: int) -> None:
        for key in [k for k in self._warned if k[1] == client_id]:
            del self._warned[key]


def reply(conn: Connection, frame: proto.Frame, status: int, message: str) -> None:
    conn.send(C.NVSHARE_MSG_REPLY, {"status": status, "message": fit(message)}, frame.seq)


def mem_reply(conn: Connection, gpu_uuid: str, decision: MemDecision, seq: int) -> None:
    conn.send(C.NVSHARE_MSG_MEM_REPLY, {"gpu_uuid": gpu_uuid, "status": decision.status,
                                        "flags": decision.flags, "available": decision.available,
                                        "total": decision.total}, seq)


def fit(message: str) -> str:
    """A message cut to the protocol's text field."""
    raw = message.encode("utf-8", "replace")[: C.NVSHARE_TEXT_LEN - 1]
    return raw.decode("utf-8", "ignore")


def size(value: int) -> str:
    if value >= 1 << 30:
        return f"{value / (1 << 30):.1f} GiB"
    return f"{value / (1 << 20):.1f} MiB"


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
