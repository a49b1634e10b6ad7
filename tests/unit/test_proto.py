"""The wire format: C and Python agree on every struct; bad frames are refused, never guessed at."""
from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from nvshare_slurm.wire import proto, wire
from nvshare_slurm.wire.proto import C, ProtocolError

HEADER = Path(proto.header_path())
CDEF = wire.cdef_block(HEADER.read_text())
LAYOUT_C = HEADER.parent.parent / "tests" / "unit" / "proto_layout.c"
if not LAYOUT_C.exists():  # the header came from the installed package
    from pathlib import Path
    LAYOUT_C = Path(__file__).resolve().parent / "proto_layout.c"

_STRUCT_RE = re.compile(r"struct\s+(\w+)\s*\{(.*?)\};", re.S)
_FIELD_RE = re.compile(r"^\s*(?:unsigned\s+)?(\w+)\s+(\w+)((?:\[\d+\])*)\s*;(.*)$", re.M)


def header_structs() -> dict[str, list[tuple[str, str, list[int], str]]]:
    """struct name -> [(type, field, dims, comment)] read from the header text (not by wire.py)."""
    structs = {}
    for name, body in _STRUCT_RE.findall(CDEF):
        structs[name] = [(ctype, field, [int(d) for d in re.findall(r"\d+", dims)], comment)
                         for ctype, field, dims, comment in _FIELD_RE.findall(body)]
    return structs



def test_an_installed_package_reads_the_header_it_ships(tmp_path):
    """setup.py installs csrc/nvshare_proto.h beside the package's __init__.py; wire.py, in wire/ one
    folder below, reads that copy where no csrc/ lies beside the package (a wheel, a pip install)."""
    installed = tmp_path / "site-packages"
    shutil.copytree(Path(proto.__file__).parents[1], installed / "nvshare_slurm",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(HEADER, installed / "nvshare_slurm" / "nvshare_proto.h")
    probe = "import nvshare_slurm.wire.proto as p; print(p.header_path()); print(p.C.NVSHARE_MAGIC)"
    out = subprocess.run([sys.executable, "-S", "-c", probe], cwd=installed, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(installed / "nvshare_slurm" / "nvshare_proto.h"),
                                  str(C.NVSHARE_MAGIC)]

def test_header_parse_sees_what_the_codec_sees():
    # The C side's field list is generated from this parse; it must miss nothing the codec knows.
    parsed = header_structs()
    assert sorted(parsed) == sorted(proto.STRUCTS)
    for name, parsed_fields in parsed.items():
        assert [f for _, f, _, _ in parsed_fields] == [f.name for f in proto.STRUCTS[name].fields]


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    """{struct: size, "struct.field": (offset, size)} as the C compiler lays them out."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    work = tmp_path_factory.mktemp("layout")
    listing = work / "layout_list.h"
    lines = []
    for name, parsed_fields in header_structs().items():
        lines.append(f"STRUCT({name})")
        lines += [f"FIELD({name}, {field})" for _, field, _, _ in parsed_fields]
    listing.write_text("\n".join(lines) + "\n")
    exe = work / "proto_layout"
    subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{HEADER.parent}",
                    f'-DNVSHARE_LAYOUT_LIST="{listing}"', str(LAYOUT_C), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    layout: dict = {}
    for line in out.splitlines():
        kind, name, *numbers = line.split()
        if kind == "S":
            layout[name] = int(numbers[0])
        elif kind == "F":
            layout[name] = (int(numbers[0]), int(numbers[1]))
        else:
            layout[name] = int(numbers[0])
    return layout


@pytest.mark.parametrize("struct_name", sorted(header_structs()))
def test_layout_matches_between_c_and_the_codec(c_layout, struct_name):
    layout = proto.STRUCTS[struct_name]
    assert c_layout[struct_name] == layout.size
    for f in layout.fields:
        assert c_layout[f"{struct_name}.{f.name}"] == (f.offset, f.size), f.name
    # Naturally aligned, no padding: the fields tile the struct exactly (the header promises it).
    end = 0
    for field in [f for _, f, _, _ in header_structs()[struct_name]]:
        offset, size = c_layout[f"{struct_name}.{field}"]
        assert offset == end, f"padding before {struct_name}.{field}"
        end += size
    assert end == c_layout[struct_name], f"tail padding in {struct_name}"


def test_header_size_constant(c_layout):
    assert c_layout["NVSHARE_HDR_SIZE"] == c_layout["nvshare_hdr"] == proto.HDR_SIZE == 16


# Which constant each array dimension must equal: wire.py reads literal sizes in the header, so the
# constants and the literals could drift apart without this.
ARRAY_DIMS = {
    ("char", "gpu_uuid"): ["NVSHARE_UUID_LEN"],
    ("char", "gpu"): ["NVSHARE_UUID_LEN"],
    ("char", "message"): ["NVSHARE_TEXT_LEN"],
    ("char", "name"): ["NVSHARE_NAME_LEN"],
    ("char", "user"): ["NVSHARE_USER_LEN"],
    ("char", "class_reason"): ["NVSHARE_REASON_LEN"],
    ("int32_t", "gpu_index"): ["NVSHARE_MAX_GPUS"],
}


def test_array_sizes_equal_their_constants():
    for name, parsed_fields in header_structs().items():
        for ctype, field, dims, comment in parsed_fields:
            if not dims:
                continue
            expected = ARRAY_DIMS.get((ctype, field))
            assert expected is not None, f"{name}.{field}: add the new array to ARRAY_DIMS"
            if len(dims) == 2:  # an array of per-GPU entries
                expected = ["NVSHARE_MAX_GPUS"] + expected
            assert dims == [getattr(C, const) for const in expected], f"{name}.{field}"
            # A constant named in the field's comment must be the size too.
            for const in re.findall(r"NVSHARE_[A-Z_]+(?:_LEN|_GPUS)", comment):
                assert getattr(C, const) in dims, f"{name}.{field}: comment names {const}"


# --- encode / decode ----------------------------------------------------------------------------

def sample_fields(struct_name: str, seed: int) -> dict:
    """A distinct non-zero value for every field of a struct, within the field's range (types and
    array sizes from the header's text, as the C compiler reads them)."""
    fields: dict = {}
    for i, (ctype, field, dims, _) in enumerate(header_structs()[struct_name]):
        value = seed * 100 + i + 1
        if ctype == "char" and len(dims) == 2:
            fields[field] = [f"GPU-{seed}-{i}-{k}" for k in range(dims[0])]
        elif ctype == "char":
            fields[field] = f"{field}-{seed}-\u00e9" + "x" * (dims[0] - len(field) - 12)
        elif dims:
            fields[field] = [value + k for k in range(dims[0])]
        elif ctype.startswith("int"):
            fields[field] = -value
        else:
            fields[field] = value
    return fields


@pytest.mark.parametrize("msg_type", sorted(proto.MSG_STRUCT), ids=lambda t: proto.MSG_NAME[t])
def test_round_trip_every_message(msg_type):
    fields = sample_fields(proto.MSG_STRUCT[msg_type], msg_type)
    tail = b""
    if msg_type in proto.VARIABLE_TAIL:
        tail = json.dumps({"node": "n\u00e9", "gpus": []}).encode()
        fields["json_length"] = len(tail)
    data = proto.encode(msg_type, fields, seq=0xFFFFFFFF - msg_type, tail=tail)
    got_type, length, seq = proto.decode_header(data[:proto.HDR_SIZE])
    assert (got_type, seq) == (msg_type, 0xFFFFFFFF - msg_type)
    assert length == len(data) - proto.HDR_SIZE
    frame = proto.Frame(got_type, seq, data[proto.HDR_SIZE:])
    decoded = proto.to_dict(frame.body())
    assert decoded == fields
    if tail:
        assert json.loads(proto.status_tail(frame.payload)) == {"node": "n\u00e9", "gpus": []}


def header_bytes(magic=proto.MAGIC, version=proto.VERSION, msg_type=C.NVSHARE_MSG_HEARTBEAT,
                 length=8, seq=1) -> bytes:
    # struct nvshare_hdr by hand (uint32 magic, uint16 version, uint16 type, uint32 length, seq)
    return struct.pack("=IHHII", magic, version, msg_type, length, seq)


@pytest.mark.parametrize("kwargs,reason", [
    ({"magic": 0x48534E56}, "bad magic"),
    ({"version": proto.VERSION + 1}, "protocol version"),
    ({"msg_type": 99}, "unknown message type 99"),
    ({"msg_type": 0}, "unknown message type 0"),
    ({"length": proto.MAX_PAYLOAD + 1}, "over the limit"),
    ({"length": 0xFFFFFFFF}, "over the limit"),
])
def test_decode_header_refuses(kwargs, reason):
    with pytest.raises(ProtocolError, match=reason):
        proto.decode_header(header_bytes(**kwargs))


def test_decode_header_refuses_short_header_and_accepts_the_limit():
    with pytest.raises(ProtocolError, match="short header"):
        proto.decode_header(header_bytes()[:-1])
    assert proto.decode_header(header_bytes(length=proto.MAX_PAYLOAD)) == (
        C.NVSHARE_MSG_HEARTBEAT, proto.MAX_PAYLOAD, 1)


@pytest.mark.parametrize("msg_type", sorted(proto.MSG_STRUCT), ids=lambda t: proto.MSG_NAME[t])
def test_unpack_refuses_wrong_payload_size(msg_type):
    size = proto.sizeof(proto.MSG_STRUCT[msg_type])
    with pytest.raises(ProtocolError, match=f"expected {size}"):
        proto.unpack(msg_type, b"\0" * (size - 1))
    with pytest.raises(ProtocolError):
        proto.unpack(msg_type, b"")
    if msg_type in proto.VARIABLE_TAIL:
        proto.unpack(msg_type, b"\0" * (size + 5))  # the JSON tail
    else:
        with pytest.raises(ProtocolError, match=f"expected {size}"):
            proto.unpack(msg_type, b"\0" * (size + 1))


def test_status_tail_shorter_than_json_length_is_refused():
    data = proto.encode(C.NVSHARE_MSG_STATUS_REPLY, {"json_length": 10}, tail=b"{}")
    with pytest.raises(ProtocolError, match="shorter than its json_length"):
        proto.status_tail(data[proto.HDR_SIZE:])


# --- set_field ----------------------------------------------------------------------------------

def test_set_field_refuses_strings_that_do_not_fit():
    uuid_len = C.NVSHARE_UUID_LEN
    ok = proto.new(C.NVSHARE_MSG_LOCK_REQUEST, {"gpu_uuid": "u" * (uuid_len - 1)})
    assert proto.text(ok.gpu_uuid) == "u" * (uuid_len - 1)
    with pytest.raises(ValueError, match="gpu_uuid"):  # no room for the NUL
        proto.new(C.NVSHARE_MSG_LOCK_REQUEST, {"gpu_uuid": "u" * uuid_len})
    with pytest.raises(ValueError, match="gpu_uuid"):  # bytes, not characters, count
        proto.new(C.NVSHARE_MSG_LOCK_REQUEST, {"gpu_uuid": "\u00e9" * (uuid_len // 2)})
    with pytest.raises(ValueError, match="gpu_index"):
        proto.new(C.NVSHARE_MSG_JOB_REGISTER, {"gpu_index": list(range(C.NVSHARE_MAX_GPUS + 1))})
    with pytest.raises(ValueError, match=r"gpu_uuid\[1\]"):
        proto.new(C.NVSHARE_MSG_JOB_REPLY, {"gpu_uuid": ["a", "b" * uuid_len]})
    with pytest.raises(ValueError, match="message"):
        proto.encode(C.NVSHARE_MSG_REPLY, {"message": "m" * C.NVSHARE_TEXT_LEN})


def test_text_replaces_undecodable_bytes():
    obj = proto.new(C.NVSHARE_MSG_REPLY, {"message": b"ok\xff\xfe"})
    assert proto.raw(obj.message) == b"ok\xff\xfe"
    assert proto.text(obj.message) == "ok\ufffd\ufffd"


# --- reading frames -----------------------------------------------------------------------------

def read_all(data: bytes, eof: bool = True) -> list:
    """Frames read_frame returns from `data`, then the ProtocolError or None ending the stream."""
    async def run():
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        if eof:
            reader.feed_eof()
        frames = []
        while True:
            try:
                frame = await proto.read_frame(reader)
            except ProtocolError as exc:
                frames.append(exc)
                return frames
            frames.append(frame)
            if frame is None:
                return frames
    return asyncio.run(run())


def heartbeat(seq: int) -> bytes:
    return proto.encode(C.NVSHARE_MSG_HEARTBEAT, {"timestamp_ns": seq * 1000}, seq=seq)


def test_read_frame_reads_back_to_back_frames_then_none_at_clean_eof():
    frames = read_all(heartbeat(1) + heartbeat(2))
    assert [(f.name, f.seq, f.body().timestamp_ns) for f in frames[:2]] == [
        ("HEARTBEAT", 1, 1000), ("HEARTBEAT", 2, 2000)]
    assert frames[2] is None
    assert read_all(b"") == [None]


@pytest.mark.parametrize("cut", [1, proto.HDR_SIZE - 1, proto.HDR_SIZE, proto.HDR_SIZE + 7])
def test_read_frame_truncated_is_a_protocol_error(cut):
    frames = read_all(heartbeat(1) + heartbeat(2)[:cut])
    assert frames[0].seq == 1
    assert isinstance(frames[1], ProtocolError)
    assert "closed inside" in str(frames[1])


def test_read_frame_refuses_payload_of_the_wrong_size_and_bad_headers():
    wrong = header_bytes(msg_type=C.NVSHARE_MSG_HEARTBEAT, length=4) + b"\0" * 4
    assert isinstance(read_all(wrong)[0], ProtocolError)
    garbage = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    [error] = read_all(garbage)
    assert isinstance(error, ProtocolError) and "bad magic" in str(error)


def test_recv_frame_over_a_socket():
    left, right = socket.socketpair()
    with left, right:
        left.sendall(heartbeat(7) + heartbeat(8)[:5])
        left.shutdown(socket.SHUT_WR)
        assert proto.recv_frame(right).seq == 7
        with pytest.raises(ConnectionError):
            proto.recv_frame(right)


def test_status_names():
    assert proto.status_name(C.NVSHARE_ERR_PERM) == "ERR_PERM"
    assert proto.status_name(C.NVSHARE_OK) == "OK"
    assert proto.status_name(1234) == "1234"


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs setuid")
def test_peer_credentials_of_a_uid_above_2_31():
    # uid_t is unsigned: a large uid (some directory services) must not read back negative, or
    # the daemon refuses that user's processes their own job.
    import os
    import tempfile
    big = 3_000_000_000
    public = tempfile.mkdtemp(prefix="nvs-cred-", dir="/tmp")  # tmp_path is root's 0700 dir
    os.chmod(public, 0o755)
    path = os.path.join(public, "creds.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.settimeout(10)
        listener.bind(path)
        os.chmod(path, 0o666)
        listener.listen(1)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setgid(big)
                os.setuid(big)
                child = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                child.settimeout(10)
                child.connect(path)
                child.recv(1)
                code = 0
            finally:
                os._exit(code)
        try:
            conn, _ = listener.accept()
            with conn:
                creds = proto.peer_credentials(conn)
                conn.send(b"x")
        finally:
            _, wait_status = os.waitpid(pid, 0)
    finally:
        listener.close()
        shutil.rmtree(public)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    assert creds == (pid, big, big)


# --- the codec against the C compiler: every field where C reads it ------------------------------

WIRE = wire.wire_format()


def test_constants_and_message_types():
    assert C.NVSHARE_HDR_SIZE == proto.HDR_SIZE and C.NVSHARE_MAGIC == proto.MAGIC
    assert WIRE.msg_types == set(proto.MSG_STRUCT) == set(proto.MSG_NAME)
    # Each message's struct is the one its comment in enum nvshare_msg_type names.
    enum = re.search(r"enum nvshare_msg_type \{(.*?)\};", CDEF, re.S).group(1)
    for name, comment in re.findall(r"NVSHARE_MSG_(\w+) = \d+,?\s*/\*(.*?)\*/", enum, re.S):
        number = getattr(C, "NVSHARE_MSG_" + name)
        assert proto.MSG_NAME[number] == name
        assert proto.MSG_STRUCT[number] == re.search(r"struct (\w+)", comment).group(1), name
    assert proto.MSG_STRUCT[C.NVSHARE_MSG_JOB_QUERY] == "nvshare_job_id"
    assert proto.MSG_STRUCT[C.NVSHARE_MSG_STATUS_REPLY] == "nvshare_status_reply"
    for name, code in WIRE.enums["nvshare_status"].items():
        assert proto.status_name(code) == name.removeprefix("NVSHARE_")


@pytest.mark.parametrize("msg_type", sorted(proto.MSG_STRUCT), ids=lambda t: proto.MSG_NAME[t])
def test_codec_writes_every_field_where_c_reads_it(c_layout, msg_type):
    struct_name = proto.MSG_STRUCT[msg_type]
    fields = sample_fields(struct_name, seed=3)
    payload = proto.encode(msg_type, fields, seq=9)[proto.HDR_SIZE:]
    assert len(payload) == c_layout[struct_name]
    codes = {"int32_t": "i", "uint32_t": "I", "int64_t": "q", "uint64_t": "Q", "int16_t": "h",
             "uint16_t": "H", "int8_t": "b", "uint8_t": "B"}
    for ctype, field, dims, _ in header_structs()[struct_name]:
        offset, size = c_layout[f"{struct_name}.{field}"]
        at = payload[offset:offset + size]
        value = fields[field]
        if ctype == "char":
            cells = [at[k:k + dims[-1]] for k in range(0, size, dims[-1])]
            wanted = value if isinstance(value, list) else [value]
            assert [c.split(b"\0", 1)[0].decode() for c in cells] == wanted, field
            assert all(c.endswith(b"\0") for c in cells), f"{field}: NUL-terminated"
        else:
            count = size // struct.calcsize(codes[ctype])
            got = list(struct.unpack(f"={count}{codes[ctype]}", at))
            assert got == (value if isinstance(value, list) else [value]), field


def test_codec_refuses_what_breaks_the_format():
    good = proto.pack_header(C.NVSHARE_MSG_JOB_QUERY, 8, 1)
    assert good == header_bytes(msg_type=C.NVSHARE_MSG_JOB_QUERY, length=8, seq=1)
    bad = {"magic": b"XXXX" + good[4:], "version": good[:4] + b"\x09\x00" + good[6:],
           "length": good[:8] + (proto.MAX_PAYLOAD + 1).to_bytes(4, "little") + good[12:],
           "type": good[:6] + (99).to_bytes(2, "little") + good[8:], "short": good[:15]}
    for data in bad.values():
        with pytest.raises(ProtocolError):
            proto.decode_header(data)
    with pytest.raises(ProtocolError):
        proto.STRUCTS["nvshare_job_reply"].unpack(b"\0" * 10)
    with pytest.raises(ValueError):
        proto.STRUCTS["nvshare_reply"].pack({"message": "x" * 256})
    with pytest.raises(ValueError, match="nvshare_job_id"):  # uint32_t
        proto.encode(C.NVSHARE_MSG_JOB_QUERY, {"job_id": -1})
