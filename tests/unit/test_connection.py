"""The scheduler's connection layer on its own (connection.py), with deadlines short enough to test:
a real listening socket and real peers, the daemon's handlers replaced by small ones."""
from __future__ import annotations

import asyncio
import io
import logging
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import become
from nvshare_slurm.base import log
from nvshare_slurm.scheduler import connection
from nvshare_slurm.scheduler.connection import Limits, Listener, peer_pidfd
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C

STATUS = proto.encode(C.NVSHARE_MSG_STATUS_QUERY, {"what": C.NVSHARE_STATUS_GPUS})
HEARTBEAT = proto.encode(C.NVSHARE_MSG_HEARTBEAT, {"timestamp_ns": 1})


class Harness:
    """A Listener on a temp socket in a loop of its own; handlers answer as the test says."""

    def __init__(self, limits: Limits, on_frame=None):
        directory = tempfile.mkdtemp(prefix="nvc-", dir="/tmp")
        os.chmod(directory, 0o755)               # peers of other uids connect too
        self.path = os.path.join(directory, "s.sock")
        self.limits = limits
        self.frames: list[tuple[int, int]] = []
        self.closed: list[int] = []
        self.on_frame = on_frame or self.echo
        self.log = io.StringIO()
        log.setup("test", "debug", self.log)

    def echo(self, conn, frame):
        self.frames.append((conn.pid, frame.type))
        conn.send(C.NVSHARE_MSG_HEARTBEAT, {"timestamp_ns": 2}, frame.seq)

    async def run(self, peer):
        """Serve while peer() (a blocking function) runs in a thread; its result is returned."""
        listener = Listener(connection.listening_socket(self.path), self.on_frame,
                            lambda conn: self.closed.append(conn.pid), self.limits)
        listener.start()
        self.listener = listener
        try:
            return await asyncio.to_thread(peer)
        finally:
            listener.close()


def connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(path)
    return sock


def closed_by_daemon(sock: socket.socket, timeout: float = 5.0) -> bool:
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_handler_error_closes_that_connection_with_one_escaped_line():
    def explode(conn, frame):
        raise RuntimeError("boom\nforged line")

    h = Harness(Limits(), explode)

    def peer():
        bad = connect(h.path)
        bad.sendall(proto.encode(C.NVSHARE_MSG_LOCK_REQUEST, {"gpu_uuid": b"GPU-\xff\n\x1b[31m"}))
        assert closed_by_daemon(bad)
        good = connect(h.path)     # the daemon still accepts
        good.close()

    asyncio.run(h.run(peer))
    text = h.log.getvalue()
    assert text.count("internal error on LOCK_REQUEST") == 1
    assert "boom\\nforged line" in text and "GPU-\\xff\\n\\x1b[31m" in text
    assert "\x1b" not in text and "Traceback" not in text
    assert len(text.strip().splitlines()) == 1


def test_a_partial_frame_and_a_silent_connection_are_cut_at_the_deadline():
    h = Harness(Limits(frame_deadline=0.3))

    def peer():
        partial = connect(h.path)
        partial.sendall(HEARTBEAT[:10])          # half a header, then nothing
        silent = connect(h.path)                 # never a byte
        idle = connect(h.path)
        idle.sendall(HEARTBEAT)                  # a whole frame, then idle: that is allowed
        assert proto.recv_frame(idle).type == C.NVSHARE_MSG_HEARTBEAT
        start = time.monotonic()
        assert closed_by_daemon(partial) and closed_by_daemon(silent)
        assert time.monotonic() - start < 3
        idle.settimeout(0.5)
        with pytest.raises(socket.timeout):      # still open
            idle.recv(1)
        idle.sendall(HEARTBEAT)
        assert proto.recv_frame(idle).type == C.NVSHARE_MSG_HEARTBEAT

    asyncio.run(h.run(peer))
    assert "no complete frame within 0.3s" in h.log.getvalue()


def test_a_peer_that_never_reads_is_aborted_and_its_output_bounded():
    big = b"x" * (512 << 10)

    def reply_big(conn, frame):
        conn.send(C.NVSHARE_MSG_STATUS_REPLY, {"status": 0, "json_length": len(big)}, 0, big)
        h.max_queued = max(h.max_queued, conn.queued())

    h = Harness(Limits(write_stall=0.5, status_rate=1e6, status_burst=1e6), reply_big)
    h.max_queued = 0

    def peer():
        sock = connect(h.path)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        for _ in range(200):                     # pipelined, never read
            try:
                sock.sendall(STATUS)
            except OSError:
                break
        deadline = time.monotonic() + 5
        while h.listener.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(h.listener.connections)

    assert asyncio.run(h.run(peer)) == []        # aborted, not left half-closed
    assert h.closed == [os.getpid()]
    assert h.max_queued <= connection.MAX_QUEUED_OUTPUT
    assert "does not read its replies" in h.log.getvalue()


def test_status_queries_of_a_user_are_rate_limited_not_refused():
    h = Harness(Limits(status_rate=20, status_burst=5))

    def peer():
        sock = connect(h.path)
        start = time.monotonic()
        sock.sendall(STATUS * 15)
        for _ in range(15):
            proto.recv_frame(sock)
        return time.monotonic() - start

    # root is exempt: run the peer as another uid
    if os.getuid() != 0:
        pytest.skip("needs root to act as another uid")
    took = asyncio.run(h.run(lambda: _as_uid(65534, peer)))
    assert 0.4 <= took < 3.0                     # 5 at once, then 10 at 20 per second
    assert len(h.frames) == 15


def _as_uid(uid: int, action):
    """Run action() in a forked child as uid; its float result comes back through a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            become(uid)
            os.write(write_end, struct.pack("d", float(action())))
            os._exit(0)
        except BaseException:
            import traceback
            traceback.print_exc()
            os._exit(1)
    os.close(write_end)
    data = os.read(read_end, 8)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return struct.unpack("d", data)[0]


def test_connection_cap_per_uid_keeps_room_for_root_and_other_users():
    if os.getuid() != 0:
        pytest.skip("needs root to act as other uids")
    h = Harness(Limits(per_uid=5, total=connection.ROOT_RESERVED + 10))

    def flood() -> float:
        socks, refused = [], 0
        for _ in range(20):
            sock = connect(h.path)
            try:
                sock.sendall(HEARTBEAT)
                proto.recv_frame(sock)
                socks.append(sock)
            except (ConnectionError, OSError):
                refused += 1
        return len(socks)

    def peer():
        kept = []
        accepted = _as_uid(65534, flood)
        # another user gets in, and root beyond the non-root total
        other = _as_uid(65533, lambda: _one_heartbeat(h.path))
        for _ in range(12):
            sock = connect(h.path)
            sock.sendall(HEARTBEAT)
            proto.recv_frame(sock)
            kept.append(sock)
        return accepted, other

    accepted, other = asyncio.run(h.run(peer))
    assert accepted == 5 and other == 1
    assert "uid 65534 has 5 connections open" in h.log.getvalue()


def _one_heartbeat(path: str) -> float:
    sock = connect(path)
    sock.sendall(HEARTBEAT)
    return 1.0 if proto.recv_frame(sock).type == C.NVSHARE_MSG_HEARTBEAT else 0.0


def test_accept_at_the_fd_limit_backs_off_and_logs_rarely(tmp_path):
    """A listener in a process with 40 fds: 150 connections exhaust them; accept() errors are
    logged a few times, not once per try, and accepting resumes once fds are free."""
    script = tmp_path / "listen.py"
    script.write_text(f"""
import asyncio, resource, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))
from nvshare_slurm.scheduler import connection
from nvshare_slurm.base import log
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C
log.setup("test", "debug")
def echo(conn, frame):
    conn.send(C.NVSHARE_MSG_HEARTBEAT, {{"timestamp_ns": 2}}, frame.seq)
async def main():
    l = connection.Listener(connection.listening_socket(sys.argv[1]), echo, lambda c: None,
                            connection.Limits(total=10_000, per_uid=10_000))
    l.start()
    await asyncio.sleep(3600)
asyncio.run(main())
""")
    path = str(tmp_path / "s.sock")
    proc = subprocess.Popen([sys.executable, str(script), path], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(path):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        socks = []
        for _ in range(150):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            try:
                sock.connect(path)
            except OSError:
                sock.close()
                continue
            socks.append(sock)
        time.sleep(2.0)          # the listener meets EMFILE again and again meanwhile
        for sock in socks:
            sock.close()
        start = time.monotonic()
        while True:              # accepting again, within the back-off
            try:
                assert _one_heartbeat(path) == 1.0
                break
            except OSError:
                assert time.monotonic() - start < 5
                time.sleep(0.1)
    finally:
        proc.terminate()
        err = proc.communicate(timeout=10)[1]
    lines = [line for line in err.splitlines() if "cannot accept" in line]
    assert 1 <= len(lines) <= 3, err[-3000:]
    assert "Traceback" not in err


def test_peer_pidfd_refuses_a_pid_younger_than_the_connection():
    class Fake:
        transport = None
        uid = os.getuid()

    old = Fake()
    old.pid = os.getpid()
    old.accepted_boottime = time.clock_gettime(time.CLOCK_BOOTTIME)
    fd = peer_pidfd(old)
    assert fd is not None
    os.close(fd)
    before = Fake()
    before.accepted_boottime = time.clock_gettime(time.CLOCK_BOOTTIME)
    time.sleep(0.1)
    young = subprocess.Popen(["sleep", "30"])   # as if the pid were reused after the connect
    try:
        before.pid = young.pid
        assert peer_pidfd(before) is None
    finally:
        young.kill()
        young.wait()


def test_log_lines_escape_whatever_a_caller_passes():
    out = io.StringIO()
    log.setup("nvshare-scheduler", "info", out)
    log.get().info("gpu GPU-x\n2026-01-01 nvshare-scheduler: forged\x1b[2J")
    assert out.getvalue().count("\n") == 1 and "\x1b" not in out.getvalue()
    assert "GPU-x\\n2026-01-01 nvshare-scheduler: forged\\x1b[2J" in out.getvalue()
    logging.getLogger("nvshare").handlers.clear()
