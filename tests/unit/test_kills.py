"""Kill only what you mean (issue 25 item 6): every kill goes through procinfo.signal_checked, which
holds the target by a pidfd and checks its uid, start time, job cgroup and run state first. The rogue
check signalled a raw pid from an NVML snapshot: a pid reused by another uid's process was killed."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from dataclasses import replace

import pytest

from conftest import become
from helpers_daemon import NOBODY, OTHER
from helpers_procs import JobCgroup
from nvshare_slurm.base import config
from nvshare_slurm.daemon import Daemon
from nvshare_slurm.node.inventory import GpuInfo, GpuProcess
from nvshare_slurm.scheduler.procinfo import read_identity, signal_checked


def _sleeper(uid: int | None = None, preexec=None) -> subprocess.Popen:
    def drop() -> None:
        if preexec is not None:
            preexec()
        elif uid is not None:
            become(uid)
    return subprocess.Popen(["sleep", "60"], preexec_fn=drop)


def _reap(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_signal_checked_kills_only_the_process_it_was_shown():
    proc = _sleeper(NOBODY)
    try:
        time.sleep(0.1)
        seen = read_identity(proc.pid)
        assert seen is not None and seen.uid == NOBODY
        assert "another process" in signal_checked(replace(seen, start=seen.start - 1))
        assert f"uid is {NOBODY}, not {OTHER}" in signal_checked(replace(seen, uid=OTHER))
        assert proc.poll() is None
        assert signal_checked(seen) == ""
        assert proc.wait(5) == -signal.SIGKILL
        assert signal_checked(seen) == "it has exited"
    finally:
        _reap(proc)


def test_signal_checked_spares_another_jobs_process_and_a_stopped_one():
    cgroup = JobCgroup(41, NOBODY)
    proc = _sleeper(preexec=cgroup.enter(NOBODY))
    try:
        time.sleep(0.1)
        seen = read_identity(proc.pid)
        assert seen is not None and seen.job_id == 41
        assert "in job 41, not 42" in signal_checked(replace(seen, job_id=42))
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.1)
        assert "stopped" in signal_checked(seen)
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.1)
        assert proc.poll() is None
        assert signal_checked(seen) == ""
        assert proc.wait(5) == -signal.SIGKILL
    finally:
        _reap(proc)
        cgroup.close()


class FakeInventory:
    def __init__(self):
        self.pids: list[int] = []

    def gpus(self):
        return [GpuInfo("GPU-a", 0, "fake", 16 << 30)]

    def processes(self, uuid):
        return [GpuProcess(pid, 1 << 20) for pid in self.pids]

    def driver_memory(self, uuid):
        return None


def _spawn_with_pid(pid: int, uid: int) -> subprocess.Popen | None:
    """A process of uid that gets exactly `pid` (the kernel's next pid set through ns_last_pid);
    None when another process on the machine took it first."""
    try:
        with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
            fh.write(str(pid - 1))
    except OSError:
        return None
    proc = _sleeper(uid)
    if proc.pid == pid:
        return proc
    _reap(proc)
    return None


def test_rogue_kill_never_hits_a_recycled_pid_of_another_uid(tmp_path):
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("needs root to choose the next pid (ns_last_pid)")
    inventory = FakeInventory()
    cfg = config.Config(state_dir=str(tmp_path), socket=str(tmp_path / "s"),
                        rogue_process="kill")
    daemon = Daemon(cfg, inventory=inventory)
    recycled = None
    for _ in range(30):
        rogue = _sleeper(NOBODY)
        time.sleep(0.05)
        inventory.pids = [rogue.pid]
        asyncio.run(daemon.check_rogues())        # first sighting: a rogue of uid NOBODY
        pid = rogue.pid
        _reap(rogue)                              # it exits; its pid goes to another uid
        recycled = _spawn_with_pid(pid, OTHER)
        if recycled is not None:
            break
        daemon = Daemon(cfg, inventory=inventory)  # start again with a fresh first sighting
    if recycled is None:
        pytest.skip("could not get the same pid back (a busy machine)")
    try:
        time.sleep(0.05)
        asyncio.run(daemon.check_rogues())        # NVML's stale snapshot still names the pid
        time.sleep(0.2)
        assert recycled.poll() is None, "the recycled pid of another uid was killed"
        assert json_rogue(daemon) == []           # a new process: not confirmed yet
    finally:
        _reap(recycled)


def json_rogue(daemon: Daemon) -> list:
    import json
    return json.loads(daemon.status(1)[1])["gpus"][0]["rogue"]


def test_rogue_kill_still_kills_a_rogue_seen_twice(tmp_path):
    inventory = FakeInventory()
    cfg = config.Config(state_dir=str(tmp_path), socket=str(tmp_path / "s"),
                        rogue_process="kill")
    daemon = Daemon(cfg, inventory=inventory)
    rogue = _sleeper(NOBODY)
    try:
        time.sleep(0.05)
        inventory.pids = [rogue.pid]
        asyncio.run(daemon.check_rogues())
        asyncio.run(daemon.check_rogues())
        assert rogue.wait(5) == -signal.SIGKILL
    finally:
        _reap(rogue)


def test_every_kill_in_the_daemon_goes_through_the_checked_helper():
    """grep: no module of the package signals a process but procinfo.py (sitetask.py kills the
    process group of a program it started itself and still waits for); a pidfd helper of
    connection.py is only ever called with signal 0 (is it alive?)."""
    import re
    from pathlib import Path

    import nvshare_slurm
    package = Path(nvshare_slurm.__file__).parent
    signalling = re.compile(r"(os\.kill|os\.killpg|pidfd_send_signal|signal_pidfd)\(([^()]*)\)")
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path.name in ("procinfo.py", "sitetask.py"):
            continue
        for match in signalling.finditer(path.read_text()):
            call, args = match.group(1), match.group(2)
            if args.replace(" ", "").endswith(",0") or ":" in args:   # a probe; a def
                continue                                  # a probe, not a signal
            if path.name == "connection.py" and (call, args) == ("pidfd_send_signal",
                                                                  "pidfd, sig"):
                continue                                  # the definition of signal_pidfd
            offenders.append(f"{path.name}: {match.group(0)}")
    assert offenders == []
