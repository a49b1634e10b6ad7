"""Status JSON (docs/protocol.md "Status JSON") as scontrol-style text: pure functions, no I/O.

A record is lines of Key=Value pairs: the first line flush left, the rest indented three spaces,
records separated by a blank line (`scontrol show node`). One-liner mode puts a record on one line.
Everything a user controls (job names, user names, GPU names from a config) goes through `safe`, so
no newline, escape sequence or other control character from the daemon's JSON reaches a terminal.
"""
from __future__ import annotations

import json
import time
from typing import Any
from collections.abc import Iterable, Sequence

from ..base.log import STEP_NAMES, escape

# A record: lines, each a list of (key, rendered value).
Pair = tuple[str, str]
Record = list[list[Pair]]

NULL = "(null)"
MAX_TEXT = 128  # characters of user text shown; --json has the rest

def safe(value: Any, limit: int | None = MAX_TEXT) -> str:
    """Text fit for a terminal: control and format characters escaped, backslash doubled (so an
    escape in the output is never ambiguous), cut to `limit` characters with a trailing '...'.
    The same escaping as the daemon's log (log.escape)."""
    if value is None:
        return NULL
    return escape(value, limit)


def human_size(value: Any) -> str:
    """Bytes as 16.0G, 512.0M, 1.5K, 100B (binary units); exact numbers are in --json."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return NULL if value is None else safe(value)
    size = float(value)
    for unit, scale in (("P", 1 << 50), ("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20),
                        ("K", 1 << 10)):
        if abs(size) >= scale:
            return f"{size / scale:.1f}{unit}"
    return f"{int(size)}B"


def duration(seconds: Any) -> str:
    """Seconds as Slurm prints times: [days-]HH:MM:SS."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return NULL if seconds is None else safe(seconds)
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def interval(seconds: Any) -> str:
    """A switch interval: short, fractional, so seconds with one decimal."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return NULL if seconds is None else safe(seconds)
    return f"{float(seconds):.1f}s"


def timestamp(epoch: Any) -> str:
    """Local time as scontrol prints it: 2024-05-01T12:00:00."""
    if not isinstance(epoch, (int, float)) or isinstance(epoch, bool):
        return NULL if epoch is None else safe(epoch)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def step_name(job_id: Any, step_id: Any) -> str:
    step = STEP_NAMES.get(step_id, step_id) if isinstance(step_id, int) else step_id
    return f"{safe(job_id)}.{safe(step)}"


def number(value: Any) -> str:
    if value is None:
        return NULL
    if isinstance(value, bool):
        return "yes" if value else "no"
    return safe(value)


def _join(items: Iterable[str]) -> str:
    items = list(items)
    return ",".join(items) if items else NULL


def user_label(user: Any, uid: Any = None) -> str:
    name = safe(user) if user not in (None, "") else NULL
    return f"{name}({safe(uid)})" if uid is not None else name


# --- records ------------------------------------------------------------------------------------

def gpu_record(gpu: dict[str, Any], node: Any = None) -> Record:
    holders = []
    for h in gpu.get("holders") or []:
        mode = ",shared" if h.get("shared") else ""
        holders.append(f"{step_name(h.get('job_id'), h.get('step_id'))}(pid={safe(h.get('pid'))},"
                       f"user={user_label(h.get('user'))},held={duration(h.get('held_sec'))}{mode}"
                       f"{_class_note(h)})")
    waiting = []
    for w in gpu.get("waiting") or []:
        waiting.append(f"{step_name(w.get('job_id'), w.get('step_id'))}(pid={safe(w.get('pid'))},"
                       f"user={user_label(w.get('user'))},"
                       f"waiting={duration(w.get('waiting_sec'))}{_class_note(w)})")
    rogue = [f"{safe(r.get('pid'))}({human_size(r.get('memory'))})" for r in gpu.get("rogue") or []]
    switch_time = gpu.get("switch_time")
    # A waiter whose grant waits for room that stopped clients' memory holds (issue 39).
    room_wait = gpu.get("waits_for_room")
    waits = [[("WaitsForRoom", f"{step_name(room_wait.get('job_id'), room_wait.get('step_id'))}"
                               f"(pid={safe(room_wait.get('pid'))}): "
                               f"{safe(room_wait.get('reason'), 400)}")]] \
        if isinstance(room_wait, dict) else []
    first = [("Index", number(gpu.get("index"))), ("UUID", safe(gpu.get("uuid"), None))]
    if node is not None:
        first.append(("Node", safe(node)))
    first.append(("Name", safe(gpu.get("name")) if gpu.get("name") else NULL))
    return [
        first,
        [("MemoryTotal", human_size(gpu.get("memory_total"))),
         ("MemoryUsed", human_size(gpu.get("memory_used"))),
         ("MemoryReserved", human_size(gpu.get("memory_reserved"))),
         ("MemoryUsable", human_size(gpu.get("memory_usable")))],
        [("MemoryFixed", human_size(gpu.get("memory_fixed"))),
         ("MemorySwapped", human_size(gpu.get("memory_swapped"))),
         ("MemoryReservePercent", number(gpu.get("memory_reserve_percent")))],
        # What only the driver holds (drivermemory.py): ended processes' memory not yet released,
        # live clients' beyond their reports, unregistered processes'; and NVML's figure less all.
        [("MemoryEnded", human_size(gpu.get("memory_ended"))),
         ("MemoryOverhead", human_size(gpu.get("memory_overhead"))),
         ("MemoryOther", human_size(gpu.get("memory_other"))),
         ("DriverGap", _gap(gpu.get("memory_gap")))],
        [("Mode", safe(gpu.get("mode")) if gpu.get("mode") is not None else NULL),
         ("SwitchTime", "auto" if switch_time == "auto" else interval(switch_time)),
         ("SwitchInterval", interval(gpu.get("switch_interval_sec"))),
         ("MaxRuntime", duration(gpu.get("max_runtime_sec"))),
         ("CoRunning", number(bool(gpu.get("co_running"))))],
        [("Sharing", sharing_label(gpu))],
        [("Holders", _join(holders)), ("Turn", turn_label(gpu.get("turn")))],
        [("Waiting", _join(waiting))],
        *waits,
        [("Jobs", _join(safe(j) for j in gpu.get("jobs") or [])), ("Rogue", _join(rogue))],
    ]


def _gap(value: Any) -> str:
    """NVML's used memory less what the scheduler counts, signed; (null) without a driver view."""
    if not isinstance(value, int) or isinstance(value, bool) or value == -1:
        return NULL
    return human_size(value)


def sharing_label(gpu: dict[str, Any]) -> str:
    """`turns(2 busy clients take turns)`: the policy's choice and why; the word alone when the
    daemon gives no reason."""
    if not gpu.get("sharing"):
        return NULL
    reason = gpu.get("sharing_reason")
    return f"{safe(gpu.get('sharing'))}({safe(reason)})" if reason else safe(gpu.get("sharing"))


def _class_note(entry: dict[str, Any]) -> str:
    """`,class=low` for a holder or waiter of a class other than normal."""
    share_class = entry.get("class")
    return f",class={safe(share_class)}" if share_class and share_class != "normal" else ""


def class_label(job: dict[str, Any]) -> str:
    """`high(qos prod)`: the job's share class and why."""
    if not job.get("share_class"):
        return NULL
    return f"{safe(job.get('share_class'))}({safe(job.get('class_reason') or 'default')})"


def turn_label(turn: Any) -> str:
    """Whose gang turn a GPU is in: `job 12(running)`."""
    if not isinstance(turn, dict):
        return NULL
    return f"job {safe(turn.get('job_id'))}({safe(turn.get('state'))})"


def gang_lines(gang: Any) -> list[list[Pair]]:
    """`Gang=job 12 on 0,1 GangState=waiting GangWaitsFor=...` for a job that takes gang turns."""
    if not isinstance(gang, dict):
        return []
    line = [("Gang", f"job {safe(gang.get('job_id'))} on "
                     f"{_join(safe(i) for i in gang.get('gpu_index') or [])}"
                     f"{' and other nodes' if gang.get('multinode') else ''}"),
            ("GangState", safe(gang.get("state"))), ("GangTurns", number(gang.get("turns")))]
    if gang.get("why"):
        line.append(("GangWaitsFor", safe(gang.get("why"))))
    return [line]


def job_record(job: dict[str, Any], now: Any = None, node: Any = None) -> Record:
    uuids = list(job.get("gpus") or [])
    indices = list(job.get("gpu_index") or [])
    index_of = dict(zip(uuids, indices, strict=False))

    def gpu_label(uuid: Any) -> str:
        return safe(index_of[uuid]) if uuid in index_of else safe(uuid, None)

    registered = job.get("registered")
    run_time = (now - registered if isinstance(now, (int, float)) and
                isinstance(registered, (int, float)) else None)
    first = [("JobId", number(job.get("job_id"))),
             ("JobName", safe(job.get("name")) if job.get("name") else NULL),
             ("User", user_label(job.get("user"), job.get("uid")))]
    if node is not None:
        first.append(("Node", safe(node)))
    record: Record = [
        first,
        [("Slots", number(job.get("slots"))),
         ("GPUIndex", _join(safe(i) for i in indices)),
         ("GPU_UUIDs", _join(safe(u, None) for u in uuids))],
        [("Registered", timestamp(registered)), ("RunTime", duration(run_time)),
         ("Class", class_label(job))],
        *gang_lines(job.get("gang")),
    ]
    # Only when there is something to say (hookwatch.py, statekeeper.py): processes running
    # without the hook, and a job known only from its processes until Slurm answers.
    unhooked = [safe(p.get("pid")) for p in job.get("unhooked") or [] if isinstance(p, dict)]
    if unhooked:
        record.append([("Ungated", f"no hook in pid {_join(unhooked)}")])
    suspended = job.get("suspended")
    if isinstance(suspended, dict):
        record.append([("State", "suspended"), ("Suspended", duration(suspended.get("sec"))),
                       ("Reason", safe(suspended.get("reason")))])
    if job.get("provisional"):
        record.append([("Provisional", "yes(state lost, Slurm not answering yet)")])
    usage = job.get("usage")
    if isinstance(usage, dict):
        for uuid, u in usage.items():
            u = u if isinstance(u, dict) else {}
            record.append([("GpuUsage", gpu_label(uuid)), ("Held", duration(u.get("held_sec"))),
                           ("Waited", duration(u.get("wait_sec"))),
                           *([("SuspendedTime", duration(u.get("suspended_sec")))]
                             if u.get("suspended_sec") else []),
                           ("PeakMemory", human_size(u.get("peak_memory"))),
                           ("Swapped", human_size(u.get("swapped_out"))),
                           ("Turns", number(u.get("turns")))])
    clients = job.get("clients") or []
    if not clients:
        record.append([("Clients", NULL)])
    for client in clients:
        states = []
        for uuid, usage in (client.get("gpus") or {}).items():
            usage = usage if isinstance(usage, dict) else {}
            state = safe(usage.get("state")) if usage.get("state") else NULL
            states.append(f"{gpu_label(uuid)}:{state}:{human_size(usage.get('allocated'))}")
        record.append([("Client", number(client.get("pid"))),
                       ("Step", step_name(job.get("job_id"), client.get("step_id"))),
                       ("GpuState", _join(states))])
    return record


def config_value(key: str, value: Any) -> str:
    if key == "gpus" and isinstance(value, list):
        return _join(f"{safe(g.get('uuid'), None)}({human_size(g.get('memory'))})"
                     if isinstance(g, dict) else safe(g) for g in value)
    if isinstance(value, (dict, list)):
        return safe(json.dumps(value, sort_keys=True), None)
    return number(value)


def config_record(config: dict[str, Any]) -> Record:
    return [[(safe(key), config_value(key, value))] for key, value in config.items()]


# --- layout -------------------------------------------------------------------------------------

def format_record(record: Record, oneliner: bool = False) -> str:
    if oneliner:
        return " ".join(f"{k}={v}" for line in record for k, v in line)
    lines = [" ".join(f"{k}={v}" for k, v in line) for line in record]
    return "\n".join([lines[0]] + ["   " + line for line in lines[1:]]) if lines else ""


def format_records(records: Sequence[Record], oneliner: bool = False) -> str:
    """Records one per block (blank line between) or one per line; ends with a newline."""
    texts = [format_record(r, oneliner) for r in records]
    if not texts:
        return ""
    return ("\n" if oneliner else "\n\n").join(texts) + "\n"


def truncated_note(status: dict[str, Any]) -> str:
    """The daemon's reply fits one frame: say so when it had to leave entries out."""
    cut = status.get("truncated")
    if not isinstance(cut, dict):
        return ""
    return (f"({number(cut.get('shown'))} of {number(cut.get('total'))} "
            f"{safe(cut.get('list'))} shown: the rest did not fit in one reply; "
            f"`nvshare-status show job <id>` shows any one job)\n")


def refused_note(status: dict[str, Any]) -> str:
    """Client registrations the daemon refused lately (a container outside its job's cgroup, a
    wrong uid): those processes run ungated."""
    return "".join(f"Refused: job={number(r.get('job_id'))} pid={number(r.get('pid'))} "
                   f"uid={number(r.get('uid'))} at={timestamp(r.get('time'))} "
                   f"reason={safe(r.get('reason'))}\n"
                   for r in status.get("refused") or [] if isinstance(r, dict))


def render_gpus(status: dict[str, Any], oneliner: bool = False) -> str:
    gpus = status.get("gpus") or []
    if not gpus:
        node = safe(status.get("node") or "this node")
        return f"No GPUs managed by nvshare-scheduler on {node}\n"
    return format_records([gpu_record(g, status.get("node")) for g in gpus],
                          oneliner) + truncated_note(status) + refused_note(status)


def render_jobs(status: dict[str, Any], oneliner: bool = False) -> str:
    jobs = status.get("jobs") or []
    if not jobs:
        return f"No nvshare jobs on {safe(status.get('node') or 'this node')}\n"
    return format_records([job_record(j, status.get("time"), status.get("node")) for j in jobs],
                          oneliner) + truncated_note(status) + refused_note(status)


def render_config(status: dict[str, Any], oneliner: bool = False) -> str:
    """`show config`: one `key = value` per line, aligned as scontrol show config; -o: one line."""
    config = status.get("config") or {}
    if oneliner:
        return format_records([config_record(config)], oneliner=True)
    rows = [(safe(k), config_value(k, v)) for k, v in config.items()]
    width = max((len(k) for k, _ in rows), default=0)
    header = (f"Configuration of nvshare-scheduler {safe(status.get('version'))} on "
              f"{safe(status.get('node'))} (pid {safe(status.get('daemon_pid'))})")
    return "\n".join([header] + [f"{k.ljust(width)} = {v}" for k, v in rows]) + "\n"
