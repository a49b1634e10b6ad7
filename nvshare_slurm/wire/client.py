"""The synchronous client of nvshare-scheduler: prolog, epilog, taskprolog, nvshare-status, tests.

Each call opens one connection, sends one request and reads its one reply. It imports nothing slow:
the TaskProlog asks for every task where its job runs (query_job). The frames are wire.py's, and
the socket is _socket's: socket.py builds its enums at import, ~5 ms of every task's start.
"""
from __future__ import annotations

import _socket
import errno
import time

from .wire import C, Frame, ProtocolError, class_flag, encode, recv_frame, status_name, \
    status_tail, text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class DaemonUnavailable(Exception):
    """The daemon's socket cannot be reached (not running, or wrong path)."""


class RequestFailed(Exception):
    """The daemon answered with a non-zero status."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status_name(status)}: {message}")
        self.status = status
        self.message = message


# The daemon is there but cannot take the connection yet: its listen backlog is full. (A daemon
# that is not running or restarting, ECONNREFUSED or ENOENT, is the callers' to wait for:
# jobenv.with_daemon; nvshare-status says so at once.)
_RETRY_CONNECT = (errno.EAGAIN, errno.EINTR)


def connect(socket_path: str, timeout: float, connect_wait: float) -> _socket.socket:
    """A connected socket, retrying a full backlog for connect_wait seconds; DaemonUnavailable."""
    deadline = time.monotonic() + connect_wait
    delay = 0.01
    while True:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno not in _RETRY_CONNECT or time.monotonic() + delay > deadline:
                raise DaemonUnavailable(
                    f"cannot reach nvshare-scheduler at {socket_path}: "
                    f"{exc.strerror or exc}") from None
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


class Client:
    def __init__(self, socket_path: str, timeout: float = 10.0, connect_wait: float | None = None):
        self.socket_path = socket_path
        self.timeout = timeout
        self.connect_wait = timeout if connect_wait is None else connect_wait
        self._seq = 0

    def _connect(self) -> _socket.socket:
        return connect(self.socket_path, self.timeout, self.connect_wait)

    def request(self, msg_type: int, fields: dict[str, Any] | None = None) -> Frame:
        """The daemon's reply frame, its payload's size checked: DaemonUnavailable, or
        ProtocolError for a malformed one."""
        self._seq += 1
        data = encode(msg_type, fields, seq=self._seq)
        sock = self._connect()
        try:
            sock.sendall(data)
            return recv_frame(sock)
        except (OSError, ConnectionError) as exc:
            raise DaemonUnavailable(f"nvshare-scheduler at {self.socket_path}: {exc}") from None
        finally:
            sock.close()

    @staticmethod
    def _check(status: int, message: bytes) -> None:
        if status != C.NVSHARE_OK:
            raise RequestFailed(status, text(message))

    def register_job(self, job_id: int, uid: int, gid: int, slots: int = 0,
                     gpu_index: list[int] | None = None, name: str = "", user: str = "",
                     share_class: str = "normal",
                     class_reason: str = "", multinode: bool = False) -> dict[str, Any]:
        """Register a job (root only); returns the placement {gpu_uuid: [...], gpu_index: [...]}.
        multinode: the job holds nvshare GPUs on other nodes too (NVSHARE_JOB_MULTINODE)."""
        gpus = list(gpu_index or [])
        flags = (C.NVSHARE_JOB_GPUS_GIVEN if gpus else 0) | class_flag(share_class) \
            | (C.NVSHARE_JOB_MULTINODE if multinode else 0)
        fields = {"job_id": job_id, "uid": uid, "gid": gid, "slots": slots, "n_gpus": len(gpus),
                  "gpu_index": gpus, "flags": flags,
                  "name": _fit(name, C.NVSHARE_NAME_LEN),
                  "user": _fit(user, C.NVSHARE_USER_LEN),
                  "class_reason": _fit(class_reason, C.NVSHARE_REASON_LEN)}
        return self._job_reply(self.request(C.NVSHARE_MSG_JOB_REGISTER, fields))

    def query_job(self, job_id: int) -> dict[str, Any]:
        """The job's placement {gpu_uuid: [...], gpu_index: [...]}; DaemonUnavailable,
        RequestFailed (NVSHARE_ERR_NOJOB: not an nvshare job here) or ProtocolError for a
        malformed reply."""
        return self._job_reply(self.request(C.NVSHARE_MSG_JOB_QUERY, {"job_id": job_id}))

    def _job_reply(self, frame: Frame) -> dict[str, Any]:
        body = frame.body()
        if frame.type == C.NVSHARE_MSG_REPLY:
            self._check(body.status, body.message)
            raise RequestFailed(C.NVSHARE_ERR_PROTO, "REPLY where JOB_REPLY was expected")
        if frame.type != C.NVSHARE_MSG_JOB_REPLY:
            raise ProtocolError(f"message type {frame.type} where JOB_REPLY was expected")
        self._check(body.status, body.message)
        n = body.n_gpus
        if n > C.NVSHARE_MAX_GPUS:
            raise ProtocolError(f"JOB_REPLY names {n} GPUs, more than {C.NVSHARE_MAX_GPUS}")
        return {"gpu_uuid": [text(u) for u in body.gpu_uuid[:n]],
                "gpu_index": [int(i) for i in body.gpu_index[:n]]}

    def unregister_job(self, job_id: int) -> str:
        body = self.request(C.NVSHARE_MSG_JOB_UNREGISTER, {"job_id": job_id}).body()
        self._check(body.status, body.message)
        return text(body.message)

    def status(self, what: int = C.NVSHARE_STATUS_GPUS, job_id: int = 0) -> Any:
        import json
        frame = self.request(C.NVSHARE_MSG_STATUS_QUERY, {"what": what, "job_id": job_id})
        body = frame.body()
        if frame.type == C.NVSHARE_MSG_REPLY:
            self._check(body.status, body.message)
        if body.status != C.NVSHARE_OK:
            raise RequestFailed(body.status, status_tail(frame.payload))
        return json.loads(status_tail(frame.payload))

    def admin_update(self, gpu: str, **changes: int) -> str:
        fields: dict[str, Any] = {"gpu": gpu}
        for key in ("mode", "switch_mode", "switch_time_ms", "memory_reserve_percent",
                    "max_runtime_sec"):
            fields[key] = changes.get(key, C.NVSHARE_KEEP)
        body = self.request(C.NVSHARE_MSG_ADMIN_UPDATE, fields).body()
        self._check(body.status, body.message)
        return text(body.message)


def query_job(socket_path: str, job_id: int, timeout: float = 10.0,
              connect_wait: float | None = None) -> dict[str, Any]:
    """Client.query_job on one connection: the TaskProlog's call."""
    return Client(socket_path, timeout, connect_wait).query_job(job_id)


def _fit(value: str, size: int) -> str:
    """Cut a string to fit a NUL-terminated char[size] without splitting a UTF-8 sequence."""
    raw = value.encode("utf-8", "replace")[: size - 1]
    return raw.decode("utf-8", "ignore")
