"""The daemon's side of the wire: frames read off asyncio streams, and the peer's credentials.

The codec itself (constants, layouts, encode and decode) is wire.py's, the one reader of
csrc/nvshare_proto.h; its names are exported here too, so that the daemon's modules say `proto.X`.
"""
from __future__ import annotations

import asyncio
import socket
import struct

from .wire import (C, HDR_SIZE, MAGIC, MAX_PAYLOAD, MSG_NAME, MSG_STRUCT, STRUCTS,  # noqa: F401
                   VARIABLE_TAIL, VERSION, Body, Frame, ProtocolError, class_flag, class_of_flags,
                   decode_header, encode, header_path, new, pack_header, raw, recv_frame, sizeof,
                   status_name, status_tail, text, to_dict, unpack)


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


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    # struct ucred: pid_t is signed, uid_t and gid_t are unsigned (uids above 2**31 exist).
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
    pid, uid, gid = struct.unpack("iII", creds)
    return pid, uid, gid
