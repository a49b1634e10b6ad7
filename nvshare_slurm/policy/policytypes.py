"""Types the per-GPU policy shares with its parts and its callers: what a client is (ClientInfo), a
GPU's settings, the Actions the policy returns and their kinds, a memory decision, a lock holder,
and a gang's turn on one GPU.

gpustate.py (the turn policy), gpumemory.py (memory accounting) and gang.py (gang turns) import
these from here rather than from each other; daemon.py reads Actions and MemDecisions.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..base.config import OVERRIDABLE, Config
from ..base.log import step_text
from ..base.priority import RANK

# A client asked to move memory out (DROP_LOCK, PREPARE_SWAP_OUT) has this much longer than
# drop_grace_sec: its first move out pins host memory as it goes (1.4-5.5 GB/s on the H100, so 70
# GiB may outlast the grace); in mix4-mem on the fake driver an 8 GiB move took 39 s, and its owner
# (every job of the bench) was benched for 30 s with the GPU idle. Not swap_bandwidth (20 GiB/s, what a
# switch is expected to take): the grace must cover the slowest move that is still making progress.
MOVE_GRACE_SEC_PER_GIB = 1.0


def move_grace(nbytes: int) -> float:
    """The seconds of grace added for moving nbytes out (about 1 GB/s)."""
    return nbytes / (1 << 30) * MOVE_GRACE_SEC_PER_GIB


GRANT = "grant"
CONTENDED = "contended"
DROP = "drop"
UNRESPONSIVE = "unresponsive"
SWAP_OUT = "swap_out"                   # PREPARE_SWAP_OUT
MEM_REPLY = "mem_reply"                 # a MEM_REPLY that waited for room
SWAP_UNANSWERED = "swap_unanswered"     # PREPARE_SWAP_OUT not answered within drop_grace_sec
PREFETCH = "prefetch"                   # PREFETCH: bring `bytes` of swapped memory back before a turn
HANDOFF = "handoff"                     # HANDOFF: `source`'s turn passes to `client` by an eventfd
ENDED_MEMORY = "ended_memory"           # an ended client's `bytes` count free: the driver released
#                                         them (value 0) or the deadline passed (1); flags: ms after


@dataclass(frozen=True)
class GpuSettings:
    """The knobs of one GPU: config defaults overlaid with admin overrides (config.OVERRIDABLE
    names those). The defaults are the config's own (one place to change them: the two copies had
    drifted apart)."""
    mode: str = Config.scheduling_mode
    auto_share: str = Config.auto_share
    switch_time_mode: str = Config.switch_time_mode
    switch_time_fixed: float = Config.switch_time_fixed
    switch_time_multiplier: float = Config.switch_time_multiplier
    switch_time_min: float = Config.switch_time_min
    swap_bandwidth: int = Config.swap_bandwidth
    memory_reserve_percent: int = Config.memory_reserve_percent
    max_runtime_sec: int = Config.max_runtime_sec
    drop_grace_sec: float = Config.drop_grace_sec
    burst_turns: bool = Config.burst_turns
    turn_handoff: bool = Config.turn_handoff

    @property
    def adaptive(self) -> bool:
        """auto with auto_share adaptive: turns for whoever gains by them, the rest co-run."""
        return self.mode == "auto" and self.auto_share == "adaptive"

    @classmethod
    def from_config(cls, cfg: Any, overrides: dict[str, Any] | None = None) -> GpuSettings:
        base = cls(mode=cfg.scheduling_mode, auto_share=cfg.auto_share,
                   switch_time_mode=cfg.switch_time_mode,
                   switch_time_fixed=cfg.switch_time_fixed,
                   switch_time_multiplier=cfg.switch_time_multiplier,
                   switch_time_min=cfg.switch_time_min, swap_bandwidth=cfg.swap_bandwidth,
                   memory_reserve_percent=cfg.memory_reserve_percent,
                   max_runtime_sec=cfg.max_runtime_sec, drop_grace_sec=cfg.drop_grace_sec,
                   burst_turns=cfg.burst_turns, turn_handoff=cfg.turn_handoff)
        return replace(base, **{k: v for k, v in (overrides or {}).items() if k in OVERRIDABLE})


@dataclass
class ClientInfo:
    """What the policy needs to know about one connected client process."""
    client_id: int
    job_id: int
    step_id: int
    pid: int
    user: str = ""
    mem_limit: int = 0        # NVSHARE_MEM_LIMIT of this process; 0 = none
    share_class: str = "normal"   # its job's class (priority.py): high, normal, low
    prefetch: bool = True     # its hook answers PREFETCH (CLIENT_REGISTER flag NVSHARE_CLIENT_PREFETCH)

    @property
    def rank(self) -> int:
        """Lower goes first."""
        return RANK.get(self.share_class, RANK["normal"])

    def label(self) -> str:
        return f"job {self.job_id} step {step_text(self.step_id)} pid {self.pid}"


@dataclass(frozen=True)
class MemDecision:
    status: int               # NVSHARE_OK or NVSHARE_ERR_NOMEM
    available: int
    total: int
    flags: int = 0            # NVSHARE_MEM_DEFERRED
    no_room: bool = False     # a held request answered without its room: nothing more moved


@dataclass(frozen=True)
class Action:
    kind: str                 # GRANT, CONTENDED, DROP, UNRESPONSIVE, SWAP_OUT, MEM_REPLY, ...
    client: ClientInfo
    flags: int = 0            # GRANT: NVSHARE_GRANT_*
    value: int = 0            # GRANT: switch_ms; DROP: NVSHARE_DROP_*
    bytes: int = 0            # DROP, SWAP_OUT: to move to host memory; GRANT: swapped bytes that
    #                           do not fit (granted anyway: nothing more could move)
    reply: MemDecision | None = None   # MEM_REPLY
    token: int = 0            # MEM_REPLY: the seq of the request it answers
    bursts: bool = False      # GRANT, shared: co-runners take turns burst by burst (burst_turns)
    yields: bool = False      # GRANT to a turn holder beside such co-runners: it waits out their
    #                           prompt bursts (GRANT_YIELD, with the burst page)
    ahead: int = 0            # GRANT with SWAP_AHEAD: its memory the GPU lacks room for (pinned ahead)
    source: ClientInfo | None = None   # HANDOFF: the holder whose turn ends (told before its DROP)
    unasked: bool = False     # GRANT: a standing grant, to a client that asked for nothing


@dataclass
class Holder:
    """A client that holds the lock of one GPU, and where its DROP_LOCK stands."""
    client: ClientInfo
    since: float
    shared: bool
    bursts: bool = False              # shared, and its bursts take turns with the other co-runners'
    yields: bool = False              # a turn holder told to wait out the co-runners' prompt bursts
    contended: bool = False
    standing: bool = False            # granted unasked (promptidle.standing_grants)
    drop_at: float | None = None      # when DROP_LOCK was sent
    drop_reason: int = 0
    drop_bytes: int = 0               # what that DROP_LOCK asked it to move out
    unresponsive_reported: bool = False
    stuck_at: float | None = None     # its last DRAIN_STUCK: its drain grace restarts there

    def grace_from(self) -> float | None:
        """Since when it has not released: DROP_LOCK, or its latest DRAIN_STUCK report."""
        if self.drop_at is None:
            return None
        return self.drop_at if self.stuck_at is None else max(self.drop_at, self.stuck_at)


# The end of a gang's turn: a rank that asks again while a peer still drains gets one step (a
# grant, DROP_LOCK right behind) once it has waited this long. Ranks that finish a collective
# together release within a fraction of a millisecond of each other; without the wait, the first
# to ask again would step one collective ahead of its peer every time, then its peer, and so on.
GANG_STEP_AFTER = 0.002
# Steps go on for one switch interval after the end of a gang's turn, but for this long at least: a
# rank asks again once its process next runs, and on a loaded CPU (two spinning processes on a 2-core
# machine, CI's) a rank whose peer drained asked more than a 20 ms turn after its end in 3 of 10 runs
# of tests/hook/test_gang_hook.py's stall test, waited for the next turn, and its peer's drain was
# taken as stuck a second later (issue 15's stall again).
GANG_STEP_WINDOW_MIN = 0.25


@dataclass
class Turn:
    """A gang's hold on one of its GPUs, set by gang.py on all of the gang's GPUs together
    (through GpuState's claim_turn, start_turn, end_turn... never by writing these fields).

    While the gang has work here (a holder, a waiter, or a grant earlier in this turn), only its
    clients are granted here. `started`: the gang runs, so a request of its own drops any other
    holder here at once. `grants`: False once its turn ends (DROP_LOCK to all its holders).
    `steps_until`: the turn ends but a rank of the gang still drains, perhaps in a collective
    that waits for this GPU's rank: until then a request of the gang here is granted and dropped
    again at once."""
    job_id: int
    started: bool = False
    grants: bool = True
    steps_until: float | None = None
    used: bool = False                # granted here in this turn
    deadline: float | None = None     # when gang.py next needs a pass (turn end, stuck drain)
