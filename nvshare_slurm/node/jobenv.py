"""What the Slurm entry points (prolog, epilog, taskprolog) share: their one log line, --help, the
node's name, waiting out a restarting daemon, and draining the node with a reason.

It imports nothing slow at import: the TaskProlog, which runs before every task, uses it.
"""
from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypeVar
    from collections.abc import Callable

    from ..base.config import Config

    T = TypeVar("T")

DAEMON_WAIT_SEC = 5.0   # a restarting daemon is back within a second or two


def say(component: str, job_id: int | None, message: str) -> None:
    """One stderr line for slurmd's log: 'nvshare-prolog: job 12: ...' (never more than one line)."""
    where = f"job {job_id}: " if job_id is not None else ""
    text = " ".join(message.split())
    print(f"{component}: {where}{text}", file=sys.stderr, flush=True)


def answer_help(prog: str, doc: str, argv: list[str]) -> None:
    """`--help`: print doc and exit 0. Slurm passes no arguments; any other is ignored, never a
    failure, because a failing Prolog or Epilog drains the node."""
    import argparse
    import textwrap

    from ..base.config import DEFAULT_PATH
    parser = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=textwrap.fill(
            "Slurm runs it as root from slurmd, with SLURM_JOB_ID, SLURM_JOB_UID, SLURMD_NODENAME, "
            f"... and no PATH; the config is NVSHARE_CONFIG or {DEFAULT_PATH}. Exit "
            "status 0: done, or nothing to do; 1: this node cannot serve nvshare jobs (the last "
            "stderr line says why, and becomes the node's drain reason).", 100))
    parser.parse_known_args(argv)


def node_name(environ: dict[str, str]) -> str:
    """Slurm's name of this node, else the short host name."""
    return environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def with_daemon(call: Callable[[], T], wait_sec: float) -> T:
    """Run call(); while the daemon is unreachable, retry with backoff for wait_sec."""
    from ..wire.client import DaemonUnavailable
    deadline = time.monotonic() + wait_sec
    delay = 0.1
    while True:
        try:
            return call()
        except DaemonUnavailable:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def drain(cfg: Config, node: str, reason: str, environ: dict[str, str]) -> None:
    """Set our reason on the node; slurmd drains it anyway, but with a generic 'Prolog error'."""
    from . import slurm
    slurm.drain_node(node, reason, cfg.slurm_bin_dir, environ)
