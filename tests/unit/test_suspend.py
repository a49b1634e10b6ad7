"""Suspend (issue 28): a stopped or frozen holder holds no lock and is never taken as unresponsive;
a job Slurm suspends moves its GPU memory to host memory and asks for nothing until it resumes.

A real nvshare-scheduler and real client processes (tests/lockclient.py); SIGSTOP and a cgroup v1
freezer freeze are real; Slurm's word is a stand-in squeue in the daemon's slurm_bin_dir."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers_daemon import GPU0, gpu_status, register, wait_for, wait_for_log
from helpers_procs import JobCgroup
from nvshare_slurm.base.config import ConfigError, load
from nvshare_slurm.node import render, slurm
from nvshare_slurm.scheduler.accounting import UsageLedger, usage_line
from nvshare_slurm.scheduler.procinfo import cgroup_frozen, memory_headroom, pause_reason, read_identity, \
    signal_checked, slurm_task, task_stopped
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C

MiB = 1 << 20


def job_status(sched, job_id: int) -> dict:
    return sched.client().status(C.NVSHARE_STATUS_JOB, job_id)["jobs"][0]



# Concurrent turns of 30 s: a waiter is granted only when the holder releases.
LONG_TURNS = {"scheduling_mode": "concurrent", "switch_time_mode": "fixed", "switch_time_fixed": 30}


def squeue_watched(scheduler_factory, tmp_path: Path, **settings):
    """A started scheduler whose squeue prints the job ids written to the file `suspended`
    (Slurm's SUSPENDED jobs; empty at first), polled every 0.2 s unless `settings` say otherwise:
    (scheduler, suspended)."""
    settings = {"suspend_slurm_poll_sec": 0.2, "suspend_check_sec": 0.1, **settings}
    sched = scheduler_factory(start=False, **settings)
    suspended = tmp_path / "suspended"
    suspended.write_text("")
    script = Path(sched.workdir) / "squeue"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {suspended}.calls\ncat {suspended}\n")
    script.chmod(0o755)
    return sched.start(), suspended


# --- a stopped holder ------------------------------------------------------------------------------

def test_a_stopped_holder_gives_its_turn_at_once_is_not_killed_and_shows_suspended(
        scheduler_factory, clients):
    sched = scheduler_factory(scheduling_mode="concurrent", unresponsive_holder="kill",
                              switch_time_mode="fixed", switch_time_fixed=30)
    register(sched, 1)
    register(sched, 2)
    holder = clients(sched, 1, "--on-contended", "ignore")
    holder.send(f"request {GPU0}")
    holder.expect("grant")
    waiter = clients(sched, 2)
    waiter.send(f"request {GPU0}")
    waiter.absent("grant", 0.3)
    os.kill(holder.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        waiter.expect("grant", timeout=5)
        # Before: the lock stayed with the stopped holder for its switch interval + drop_grace_sec.
        assert time.monotonic() - stopped_at < 2.0
        job = job_status(sched, 1)
        assert job["suspended"]["reason"] == "stopped (state T)"
        assert job["clients"][0]["gpus"][GPU0]["state"] == "suspended"
        text = render.render_jobs({"jobs": [job]})
        assert "State=suspended" in text, text
        assert [h["job_id"] for h in gpu_status(sched)["holders"]] == [2]
        time.sleep(0.5)
        assert holder.proc.poll() is None            # unresponsive_holder: kill spared it
        assert "unresponsive" not in sched.log()
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    # Running again, it reads the DROP_LOCK that waited for it, releases, and may ask again.
    holder.expect("drop", reason=C.NVSHARE_DROP_SUSPEND)
    wait_for_log(sched, "runs again after")
    assert job_status(sched, 1)["suspended"] is None
    holder.send(f"request {GPU0}")
    waiter.send(f"release {GPU0}")
    holder.expect("grant")
    assert holder.proc.poll() is None


def test_a_frozen_holder_behaves_as_a_stopped_one_and_is_never_killed(scheduler_factory, clients):
    if not Path("/sys/fs/cgroup/freezer/cgroup.procs").exists():
        pytest.skip("needs the cgroup v1 freezer")
    sched = scheduler_factory(scheduling_mode="concurrent", unresponsive_holder="kill",
                              drop_grace_sec=1.0, switch_time_mode="fixed", switch_time_fixed=0.2)
    register(sched, 11)
    register(sched, 12)
    cgroup = JobCgroup(11, os.getuid())
    assert cgroup.root == Path("/sys/fs/cgroup/freezer")
    try:
        holder = clients(sched, 11)
        (cgroup.step / "cgroup.procs").write_text(str(holder.pid))
        holder.send(f"request {GPU0}")
        holder.expect("grant")
        (cgroup.step / "freezer.state").write_text("FROZEN")
        wait_for(lambda: (cgroup.step / "freezer.state").read_text().strip() == "FROZEN")
        seen = read_identity(holder.pid)
        assert seen is not None and seen.stopped
        assert "frozen" in pause_reason(holder.pid)
        assert "stopped" in signal_checked(seen)     # a frozen process is never killed either
        frozen_at = time.monotonic()
        waiter = clients(sched, 12)
        waiter.send(f"request {GPU0}")
        waiter.expect("grant", timeout=5)
        assert time.monotonic() - frozen_at < 2.0
        assert "freezer.state FROZEN" in job_status(sched, 11)["suspended"]["reason"]
        time.sleep(1.5)                              # past drop_grace_sec: still not reported
        assert "unresponsive" not in sched.log()
        (cgroup.step / "freezer.state").write_text("THAWED")
        holder.expect("drop", reason=C.NVSHARE_DROP_SUSPEND)
        wait_for_log(sched, "runs again after")
        time.sleep(0.3)
        assert holder.proc.poll() is None
    finally:
        (cgroup.step / "freezer.state").write_text("THAWED")
        cgroup.close()


# --- Slurm says SUSPENDED before slurmd freezes the job ----------------------------------------------

def test_a_job_slurm_suspends_moves_its_memory_out_and_waits_until_it_resumes(
        scheduler_factory, clients, tmp_path):
    sched, suspended = squeue_watched(scheduler_factory, tmp_path, scheduling_mode="concurrent")
    register(sched, 21)
    register(sched, 22)
    holder = clients(sched, 21, "--swap")
    holder.send(f"mem {GPU0} {600 * MiB} {MiB} 0 0")
    holder.send(f"request {GPU0}")
    holder.expect("grant")
    idle = clients(sched, 22, "--swap")
    idle.send(f"mem {GPU0} {300 * MiB} 0 0 0")
    wait_for(lambda: gpu_status(sched)["memory_used"] == 900 * MiB, what="both reported")

    suspended.write_text("21\n22\n")
    # The holder is asked to move every swappable byte out (not the fixed MiB); the client that
    # holds nothing is asked the same by PREPARE_SWAP_OUT.
    drop = holder.expect("drop", reason=C.NVSHARE_DROP_SUSPEND)
    assert drop["bytes"] == 599 * MiB
    assert idle.expect("prepare_swap_out")["bytes"] == 300 * MiB
    gpu = wait_for(lambda: (g := gpu_status(sched))["memory_swapped"] == 899 * MiB and g,
                   what="the memory out")
    assert gpu["memory_used"] == MiB and gpu["holders"] == []
    # It asks again at once (a hook whose program goes on): nothing is granted while suspended.
    holder.send(f"request {GPU0}")
    holder.absent("grant", 1.0)
    job = job_status(sched, 21)
    assert job["suspended"]["reason"] == "its job is suspended by Slurm"
    assert job["clients"][0]["gpus"][GPU0]["state"] == "suspended"
    assert "--states=SUSPENDED" in (tmp_path / "suspended.calls").read_text()

    suspended.write_text("")
    holder.expect("grant", timeout=5)
    holder.expect("swapped_in")
    wait_for(lambda: gpu_status(sched)["memory_swapped"] == 300 * MiB, what="its memory back")
    usage = job_status(sched, 21)["usage"][GPU0]
    # The time suspended is its own, not wait time: it waited for nothing meanwhile.
    assert usage["suspended_sec"] >= 1.0
    assert usage["wait_sec"] < 0.5, usage
    assert "suspended=" in usage_line({GPU0: usage})


def test_a_client_waiting_in_the_queue_when_its_job_is_suspended_is_granted_after_resume(
        scheduler_factory, clients, tmp_path):
    """Its request was withdrawn from the queue at the suspend; it must not be lost (the real-Slurm
    test saw the job hang after `scontrol resume`: its hook waited for a grant that never came).
    The holder's turn is long (30 s): with the automatic ~100 ms one, the waiter was granted by the
    end of the holder's turn before the suspend was seen, and that grant failed the test (CI)."""
    sched, suspended = squeue_watched(scheduler_factory, tmp_path, **LONG_TURNS)
    register(sched, 41)
    register(sched, 42)
    holder = clients(sched, 41)
    holder.send(f"request {GPU0}")
    holder.expect("grant")
    waiter = clients(sched, 42)
    waiter.send(f"request {GPU0}")
    wait_for(lambda: gpu_status(sched)["waiting"], what="the second job waits")

    suspended.write_text("42\n")
    wait_for(lambda: job_status(sched, 42).get("suspended"), what="job 42 suspended")
    assert gpu_status(sched)["waiting"] == []
    holder.send(f"release {GPU0}")
    waiter.absent("grant", 0.5)                    # nothing is granted to a suspended job
    suspended.write_text("")
    waiter.expect("grant", timeout=5)              # its request goes ahead once it resumes


def test_a_resumed_client_is_told_to_stop_moving_out_only_where_the_suspend_asked_it_to(
        scheduler_factory, clients, tmp_path):
    """RESUMED (issue 28, the H100's 35 s): a swap-out asked for a suspension and still under way
    when the job runs again must stop. The daemon says so on each GPU where it asked for memory,
    and tells a client it asked for nothing nothing."""
    sched, suspended = squeue_watched(scheduler_factory, tmp_path, **LONG_TURNS)
    register(sched, 51)
    register(sched, 52)
    # The holder does not answer its DROP_LOCK: its hook is still moving memory out.
    holder = clients(sched, 51, "--swap", "--on-drop", "ignore")
    holder.send(f"mem {GPU0} {600 * MiB} 0 0 0")
    holder.send(f"request {GPU0}")
    holder.expect("grant")
    empty = clients(sched, 52)                     # nothing to move
    empty.send(f"request {GPU0}")
    wait_for(lambda: gpu_status(sched)["waiting"], what="the second job waits")

    suspended.write_text("51\n52\n")
    assert holder.expect("drop", reason=C.NVSHARE_DROP_SUSPEND)["bytes"] == 600 * MiB
    wait_for(lambda: job_status(sched, 52).get("suspended"), what="job 52 suspended")
    resumed = proto.MSG_NAME[C.NVSHARE_MSG_RESUMED]
    holder.absent("other", 0.5, type=resumed)       # not while Slurm still says SUSPENDED
    suspended.write_text("")
    holder.expect("other", type=resumed)
    wait_for_log(sched, "told to stop moving memory out")
    empty.absent("other", 0.5, type=resumed)
    # Its release after the stopped swap-out passes the lock on as any release does.
    holder.send(f"release {GPU0}")
    empty.expect("grant", timeout=5)


def test_a_thawed_client_has_slurm_asked_at_once(scheduler_factory, clients, tmp_path):
    """Slurm thaws a job only to resume it: the daemon asks squeue at once rather than at the next
    suspend_slurm_poll_sec (30 s here), so a swap-out the freeze caught stops soon after."""
    sched, suspended = squeue_watched(scheduler_factory, tmp_path,
                                      scheduling_mode="concurrent", suspend_slurm_poll_sec=30)
    suspended.write_text("61\n")
    # The first poll (at the first look after a job registers) answers after 1 s: by then the
    # client holds the lock. Answered at once, it could come before the client's request, which
    # was then parked, and no drop came (2 of 25 runs on a loaded machine).
    first = tmp_path / "first-answered"
    script = Path(sched.workdir) / "squeue"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {suspended}.calls\n"
                      f"[ -e {first} ] || {{ touch {first}; sleep 1; }}\ncat {suspended}\n")
    register(sched, 61)
    holder = clients(sched, 61, "--swap", "--on-drop", "ignore")
    holder.send(f"mem {GPU0} {300 * MiB} 0 0 0")
    holder.send(f"request {GPU0}")
    holder.expect("drop", reason=C.NVSHARE_DROP_SUSPEND, timeout=5)   # the first poll's word
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: "suspended (stopped (state T))" in sched.log(), what="seen stopped")
        polls = len((tmp_path / "suspended.calls").read_text().splitlines())
        suspended.write_text("")                    # scontrol resume: RUNNING, then the thaw
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    holder.expect("other", type=proto.MSG_NAME[C.NVSHARE_MSG_RESUMED], timeout=3)
    assert len((tmp_path / "suspended.calls").read_text().splitlines()) == polls + 1
    assert job_status(sched, 61)["suspended"] is None


def test_a_job_registered_has_slurm_asked_at_once(scheduler_factory, tmp_path):
    """Preemption by suspension starts the preemptor as its victim is suspended, and the victim's
    memory can move out only before Slurm freezes it (2 s after SIGTSTP): a job's registration has
    squeue asked at the next look, not at the next suspend_slurm_poll_sec (30 s here). On a loaded
    machine the freeze otherwise often came first (tests/slurm/test_suspend_slurm.py)."""
    sched, suspended = squeue_watched(scheduler_factory, tmp_path, suspend_slurm_poll_sec=30)
    calls = tmp_path / "suspended.calls"

    def asked() -> int:
        return len(calls.read_text().splitlines()) if calls.exists() else 0
    register(sched, 61)
    wait_for(lambda: asked() == 1, what="the first poll")
    time.sleep(0.5)
    assert asked() == 1                               # no other poll before 30 s ...
    register(sched, 62)
    wait_for(lambda: asked() == 2, timeout=2, what="squeue asked for the new job")   # ... but this


# --- the batch script stopped: Slurm's SIGTSTP, 2 s before the freeze -------------------------------

FAKE_STEPD = Path(__file__).resolve().parent.parent / "fake_slurmstepd.py"


def task_pid(pidfile: Path) -> int:
    """The task fake_slurmstepd.py started (a batch script's stand-in), once it has said."""
    return int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(),
                        what="the fake slurmstepd's task"))


def test_slurm_task_is_the_ancestor_whose_parent_is_slurmstepd(tmp_path):
    pidfile = tmp_path / "task"
    stepd = subprocess.Popen([sys.executable, str(FAKE_STEPD), str(pidfile), "sleep", "30"])
    try:
        task = task_pid(pidfile)
        sleeper = int(wait_for(lambda: subprocess.run(["pgrep", "-P", str(task)], text=True,
                                                      capture_output=True).stdout.split())[0])
        seen = read_identity(task)
        assert seen is not None
        assert slurm_task(sleeper) == (task, seen.start)
        assert slurm_task(task) is None                  # the task itself: its own stop is seen
        assert slurm_task(os.getpid()) is None           # under no slurmstepd
        assert not task_stopped((task, seen.start))
        os.kill(task, signal.SIGTSTP)                    # what slurmstepd sends a suspended job
        wait_for(lambda: task_stopped((task, seen.start)), what="the task stopped")
        assert pause_reason(sleeper) == ""               # its child runs on, as under Slurm
        assert not task_stopped((task, seen.start + 1))  # another process of that pid: not it
        os.kill(task, signal.SIGCONT)
        wait_for(lambda: not task_stopped((task, seen.start)), what="the task running again")
    finally:
        if pidfile.exists():
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)   # the task leads its group
        stepd.wait()


def stepd_client(sched, clients, job_id: int, tmp_path: Path):
    """A --swap client of the job under a fake slurmstepd's task, holding the GPU with 600 MiB:
    (client, the task's pid)."""
    pidfile = tmp_path / f"task-{job_id}"
    client = clients(sched, job_id, "--swap", wrap=(sys.executable, str(FAKE_STEPD), str(pidfile)))
    client.send(f"mem {GPU0} {600 * MiB} {MiB} 0 0")
    client.send(f"request {GPU0}")
    client.expect("grant")
    return client, task_pid(pidfile)


def test_a_job_whose_batch_script_slurm_stops_moves_its_memory_out_before_squeue_answers(
        scheduler_factory, clients, tmp_path):
    """Under proctrack/cgroup Slurm's suspend sends SIGTSTP to the batch script only; the CUDA
    process runs until the freeze 2 s later (22.05; suspend_grace_time from 23.11), and must move
    its memory out meanwhile. Here squeue takes 1.5 s to answer (a loaded node, as in a CI run of
    tests/slurm/test_suspend_slurm.py where the freeze came first): the stopped script is the word,
    and the memory is out well before any squeue asked after the stop could answer."""
    sched, suspended = squeue_watched(scheduler_factory, tmp_path, scheduling_mode="concurrent",
                                      suspend_slurm_poll_sec=0.5)
    script = Path(sched.workdir) / "squeue"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {suspended}.calls\nsleep 1.5\ncat {suspended}\n")
    register(sched, 71)
    holder, task = stepd_client(sched, clients, 71, tmp_path)
    try:
        stopped_at = time.monotonic()
        os.kill(task, signal.SIGTSTP)
        suspended.write_text("71\n")                    # slurmctld marked it SUSPENDED first
        drop = holder.expect("drop", reason=C.NVSHARE_DROP_SUSPEND, timeout=5)
        assert drop["bytes"] == 599 * MiB
        gpu = wait_for(lambda: (g := gpu_status(sched))["memory_swapped"] == 599 * MiB and g,
                       what="the memory out")
        assert time.monotonic() - stopped_at < 1.2, "not before squeue could have answered"
        assert gpu["holders"] == []
        job = job_status(sched, 71)
        assert job["suspended"]["reason"] == "its Slurm task is stopped: Slurm's SIGTSTP before a suspend"
        assert f"its Slurm task (pid {task}) is stopped" in sched.log()
        # Slurm's answers, asked after the stop, say SUSPENDED: it stays suspended, asks in vain.
        time.sleep(3.5)
        holder.send(f"request {GPU0}")
        holder.absent("grant", 0.5)
        assert job_status(sched, 71)["suspended"] is not None
        suspended.write_text("")                         # scontrol resume: RUNNING, then SIGCONT
    finally:
        os.kill(task, signal.SIGCONT)
    holder.expect("grant", timeout=8)
    holder.expect("swapped_in")
    wait_for(lambda: job_status(sched, 71)["suspended"] is None, what="resumed")
    assert sched.log().count("suspended (its Slurm task is stopped") == 1


def test_a_batch_script_its_user_stops_is_not_taken_for_a_suspend_once_slurm_answers(
        scheduler_factory, clients, tmp_path):
    """A script stopped by its user (kill -TSTP), not by Slurm: the daemon takes it for Slurm's
    suspend at first, asks Slurm at once, and Slurm's answer (not SUSPENDED) ends it: the client
    runs on beside its stopped script, with its turns, and is not taken as suspended again while
    the script stays stopped."""
    sched, suspended = squeue_watched(scheduler_factory, tmp_path, scheduling_mode="concurrent",
                                      suspend_slurm_poll_sec=30)
    register(sched, 72)
    holder, task = stepd_client(sched, clients, 72, tmp_path)
    calls = tmp_path / "suspended.calls"
    wait_for(lambda: calls.exists(), what="the first poll")   # a job registered: asked at once
    try:
        os.kill(task, signal.SIGTSTP)
        holder.expect("drop", reason=C.NVSHARE_DROP_SUSPEND, timeout=5)
        wait_for_log(sched, "runs again after")
        assert len(calls.read_text().splitlines()) == 2   # asked at the stop, not 30 s later
        holder.send(f"request {GPU0}")
        holder.expect("grant", timeout=5)
        time.sleep(1.0)                                   # the script still stopped
        assert job_status(sched, 72)["suspended"] is None
        assert sched.log().count("suspended (its Slurm task is stopped") == 1
        assert [h["job_id"] for h in gpu_status(sched)["holders"]] == [72]
    finally:
        os.kill(task, signal.SIGCONT)


def test_at_slurms_resume_a_script_not_yet_continued_keeps_nothing_suspended(
        scheduler_factory, clients, tmp_path):
    """Slurm's word came first (squeue said SUSPENDED before the script was seen stopped), and at
    the resume squeue says RUNNING a moment before slurmd's SIGCONT reaches the script: the client
    runs again at that answer, and the stopped script is never taken for a suspend of its own."""
    sched, suspended = squeue_watched(scheduler_factory, tmp_path, scheduling_mode="concurrent")
    register(sched, 74)
    holder, task = stepd_client(sched, clients, 74, tmp_path)
    suspended.write_text("74\n")
    holder.expect("drop", reason=C.NVSHARE_DROP_SUSPEND, timeout=5)
    try:
        os.kill(task, signal.SIGTSTP)
        wait_for(lambda: task_stopped((task, read_identity(task).start)), what="the script stopped")
        time.sleep(0.5)
        suspended.write_text("")                 # RUNNING; the SIGCONT has not come yet
        wait_for_log(sched, "runs again after")
        holder.send(f"request {GPU0}")
        holder.expect("grant", timeout=5)
        assert job_status(sched, 74)["suspended"] is None
    finally:
        os.kill(task, signal.SIGCONT)
    log = sched.log()
    assert "suspended (its job is suspended by Slurm)" in log
    assert "taken as Slurm's suspend" not in log, log


def test_without_squeue_a_stopped_batch_script_suspends_its_job_until_it_runs_again(
        scheduler_factory, clients, tmp_path):
    """suspend_slurm_poll_sec 0 (a site that asks Slurm nothing): the stopped script is the only
    word. The memory moves out, and the job runs again when the script does (Slurm's resume
    sends it SIGCONT), with nobody asked."""
    sched = scheduler_factory(scheduling_mode="concurrent", suspend_slurm_poll_sec=0,
                              suspend_check_sec=0.1)
    register(sched, 73)
    holder, task = stepd_client(sched, clients, 73, tmp_path)
    try:
        os.kill(task, signal.SIGTSTP)
        assert holder.expect("drop", reason=C.NVSHARE_DROP_SUSPEND, timeout=5)["bytes"] == 599 * MiB
        wait_for(lambda: gpu_status(sched)["memory_swapped"] == 599 * MiB, what="the memory out")
        holder.send(f"request {GPU0}")
        holder.absent("grant", 1.0)
    finally:
        os.kill(task, signal.SIGCONT)
    holder.expect("grant", timeout=5)
    holder.expect("swapped_in")
    assert job_status(sched, 73)["suspended"] is None
    log = sched.log()
    assert "taken as Slurm's suspend (suspend_slurm_poll_sec 0)" in log, log
    assert "Slurm is asked" not in log and "cannot ask Slurm" not in log


def test_memory_that_the_jobs_memory_limit_cannot_hold_stays_on_the_gpu(scheduler_factory, clients,
                                                                         tmp_path):
    memory = Path("/sys/fs/cgroup/memory")
    if not (memory / "cgroup.procs").exists() or not os.access(memory, os.W_OK):
        pytest.skip("needs a writable cgroup v1 memory hierarchy")
    sched, suspended = squeue_watched(scheduler_factory, tmp_path)
    register(sched, 31)
    group = memory / f"nvt_suspend_{os.getpid()}"
    group.mkdir()
    try:
        holder = clients(sched, 31, "--swap")
        (group / "cgroup.procs").write_text(str(holder.pid))
        used = int((group / "memory.usage_in_bytes").read_text())
        (group / "memory.limit_in_bytes").write_text(str(used + 64 * MiB))
        assert memory_headroom(holder.pid) is not None
        holder.send(f"mem {GPU0} {600 * MiB} 0 0 0")
        holder.send(f"request {GPU0}")
        holder.expect("grant")
        suspended.write_text("31\n")
        # The lock goes, the memory stays, and the log says why.
        assert holder.expect("drop", reason=C.NVSHARE_DROP_SUSPEND)["bytes"] == 0
        wait_for_log(sched, "stays on the GPU while suspended: the job's memory limit has")
        assert gpu_status(sched)["memory_swapped"] == 0
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            (memory / "cgroup.procs").write_text(pid)
        group.rmdir()


# --- the pieces ----------------------------------------------------------------------------------

def test_cgroup_frozen_reads_v1_freezer_and_v2_events(tmp_path):
    v1 = tmp_path / "freezer" / "slurm" / "uid_1" / "job_5" / "step_0"
    v1.mkdir(parents=True)
    text_v1 = "6:freezer:/slurm/uid_1/job_5/step_0\n4:memory:/x\n"
    for state, expected in (("THAWED", ""), ("FREEZING", "freezing"), ("FROZEN", "frozen")):
        (v1 / "freezer.state").write_text(state + "\n")
        assert expected in cgroup_frozen(text_v1, str(tmp_path))
        assert bool(cgroup_frozen(text_v1, str(tmp_path))) == bool(expected)
    v2 = tmp_path / "system.slice" / "slurmstepd.scope" / "job_5" / "step_0"
    v2.mkdir(parents=True)
    text_v2 = "0::/system.slice/slurmstepd.scope/job_5/step_0\n"
    (v2 / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    (v2 / "cgroup.freeze").write_text("0\n")
    assert cgroup_frozen(text_v2, str(tmp_path)) == ""
    (v2 / "cgroup.freeze").write_text("1\n")
    assert "freezing" in cgroup_frozen(text_v2, str(tmp_path))
    (v2 / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    assert "frozen 1" in cgroup_frozen(text_v2, str(tmp_path))
    assert cgroup_frozen("6:freezer:/../../etc\n", str(tmp_path)) == ""


def test_pause_reason_sees_a_stopped_process():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.1)
        assert pause_reason(proc.pid) == ""
        os.kill(proc.pid, signal.SIGSTOP)
        assert wait_for(lambda: pause_reason(proc.pid)) == "stopped (state T)"
        os.kill(proc.pid, signal.SIGCONT)
        wait_for(lambda: pause_reason(proc.pid) == "")
    finally:
        proc.kill()
        proc.wait()
    assert pause_reason(proc.pid) == ""             # gone: nothing to say


def test_suspended_jobs_asks_squeue_for_this_node(tmp_path):
    script = tmp_path / "squeue"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\nprintf '12\\n 7\\nbad\\n'\n")
    script.chmod(0o755)
    assert slurm.suspended_jobs("node-1", str(tmp_path)) == {12, 7}
    assert (tmp_path / "args").read_text().split() == [
        "--noheader", "--states=SUSPENDED", "--nodelist=node-1", "--format=%A"]
    script.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact' >&2\nexit 1\n")
    with pytest.raises(slurm.SlurmError, match="Unable to contact"):
        slurm.suspended_jobs("node-1", str(tmp_path))


def test_the_ledger_counts_suspended_time_apart():
    ledger = UsageLedger()
    ledger.jobs[5] = {GPU0: ledger._job(5, GPU0)}
    ledger.suspend(5, 10.0)
    ledger.suspend(5, 11.0)                          # a second client of the job: no restart
    assert ledger.job_usage(5, 12.5)[GPU0]["suspended_sec"] == 2.5
    ledger.resume(5, 13.0)
    assert ledger.job_usage(5, 20.0)[GPU0]["suspended_sec"] == 3.0
    assert "suspended=3.0s" in usage_line(ledger.job_usage(5, 20.0))
    assert "suspended" not in usage_line({GPU0: {**ledger.job_usage(5, 20.0)[GPU0],
                                                 "suspended_sec": 0}})


def test_suspend_settings_are_checked(tmp_path, monkeypatch):
    path = tmp_path / "nvshare.yaml"
    path.write_text("suspend_slurm_poll_sec: 0.05\n")
    with pytest.raises(ConfigError, match="suspend_slurm_poll_sec"):
        load(str(path), environ={})
    path.write_text("suspend_slurm_poll_sec: 0\nsuspend_check_sec: 0.5\n")
    cfg = load(str(path), environ={})
    assert (cfg.suspend_slurm_poll_sec, cfg.suspend_check_sec) == (0, 0.5)


def test_a_stopped_client_is_asked_to_move_no_memory_until_it_runs_again():
    """A frozen job cannot answer PREPARE_SWAP_OUT. On the H100 a frozen 63 GiB job was asked
    twice, and the allocation of the job that preempted it waited 30 s each time for room that
    could not come. Now its ask stops counting as memory on the way out and nothing more is asked
    of it; the head, whose memory needs that room, waits for it (before issue 39 it was granted at
    once, and its hook gave the grant back NO_ROOM every 250 ms); once it runs it may be asked."""
    from test_policy import G, client, gpu, moves

    from nvshare_slurm.policy.gpupause import resume_client, suspend_client
    from nvshare_slurm.policy.policytypes import PREFETCH, SWAP_OUT
    g = gpu()                                                     # 16G
    head, stopped = client(1), client(2)
    g.mem_update(stopped, 0, 12 * G, 2 * G, 0)                   # 10G of it can move
    g.mem_update(head, 0, 0, 0, 10 * G)
    assert moves(g.request(head, 1)) == [(PREFETCH, 1, 4 * G), (SWAP_OUT, 2, 6 * G)]  # asked while it runs
    assert moves(suspend_client(g, 2, 2, stopped=True, move=0,
                                why="its cgroup is frozen (nvshare never thaws it)")) == []
    assert g.memory.swap_asked == {}
    assert moves(g.tick(30)) == []                   # long past drop_grace_sec: nothing asked
    assert moves(resume_client(g, 2, 31)) == [(SWAP_OUT, 2, 6 * G)]  # running: asked


# --- a stopped holder holds nothing hostage (issue 39) -------------------------------------------

def stopped_holder_and_waiter():
    """16G GPU: client 1 held it with 12G resident and was stopped by SIGSTOP (may be let run);
    client 2's 10G are in host memory, so its grant lacks 6G that only client 1 can make."""
    from test_policy import G, client, gpu

    from nvshare_slurm.policy.gpupause import suspend_client
    g = gpu()
    stopped, waiter = client(1), client(2)
    g.request(stopped, 0)
    g.mem_update(stopped, 0, 12 * G, 0, 0)
    suspend_client(g, 1, 1, stopped=True, move=0, may_run=True)
    g.mem_update(waiter, 2, 0, 0, 10 * G)
    return g, stopped, waiter


def test_a_waiter_that_needs_a_stopped_holders_memory_is_not_granted_in_a_loop():
    """Before: granted at once "nothing more can move", given back NO_ROOM by its hook, asked
    again every 250 ms (161 times in 40 s on a 1 GiB GPU). Now it waits, the stopped client is
    wanted for the 6G, and status says why."""
    from test_policy import G, moves

    from nvshare_slurm.policy.policytypes import GRANT
    g, _, _ = stopped_holder_and_waiter()
    assert GRANT not in [kind for kind, _, _ in moves(g.request(g.clients[2], 3))]
    assert g.stopped.wanted == {1: 6 * G}
    for t in (3.25, 3.5, 10.0):                           # the hook asks again: still nothing
        assert GRANT not in [kind for kind, _, _ in moves(g.tick(t))]
    wait = g.status(10.0, [], [])["waits_for_room"]
    assert wait["job_id"] == 2 and wait["reason"] == (
        "waits for room: job 1's 12.0 GiB is on the GPU and its process is stopped; moving it out")
    text = render.render_gpus({"gpus": [g.status(10.0, [], [])]})
    assert "WaitsForRoom=2.0(pid=1002): waits for room: job 1's 12.0 GiB" in text, text


def test_a_stopped_holder_is_let_run_asked_once_released_and_stopped_again_after_its_answer():
    from test_policy import G, moves

    from nvshare_slurm.policy.gpupause import let_run, stopped_again
    from nvshare_slurm.policy.policytypes import GRANT, SWAP_OUT
    g, stopped, waiter = stopped_holder_and_waiter()
    g.request(waiter, 3)
    # SIGCONT: its hook still holds (the DROP_LOCK(SUSPEND) waits for it), so nothing is asked
    # yet: a PREPARE_SWAP_OUT read while it releases would be lost in that release.
    assert SWAP_OUT not in [kind for kind, _, _ in moves(let_run(g, 1, 4))]
    assert g.stopped.wanted == {}                        # let run once for this shortfall
    assert "moving it out" in g.status(4, [], [])["waits_for_room"]["reason"]
    # Its late LOCK_RELEASED: now the pass asks it for what the waiter lacks.
    assert (SWAP_OUT, 1, 6 * G) in moves(g.release(1, 4.1))
    assert g.stopped.done == set()
    actions, _ = g.mem_update(stopped, 4.5, 9 * G, 0, 3 * G, flags=C.NVSHARE_MEM_MOVING)
    assert GRANT not in [kind for kind, _, _ in moves(actions)]
    actions, _ = g.mem_update(stopped, 5.0, 6 * G, 0, 6 * G)        # the answer
    assert moves(actions)[-1] == (GRANT, 2, 0)           # with all its memory's room
    assert g.stopped.done == {1}                         # the watch stops it again ...
    assert stopped_again(g, 1, 5.1) == []
    assert 1 in g.memory.frozen and g.stopped.done == set()   # ... and nothing is asked of it
    assert g.status(5.1, [], [])["waits_for_room"] is None


def test_a_stopped_client_that_cannot_be_let_run_keeps_the_waiter_waiting_until_it_runs():
    """A debugger's stop, a frozen cgroup, a --mem limit: its memory stays, and the waiter is not
    granted to give it back NO_ROOM; once the client runs it is asked like any other."""
    from test_policy import G, client, gpu, moves

    from nvshare_slurm.policy.gpupause import cannot_run, resume_client, suspend_client
    from nvshare_slurm.policy.policytypes import GRANT, SWAP_OUT
    g = gpu()
    frozen, waiter = client(1), client(2)
    g.mem_update(frozen, 0, 12 * G, 0, 0)
    suspend_client(g, 1, 1, stopped=True, move=0, why="its cgroup is frozen (nvshare never thaws it)")
    g.mem_update(waiter, 2, 0, 0, 10 * G)
    assert GRANT not in [kind for kind, _, _ in moves(g.request(waiter, 3))]
    assert g.stopped.wanted == {}                        # not one that may be let run
    assert g.status(3, [], [])["waits_for_room"]["reason"].endswith(
        "its cgroup is frozen (nvshare never thaws it); it stays there until it runs again")
    # One that may run but is refused (moveout.py says why): the same, once per shortfall.
    g2, _, waiter2 = stopped_holder_and_waiter()
    g2.request(waiter2, 3)
    assert GRANT not in [kind for kind, _, _ in moves(cannot_run(g2, 1, 3.5))]
    assert g2.stopped.wanted == {} and GRANT not in [k for k, _, _ in moves(g2.tick(4))]
    assert moves(resume_client(g, 1, 5)) == [(SWAP_OUT, 1, 6 * G)]  # running: asked


def test_what_stopped_memory_cannot_make_is_granted_anyway_as_before():
    """A shortfall beyond all the stopped clients' memory (others' fixed memory) cannot be made
    by letting them run: the grant goes out with what did not fit, as it did."""
    from test_policy import G, client, gpu, moves

    from nvshare_slurm.policy.gpupause import suspend_client
    from nvshare_slurm.policy.policytypes import GRANT
    g = gpu()
    stopped, fixed, waiter = client(1), client(3), client(2)
    g.mem_update(stopped, 0, 2 * G, 0, 0)
    g.mem_update(fixed, 0, 12 * G, 12 * G, 0)
    suspend_client(g, 1, 1, stopped=True, move=0, may_run=True)
    g.mem_update(waiter, 2, 0, 0, 10 * G)
    assert moves(g.request(waiter, 3)) == [(GRANT, 2, 8 * G)]
    assert g.stopped.wanted == {}


class MoveOutCore:
    """What MoveOuts asks of the daemon core: its clients, GPUs, clock and after_event (whose
    Actions are kept), with one GPU whose stopped holder (a real stopped process) is wanted."""

    def __init__(self, proc: subprocess.Popen, job_id: int = 1):
        from test_policy import G, client, gpu

        from nvshare_slurm.policy.gpupause import suspend_client
        from nvshare_slurm.scheduler.registry import RegisteredClient
        self.logger = __import__("logging").getLogger("test_suspend")
        self.clock = 10.0
        self.sent: list = []
        pidfd = os.pidfd_open(proc.pid)
        __import__("weakref").finalize(self, os.close, pidfd)
        conn = type("Conn", (), {"pidfd": pidfd, "pid": proc.pid, "uid": os.getuid()})()
        self.stopped = RegisteredClient(1, job_id, 0, proc.pid, uid=os.getuid(), connection=conn)
        self.registry = type("Registry", (), {"clients": {1: self.stopped}})()
        g = self.gpu = gpu()
        self.gpus = {g.uuid: g}
        g.request(self.stopped, 0)
        g.mem_update(self.stopped, 0, 12 * G, 0, 0)
        suspend_client(g, 1, 1, stopped=True, move=0, may_run=True)
        waiter = client(2)
        g.mem_update(waiter, 2, 0, 0, 10 * G)
        g.request(waiter, 3)
        assert g.stopped.wanted == {1: 6 * G}

    def now(self) -> float:
        return self.clock

    def after_event(self, gpu, actions) -> None:
        self.sent.extend(actions)

    def answer(self) -> None:
        """Its hook's late release, then its report after moving 6G out: the waiter is granted."""
        from test_policy import G

        from nvshare_slurm.policy.policytypes import GRANT
        g = self.gpu
        self.sent.extend(g.release(1, self.clock))
        actions, _ = g.mem_update(self.stopped, self.clock + 0.5, 6 * G, 0, 6 * G)
        assert GRANT in [a.kind for a in actions]
        assert g.stopped.done == {1}


def state(pid: int) -> str:
    identity = read_identity(pid)
    return identity.state if identity is not None else "gone"


@pytest.fixture
def stopped_sleep():
    """A `sleep` stopped by SIGSTOP, in a session of its own (no stopped relatives)."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    os.kill(proc.pid, signal.SIGSTOP)
    wait_for(lambda: state(proc.pid) == "T")
    yield proc
    proc.kill()
    proc.wait()


def test_a_stopped_process_is_let_run_for_its_move_out_and_stopped_again(stopped_sleep, caplog):
    from nvshare_slurm.policy.policytypes import SWAP_OUT
    from nvshare_slurm.scheduler.moveout import MoveOuts
    core = MoveOutCore(stopped_sleep)
    moves = MoveOuts(core)
    caplog.set_level("INFO")
    moves.follow(core.gpu, set())
    wait_for(lambda: state(stopped_sleep.pid) in ("S", "R"), what="SIGCONT through its pidfd")
    assert 1 in moves.active and core.gpu.stopped.running == {1}
    assert SWAP_OUT not in [a.kind for a in core.sent]    # its hook holds until it releases
    core.clock = 11.0
    core.answer()
    moves.follow(core.gpu, set())
    wait_for(lambda: state(stopped_sleep.pid) == "T", what="stopped again by SIGSTOP")
    assert 1 in core.gpu.memory.frozen
    moves.tick(set())
    assert moves.active == {}
    assert "is let run (SIGCONT) to move it to host memory" in caplog.text
    assert "stopped again (SIGSTOP) after 1.0s moving 6.0 GiB to host memory" in caplog.text
    # Once per shortfall: the waiter still waiting would not have it let run again.
    assert 1 in core.gpu.stopped.tried or core.gpu.stopped.wanted == {}


def test_a_process_slurm_resumes_during_its_move_out_is_not_stopped_again(stopped_sleep, caplog):
    from nvshare_slurm.scheduler.moveout import MoveOuts
    core = MoveOutCore(stopped_sleep, job_id=7)
    moves = MoveOuts(core)
    caplog.set_level("INFO")
    moves.follow(core.gpu, {7})                       # Slurm says job 7 is SUSPENDED
    wait_for(lambda: state(stopped_sleep.pid) in ("S", "R"))
    core.answer()                                     # ... and then RUNNING (scontrol resume)
    moves.follow(core.gpu, set())
    time.sleep(0.3)
    assert state(stopped_sleep.pid) in ("S", "R")
    assert moves.active == {} and "Slurm resumed its job while it moved its memory out" in caplog.text


def test_a_process_stopped_again_just_as_slurm_resumed_it_is_continued_at_slurms_next_word(
        stopped_sleep, caplog):
    """Slurm marks the job RUNNING before slurmd's SIGCONT: when squeue showed SUSPENDED at the
    answer and the SIGCONT came before nvshare's SIGSTOP, the next squeue answer undoes it."""
    from nvshare_slurm.scheduler.moveout import MoveOuts
    core = MoveOutCore(stopped_sleep, job_id=7)
    moves = MoveOuts(core)
    caplog.set_level("INFO")
    moves.follow(core.gpu, {7})
    wait_for(lambda: state(stopped_sleep.pid) in ("S", "R"))
    core.answer()
    moves.follow(core.gpu, {7})                       # squeue's last word still SUSPENDED
    wait_for(lambda: state(stopped_sleep.pid) == "T")
    moves.slurm_answer(core.clock - 1, set())         # asked before the stop: changes nothing
    time.sleep(0.2)
    assert state(stopped_sleep.pid) == "T"
    moves.slurm_answer(core.clock + 1, set())         # asked after it: RUNNING
    wait_for(lambda: state(stopped_sleep.pid) in ("S", "R"), what="continued again")
    assert "Slurm resumed its job about when nvshare stopped it again" in caplog.text


def test_a_process_group_resumed_during_the_move_out_is_not_stopped_again(caplog):
    """kill -STOP -PGID (or Ctrl-Z, or Slurm under linuxproc with the batch shell) stops its
    relatives too; one of them running again says the group was resumed (fg, kill -CONT -PGID)."""
    from nvshare_slurm.scheduler.moveout import MoveOuts
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        assert shell.stdout is not None
        child = int(shell.stdout.readline())
        os.killpg(shell.pid, signal.SIGSTOP)
        wait_for(lambda: state(child) == "T" and state(shell.pid) == "T")
        proc = type("Proc", (), {"pid": child})()
        core = MoveOutCore(proc)                      # type: ignore[arg-type]
        moves = MoveOuts(core)
        caplog.set_level("INFO")
        moves.follow(core.gpu, set())
        assert [w.pid for w in moves.active[1].witnesses] == [shell.pid]
        wait_for(lambda: state(child) in ("S", "R"))
        assert state(shell.pid) == "T"                # only the process whose memory is needed
        os.killpg(shell.pid, signal.SIGCONT)          # the user's fg
        core.answer()
        moves.follow(core.gpu, set())
        time.sleep(0.3)
        assert state(child) in ("S", "R")
        assert f"process {shell.pid}, stopped beside it, runs again (resumed)" in caplog.text
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.communicate()


def test_a_daemon_that_stops_during_a_move_out_stops_the_process_again(stopped_sleep, caplog):
    """Nobody would stop it later: a suspended job must not run on for the daemon's restart. The
    watch's own pidfd copy outlives the connection, which the daemon closes first."""
    from nvshare_slurm.scheduler.moveout import MoveOuts
    core = MoveOutCore(stopped_sleep)
    moves = MoveOuts(core)
    moves.follow(core.gpu, set())
    wait_for(lambda: state(stopped_sleep.pid) in ("S", "R"))
    core.stopped.connection.pidfd = None              # the connection is gone
    moves.shutdown()
    wait_for(lambda: state(stopped_sleep.pid) == "T", what="stopped again at the daemon's stop")
    assert moves.active == {} and "the daemon stops during its move-out" in caplog.text


def test_a_holders_allocation_waits_for_a_stopped_clients_move_out_not_answered_without_room():
    """A running holder asks for memory that only a stopped client's can make: before, it was
    answered at once without room (nothing could move) and the driver said out-of-memory. Now it
    waits, the stopped client is wanted for the bytes, and once its move-out is answered the
    allocation gets its room."""
    from test_policy import G, client, gpu, moves

    from nvshare_slurm.policy.gpupause import let_run, suspend_client
    from nvshare_slurm.policy.policytypes import GRANT, MEM_REPLY, SWAP_OUT
    g = gpu()                                                     # 16G
    stopped, holder = client(1), client(2)
    g.mem_update(stopped, 0, 12 * G, 0, 0)
    suspend_client(g, 1, 1, stopped=True, move=0, may_run=True)
    g.mem_update(holder, 1.5, 4 * G, 0, 0)
    assert (GRANT, 2, 0) in moves(g.request(holder, 2))
    _, decision = g.mem_update(holder, 3, 4 * G, 0, 0, 6 * G)
    assert decision is None                                      # held, not answered without room
    assert g.stopped.wanted == {1: 6 * G}
    assert (SWAP_OUT, 1, 6 * G) in moves(let_run(g, 1, 3.2))     # running: asked for the bytes
    actions, _ = g.mem_update(stopped, 4, 6 * G, 0, 6 * G)       # its answer
    replies = [a for a in actions if a.kind == MEM_REPLY]
    assert len(replies) == 1 and replies[0].reply.status == C.NVSHARE_OK
    assert not replies[0].reply.no_room
