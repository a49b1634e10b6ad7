"""The three settings a TaskProlog needs (socket, on_daemon_loss, swap), read from nvshare.yaml
without yaml or config.py, which cost ~45 ms of every task's start.

`read` understands only the plain form that nvshare.yaml.example and most sites use: top-level
`key: value` lines with unquoted single-word values, comments, and indented blocks under a key
with no value (a `gpus:` list). It returns None for anything else, and also whenever a key is not a
config key or one of the three values is not plainly valid: the caller then loads the file with
config.load, which says what is wrong exactly as the other entry points do. Values of the keys the
TaskProlog does not use are left to config.load in the prolog (which refuses the next job, and so
drains the node) and in the daemon.
"""
from __future__ import annotations

import re

DEFAULT_PATH = "/etc/nvshare/nvshare.yaml"      # config.DEFAULT_PATH
# config.Config's fields; a test keeps the two equal. A key missing here only costs the slow path.
KEYS = frozenset((
    "scheduling_mode", "auto_share", "burst_turns", "turn_handoff", "switch_time_mode",
    "switch_time_fixed", "switch_time_multiplier", "switch_time_min", "swap_bandwidth", "swap",
    "memory_reserve_percent", "max_runtime_sec", "idle_release_ms", "drop_grace_sec",
    "unresponsive_holder", "socket", "state_dir", "slurm_user", "slurm_bin_dir", "on_daemon_loss",
    "rogue_process", "rogue_check_sec", "max_connections_per_uid", "node_name", "log_level",
    "metrics_port", "usage_admin_comment", "priority_classes", "gpus"))
# A top-level key and a value YAML reads as the same plain string it shows (no quotes, flow,
# anchors, tags, block scalars or `: ` inside), then an optional comment.
_LINE = re.compile(r"([a-z_][a-z0-9_]*):(?:[ ]+([A-Za-z0-9_./+-][A-Za-z0-9_./+-]*))?"
                   r"[ ]*(?:[ ]#.*)?")
_NESTED = re.compile(r"(?:[ ]+|-[ ]|-$)")        # a line of the block under a key with no value
_TRUE, _FALSE = ("true", "yes", "on"), ("false", "no", "off")   # YAML's booleans, any case


class TaskConfig:
    """What export_lines reads of config.Config."""
    __slots__ = ("socket", "on_daemon_loss", "swap")

    def __init__(self, socket: str = "/run/nvshare/scheduler.sock", on_daemon_loss: str = "wait",
                 swap: bool = True):
        self.socket, self.on_daemon_loss, self.swap = socket, on_daemon_loss, swap


def read(path: str) -> TaskConfig | None:
    """The settings from the file at path, or None: load it with config.load instead."""
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8")
    except (OSError, ValueError):          # absent, unreadable, not UTF-8: config.load says
        return None
    values: dict[str, str | None] = {}
    in_block = False
    for line in text.split("\n"):
        bare = line.strip(" ")
        if not bare or bare.startswith("#"):
            continue
        if "\t" in line or "\r" in line or "'" in line or '"' in line:
            return None
        if in_block and _NESTED.match(line):
            continue
        match = _LINE.fullmatch(line)
        if not match or match.group(1) not in KEYS or match.group(1) in values:
            return None
        values[match.group(1)] = match.group(2)
        in_block = match.group(2) is None
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
    if "swap" in values:
        swap = (values["swap"] or "").lower()
        if swap not in _TRUE + _FALSE:
            return None
        cfg.swap = swap in _TRUE
    return cfg
