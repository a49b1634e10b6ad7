"""Helpers of the tests about who a process is (its Slurm job cgroup, its uid, its start time):
a real cgroup `slurm_nvt<pid>/uid_<u>/job_<j>/step_0` (cgroup v1 freezer or v2, as root), processes
started inside it as another uid, and a client program that registers and asks for a lock."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import become

TESTS = Path(__file__).resolve().parent
ROOTS = [Path("/sys/fs/cgroup/freezer"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")]

# Registers with the daemon for a job, prints the reply, asks for a lock on a GPU and prints what
# comes back (or "none" after a while); then waits for stdin to close.
CLIENT = """
import os, socket, sys
sys.path.insert(0, {tests!r})
from lockclient import connect_and_register, gpu_frame
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C
path, job, gpu, wait = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
try:
    sock, body = connect_and_register(path, job, timeout=wait)
except socket.timeout:
    print("registered none", flush=True); sys.stdin.read(); sys.exit(0)
print("registered", body.status, flush=True)
if body.status == 0:
    sock.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, gpu))
    sock.settimeout(wait)
    try:
        while proto.recv_frame(sock).type != C.NVSHARE_MSG_LOCK_GRANT:
            pass                           # HANDOFF, LOCK_CONTENDED: not the lock
        print("lock grant", flush=True)
    except socket.timeout:
        print("lock none", flush=True)
sys.stdin.read()
"""


class JobCgroup:
    """A Slurm-shaped job cgroup that processes can be started in; removed by close()."""

    def __init__(self, job_id: int, uid: int):
        for root in ROOTS:
            if (root / "cgroup.procs").exists() and os.access(root, os.W_OK):
                break
        else:
            pytest.skip("no writable cgroup hierarchy (needs root)")
        self.root = root
        self.top = root / f"slurm_nvt{os.getpid()}_{job_id}"
        self.step = self.top / f"uid_{uid}" / f"job_{job_id}" / "step_0"
        try:
            self.step.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            pytest.skip(f"cannot make a cgroup here: {exc}")

    def enter(self, uid: int | None = None):
        """A preexec_fn: the child joins the cgroup, then becomes uid."""
        procs = str(self.step / "cgroup.procs")

        def preexec() -> None:
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))
            if uid is not None:
                become(uid)
        return preexec

    def close(self) -> None:
        for path in sorted(self.top.rglob("*"), key=lambda p: -len(p.parts)) + [self.top]:
            if path.is_dir():
                try:
                    for pid in (path / "cgroup.procs").read_text().split():
                        (self.root / "cgroup.procs").write_text(pid)
                    path.rmdir()
                except OSError:
                    pass


def start_client(socket_path: str, job_id: int, gpu: str, preexec=None, env=None,
                 wait: float = 5.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CLIENT.format(tests=str(TESTS)), socket_path,
                             str(job_id), gpu, str(wait)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, preexec_fn=preexec,
                            env=env if env is not None else dict(os.environ))


def read_line(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    return line.strip()


def finish(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
