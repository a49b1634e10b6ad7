"""A task of a managed job that runs without the hook is reported (issue 24): the daemon logs it
once, nvshare-status shows the job's unhooked processes, and the process's own stderr (the job's
output) gets one line, written as the job's user, never as root. With rogue_process: kill it is
then killed, checked. The stand-in driver is tests/c's fake libcuda.so.1, mapped with ctypes."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, become
from helpers_daemon import NOBODY, wait_for_log
from helpers_procs import JobCgroup
from nvshare_slurm.wire.proto import C

FAKE_DRIVER = REPO / "tests" / "c" / "build" / "libcuda.so.1"
# Maps the driver (and, given a second path, the hook too), says so, then sleeps.
PROGRAM = ("import ctypes, sys, time\n"
           "for path in sys.argv[1:]: ctypes.CDLL(path)\n"
           "print('mapped', flush=True)\n"
           "time.sleep(60)\n")


@pytest.fixture
def outdir():
    """Where the job's user can write its output (pytest's tmp_path is root's alone)."""
    import shutil
    import tempfile
    path = tempfile.mkdtemp(prefix="nvs-hook-", dir="/tmp")
    os.chmod(path, 0o777)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def fake_driver():
    subprocess.run(["make", "-s", "-C", str(REPO / "tests" / "c")], check=True,
                   capture_output=True)
    return FAKE_DRIVER


def _task(cgroup: JobCgroup, stderr_path, libraries, root_stderr: bool = False):
    """A task of the job as NOBODY in its cgroup, its stderr a file (made by its user, or opened
    by root before it drops privileges: a file only root may open)."""
    enter = cgroup.enter(None)

    def preexec() -> None:
        enter()
        if root_stderr:
            fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(fd, 2)
            os.close(fd)
        become(NOBODY)
        if not root_stderr:
            fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(fd, 2)
            os.close(fd)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM, *map(str, libraries)],
                            stdout=subprocess.PIPE, text=True, preexec_fn=preexec, env=env,
                            cwd="/")
    assert proc.stdout.readline().strip() == "mapped"
    return proc


def _job(sched, job_id):
    return sched.client().status(C.NVSHARE_STATUS_JOB, job_id)["jobs"][0]


def _wait(predicate, what, timeout=8.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.1)


def test_a_task_without_the_hook_is_reported_once_in_log_status_and_its_output(
        scheduler_factory, fake_driver, outdir, hook_lib):
    sched = scheduler_factory(rogue_check_sec=0.5)
    sched.client().register_job(31, uid=NOBODY, gid=NOBODY, gpu_index=[0])
    cgroup = JobCgroup(31, NOBODY)
    out, hooked_out = outdir / "job.err", outdir / "hooked.err"
    bare = hooked = None
    try:
        bare = _task(cgroup, out, [fake_driver])
        hooked = _task(cgroup, hooked_out, [hook_lib, fake_driver])
        _wait(lambda: _job(sched, 31)["unhooked"], "status lists the unhooked task")
        assert [p["pid"] for p in _job(sched, 31)["unhooked"]] == [bare.pid]   # not the hooked
        wait_for_log(sched, f"job 31: pid {bare.pid} (uid {NOBODY}) runs with the CUDA driver "
                            f"but without libnvshare.so")
        _wait(lambda: out.exists() and "nvshare: job 31" in out.read_text(), "job output")
        assert out.stat().st_uid == NOBODY
        assert "it runs unshared (rogue_process: warn)" in out.read_text()
        assert "the job's output says so" in sched.log()
        time.sleep(1.5)                                    # three more scans: logged once
        assert sched.log().count(f"pid {bare.pid} (uid {NOBODY}) runs with") == 1
        assert out.read_text().count("nvshare: job 31") == 1
        assert bare.poll() is None                         # warn: it runs on
        assert not hooked_out.exists() or "nvshare" not in hooked_out.read_text()
    finally:
        for proc in (bare, hooked):
            if proc is not None:
                proc.kill()
                proc.wait()
        cgroup.close()


def test_the_notice_is_written_as_the_user_never_as_root(scheduler_factory, fake_driver,
                                                         outdir):
    sched = scheduler_factory(rogue_check_sec=0.5)
    sched.client().register_job(32, uid=NOBODY, gid=NOBODY, gpu_index=[0])
    cgroup = JobCgroup(32, NOBODY)
    out = outdir / "root-only.err"
    task = None
    try:
        task = _task(cgroup, out, [fake_driver], root_stderr=True)
        wait_for_log(sched, f"job 32: pid {task.pid}")
        wait_for_log(sched, "not told in the job's output")
        assert out.stat().st_uid == 0 and "nvshare" not in out.read_text()
    finally:
        if task is not None:
            task.kill()
            task.wait()
        cgroup.close()


def test_kill_policy_tells_then_kills_the_task_without_the_hook(scheduler_factory, fake_driver,
                                                                outdir):
    sched = scheduler_factory(rogue_check_sec=0.5, rogue_process="kill")
    sched.client().register_job(33, uid=NOBODY, gid=NOBODY, gpu_index=[0])
    cgroup = JobCgroup(33, NOBODY)
    out = outdir / "job.err"
    task = None
    try:
        task = _task(cgroup, out, [fake_driver])
        assert task.wait(10) == -9
        assert "this process is killed (rogue_process: kill)" in out.read_text()
        wait_for_log(sched, f"job 33: pid {task.pid} without the hook: killed")
    finally:
        if task is not None and task.poll() is None:
            task.kill()
            task.wait()
        cgroup.close()
