"""A client the daemon refuses keeps working (issue 24, issue 25 item 7).

The daemon refuses a registration it cannot accept (another uid's job, a pid that is not the
connecting process, a job it does not know): the hook then runs unshared, and every CUDA call must
keep its contract, frees and kernels included, with swap on or off. Before the fix, with swap on,
an allocation that waited for the registration's answer was made swappable (a reservation with
chunks mapped under it) but not entered in the hook's table once the GPU had gone pass-through, so
its cuMemFree went to the driver, which knows no such allocation: error 1, and the program exited 2.

Against the fake driver (tests/c) and a scripted daemon (RefusingDaemon: it answers the
registration as a test tells it), or the real one refusing a process of another uid.
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import become
from helpers_daemon import NOBODY
from helpers_hook import BUILD, GPU0, NVTEST, finish, start_nvtest
from helpers_scripted import ScriptedDaemon
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C

MIB = 1 << 20
# The daemon's reason, as a hostile peer might shape it: a newline, a terminal escape, a backslash.
HOSTILE = "pid 1 in the message is not the connecting process\nnvshare: fake line \x1b[31m\\"
HOSTILE_ESCAPED = "pid 1 in the message is not the connecting process\\x0anvshare: fake line \\x1b[31m\\\\"


class RefusingDaemon(ScriptedDaemon):
    """Each connection is answered by the next entry of `answers`, the last one repeating: "ok"
    (registered; then questions, lock requests and heartbeats are answered) or (status, message,
    delay): a refusal sent `delay` seconds after the CLIENT_REGISTER. Records what the hook sends as
    (connection number, type, body)."""

    def __init__(self, path: Path, answers: list):
        self.answers = answers
        self.received: list[tuple[int, int, object]] = []
        super().__init__(path)

    def serve(self, conn: socket.socket, number: int) -> None:
        answer = self.answers[min(number, len(self.answers) - 1)]
        granted = False
        try:
            while True:
                frame = proto.recv_frame(conn)
                with self.cond:
                    self.received.append((number, frame.type, frame.body()))
                    self.cond.notify_all()
                if frame.type == C.NVSHARE_MSG_CLIENT_REGISTER:
                    if answer == "ok":
                        conn.sendall(proto.encode(C.NVSHARE_MSG_CLIENT_REGISTER_REPLY,
                                                  {"status": 0, "client_id": 1}, frame.seq))
                        continue
                    status, message, delay = answer
                    time.sleep(delay)
                    conn.sendall(proto.encode(C.NVSHARE_MSG_CLIENT_REGISTER_REPLY,
                                              {"status": status, "message": message}, frame.seq))
                    conn.close()
                    return
                if frame.type == C.NVSHARE_MSG_HEARTBEAT:
                    conn.sendall(proto.encode(C.NVSHARE_MSG_HEARTBEAT,
                                              {"timestamp_ns": frame.body().timestamp_ns}, frame.seq))
                elif frame.type == C.NVSHARE_MSG_MEM_UPDATE and frame.body().request:
                    conn.sendall(proto.encode(C.NVSHARE_MSG_MEM_REPLY, {"status": 0, "available": 8 << 30,
                                                                        "total": 16 << 30}, frame.seq))
                elif frame.type == C.NVSHARE_MSG_LOCK_REQUEST and not granted:
                    granted = True  # the first request only: after a DROP_LOCK the GPU stays away
                    conn.sendall(proto.encode(C.NVSHARE_MSG_LOCK_GRANT,
                                              {"gpu_uuid": proto.text(frame.body().gpu_uuid)}))
        except (OSError, ConnectionError, proto.ProtocolError):
            pass

    def send(self, number: int, msg_type: int, fields: dict) -> None:
        self.conns[number].sendall(proto.encode(msg_type, fields))

    def close(self, number: int) -> None:
        self.conns[number].shutdown(socket.SHUT_RDWR)

    def wait_for(self, msg_type: int, timeout: float = 20.0):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for number, kind, body in self.received:
                    if kind == msg_type:
                        return number, body
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no message {msg_type}; got {[k for _, k, _ in self.received]}")
                self.cond.wait(left)


@pytest.fixture
def daemons():
    started: list[RefusingDaemon] = []

    def make(path: Path, answers: list) -> RefusingDaemon:
        daemon = RefusingDaemon(path, answers)
        started.append(daemon)
        return daemon
    yield make
    for daemon in started:
        daemon.stop()


def job_env(sock: Path, swap: str, **extra: str) -> dict:
    return {"NVSHARE_SOCKET": str(sock), "NVSHARE_JOB_ID": "261", "SLURM_STEP_ID": "0",
            "NVSHARE_MANAGED_GPUS": GPU0, "CUDA_VISIBLE_DEVICES": GPU0, "NVSHARE_SWAP": swap, **extra}


# What a program does with a GPU: allocations large (swappable with swap on) and small, kernels,
# copies both ways with the data checked, frees, and the memory view.
WORK = [f"alloc:{64 * MIB}", "alloc:4096", "fill:0:a5", "launch:1000", "sync", "check:0:a5", "copy",
        f"pattern:{8 * MIB}:2:1000", "freeall", "meminfo"]


def assert_worked(out: str, allocs: int = 2) -> None:
    assert out.count(" rc=0") >= allocs and "rc=1 " not in out, out
    assert "check 0 rc=0 bytes=67108864 bad=0" in out, out
    assert "copy ok" in out and "pattern ok rounds=2" in out and "freeall ok" in out, out


@pytest.mark.parametrize("swap", ["on", "off"])
def test_a_client_refused_while_it_allocates_keeps_working(hook_lib, daemons, tmp_path, procs, swap):
    """The refusal comes 300 ms after CLIENT_REGISTER, while the program's first allocation waits for
    it: the allocation, its free and everything after work, and the job's output says why."""
    daemons(tmp_path / "d.sock", [(C.NVSHARE_ERR_PERM, HOSTILE, 0.3)])
    proc = start_nvtest(hook_lib, ["init", "ctx:0", *WORK], job_env(tmp_path / "d.sock", swap))
    procs.append(proc)
    out = finish(proc)
    assert_worked(out)
    refused = [line for line in proc.stderr_text.splitlines() if "refused this process" in line]
    assert len(refused) == 1, proc.stderr_text
    assert f"(status {C.NVSHARE_ERR_PERM}: {HOSTILE_ESCAPED}); GPU work runs unshared" in refused[0]
    # One line per message: the daemon's words cannot start a line of their own or colour the output.
    assert all(line.startswith("nvshare: job 261 step 0 pid ") for line in proc.stderr_text.splitlines())
    assert "\x1b" not in proc.stderr_text


@pytest.mark.parametrize("swap", ["on", "off"])
def test_a_reconnect_refused_mid_run_keeps_the_program_working(hook_lib, daemons, tmp_path, procs, swap):
    """Registered, 64 MiB allocated and filled, then the daemon asks for the GPU back with the
    memory (it moves to host memory when swap is on), and the connection ends. The reconnect is
    refused 300 ms after it registers, while the program's next allocation waits for the answer:
    the first allocation comes back with its data before any work touches it, and every call after
    keeps its contract."""
    refusal = (C.NVSHARE_ERR_PERM, "uid 1 may not attach to job 261", 0.3)
    daemon = daemons(tmp_path / "d.sock", ["ok", refusal])
    go = tmp_path / "go"
    steps = ["init", "ctx:0", f"alloc:{64 * MIB}", "fill:0:a5", "launch:1000", "sync", f"waitfile:{go}",
             f"alloc:{64 * MIB}", "fill:1:5a", "check:0:a5", "check:1:5a", "launch:1000", "sync", "copy",
             "freeall", "meminfo"]
    proc = start_nvtest(hook_lib, steps, job_env(tmp_path / "d.sock", swap))
    procs.append(proc)
    daemon.wait_for(C.NVSHARE_MSG_LOCK_REQUEST)
    deadline = time.monotonic() + 20
    while "sync ok" not in (line := proc.stdout.readline()) and time.monotonic() < deadline:
        assert line, "nvtest ended early"
    daemon.send(0, C.NVSHARE_MSG_DROP_LOCK, {"gpu_uuid": GPU0, "bytes": 64 * MIB})
    _, released = daemon.wait_for(C.NVSHARE_MSG_LOCK_RELEASED)
    if swap == "on":
        assert released.flags & C.NVSHARE_RELEASE_SWAPPED and released.bytes == 64 * MIB
    else:
        assert released.bytes == 0
    daemon.close(0)
    go.touch()
    out = finish(proc)
    assert "check 0 rc=0 bytes=67108864 bad=0" in out and "check 1 rc=0 bytes=67108864 bad=0" in out, out
    assert "copy ok" in out and "freeall ok" in out, out
    assert "nvshare-scheduler refused this process (status 1: uid 1 may not attach to job 261)" \
        in proc.stderr_text, proc.stderr_text


@pytest.mark.parametrize("swap", ["on", "off"])
def test_the_real_daemon_refusing_another_users_process(hook_lib, scheduler, tmp_path, swap):
    """The job is root's; its process runs as nobody, whom the daemon refuses (a uid mismatch). The
    program works unshared and its output says why."""
    if os.getuid() != 0:
        pytest.skip("acts as another uid: needs root")
    scheduler.client().register_job(262, uid=0, gid=0, slots=0, gpu_index=[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVSHARE_", "SLURM_", "FAKE_CUDA_"))}
    env.update(job_env(Path(scheduler.socket), swap, NVSHARE_JOB_ID="262"),
               LD_LIBRARY_PATH=str(BUILD), LD_PRELOAD=str(hook_lib))
    out = subprocess.run([str(NVTEST), "init", "ctx:0", *WORK], env=env, capture_output=True, text=True,
                         timeout=60, preexec_fn=lambda: become(NOBODY), cwd="/")
    assert out.returncode == 0 and out.stdout.rstrip().endswith("done"), out.stdout + out.stderr
    assert_worked(out.stdout)
    assert f"refused this process (status {C.NVSHARE_ERR_PERM}: uid {NOBODY} may not attach to job 262 " \
           f"of uid 0); GPU work runs unshared" in out.stderr, out.stderr
