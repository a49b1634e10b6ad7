"""One logger setup: every line names its component ("nvshare-scheduler: gpu GPU-1a2b: job 12 step 0: ...").

Client-supplied text (GPU UUIDs, job and user names, raw frame bytes) goes through `escape`, the
same escaping nvshare-status shows, so no peer can forge a log line or send terminal escapes to the
admin who reads the log. The formatter escapes each whole message once more, so a value that a
caller forgot cannot break a line either.
"""
from __future__ import annotations

import logging
import sys
import time
import unicodedata
from typing import Any

# Slurm's special step ids (slurm.h), named as Slurm names them ("1234.batch") in logs and status.
STEP_NAMES = {
    0xFFFFFFFA: "interactive",
    0xFFFFFFFB: "batch",
    0xFFFFFFFC: "extern",
    0xFFFFFFFD: "pending",
}


def step_text(step_id: Any) -> str:
    """A step id as Slurm prints it: 0, 1, ... or batch, extern, interactive."""
    return STEP_NAMES.get(step_id, str(step_id)) if isinstance(step_id, int) else str(step_id)


# Unicode categories that move the cursor, reorder text or are not characters at all.
_UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if 0xDC80 <= code <= 0xDCFF:      # an undecodable byte (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape_pieces(text: str, backslash: bool = True) -> list[str]:
    """Each character of text, control and format characters escaped (and, with backslash, a
    backslash doubled, so that an escape in the output is never ambiguous)."""
    out = []
    for ch in text:
        if ch == "\\" and backslash:
            out.append("\\\\")
        elif unicodedata.category(ch) in _UNSAFE_CATEGORIES:
            out.append(_escape_char(ch))
        else:
            out.append(ch)
    return out


def escape(value: Any, limit: int | None = 128) -> str:
    """A client-supplied value fit for one log line: bytes decoded with undecodable bytes as \\xNN,
    control and format characters escaped, cut to `limit` characters with '...'."""
    if isinstance(value, (bytes, bytearray)):
        # surrogateescape keeps each undecodable byte as one character, shown as \\xNN.
        text = bytes(value).decode("utf-8", "surrogateescape")
    else:
        text = value if isinstance(value, str) else str(value)
    text_pieces = escape_pieces(text)
    escaped = "".join(text_pieces)
    if limit is not None and len(escaped) > limit:
        shown, length = [], 0
        for piece in text_pieces:       # cut between escapes, never inside one
            if length + len(piece) > limit:
                break
            shown.append(piece)
            length += len(piece)
        escaped = "".join(shown) + "..."
    return escaped


class _EscapingFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = "".join(escape_pieces(record.message, backslash=False))
        return super().formatMessage(record)


def setup(component: str, level: str = "info", stream=None) -> logging.Logger:
    logger = logging.getLogger("nvshare")
    logger.handlers.clear()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_EscapingFormatter(f"%(asctime)s {component}: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return logger


def get() -> logging.Logger:
    return logging.getLogger("nvshare")


class Throttle:
    """At most one line per key and interval; the lines held back are counted in the next one.
    For what a peer can make happen as often as it likes (refused connections, accept errors)."""

    def __init__(self, interval: float = 10.0, clock=time.monotonic):
        self.interval = interval
        self.clock = clock
        self._last: dict[Any, float] = {}
        self._held: dict[Any, int] = {}

    def __call__(self, key: Any, level: int, text: str) -> None:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return
        if len(self._last) > 4096:     # keys come from peers (uids): keep the table small
            self._last.clear()
            self._held.clear()
        self._last[key] = now
        held = self._held.pop(key, 0)
        suffix = f" ({held} more like this in the last {now - last:.0f}s)" if held and last else ""
        get().log(level, text + suffix)
