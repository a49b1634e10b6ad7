"""nvshare-node-config: this node's slurm.conf Gres= and gres.conf lines for the nvshare GRES.

    nvshare-node-config                    count-only: Gres=nvshare:<GPUs x sharers>
    nvshare-node-config --typed            one type per GPU: Gres=nvshare:gpu0:4,nvshare:gpu1:4,...
    nvshare-node-config --sharers 8        jobs allowed on each GPU at once (default 4)
    nvshare-node-config --json             the same as JSON, for configuration management

The GPUs come from NVML, or from the config's `gpus:` list where it has one (NVSHARE_CONFIG or
--config), in the order the scheduler numbers them: type gpuK is the GPU with index K. It only
prints: slurm.conf and gres.conf stay the admin's to edit.
Exit status: 0 printed, 1 no GPUs, the inventory or the --config file cannot be read, 2 bad
arguments.
"""
from __future__ import annotations

import argparse
import json
import re
import socket
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from . import config as config_mod
from . import inventory as inventory_mod
from .inventory import GpuInfo

PROG = "nvshare-node-config"
DEFAULT_SHARERS = 4
MAX_SHARERS = 1024
# What Slurm accepts as a NodeName without quoting; slurmd's default is the short host name.
_NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class NodeGres:
    node: str
    sharers_per_gpu: int
    typed: bool
    gpus: tuple[GpuInfo, ...]

    @property
    def slots(self) -> int:
        return self.sharers_per_gpu * len(self.gpus)

    def gres_value(self) -> str:
        """The value of the NodeName line's Gres= (merge it with gpu/shard GRES the node has)."""
        if not self.typed:
            return f"nvshare:{self.slots}"
        return ",".join(f"nvshare:gpu{g.index}:{self.sharers_per_gpu}" for g in self.gpus)

    def slurm_conf_line(self) -> str:
        return f"NodeName={self.node} Gres={self.gres_value()}"

    def gres_conf_lines(self) -> list[str]:
        if not self.typed:
            return [f"NodeName={self.node} Name=nvshare Count={self.slots}"]
        return [f"NodeName={self.node} Name=nvshare Type=gpu{g.index} Count={self.sharers_per_gpu}"
                for g in self.gpus]


def _printable(text: str) -> str:
    """Text from NVML on one comment line: nothing that could end it or start a new one."""
    return "".join(c if c.isprintable() else "?" for c in text)[:80]


def render_text(node_gres: NodeGres, source: str) -> str:
    n = node_gres
    style = "typed per GPU" if n.typed else "count-only"
    lines = [f"# {PROG}: {n.node}: {len(n.gpus)} GPU(s) from {source}, {n.sharers_per_gpu} sharers "
             f"per GPU, {style}"]
    lines += [f"#   gpu{g.index}: {_printable(g.uuid)} {config_mod.format_size(g.memory_total)} "
              f"{_printable(g.name)}"
              for g in n.gpus]
    lines += [
        "",
        "# slurm.conf: put this Gres= on the node's NodeName line (`slurmd -C` prints the rest of",
        "# it; keep gpu/shard GRES beside it: Gres=gpu:4,nvshare:...). Once per cluster:",
        "# GresTypes=nvshare, PrologFlags=Alloc, Prolog=, Epilog=, TaskProlog= as in",
        "# <prefix>/share/nvshare-slurm/slurm.conf.snippet.",
        n.slurm_conf_line(),
        "",
        "# gres.conf",
        *n.gres_conf_lines(),
    ]
    return "\n".join(lines) + "\n"


def render_json(node_gres: NodeGres, source: str) -> str:
    n = node_gres
    return json.dumps({
        "node": n.node, "source": source, "sharers_per_gpu": n.sharers_per_gpu, "typed": n.typed,
        "slots": n.slots,
        "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name, "memory": g.memory_total}
                 for g in n.gpus],
        "slurm_conf": {"NodeName": n.node, "Gres": n.gres_value()},
        "gres_conf": n.gres_conf_lines(),
    }, indent=2) + "\n"


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
        # A --config named on the command line must be there: without it NVML would be asked, and
        # its failure would hide the mistyped path.
        cfg = config_mod.load(path=args.config, require_file=args.config is not None)
        source = "the config's gpus: list" if cfg.gpus else "NVML"
        gpus = tuple(sorted(inventory_for(cfg).gpus(), key=lambda g: g.index))
    except (config_mod.ConfigError, inventory_mod.InventoryError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    if not gpus:
        print(f"{PROG}: {source} lists no GPUs on {node}: nothing to share", file=sys.stderr)
        return 1
    node_gres = NodeGres(node, args.sharers, args.typed, gpus)
    sys.stdout.write(render_json(node_gres, source) if args.json else render_text(node_gres, source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
