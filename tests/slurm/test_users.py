"""Two unprivileged users share one GPU through real Slurm, on a cluster set up as sites run it.

The cluster here is its own: one node, u1, whose typed Gres= and gres.conf lines are what
nvshare-node-config prints for its GPUs, and SlurmUser an unprivileged user: slurmctld runs
as that user, slurmd (and so Prolog and Epilog) as root. Each user submits with sbatch as themself
(runuser: munge authenticates them; slurmd runs the job, the TaskProlog and the hook under their uid).
Both jobs land on GPU 0 (typed GRES gpu0). The checks are what the users and their admin would see:
both jobs registered with their own uid and name, every client of a job a process of that job's user,
a process in one user's job that names the other user's job refused by the scheduler (and told so),
both users' GPU work on GPU 0, nvshare-status run by either user showing both, and admin updates
taken from the SlurmUser but refused from a job's user.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from nvshare_slurm.node import localcluster

from .cluster import (BIN, FAKE_GPUS, SBIN, SlurmCluster, entry_point, registered_jobs, stand_in_gpu,
                      wait_until)

USERS = ("nvs-alice", "nvs-bob")
REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tests" / "c" / "build"
NVTEST = BUILD / "nvtest"
GPU0 = "GPU-fa4e0000-0000-0000-0000-000000000000"
NODE = "u1"


def gpus_with_devices(workdir: Path) -> list[dict]:
    """The fake GPUs, each with a device file that slurmd can find for its gpu GRES (a character
    device with a live driver, /dev/full's 1:7), named as the driver names them."""
    return [dict(gpu, device=stand_in_gpu(workdir / "dev" / f"nvidia{i}"))
            for i, gpu in enumerate(FAKE_GPUS)]


def node_gres_from_the_helper(workdir: Path) -> tuple[str, str, list[str]]:
    """(node, Gres=, gres.conf lines) as nvshare-node-config prints them for the fake GPUs, so that
    real slurmd judges the helper's output."""
    config = workdir / "node-config.yaml"
    config.write_text(yaml.safe_dump({"gpus": gpus_with_devices(workdir)}))
    out = subprocess.run([entry_point("nvshare-node-config"), "--config", str(config), "--node", NODE,
                          "--typed", "--sharers", "4", "--json"],
                         capture_output=True, text=True, check=True, timeout=30)
    printed = json.loads(out.stdout)
    return NODE, printed["slurm_conf"]["Gres"], printed["gres_conf"]


class SiteCluster(SlurmCluster):
    """SlurmCluster with SlurmUser an unprivileged user, who owns slurmctld's state and log files."""

    def __init__(self, base: Path, slurm_user: pwd.struct_passwd):
        super().__init__(base, [node_gres_from_the_helper(base)], gres_types="gpu,nvshare")
        self.slurm_user = slurm_user
        self.nodes[NODE].settings["slurm_user"] = slurm_user.pw_name
        self.nodes[NODE].settings["gpus"] = gpus_with_devices(base)

    def description(self) -> localcluster.LocalCluster:
        return dataclasses.replace(super().description(), slurm_user=self.slurm_user.pw_name)

    def write(self) -> None:
        super().write()
        owner = (self.slurm_user.pw_uid, self.slurm_user.pw_gid)
        os.chown(self.base / "state", *owner)
        for name in ("slurmctld.log", "slurmctld.pid"):
            (self.base / name).touch()
            os.chown(self.base / name, *owner)


def ensure_user(name: str, created: list[str]) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/bin/sh", name], check=True, capture_output=True)
        created.append(name)
        return pwd.getpwnam(name)


@pytest.fixture(scope="module")
def site():
    """(the running cluster, {user name: passwd entry}); users made with useradd are removed again."""
    if os.geteuid() != 0:
        pytest.skip("real-Slurm tests need root (slurmd runs jobs as their users)")
    if shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip("needs useradd and runuser (util-linux, passwd)")
    if not (SBIN / "slurmctld").exists() or not Path("/etc/munge/munge.key").exists():
        pytest.skip("real-Slurm tests need Slurm and munge installed; run scripts/install-demo-slurm.sh")
    created: list[str] = []
    cluster = None
    base = Path(tempfile.mkdtemp(prefix="nvslurm-users-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        users = {name: ensure_user(name, created) for name in USERS}
        # Debian's and EPEL's Slurm packages make a `slurm` user; elsewhere one of our own.
        slurm_user = pwd.getpwnam("slurm") if "slurm" in {p.pw_name for p in pwd.getpwall()} \
            else ensure_user("nvs-slurm", created)
        subprocess.run(["make", "-s", "-C", str(REPO / "tests" / "c")], check=True, capture_output=True)
        # The jobs run this checkout's code (an editable install, or PYTHONPATH) as these users.
        probe = subprocess.run(
            ["runuser", "-u", USERS[0], "--", sys.executable, "-c",
             f"import nvshare_slurm.taskprolog, os, sys; sys.exit(not os.access({str(NVTEST)!r}, os.X_OK))"],
            capture_output=True, text=True, timeout=60)
        if probe.returncode != 0:
            pytest.skip(f"{USERS[0]} cannot run {sys.executable} with this checkout ({REPO}) or "
                        f"{NVTEST}: jobs of other users need them readable by all "
                        f"({probe.stderr.strip()[-300:]})")
        cluster = SiteCluster(base, slurm_user).start()
        yield cluster, users
    finally:
        if cluster is not None:
            for name in USERS:
                cluster.run([BIN / "scancel", "-u", name], timeout=10)
            cluster.stop()
        for name in created:
            subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


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


def test_two_users_share_a_gpu_each_in_their_own_job(site):
    cluster, users = site
    alice, bob = (users[name] for name in USERS)
    node = cluster.nodes[NODE]
    jobdir = cluster.base / "jobs" / "users"
    jobdir.mkdir(mode=0o777)
    jobdir.chmod(0o777)
    ctld_uid = process_uid(cluster.procs["slurmctld"].pid)
    assert ctld_uid == cluster.slurm_user.pw_uid != 0, "slurmctld should run as the SlurmUser"
    gres = ("-w", NODE, "--gres=nvshare:gpu0:1")
    bob_job = sbatch_as(cluster, bob.pw_name, jobdir, gpu_work(jobdir / "trace-bob"), "-J", "bobs", *gres)
    wait_until(lambda: bob_job in registered_jobs(node), 30, "bob's job registered", cluster.diagnostics)
    # Alice's job first runs a process that claims to belong to Bob's job.
    intruder = (f"NVSHARE_JOB_ID={bob_job} {shlex.quote(str(NVTEST))} init ctx:0 launch:1000 sync "
                f"2> {shlex.quote(str(jobdir / 'intruder.err'))}\n")
    alice_job = sbatch_as(cluster, alice.pw_name, jobdir, gpu_work(jobdir / "trace-alice", intruder),
                          "-J", "alices", *gres)

    def both_connected():
        jobs = registered_jobs(node)
        return jobs if all(jobs.get(j, {}).get("clients") for j in (alice_job, bob_job)) else None

    jobs = wait_until(both_connected, 60, "both users' processes connected", cluster.diagnostics)
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
        shown = cluster.run(["runuser", "-u", user.pw_name, "--", *status_cmd],
                            env={**cluster.env, "NVSHARE_CONFIG": str(node.config_path)})
        assert shown.returncode == 0, shown.stderr
        assert f"JobId={alice_job} JobName=alices User={alice.pw_name}({alice.pw_uid})" in shown.stdout
        assert f"JobId={bob_job} JobName=bobs User={bob.pw_name}({bob.pw_uid})" in shown.stdout

    for job_id in (alice_job, bob_job):
        assert cluster.wait_job(job_id, 90) == "COMPLETED", cluster.diagnostics()
    # The intruder was refused by the scheduler (uid check), told so, and never became a client.
    assert "refused this process" in (jobdir / "intruder.err").read_text()
    assert f"uid {alice.pw_uid} may not attach to job {bob_job}" in node.log_path.read_text()
    for name, owner in (("alice", alice), ("bob", bob)):
        trace = jobdir / f"trace-{name}"
        assert trace.stat().st_uid == owner.pw_uid    # written by the job's own processes
        rows = [line.split() for line in trace.read_text().splitlines()]
        assert len([r for r in rows if r[1] == GPU0]) >= 100, f"{name}'s kernels on GPU 0"
    wait_until(lambda: not {alice_job, bob_job} & set(registered_jobs(node)), 15,
               "the epilog unregisters both jobs")

    # Admin updates: the SlurmUser may, a job's user may not.
    update = [entry_point("nvshare-status"), "update", "gpu=0", "mode=serial"]
    env = {**cluster.env, "NVSHARE_CONFIG": str(node.config_path)}
    refused = cluster.run(["runuser", "-u", alice.pw_name, "--", *update], env=env)
    assert refused.returncode == 1 and "update refused" in refused.stderr, refused
    taken = cluster.run(["runuser", "-u", cluster.slurm_user.pw_name, "--", *update], env=env)
    assert taken.returncode == 0, taken.stderr
    shown = cluster.run([entry_point("nvshare-status"), "show", "gpu", "0"], env=env)
    assert "Mode=serial" in shown.stdout, shown.stdout
