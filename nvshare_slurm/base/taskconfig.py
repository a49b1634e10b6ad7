"""The settings a TaskProlog needs (socket, on_daemon_loss, swap, swap_prepin, and the site's own
TaskProlog with its timeout), read from nvshare.yaml without yaml or config.py, which cost ~45 ms
of every task's start.

`read` understands only the plain form that nvshare.yaml.example and most sites use: top-level
`key: value` lines with unquoted single-word values, comments, indented blocks under a key
with no value (a `gpus:` list), and flow-style values (`gpus: [...]`) of the keys it does not
read. It returns None for anything else, and also whenever a key is not a config key or one of
its values is not plainly valid: the caller then loads the file with
config.load, which says what is wrong exactly as the other entry points do. Values of the keys the
TaskProlog does not use are left to config.load in the prolog (which refuses the next job, and so
drains the node) and in the daemon.
"""
from __future__ import annotations

import os
import re

DEFAULT_PATH = "/etc/nvshare/nvshare.yaml"      # config.DEFAULT_PATH
# The class body's field lines of config.Config: `    name: type = default  # comment`.
_FIELD_LINE = re.compile(r"    ([a-z_][a-z0-9_]*): \S")


def config_keys() -> frozenset[str]:
    """config.Config's fields, the one list of config keys, read from config.py's text: importing
    it costs yaml and dataclasses. Empty when that text cannot be read; then every file with a key
    goes to config.load."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.py"),
                  encoding="utf-8") as fh:
            source = fh.read()
    except (OSError, ValueError):
        return frozenset()
    _, found, body = source.partition("\nclass Config:\n")
    keys = []
    for line in body.split("\n"):
        if line.startswith("    def ") or (line and not line.startswith(" ")):
            break
        match = _FIELD_LINE.match(line)
        if match:
            keys.append(match.group(1))
    return frozenset(keys) if found else frozenset()


KEYS = config_keys()
# A top-level key and a value YAML reads as the same plain string it shows (no quotes, flow,
# anchors, tags, block scalars or `: ` inside), then an optional comment.
_LINE = re.compile(r"([a-z_][a-z0-9_]*):(?:[ ]+([A-Za-z0-9_./+-][A-Za-z0-9_./+-]*))?"
                   r"[ ]*(?:[ ]#.*)?")
_SITE_LINE = re.compile(r"""site_task_prolog:(?:[ ]+(['"]?)(/[^'"#\x00-\x1f]*?)\1)?[ ]*(?:[ ]#.*)?""")
_NESTED = re.compile(r"(?:[ ]+|-[ ]|-$)")        # a line of the block under a key with no value
# A flow-style value (`gpus: [{uuid: ..., memory: 16G}]`, its continuation lines indented) of a
# key the TaskProlog does not read: skipped, its check left to the prolog and the daemon.
_FLOW = re.compile(r"([a-z_][a-z0-9_]*):[ ]+[\[{].*")
_READ_HERE = frozenset(("socket", "on_daemon_loss", "swap", "swap_prepin", "site_task_prolog",
                        "site_task_prolog_timeout"))
_TRUE, _FALSE = ("true", "yes", "on"), ("false", "no", "off")   # YAML's booleans, any case


class TaskConfig:
    """What the TaskProlog reads of config.Config."""
    __slots__ = ("socket", "on_daemon_loss", "swap", "swap_prepin", "site_task_prolog",
                 "site_task_prolog_timeout")

    def __init__(self, socket: str = "/run/nvshare/scheduler.sock", on_daemon_loss: str = "wait",
                 swap: bool = True, swap_prepin: bool = False, site_task_prolog: str = "",
                 site_task_prolog_timeout: float = 30.0):
        self.socket, self.on_daemon_loss, self.swap = socket, on_daemon_loss, swap
        self.swap_prepin = swap_prepin
        self.site_task_prolog = site_task_prolog
        self.site_task_prolog_timeout = site_task_prolog_timeout


def read(path: str) -> TaskConfig | None:
    """The settings from the file at path, or None: load it with config.load instead."""
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8")
    except (OSError, ValueError):          # absent, unreadable, not UTF-8: config.load says
        return None
    values: dict[str, str | None] = {}
    block_key = ""                  # the key with no value whose block the next lines may be
    for line in text.split("\n"):
        bare = line.strip(" ")
        if not bare or bare.startswith("#"):
            continue
        if "\t" in line or "\r" in line or "'" in line or '"' in line:
            return None
        if block_key and _NESTED.match(line):
            if block_key == "site_task_prolog":     # YAML reads an indented line as its value
                return None
            continue
        flow = _FLOW.fullmatch(line)
        if flow and flow.group(1) in KEYS and flow.group(1) not in _READ_HERE \
                and flow.group(1) not in values:
            values[flow.group(1)] = None
            block_key = flow.group(1)
            continue
        match = _LINE.fullmatch(line)
        if not match or match.group(1) not in KEYS or match.group(1) in values:
            return None
        values[match.group(1)] = match.group(2)
        block_key = match.group(1) if match.group(2) is None else ""
    cfg = TaskConfig()
    if "socket" in values:
        socket = values["socket"]
        if socket is None or not socket.startswith("/"):
            return None
        cfg.socket = socket
    if "on_daemon_loss" in values:
        policy = (values["on_daemon_loss"] or "").lower()
        if policy not in ("wait", "run"):
            return None
        cfg.on_daemon_loss = policy
    for key in ("swap", "swap_prepin"):
        if key in values:
            flag = (values[key] or "").lower()
            if flag not in _TRUE + _FALSE:
                return None
            setattr(cfg, key, flag in _TRUE)
    if values.get("site_task_prolog") is not None:       # no value: none, as config.load reads it
        program = values["site_task_prolog"] or ""
        if not program.startswith("/"):
            return None
        cfg.site_task_prolog = program
    if "site_task_prolog_timeout" in values:
        try:
            timeout = float(values["site_task_prolog_timeout"] or "")
        except ValueError:
            return None
        if not 0.1 <= timeout <= 3600:          # config._RANGES'
            return None
        cfg.site_task_prolog_timeout = timeout
    return cfg


def site_task_prolog_line(path: str) -> str | None:
    """The `site_task_prolog:` value of a file that config.load refuses, read on its own, so that a
    broken nvshare.yaml never silently drops the site's TaskProlog: the path when the line is
    there and plain, "" when no such line is there, None when there is one that cannot be used
    (or the file cannot be read)."""
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        import errno
        return "" if exc.errno == errno.ENOENT else None
    found, seen = "", False
    for line in text.splitlines():
        if not line.startswith("site_task_prolog:"):
            continue
        match = _SITE_LINE.fullmatch(line)
        if seen or not match:
            return None
        found, seen = match.group(2) or "", True
    return found
