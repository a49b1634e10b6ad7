"""The files of a throw-away Slurm cluster on this host: slurm.conf, gres.conf, cgroup.conf and the
Prolog, Epilog and TaskProlog wrappers that run nvshare-slurm's entry points.

One writer for every local cluster: the real-Slurm tests (tests/slurm/cluster.py), the demo
(scripts/demo.sh, through the command line below) and the benchmarks' node (bench/slurm_node.py).
A `LocalCluster` describes the cluster (nodes, ports, paths, plugins, GRES, extra keys); render_*()
turn it into text and write() puts the files in its directory. It starts nothing.

    python3 -m nvshare_slurm.node.localcluster DIR --name NAME --partition PART --gres GRES
        --gres-conf LINE ... --nvshare-config FILE (--python PY | --bin-dir DIR) [options]

writes DIR/slurm.conf, gres.conf, cgroup.conf (only where one is needed) and prolog.sh, epilog.sh,
taskprolog.sh for one node of this host (--help lists the options). Exit status: 0 written, 1 a
value that cannot go into the files, 2 bad arguments.
"""
from __future__ import annotations

import argparse
import re
import shlex
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping, Sequence

PROG = "nvshare_slurm.node.localcluster"
ENTRY_POINTS = ("prolog", "epilog", "taskprolog")
CGROUP_V2_MARK = Path("/sys/fs/cgroup/cgroup.controllers")
# A value in slurm.conf ends at white space and a '#' starts a comment: neither may be in one.
_VALUE_RE = re.compile(r"^[^\s#]+$")
_KEY_RE = re.compile(r"^[A-Za-z]+$")


class LocalClusterError(ValueError):
    """A description whose files would not say what it says (the key is named)."""


@dataclass(frozen=True)
class Node:
    """A slurmd of this host. All nodes share 127.0.0.1, so each has its own port; with several
    on one host, `hostname` (NodeHostname=) is this host's name and `slurmd -N <name>` picks one."""
    name: str
    port: int
    gres: str                          # the NodeName Gres= value
    gres_conf: tuple[str, ...]         # this node's gres.conf lines, verbatim
    cpus: int = 8
    real_memory: int = 1000
    hostname: str | None = None
    one_socket: bool = False           # Sockets=1 CoresPerSocket=<cpus> ThreadsPerCore=1


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    default: bool = False
    oversubscribe: str | None = None   # OverSubscribe=, where the partition names it
    priority_tier: int | None = None   # PriorityTier= (preempt/partition_prio), where it is named


@dataclass(frozen=True)
class CgroupConf:
    """cgroup.conf. ignore_systemd: slurmd makes its cgroups itself, for a cgroup v2 machine
    without systemd (a container) and a Slurm that was unpacked rather than installed."""
    version: int                       # 1 or 2
    ignore_systemd: bool = False
    constrain_devices: bool = False
    mountpoint: str = "/sys/fs/cgroup"


@dataclass(frozen=True)
class Wrappers:
    """The Prolog, Epilog and TaskProlog scripts. slurmd passes them no environment (only SLURM_*):
    each names nvshare.yaml, slurm.conf and whatever `env` holds (PYTHONPATH, LD_LIBRARY_PATH),
    then execs its entry point. `nvshare_config` may hold "{node}", the node that runs the script
    ($SLURMD_NODENAME), where each node of the host has its own."""
    nvshare_config: str
    commands: Mapping[str, Sequence[str]]     # "prolog", "epilog", "taskprolog" -> argv
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LocalCluster:
    """A cluster whose files all lie in `base`: slurm.conf, gres.conf, cgroup.conf, the wrappers,
    state/, spool/, munge/munge.sock, the daemons' pid and log files. `extra` holds slurm.conf keys
    beyond the ones every local cluster has; a key that those already set is refused."""
    name: str
    base: Path
    host: str
    ctld_port: int
    nodes: tuple[Node, ...]
    partitions: tuple[Partition, ...]
    gres_types: str = "nvshare"
    slurm_user: str = "root"
    proctrack: str = "proctrack/linuxproc"
    task_plugin: str = "task/none"
    per_node_files: bool = False       # spool/<node>, slurmd-<node>.pid and .log: several slurmd
    prolog: str | None = None          # default <base>/prolog.sh; likewise epilog, task_prolog
    epilog: str | None = None
    task_prolog: str | None = None
    plugin_dir: str | None = None
    cgroup: CgroupConf | None = None
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def slurm_conf(self) -> Path:
        return self.base / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.base / "munge" / "munge.sock"


# ---- what every local cluster shares -----------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def short_hostname() -> str:
    """What `hostname -s` prints and slurmd takes as its node name by default."""
    return socket.gethostname().split(".")[0]


def cgroup_v2() -> bool:
    return CGROUP_V2_MARK.exists()


def unpacked_plugin_dir(slurm_root: str) -> str:
    """Where Debian's Slurm packages, unpacked under a root (.slurmdeb/gpu-machine-slurm.sh), keep
    their plugins: not where slurmd looks unless PluginDir= says so."""
    return f"{slurm_root.rstrip('/')}/usr/lib/x86_64-linux-gnu/slurm-wlm"


def local_cgroup_conf(unpacked: bool, constrain_devices: bool, v2: bool) -> CgroupConf | None:
    """The cgroup.conf a local cluster needs, if any: ConstrainDevices=yes for a site's device
    confinement, and IgnoreSystemd on a cgroup v2 machine where Slurm is unpacked (no systemd to
    ask for a scope). Installed Slurm on a site-free cluster needs none."""
    if not constrain_devices and not (unpacked and v2):
        return None
    return CgroupConf(version=2 if v2 else 1, ignore_systemd=unpacked and v2,
                      constrain_devices=constrain_devices)


def python_commands(python: str) -> dict[str, list[str]]:
    """Entry points as `python -m nvshare_slurm.<module>` (a checkout on PYTHONPATH)."""
    return {kind: [python, "-m", f"nvshare_slurm.{kind}"] for kind in ENTRY_POINTS}


def script_commands(bin_dir: str) -> dict[str, list[str]]:
    """Entry points as the installed console scripts in bin_dir."""
    return {kind: [f"{bin_dir.rstrip('/')}/nvshare-{kind}"] for kind in ENTRY_POINTS}


# ---- rendering ---------------------------------------------------------------------------------
def _value(key: str, value: object) -> str:
    text = str(value)
    if not _VALUE_RE.match(text):
        raise LocalClusterError(f"{key}: {text!r} cannot be a slurm.conf value (empty, white space "
                                f"or '#')")
    return text


def _settings(c: LocalCluster) -> list[tuple[str, object]]:
    b = c.base
    node_files = "-%n" if c.per_node_files else ""
    return [
        ("ClusterName", c.name),
        ("SlurmctldHost", f"{c.host}(127.0.0.1)"),
        ("SlurmctldPort", c.ctld_port),
        ("SlurmUser", c.slurm_user),
        ("SlurmdUser", "root"),
        ("AuthType", "auth/munge"),
        ("CredType", "cred/munge"),
        ("AuthInfo", f"socket={c.munge_socket}"),
        ("StateSaveLocation", b / "state"),
        ("SlurmdSpoolDir", b / "spool" / "%n" if c.per_node_files else b / "spool"),
        ("SlurmctldPidFile", b / "slurmctld.pid"),
        ("SlurmdPidFile", b / f"slurmd{node_files}.pid"),
        ("SlurmctldLogFile", b / "slurmctld.log"),
        ("SlurmdLogFile", b / f"slurmd{node_files}.log"),
        ("ProctrackType", c.proctrack),
        ("TaskPlugin", c.task_plugin),
        ("SelectType", "select/cons_tres"),
        ("SelectTypeParameters", "CR_CPU"),
        ("SchedulerParameters", "sched_interval=1,bf_interval=1"),
        ("JobAcctGatherType", "jobacct_gather/none"),
        ("AccountingStorageType", "accounting_storage/none"),
        ("MpiDefault", "none"),
        ("ReturnToService", 2),
        ("SlurmdParameters", "config_overrides"),
        ("KillWait", 2),
        ("GresTypes", c.gres_types),
        ("PrologFlags", "Alloc"),
        ("Prolog", c.prolog or b / "prolog.sh"),
        ("Epilog", c.epilog or b / "epilog.sh"),
        ("TaskProlog", c.task_prolog or b / "taskprolog.sh"),
    ] + ([("PluginDir", c.plugin_dir)] if c.plugin_dir else [])


# Said in the file, for whoever reads a cluster's slurm.conf.
_WHY = {"SchedulerParameters": (
    "# A job submitted while the last one's nodes still complete is marked \"Resources\" and would "
    "wait\n# for the next periodic pass (60 s main, 30 s backfill by default): schedule every "
    "second instead.\n")}


def render_slurm_conf(c: LocalCluster) -> str:
    settings = _settings(c)
    ours = {key for key, _ in settings}
    for key in c.extra:
        if not _KEY_RE.match(key):
            raise LocalClusterError(f"extra: {key!r} is not a slurm.conf key")
        if key in ours:
            raise LocalClusterError(f"extra: {key} is already set ({key}= has a field of its own)")
    kill_wait = next(i for i, (key, _) in enumerate(settings) if key == "KillWait") + 1
    settings[kill_wait:kill_wait] = list(c.extra.items())
    out = [_WHY.get(key, "") + f"{key}={_value(key, value)}\n" for key, value in settings]
    for n in c.nodes:
        words: list[tuple[str, object]] = [("NodeName", n.name)]
        words += [("NodeHostname", n.hostname)] if n.hostname else []
        words += [("NodeAddr", "127.0.0.1"), ("Port", n.port), ("CPUs", n.cpus)]
        if n.one_socket:
            words += [("Sockets", 1), ("CoresPerSocket", n.cpus), ("ThreadsPerCore", 1)]
        words += [("RealMemory", n.real_memory), ("Gres", n.gres), ("State", "UNKNOWN")]
        out.append(" ".join(f"{k}={_value(k, v)}" for k, v in words) + "\n")
    for p in c.partitions:
        words = [("PartitionName", p.name), ("Nodes", ",".join(p.nodes))]
        words += [("Default", "YES")] if p.default else []
        words += [("MaxTime", "INFINITE"), ("State", "UP")]
        words += [("OverSubscribe", p.oversubscribe)] if p.oversubscribe else []
        words += [("PriorityTier", p.priority_tier)] if p.priority_tier is not None else []
        out.append(" ".join(f"{k}={_value(k, v)}" for k, v in words) + "\n")
    return "".join(out)


def render_gres_conf(c: LocalCluster) -> str:
    lines = [line for n in c.nodes for line in n.gres_conf]
    for line in lines:
        if "\n" in line:
            raise LocalClusterError(f"gres.conf: {line!r} is more than one line")
    return "".join(line + "\n" for line in lines)


def render_cgroup_conf(c: LocalCluster) -> str | None:
    g = c.cgroup
    if g is None:
        return None
    if g.version not in (1, 2):
        raise LocalClusterError(f"CgroupPlugin: cgroup/v{g.version} (1 or 2)")
    lines = [f"CgroupPlugin=cgroup/v{g.version}"]
    lines += ["IgnoreSystemd=yes"] if g.ignore_systemd else []
    lines += [f"CgroupMountpoint={_value('CgroupMountpoint', g.mountpoint)}"]
    lines += ["ConstrainDevices=yes"] if g.constrain_devices else []
    return "".join(line + "\n" for line in lines)


def render_wrapper(c: LocalCluster, w: Wrappers, kind: str) -> str:
    before, node, after = w.nvshare_config.partition("{node}")
    config = shlex.quote(before) + ('"$SLURMD_NODENAME"' + shlex.quote(after) if node else "")
    env = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in w.env.items())
    return (f"#!/bin/sh\nexport NVSHARE_CONFIG={config}\n"
            f"export SLURM_CONF={shlex.quote(str(c.slurm_conf))}\n"
            f"{env}exec {shlex.join(w.commands[kind])}\n")


def write(c: LocalCluster, wrappers: Wrappers) -> None:
    """Every file of the description into c.base, and the directories its slurm.conf names.
    A cgroup.conf of an earlier description that needs none is removed."""
    texts = {"slurm.conf": render_slurm_conf(c), "gres.conf": render_gres_conf(c)}
    texts.update({f"{kind}.sh": render_wrapper(c, wrappers, kind) for kind in ENTRY_POINTS})
    cgroup = render_cgroup_conf(c)
    spools = [c.base / "spool" / n.name for n in c.nodes] if c.per_node_files else [c.base / "spool"]
    for directory in (c.base / "state", c.base / "munge", *spools):
        directory.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (c.base / name).write_text(text)
        if name.endswith(".sh"):
            (c.base / name).chmod(0o755)
    if cgroup is not None:
        (c.base / "cgroup.conf").write_text(cgroup)
    else:
        (c.base / "cgroup.conf").unlink(missing_ok=True)


def one_node(base: Path, *, name: str, partition: str, gres: str, gres_conf: Sequence[str],
             cpus: int, slurm_root: str | None = None, constrain_devices: bool = False,
             host: str | None = None, **fields) -> LocalCluster:
    """This host as the one node of a cluster (the demo's, the benchmarks'). slurm_root: Slurm is
    unpacked under it, not installed: PluginDir=, and a cgroup.conf on cgroup v2 (see
    local_cgroup_conf). `fields`: more of LocalCluster's (gres_types, proctrack, extra, ...)."""
    host = host or short_hostname()
    return LocalCluster(
        name=name, base=base, host=host, ctld_port=free_port(),
        nodes=(Node(host, free_port(), gres, tuple(gres_conf), cpus=cpus),),
        partitions=(Partition(partition, (host,), default=True),),
        plugin_dir=unpacked_plugin_dir(slurm_root) if slurm_root else None,
        cgroup=local_cgroup_conf(bool(slurm_root), constrain_devices, cgroup_v2()), **fields)


# ---- command line (scripts/demo.sh) ------------------------------------------------------------
def _assignment(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=Path, help="the cluster's directory (made if missing)")
    p.add_argument("--name", required=True, help="ClusterName")
    p.add_argument("--host", help="the node's name (default: this host's short name)")
    p.add_argument("--partition", required=True, help="the one partition, the default")
    p.add_argument("--cpus", type=int, default=8)
    p.add_argument("--gres", required=True, help="the node's Gres= value")
    p.add_argument("--gres-conf", action="append", default=[], metavar="LINE",
                   help="a gres.conf line (repeat for more)")
    p.add_argument("--gres-types", default="nvshare")
    p.add_argument("--proctrack", default="proctrack/linuxproc")
    p.add_argument("--task-plugin", default="task/none")
    p.add_argument("--constrain-devices", action="store_true",
                   help="cgroup.conf ConstrainDevices=yes (cgroup v1 or v2, as this host mounts)")
    p.add_argument("--slurm-root", help="Slurm is unpacked under this root, not installed")
    p.add_argument("--set", action="append", default=[], type=_assignment, metavar="KEY=VALUE",
                   help="one more slurm.conf key")
    w = p.add_argument_group("the Prolog, Epilog and TaskProlog wrappers")
    w.add_argument("--nvshare-config", required=True, help="nvshare.yaml")
    run = w.add_mutually_exclusive_group(required=True)
    run.add_argument("--python", help="run the entry points as PYTHON -m nvshare_slurm.<module>")
    run.add_argument("--bin-dir", help="run the entry points as BIN_DIR/nvshare-<name>")
    w.add_argument("--wrapper-env", action="append", default=[], type=_assignment,
                   metavar="NAME=VALUE", help="a variable the wrappers export (repeat for more)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    base = args.dir.resolve()
    host = args.host or short_hostname()
    commands = python_commands(args.python) if args.python else script_commands(args.bin_dir)
    try:
        cluster = one_node(
            base, name=args.name, partition=args.partition, gres=args.gres,
            gres_conf=args.gres_conf, cpus=args.cpus, slurm_root=args.slurm_root,
            constrain_devices=args.constrain_devices, host=host, gres_types=args.gres_types,
            proctrack=args.proctrack, task_plugin=args.task_plugin, extra=dict(args.set))
        write(cluster, Wrappers(args.nvshare_config, commands, dict(args.wrapper_env)))
    except (LocalClusterError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
