"""nvshare-prolog: Slurm Prolog (root, once per job per node). Registers nvshare jobs with the daemon.

Jobs that hold no nvshare GRES on this node (and no Slurm gpu/shard GPUs) exit 0 doing nothing.
On typed GRES (nvshare:gpuK) a job that asked for untyped `nvshare:N` is placed by the daemon over
min(N, GPUs) distinct GPUs, as on a count-only node; a typed request follows Slurm's choice.
Exit non-zero only when this node cannot serve nvshare jobs: Slurm then requeues the job and drains
the node, and our last stderr line says why (it is also set as the drain reason).

Daemon down at job start: retry for DAEMON_WAIT_SEC (a restart takes a second or two), then fail.
Starting the job anyway would run it ungated on a shared GPU, and the next nvshare job would fail
the same way; draining makes the problem visible at once and the requeued job runs elsewhere.
"""
from __future__ import annotations

import os
import sys

from .base import config as config_mod
from .base import priority
from .node import slurm
from .node.jobenv import DAEMON_WAIT_SEC, answer_help, drain, node_name, say, with_daemon
from .wire.client import Client, DaemonUnavailable, RequestFailed
from .wire.wire import C


def run(environ: dict[str, str], wait_sec: float = DAEMON_WAIT_SEC) -> int:
    me = "nvshare-prolog"
    job_id = slurm.valid_job_id(environ.get("SLURM_JOB_ID"))
    if job_id is None:
        say(me, None, f"no usable SLURM_JOB_ID ({environ.get('SLURM_JOB_ID')!r}): not run by slurmd?")
        return 0
    node = node_name(environ)
    cfg, config_error = config_mod.load_for_job(environ)
    try:
        env_gpus = slurm.job_gpus_from_env(environ.get("SLURM_JOB_GPUS"))
    except slurm.SlurmError as exc:
        say(me, job_id, f"ignoring SLURM_JOB_GPUS: {exc}")
        env_gpus = []

    def fail(reason: str) -> int:
        say(me, job_id, reason)
        drain(cfg, node, reason, environ)
        return 1

    try:
        record = slurm.show_job(job_id, cfg.slurm_bin_dir, environ=environ)
    except slurm.SlurmError as exc:
        if not env_gpus:
            return fail(f"nvshare: cannot read job {job_id} from slurmctld: {exc}")
        record = slurm.JobRecord(job_id)
    gres = record.on_node(node)
    if not gres.holds_nvshare and not env_gpus:
        return 0
    if config_error:
        return fail(f"nvshare: bad config: {config_error}")

    uid = _int(environ.get("SLURM_JOB_UID"), record.uid)
    gid = _int(environ.get("SLURM_JOB_GID"), record.gid)
    if uid is None or gid is None:
        return fail(f"nvshare: job {job_id} has no SLURM_JOB_UID/SLURM_JOB_GID")
    user = environ.get("SLURM_JOB_USER") or record.user
    gpu_index = list(gres.nvshare_gpus) or (env_gpus if not gres.holds_nvshare else [])
    slots = gres.nvshare_slots
    spread = bool(gres.nvshare_gpus) and slots > len(gres.nvshare_gpus) \
        and asked_untyped(record.tres_requests)
    if spread:
        # `--gres=nvshare:2` on typed GRES: Slurm may pack both slots on gpu0, but the user asked
        # for two slots, i.e. two distinct GPUs where the node has them (the user guide): the
        # daemon places it as on a count-only node.
        gpu_index = []
    if len(gpu_index) > C.NVSHARE_MAX_GPUS:
        return fail(f"nvshare: job {job_id} holds {len(gpu_index)} GPUs, at most "
                    f"{C.NVSHARE_MAX_GPUS} per node are supported")

    # From slurmctld's record, never from the job's environment: the user cannot raise it.
    share = priority.classify(cfg.priority_classes, record.qos, record.partition,
                              record.interactive, record.comment)
    multinode = record.multinode()
    client = Client(cfg.socket, timeout=10.0)
    try:
        placement = with_daemon(lambda: client.register_job(
            job_id, uid, gid, slots=slots, gpu_index=gpu_index, name=record.name, user=user,
            share_class=share.name, class_reason=share.reason, multinode=multinode), wait_sec)
    except DaemonUnavailable:
        return fail("nvshare: scheduler not running")
    except RequestFailed as exc:
        if not gres.holds_nvshare and exc.status == C.NVSHARE_ERR_NOGPU:
            say(me, job_id, f"GPUs {env_gpus} are not managed by nvshare: job runs unshared")
            return 0
        return fail(f"nvshare: scheduler refused job {job_id}: {exc}")
    # strict=False: the daemon pairs them; a reply that does not only shortens this log line, it
    # never fails the prolog.
    pairs = zip(placement["gpu_index"], placement["gpu_uuid"], strict=False)
    where = ", ".join(f"GPU {i} ({u})" for i, u in pairs)
    kind = f"{slots} nvshare slot(s)" if gres.holds_nvshare else f"Slurm GPUs {env_gpus}"
    if spread:
        kind += f" (untyped request, Slurm counted them on GPU(s) {list(gres.nvshare_gpus)})"
    others = f", one of its {sum(map(record.held_nvshare_on, record.nodes))} nodes (multi-node: " \
        f"turns in job-id order)" if multinode else ""
    say(me, job_id, f"registered on {node}: {kind} on {where}, class {share.describe()}{others}")
    return 0


def asked_untyped(tres_requests: str) -> bool:
    """Whether the job's request names nvshare without a type (gres:nvshare:2, gres/nvshare)."""
    for item in tres_requests.split(","):
        name, _, rest = item.strip().removeprefix("gres:").removeprefix("gres/").partition(":")
        if name == "nvshare" and (not rest or rest.isdigit()):
            return True
    return False


def _int(value: str | None, fallback: int | None) -> int | None:
    if value is not None and value.strip().isdigit():
        return int(value.strip())
    return fallback


def main() -> int:
    answer_help("nvshare-prolog", __doc__, sys.argv[1:])
    try:
        return run(dict(os.environ))
    except Exception as exc:  # one line for slurmd's log, never a traceback as the drain reason
        say("nvshare-prolog", slurm.valid_job_id(os.environ.get("SLURM_JOB_ID")),
            f"nvshare: internal error: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
