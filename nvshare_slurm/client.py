"""A small synchronous client of nvshare-scheduler: prolog, epilog, taskprolog, nvshare-status, tests.

Each call opens one connection, sends one request and reads its one reply.
"""
from __future__ import annotations

import json
from typing import Any

from . import jobquery, proto
from .jobquery import DaemonUnavailable, RequestFailed
from .proto import C


class Client:
    def __init__(self, socket_path: str, timeout: float = 10.0, connect_wait: float | None = None):
        self.socket_path = socket_path
        self.timeout = timeout
        self.connect_wait = timeout if connect_wait is None else connect_wait
        self._seq = 0

    def _connect(self):
        return jobquery.connect(self.socket_path, self.timeout, self.connect_wait)

    def request(self, msg_type: int, fields: dict[str, Any] | None = None) -> proto.Frame:
        self._seq += 1
        sock = self._connect()
        try:
            sock.sendall(proto.encode(msg_type, fields, seq=self._seq))
            return proto.recv_frame(sock)
        except (OSError, ConnectionError) as exc:
            raise DaemonUnavailable(f"nvshare-scheduler at {self.socket_path}: {exc}") from None
        finally:
            sock.close()

    @staticmethod
    def _check(status: int, message: Any) -> None:
        if status != C.NVSHARE_OK:
            raise RequestFailed(status, proto.text(message))

    def register_job(self, job_id: int, uid: int, gid: int, slots: int = 0,
                     gpu_index: list[int] | None = None, name: str = "", user: str = "",
                     mem_limit: int = 0, share_class: str = "normal",
                     class_reason: str = "") -> dict[str, Any]:
        """Register a job (root only); returns the placement {gpu_uuid: [...], gpu_index: [...]}."""
        gpus = list(gpu_index or [])
        flags = (C.NVSHARE_JOB_GPUS_GIVEN if gpus else 0) | proto.class_flag(share_class)
        fields = {"job_id": job_id, "uid": uid, "gid": gid, "slots": slots, "n_gpus": len(gpus),
                  "gpu_index": gpus, "flags": flags,
                  "mem_limit": mem_limit, "name": _fit(name, C.NVSHARE_NAME_LEN),
                  "user": _fit(user, C.NVSHARE_USER_LEN),
                  "class_reason": _fit(class_reason, C.NVSHARE_REASON_LEN)}
        return self._job_reply(self.request(C.NVSHARE_MSG_JOB_REGISTER, fields))

    def query_job(self, job_id: int) -> dict[str, Any]:
        self._seq += 1
        return jobquery.query_job(self.socket_path, job_id, self.timeout, self.connect_wait,
                                  seq=self._seq)

    def _job_reply(self, frame: proto.Frame) -> dict[str, Any]:
        if frame.type == C.NVSHARE_MSG_REPLY:
            body = frame.body()
            self._check(body.status, body.message)
            raise RequestFailed(C.NVSHARE_ERR_PROTO, "REPLY where JOB_REPLY was expected")
        body = frame.body()
        self._check(body.status, body.message)
        n = body.n_gpus
        return {"gpu_uuid": [proto.text(body.gpu_uuid[i]) for i in range(n)],
                "gpu_index": [int(body.gpu_index[i]) for i in range(n)]}

    def unregister_job(self, job_id: int) -> str:
        body = self.request(C.NVSHARE_MSG_JOB_UNREGISTER, {"job_id": job_id}).body()
        self._check(body.status, body.message)
        return proto.text(body.message)

    def status(self, what: int = C.NVSHARE_STATUS_GPUS, job_id: int = 0) -> Any:
        frame = self.request(C.NVSHARE_MSG_STATUS_QUERY, {"what": what, "job_id": job_id})
        body = frame.body()
        if frame.type == C.NVSHARE_MSG_REPLY:
            self._check(body.status, body.message)
        if body.status != C.NVSHARE_OK:
            raise RequestFailed(body.status, proto.status_tail(frame.payload))
        return json.loads(proto.status_tail(frame.payload))

    def admin_update(self, gpu: str, **changes: int) -> str:
        fields: dict[str, Any] = {"gpu": gpu}
        for key in ("mode", "switch_mode", "switch_time_ms", "memory_reserve_percent",
                    "max_runtime_sec"):
            fields[key] = changes.get(key, C.NVSHARE_KEEP)
        body = self.request(C.NVSHARE_MSG_ADMIN_UPDATE, fields).body()
        self._check(body.status, body.message)
        return proto.text(body.message)


def _fit(value: str, size: int) -> str:
    """Cut a string to fit a NUL-terminated char[size] without splitting a UTF-8 sequence."""
    raw = value.encode("utf-8", "replace")[: size - 1]
    return raw.decode("utf-8", "ignore")

