"""The client registrations the daemon refused lately, for nvshare-status.

A refused client runs without the daemon (its hook follows on_daemon_loss), and the reason is
otherwise only in the daemon's log and the job's output: status shows the last few, so an admin
sees that a job's processes (a container without the job's cgroup, a wrong uid) are not gated.
Bounded: a peer that is refused in a loop pushes out older entries, never grows the daemon.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass

KEPT = 16
REASON_MAX = 200


@dataclass(frozen=True)
class Refusal:
    job_id: int
    pid: int               # SO_PEERCRED's: the kernel's word, in the daemon's PID namespace
    uid: int
    reason: str
    time: float


class Refusals:
    def __init__(self, kept: int = KEPT):
        self._recent: deque[Refusal] = deque(maxlen=kept)

    def add(self, job_id: int, pid: int, uid: int, reason: str) -> None:
        self._recent.append(Refusal(job_id, pid, uid, reason[:REASON_MAX], time.time()))

    def for_status(self) -> list[dict[str, object]]:
        """Oldest first."""
        return [asdict(r) for r in self._recent]
