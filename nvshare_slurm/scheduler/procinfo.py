"""Who a process is, read from /proc, and the one way the daemon signals a process: checked.

A pid alone names nobody for long: it is reused once its process exits. So every kill goes through
signal_checked(), which holds the target through a pidfd (pidfd_open, Linux 5.3; or one the daemon
took when the process registered), reads the process's uid, start time, Slurm job (its cgroup
`job_<id>`) and run state from /proc, and signals through that pidfd only when all of them are what
the caller saw before: a pid reused by another process, of another uid, or moved into another job,
is never signalled, and neither is a stopped (suspended) process, except by the one caller that
continues a process stopped by a signal for its GPU memory's move-out and stops it again (issue 39:
moveout.py). A signal through the pidfd of a process that has exited since fails instead of reaching
a stranger.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import NamedTuple

from .devices import slurm_jobs_of_cgroup

ANY_START = -1
STOPPED = "stopped (state T)"       # pause_reason of a process a signal stopped (SIGSTOP, SIGTSTP)
# At most this many processes stopped beside one are kept as its witnesses (stopped_relatives).
MAX_WITNESSES = 64


@dataclass(frozen=True)
class ProcIdentity:
    """One process as /proc shows it; pid and start together name it for its whole life."""
    pid: int
    uid: int                  # real uid
    gid: int                  # real gid
    start: int                # start time in clock ticks since boot (/proc/<pid>/stat field 22);
    #                           ANY_START where the caller's pidfd already pins the process
    job_id: int | None        # the Slurm job of its cgroup (job_<id>), None outside any job
    stopped: bool = False     # state T or t (stopped by a signal, or traced), or its cgroup is
    #                           frozen or freezing (Slurm's suspend under proctrack/cgroup)
    state: str = ""           # its run state (/proc/<pid>/stat field 3): R, S, D, T, t, ...
    frozen: bool = False      # its cgroup is frozen or freezing

    def same_process(self, other: ProcIdentity) -> bool:
        """Whether other is this very process, still of the same uid and job."""
        return (self.pid, self.start, self.uid, self.job_id) == \
            (other.pid, other.start, other.uid, other.job_id)


def job_of_cgroup(text: str) -> int | None:
    """The Slurm job a /proc/<pid>/cgroup text places the process in (devices.py reads the
    `job_<id>` directory below a slurm one: v1 `/slurm/uid_U/job_J/step_S`, v2
    `/system.slice/slurmstepd.scope/job_J/...`). None when there is none, or when hierarchies
    disagree (nothing to trust)."""
    jobs = slurm_jobs_of_cgroup(text)
    return next(iter(jobs)) if len(jobs) == 1 else None


class ProcStat(NamedTuple):
    """What /proc/<pid>/stat says of a process that the daemon reads."""
    comm: str                 # its name (field 2, without the parentheses)
    state: str                # its run state (field 3): R, S, D, T, t, ...
    parent: int               # its parent's pid (field 4)
    group: int                # its process group (field 5)
    start: int                # its start in clock ticks since boot (field 22)


def stat_of(pid: int) -> ProcStat | None:
    """The process's /proc/<pid>/stat, or None when it has exited or the file cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            head, tail = fh.read().rsplit(b")", 1)
        fields = tail.split()
        return ProcStat(head.split(b"(", 1)[1].decode(errors="replace"), fields[0].decode(),
                        int(fields[1]), int(fields[2]), int(fields[19]))
    except (OSError, ValueError, IndexError):
        return None


def read_identity(pid: int) -> ProcIdentity | None:
    """The process's identity now, or None when it has exited or /proc cannot be read."""
    stat = stat_of(pid)
    if stat is None:
        return None
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as fh:
            status = fh.read()
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            cgroup = fh.read()
        lines = {line.split(":", 1)[0]: line.split(":", 1)[1].split()
                 for line in status.splitlines() if ":" in line}
        uid, gid = int(lines["Uid"][0]), int(lines["Gid"][0])
    except (OSError, ValueError, IndexError, KeyError):
        return None
    frozen = bool(cgroup_frozen(cgroup))
    return ProcIdentity(pid, uid, gid, stat.start, job_of_cgroup(cgroup),
                        stat.state in ("T", "t") or frozen, stat.state, frozen)


def cgroup_frozen(cgroup_text: str, root: str = "/sys/fs/cgroup") -> str:
    """Why the cgroup a /proc/<pid>/cgroup text names is frozen (or freezing), else "": cgroup v1
    `freezer.state` FROZEN or FREEZING, or v2 `cgroup.events` `frozen 1` (`cgroup.freeze` 1 while
    it is still freezing). A frozen process is in no run state of its own to read (often D or S),
    and slurmstepd's SIGSTOP under proctrack/cgroup is such a freeze."""
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or ".." in parts[2].split("/"):
            continue
        path = parts[2].rstrip("\n")
        if "freezer" in parts[1].split(","):
            state = _read_small(f"{root}/freezer{path}/freezer.state")
            if state in ("FROZEN", "FREEZING"):
                return f"its cgroup is {state.lower()} (freezer.state {state})"
        elif parts[0] == "0" and parts[1] == "":
            for base in (root, f"{root}/unified"):
                events = _read_small(f"{base}{path}/cgroup.events")
                if events is None:
                    continue
                if "frozen 1" in events.splitlines():
                    return "its cgroup is frozen (cgroup.events frozen 1)"
                if _read_small(f"{base}{path}/cgroup.freeze") == "1":
                    return "its cgroup is freezing (cgroup.freeze 1)"
                break
    return ""


def pause_reason(pid: int, root: str = "/sys/fs/cgroup") -> str:
    """Why the process cannot run now, or "" when it can (or has exited): stopped (state T),
    traced (t), or its cgroup frozen. Two small reads of /proc, one or two of the cgroup tree."""
    stat = stat_of(pid)
    if stat is None:
        return ""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            cgroup = fh.read(65536)
    except OSError:
        return ""
    if stat.state == "T":
        return STOPPED
    if stat.state == "t":
        return "stopped by a debugger (state t)"
    return cgroup_frozen(cgroup, root)


SLURMSTEPD = "slurmstepd"     # the comm of Slurm's step daemon, the parent of every task
MAX_ANCESTORS = 32            # how far up slurm_task looks for slurmstepd


def slurm_task(pid: int) -> tuple[int, int] | None:
    """(pid, start tick) of the Slurm task the process runs under, when that is another process:
    its ancestor whose parent is slurmstepd (a batch script, an srun step's command). Under
    proctrack/cgroup a suspend's SIGTSTP reaches only such tasks, and stops a batch script at
    once, two seconds (suspend_grace_time) before the freeze: the word that needs no squeue.
    None when the process is that task itself, or runs under no slurmstepd."""
    chain: list[tuple[int, int]] = []
    cur = pid
    for _ in range(MAX_ANCESTORS):
        seen = stat_of(cur)
        if seen is None:
            return None
        if seen.comm == SLURMSTEPD:
            return chain[-1] if len(chain) >= 2 else None
        chain.append((cur, seen.start))
        if seen.parent <= 1:
            return None
        cur = seen.parent
    return None


def task_stopped(task: tuple[int, int]) -> bool:
    """Whether the task slurm_task named is still that process and stopped by a signal (state
    T): one read of /proc/<pid>/stat."""
    seen = stat_of(task[0])
    return seen is not None and seen.start == task[1] and seen.state == "T"


def _read_small(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read(4096).strip()
    except OSError:
        return None


def mapped_libraries(pid: int) -> set[str] | None:
    """The file names (no directory) of the shared objects mapped into the process, or None when
    its maps cannot be read (it exited, or a kernel that hides them)."""
    names: set[str] = set()
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split(None, 5)     # address perms offset dev inode [path]
                path = fields[5].strip() if len(fields) == 6 else ""
                if path.startswith("/") and ".so" in path:
                    names.add(path.rsplit("/", 1)[1].removesuffix(" (deleted)"))
    except OSError:
        return None
    return names


def signal_checked(expected: ProcIdentity, sig: int = signal.SIGKILL,
                   pidfd: int | None = None, stopped_only: bool = False) -> str:
    """Signal the process `expected` names, through a pidfd, after checking that it still is that
    process (uid, start time, the job of its cgroup where it is in one) and is not stopped; with
    `stopped_only`, that it is stopped by a signal (state T; not traced, not in a frozen cgroup):
    the SIGCONT of a move-out. Returns "" when signalled, else why not (one phrase, for the
    caller's log line). pidfd: one the caller holds for it (kept open); otherwise one is opened
    (and closed) here."""
    own = pidfd is None
    if own:
        try:
            pidfd = os.pidfd_open(expected.pid)
        except ProcessLookupError:
            return "it has exited"
        except (OSError, AttributeError) as exc:
            return f"it cannot be held by a pidfd ({exc}), so a reused pid cannot be ruled out"
    assert pidfd is not None
    try:
        now = read_identity(expected.pid)
        try:
            # Alive after /proc was read: what /proc showed was the pidfd's process (a pid is
            # not reused while its process lives).
            signal.pidfd_send_signal(pidfd, 0)
        except ProcessLookupError:
            return "it has exited"
        if now is None:
            return "its /proc entry cannot be read"
        if expected.start == ANY_START and own:
            return "no start time to check it against"
        if expected.start != ANY_START and now.start != expected.start:
            return (f"pid {expected.pid} is another process now (started at tick {now.start}, "
                    f"not {expected.start})")
        if now.uid != expected.uid:
            return f"its uid is {now.uid}, not {expected.uid}"
        # Outside any job cgroup (a node without proctrack/cgroup) its job cannot be read;
        # in another job's it is not the process meant.
        if now.job_id is not None and now.job_id != expected.job_id:
            return (f"it is in job {now.job_id if now.job_id is not None else '(none)'}, "
                    f"not {expected.job_id if expected.job_id is not None else '(none)'}")
        if stopped_only and (now.state != "T" or now.frozen):
            return (f"it is not stopped by a signal now (state {now.state or '?'}"
                    f"{', its cgroup frozen' if now.frozen else ''})")
        if now.stopped and not stopped_only:
            return "it is stopped (suspended); a stopped process is never killed for this"
        try:
            signal.pidfd_send_signal(pidfd, sig)
        except ProcessLookupError:
            return "it has exited"
        except OSError as exc:
            return f"cannot signal it: {exc}"
        return ""
    finally:
        if own:
            os.close(pidfd)


def stopped_relatives(pid: int) -> list[ProcIdentity]:
    """The processes stopped by a signal (state T) beside this one: its parent and the others of
    its process group (a batch script that Slurm stopped with its children under proctrack/
    linuxproc, a shell pipeline stopped by Ctrl-Z). Whoever resumes them (Slurm's resume, a
    shell's fg, kill -CONT -PGID) resumes this one too, so one of them running again later says
    this one was resumed as well (moveout.py). Reads every /proc/<pid>/stat once."""
    mine = stat_of(pid)
    if mine is None:
        return []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    found: list[ProcIdentity] = []
    for name in names:
        if not name.isdigit() or int(name) == pid:
            continue
        other = int(name)
        theirs = stat_of(other)
        if theirs is None or theirs.state != "T" or \
                (other != mine.parent and theirs.group != mine.group):
            continue
        seen = read_identity(other)
        if seen is not None and seen.state == "T" and not seen.frozen:
            found.append(seen)
            if len(found) >= MAX_WITNESSES:
                break
    return found


def memory_headroom(pid: int, root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes the process's memory cgroup may still grow by (v2 memory.max - memory.current, v1
    memory.limit_in_bytes - memory.usage_in_bytes), or None when it has no limit or none can be
    read. Pinned host memory for a swap-out counts against it (Slurm's --mem)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            text = fh.read(65536)
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or ".." in parts[2].split("/"):
            continue
        if "memory" in parts[1].split(","):
            names = [(f"{root}/memory{parts[2]}", "memory.limit_in_bytes", "memory.usage_in_bytes")]
        elif parts[0] == "0" and parts[1] == "":
            names = [(f"{base}{parts[2]}", "memory.max", "memory.current")
                     for base in (root, f"{root}/unified")]
        else:
            continue
        for directory, limit_name, usage_name in names:
            limit, usage = _read_small(f"{directory}/{limit_name}"), \
                _read_small(f"{directory}/{usage_name}")
            if limit is None or usage is None:
                continue
            if not limit.isdigit() or not usage.isdigit() or int(limit) >= 1 << 60:
                return None               # "max", or v1's "no limit" (a huge number)
            return max(0, int(limit) - int(usage))
    return None
