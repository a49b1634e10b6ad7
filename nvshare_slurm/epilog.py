"""nvshare-epilog: Slurm Epilog (root, once per job per node). Unregisters the job from the daemon.

Idempotent: an unknown job (never nvshare, already unregistered, daemon restarted without it) is fine.
A failing Epilog drains the node, so before reporting failure it re-checks: a daemon that cannot be
reached only matters if the job held nvshare here (then the daemon would keep a dead job's placement).
It learns that from what was recorded, never from the job's node line (which shows an empty GRES=
while the job is COMPLETING, exactly when the epilog runs): the daemon's state.json listing the job
(it registered here), or Slurm's record of the job asking for nvshare GRES (TresPerNode) on a node
list that includes this one. A job Slurm does not know (an epilog run by hand) never drains.
"""
from __future__ import annotations

import os
import sys

from .base import config as config_mod
from .node import slurm
from .node.jobenv import DAEMON_WAIT_SEC, answer_help, drain, node_name, say, with_daemon
from .node.statefile import job_in_state
from .scheduler.accounting import usage_line
from .wire.client import Client, DaemonUnavailable, RequestFailed
from .wire.wire import C

ME = "nvshare-epilog"


def run(environ: dict[str, str], wait_sec: float = DAEMON_WAIT_SEC) -> int:
    job_id = slurm.valid_job_id(environ.get("SLURM_JOB_ID"))
    if job_id is None:
        say(ME, None, f"no usable SLURM_JOB_ID ({environ.get('SLURM_JOB_ID')!r}): not run by slurmd?")
        return 0
    node = node_name(environ)
    cfg, config_error = config_mod.load_for_job(environ)
    client = Client(cfg.socket, timeout=10.0)
    problem = ""
    if config_error:
        problem = f"nvshare: bad config: {config_error}"
    else:
        for wait in (wait_sec, 0.5):   # the second pass re-checks before reporting failure
            try:
                usage = job_usage(client, job_id)     # asked first: unregistering forgets it
                message = with_daemon(lambda: client.unregister_job(job_id), wait)
                if message != "not registered":
                    say(ME, job_id, f"unregistered on {node}")
                    if usage is not None:   # the scheduler logs it (and writes AdminComment)
                        say(ME, job_id, f"GPU usage on {node}: {usage}")
                return 0
            except DaemonUnavailable:
                problem = "nvshare: scheduler not running"
            except RequestFailed as exc:
                if exc.status == C.NVSHARE_ERR_NOJOB:
                    return 0
                problem = f"nvshare: scheduler refused to unregister job {job_id}: {exc}"
    if must_drain(cfg, job_id, node, environ):
        say(ME, job_id, problem)
        drain(cfg, node, problem, environ)
        return 1
    say(ME, job_id, f"{problem}; the job held no nvshare GRES here and was not registered: "
                    f"not draining")
    return 0


def must_drain(cfg: config_mod.Config, job_id: int, node: str, environ: dict[str, str]) -> bool:
    """With the scheduler unreachable: whether this job can have left state behind here (it
    registered, or held nvshare or Slurm GPUs on this node), so the node cannot serve nvshare jobs
    until the scheduler is back."""
    registered = job_in_state(cfg.state_dir, job_id)
    try:
        record = slurm.show_job(job_id, cfg.slurm_bin_dir, environ=environ)
    except slurm.SlurmError as exc:
        if "Invalid job id" in str(exc):
            return False          # Slurm does not know it: run by hand, nothing of it runs here
        # Slurm cannot tell either: what the daemon recorded decides; nothing readable: drain.
        return registered is not False or bool(environ.get("SLURM_JOB_GPUS"))
    return registered is True or record.held_nvshare_on(node) or \
        bool(environ.get("SLURM_JOB_GPUS"))


def job_usage(client: Client, job_id: int) -> str | None:
    """The job's GPU usage on this node as one line, or None when the daemon cannot say."""
    try:
        job = client.status(C.NVSHARE_STATUS_JOB, job_id)["jobs"][0]
        index_of = dict(zip(job["gpus"], job["gpu_index"], strict=True))
        return usage_line(job.get("usage", {}), index_of)
    except (DaemonUnavailable, RequestFailed, LookupError, TypeError, ValueError):
        return None


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
