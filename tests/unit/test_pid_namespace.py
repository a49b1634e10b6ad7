"""A client in a PID namespace of its own (a container) is known by SO_PEERCRED's pid, and only
inside its job's Slurm cgroup: the pid in its message is its namespace's (1), never trusted alone.

Each client here runs under `unshare --pid --fork --mount-proc`, so its getpid() is 1, like a
container's first process; a job's cgroup is a directory named as Slurm names it
(slurm_<node>/uid_<uid>/job_<id>/step_<s> on cgroup v1, <node>_slurmstepd.scope/job_<id>/... on v2).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers_daemon import GPU0
from nvshare_slurm.node import render
from nvshare_slurm.scheduler.peerpid import namespace_pids
from nvshare_slurm.wire.proto import C

JOB = 77
OTHER_JOB = 78
# Registers, prints the reply's status and its own pid, then holds the connection until stdin closes.
CLIENT = textwrap.dedent("""
    import os, socket, sys
    sys.path[:0] = [{tests!r}]
    from lockclient import register_frame
    from nvshare_slurm.wire import proto
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect({socket!r})
    sock.sendall(register_frame(int(sys.argv[1]), 0, int(sys.argv[2] or os.getpid())))
    print(int(proto.recv_frame(sock).body().status), os.getpid(), flush=True)
    sys.stdin.read()
""")


def cgroup_root() -> Path | None:
    """Where this test makes Slurm-named cgroups: the v2 root, else v1's freezer hierarchy."""
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return Path("/sys/fs/cgroup/nvstest_slurmstepd.scope")
    if Path("/sys/fs/cgroup/freezer/cgroup.procs").exists():
        return Path("/sys/fs/cgroup/freezer/slurm_nvstest/uid_0")
    return None


@pytest.fixture
def job_cgroups():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux): a PID namespace and a cgroup")
    root = cgroup_root()
    if root is None:
        pytest.skip("no cgroup hierarchy to make a job's cgroup in")
    made = []

    def make(job_id: int) -> Path:
        path = root / f"job_{job_id}" / "step_0"
        path.mkdir(parents=True, exist_ok=True)
        made.append(path)
        return path

    yield make
    for path in made:
        for d in (path, path.parent):
            for _ in range(50):        # a process that just exited may still be counted
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
    try:
        root.rmdir()
        if root.parent.name == "slurm_nvstest":
            root.parent.rmdir()
    except OSError:
        pass


class NamespacedClient:
    """A client process in its own PID namespace, in the given cgroup (or none)."""

    def __init__(self, sched, job_id: int, cgroup: Path | None, claimed_pid: int | None = None):
        script = CLIENT.format(tests=str(Path(__file__).resolve().parents[1]), socket=sched.socket)
        enter = f"echo $$ > {cgroup}/cgroup.procs && " if cgroup else ""
        self.proc = subprocess.Popen(
            ["sh", "-c", f'{enter}exec unshare --pid --fork --mount-proc "$@"', "sh",
             sys.executable, "-c", script, str(job_id), str(claimed_pid or "")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split() if self.proc.stdout else []
        assert len(line) == 2, self.proc.stderr.read() if self.proc.stderr else ""
        self.status, self.inner_pid = int(line[0]), int(line[1])

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(10)


def client_pids(sched, job_id: int) -> list[int]:
    jobs = sched.client().status(C.NVSHARE_STATUS_JOBS)["jobs"]
    return [c["pid"] for j in jobs if j["job_id"] == job_id for c in j["clients"]]


@pytest.fixture
def sched(scheduler_factory):
    s = scheduler_factory()
    for job in (JOB, OTHER_JOB):
        s.client().register_job(job, uid=0, gid=0, gpu_index=[0])
    return s


def test_a_client_in_its_jobs_cgroup_registers_by_its_pid_on_the_node(sched, job_cgroups):
    client = NamespacedClient(sched, JOB, job_cgroups(JOB))
    try:
        assert (client.status, client.inner_pid) == (C.NVSHARE_OK, 1)
        (pid,) = client_pids(sched, JOB)
        # SO_PEERCRED's pid: the python under unshare's fork, as the node sees it.
        assert pid > 1 and namespace_pids(pid) == [pid, 1]
        assert f"pid {pid}: client registered from a PID namespace (pid 1 there)" in sched.log()
    finally:
        client.close()


def test_a_namespaced_client_outside_its_jobs_cgroup_is_refused_and_shown(sched, job_cgroups):
    elsewhere = NamespacedClient(sched, JOB, job_cgroups(OTHER_JOB))
    nowhere = NamespacedClient(sched, JOB, None)
    try:
        assert elsewhere.status == nowhere.status == C.NVSHARE_ERR_PERM
        assert client_pids(sched, JOB) == []
        refused = sched.client().status()["refused"]
        assert [(r["job_id"], r["uid"]) for r in refused] == [(JOB, 0), (JOB, 0)]
        assert all(r["pid"] > 1 for r in refused)
        assert f"the cgroup of job {OTHER_JOB}, not job {JOB}'s" in refused[0]["reason"]
        assert "no Slurm job's cgroup" in refused[1]["reason"]
        shown = render.render_gpus(sched.client().status())
        assert f"Refused: job={JOB} pid={refused[1]['pid']} uid=0 at=" in shown
        assert "reason=process" in shown and "not job 77's" in shown
        assert "client refused" in sched.log()
    finally:
        elsewhere.close()
        nowhere.close()


def test_a_namespaced_client_must_name_its_own_namespace_pid(sched, job_cgroups):
    liar = NamespacedClient(sched, JOB, job_cgroups(JOB), claimed_pid=5)
    try:
        assert liar.status == C.NVSHARE_ERR_PERM
        (refusal,) = sched.client().status(C.NVSHARE_STATUS_JOBS)["refused"]
        assert "pid 5 in the message is not the connecting process" in refusal["reason"]
        assert "(pid 1 in its own PID namespace)" in refusal["reason"]
    finally:
        liar.close()


def test_status_lists_no_refusal_of_a_healthy_node(sched):
    from lockclient import connect_and_register
    sock, body = connect_and_register(sched.socket, JOB)
    with sock:
        assert body.status == C.NVSHARE_OK
        assert sched.client().status()["refused"] == []
        assert any(g["uuid"] == GPU0 for g in sched.client().status()["gpus"])
