"""nvshare.yaml: every key, its default, its check. Environment NVSHARE_<KEY> overrides the file.

Unknown keys and bad values raise ConfigError naming the key, so a typo never silently falls back
to a default. slurm/nvshare.yaml.example lists the same keys; a test keeps the two in step.
"""
from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from .priority import ClassMap, ClassMapError, parse_map

DEFAULT_PATH = "/etc/nvshare/nvshare.yaml"
ENV_PREFIX = "NVSHARE_"

MODES = ("auto", "concurrent", "serial")
SWITCH_MODES = ("auto", "fixed")
AUTO_SHARES = ("adaptive", "turns", "corun")
DAEMON_LOSS_POLICIES = ("wait", "run")
ROGUE_POLICIES = ("warn", "kill")


class ConfigError(ValueError):
    """A config key or value that cannot be used; the message names the key and the source."""


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def parse_size(value: Any, key: str = "size") -> int:
    """Bytes from an int or a string like '80G', '512M', '1.5T' (binary units)."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size such as 80G or 512M, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{key}: size must not be negative, got {value}")
        return value
    match = _SIZE_RE.match(str(value))
    if not match:
        raise ConfigError(f"{key}: expected a size such as 80G or 512M, got {value!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def format_size(value: int) -> str:
    for unit in ("P", "T", "G", "M", "K"):
        if value >= _UNITS[unit] and value % _UNITS[unit] == 0:
            return f"{value // _UNITS[unit]}{unit}"
    return str(value)


@dataclass(frozen=True)
class GpuSpec:
    """A GPU given in the config instead of NVML (machines without an NVIDIA GPU: demo, tests)."""
    uuid: str
    memory: int
    index: int
    device: str = ""    # the GPU's device file; "" = /dev/nvidia<index>

    @property
    def device_path(self) -> str:
        return self.device or f"/dev/nvidia{self.index}"


# The one list of config keys. taskconfig reads its field lines (`    name: type = default`, one
# per line) from this file's text, for the TaskProlog, which cannot afford to import this module.
@dataclass(frozen=True)
class Config:
    scheduling_mode: str = "auto"
    auto_share: str = "adaptive"           # auto while memory fits: adaptive | turns | corun
    burst_turns: bool = True               # adaptive: co-runners' bursts take turns (shared page)
    turn_handoff: bool = True              # an exclusive turn passes holder to holder by an eventfd
    switch_time_mode: str = "auto"
    switch_time_fixed: float = 10.0        # seconds, with switch_time_mode: fixed
    switch_time_multiplier: float = 20.0   # auto: interval = multiplier x time to move a switch's bytes
    switch_time_min: float = 0.1           # auto: floor of the interval, seconds
    swap_bandwidth: int = 20 << 30         # bytes/s of a switch's copies, out and in one after the other
    swap: bool = True                      # back allocations so that a paused job's memory can move
    swap_prepin: bool = False              # jobs pin their host copies ahead (NVSHARE_SWAP_PREPIN=1)
    memory_reserve_percent: int = 5
    max_runtime_sec: int = 300             # serial: longest turn while others wait
    idle_release_ms: float = 5.0           # starting idle threshold for early release (adapts)
    drop_grace_sec: float = 30.0           # a holder that ignores DROP_LOCK this long (+1 s per GiB
    #                                        it was asked to move out) is unresponsive
    unresponsive_holder: str = "warn"      # warn | kill
    socket: str = "/run/nvshare/scheduler.sock"
    state_dir: str = "/var/lib/nvshare"
    slurm_user: str = "slurm"
    slurm_bin_dir: str = "/usr/bin"        # scontrol lives here; Prolog/Epilog run with no PATH
    on_daemon_loss: str = "wait"           # wait | run
    rogue_process: str = "warn"            # warn | kill
    rogue_check_sec: float = 10.0
    suspend_check_sec: float = 0.25        # how often clients' run state (stopped, frozen) is read
    suspend_slurm_poll_sec: float = 1.0    # how often squeue is asked for suspended jobs; 0 = never
    max_connections_per_uid: int = 256     # each job process holds one; root is not capped
    node_name: str = "-"                   # this node's Slurm NodeName; "-": the short host name
    log_level: str = "info"
    metrics_port: int = 0                  # Prometheus metrics over HTTP on this port; 0 = off
    metrics_bind: str = "127.0.0.1"        # the address it listens on; 0.0.0.0 or :: for all
    metrics_user_labels: bool = False      # the job samples carry a `user` label (user names)
    usage_admin_comment: bool = False      # the scheduler also writes a job's GPU usage to AdminComment
    site_task_prolog: str = ""             # the site's own TaskProlog, run by nvshare-taskprolog
    site_task_prolog_timeout: float = 30.0  # seconds; past it that program is killed, the task fails
    gpus: tuple[GpuSpec, ...] = field(default_factory=tuple)  # empty: NVML inventory
    # QOS, partition, interactive, --comment word -> high | normal | low (priority.py)
    priority_classes: ClassMap = field(default_factory=ClassMap)

    def slurm_node(self) -> str:
        """This node's Slurm NodeName: node_name, or the short host name for "-"."""
        if self.node_name != "-":
            return self.node_name
        import socket
        return socket.gethostname().split(".")[0]

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["gpus"] = [{"uuid": g.uuid, "memory": g.memory, "index": g.index,
                        "device": g.device_path} for g in self.gpus]
        out["priority_classes"] = self.priority_classes.as_dict()
        return out


@dataclass(frozen=True)
class Setting:
    """A setting an admin may change per GPU at run time (`nvshare-status update`, ADMIN_UPDATE),
    over the file's value. `config_key` is its key in nvshare.yaml; the table's key is its name in
    the daemon (GpuSettings, state.json's overrides). A number's range holds wherever it is set:
    the file, the environment, the status CLI, the daemon's check of an update and of state.json."""
    config_key: str
    kind: type                      # str, int or float
    choices: tuple[str, ...] = ()   # str: the words it takes
    low: float = 0                  # int, float: the range, both ends allowed, in `unit`
    high: float = 0
    unit: str = ""

    def accepts(self, value: Any) -> bool:
        """Is `value` (as state.json keeps it) of this setting's type and in its range?"""
        if self.kind is str:
            return isinstance(value, str) and value in self.choices
        kinds = (int, float) if self.kind is float else (int,)
        return isinstance(value, kinds) and not isinstance(value, bool) and \
            self.low <= value <= self.high


# The settings an admin may change per GPU: one table for the config reader, nvshare-status update,
# the daemon's check of ADMIN_UPDATE and of the overrides state.json keeps.
OVERRIDABLE: dict[str, Setting] = {
    "mode": Setting("scheduling_mode", str, choices=MODES),
    "switch_time_mode": Setting("switch_time_mode", str, choices=SWITCH_MODES),
    "switch_time_fixed": Setting("switch_time_fixed", float, low=0.01, high=86400, unit="s"),
    "memory_reserve_percent": Setting("memory_reserve_percent", int, low=0, high=90, unit="%"),
    "max_runtime_sec": Setting("max_runtime_sec", int, low=1, high=10 ** 9, unit="s"),
}
_FIELD_TYPES = {f.name: f.type for f in fields(Config)}
_CHOICES: dict[str, tuple[str, ...]] = {
    **{s.config_key: s.choices for s in OVERRIDABLE.values() if s.kind is str},
    "auto_share": AUTO_SHARES,
    "on_daemon_loss": DAEMON_LOSS_POLICIES,
    "rogue_process": ROGUE_POLICIES,
    "unresponsive_holder": ROGUE_POLICIES,
    "log_level": ("debug", "info", "warning", "error"),
}
_RANGES: dict[str, tuple[float, float]] = {
    **{s.config_key: (s.low, s.high) for s in OVERRIDABLE.values() if s.kind is not str},
    "switch_time_multiplier": (1, 10000),
    "switch_time_min": (0.01, 86400),
    "swap_bandwidth": (1 << 20, 1 << 50),
    "idle_release_ms": (0.1, 60000),
    "drop_grace_sec": (0.1, 86400),
    "rogue_check_sec": (0.5, 86400),
    "suspend_check_sec": (0.05, 60),
    "suspend_slurm_poll_sec": (0, 3600),
    "max_connections_per_uid": (1, 1_000_000),
    "metrics_port": (0, 65535),
    "site_task_prolog_timeout": (0.1, 3600),
}
# Booleans as YAML writes them and as people write them in an environment variable.
_BOOLS = {"true": True, "yes": True, "on": True, "1": True,
          "false": False, "no": False, "off": False, "0": False}
_NODE_RE = re.compile(r"^(-|[A-Za-z0-9][A-Za-z0-9_.-]{0,127})$")
_UUID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")
_DEVICE_RE = re.compile(r"^/[A-Za-z0-9_./-]{0,240}/nvidia[0-9]{1,4}$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def _convert(key: str, value: Any, source: str) -> Any:
    kind = _FIELD_TYPES[key]
    where = f"{key} (from {source})"
    if key == "gpus":
        return _convert_gpus(value, where)
    if key == "priority_classes":
        if isinstance(value, str):   # from the environment: YAML text
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError as exc:
                raise ConfigError(f"{where}: not a YAML mapping: {exc}") from None
        try:
            return parse_map(value, where)
        except ClassMapError as exc:
            raise ConfigError(str(exc)) from None
    if key == "site_task_prolog":
        return _convert_program(value, where)
    if key == "swap_bandwidth":
        value = parse_size(value, where)
    elif kind == "bool":
        if isinstance(value, str) and value.strip().lower() in _BOOLS:
            value = _BOOLS[value.strip().lower()]
        elif not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false (on/off), got {value!r}")
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            value = int(str(value).strip())
        except ValueError:
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            value = float(str(value).strip())
        except ValueError:
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    else:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
        value = value.strip()
        if key in _CHOICES:
            value = value.lower()
            if value not in _CHOICES[key]:
                raise ConfigError(f"{where}: {value!r} is not one of {', '.join(_CHOICES[key])}")
    if key in _RANGES:
        low, high = _RANGES[key]
        if not low <= value <= high:
            raise ConfigError(f"{where}: {value} is outside {low}..{high}")
    if key == "suspend_slurm_poll_sec" and 0 < value < 0.2:
        raise ConfigError(f"{where}: {value} asks slurmctld too often: 0 (off) or at least 0.2")
    if key == "node_name" and not _NODE_RE.match(value):
        raise ConfigError(f"{where}: {value!r} is not a Slurm node name (or - for the host name)")
    if key == "metrics_bind":
        try:
            value = str(ipaddress.ip_address(value.strip("[]")))
        except ValueError:
            raise ConfigError(f"{where}: {value!r} is not an IP address (127.0.0.1, 0.0.0.0 for "
                              f"every IPv4 interface, :: for every interface)") from None
    if key in ("socket", "state_dir", "slurm_bin_dir") and not str(value).startswith("/"):
        raise ConfigError(f"{where}: must be an absolute path, got {value!r}")
    return value


def _convert_program(value: Any, where: str) -> str:
    """An absolute path Slurm could have run itself, or "" (empty or no value) for none."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not value.startswith("/"):
        raise ConfigError(f"{where}: expected an absolute path of a program, got {value!r}")
    if _CONTROL_RE.search(value):
        raise ConfigError(f"{where}: {value!r} holds control characters")
    return value


def _convert_gpus(value: Any, where: str) -> tuple[GpuSpec, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: not a YAML list: {exc}") from None
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of {{uuid, memory}}, got {value!r}")
    specs = []
    for index, item in enumerate(value):
        if not isinstance(item, dict) or set(item) - {"uuid", "memory", "device"} \
                or "uuid" not in item or "memory" not in item:
            raise ConfigError(f"{where}[{index}]: expected {{uuid: ..., memory: ..., device: ...}} "
                              f"(device optional), got {item!r}")
        uuid = str(item["uuid"])
        if not _UUID_RE.match(uuid):
            raise ConfigError(f"{where}[{index}].uuid: {uuid!r} is not a usable GPU UUID")
        memory = parse_size(item["memory"], f"{where}[{index}].memory")
        if memory <= 0:
            raise ConfigError(f"{where}[{index}].memory: must be positive")
        device = str(item.get("device") or "")
        if device and (not device.startswith("/") or not _DEVICE_RE.match(device)):
            raise ConfigError(f"{where}[{index}].device: {device!r} is not an absolute path of "
                              f"plain characters (letters, digits, / . _ -) to a file named "
                              f"nvidia<N>, as the driver names a GPU's device file")
        specs.append(GpuSpec(uuid=uuid, memory=memory, index=index, device=device))
    if len({s.uuid for s in specs}) != len(specs):
        raise ConfigError(f"{where}: the same uuid is listed twice")
    if len({s.device_path for s in specs}) != len(specs):
        raise ConfigError(f"{where}: the same device file is listed twice")
    return tuple(specs)


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("NVSHARE_CONFIG", DEFAULT_PATH))


def load_for_job(environ: Mapping[str, str]) -> tuple[Config, str]:
    """The config for a job's Prolog or Epilog, and an error text ('' when fine). A bad file still
    yields what `fallback` can read of it (slurm_bin_dir above all), so that scontrol can tell
    whether the job is affected by the bad config at all."""
    try:
        return load(environ=environ), ""
    except ConfigError as exc:
        return fallback(environ), str(exc)


# What an entry point needs to reach the daemon and Slurm when the file as a whole is refused.
_FALLBACK_KEYS = ("socket", "state_dir", "slurm_bin_dir", "node_name", "gpus")
_FALLBACK_LINE = re.compile(r"^(socket|state_dir|slurm_bin_dir|node_name):[ ]+([^ #'\"]+)[ ]*(?:#.*)?$")


def fallback(environ: Mapping[str, str] | None = None) -> Config:
    """The defaults, with each of the file's socket, state_dir, slurm_bin_dir, node_name and gpus
    that is valid on its own (read line by line where the file is not even YAML). Everything else,
    on_daemon_loss above all, stays at its default: the safe choice (wait) for a task that must
    start with the hook although nvshare.yaml is broken."""
    file = config_path(environ if environ is not None else os.environ)
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError):
        return Config()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError:
        raw = None
    if not isinstance(raw, dict):
        raw = {m.group(1): m.group(2) for m in map(_FALLBACK_LINE.match, text.splitlines()) if m}
    values = {}
    for key in _FALLBACK_KEYS:
        if key in raw:
            try:
                values[key] = _convert(key, raw[key], str(file))
            except ConfigError:
                pass
    return replace(Config(), **values)


def load(path: str | Path | None = None, environ: Mapping[str, str] | None = None,
         require_file: bool = False) -> Config:
    """The config: defaults, then the file (if it exists), then NVSHARE_<KEY> variables."""
    env = os.environ if environ is None else environ
    file = Path(path) if path is not None else config_path(env)
    values: dict[str, Any] = {}
    try:
        exists = file.exists()
    except OSError as exc:  # e.g. a 0700 /etc/nvshare and a user running nvshare-status
        raise ConfigError(f"{file}: cannot be read: {exc.strerror or exc}") from None
    if exists:
        try:
            raw = yaml.safe_load(file.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ConfigError(f"{file}: cannot be read as YAML: {exc}") from None
        if raw is None:  # empty, or only comments
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{file}: expected a mapping of key: value at the top level")
        for key, value in raw.items():
            if key not in _FIELD_TYPES:
                raise ConfigError(f"{file}: unknown key {key!r}")
            values[key] = _convert(key, value, str(file))
    elif require_file:
        raise ConfigError(f"{file}: no such config file")
    for key in _FIELD_TYPES:
        name = ENV_PREFIX + key.upper()
        if name in env and env[name] != "":
            values[key] = _convert(key, env[name], f"environment {name}")
    return replace(Config(), **values)

