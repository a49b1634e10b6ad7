"""Peer credentials and malformed frames: refusals reach only the offending connection."""
from __future__ import annotations

import os
import socket
import struct

import pytest

from helpers_daemon import GPU0, NOBODY, OTHER, as_uid, healthy
from lockclient import connect_and_register, gpu_frame, register_frame
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C


def request_status(path: str, data: bytes) -> int:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(path)
    sock.sendall(data)
    return int(proto.recv_frame(sock).body().status)


@pytest.fixture
def sched(scheduler_factory):
    s = scheduler_factory(scheduling_mode="concurrent")
    s.client().register_job(1, uid=0, gid=0, gpu_index=[0])
    s.client().register_job(2, uid=NOBODY, gid=NOBODY, gpu_index=[0])
    return s


def test_only_root_registers_jobs(sched):
    frame = proto.encode(C.NVSHARE_MSG_JOB_REGISTER, {"job_id": 9, "uid": NOBODY, "gid": NOBODY,
                                                      "slots": 1})
    assert as_uid(NOBODY, lambda: request_status(sched.socket, frame)) == C.NVSHARE_ERR_PERM
    unreg = proto.encode(C.NVSHARE_MSG_JOB_UNREGISTER, {"job_id": 2})
    assert as_uid(NOBODY, lambda: request_status(sched.socket, unreg)) == C.NVSHARE_ERR_PERM
    assert sorted(j["job_id"] for j in sched.client().status(C.NVSHARE_STATUS_JOBS)["jobs"]) \
        == [1, 2]
    assert "registration by uid 65534" in sched.log()


def test_client_attaches_only_to_its_own_uids_job(sched):
    def attach(job_id: int) -> int:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect(sched.socket)
        sock.sendall(register_frame(job_id, 0, os.getpid()))
        return int(proto.recv_frame(sock).body().status)

    assert as_uid(NOBODY, lambda: attach(2)) == C.NVSHARE_OK
    assert as_uid(OTHER, lambda: attach(2)) == C.NVSHARE_ERR_PERM
    assert as_uid(NOBODY, lambda: attach(1)) == C.NVSHARE_ERR_PERM
    assert as_uid(NOBODY, lambda: attach(99)) == C.NVSHARE_ERR_NOJOB
    healthy(sched)


def test_client_pid_must_be_the_peer(sched):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sched.socket)
    sock.sendall(register_frame(1, 0, os.getpid() + 1))
    assert proto.recv_frame(sock).body().status == C.NVSHARE_ERR_PERM
    healthy(sched)


def test_admin_update_needs_root_or_slurm_user(sched):
    frame = proto.encode(C.NVSHARE_MSG_ADMIN_UPDATE, {
        "gpu": "all", "mode": C.NVSHARE_MODE_SERIAL, "switch_mode": C.NVSHARE_KEEP,
        "switch_time_ms": C.NVSHARE_KEEP, "memory_reserve_percent": C.NVSHARE_KEEP,
        "max_runtime_sec": C.NVSHARE_KEEP})
    assert as_uid(NOBODY, lambda: request_status(sched.socket, frame)) == C.NVSHARE_ERR_PERM
    assert all(g["mode"] == "concurrent" for g in sched.client().status()["gpus"])
    assert request_status(sched.socket, frame) == C.NVSHARE_OK
    assert all(g["mode"] == "serial" for g in sched.client().status()["gpus"])


def _hdr(msg_type: int, length: int, magic: int = proto.MAGIC, version: int = proto.VERSION):
    return struct.pack("=IHHII", magic, version, msg_type, length, 0)


EVENT_SIZE = proto.sizeof("nvshare_gpu_event")
MALFORMED = {
    "bad magic": _hdr(C.NVSHARE_MSG_HEARTBEAT, 8, magic=0xDEADBEEF) + b"\0" * 8,
    "bad version": _hdr(C.NVSHARE_MSG_HEARTBEAT, 8, version=99) + b"\0" * 8,
    "unknown type": _hdr(999, 0),
    "over-long length": _hdr(C.NVSHARE_MSG_HEARTBEAT, proto.MAX_PAYLOAD + 1),
    "wrong payload size": _hdr(C.NVSHARE_MSG_HEARTBEAT, 4) + b"\0" * 4,
    "truncated frame": _hdr(C.NVSHARE_MSG_LOCK_REQUEST, EVENT_SIZE) + b"\0" * 10,
    "truncated header": _hdr(C.NVSHARE_MSG_HEARTBEAT, 8)[:7],
    "garbage": os.urandom(64),
    "daemon-only type": proto.encode(C.NVSHARE_MSG_LOCK_GRANT, {"gpu_uuid": GPU0}),
    "lock request before register": gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0),
    "mem update before register": proto.encode(C.NVSHARE_MSG_MEM_UPDATE, {"gpu_uuid": GPU0}),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_frame_closes_only_that_connection(sched, kind):
    # a holder on another connection must keep its lock through the bad frame
    holder, body = connect_and_register(sched.socket, 1)
    holder.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0))
    assert proto.recv_frame(holder).type == C.NVSHARE_MSG_LOCK_GRANT
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bad.settimeout(5)
    bad.connect(sched.socket)
    bad.sendall(MALFORMED[kind])
    bad.shutdown(socket.SHUT_WR)
    assert bad.recv(4096) == b""             # closed, and nothing sent back
    bad.close()
    holders = sched.client().status()["gpus"][0]["holders"]
    assert [h["pid"] for h in holders] == [os.getpid()]
    holder.close()
    healthy(sched)
    assert "closing it" in sched.log()


def test_second_client_register_on_one_connection_is_refused(sched):
    sock, body = connect_and_register(sched.socket, 1)
    sock.sendall(register_frame(1, 0, os.getpid()))
    assert sock.recv(4096) == b""
    healthy(sched)
