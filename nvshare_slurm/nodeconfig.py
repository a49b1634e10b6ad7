"""nvshare-node-config: this node's slurm.conf, gres.conf and cgroup.conf lines for nvshare, and
the container runtimes' files (oci.conf, the enroot hook, apptainer.conf).

    nvshare-node-config                    count-only: Gres=gpu:<GPUs>,nvshare:<GPUs x sharers>
    nvshare-node-config --typed            one type per GPU: Gres=gpu:<GPUs>,nvshare:gpu0:4,...
    nvshare-node-config --sharers 8        jobs allowed on each GPU at once (default 4)
    nvshare-node-config --prefix DIR       the entry points are DIR/bin/nvshare-prolog, ...
    nvshare-node-config --json             the same as JSON, for configuration management

It prints one section per file, each headed by a comment line naming it (`# slurm.conf`,
`# gres.conf`, `# cgroup.conf`, `# oci.conf`, `# /etc/enroot/hooks.d/nvshare.sh`,
`# apptainer.conf`), usable verbatim; a site sets up the runtimes its jobs use (containerconf.py).
The GPUs are Slurm `gpu` GRES on their device files, so Slurm's device cgroup (ConstrainDevices=yes)
denies them to every job that holds no `gpu` GRES; an nvshare job's hook gets its GPU's device file
from nvshare-scheduler instead.

The GPUs come from NVML, or from the config's `gpus:` list where it has one (NVSHARE_CONFIG or
--config), in the order the scheduler numbers them: type gpuK is the GPU with index K. The
Prolog=, Epilog= and TaskProlog= paths (and nvshare-container's) are the entry points installed
beside this Python (else /opt/nvshare/bin), or DIR/bin with --prefix DIR; the hook that
apptainer.conf binds is this installation's, the socket directory the config's. It only prints: the
files stay the admin's to edit. Exit status: 0 printed, 1 no GPUs, the inventory or the --config
file cannot be read, or a device path or entry point that is not a plain path, 2 bad arguments.

Slurm runs the Prolog, Epilog and TaskProlog with no environment of ours, so they (and
nvshare-container) read /etc/nvshare/nvshare.yaml. Printed from a config elsewhere (--config or
NVSHARE_CONFIG), the lines work once that file is there: the slurm.conf section and stderr say so,
with the command that links it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Sequence

from . import libnvshare_file
from .base import config as config_mod
from .node import containerconf
from .node import inventory as inventory_mod
from .node.inventory import GpuInfo

PROG = "nvshare-node-config"
DEFAULT_SHARERS = 4
MAX_SHARERS = 1024
DEFAULT_BIN_DIR = "/opt/nvshare/bin"
ENTRY_POINTS = {"Prolog": "nvshare-prolog", "Epilog": "nvshare-epilog",
                "TaskProlog": "nvshare-taskprolog"}
FILES = ("slurm.conf", "gres.conf", "cgroup.conf", "oci.conf", containerconf.ENROOT_HOOK,
         "apptainer.conf")
# What Slurm accepts as a NodeName without quoting; slurmd's default is the short host name.
_NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# A path printed as a value in a Slurm config file: nothing that could end the line, start another
# key (space, '='), a comment ('#') or need quoting.
_PLAIN_PATH_RE = re.compile(r"^/[A-Za-z0-9_./-]+$")


class NodeConfigError(Exception):
    """What the node's lines cannot be printed from (exit status 1)."""


def plain_path(path: str, what: str) -> str:
    if not _PLAIN_PATH_RE.match(path):
        raise NodeConfigError(f"{what}: {path!r} is not a plain absolute path "
                              f"(/ followed by letters, digits, _ . / -): refusing to print it")
    return path


def config_elsewhere(path: Path) -> str:
    """The config's absolute path when it is not the file the entry points read
    (config.DEFAULT_PATH, or a link to it), else ""."""
    if os.path.realpath(path) == os.path.realpath(config_mod.DEFAULT_PATH):
        return ""
    elsewhere = os.path.abspath(path)
    if not elsewhere.isprintable():
        raise NodeConfigError(f"the config's path {elsewhere!r} holds control characters: "
                              f"refusing to print it")
    return elsewhere


def link_command(config: str) -> str:
    """What puts a config kept elsewhere where the entry points read it."""
    default = config_mod.DEFAULT_PATH
    return f"mkdir -p {shlex.quote(str(Path(default).parent))}; ln -s {shlex.quote(config)} {default}"


def entry_point_dir(prefix: str | None) -> str:
    """Where nvshare-prolog and the others are: DIR/bin for --prefix DIR, else beside this Python
    (the virtualenv's bin, not resolved: Slurm must run the venv's scripts), else
    /opt/nvshare/bin."""
    if prefix is not None:
        if not prefix.startswith("/"):
            raise NodeConfigError(f"--prefix: {prefix!r} is not an absolute path (Slurm runs the "
                                  f"Prolog with no working directory of yours)")
        return plain_path(str(Path(prefix) / "bin"), "--prefix")
    here = Path(sys.executable).parent
    if sys.executable and (here / ENTRY_POINTS["Prolog"]).exists():
        return plain_path(str(here), "the entry points' directory (--prefix DIR names another)")
    print(f"{PROG}: no {ENTRY_POINTS['Prolog']} beside {sys.executable}: printing "
          f"{DEFAULT_BIN_DIR}/... (--prefix DIR names where they are)", file=sys.stderr)
    return DEFAULT_BIN_DIR


@dataclass(frozen=True)
class NodeGres:
    node: str
    sharers_per_gpu: int
    typed: bool
    gpus: tuple[GpuInfo, ...]
    bin_dir: str = DEFAULT_BIN_DIR
    hook: str = "/opt/nvshare/lib/libnvshare.so"     # what containers bind (apptainer.conf)
    socket: str = config_mod.Config.socket
    config_elsewhere: str = ""      # the config printed from, where it is not the entry points'

    @property
    def slots(self) -> int:
        return self.sharers_per_gpu * len(self.gpus)

    def gres_value(self) -> str:
        """The NodeName line's Gres=: the GPUs as Slurm's gpu GRES, then the nvshare slots."""
        if not self.typed:
            nvshare = f"nvshare:{self.slots}"
        else:
            nvshare = ",".join(f"nvshare:gpu{g.index}:{self.sharers_per_gpu}" for g in self.gpus)
        return f"gpu:{len(self.gpus)},{nvshare}"

    def slurm_conf_line(self) -> str:
        return f"NodeName={self.node} Gres={self.gres_value()}"

    def entry_points(self) -> dict[str, str]:
        return {key: f"{self.bin_dir}/{name}" for key, name in ENTRY_POINTS.items()}

    def gpu_gres_conf_lines(self) -> list[str]:
        return [f"NodeName={self.node} Name=gpu File={g.device}" for g in self.gpus]

    def nvshare_gres_conf_lines(self) -> list[str]:
        if not self.typed:
            return [f"NodeName={self.node} Name=nvshare Count={self.slots}"]
        return [f"NodeName={self.node} Name=nvshare Type=gpu{g.index} Count={self.sharers_per_gpu}"
                for g in self.gpus]

    def gres_conf_lines(self) -> list[str]:
        """gres.conf's lines for this node, without comments."""
        return self.gpu_gres_conf_lines() + self.nvshare_gres_conf_lines()

    def config_note(self) -> list[str]:
        """slurm.conf's comment on a config kept elsewhere: the entry points read the default."""
        if not self.config_elsewhere:
            return []
        return [f"# These read {config_mod.DEFAULT_PATH} (Slurm gives them no NVSHARE_CONFIG), and",
                f"# this was printed from {shlex.quote(self.config_elsewhere)}: put it there on every node:",
                f"# {link_command(self.config_elsewhere)}"]

    def files(self) -> dict[str, list[str]]:
        """Each file's lines (comments included), in the order the text prints them."""
        entry = self.entry_points()
        slurm_conf = [
            "# Once per cluster, the same on every node and the controller; restart",
            "# slurmctld and slurmd after changing GresTypes, TaskPlugin or ProctrackType.",
            "# Keep the site's other GRES types beside these.",
            "GresTypes=gpu,nvshare",
            "# The Prolog runs at allocation on every node of the job, before any step.",
            "PrologFlags=Alloc",
            "# Absolute paths: Slurm runs these with no PATH. A site with its own Prolog,",
            "# Epilog or TaskProlog calls these from it (keeping their exit status, and",
            "# the TaskProlog's stdout).",
            *self.config_note(),
            *(f"{key}={path}" for key, path in entry.items()),
            "# Device confinement needs task/cgroup: a site with other task plugins keeps",
            "# them beside it (TaskPlugin=task/cgroup,task/affinity).",
            "TaskPlugin=task/cgroup",
            "ProctrackType=proctrack/cgroup",
            "# This node. The rest of its NodeName line (CPUs=, RealMemory=, ...) comes",
            "# from `slurmd -C`; a shard GRES it has stays in Gres= beside these.",
            self.slurm_conf_line(),
        ]
        style = ("Type gpuK is the GPU with index K" if self.typed
                 else "nvshare-scheduler picks the GPUs")
        gres_conf = [
            "# The same on the node and the controller. The GPUs as Slurm's gpu GRES on",
            "# their device files, in index order: Slurm's device cgroup denies them to",
            "# every job that holds no gpu GRES.",
            *self.gpu_gres_conf_lines(),
            f"# The nvshare slots: {self.sharers_per_gpu} jobs at once on each GPU ({style}).",
            *self.nvshare_gres_conf_lines(),
        ]
        cgroup_conf = [
            "# nvshare jobs reach their GPU through nvshare-scheduler, every other job",
            "# only through Slurm's gpu GRES. Keep the site's other settings (CgroupPlugin=).",
            "ConstrainDevices=yes",
        ]
        return {"slurm.conf": slurm_conf, "gres.conf": gres_conf, "cgroup.conf": cgroup_conf,
                "oci.conf": containerconf.oci_conf(self.bin_dir),
                containerconf.ENROOT_HOOK: containerconf.enroot_hook(self.bin_dir),
                "apptainer.conf": containerconf.apptainer_conf(self.hook,
                                                               str(Path(self.socket).parent))}


def _printable(text: str) -> str:
    """Text from NVML on one comment line: nothing that could end it or start a new one."""
    return "".join(c if c.isprintable() else "?" for c in text)[:80]


def render_text(node_gres: NodeGres, source: str) -> str:
    n = node_gres
    style = "typed per GPU" if n.typed else "count-only"
    lines = [f"# {PROG}: {n.node}: {len(n.gpus)} GPU(s) from {source}, {n.sharers_per_gpu} sharers "
             f"per GPU, {style}"]
    lines += [f"#   gpu{g.index}: {g.device} {_printable(g.uuid)} "
              f"{config_mod.format_size(g.memory_total)} {_printable(g.name)}"
              for g in n.gpus]
    lines.append("# Each section below goes into the file its first line names.")
    for name, body in n.files().items():
        lines += ["", f"# {name}", *body]
    return "\n".join(lines) + "\n"


def render_json(node_gres: NodeGres, source: str) -> str:
    n = node_gres
    return json.dumps({
        "node": n.node, "source": source, "sharers_per_gpu": n.sharers_per_gpu, "typed": n.typed,
        "slots": n.slots,
        "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name, "memory": g.memory_total,
                  "device": g.device}
                 for g in n.gpus],
        "slurm_conf": {"NodeName": n.node, "Gres": n.gres_value()},
        "gres_conf": n.gres_conf_lines(),
        "entry_points": n.entry_points(),
        "files": n.files(),
    }, indent=2) + "\n"


def check_gpus(gpus: Sequence[GpuInfo]) -> None:
    """Every GPU's device file is printed as gres.conf's File=: plain, and each one once."""
    seen: dict[str, int] = {}
    for g in gpus:
        plain_path(g.device, f"gpu{g.index}'s device file")
        if g.device in seen:
            raise NodeConfigError(f"gpu{seen[g.device]} and gpu{g.index} have the same device file "
                                  f"{g.device}: slurmd would refuse the gres.conf")
        seen[g.device] = g.index


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sharers", type=int, default=DEFAULT_SHARERS, metavar="N",
                        help=f"jobs allowed on each GPU at once (default {DEFAULT_SHARERS})")
    parser.add_argument("--typed", action="store_true",
                        help="one GRES type per GPU (gpu0, gpu1, ...): Slurm accounts per GPU")
    parser.add_argument("--node", metavar="NAME",
                        help="the NodeName (default: this host's short name, as slurmd uses)")
    parser.add_argument("--config", metavar="PATH",
                        help="nvshare.yaml to read `gpus:` from; it must exist (default: "
                             f"NVSHARE_CONFIG or {config_mod.DEFAULT_PATH}, if there)")
    parser.add_argument("--prefix", metavar="DIR",
                        help="where nvshare-slurm is installed: Prolog=DIR/bin/nvshare-prolog, ... "
                             f"(default: beside this Python, else {DEFAULT_BIN_DIR})")
    parser.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: Sequence[str] | None = None,
         inventory_for: Callable[[config_mod.Config], inventory_mod.Inventory] = inventory_mod.from_config,
         ) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    node = args.node or socket.gethostname().split(".")[0]
    if not _NODE_NAME_RE.match(node):
        parser.error(f"--node: {node!r} is not a usable Slurm NodeName")
    if not 1 <= args.sharers <= MAX_SHARERS:
        parser.error(f"--sharers: expected 1 .. {MAX_SHARERS}, got {args.sharers}")
    try:
        bin_dir = entry_point_dir(args.prefix)
        # A --config named on the command line must be there: without it NVML would be asked, and
        # its failure would hide the mistyped path.
        cfg = config_mod.load(path=args.config, require_file=args.config is not None)
        source = "the config's gpus: list" if cfg.gpus else "NVML"
        gpus = tuple(sorted(inventory_for(cfg).gpus(), key=lambda g: g.index))
        check_gpus(gpus)
        hook = plain_path(libnvshare_file(), "the hook's path")
        socket_path = plain_path(cfg.socket, "the config's socket")
        elsewhere = config_elsewhere(Path(args.config) if args.config is not None
                                     else config_mod.config_path())
    except (config_mod.ConfigError, inventory_mod.InventoryError, NodeConfigError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    if not gpus:
        print(f"{PROG}: {source} lists no GPUs on {node}: nothing to share", file=sys.stderr)
        return 1
    if elsewhere:
        print(f"{PROG}: printed from {elsewhere}, but the Prolog, Epilog, TaskProlog and "
              f"nvshare-container read {config_mod.DEFAULT_PATH} (Slurm gives them no NVSHARE_CONFIG): "
              f"put it there on every node: {link_command(elsewhere)}", file=sys.stderr)
    node_gres = NodeGres(node, args.sharers, args.typed, gpus, bin_dir, hook, socket_path, elsewhere)
    render = render_json if args.json else render_text
    sys.stdout.write(render(node_gres, source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
