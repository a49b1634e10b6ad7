"""Suspended jobs and stopped processes give their shared GPUs up (issue 28).

Slurm suspends a job (scontrol suspend, PreemptMode=SUSPEND, gang scheduling) in three moves:
slurmctld marks it SUSPENDED at once; slurmd's slurmstepd then sends SIGTSTP to its direct
children, waits 2 s (PreemptParameters=suspend_grace_time from 23.11) and sends SIGSTOP, which
under proctrack/cgroup is a freeze of the job's cgroup. A CUDA process that a batch script starts
never sees the SIGTSTP; it is simply frozen, and a frozen process moves no memory. So the daemon
looks from outside, three ways, and never touches the freezer itself:

- every suspend_check_sec, the Slurm task each client runs under (its ancestor whose parent is
  slurmstepd: the batch script; procinfo.slurm_task) when that is another process: stopped (T)
  while the client runs is slurmstepd's SIGTSTP, seen within a look of it, with the whole grace
  time left for the move-out (a squeue on a loaded node took most of 22.05's 2 s once in CI, and
  the freeze came first). The client is taken as suspended at once, as below, and Slurm is asked
  now: an answer asked after the stop that does not call the job SUSPENDED (its user stopped the
  script) ends this word until the task stops again;

- every suspend_slurm_poll_sec (while jobs are registered here), and at once when a job is
  registered (a preemptor starts as its victim is suspended), one `squeue --states=SUSPENDED` for
  this node (slurm.py): the early word. Each client of such a job that still runs is told
  DROP_LOCK(SUSPEND) (or PREPARE_SWAP_OUT when it holds nothing) with all its swappable memory, so
  the memory goes to host memory, within the job's memory cgroup, before the freeze;
- every suspend_check_sec, each client's run state (procinfo.pause_reason): stopped (T), traced
  (t), or its cgroup frozen (freezer.state, cgroup.events). Such a client cannot answer: it holds
  no lock from that moment, its turns go to the others at once, and it is never taken as
  unresponsive (nor killed: procinfo.signal_checked refuses it). This covers SIGSTOP alone and a
  debugger too, and a Slurm suspend whose early word came too late.

A process stopped by a signal whose memory a waiter needs is let run for its move-out and
stopped again (moveout.py, issue 39); frozen and traced ones are left as they are.

A suspended client's lock requests wait here (park), not in a GPU's queue, until its job runs
again: then they are made as if they had just come, and the grant brings its memory back before its
gate opens (the hook's swap-in). A client that was asked to move memory out for the suspension is
told RESUMED on those GPUs first: a swap-out it still has pending or under way (one the freeze
caught half-way) stops, and what is still on the GPU stays there. A stopped or frozen client seen
running again has Slurm asked at once rather than at the next poll. nvshare-status shows such a
client `suspended`, and the ledger counts the time apart from waiting.
"""
from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..node import slurm
from ..node.render import human_size
from ..policy.gpupause import resume_client, suspend_client
from ..wire.proto import C
from .moveout import MoveOuts
from .procinfo import STOPPED, memory_headroom, pause_reason, slurm_task, task_stopped

if TYPE_CHECKING:
    from ..policy.gpustate import GpuState
    from .daemoncore import Core
    from .registry import RegisteredClient

SLURM_REASON = "its job is suspended by Slurm"
TASK_REASON = "its Slurm task is stopped: Slurm's SIGTSTP before a suspend"
SLURM_TIMEOUT_SEC = 5.0


@dataclass
class Pause:
    """One suspended client: since when, why, and whether its process can still run."""
    job_id: int
    since: float
    reason: str
    stopped: bool                         # it cannot run (stopped, frozen): it answers nothing
    moving: dict[str, int] = field(default_factory=dict)   # GPU -> bytes it was asked to move out


class SuspendWatch:
    """The daemon's part that finds suspended clients and takes them off their GPUs."""

    def __init__(self, core: Core):
        self.core = core
        self.logger = core.logger
        self.paused: dict[int, Pause] = {}
        self.parked: dict[int, set[str]] = {}          # client -> GPUs it asked for meanwhile
        self.slurm_suspended: set[int] = set()
        self._slurm_error = ""
        self._slurm_next = 0.0
        self._slurm_asked_at = 0.0
        self._slurm_answered = -1.0     # when Slurm's latest answer was asked for
        self.tasks: dict[int, tuple[int, int] | None] = {}   # client -> its Slurm task, if another
        self.task_stops: dict[int, float] = {}                # client -> its task seen stopped since
        self._slurm_task: asyncio.Future[Any] | None = None
        self.moves = MoveOuts(core)       # stopped processes let run for a move-out

    # --- what the handlers and status ask ------------------------------------------------------

    def park(self, client: RegisteredClient, uuid: str) -> bool:
        """A LOCK_REQUEST of a suspended client waits here until it resumes (True)."""
        if client.client_id not in self.paused:
            return False
        self.parked.setdefault(client.client_id, set()).add(uuid)
        return True

    def job_started(self) -> None:
        """A job was registered here: Slurm may have suspended another for it (preemption by
        suspension starts the preemptor at once). Ask squeue at the next look, not at the next
        poll: a suspended job's memory can move out only before its freeze (2 s after SIGTSTP)."""
        self._slurm_next = 0.0

    def after_send(self, gpu: GpuState) -> None:
        """A GPU's Actions went out (sender.py): let run the stopped clients its pass wants for a
        move-out, stop again those whose move-out is over."""
        if gpu.stopped.wanted or gpu.stopped.done:
            self.moves.follow(gpu, self.slurm_suspended)

    def state_of(self, client_id: int) -> str | None:
        return "suspended" if client_id in self.paused else None

    def for_status(self, job_id: int) -> dict[str, Any] | None:
        """The job's suspension for nvshare-status: since (daemon clock), why; None if running."""
        pauses = [p for p in self.paused.values() if p.job_id == job_id]
        if not pauses:
            return None
        first = min(pauses, key=lambda p: p.since)
        return {"since": round(first.since, 3), "sec": round(self.core.now() - first.since, 3),
                "reason": first.reason}

    # --- the watch -----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._watch()
        finally:                    # the daemon stops: nobody is left running for a move-out
            self.moves.shutdown()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.core.cfg.suspend_check_sec)
            try:
                self._maybe_ask_slurm()
                self.check()
                self.moves.tick(self.slurm_suspended)
            except Exception as exc:  # noqa: BLE001 - a failed look must never stop the daemon
                self.logger.error(f"suspend check failed: {exc!r}")

    def _maybe_ask_slurm(self) -> None:
        """Start one squeue in a thread when it is due and none is under way."""
        every = self.core.cfg.suspend_slurm_poll_sec
        now = self.core.now()
        if not every or now < self._slurm_next or self._slurm_task is not None:
            return
        if not self.core.registry.jobs:
            self.slurm_suspended = set()
            return
        self._slurm_next = now + every
        self._slurm_asked_at = now
        node = self.core.cfg.node_name if self.core.cfg.node_name != "-" \
            else socket.gethostname().split(".")[0]
        self._slurm_task = asyncio.ensure_future(asyncio.to_thread(
            slurm.suspended_jobs, node, self.core.cfg.slurm_bin_dir, SLURM_TIMEOUT_SEC))
        self._slurm_task.add_done_callback(self._slurm_answer)

    def _slurm_answer(self, task: asyncio.Future[Any]) -> None:
        self._slurm_task = None
        try:
            jobs = task.result()
        except slurm.SlurmError as exc:
            if str(exc) != self._slurm_error:
                self.logger.warning(f"suspend: cannot ask Slurm which jobs are suspended: {exc}; "
                                    f"stopped and frozen processes are still seen "
                                    f"(suspend_slurm_poll_sec)")
            self._slurm_error = str(exc)
            return
        if self._slurm_error:
            self.logger.info("suspend: Slurm answers again")
            self._slurm_error = ""
        self.slurm_suspended = jobs & set(self.core.registry.jobs)
        self._slurm_answered = self._slurm_asked_at
        self.moves.slurm_answer(self._slurm_asked_at, self.slurm_suspended)
        self.check()

    def check(self) -> None:
        """One look at every client: new suspensions take effect, ended ones resume."""
        now = self.core.now()
        clients = self.core.registry.clients
        for cid in [c for c in self.paused if c not in clients]:
            self._forget(cid, now)
        for cid in [c for c in self.tasks if c not in clients]:
            del self.tasks[cid]
            self.task_stops.pop(cid, None)
        for client in list(clients.values()):
            if client.client_id in self.moves.active:
                continue                    # let run for a move-out: it is still stopped to us
            why = pause_reason(client.pid)
            stopped = bool(why)
            if not stopped:
                self.moves.runs(client.client_id)
            # Read even while Slurm says SUSPENDED: at its resume the script still stopped for a
            # moment (RUNNING comes before the SIGCONT) is then a stop Slurm has answered.
            task_word = not stopped and self._task_stopped(client, now)
            if not why and client.job_id in self.slurm_suspended:
                why = SLURM_REASON
            elif task_word:
                why = TASK_REASON
            pause = self.paused.get(client.client_id)
            if pause is not None and pause.stopped and not stopped:
                # Thawed (Slurm thaws a job only to resume it): ask Slurm now, not at the next poll.
                pause.stopped = False
                self._slurm_next = 0.0
                if why:                     # still suspended by Slurm; else _resume thaws it
                    self._thaw(client, now)
            if why and (pause is None or (stopped and not pause.stopped)):
                self._suspend(client, why, stopped, pause, now)
            elif not why and pause is not None:
                self._resume(client, pause, now)

    def _task_stopped(self, client: RegisteredClient, now: float) -> bool:
        """Whether the client's Slurm task (another process: its batch script) is stopped while it
        runs, and Slurm has not said since that the job runs. The first look that sees it, where
        Slurm has not said SUSPENDED already, asks Slurm at once."""
        cid = client.client_id
        if cid not in self.tasks:
            self.tasks[cid] = slurm_task(client.pid)
        task = self.tasks[cid]
        if task is None or not task_stopped(task):
            self.task_stops.pop(cid, None)
            return False
        since = self.task_stops.get(cid)
        if since is None:
            self.task_stops[cid] = since = now
            if client.job_id in self.slurm_suspended:
                return True                 # Slurm's word came first: nothing to say
            self._slurm_next = 0.0
            asks = bool(self.core.cfg.suspend_slurm_poll_sec)
            self.logger.info(f"{client.label()}: its Slurm task (pid {task[0]}) is stopped: "
                             f"taken as Slurm's suspend"
                             f"{', Slurm is asked now' if asks else ' (suspend_slurm_poll_sec 0)'}")
        return not (self._slurm_answered > since and client.job_id not in self.slurm_suspended)

    # --- suspend and resume ----------------------------------------------------------------------

    def _suspend(self, client: RegisteredClient, why: str, stopped: bool, before: Pause | None,
                 now: float) -> None:
        pause = Pause(client.job_id, before.since if before else now, why, stopped,
                      dict(before.moving) if before else {})
        self.paused[client.client_id] = pause
        if before is None:
            self.core.ledger.suspend(client.job_id, now)
        for uuid in sorted(client.gpus):
            gpu = self.core.gpus.get(uuid)
            if gpu is None:
                continue
            where = f"gpu {uuid}: {client.label()}"
            use = gpu.usage.get(client.client_id)
            resident = max(0, use.allocated - use.fixed) if use is not None else 0
            move = 0 if stopped else self._movable(client, where, resident)
            if stopped and pause.moving.get(uuid) and resident:
                self.logger.warning(f"{where}: {why} before its memory was out: "
                                    f"{human_size(resident)} stays on the GPU until it resumes")
            if move:
                pause.moving[uuid] = move
            held = client.client_id in gpu.holders
            if gpu.lock.withdraw(client.client_id):
                # It asked before the suspend and waits for that grant: made again on resume.
                self.parked.setdefault(client.client_id, set()).add(uuid)
            self.logger.info(
                f"{where}: suspended ({why}): holds no lock until it runs again"
                f"{'; its lock goes to others now' if held else ''}"
                f"{f'; {human_size(move)} to host memory' if move else ''}")
            self.core.after_event(gpu, suspend_client(gpu, client.client_id, now, stopped, move,
                                                      _state_words(why), why == STOPPED))

    def _movable(self, client: RegisteredClient, where: str, resident: int) -> int:
        """The swappable bytes to move out, or 0 when the job's memory cgroup cannot hold them
        (pinned host memory counts against --mem): then the memory stays, and that is logged."""
        if not resident:
            return 0
        headroom = memory_headroom(client.pid)
        if headroom is not None and headroom < resident:
            self.logger.warning(f"{where}: its {human_size(resident)} stays on the GPU while "
                                f"suspended: the job's memory limit has {human_size(headroom)} "
                                f"left (Slurm --mem); Slurm still stops its processes")
            return 0
        return resident

    def _resume(self, client: RegisteredClient, pause: Pause, now: float) -> None:
        del self.paused[client.client_id]
        if not any(p.job_id == pause.job_id for p in self.paused.values()):
            self.core.ledger.resume(pause.job_id, now)
        asked = self.parked.pop(client.client_id, set())
        moving = sorted(u for u in pause.moving if u in client.gpus)
        if client.connection is not None:
            for uuid in moving:
                # Memory still moving out for the suspension would only have to come back.
                client.connection.send(C.NVSHARE_MSG_RESUMED, {"gpu_uuid": uuid})
        self._thaw(client, now)
        self.logger.info(f"{client.label()}: runs again after {now - pause.since:.1f}s suspended"
                         f"{'; told to stop moving memory out' if moving else ''}"
                         f"{'; its lock requests go ahead' if asked else ''}")
        for uuid in sorted(asked):
            gpu = self.core.gpus.get(uuid)
            if gpu is not None and uuid in client.gpus:
                self.core.after_event(gpu, gpu.request(client, now))

    def _thaw(self, client: RegisteredClient, now: float) -> None:
        """It runs: its GPUs may ask it to move memory again."""
        for uuid in sorted(client.gpus):
            gpu = self.core.gpus.get(uuid)
            if gpu is not None:
                self.core.after_event(gpu, resume_client(gpu, client.client_id, now))

    def _forget(self, client_id: int, now: float) -> None:
        pause = self.paused.pop(client_id)
        self.parked.pop(client_id, None)
        self.moves.forget(client_id)
        if not any(p.job_id == pause.job_id for p in self.paused.values()):
            self.core.ledger.resume(pause.job_id, now)


def _state_words(why: str) -> str:
    """A stopped or frozen client's state, as a waiter's reason says it (status)."""
    if why == STOPPED:
        return "its process is stopped"
    if why.startswith("stopped"):
        return "its process is stopped by a debugger"
    return "its cgroup is frozen (nvshare never thaws it)"
