"""A busy daemon is not a lost one (issue 25, "Never ungate through a stall").

With on_daemon_loss=run the hook lets GPU work pass ungated once the daemon is gone. A frame flood
once stalled the daemon past the hooks' 10 s deadline, and they ran unshared beside other jobs. Now
only a daemon that is gone counts: nobody listens on its socket (a connect fails), after the
connection ended or from the start. While the connection is open, or a new one is accepted, a late
answer (to CLIENT_REGISTER, a heartbeat, a memory question, a lock request) is waited for and
logged once (docs/design-hook.md, "Daemon connection and failures").

Against the fake driver (tests/c), a scripted daemon that stalls in one way or another and then
dies (StallingDaemon), and the real daemon stopped with SIGSTOP or killed.
"""
from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from helpers_hook import GPU0, Job, finish, read_trace, start_nvtest
from helpers_scripted import ScriptedDaemon
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C

MIB = 1 << 20
DEADLINE_MS = 500
STALL_LINE = "but its connection is open: it is busy, not lost"


class StallingDaemon(ScriptedDaemon):
    """Stalls as `how` says:
    - "register": accepts, never answers CLIENT_REGISTER;
    - "everything": registers, then answers nothing (heartbeats, lock requests, questions);
    - "questions": registers, answers heartbeats and grants locks, never answers a memory question;
    - "reconnect": registers, closes the connection 200 ms later, accepts the next ones and never
      answers their CLIENT_REGISTER.
    die() is stop(), its time recorded."""

    def __init__(self, path: Path, how: str):
        self.how = how
        self.died_ns = 0
        super().__init__(path)

    def serve(self, conn: socket.socket, number: int) -> None:
        try:
            while True:
                frame = proto.recv_frame(conn)
                if frame.type == C.NVSHARE_MSG_CLIENT_REGISTER:
                    if self.how == "register" or (self.how == "reconnect" and number > 0):
                        continue
                    conn.sendall(proto.encode(C.NVSHARE_MSG_CLIENT_REGISTER_REPLY,
                                              {"status": 0, "client_id": 1}, frame.seq))
                    if self.how == "reconnect":
                        threading.Timer(0.2, conn.shutdown, (socket.SHUT_RDWR,)).start()
                elif self.how != "questions":
                    continue
                elif frame.type == C.NVSHARE_MSG_HEARTBEAT:
                    conn.sendall(proto.encode(C.NVSHARE_MSG_HEARTBEAT,
                                              {"timestamp_ns": frame.body().timestamp_ns}, frame.seq))
                elif frame.type == C.NVSHARE_MSG_LOCK_REQUEST:
                    conn.sendall(proto.encode(C.NVSHARE_MSG_LOCK_GRANT,
                                              {"gpu_uuid": proto.text(frame.body().gpu_uuid)}))
        except (OSError, ConnectionError, proto.ProtocolError):
            pass

    def die(self) -> None:
        self.died_ns = time.monotonic_ns()
        self.stop()


def stamps(out: str) -> list[int]:
    return [int(line.split()[1]) for line in out.splitlines() if line.startswith("stamp ")]


@pytest.mark.parametrize("how", ["register", "everything", "questions", "reconnect"])
def test_a_stalled_daemon_never_ungates_and_a_dead_one_does(hook_lib, tmp_path, procs, how):
    """on_daemon_loss=run, deadline 500 ms: for five deadlines the daemon stalls and the program's
    allocation and kernel wait; then the daemon dies, and they pass at once (run). The stall is
    logged once."""
    daemon = StallingDaemon(tmp_path / "d.sock", how)
    trace = tmp_path / "trace"
    env = {"NVSHARE_SOCKET": str(tmp_path / "d.sock"), "NVSHARE_JOB_ID": "271", "SLURM_STEP_ID": "0",
           "NVSHARE_MANAGED_GPUS": GPU0, "CUDA_VISIBLE_DEVICES": GPU0, "FAKE_CUDA_TRACE": str(trace),
           "NVSHARE_ON_DAEMON_LOSS": "run", "NVSHARE_DAEMON_TIMEOUT_MS": str(DEADLINE_MS)}
    proc = start_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{MIB}", "stamp", "launch:1000", "sync", "stamp"],
                        env)
    procs.append(proc)
    time.sleep(5 * DEADLINE_MS / 1000)
    assert proc.poll() is None, "the program went on while the daemon only stalled"
    assert not trace.exists() or trace.read_text() == "", "a kernel ran ungated through a stall"
    daemon.die()
    out = finish(proc, timeout=15)
    after_alloc, after_kernel = stamps(out)
    assert after_alloc >= daemon.died_ns, "the allocation passed before the daemon was gone"
    assert read_trace(trace)[0][2] >= daemon.died_ns
    assert after_kernel - daemon.died_ns < 5e9
    assert f"alloc {MIB} rc=0" in out
    assert proc.stderr_text.count(STALL_LINE) == 1, proc.stderr_text
    assert "cannot reach nvshare-scheduler" in proc.stderr_text and "runs unshared" in proc.stderr_text


def test_a_stopped_daemon_is_waited_for(hook_lib, scheduler, tmp_path, procs):
    """The real daemon, stopped (SIGSTOP) while a process of a registered job starts with
    on_daemon_loss=run: the connection is accepted by the kernel, its registration is answered only
    after SIGCONT, and the process's kernel runs only then, gated."""
    trace = tmp_path / "trace"
    job = Job(scheduler, 272, trace, gpu_index=[0], NVSHARE_ON_DAEMON_LOSS="run",
              NVSHARE_DAEMON_TIMEOUT_MS=str(DEADLINE_MS))
    scheduler.proc.send_signal(signal.SIGSTOP)
    try:
        proc = start_nvtest(hook_lib, ["init", "ctx:0", "launch:1000", "sync"], job.env)
        procs.append(proc)
        time.sleep(5 * DEADLINE_MS / 1000)
        assert proc.poll() is None
        assert not trace.exists() or trace.read_text() == "", "a kernel ran while the daemon was stopped"
    finally:
        resumed = time.monotonic_ns()
        scheduler.proc.send_signal(signal.SIGCONT)
    finish(proc, timeout=15)
    assert read_trace(trace)[0][2] >= resumed
    assert "has not answered CLIENT_REGISTER" in proc.stderr_text and "answers again" in proc.stderr_text
    assert "runs unshared" not in proc.stderr_text


def test_a_killed_daemon_still_lets_work_run(hook_lib, scheduler, tmp_path, procs):
    """on_daemon_loss=run: the daemon killed (SIGKILL) mid-run is gone, and the next kernel runs."""
    trace = tmp_path / "trace"
    go = tmp_path / "go"
    job = Job(scheduler, 273, trace, gpu_index=[0], NVSHARE_ON_DAEMON_LOSS="run")
    proc = start_nvtest(hook_lib, ["init", "ctx:0", "launch:1000", "sync", f"waitfile:{go}", "launch:1000",
                                   "sync"], job.env)
    procs.append(proc)
    deadline = time.monotonic() + 20
    while "sync ok" not in (line := proc.stdout.readline()) and time.monotonic() < deadline:
        assert line, "nvtest ended early"
    scheduler.proc.kill()
    scheduler.proc.wait()
    go.touch()
    finish(proc, timeout=10)
    assert len(read_trace(trace)) == 2
    assert "lost the connection to nvshare-scheduler" in proc.stderr_text
    assert "runs unshared" in proc.stderr_text
    assert os.path.exists(scheduler.socket)  # the socket file stayed: the connect was refused
