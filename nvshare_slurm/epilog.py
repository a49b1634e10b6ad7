"""nvshare-epilog: Slurm Epilog (root, once per job per node). Unregisters the job from the daemon.

Idempotent: an unknown job (never nvshare, already unregistered, daemon restarted without it) is fine.
A failing Epilog drains the node, so before reporting failure it re-checks: a daemon that cannot be
reached only matters if the job held nvshare here (then the daemon would keep a dead job's placement).
"""
from __future__ import annotations

import os
import sys

from . import slurm
from .client import Client, DaemonUnavailable, RequestFailed
from .prolog import DAEMON_WAIT_SEC, answer_help, drain, load_config, node_name, say, with_daemon
from .proto import C

ME = "nvshare-epilog"


def run(environ: dict[str, str], wait_sec: float = DAEMON_WAIT_SEC) -> int:
    job_id = slurm.valid_job_id(environ.get("SLURM_JOB_ID"))
    if job_id is None:
        say(ME, None, f"no usable SLURM_JOB_ID ({environ.get('SLURM_JOB_ID')!r}): not run by slurmd?")
        return 0
    node = node_name(environ)
    cfg, config_error = load_config(environ)
    client = Client(cfg.socket, timeout=10.0)
    problem = ""
    if config_error:
        problem = f"nvshare: bad config: {config_error}"
    else:
        for wait in (wait_sec, 0.5):   # the second pass re-checks before reporting failure
            try:
                message = with_daemon(lambda: client.unregister_job(job_id), wait)
                if message != "not registered":
                    say(ME, job_id, f"unregistered on {node}")
                return 0
            except DaemonUnavailable:
                problem = "nvshare: scheduler not running"
            except RequestFailed as exc:
                if exc.status == C.NVSHARE_ERR_NOJOB:
                    return 0
                problem = f"nvshare: scheduler refused to unregister job {job_id}: {exc}"
    # Only a job that held nvshare (or Slurm GPUs) here can leave state behind.
    if not environ.get("SLURM_JOB_GPUS"):
        try:
            held = slurm.show_job(job_id, cfg.slurm_bin_dir, environ=environ).on_node(node)
        except slurm.SlurmError:
            held = None   # cannot tell: assume it did, the daemon is broken either way
        if held is not None and not held.holds_nvshare:
            return 0
    say(ME, job_id, problem)
    drain(cfg, node, problem, environ)
    return 1


def main() -> int:
    answer_help(ME, __doc__, sys.argv[1:])
    try:
        return run(dict(os.environ))
    except Exception as exc:
        say(ME, slurm.valid_job_id(os.environ.get("SLURM_JOB_ID")),
            f"nvshare: internal error: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
