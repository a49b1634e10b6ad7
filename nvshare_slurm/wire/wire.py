"""The wire format of csrc/nvshare_proto.h, and the one codec for its frames.

Constants, struct layouts and which struct each message carries are read from the header's text
(the block between its NVSHARE_CDEF markers) with the struct module, so that C and Python cannot
drift: tests/unit/test_proto.py checks every layout against the C compiler's offsets. It imports nothing
slow (the TaskProlog, which runs before every task, uses it); the daemon reads frames off its
streams through proto.py.

A frame is `struct nvshare_hdr` then `length` payload bytes. `decode_header` refuses a bad magic,
version, type or length with ProtocolError; the caller closes that one connection. A payload is
read into a Body: each field an attribute, numbers as int (arrays as lists), char arrays as the
bytes before their first NUL (`text` decodes them).

The block for Python holds only integer #defines, enums and structs of fixed-width fields with
literal array sizes, naturally aligned (see the header's first comment), and each message type's
comment in enum nvshare_msg_type names its payload struct first: that is all this reads.
"""
from __future__ import annotations

import os
import re
import struct
from functools import cached_property

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_HEADER_NAME = "nvshare_proto.h"
# C type -> struct code; char arrays become bytes ("s"), the last dimension their length.
_CODES = {"char": "s", "int8_t": "b", "uint8_t": "B", "int16_t": "h", "uint16_t": "H",
          "int32_t": "i", "uint32_t": "I", "int64_t": "q", "uint64_t": "Q"}
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_DEFINE = re.compile(r"^#define\s+(\w+)\s+(-?(?:0x[0-9A-Fa-f]+|\d+))\s*$", re.M)
_ENUM = re.compile(r"enum\s+(\w+)\s*\{(.*?)\};", re.S)
_ENUM_ITEM = re.compile(r"(\w+)\s*=\s*(-?\d+)")
# A message type, then its comment, whose first `struct x` is the payload's.
_MSG_ITEM = re.compile(r"(NVSHARE_MSG_\w+)\s*=\s*\d+\s*,?\s*/\*(.*?)\*/", re.S)
_STRUCT = re.compile(r"struct\s+(\w+)\s*\{(.*?)\};", re.S)
_FIELD = re.compile(r"^\s*(\w+)\s+(\w+)((?:\s*\[\d+\])*)\s*;\s*$")


class ProtocolError(Exception):
    """A frame that breaks the wire format; the connection it came on must be closed."""


def header_path() -> str:
    """The installed copy of the header (package data), else the source tree's csrc/."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the package, above wire/
    for candidate in (os.path.join(here, _HEADER_NAME),
                      os.path.join(os.path.dirname(here), "csrc", _HEADER_NAME)):
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(f"nvshare: {_HEADER_NAME} is neither in the package nor in csrc/")


def cdef_block(text: str) -> str:
    """The part of the header meant for Python."""
    try:
        return text.split("/* NVSHARE_CDEF_BEGIN */", 1)[1].split("/* NVSHARE_CDEF_END */", 1)[0]
    except IndexError as exc:
        raise RuntimeError("nvshare: nvshare_proto.h lacks its NVSHARE_CDEF markers") from exc


def recv_exact(sock: Any, size: int) -> bytes:
    """Exactly size bytes from a blocking socket; ConnectionError when the peer closes first."""
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("nvshare-scheduler closed the connection")
        chunks += chunk
    return bytes(chunks)


class Field:
    """One field: byte offset and size, struct code, array dimensions, and where its values sit
    in the layout's flat tuple (start, count)."""
    __slots__ = ("name", "offset", "code", "dims", "size", "start", "count")

    def __init__(self, name: str, offset: int, code: str, dims: tuple[int, ...], size: int):
        self.name, self.offset, self.code, self.dims, self.size = name, offset, code, dims, size
        self.start, self.count = 0, 1


class Body:
    """A payload's fields as attributes (Layout.body)."""

    def __init__(self, values: dict[str, Any]):
        self.__dict__.update(values)

    if TYPE_CHECKING:
        # The fields are the message's struct's, known at run time only: any name reads as Any.
        # Checkers only; at run time a missing field is AttributeError as on any object.
        def __getattr__(self, name: str) -> Any: ...

    def __repr__(self) -> str:
        return f"Body({self.__dict__!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Body) and self.__dict__ == other.__dict__


class Layout:
    """One struct: its size and fields at their offsets, packed and unpacked with one precompiled
    struct.Struct (padding as pad bytes)."""

    def __init__(self, name: str, size: int, fields: list[Field]):
        self.name, self.size, self.fields = name, size, fields
        self.by_name = {f.name: f for f in fields}
        fmt, at, start = "=", 0, 0
        for f in fields:
            fmt += "x" * (f.offset - at)
            if f.code == "s":
                f.count = f.size // f.dims[-1]
                fmt += f"{f.dims[-1]}s" * f.count
            else:
                f.count = f.size // struct.calcsize(f.code)
                fmt += f.code * f.count
            f.start, at, start = start, f.offset + f.size, start + f.count
        self._format = fmt + "x" * (size - at)

    # Both made at first use: the TaskProlog uses three of the header's structs.
    @cached_property
    def _struct(self) -> struct.Struct:
        return struct.Struct(self._format)

    @cached_property
    def _zero(self) -> tuple[Any, ...]:
        return tuple(b"" if f.code == "s" else 0 for f in self.fields for _ in range(f.count))

    def pack(self, values: dict[str, Any]) -> bytes:
        """The struct's bytes: fields not given are zero; text (str, or bytes as received) must
        fit with its NUL; arrays may be shorter than the field."""
        flat = list(self._zero)
        for key, value in values.items():
            f = self.by_name.get(key)
            if f is None:
                raise KeyError(f"struct {self.name} has no field {key!r}")
            if f.code == "s":
                length = f.dims[-1]
                if len(f.dims) == 1:
                    raw = value.encode() if isinstance(value, str) else bytes(value)
                    if len(raw) >= length:
                        raise ValueError(f"{key}: {len(raw)} bytes do not fit in {length - 1}")
                    flat[f.start] = raw
                    continue
                items = list(value)
                if len(f.dims) != 2 or len(items) > f.dims[0]:
                    raise ValueError(f"{key}: {len(items)} entries do not fit in {f.dims[0]}")
                for i, item in enumerate(items):
                    raw = item.encode() if isinstance(item, str) else bytes(item)
                    if len(raw) >= length:
                        raise ValueError(f"{key}[{i}]: too long ({len(raw)} bytes, at most "
                                         f"{length - 1})")
                    flat[f.start + i] = raw
            elif f.dims:
                items = list(value)
                if len(f.dims) != 1 or len(items) > f.count:
                    raise ValueError(f"{key}: {len(items)} entries do not fit in {f.count}")
                flat[f.start:f.start + len(items)] = items
            else:
                flat[f.start] = value
        try:
            return self._struct.pack(*flat)
        except struct.error as exc:     # a number out of its field's range, or not a number
            raise ValueError(f"struct {self.name}: {exc}") from None

    def unpack(self, data: bytes) -> dict[str, Any]:
        """The fields of exactly one struct: numbers as int (arrays as lists), char arrays as the
        bytes before their first NUL (arrays of them as lists)."""
        if len(data) != self.size:
            raise ProtocolError(f"struct {self.name} is {self.size} bytes, got {len(data)}")
        flat = self._struct.unpack(data)
        out: dict[str, Any] = {}
        for f in self.fields:
            if f.code == "s":
                if len(f.dims) == 1:
                    out[f.name] = flat[f.start].split(b"\0", 1)[0]
                else:
                    items = [v.split(b"\0", 1)[0] for v in flat[f.start:f.start + f.count]]
                    out[f.name] = _shape(items, f.dims[:-1])
            elif f.dims:
                out[f.name] = _shape(list(flat[f.start:f.start + f.count]), f.dims)
            else:
                out[f.name] = flat[f.start]
        return out


def _shape(items: list[Any], dims: tuple[int, ...]) -> list[Any]:
    if len(dims) == 1:
        return items
    step = len(items) // dims[0]
    return [_shape(items[i:i + step], dims[1:]) for i in range(0, len(items), step)]


class Constants:
    """The header's #defines and enum values as attributes: C.NVSHARE_OK."""

    def __init__(self, values: dict[str, int]):
        self.__dict__.update(values)


class WireFormat:
    """The header's constants (#defines and enum values), struct layouts, and each message
    type's payload struct."""

    def __init__(self, text: str):
        raw_block = cdef_block(text)
        block = _COMMENT.sub("", raw_block)
        self.constants: dict[str, int] = {n: int(v, 0) for n, v in _DEFINE.findall(block)}
        self.enums: dict[str, dict[str, int]] = {}
        for name, body in _ENUM.findall(block):
            self.enums[name] = {n: int(v) for n, v in _ENUM_ITEM.findall(body)}
            self.constants.update(self.enums[name])
        self.C = Constants(self.constants)
        self.structs: dict[str, Layout] = {}
        for name, body in _STRUCT.findall(block):
            self.structs[name] = _layout(name, body)
        self.hdr = self.structs["nvshare_hdr"]
        # The daemon decodes a header per frame: one precompiled unpack, fields in header order.
        if [f.name for f in self.hdr.fields] != ["magic", "version", "type", "length", "seq"] \
                or any(f.dims for f in self.hdr.fields):
            raise RuntimeError("nvshare: struct nvshare_hdr is not magic, version, type, length, seq")
        self._hdr_struct = self.hdr._struct
        if self.hdr.size != self.constants["NVSHARE_HDR_SIZE"]:
            raise RuntimeError("nvshare: struct nvshare_hdr is not NVSHARE_HDR_SIZE bytes")
        messages = self.enums["nvshare_msg_type"]
        self.msg_types = set(messages.values())
        self.msg_name = {value: name[len("NVSHARE_MSG_"):] for name, value in messages.items()}
        self.msg_struct: dict[int, str] = {}
        enum_text = re.search(r"enum\s+nvshare_msg_type\s*\{(.*?)\};", raw_block, re.S)
        for name, comment in _MSG_ITEM.findall(enum_text.group(1) if enum_text else ""):
            named = re.search(r"struct\s+(\w+)", comment)
            if named and named.group(1) in self.structs:
                self.msg_struct[messages[name]] = named.group(1)
        missing = sorted(n for n, v in messages.items() if v not in self.msg_struct)
        if missing:
            raise RuntimeError(f"nvshare: nvshare_proto.h names no payload struct for {missing}")
        self.variable_tail = {self.constants["NVSHARE_MSG_STATUS_REPLY"]}  # JSON after the struct
        self._magic, self._version = self.constants["NVSHARE_MAGIC"], \
            self.constants["NVSHARE_PROTO_VERSION"]
        self._max_payload = self.constants["NVSHARE_MAX_PAYLOAD"]

    def status_name(self, code: int) -> str:
        for name, value in self.enums["nvshare_status"].items():
            if value == code:
                return name[len("NVSHARE_"):]
        return str(code)

    def pack_header(self, msg_type: int, length: int, seq: int = 0) -> bytes:
        return self._hdr_struct.pack(self._magic, self._version, msg_type, length, seq)

    def encode(self, msg_type: int, values: dict[str, Any] | None = None, seq: int = 0,
               tail: bytes = b"") -> bytes:
        """A whole frame: header, the message's struct from values, then tail (STATUS_REPLY's
        JSON). ValueError for a value that does not fit or a payload over the limit."""
        payload = self.structs[self.msg_struct[msg_type]].pack(values or {}) + tail
        if len(payload) > self._max_payload:
            raise ValueError(f"payload of {len(payload)} bytes is over {self._max_payload}")
        return self.pack_header(msg_type, len(payload), seq) + payload

    def decode_header(self, data: bytes) -> tuple[int, int, int]:
        """(type, length, seq) of a header, or ProtocolError naming what is wrong."""
        if len(data) != self.hdr.size:
            raise ProtocolError(f"short header: {len(data)} bytes")
        magic, version, msg_type, length, seq = self._hdr_struct.unpack(data)
        if magic != self._magic:
            raise ProtocolError(f"bad magic 0x{magic:08x}")
        if version != self._version:
            raise ProtocolError(f"protocol version {version}, expected {self._version}")
        if length > self._max_payload:
            raise ProtocolError(f"length {length} over the limit {self._max_payload}")
        if msg_type not in self.msg_types:
            raise ProtocolError(f"unknown message type {msg_type}")
        return msg_type, length, seq

    def body(self, msg_type: int, payload: bytes) -> Body:
        """The payload's struct; ProtocolError if its size is wrong (STATUS_REPLY: too short)."""
        layout = self.structs[self.msg_struct[msg_type]]
        size = layout.size
        if len(payload) != size and not (msg_type in self.variable_tail and len(payload) >= size):
            raise ProtocolError(f"{self.msg_name[msg_type]} payload is {len(payload)} bytes, "
                                f"expected {size}")
        return Body(layout.unpack(payload[:size] if len(payload) != size else payload))


def _layout(name: str, body: str) -> Layout:
    fields, offset, align_max = [], 0, 1
    for line in body.split(";"):
        line = line.strip()
        if not line:
            continue
        match = _FIELD.match(line + ";")
        if not match or match.group(1) not in _CODES:
            raise RuntimeError(f"nvshare: struct {name}: cannot read field {line!r}")
        ctype, field_name, dims_text = match.groups()
        dims = tuple(int(d) for d in re.findall(r"\d+", dims_text))
        code = _CODES[ctype]
        elem = 1 if code == "s" else struct.calcsize(code)
        if code == "s" and not dims:
            raise RuntimeError(f"nvshare: struct {name}.{field_name}: a lone char")
        count = 1
        for d in dims:
            count *= d
        offset = -(-offset // elem) * elem          # natural alignment
        fields.append(Field(field_name, offset, code, dims, elem * count))
        offset += elem * count
        align_max = max(align_max, elem)
    return Layout(name, -(-offset // align_max) * align_max, fields)


def _read_header() -> WireFormat:
    with open(header_path(), encoding="utf-8") as fh:
        return WireFormat(fh.read())


FORMAT = _read_header()
C: Any = FORMAT.C
MAGIC: int = C.NVSHARE_MAGIC
VERSION: int = C.NVSHARE_PROTO_VERSION
HDR_SIZE: int = FORMAT.hdr.size
MAX_PAYLOAD: int = C.NVSHARE_MAX_PAYLOAD
MSG_NAME: dict[int, str] = FORMAT.msg_name
# message type -> its payload struct's name (a key of STRUCTS)
MSG_STRUCT: dict[int, str] = FORMAT.msg_struct
STRUCTS: dict[str, Layout] = FORMAT.structs
VARIABLE_TAIL = FORMAT.variable_tail
encode = FORMAT.encode
decode_header = FORMAT.decode_header
pack_header = FORMAT.pack_header
unpack = FORMAT.body
status_name = FORMAT.status_name


def wire_format() -> WireFormat:
    """The installed header's format (read once, at import)."""
    return FORMAT


def sizeof(struct_name: str) -> int:
    return STRUCTS[struct_name].size


class Frame:
    """One frame: its type, seq and payload; body() is the payload's struct."""
    __slots__ = ("type", "seq", "payload")

    def __init__(self, type: int, seq: int, payload: bytes):
        self.type, self.seq, self.payload = type, seq, payload

    def __repr__(self) -> str:
        return f"Frame({self.name}, seq={self.seq}, {len(self.payload)} bytes)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Frame) and (self.type, self.seq, self.payload) == (
            other.type, other.seq, other.payload)

    @property
    def name(self) -> str:
        return MSG_NAME.get(self.type, str(self.type))

    def body(self) -> Body:
        """The payload's struct (a new Body each call); ProtocolError if its size is wrong."""
        return FORMAT.body(self.type, self.payload)


def new(msg_type: int, fields: dict[str, Any] | None = None) -> Body:
    """The payload struct that msg_type would carry with fields: ValueError for one that does
    not fit, exactly as encode refuses it."""
    layout = STRUCTS[MSG_STRUCT[msg_type]]
    return Body(layout.unpack(layout.pack(fields or {})))


def text(field: bytes) -> str:
    """A char[] field's bytes as str; undecodable bytes are replaced, never raised."""
    return field.decode("utf-8", "replace")


def raw(field: bytes) -> bytes:
    """A char[] field as the bytes a peer sent, to echo back unchanged."""
    return field


def to_dict(body: Body) -> dict[str, Any]:
    """A payload's fields as plain values (char arrays as str), for logs and JSON."""
    out: dict[str, Any] = {}
    for name, value in body.__dict__.items():
        if isinstance(value, bytes):
            out[name] = text(value)
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            out[name] = [text(v) for v in value]
        else:
            out[name] = value
    return out


def status_tail(reply_payload: bytes) -> str:
    """The JSON text that follows struct nvshare_status_reply."""
    body = unpack(C.NVSHARE_MSG_STATUS_REPLY, reply_payload)
    size = STRUCTS["nvshare_status_reply"].size
    tail = reply_payload[size:size + body.json_length]
    if len(tail) != body.json_length:
        raise ProtocolError("STATUS_REPLY shorter than its json_length")
    return tail.decode("utf-8")


def recv_frame(sock: Any) -> Frame:
    """Blocking read of one frame from a socket (for the small synchronous clients); the payload
    is checked against its struct's size."""
    msg_type, length, seq = decode_header(recv_exact(sock, HDR_SIZE))
    frame = Frame(msg_type, seq, recv_exact(sock, length))
    frame.body()
    return frame


def class_flag(share_class: str) -> int:
    """NVSHARE_JOB_CLASS_* bits of nvshare_job_register.flags for a class name."""
    return {"high": C.NVSHARE_JOB_CLASS_HIGH, "low": C.NVSHARE_JOB_CLASS_LOW}.get(
        share_class, C.NVSHARE_JOB_CLASS_NORMAL)


def class_of_flags(flags: int) -> str | None:
    """The class name in nvshare_job_register.flags; None for the reserved value."""
    return {C.NVSHARE_JOB_CLASS_NORMAL: "normal", C.NVSHARE_JOB_CLASS_HIGH: "high",
            C.NVSHARE_JOB_CLASS_LOW: "low"}.get(flags & C.NVSHARE_JOB_CLASS_MASK)
