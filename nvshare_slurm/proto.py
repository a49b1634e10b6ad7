"""The wire format, read from csrc/nvshare_proto.h through cffi so that C and Python cannot drift.

A frame is `struct nvshare_hdr` then `length` payload bytes. `decode_header` refuses a bad magic,
version, type or length with ProtocolError; the caller closes that one connection.
"""
from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cffi

from . import wire
from .wire import ProtocolError, cdef_block as _cdef_block, recv_exact as _recv_exact, wire_format


def header_path() -> Path:
    """The installed copy of the header (package data), else the source tree's csrc/."""
    return Path(wire.header_path())


ffi = cffi.FFI()
ffi.cdef(_cdef_block(header_path().read_text()))
C: Any = ffi.dlopen(None)  # integer #defines and enum values

MAGIC: int = C.NVSHARE_MAGIC
VERSION: int = C.NVSHARE_PROTO_VERSION
HDR_SIZE: int = ffi.sizeof("struct nvshare_hdr")
MAX_PAYLOAD: int = C.NVSHARE_MAX_PAYLOAD
assert HDR_SIZE == C.NVSHARE_HDR_SIZE

# message type number -> (name, payload struct or None for variable payloads)
MSG_STRUCT: dict[int, str] = {
    C.NVSHARE_MSG_CLIENT_REGISTER: "struct nvshare_client_register",
    C.NVSHARE_MSG_CLIENT_REGISTER_REPLY: "struct nvshare_client_register_reply",
    C.NVSHARE_MSG_LOCK_REQUEST: "struct nvshare_gpu_event",
    C.NVSHARE_MSG_LOCK_GRANT: "struct nvshare_gpu_event",
    C.NVSHARE_MSG_LOCK_CONTENDED: "struct nvshare_gpu_event",
    C.NVSHARE_MSG_DROP_LOCK: "struct nvshare_gpu_event",
    C.NVSHARE_MSG_LOCK_RELEASED: "struct nvshare_gpu_event",
    C.NVSHARE_MSG_MEM_UPDATE: "struct nvshare_mem_update",
    C.NVSHARE_MSG_MEM_REPLY: "struct nvshare_mem_reply",
    C.NVSHARE_MSG_WAIT_FOR_MEM: "struct nvshare_gpu_event",
    C.NVSHARE_MSG_MEM_AVAILABLE: "struct nvshare_gpu_event",
    C.NVSHARE_MSG_PREPARE_SWAP_OUT: "struct nvshare_gpu_event",
    C.NVSHARE_MSG_DRAIN_STUCK: "struct nvshare_gpu_event",
    C.NVSHARE_MSG_DEMAND: "struct nvshare_demand",
    C.NVSHARE_MSG_BURST_PAGE: "struct nvshare_gpu_event",   # with the page's fd (SCM_RIGHTS)
    C.NVSHARE_MSG_HANDOFF: "struct nvshare_gpu_event",      # with an eventfd (SCM_RIGHTS)
    C.NVSHARE_MSG_JOB_REGISTER: "struct nvshare_job_register",
    C.NVSHARE_MSG_JOB_UNREGISTER: "struct nvshare_job_id",
    C.NVSHARE_MSG_JOB_QUERY: "struct nvshare_job_id",
    C.NVSHARE_MSG_JOB_REPLY: "struct nvshare_job_reply",
    C.NVSHARE_MSG_STATUS_QUERY: "struct nvshare_status_query",
    C.NVSHARE_MSG_STATUS_REPLY: "struct nvshare_status_reply",  # followed by JSON text
    C.NVSHARE_MSG_ADMIN_UPDATE: "struct nvshare_admin_update",
    C.NVSHARE_MSG_REPLY: "struct nvshare_reply",
    C.NVSHARE_MSG_HEARTBEAT: "struct nvshare_heartbeat",
    C.NVSHARE_MSG_DEVICE_OPEN: "struct nvshare_device_open",   # REPLY carries the device's fd
}
VARIABLE_TAIL = {C.NVSHARE_MSG_STATUS_REPLY}

MSG_NAME: dict[int, str] = {
    getattr(C, n): n[len("NVSHARE_MSG_"):] for n in dir(C) if n.startswith("NVSHARE_MSG_")
}


@dataclass
class Frame:
    type: int
    seq: int
    payload: bytes

    @property
    def name(self) -> str:
        return MSG_NAME.get(self.type, str(self.type))

    def body(self) -> Any:
        """The payload as a cffi struct (a copy); ProtocolError if its size is wrong."""
        return unpack(self.type, self.payload)


def pack_header(msg_type: int, length: int, seq: int = 0) -> bytes:
    hdr = ffi.new("struct nvshare_hdr *", {"magic": MAGIC, "version": VERSION, "type": msg_type,
                                          "length": length, "seq": seq})
    return bytes(ffi.buffer(hdr))


def decode_header(data: bytes) -> tuple[int, int, int]:
    """(type, length, seq) of a header, or ProtocolError naming what is wrong."""
    return wire_format().decode_header(data)


def new(msg_type: int, fields: dict[str, Any] | None = None) -> Any:
    """A zeroed payload struct for msg_type; str values are encoded and NUL-padded (and must fit)."""
    struct_name = MSG_STRUCT[msg_type]
    obj = ffi.new(struct_name + " *")
    for key, value in (fields or {}).items():
        set_field(obj, key, value)
    return obj


def set_field(obj: Any, key: str, value: Any) -> None:
    if isinstance(value, (str, bytes)):
        raw = value.encode() if isinstance(value, str) else value   # bytes: echoed as received
        size = ffi.sizeof(getattr(obj, key))
        if len(raw) >= size:
            raise ValueError(f"{key}: {len(raw)} bytes do not fit in {size - 1}")
        ffi.memmove(getattr(obj, key), raw, len(raw))
    elif isinstance(value, (list, tuple)):
        arr = getattr(obj, key)
        if len(value) > len(arr):
            raise ValueError(f"{key}: {len(value)} entries do not fit in {len(arr)}")
        for i, item in enumerate(value):
            if isinstance(item, str):
                raw = item.encode()
                if len(raw) >= ffi.sizeof(arr[i]):
                    raise ValueError(f"{key}[{i}]: too long")
                ffi.memmove(arr[i], raw, len(raw))
            else:
                arr[i] = item
    else:
        setattr(obj, key, value)


def text(field: Any) -> str:
    """A NUL-padded char[] as str; undecodable bytes are replaced, never raised."""
    return ffi.string(field).decode("utf-8", "replace")


def raw(field: Any) -> bytes:
    """A NUL-padded char[] as the bytes a peer sent, to echo back unchanged."""
    return ffi.string(field)


def encode(msg_type: int, fields: dict[str, Any] | None = None, seq: int = 0,
           tail: bytes = b"") -> bytes:
    obj = new(msg_type, fields)
    payload = bytes(ffi.buffer(obj)) + tail
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD}")
    return pack_header(msg_type, len(payload), seq) + payload


def unpack(msg_type: int, payload: bytes) -> Any:
    struct_name = MSG_STRUCT[msg_type]
    size = ffi.sizeof(struct_name)
    if len(payload) != size and not (msg_type in VARIABLE_TAIL and len(payload) >= size):
        raise ProtocolError(f"{MSG_NAME[msg_type]} payload is {len(payload)} bytes, expected {size}")
    obj = ffi.new(struct_name + " *")
    ffi.memmove(obj, payload[:size], size)
    return obj


def to_dict(obj: Any) -> dict[str, Any]:
    """A cffi struct as plain Python values (char arrays as str), for logs and JSON."""
    out: dict[str, Any] = {}
    ctype = ffi.typeof(obj).item if ffi.typeof(obj).kind == "pointer" else ffi.typeof(obj)
    for name, field in ctype.fields:
        value = getattr(obj, name)
        if field.type.kind == "array":
            if field.type.item.cname == "char":
                out[name] = text(value)
            elif field.type.item.kind == "array":
                out[name] = [text(v) for v in value]
            else:
                out[name] = list(value)
        else:
            out[name] = value
    return out


def status_tail(reply_payload: bytes) -> str:
    """The JSON text that follows struct nvshare_status_reply."""
    body = unpack(C.NVSHARE_MSG_STATUS_REPLY, reply_payload)
    size = ffi.sizeof("struct nvshare_status_reply")
    tail = reply_payload[size:size + body.json_length]
    if len(tail) != body.json_length:
        raise ProtocolError("STATUS_REPLY shorter than its json_length")
    return tail.decode("utf-8")


# --- reading frames -------------------------------------------------------------------------

async def read_frame(reader: asyncio.StreamReader) -> Frame | None:
    """The next frame, None at a clean end of stream, ProtocolError for anything malformed."""
    try:
        head = await reader.readexactly(HDR_SIZE)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ProtocolError(f"connection closed inside a header ({len(exc.partial)} bytes)") from exc
    msg_type, length, seq = decode_header(head)
    try:
        payload = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError(f"connection closed inside a {MSG_NAME[msg_type]} payload") from exc
    frame = Frame(msg_type, seq, payload)
    frame.body()  # size check now, so handlers never see a short payload
    return frame


def recv_frame(sock: socket.socket) -> Frame:
    """Blocking read of one frame from a socket (for the small synchronous clients)."""
    msg_type, length, seq = decode_header(_recv_exact(sock, HDR_SIZE))
    frame = Frame(msg_type, seq, _recv_exact(sock, length))
    frame.body()
    return frame


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    # struct ucred: pid_t is signed, uid_t and gid_t are unsigned (uids above 2**31 exist).
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
    pid, uid, gid = struct.unpack("iII", creds)
    return pid, uid, gid


def status_name(code: int) -> str:
    return wire_format().status_name(code)


__all__ = ["C", "Frame", "ProtocolError", "decode_header", "encode", "ffi", "new", "read_frame",
           "recv_frame", "text", "to_dict", "unpack", "peer_credentials", "status_tail"]


def class_flag(share_class: str) -> int:
    """NVSHARE_JOB_CLASS_* bits of nvshare_job_register.flags for a class name."""
    return {"high": C.NVSHARE_JOB_CLASS_HIGH, "low": C.NVSHARE_JOB_CLASS_LOW}.get(
        share_class, C.NVSHARE_JOB_CLASS_NORMAL)


def class_of_flags(flags: int) -> str | None:
    """The class name in nvshare_job_register.flags; None for the reserved value."""
    return {C.NVSHARE_JOB_CLASS_NORMAL: "normal", C.NVSHARE_JOB_CLASS_HIGH: "high",
            C.NVSHARE_JOB_CLASS_LOW: "low"}.get(flags & C.NVSHARE_JOB_CLASS_MASK)
