"""Tasks of managed jobs that run without the hook: found, reported, and handled by policy.

A task runs ungated when libnvshare.so did not reach it: not preloaded (LD_PRELOAD unset, a static
binary), not mounted into its container, or failed to load (ld.so then only prints "cannot be
preloaded ... ignored"). Nothing inside such a process can say so, so the daemon looks from outside
and needs no NVML: every rogue_check_sec it reads, for each process whose cgroup places it in a
registered job (`job_<id>`, see devices.py) and whose uid is the job's, /proc/<pid>/maps. A process
with libcuda.so mapped and no libnvshare.so is a missing hook. Then:

- the daemon logs it once per job (each further process of the job at debug level);
- nvshare-status shows the job's `unhooked` processes (the job is ungated there);
- the job's output says so: one line is written to the process's own stderr (/proc/<pid>/fd/2:
  the batch job's StdErr file, or srun's terminal), opened by a child process running as the job's
  uid and gid, never as root, so the line lands only where the user could write it;
- its GPU work meanwhile follows `rogue_process`: `warn` lets it run ungated (reported as above);
  `kill` kills the process after that line, through procinfo.signal_checked (uid, start time, job).
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from ..base import log
from .procinfo import (ProcIdentity, job_of_cgroup, mapped_libraries, read_identity,
                       signal_checked)

if TYPE_CHECKING:
    from .daemoncore import Core

HOOK_LIBRARY = "libnvshare.so"
DRIVER_LIBRARY = "libcuda.so"
NOTICE_TIMEOUT_SEC = 5.0
PER_JOB_KEPT = 32           # unhooked processes kept per job for status (the first ones)

# Run as the job's user: append one line to the target's stderr, never creating a file and never
# blocking on a FIFO without a reader.
_WRITE_NOTICE = (
    "import os, sys\n"
    "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | os.O_NONBLOCK)\n"
    "os.write(fd, sys.argv[2].encode())\n")


def find_unhooked(job_uids: dict[int, int], proc: str = "/proc") -> list[ProcIdentity]:
    """Processes of the given jobs (job id -> its uid) with the CUDA driver and without the hook."""
    found = []
    try:
        entries = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return []
    for name in entries:
        pid = int(name)
        try:                      # the cheap look first: most processes are in no managed job
            with open(f"{proc}/{name}/cgroup", encoding="utf-8", errors="replace") as fh:
                if job_of_cgroup(fh.read(65536)) not in job_uids:
                    continue
        except OSError:
            continue
        identity = read_identity(pid)
        if identity is None or identity.job_id not in job_uids or \
                identity.uid != job_uids[identity.job_id]:
            continue
        libraries = mapped_libraries(pid)
        if libraries is None:
            continue
        if any(n.startswith(DRIVER_LIBRARY) for n in libraries) and \
                not any(n.startswith(HOOK_LIBRARY) for n in libraries):
            found.append(identity)
    return found


def write_notice(identity: ProcIdentity, line: str) -> str:
    """Append line to the process's stderr as its own uid and gid; "" when written, else why not."""
    try:
        result = subprocess.run(
            [sys.executable, "-I", "-c", _WRITE_NOTICE, f"/proc/{identity.pid}/fd/2", line],
            user=identity.uid, group=identity.gid, extra_groups=[], capture_output=True,
            text=True, errors="replace", timeout=NOTICE_TIMEOUT_SEC, env={"PATH": "/usr/bin:/bin"},
            cwd="/")
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit {result.returncode}"
    return ""


class HookWatch:
    """The periodic scan and what the daemon remembers of it (for status)."""

    def __init__(self, core: Core):
        self.core = core
        self.unhooked: dict[int, dict[tuple[int, int], dict[str, Any]]] = {}   # job -> found
        self._notified: set[int] = set()                                       # jobs told

    async def scan(self) -> None:
        jobs = {j.job_id: j.uid for j in self.core.registry.jobs.values()}
        found = await asyncio.to_thread(find_unhooked, jobs) if jobs else []
        seen: dict[int, set[tuple[int, int]]] = {}
        for identity in found:
            assert identity.job_id is not None
            key = (identity.pid, identity.start)
            seen.setdefault(identity.job_id, set()).add(key)
            known = self.unhooked.setdefault(identity.job_id, {})
            if key in known or len(known) >= PER_JOB_KEPT:
                continue
            known[key] = {"pid": identity.pid, "uid": identity.uid, "since": time.time()}
            await self._report(identity)
        # Exited processes and unregistered jobs are forgotten.
        for job_id in list(self.unhooked):
            if job_id not in jobs:
                del self.unhooked[job_id]
                self._notified.discard(job_id)
                continue
            keep = seen.get(job_id, set())
            self.unhooked[job_id] = {k: v for k, v in self.unhooked[job_id].items() if k in keep}

    async def _report(self, identity: ProcIdentity) -> None:
        job_id = identity.job_id
        assert job_id is not None
        policy = self.core.cfg.rogue_process
        first = job_id not in self._notified
        text = (f"job {job_id}: pid {identity.pid} (uid {identity.uid}) runs with the CUDA driver "
                f"but without {HOOK_LIBRARY} (not preloaded, not mounted in its container, or it "
                f"failed to load): its GPU work is not gated")
        if first:
            self._notified.add(job_id)
            notice = (f"nvshare: {text}; "
                      f"{'this process is killed' if policy == 'kill' else 'it runs unshared'} "
                      f"(rogue_process: {policy}). Ask your admin, or see the user guide.\n")
            why_not = await asyncio.to_thread(write_notice, identity, notice)
            told = "the job's output says so" if not why_not else \
                f"not told in the job's output: {log.escape(why_not, 200)}"
            self.core.logger.warning(f"{text}; {told} (rogue_process: {policy})")
        else:
            self.core.logger.debug(f"{text} (rogue_process: {policy})")
        if policy == "kill":
            why_not = signal_checked(identity)
            self.core.logger.warning(f"job {job_id}: pid {identity.pid} without the hook: "
                                     f"{'killed' if not why_not else 'not killed: ' + why_not}")

    def for_status(self, job_id: int) -> list[dict[str, Any]]:
        return list(self.unhooked.get(job_id, {}).values())
