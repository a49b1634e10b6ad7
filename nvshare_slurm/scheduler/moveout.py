"""A stopped process holds nothing hostage (issue 39): it is let run for the move-out of GPU memory
that a waiter needs, then stopped again.

A process stopped by a signal (SIGSTOP, Ctrl-Z, Slurm's suspend under proctrack/linuxproc, which
stops every process of the job at once) cannot move its memory to host memory, and until it did a
waiter whose memory is in host memory could not run: on a 1 GiB GPU, 40 s and 161 grants given
back NO_ROOM. When a GPU's pass finds such a waiter (stoppedroom.py `wanted`), the watch:

- checks the process through the pidfd of its connection (SO_PEERPIDFD, or pidfd_open kept only
  for a process older than the connection): the same process, uid and job, stopped by a signal
  (state T; a debugger's `t` and a frozen cgroup are left as they are: nvshare never writes the
  freezer), and a job memory limit (--mem) that holds the bytes;
- sends SIGCONT through that pidfd. The process holds no lock, so its CUDA threads wait in the
  hook's gate (a LOCK_REQUEST is parked by the suspend watch); its hook reads the DROP_LOCK that
  waited for it (a stopped holder) and releases, then the PREPARE_SWAP_OUT of the pass, and moves
  the memory out, reporting after each chunk;
- stops it again (SIGSTOP through the pidfd) when the move-out is answered (its report without
  NVSHARE_MEM_MOVING) on every GPU it was let run for, or at the deadline (move_grace for the
  bytes and MOVE_OUT_SLACK_SEC), unless it was resumed meanwhile: its job is no longer SUSPENDED in
  Slurm's latest word, or a process that was stopped beside it (its parent, its process group:
  procinfo.stopped_relatives) runs again. Slurm marks a job RUNNING before slurmd sends its
  SIGCONT, so a resume that squeue did not show yet and whose SIGCONT came before ours is seen at
  the next answer: a process stopped again whose job is no longer SUSPENDED is continued then.
  A SIGCONT sent to that one process alone while it ran for its move-out cannot be seen (the
  kernel drops it) and is lost: it stays stopped until the next one, and the log says so.

Each process is let run at most once per shortfall of a GPU (StoppedRoom `tried`).
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..policy.gpupause import cannot_run, let_run, move_out_over, stopped_again
from ..policy.policytypes import move_grace
from .connection import peer_pidfd
from .daemoncore import size
from .procinfo import ANY_START, ProcIdentity, memory_headroom, read_identity, signal_checked, \
    stopped_relatives

if TYPE_CHECKING:
    from ..policy.gpustate import GpuState
    from .daemoncore import Core
    from .registry import RegisteredClient

# Beyond move_grace(bytes): waking up, the hook's drain and late release, pinning host memory.
MOVE_OUT_SLACK_SEC = 5.0
# A SIGSTOP not seen in /proc by then: someone continued the process meanwhile.
STOP_SEEN_SEC = 1.0


@dataclass
class MoveOut:
    """One stopped process let run for its move-out."""
    client_id: int
    process: ProcIdentity           # pid, uid, job: checked again before each signal
    label: str
    pidfd: int                      # our own copy: it outlives the connection (daemon stop)
    since: float
    deadline: float
    slurm: bool                     # Slurm said its job SUSPENDED while it ran
    witnesses: list[ProcIdentity]   # stopped beside it when it was let run
    gpus: set[str] = field(default_factory=set)              # move-outs still under way
    swapped_before: dict[str, int] = field(default_factory=dict)   # GPU -> its swapped bytes
    stopping_at: float | None = None     # SIGSTOP sent, not yet seen


class MoveOuts:
    """The daemon's part that lets stopped processes run for a move-out (suspend.py owns it)."""

    def __init__(self, core: Core):
        self.core = core
        self.logger = core.logger
        self.active: dict[int, MoveOut] = {}
        self.restopped: dict[int, tuple[float, bool]] = {}   # client -> (stopped again at, slurm)

    # --- from the GPUs' passes (ActionSender, after each send) -------------------------------

    def follow(self, gpu: GpuState, suspended: set[int]) -> None:
        """Let run the stopped clients the GPU's last pass wants, stop again those whose
        move-out is over."""
        room = gpu.stopped
        for cid in sorted(room.wanted):
            if cid in gpu.stopped.wanted:       # each let_run is a pass, which wants anew
                self._let_run(gpu, cid, gpu.stopped.wanted[cid], suspended)
        for cid in sorted(room.done):
            self._done(gpu, cid, suspended)

    def _let_run(self, gpu: GpuState, cid: int, move: int, suspended: set[int]) -> None:
        now = self.core.now()
        client = self.core.registry.clients.get(cid)
        record = self.active.get(cid)
        if client is None or (record is not None and record.stopping_at is not None):
            return                        # being stopped again: wanted anew once it is
        where = f"gpu {gpu.uuid}: {client.label()}"
        waiter = gpu.stopped.waiter
        whom = waiter.label() if waiter is not None else "a waiter"
        if record is not None:            # already running for another GPU's move-out
            record.deadline = max(record.deadline, now + move_grace(move) + MOVE_OUT_SLACK_SEC)
        else:
            why_not = self._why_not(client, move)
            witnesses: list[ProcIdentity] = []
            pidfd = -1
            held = self._pidfd(client)
            if not why_not and held is not None:
                witnesses = stopped_relatives(client.pid)
                pidfd = os.dup(held)
                why_not = signal_checked(_identity(client), signal.SIGCONT, pidfd,
                                         stopped_only=True)
                if why_not:
                    os.close(pidfd)
            if why_not:
                self.logger.warning(f"{where}: its {size(move)} stays on the GPU although "
                                    f"{whom} waits for that room: its stopped process "
                                    f"cannot be let run to move it out ({why_not})")
                self.core.after_event(gpu, cannot_run(gpu, cid, now))
                return
            record = self.active[cid] = MoveOut(
                cid, _identity(client), client.label(), pidfd, now,
                now + move_grace(move) + MOVE_OUT_SLACK_SEC, client.job_id in suspended, witnesses)
            self.restopped.pop(cid, None)
        record.gpus.add(gpu.uuid)
        use = gpu.usage.get(cid)
        record.swapped_before.setdefault(gpu.uuid, use.swapped if use else 0)
        self.logger.info(f"{where}: {whom} waits for {size(move)} of room that its memory "
                         f"holds: its stopped process is let run (SIGCONT) to move it to host "
                         f"memory, and stopped again after")
        self.core.after_event(gpu, let_run(gpu, cid, now))

    def _why_not(self, client: RegisteredClient, move: int) -> str:
        if client.connection is None:
            return "it has no connection"
        if self._pidfd(client) is None:
            return "its process cannot be held by a pidfd, so a reused pid cannot be ruled out"
        headroom = memory_headroom(client.pid)
        if headroom is not None and headroom < move:
            return f"the job's memory limit has {size(headroom)} left (Slurm --mem)"
        return ""

    def _done(self, gpu: GpuState, cid: int, suspended: set[int]) -> None:
        move_out_over(gpu, cid)
        record = self.active.get(cid)
        if record is None or record.stopping_at is not None:
            return
        record.gpus.discard(gpu.uuid)
        if not record.gpus:
            self._stop_again(record, suspended, "its move-out is answered")

    # --- stopping it again --------------------------------------------------------------------

    def _stop_again(self, record: MoveOut, suspended: set[int], what: str) -> None:
        now = self.core.now()
        cid = record.client_id
        client = self.core.registry.clients.get(cid)
        if client is None:
            self._end(record)
            return
        gpus = [g for u in sorted(record.swapped_before) if (g := self.core.gpus.get(u))]
        moved = sum(max(0, (u.swapped if (u := g.usage.get(cid)) else 0)
                        - record.swapped_before[g.uuid]) for g in gpus)
        resumed = self._resumed(record, client, suspended)
        why_not = ""
        if not resumed:
            why_not = _stop(record)
        if resumed or why_not:
            self.logger.info(f"{client.label()}: {resumed or f'cannot be stopped again ({why_not})'}"
                             f" after {now - record.since:.1f}s moving {size(moved)} "
                             f"to host memory ({what}): it runs")
            self._end(record)
            for gpu in gpus:
                move_out_over(gpu, cid)
            return
        record.stopping_at = now
        self.restopped[cid] = (now, record.slurm)
        self.logger.info(f"{client.label()}: stopped again (SIGSTOP) after {now - record.since:.1f}s "
                         f"moving {size(moved)} to host memory ({what}); a SIGCONT sent to "
                         f"it alone meanwhile cannot be seen: it waits for the next one")
        for gpu in gpus:
            self.core.after_event(gpu, stopped_again(gpu, cid, now))

    def _resumed(self, record: MoveOut, client: RegisteredClient, suspended: set[int]) -> str:
        """Why it was resumed meanwhile, or "" (see the module's docstring)."""
        if record.slurm and client.job_id not in suspended:
            return "Slurm resumed its job while it moved its memory out"
        ours = {r.process.pid for r in self.active.values()}   # let run by us, not resumed
        for witness in record.witnesses:
            if witness.pid in ours:
                continue
            seen = read_identity(witness.pid)
            if seen is not None and seen.same_process(witness) and not seen.stopped:
                return f"process {witness.pid}, stopped beside it, runs again (resumed)"
        return ""

    # --- the watch's looks --------------------------------------------------------------------

    def tick(self, suspended: set[int]) -> None:
        """Each suspend_check_sec: deadlines, a resume meanwhile, a SIGSTOP seen taking effect."""
        now = self.core.now()
        for cid, record in list(self.active.items()):
            client = self.core.registry.clients.get(cid)
            if self.active.get(cid) is not record:
                continue                  # ended by what an earlier one brought about
            if client is None:
                self._end(record)
                continue
            if record.stopping_at is not None:
                seen = read_identity(client.pid)
                if seen is None or seen.stopped or now >= record.stopping_at + STOP_SEEN_SEC:
                    self._end(record)
                    for uuid in sorted(record.swapped_before):
                        gpu = self.core.gpus.get(uuid)
                        if gpu is not None:      # a shortfall that came meanwhile may want it
                            self.core.after_event(gpu, gpu.tick(now))
            elif now >= record.deadline:
                self.logger.warning(f"{client.label()}: its move-out was not answered "
                                    f"{now - record.since:.1f}s after it was let run")
                self._stop_again(record, suspended, "its deadline passed")
            elif self._resumed(record, client, suspended):
                self._stop_again(record, suspended, "resumed")

    def slurm_answer(self, asked_at: float, suspended: set[int]) -> None:
        """Slurm's word: a job SUSPENDED while it ran for a move-out is noted; a process stopped
        again whose job Slurm no longer calls SUSPENDED (asked after that stop) is continued."""
        for record in self.active.values():
            client = self.core.registry.clients.get(record.client_id)
            if client is not None and client.job_id in suspended:
                record.slurm = True
        for cid, (at, slurm) in list(self.restopped.items()):
            client = self.core.registry.clients.get(cid)
            if client is None or not slurm:
                self.restopped.pop(cid)
                continue
            if asked_at <= at or client.job_id in suspended:
                continue
            del self.restopped[cid]
            why_not = signal_checked(_identity(client), signal.SIGCONT, self._pidfd(client),
                                     stopped_only=True)
            self.logger.info(f"{client.label()}: Slurm resumed its job about when nvshare "
                             f"stopped it again after its move-out: "
                             f"{'continued (SIGCONT)' if not why_not else f'not continued: {why_not}'}")

    def runs(self, client_id: int) -> None:
        """Seen running (not by our move-out): nothing to undo."""
        self.restopped.pop(client_id, None)

    def forget(self, client_id: int) -> None:
        record = self.active.get(client_id)
        if record is not None:
            self._end(record)
        self.restopped.pop(client_id, None)

    def shutdown(self) -> None:
        """The daemon stops: whoever runs for a move-out is stopped again now (no resume rule:
        nobody would stop it later). A daemon killed outright leaves it running."""
        for record in list(self.active.values()):
            why_not = "" if record.stopping_at is not None else _stop(record)
            self.logger.warning(f"{record.label}: the daemon stops during its move-out: "
                                f"{'stopped again (SIGSTOP)' if not why_not else why_not}")
            self._end(record)

    def _end(self, record: MoveOut) -> None:
        if self.active.get(record.client_id) is record:
            del self.active[record.client_id]
        if record.pidfd >= 0:
            os.close(record.pidfd)
            record.pidfd = -1

    # --- the process ------------------------------------------------------------------------

    @staticmethod
    def _pidfd(client: RegisteredClient) -> int | None:
        """The pidfd of the client's connection (taken now if it has none: the connection keeps
        and closes it)."""
        conn = client.connection
        if conn is None:
            return None
        if conn.pidfd is None:
            conn.pidfd = peer_pidfd(conn)
        return conn.pidfd


def _identity(client: RegisteredClient) -> ProcIdentity:
    return ProcIdentity(client.pid, client.uid, -1, ANY_START, client.job_id)


def _stop(record: MoveOut) -> str:
    """SIGSTOP through the record's pidfd, after the checks; "" when sent or already stopped."""
    seen = read_identity(record.process.pid)
    if seen is not None and seen.stopped:
        return ""
    return signal_checked(record.process, signal.SIGSTOP, record.pidfd)
