"""nvshare-scheduler's connections: accepting, framing, and the bounds that keep one peer from
stalling or blinding the others. The message handlers are the daemon's (clienthandlers.py,
requesthandlers.py), reached through daemon.py's dispatch.

Every peer is a local process, but not every local process is friendly. So:
- each uid has a connection cap; root (prolog, epilog, admins) has connections of its own held back
  from everyone else, so a flood never keeps a job from being registered or unregistered;
- accept() errors (file descriptors exhausted) back off and are logged once now and then;
- a frame once begun, and a new connection's first frame, must be complete within FRAME_DEADLINE_SEC;
- a peer whose replies pile up is read no further until they drain (back-pressure), and is cut off
  with transport.abort() when they do not drain within WRITE_STALL_SEC or pass MAX_QUEUED_OUTPUT;
- status queries of each non-root uid are rate limited (a query over the rate waits, unread);
- frames are served in turns, round robin over uids and, within a uid, over its connections: each
  uid's turn is at most SERVE_SLICE_SEC of handling (and one connection's at most FRAMES_PER_TURN
  frames), then the next uid's, and I/O is polled between rounds. So one uid's flood, of any frame
  type, registered or not, delays another uid's frame by about one slice, whatever the number of
  its connections; input waiting for its turn is bounded per connection (INPUT_HIGH_WATER, then
  the socket is read no further);
- whatever a handler raises closes that one connection with one log line, the frame's bytes escaped.
"""
from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
import resource
import math
import socket
import signal
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base import log
from ..wire import proto
from ..wire.proto import C

FRAME_DEADLINE_SEC = 10.0
WRITE_STALL_SEC = 10.0
# Input read ahead while a peer's frames wait for their turn (or its status queries for the rate
# limit); above it the socket is read no further until they are served.
INPUT_HIGH_WATER = 64 << 10
READ_SIZE = 64 << 10                # one recv() (asyncio's default is 256 KiB)
SERVE_SLICE_SEC = 0.0005            # one uid's handling per round, at most (one frame at least)
FRAMES_PER_TURN = 16                # one connection's frames per turn before its uid's next one
# Above this much queued output a peer's further requests wait unread.
OUTPUT_HIGH_WATER = 64 << 10
# One full status reply past the high-water mark, and room for the lock messages of its GPUs.
MAX_QUEUED_OUTPUT = OUTPUT_HIGH_WATER + proto.HDR_SIZE + proto.MAX_PAYLOAD + (64 << 10)
ROOT_RESERVED = 64                  # connections only root may use
FDS_KEPT_FREE = 64                  # for state.json, scontrol's pipes, the log
STATUS_RATE = 10.0                  # status queries per second per non-root uid ...
STATUS_BURST = 20.0                 # ... after a burst of this many
ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX = 0.05, 1.0
LISTEN_BACKLOG = 1024
ACCEPTS_PER_WAKEUP = 64
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Violation(Exception):
    """A message that is not allowed from this peer or in this state: close the connection."""


@dataclass
class Limits:
    per_uid: int = 256              # config max_connections_per_uid
    total: int = 0                  # 0: from RLIMIT_NOFILE
    frame_deadline: float = FRAME_DEADLINE_SEC
    write_stall: float = WRITE_STALL_SEC
    status_rate: float = STATUS_RATE
    status_burst: float = STATUS_BURST

    def total_connections(self) -> int:
        if self.total:
            return self.total
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return max(ROOT_RESERVED + 16, soft - FDS_KEPT_FREE)


class TokenBucket:
    def __init__(self, rate: float, burst: float, now: float):
        self.rate, self.burst = rate, burst
        self.tokens, self.at = burst, now

    def wait(self, now: float) -> float:
        """0 and one token taken, or the seconds until one is there (nothing taken)."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class Connection(asyncio.Protocol):
    """One accepted socket: its peer's credentials and, after CLIENT_REGISTER, its client."""

    def __init__(self, listener: Listener, pid: int, uid: int, gid: int):
        self.listener = listener
        self.pid, self.uid, self.gid = pid, uid, gid
        self.client: Any = None          # registry.RegisteredClient from CLIENT_REGISTER on
        self.pidfd: int | None = None    # taken at CLIENT_REGISTER, for unresponsive_holder: kill
        self.closed = False
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._frame_timer: asyncio.TimerHandle | None = None
        self._stall_timer: asyncio.TimerHandle | None = None
        self._rate_waiting = False       # a status query waits for its turn (Listener.status_turn)
        self._rate_token = False
        self._output_blocked = False
        self._eof = False
        self._held = False
        self.queued_for_turn = False     # in Listener's round robin: complete frames wait
        self.accepted_boottime = time.clock_gettime(time.CLOCK_BOOTTIME)
        self.sock: socket.socket | None = None      # the accepted socket, for send_with_fd
        self.burst_pages: set[str] = set()          # GPUs whose burst page this peer has

    def who(self) -> str:
        if self.client is not None:
            return self.client.label()
        return f"pid {self.pid} uid {self.uid}"

    # --- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=OUTPUT_HIGH_WATER)
        if hasattr(transport, "max_size"):   # the selector transport's recv() size
            transport.max_size = READ_SIZE
        self._arm_frame_deadline()       # the first frame must come, and be whole, in time

    def data_received(self, data: bytes) -> None:
        # Served in its uid's turn (Listener.serve_round), never here: a flood must not be
        # handled ahead of other uids' frames just because its socket was read first.
        self._buffer += data
        if len(self._buffer) > INPUT_HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
        self.listener.queue_for_turn(self)

    def eof_received(self) -> bool:
        # The peer sends no more; what it sent is still answered, then the connection closes.
        # Queries held back by the rate limit are not: a peer that floods and goes is gone at once.
        self._eof = True
        if self._rate_waiting:
            self.close()
        else:
            self.listener.queue_for_turn(self)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()
        self.listener.forget(self)

    def pause_writing(self) -> None:
        # Replies pile up: read no more requests until they drain, and not forever.
        self._output_blocked = True
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()
        if self._stall_timer is None:
            self._stall_timer = self.listener.loop.call_later(self.listener.limits.write_stall,
                                                              self._write_stalled)

    def resume_writing(self) -> None:
        self._output_blocked = False
        self._cancel("_stall_timer")
        if not self.closed:
            self.listener.queue_for_turn(self)

    # --- frames in, frames out -------------------------------------------------------------------

    def serve_turn(self, until: float = math.inf, budget: int = FRAMES_PER_TURN) -> None:
        """Its turn (Listener.serve_round): up to `budget` frames, and none begun after `until`
        (perf_counter) but the first; what is left waits for its next turn."""
        self.queued_for_turn = False
        listener = self.listener
        served = 0
        while not self.closed and not self._output_blocked and not self._rate_waiting \
                and not self._held:
            if len(self._buffer) < proto.HDR_SIZE:
                break
            try:
                msg_type, length, seq = proto.decode_header(bytes(self._buffer[:proto.HDR_SIZE]))
            except proto.ProtocolError as exc:
                return self._refuse(exc, bytes(self._buffer[:proto.HDR_SIZE]))
            end = proto.HDR_SIZE + length
            if len(self._buffer) < end:
                break
            if served >= budget or (served and time.perf_counter() >= until):
                listener.queue_for_turn(self)
                break
            if msg_type == C.NVSHARE_MSG_STATUS_QUERY and self.uid != 0:
                if self._rate_token:
                    self._rate_token = False
                elif not listener.status_allowed(self):
                    self._rate_waiting = True
                    break
            raw = bytes(self._buffer[:end])
            del self._buffer[:end]
            self._cancel("_frame_timer")     # a frame came whole: the next one's deadline is new
            served += 1
            self.dispatch(proto.Frame(msg_type, seq, raw[proto.HDR_SIZE:]))
        if self.closed:
            return
        if self._held:
            return
        if self.queued_for_turn:             # whole frames wait for its next turn
            if len(self._buffer) <= INPUT_HIGH_WATER and self.transport is not None \
                    and not self._output_blocked:
                self.transport.resume_reading()
            return
        if self._eof and not self._rate_waiting and not self._output_blocked:
            if self._buffer:
                return self._refuse(proto.ProtocolError(
                    f"connection closed inside a frame ({len(self._buffer)} bytes)"),
                    bytes(self._buffer))
            return self.close()
        if self._buffer:
            if self._frame_timer is None:
                self._arm_frame_deadline()
        else:
            self._cancel("_frame_timer")
        if self.transport is None:
            return
        if self._output_blocked or len(self._buffer) > INPUT_HIGH_WATER:
            self.transport.pause_reading()
        else:
            # Rate-limited, still read (up to INPUT_HIGH_WATER): a peer that hangs up is seen.
            self.transport.resume_reading()

    def dispatch(self, frame: proto.Frame) -> None:
        """Hand one frame to the daemon; whatever goes wrong closes this connection only."""
        try:
            frame.body()
            self.listener.on_frame(self, frame)
        except (proto.ProtocolError, Violation) as exc:
            self._refuse(exc, proto.pack_header(frame.type, len(frame.payload), frame.seq)
                         + frame.payload)
        except Exception as exc:  # noqa: BLE001 - one peer's frame never stops the daemon
            self.listener.logger.error(
                f"connection from {self.who()}: internal error on {frame.name}: "
                f"{type(exc).__name__}: {log.escape(str(exc))}; frame "
                f"{log.escape(frame.payload, 512)}; closing it")
            self.close()

    def hold(self) -> None:
        """Read no further frames until unhold(): the daemon answers the last one later."""
        self._held = True
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def unhold(self) -> None:
        self._held = False
        if not self.closed:
            self.listener.queue_for_turn(self)

    def _refuse(self, exc: Exception, raw: bytes) -> None:
        self.listener.logger.warning(f"connection from {self.who()}: {exc}; frame "
                                     f"{log.escape(raw, 256)}; closing it")
        self.close()

    def rate_granted(self) -> None:
        """Its status query's turn has come (the token is taken for it)."""
        self._rate_waiting, self._rate_token = False, True
        self.listener.queue_for_turn(self)

    def _arm_frame_deadline(self) -> None:
        self._cancel("_frame_timer")
        self._frame_timer = self.listener.loop.call_later(self.listener.limits.frame_deadline,
                                                          self._frame_late)

    def _frame_late(self) -> None:
        self._frame_timer = None
        if self.closed or self._rate_waiting or self._output_blocked or self._held \
                or self.queued_for_turn:
            return      # waiting on us, not on the peer
        self.listener.throttle(("late", self.uid), logging.WARNING,
                               f"connection from {self.who()}: no complete frame within "
                               f"{self.listener.limits.frame_deadline:g}s; closing it")
        self.abort()

    def _write_stalled(self) -> None:
        self._stall_timer = None
        self.listener.throttle(("stall", self.uid), logging.WARNING,
                               f"connection from {self.who()}: does not read its replies "
                               f"({self.queued()} bytes queued for "
                               f"{self.listener.limits.write_stall:g}s); cutting it off")
        self.abort()

    def queued(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    def send(self, msg_type: int, fields: dict[str, Any] | None = None, seq: int = 0,
             tail: bytes = b"") -> None:
        if self.closed or self.transport is None:
            return
        self.transport.write(proto.encode(msg_type, fields, seq, tail))
        if self.queued() > MAX_QUEUED_OUTPUT:
            self.listener.throttle(("backlog", self.uid), logging.WARNING,
                                   f"connection from {self.who()}: does not read its socket "
                                   f"({self.queued()} bytes queued); cutting it off")
            self.abort()

    def send_with_fd(self, msg_type: int, fields: dict[str, Any], fd: int, seq: int = 0) -> bool:
        """Send one frame with a file descriptor (SCM_RIGHTS) straight on the socket. Only while
        nothing waits in the transport's buffer, so that frames keep their order; False when it
        could not go now (the caller tries again later)."""
        if self.closed or self.transport is None or self.sock is None or self.queued():
            return False
        data = proto.encode(msg_type, fields, seq)
        try:
            sent = socket.send_fds(self.sock, [data], [fd])
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            # A peer that has gone (its process exited) is the normal end of a client: debug.
            gone = isinstance(exc, (BrokenPipeError, ConnectionResetError))
            self.listener.throttle(("send_fds", self.uid), logging.DEBUG if gone else logging.WARNING,
                                   f"connection from {self.who()}: cannot pass a file "
                                   f"descriptor ({exc})")
            return False
        if sent < len(data):      # the socket took part of it (and the descriptor): queue the rest
            self.transport.write(data[sent:])
        return True

    # --- the end ---------------------------------------------------------------------------------

    def _cancel(self, name: str) -> None:
        handle = getattr(self, name)
        if handle is not None:
            handle.cancel()
            setattr(self, name, None)

    def _finish(self) -> None:
        """Once per connection, at the first of close, abort or loss: the client is gone now."""
        if self.closed:
            return
        self.closed = True
        self._cancel("_frame_timer")
        self._buffer.clear()
        try:
            self.listener.on_close(self)
        finally:
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None

    def close(self) -> None:
        """Close after what is queued is sent; a peer that does not take it is cut off later."""
        self._finish()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
            if self.queued() and self._stall_timer is None:
                self._stall_timer = self.listener.loop.call_later(
                    self.listener.limits.write_stall, self.abort)

    def abort(self) -> None:
        """Close now, dropping queued output: close() would wait on a peer that never reads."""
        self._finish()
        self._cancel("_stall_timer")
        if self.transport is not None:
            self.transport.abort()


class Listener:
    """The listening socket and the set of live connections, with their caps."""

    def __init__(self, sock: socket.socket, on_frame: Callable[[Connection, proto.Frame], None],
                 on_close: Callable[[Connection], None], limits: Limits | None = None):
        self.sock = sock
        self.on_frame = on_frame
        self.on_close = on_close
        self.limits = limits or Limits()
        self.loop = asyncio.get_running_loop()
        self.logger = log.get()
        self.throttle = log.Throttle()
        self.connections: set[Connection] = set()
        self.per_uid: dict[int, int] = {}
        self._buckets: dict[int, TokenBucket] = {}
        self._status_waiting: dict[int, collections.deque[Connection]] = {}
        # uid -> its connections whose frames wait for a turn; uids in round-robin order
        self._turns: dict[int, collections.deque[Connection]] = {}
        self._round: asyncio.Handle | None = None
        self.stopping = False            # the daemon stops: no frame is served any more
        self._backoff = ACCEPT_BACKOFF_MIN
        self._retry: asyncio.TimerHandle | None = None
        self._serving = False
        self._total = self.limits.total_connections()

    def start(self) -> None:
        self.sock.setblocking(False)
        self.loop.add_reader(self.sock.fileno(), self._accept)
        self._serving = True

    def queue_for_turn(self, conn: Connection) -> None:
        """conn has input: serve it in its uid's next turn (a round is scheduled)."""
        if conn.queued_for_turn or conn.closed or self.stopping:
            return
        conn.queued_for_turn = True
        waiting = self._turns.get(conn.uid)
        if waiting is None:
            waiting = self._turns[conn.uid] = collections.deque()
        waiting.append(conn)
        if self._round is None:
            self._round = self.loop.call_soon(self.serve_round)

    def serve_round(self) -> None:
        """One round: each uid with input in turn gets up to SERVE_SLICE_SEC, its connections
        round robin. Callbacks run after the next poll, so I/O is read between rounds."""
        self._round = None
        for uid in list(self._turns):
            waiting = self._turns[uid]
            until = time.perf_counter() + SERVE_SLICE_SEC
            while waiting:
                conn = waiting.popleft()
                if conn.closed or self.stopping:
                    conn.queued_for_turn = False
                    continue
                conn.serve_turn(until)
                if time.perf_counter() >= until:
                    break
            del self._turns[uid]
            if waiting:
                self._turns[uid] = waiting      # to the end: the next uid goes first next round
        if self._turns and self._round is None and not self.stopping:
            self._round = self.loop.call_soon(self.serve_round)

    def close(self) -> None:
        self.stopping = True
        if self._round is not None:
            self._round.cancel()
            self._round = None
        if self._serving:
            self.loop.remove_reader(self.sock.fileno())
            self._serving = False
        if self._retry is not None:
            self._retry.cancel()
        self.sock.close()
        for conn in list(self.connections):
            conn.close()

    def status_allowed(self, conn: Connection) -> bool:
        """True: conn's status query may go now. False: it queues behind its uid's earlier ones,
        and Listener.status_turn hands it a token in turn (one timer per uid, not per connection:
        a thousand waiting connections must not all wake up to find the bucket empty)."""
        uid = conn.uid
        waiting = self._status_waiting.get(uid)
        if waiting:
            waiting.append(conn)
            return False
        now = self.loop.time()
        bucket = self._buckets.get(uid)
        if bucket is None:
            if len(self._buckets) > 4096:
                self._buckets = {u: b for u, b in self._buckets.items() if u in self._status_waiting}
            bucket = self._buckets[uid] = TokenBucket(self.limits.status_rate,
                                                       self.limits.status_burst, now)
        wait = bucket.wait(now)
        if wait == 0:
            return True
        self._status_waiting[uid] = collections.deque([conn])
        self.loop.call_later(wait, self.status_turn, uid)
        return False

    def status_turn(self, uid: int) -> None:
        waiting = self._status_waiting.get(uid)
        while waiting and waiting[0].closed:
            waiting.popleft()
        if not waiting:
            self._status_waiting.pop(uid, None)
            return
        wait = self._buckets[uid].wait(self.loop.time())
        if wait == 0:
            conn = waiting.popleft()
            if not waiting:
                self._status_waiting.pop(uid, None)
            else:
                self.loop.call_later(1.0 / self.limits.status_rate, self.status_turn, uid)
            conn.rate_granted()      # may queue its next query: the table is in order before
            return
        self.loop.call_later(wait, self.status_turn, uid)

    def set_limits(self, limits: Limits) -> None:
        self.limits = limits
        self._total = limits.total_connections()

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_WAKEUP):
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                # Out of file descriptors: the socket stays readable, so stop listening a while
                # instead of spinning on it; one log line now and then.
                self.loop.remove_reader(self.sock.fileno())
                self._serving = False
                self._retry = self.loop.call_later(self._backoff, self._resume_accepting)
                self.throttle("accept", logging.ERROR,
                              f"cannot accept connections: {exc.strerror or exc}; retrying in "
                              f"{self._backoff:g}s ({len(self.connections)} open)")
                if exc.errno in _OUT_OF_FDS:
                    self._backoff = min(self._backoff * 2, ACCEPT_BACKOFF_MAX)
                return
            self._backoff = ACCEPT_BACKOFF_MIN
            self._admit(sock)

    def _resume_accepting(self) -> None:
        self._retry = None
        if not self._serving and self.sock.fileno() >= 0:
            self.loop.add_reader(self.sock.fileno(), self._accept)
            self._serving = True

    def _admit(self, sock: socket.socket) -> None:
        try:
            pid, uid, gid = proto.peer_credentials(sock)
            sock.setblocking(False)
        except OSError as exc:
            self.throttle("creds", logging.WARNING,
                          f"connection: cannot read peer credentials ({exc}); closing it")
            sock.close()
            return
        open_now = len(self.connections)
        mine = self.per_uid.get(uid, 0)
        reason = ""
        if open_now >= self._total:
            reason = f"{open_now} connections open, the most this daemon takes"
        elif uid != 0 and open_now >= self._total - ROOT_RESERVED:
            reason = f"{open_now} connections open; the rest are kept for root"
        elif uid != 0 and mine >= self.limits.per_uid:
            reason = f"uid {uid} has {mine} connections open (max_connections_per_uid)"
        if reason:
            self.throttle(("refused", uid), logging.WARNING,
                          f"connection from pid {pid} uid {uid} refused: {reason}")
            sock.close()
            return
        conn = Connection(self, pid, uid, gid)
        self.connections.add(conn)
        self.per_uid[uid] = mine + 1
        self.loop.create_task(self._attach(conn, sock))

    async def _attach(self, conn: Connection, sock: socket.socket) -> None:
        conn.sock = sock
        try:
            await self.loop.connect_accepted_socket(lambda: conn, sock)
        except Exception as exc:  # noqa: BLE001 - the peer may be gone already
            self.throttle("attach", logging.WARNING, f"connection from {conn.who()}: cannot be "
                                                     f"set up ({exc}); closing it")
            sock.close()
            self.forget(conn)

    def forget(self, conn: Connection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            left = self.per_uid.get(conn.uid, 1) - 1
            if left > 0:
                self.per_uid[conn.uid] = left
            else:
                self.per_uid.pop(conn.uid, None)


async def prepare_socket_path(path: str) -> bool:
    """Create the socket's directory; remove a stale socket. False if a daemon answers there."""
    directory = Path(path).parent
    if not directory.exists():
        directory.mkdir(parents=True, mode=0o755)
        os.chmod(directory, 0o755)
    if os.path.lexists(path):
        try:
            _, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), 2.0)
        except (OSError, asyncio.TimeoutError):
            os.unlink(path)
            return True
        writer.close()
        return False
    return True


def listening_socket(path: str) -> socket.socket:
    """A socket that listens before its name appears: whoever sees the path can connect."""
    temporary = os.path.join(os.path.dirname(path), f".{os.getpid()}.sock")   # short: sun_path
    if os.path.lexists(temporary):
        os.unlink(temporary)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(temporary)
        sock.listen(LISTEN_BACKLOG)
        os.chmod(temporary, 0o666)
        os.rename(temporary, path)
    except OSError:
        sock.close()
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise
    return sock


def remove_socket(path: str) -> None:
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass


SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)     # Linux 6.5


def peer_pidfd(conn: Connection) -> int | None:
    """A pidfd of the process at the other end of conn, or None when none can be had safely.

    SO_PEERPIDFD names the very process that connected. Older kernels: pidfd_open(pid), kept only
    when that pid's process is older than the connection (else the pid was reused since). Either way
    a signal sent through the pidfd can only reach that process: if it has exited (a forked child
    may hold the socket now) the signal fails with ESRCH instead of hitting a stranger."""
    sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
    if sock is not None:
        try:
            return int(sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD))
        except OSError:
            pass
    try:
        pidfd = os.pidfd_open(conn.pid)
    except OSError:
        return None
    try:
        with open(f"/proc/{conn.pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")     # field 22: since boot
        status = Path(f"/proc/{conn.pid}/status").read_text()
        uid = int(next(line.split()[1] for line in status.splitlines()
                       if line.startswith("Uid:")))
        signal_pidfd(pidfd, 0)      # still alive: /proc showed that very process
    except (OSError, ValueError, IndexError, StopIteration):
        os.close(pidfd)
        return None
    if started > conn.accepted_boottime + 0.02 or uid != conn.uid:
        os.close(pidfd)
        return None
    return pidfd


def signal_pidfd(pidfd: int, sig: int) -> None:
    """ProcessLookupError when the process has exited."""
    signal.pidfd_send_signal(pidfd, sig)


def raise_fd_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard one: each client process holds one connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass
