"""Two unprivileged users share one GPU through real Slurm, as on a cluster.

Each user submits with sbatch as themself (runuser: munge authenticates them, slurmd runs the job,
the TaskProlog and the hook under their uid). Both jobs land on n2's GPU 0 (typed GRES gpu0). The
checks are what the users and their admin would see: both jobs registered with their own uid and
name, every client of a job a process of that job's user, a process in one user's job that names the
other user's job refused by the scheduler (and told so), both users' GPU work on GPU 0, and
nvshare-status, run by either user, showing both.
"""
from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .cluster import BIN, entry_point, registered_jobs, wait_until

USERS = ("nvs-alice", "nvs-bob")
REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tests" / "c" / "build"
NVTEST = BUILD / "nvtest"
GPU0 = "GPU-fa4e0000-0000-0000-0000-000000000000"


@pytest.fixture(scope="module")
def users(cluster):
    """The two users (created with useradd when missing, removed again afterwards)."""
    if shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip("needs useradd and runuser (util-linux, passwd)")
    created = []
    for name in USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                            "--shell", "/bin/sh", name], check=True, capture_output=True)
            created.append(name)
    subprocess.run(["make", "-s", "-C", str(REPO / "tests" / "c")], check=True, capture_output=True)
    # The jobs run this checkout's code (an editable install, or PYTHONPATH) as these users.
    probe = subprocess.run(
        ["runuser", "-u", USERS[0], "--", sys.executable, "-c",
         f"import nvshare_slurm.taskprolog, os, sys; sys.exit(not os.access({str(NVTEST)!r}, os.X_OK))"],
        env=cluster.env, capture_output=True, text=True, timeout=60)
    try:
        if probe.returncode != 0:
            pytest.skip(f"{USERS[0]} cannot run this checkout ({REPO}) or {NVTEST}: jobs of other users "
                        f"need it readable by all ({probe.stderr.strip()[-300:]})")
        yield {name: pwd.getpwnam(name) for name in USERS}
    finally:
        for name in USERS:
            cluster.run([BIN / "scancel", "-u", name], timeout=10)
        for name in created:
            subprocess.run(["userdel", name], capture_output=True)


def sbatch_as(cluster, user: str, jobdir: Path, script: str, *args: str) -> int:
    path = jobdir / f"{user}.sh"
    path.write_text(script)
    path.chmod(0o755)
    result = cluster.run(["runuser", "-u", user, "--", BIN / "sbatch", "--parsable", *args, path],
                         cwd=str(jobdir))
    assert result.returncode == 0, f"sbatch as {user}: {result.stderr}"
    return int(result.stdout.strip().split(";")[0])


def gpu_work(trace: Path, before: str = "") -> str:
    """A job: ~3 s of kernels with host work between them on GPU 0 of the fake driver."""
    return (f"#!/bin/sh\nexport LD_LIBRARY_PATH={shlex.quote(str(BUILD))}\n"
            f"export FAKE_CUDA_TRACE={shlex.quote(str(trace))}\n{before}"
            f"exec {shlex.quote(str(NVTEST))} init ctx:0 burst:20000:100:10\n")


def process_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"pid {pid} has no Uid line")


def test_two_users_share_a_gpu_each_in_their_own_job(healthy, jobdir, users):
    alice, bob = (users[name] for name in USERS)
    n2 = healthy.nodes["n2"]
    gres = ("-w", "n2", "--gres=nvshare:gpu0:1")
    bob_job = sbatch_as(healthy, bob.pw_name, jobdir, gpu_work(jobdir / "trace-bob"), "-J", "bobs", *gres)
    wait_until(lambda: bob_job in registered_jobs(n2), 30, "bob's job registered", healthy.diagnostics)
    # Alice's job first runs a process that claims to belong to Bob's job.
    intruder = (f"NVSHARE_JOB_ID={bob_job} {shlex.quote(str(NVTEST))} init ctx:0 launch:1000 sync "
                f"2> {shlex.quote(str(jobdir / 'intruder.err'))}\n")
    alice_job = sbatch_as(healthy, alice.pw_name, jobdir, gpu_work(jobdir / "trace-alice", intruder),
                          "-J", "alices", *gres)

    def both_connected():
        jobs = registered_jobs(n2)
        return jobs if all(jobs.get(j, {}).get("clients") for j in (alice_job, bob_job)) else None

    jobs = wait_until(both_connected, 60, "both users' processes connected", healthy.diagnostics)
    for job_id, user in ((alice_job, alice), (bob_job, bob)):
        entry = jobs[job_id]
        assert (entry["user"], entry["uid"]) == (user.pw_name, user.pw_uid)
        assert entry["gpus"] == [GPU0]
        for c in entry["clients"]:
            try:
                assert process_uid(c["pid"]) == user.pw_uid, (job_id, c)
            except FileNotFoundError:
                pass   # the process ended since the status was taken
    # What each user sees: both jobs, with their owners.
    status_cmd = [entry_point("nvshare-status"), "show", "jobs"]
    for user in (alice, bob):
        shown = healthy.run(["runuser", "-u", user.pw_name, "--", *status_cmd],
                            env={**healthy.env, "NVSHARE_CONFIG": str(n2.config_path)})
        assert shown.returncode == 0, shown.stderr
        assert f"JobId={alice_job} JobName=alices User={alice.pw_name}({alice.pw_uid})" in shown.stdout
        assert f"JobId={bob_job} JobName=bobs User={bob.pw_name}({bob.pw_uid})" in shown.stdout

    for job_id in (alice_job, bob_job):
        assert healthy.wait_job(job_id, 90) == "COMPLETED", healthy.diagnostics()
    # The intruder was refused by the scheduler (uid check), told so, and never became a client.
    assert "refused this process" in (jobdir / "intruder.err").read_text()
    assert f"uid {alice.pw_uid} may not attach to job {bob_job}" in n2.log_path.read_text()
    for name, owner in (("alice", alice), ("bob", bob)):
        trace = jobdir / f"trace-{name}"
        assert trace.stat().st_uid == owner.pw_uid    # written by the job's own processes
        rows = [line.split() for line in trace.read_text().splitlines()]
        assert len([r for r in rows if r[1] == GPU0]) >= 100, f"{name}'s kernels on GPU 0"
    wait_until(lambda: not {alice_job, bob_job} & set(registered_jobs(n2)), 15,
               "the epilog unregisters both jobs")
