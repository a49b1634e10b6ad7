"""Asking nvshare-scheduler where a job runs (JOB_QUERY), with nothing slow to import.

The TaskProlog runs this before every task of every step; client.Client.query_job is the same call.
The frames come from wire.py (the header read with the struct module, not cffi) and the socket is
_socket's: socket.py builds its enums at import, ~5 ms of every task's start.
"""
from __future__ import annotations

import _socket
import errno
import time

from .wire import ProtocolError, recv_exact, wire_format

# Which struct each message of this exchange carries (proto.MSG_STRUCT; a test keeps them equal).
QUERY_STRUCT = "nvshare_job_id"
JOB_REPLY_STRUCT = "nvshare_job_reply"
REPLY_STRUCT = "nvshare_reply"


class DaemonUnavailable(Exception):
    """The daemon's socket cannot be reached (not running, or wrong path)."""


class RequestFailed(Exception):
    """The daemon answered with a non-zero status."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{wire_format().status_name(status)}: {message}")
        self.status = status
        self.message = message


# The daemon is there but cannot take the connection yet: its listen backlog is full. (A daemon
# that is not running or restarting, ECONNREFUSED or ENOENT, is the callers' to wait for:
# prolog.with_daemon; nvshare-status says so at once.)
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


def text(raw: object) -> str:
    """A char[] field's bytes as str; undecodable bytes are replaced, never raised."""
    return bytes(raw).decode("utf-8", "replace")  # type: ignore[call-overload]


def query_job(socket_path: str, job_id: int, timeout: float = 10.0,
              connect_wait: float | None = None, seq: int = 1) -> dict[str, list]:
    """The job's placement {gpu_uuid: [...], gpu_index: [...]}; DaemonUnavailable, RequestFailed
    (NVSHARE_ERR_NOJOB: not an nvshare job here) or ProtocolError for a malformed reply."""
    fmt = wire_format()
    c = fmt.constants
    request = fmt.encode(c["NVSHARE_MSG_JOB_QUERY"], QUERY_STRUCT, {"job_id": job_id}, seq)
    sock = connect(socket_path, timeout, timeout if connect_wait is None else connect_wait)
    try:
        sock.sendall(request)
        msg_type, length, _ = fmt.decode_header(recv_exact(sock, fmt.hdr.size))
        payload = recv_exact(sock, length)
    except (OSError, ConnectionError) as exc:
        raise DaemonUnavailable(f"nvshare-scheduler at {socket_path}: {exc}") from None
    finally:
        sock.close()
    if msg_type == c["NVSHARE_MSG_REPLY"]:
        body = fmt.structs[REPLY_STRUCT].unpack(payload)
        if body["status"] != c["NVSHARE_OK"]:
            raise RequestFailed(body["status"], text(body["message"]))  # type: ignore[arg-type]
        raise RequestFailed(c["NVSHARE_ERR_PROTO"], "REPLY where JOB_REPLY was expected")
    if msg_type != c["NVSHARE_MSG_JOB_REPLY"]:
        raise ProtocolError(f"message type {msg_type} where JOB_REPLY was expected")
    body = fmt.structs[JOB_REPLY_STRUCT].unpack(payload)
    if body["status"] != c["NVSHARE_OK"]:
        raise RequestFailed(body["status"], text(body["message"]))  # type: ignore[arg-type]
    n = int(body["n_gpus"])  # type: ignore[call-overload]
    if n > c["NVSHARE_MAX_GPUS"]:
        raise ProtocolError(f"JOB_REPLY names {n} GPUs, more than {c['NVSHARE_MAX_GPUS']}")
    uuids, indices = body["gpu_uuid"], body["gpu_index"]
    return {"gpu_uuid": [text(u) for u in uuids[:n]],  # type: ignore[index]
            "gpu_index": [int(i) for i in indices[:n]]}  # type: ignore[index]

