"""The wire format of csrc/nvshare_proto.h for the struct module: constants and struct layouts read
from the header's text, for the TaskProlog, which runs before every task and cannot afford cffi's
start-up (pycparser alone costs ~50 ms). proto.py hands the same header text to cffi; a test checks
that every layout here matches cffi's and the C compiler's.

The header's block for Python holds only integer #defines, enums and structs of fixed-width fields
with literal array sizes, naturally aligned (see its first comment): that is all this reads.
"""
from __future__ import annotations

import os
import re
import struct

_HEADER_NAME = "nvshare_proto.h"
# C type -> struct code; char arrays become bytes ("s"), the last dimension their length.
_CODES = {"char": "s", "int8_t": "b", "uint8_t": "B", "int16_t": "h", "uint16_t": "H",
          "int32_t": "i", "uint32_t": "I", "int64_t": "q", "uint64_t": "Q"}
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_DEFINE = re.compile(r"^#define\s+(\w+)\s+(-?(?:0x[0-9A-Fa-f]+|\d+))\s*$", re.M)
_ENUM = re.compile(r"enum\s+(\w+)\s*\{(.*?)\};", re.S)
_ENUM_ITEM = re.compile(r"(\w+)\s*=\s*(-?\d+)")
_STRUCT = re.compile(r"struct\s+(\w+)\s*\{(.*?)\};", re.S)
_FIELD = re.compile(r"^\s*(\w+)\s+(\w+)((?:\s*\[\d+\])*)\s*;\s*$")


class ProtocolError(Exception):
    """A frame that breaks the wire format; the connection it came on must be closed."""


def header_path() -> str:
    """The installed copy of the header (package data), else the source tree's csrc/."""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, _HEADER_NAME),
                      os.path.join(os.path.dirname(here), "csrc", _HEADER_NAME)):
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(f"nvshare: {_HEADER_NAME} is neither in the package nor in csrc/")


def cdef_block(text: str) -> str:
    """The part of the header meant for Python (cffi's cdef, and this module)."""
    try:
        return text.split("/* NVSHARE_CDEF_BEGIN */", 1)[1].split("/* NVSHARE_CDEF_END */", 1)[0]
    except IndexError as exc:
        raise RuntimeError("nvshare: nvshare_proto.h lacks its NVSHARE_CDEF markers") from exc


def recv_exact(sock, size: int) -> bytes:
    """Exactly size bytes from a blocking socket; ConnectionError when the peer closes first."""
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("nvshare-scheduler closed the connection")
        chunks += chunk
    return bytes(chunks)


class Field:
    __slots__ = ("name", "offset", "code", "dims", "size")

    def __init__(self, name: str, offset: int, code: str, dims: tuple[int, ...], size: int):
        self.name, self.offset, self.code, self.dims, self.size = name, offset, code, dims, size


class Layout:
    """One struct: its size and fields at their offsets."""

    def __init__(self, name: str, size: int, fields: list[Field]):
        self.name, self.size, self.fields = name, size, fields

    def pack(self, values: dict[str, object]) -> bytes:
        """The struct's bytes: fields not given are zero; text must fit with its NUL."""
        out = bytearray(self.size)
        known = {f.name: f for f in self.fields}
        for key, value in values.items():
            f = known[key]
            if f.code == "s":
                raw = value.encode() if isinstance(value, str) else bytes(value)  # type: ignore[union-attr]
                if len(f.dims) != 1 or len(raw) >= f.dims[0]:
                    raise ValueError(f"{key}: {len(raw)} bytes do not fit in {f.dims[-1] - 1}")
                out[f.offset:f.offset + len(raw)] = raw
            elif f.dims:
                items = list(value)  # type: ignore[call-overload]
                if len(f.dims) != 1 or len(items) > f.dims[0]:
                    raise ValueError(f"{key}: {len(items)} entries do not fit in {f.dims}")
                struct.pack_into(f"={len(items)}{f.code}", out, f.offset, *items)
            else:
                struct.pack_into("=" + f.code, out, f.offset, value)
        return bytes(out)

    def unpack(self, data: bytes) -> dict[str, object]:
        """The fields of exactly one struct: numbers as int (arrays as lists), char arrays as the
        bytes before their first NUL (arrays of them as lists)."""
        if len(data) != self.size:
            raise ProtocolError(f"struct {self.name} is {self.size} bytes, got {len(data)}")
        out: dict[str, object] = {}
        for f in self.fields:
            if f.code == "s":
                length = f.dims[-1]
                items = [data[at:at + length].split(b"\0", 1)[0]
                         for at in range(f.offset, f.offset + f.size, length)]
                out[f.name] = items[0] if len(f.dims) == 1 else _shape(items, f.dims[:-1])
            elif f.dims:
                count = f.size // struct.calcsize(f.code)
                items = list(struct.unpack_from(f"={count}{f.code}", data, f.offset))
                out[f.name] = _shape(items, f.dims)
            else:
                out[f.name] = struct.unpack_from("=" + f.code, data, f.offset)[0]
        return out


def _shape(items: list, dims: tuple[int, ...]) -> list:
    if len(dims) == 1:
        return items
    step = len(items) // dims[0]
    return [_shape(items[i:i + step], dims[1:]) for i in range(0, len(items), step)]


class WireFormat:
    """The header's constants (#defines and enum values) and struct layouts."""

    def __init__(self, text: str):
        block = _COMMENT.sub("", cdef_block(text))
        self.constants: dict[str, int] = {n: int(v, 0) for n, v in _DEFINE.findall(block)}
        self.enums: dict[str, dict[str, int]] = {}
        for name, body in _ENUM.findall(block):
            self.enums[name] = {n: int(v) for n, v in _ENUM_ITEM.findall(body)}
            self.constants.update(self.enums[name])
        self.structs: dict[str, Layout] = {}
        for name, body in _STRUCT.findall(block):
            self.structs[name] = _layout(name, body)
        self.hdr = self.structs["nvshare_hdr"]
        # The daemon decodes a header per frame: one precompiled unpack, fields in header order.
        if [f.name for f in self.hdr.fields] != ["magic", "version", "type", "length", "seq"] \
                or any(f.dims for f in self.hdr.fields):
            raise RuntimeError("nvshare: struct nvshare_hdr is not magic, version, type, length, seq")
        self._hdr_struct = struct.Struct(_scalar_format(self.hdr))
        self.msg_types = set(self.enums["nvshare_msg_type"].values())
        if self.hdr.size != self.constants["NVSHARE_HDR_SIZE"]:
            raise RuntimeError("nvshare: struct nvshare_hdr is not NVSHARE_HDR_SIZE bytes")

    def status_name(self, code: int) -> str:
        for name, value in self.enums["nvshare_status"].items():
            if value == code:
                return name[len("NVSHARE_"):]
        return str(code)

    def encode(self, msg_type: int, struct_name: str, values: dict[str, object], seq: int) -> bytes:
        payload = self.structs[struct_name].pack(values)
        return self.hdr.pack({"magic": self.constants["NVSHARE_MAGIC"],
                              "version": self.constants["NVSHARE_PROTO_VERSION"],
                              "type": msg_type, "length": len(payload), "seq": seq}) + payload

    def decode_header(self, data: bytes) -> tuple[int, int, int]:
        """(type, length, seq) of a header, or ProtocolError naming what is wrong."""
        if len(data) != self.hdr.size:
            raise ProtocolError(f"short header: {len(data)} bytes")
        magic, version, msg_type, length, seq = self._hdr_struct.unpack(data)
        if magic != self.constants["NVSHARE_MAGIC"]:
            raise ProtocolError(f"bad magic 0x{magic:08x}")
        if version != self.constants["NVSHARE_PROTO_VERSION"]:
            raise ProtocolError(f"protocol version {version}, expected "
                                f"{self.constants['NVSHARE_PROTO_VERSION']}")
        if length > self.constants["NVSHARE_MAX_PAYLOAD"]:
            raise ProtocolError(f"length {length} over the limit "
                                f"{self.constants['NVSHARE_MAX_PAYLOAD']}")
        if msg_type not in self.msg_types:
            raise ProtocolError(f"unknown message type {msg_type}")
        return msg_type, length, seq


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


def _scalar_format(layout: Layout) -> str:
    """A struct format for a layout of scalar fields, padding included."""
    out, at = "=", 0
    for f in layout.fields:
        out += "x" * (f.offset - at) + f.code
        at = f.offset + f.size
    return out + "x" * (layout.size - at)


_FORMAT: WireFormat | None = None


def wire_format() -> WireFormat:
    """The installed header's format, read once per process."""
    global _FORMAT
    if _FORMAT is None:
        with open(header_path(), encoding="utf-8") as fh:
            _FORMAT = WireFormat(fh.read())
    return _FORMAT
