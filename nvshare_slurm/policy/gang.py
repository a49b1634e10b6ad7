"""Gang turns: a job placed on several GPUs holds all of them or none, in one order for all GPUs.

Multi-GPU jobs (DDP over NCCL) launch kernels that wait for their peer ranks on the other GPUs. If
job A held GPU 0 and job B held GPU 1 while each waited for the other GPU, both would spin forever,
and the holders' drains would never end (docs/design-scheduler.md "Gang turns"). So:

- A job placed on two or more GPUs of the node is a gang from its first request, for all of its
  processes together. Waiting for its first work on a second GPU would be too late: by then its
  first rank may already hold one GPU with a collective in flight while another job holds the next.
- Gangs take turns in one global order (class first, then the earliest waiting request of each
  gang). A gang claims all its GPUs at once, and only when no gang earlier in the order wants any
  of them and no single-GPU client that waited longer (in its class, or of a better class) waits
  on a GPU it needs. A running turn is not cut short for a better class: it ends as any turn
  does. Claimed GPUs are given to its waiting clients together (SHARED) once every GPU it waits on
  is free of others.
- Single-GPU jobs fill any GPU of a claimed set that the gang has not used in this turn; a filler
  is dropped at once when the gang asks for that GPU (its drain cannot wait on another GPU).
- The turn ends on all its GPUs together: one switch interval (the shortest of its GPUs') after
  someone else started waiting for one of them, DROP_LOCK goes to every holder of the gang; the
  GPUs stay claimed until every holder has released. Meanwhile a rank that asks again while a
  peer drains gets a step (a grant with DROP_LOCK right behind): the DROP_LOCK may have caught it
  one collective behind that peer, whose drain then waits for it. A holder that still cannot
  drain (DRAIN_STUCK, or no release within about a turn while its peers wait, see
  Gang.stuck_after) usually waits for a peer the end of the turn shut out: the gang's waiting
  clients are granted again so that the collective can finish, and the end of the turn is
  retried once the gang runs whole again (every client it dropped holds again), or one switch
  interval after that resumption at the latest.

Pure policy like gpustate.py: the caller's clock, no I/O; `schedule(now)` returns per-GPU Actions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..base.priority import RANK
from .gpustate import GpuState
from .policytypes import GANG_STEP_AFTER, GANG_STEP_WINDOW_MIN, Action, ClientInfo


@dataclass
class Gang:
    job_id: int
    gpus: list[GpuState]             # its placed GPUs, in placement order
    multinode: bool = False          # its ranks on other nodes wait for its ranks here
    contention_since: float | None = None
    ending: bool = False             # DROP_LOCK sent to all its holders: the turn is over
    dropped: set[int] = field(default_factory=set)   # the clients that the end of turn dropped
    resumed_at: float | None = None  # a stuck drain made it grant its waiting clients again
    ended_at: float = 0.0            # when DROP_LOCK last went to all its holders
    why: str = ""                    # why it waits (status)
    turns: int = 0

    @property
    def owns(self) -> bool:
        turn = self.gpus[0].lock.turn
        return turn is not None and turn.job_id == self.job_id

    @property
    def started(self) -> bool:
        turn = self.gpus[0].lock.turn
        return self.owns and turn is not None and turn.started

    def holders(self) -> list[tuple[GpuState, Any]]:
        return [(g, h) for g in self.gpus for h in g.lock.job_holders(self.job_id)]

    def waiters(self) -> list[tuple[GpuState, ClientInfo, float]]:
        return [(g, c, since) for g in self.gpus for c, since in g.lock.job_waiters(self.job_id)]

    def ticket(self) -> float | None:
        """Its place in the global order: its earliest waiting request."""
        return min((since for _, _, since in self.waiters()), default=None)

    def rank(self) -> int:
        """Its job's class rank (priority.py); the same for all its clients."""
        return min((c.rank for _, c, _ in self.waiters()), default=RANK["normal"])

    def interval(self) -> float:
        """How long its turn lasts once others wait: the shortest of its GPUs' turns."""
        return min(g.settings.max_runtime_sec if g.settings.mode == "serial"
                   else g.switch_interval() for g in self.gpus)

    def stuck_after(self) -> float:
        """How long a holder may drain after DROP_LOCK, while its gang's clients wait, before it
        is taken as stuck without saying so (a hook without DRAIN_STUCK): about a turn, at least
        a second (a drain that moves memory takes its time), at most half of drop_grace_sec."""
        return min(self.gpus[0].settings.drop_grace_sec / 2, max(1.0, self.interval()))

    def step_window(self) -> float:
        """How long after the end of its turn its ranks may still take steps: one interval, at
        least GANG_STEP_WINDOW_MIN (a rank on a loaded CPU asks late), and no longer than a drain
        may look stuck (after that, the stuck-drain resolution)."""
        return min(max(self.interval(), GANG_STEP_WINDOW_MIN), self.stuck_after())

    def indices(self) -> str:
        return ",".join(str(g.index) for g in self.gpus)


@dataclass
class GangPolicy:
    gangs: dict[int, Gang] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)    # for the daemon's log, taken by schedule()

    # --- jobs ----------------------------------------------------------------------------------

    def add_job(self, job_id: int, gpus: list[GpuState], multinode: bool = False) -> bool:
        """A registered job: a gang when it is placed on two or more GPUs, or holds GPUs on other
        nodes too (multinode: a gang of its GPUs here, however many)."""
        known = self.gangs.get(job_id)
        if known is not None and multinode and not known.multinode:   # Slurm said so later
            known.multinode = True
            for gpu in known.gpus:
                gpu.lock.join_gang(job_id, waits_outside=True)
            return True
        if len(gpus) < (1 if multinode else 2) or known is not None:
            return False
        self.gangs[job_id] = Gang(job_id, list(gpus), multinode)
        for gpu in gpus:
            gpu.lock.join_gang(job_id, waits_outside=multinode)
        return True

    def first_multinode(self, gang: Gang) -> Gang | None:
        """A multi-node gang of a lower job id on one of this multi-node gang's GPUs: it goes
        first, here and on every node (Multi-node jobs, below)."""
        mine = {gpu.uuid for gpu in gang.gpus}
        return min((other for other in self.gangs.values()
                    if other.multinode and other.job_id < gang.job_id
                    and mine & {gpu.uuid for gpu in other.gpus}),
                   key=lambda other: other.job_id, default=None)

    def remove_job(self, job_id: int) -> None:
        gang = self.gangs.pop(job_id, None)
        if gang is None:
            return
        for gpu in gang.gpus:
            gpu.lock.leave_gang(job_id)

    # --- events --------------------------------------------------------------------------------

    def drain_stuck(self, gpu: GpuState, client: ClientInfo, now: float) -> str:
        """DRAIN_STUCK from a client: what the daemon does about it, for its log line."""
        if not gpu.lock.mark_stuck(client.client_id, now):
            return "it holds no lock there; nothing to resolve"
        gang = self.gangs.get(client.job_id)
        if gang is None or not gang.owns:
            return ("it keeps the GPU until its work finishes; others wait, and it is not "
                    "counted as unresponsive while it reports")
        return (f"its gang (job {gang.job_id} on GPUs {gang.indices()}) gets its waiting "
                f"clients granted so that the work it waits for can finish")

    # --- the pass ------------------------------------------------------------------------------

    def schedule(self, now: float) -> list[tuple[GpuState, list[Action]]]:
        """Advance every gang's turn after an event; the per-GPU actions that follow from it."""
        out: list[tuple[GpuState, list[Action]]] = []
        if not self.gangs:
            return out
        for _ in range(8):          # claim, start, end, release: each settles in a pass
            changed: set[int] = set()
            for gang in self.gangs.values():
                if gang.owns:
                    self._run_turn(gang, now, out, changed)
            self._claim(now, changed)
            if not changed:
                break
            for gang in self.gangs.values():
                if gang.job_id in changed:
                    for gpu in gang.gpus:
                        out.append((gpu, gpu.tick(now)))
        for gang in self.gangs.values():
            self._set_deadline(gang, now)
        return out

    def _claim(self, now: float, changed: set[int]) -> None:
        """Waiting gangs, in the global order, claim their GPUs when nothing earlier wants them."""
        blocked: dict[str, int] = {}        # GPU uuid -> the gang that owns or first wants it
        for gang in self.gangs.values():
            if gang.owns:
                for gpu in gang.gpus:
                    blocked[gpu.uuid] = gang.job_id
        waiting = [(gang.rank(), ticket, gang.job_id, gang) for gang in self.gangs.values()
                   if not gang.owns and (ticket := gang.ticket()) is not None]
        for rank, ticket, _, gang in sorted(waiting, key=lambda item: item[:3]):
            first = self.first_multinode(gang) if gang.multinode else None
            if first is not None:     # not in the order here: it blocks nobody while it waits
                gang.why = (f"multi-node job {first.job_id} goes first on GPUs {first.indices()} "
                            f"(multi-node jobs run in job-id order on every node)")
                continue
            before = next((blocked[g.uuid] for g in gang.gpus if g.uuid in blocked), None)
            for gpu in gang.gpus:
                blocked.setdefault(gpu.uuid, gang.job_id)
            if before is not None:
                gang.why = f"gang job {before} goes first on GPUs {self.gangs[before].indices()}"
                continue
            needed = {gpu.uuid for gpu, _, _ in gang.waiters()}
            longer = [gpu.index for gpu in gang.gpus if gpu.uuid in needed and
                      any(client.rank < rank or since < ticket and client.rank == rank
                          for client, since in gpu.lock.queue.values())]
            if longer:
                gang.why = (f"single-GPU clients that waited longer on GPU "
                            f"{','.join(map(str, longer))} go first")
                continue
            for gpu in gang.gpus:
                gpu.lock.claim_turn(gang.job_id)
            gang.contention_since, gang.ending, gang.why = None, False, ""
            changed.add(gang.job_id)

    def _others_wait(self, gang: Gang) -> bool:
        """Does anybody else wait for one of its GPUs: a single-GPU client where the gang has
        work, or another gang that shares a GPU with it?"""
        for gpu in gang.gpus:
            if gpu.lock.queue and gpu.lock.turn_here():
                return True
        mine = {gpu.uuid for gpu in gang.gpus}
        return any(other is not gang and other.ticket() is not None
                   and mine & {gpu.uuid for gpu in other.gpus}
                   for other in self.gangs.values())

    def _run_turn(self, gang: Gang, now: float, out: list[tuple[GpuState, list[Action]]],
                  changed: set[int]) -> None:
        holders = gang.holders()
        waiters = gang.waiters()
        turns = [gpu.lock.turn for gpu in gang.gpus]
        if not gang.started:
            if not waiters and not holders:
                self._release(gang, changed)
                return
            needed = {gpu.uuid for gpu, _, _ in waiters}
            busy = [gpu.index for gpu in gang.gpus if gpu.uuid in needed and
                    any(h.client.job_id != gang.job_id for h in gpu.lock.holders.values())]
            if busy:
                gang.why = f"claimed; others finish their turn on GPU {','.join(map(str, busy))}"
                return
            for gpu in gang.gpus:
                gpu.lock.start_turn()
            gang.turns += 1
            gang.why = ""
            changed.add(gang.job_id)
            return
        used = any(turn.used for turn in turns)  # type: ignore[union-attr]  # started: a turn on each GPU
        if not holders and ((used and (gang.ending or gang.contention_since is not None
                                       or not waiters)) or (not used and not waiters)):
            self._release(gang, changed)
            return
        if self._others_wait(gang):
            if gang.contention_since is None:
                gang.contention_since = now
            # Serial GPUs keep a job's lock while it idles, a gang's too.
            serial = any(gpu.settings.mode == "serial" for gpu in gang.gpus)
            for gpu in gang.gpus if not gang.ending and not serial else ():
                contended = gpu.lock.contend_job(gang.job_id)
                if contended:
                    out.append((gpu, contended))
        else:
            gang.contention_since = None
        if not gang.ending:
            if gang.contention_since is not None \
                    and now >= gang.contention_since + gang.interval():
                self._end_turn(gang, now, out, changed)
            return
        # The turn is over and DROP_LOCK went out. Ranks stop at different points of their
        # work: one may have launched collective k+1 while its peer had finished k and now asks
        # to launch k+1. Until every rank has released, such a request gets one step (granted,
        # DROP_LOCK right behind): it launches what it waited to launch, so the collective can
        # complete and the drains end. Waiting for the next turn instead stalled both GPUs until
        # the drain was taken as stuck (stuck_after, 1 s): 1-2 times in each run of issue 15's
        # two-GPU proof on the fake driver. The GPUs stay claimed meanwhile: no other gang runs
        # there.
        # Steps stop after a while (Gang.step_window): a gang whose ranks keep asking while a
        # peer drains (each step putting one ahead of the other) cannot keep the GPUs.
        granting = turns[0].grants  # type: ignore[union-attr]  # started: a turn on each GPU
        drains = not granting and any(h.drop_at is not None for _, h in holders)
        until = gang.ended_at + gang.step_window() if drains else None
        if until is not None and now >= until:
            until = None
        if until != turns[0].steps_until:  # type: ignore[union-attr]  # started: a turn on each GPU
            for gpu in gang.gpus:
                gpu.lock.allow_steps_until(until)
        if until is not None and gang.job_id not in changed and any(
                now >= since + GANG_STEP_AFTER and not gpu.waits_for_room()
                for gpu, _, since in waiters):
            # A step is due: tick all its GPUs, since the timer that woke us may be another
            # GPU's, and this pass's deadlines no longer include the step. Not where the GPU's
            # last pass withheld a grant for room: it tries again itself once room changes, and
            # ticking it would only withhold again, pass after pass.
            changed.add(gang.job_id)
        # A holder that still cannot drain (DRAIN_STUCK, or no release for about a turn while
        # its gang's clients wait, e.g. a step withheld for room): let the gang run whole again,
        # then retry.
        grace = gang.stuck_after()
        stuck = [(gpu, h) for gpu, h in holders if h.drop_at is not None and
                 (h.stuck_at is not None or (waiters and now >= h.drop_at + grace))]
        if stuck and waiters and not granting:
            gang.resumed_at = now
            for gpu in gang.gpus:
                gpu.lock.resume_turn()
            for gpu, holder in stuck:
                if holder.stuck_at is None:  # a hook that does not send DRAIN_STUCK
                    gpu.lock.presume_stuck(holder.client.client_id, now)
                    self.notes.append(
                        f"gpu {gpu.uuid}: {holder.client.label()}: not released "
                        f"{now - holder.drop_at:.1f}s after DROP_LOCK while its gang's other "
                        f"clients wait; taken as a stuck drain")
            self.notes.append(f"job {gang.job_id}: gang on GPUs {gang.indices()}: a drain is "
                              f"stuck; its waiting clients are granted again so that it can "
                              f"finish")
            changed.add(gang.job_id)
        elif granting and not waiters and all(h.drop_at is None for _, h in holders) and (
                gang.dropped <= {h.client.client_id for _, h in holders}
                or now >= (gang.resumed_at or now) + gang.interval()):
            self._end_turn(gang, now, out, changed)       # whole again: end the turn again

    def _end_turn(self, gang: Gang, now: float, out: list[tuple[GpuState, list[Action]]],
                  changed: set[int]) -> None:
        gang.ending, gang.resumed_at, gang.ended_at = True, None, now
        gang.dropped = {h.client.client_id for _, h in gang.holders()}
        for gpu in gang.gpus:
            dropped = gpu.end_turn(now)
            if dropped:
                out.append((gpu, dropped))
        changed.add(gang.job_id)

    def _release(self, gang: Gang, changed: set[int]) -> None:
        for gpu in gang.gpus:
            gpu.lock.release_turn()
        gang.contention_since, gang.ending, gang.resumed_at = None, False, None
        gang.dropped = set()
        changed.add(gang.job_id)

    def _set_deadline(self, gang: Gang, now: float) -> None:
        """When the gang next needs a pass: its turn's end, or a drain to take as stuck."""
        if not gang.owns:
            return
        deadline = None
        if not gang.ending and gang.started and gang.contention_since is not None:
            deadline = gang.contention_since + gang.interval()
        elif gang.ending and gang.resumed_at is not None:
            deadline = gang.resumed_at + gang.interval()
        elif gang.ending and (waiters := gang.waiters()):
            grace = gang.stuck_after()
            pending = [h.drop_at + grace for _, h in gang.holders()
                       if h.drop_at is not None and h.stuck_at is None]
            until = gang.gpus[0].lock.turn.steps_until  # type: ignore[union-attr]  # ending: its turn stays until released
            if until is not None:       # a waiter's step
                pending += [t for _, _, since in waiters
                            if now <= (t := since + GANG_STEP_AFTER) < until]
            deadline = min(pending, default=None)
        for gpu in gang.gpus:
            gpu.lock.set_turn_deadline(deadline)

    # --- status --------------------------------------------------------------------------------

    def status(self, job_id: int) -> dict[str, Any] | None:
        gang = self.gangs.get(job_id)
        if gang is None:
            return None
        if gang.owns:
            state = "ending" if gang.ending else "running" if gang.started else "claiming"
        else:
            state = "waiting" if gang.ticket() is not None else "idle"
        why = gang.why if state in ("waiting", "claiming") else ""
        return {"job_id": job_id, "gpu_index": [g.index for g in gang.gpus],
                "gpus": [g.uuid for g in gang.gpus], "state": state, "why": why,
                "turns": gang.turns, "multinode": gang.multinode}
