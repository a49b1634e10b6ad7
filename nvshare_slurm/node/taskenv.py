"""What a managed job's task is given: the `export` lines of the hook, the placed GPUs, the
daemon's socket and the policies, and the placement they come from (the daemon's answer; while it
cannot be reached, state.json's, else every GPU nvshare manages here). nvshare-taskprolog prints
them; nvshare-container puts them in a container's environment. Its lines are the TaskProlog's.

Slurm reads each exported line literally up to the newline, with no quoting: every value is checked
to be one line of plain characters (UnsafeValue otherwise), and user-controlled text (an existing
LD_PRELOAD) is only passed on when it is safe.

The TaskProlog runs for every task: this module imports nothing slow at import; each way that
needs more (the daemon, config.py, Slurm, NVML) imports it when it gets there.
"""
from __future__ import annotations

import re
import time

from ..base import taskconfig

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..base.config import Config

ME = "nvshare-taskprolog"       # its lines, also where nvshare-container asks
_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")
_JOB_ID = re.compile(r"^[1-9]\d{0,9}$")        # slurm.valid_job_id's; a test keeps them equal


class UnsafeValue(ValueError):
    pass


def export_line(name: str, value: str) -> str:
    """`export NAME=value` for Slurm's TaskProlog parser; refuses what it cannot carry literally."""
    if not _NAME.match(name):
        raise UnsafeValue(f"bad variable name {name!r}")
    if _UNSAFE.search(value):
        raise UnsafeValue(f"{name}: value holds control characters")
    return f"export {name}={value}"


def ld_preload(hook: str, existing: str | None) -> str:
    """The hook first, then the existing entries (minus the hook itself: steps inherit the job's)."""
    entries = [hook]
    for entry in re.split(r"[: ]+", existing or ""):
        if not entry or entry == hook or _UNSAFE.search(entry):
            continue
        entries.append(entry)
    return ":".join(entries)


def export_lines(job_id: int, placement: dict[str, Any], cfg: Config | taskconfig.TaskConfig, hook: str,
                 existing_preload: str | None) -> list[str]:
    """The exports; a placement marked "managed_only" (the daemon could not be asked) names the
    GPUs to gate but leaves the GPUs the job sees as Slurm set them, and may name none (the hook
    then gates every GPU)."""
    uuids = placement["gpu_uuid"]
    for uuid in uuids:
        if not _UUID.match(uuid):
            raise UnsafeValue(f"the daemon placed the job on a GPU with an unusable UUID {uuid!r}")
    managed_only = placement.get("managed_only", False)
    if not uuids and not managed_only:
        raise UnsafeValue("the daemon placed the job on no GPU")
    gpus = ",".join(uuids)
    lines = [export_line("LD_PRELOAD", ld_preload(hook, existing_preload))]
    if not managed_only:
        lines.append(export_line("CUDA_VISIBLE_DEVICES", gpus))
    if gpus:
        lines.append(export_line("NVSHARE_MANAGED_GPUS", gpus))
    lines += [export_line("NVSHARE_SOCKET", cfg.socket),
             export_line("NVSHARE_JOB_ID", str(job_id)),
             export_line("NVSHARE_ON_DAEMON_LOSS", cfg.on_daemon_loss)]
    if not cfg.swap:
        # Only "off" is written: the hook's default is on, and a job may still turn it off itself.
        lines.append(export_line("NVSHARE_SWAP", "off"))
    if cfg.swap_prepin:
        lines.append(export_line("NVSHARE_SWAP_PREPIN", "1"))
    return lines


def placement_of(job_id: int, cfg: Config | taskconfig.TaskConfig, environ: dict[str, str],
                 wait_sec: float) -> tuple[dict[str, Any], Config | taskconfig.TaskConfig] | None:
    """The job's placement and the config to export it with, or None: nothing to export.
    Imported here, so that the site's TaskProlog already runs while these load."""
    from ..wire.client import DaemonUnavailable, RequestFailed, query_job
    from ..wire.wire import C
    socket_path, started = cfg.socket, time.monotonic()

    def ask() -> dict[str, Any]:
        return query_job(socket_path, job_id, timeout=wait_sec, connect_wait=wait_sec)

    try:
        try:
            return ask(), cfg
        except DaemonUnavailable:   # restarting, or its backlog full: retry what is left of wait_sec
            from .jobenv import with_daemon
            return with_daemon(ask, wait_sec - (time.monotonic() - started)), cfg
    except DaemonUnavailable as exc:
        full = cfg if not isinstance(cfg, taskconfig.TaskConfig) else config_or_fallback(environ)[0]
        placement = placement_without_daemon(job_id, full, environ)
        if placement is None:
            return None
        where = "its GPUs from state.json" if not placement.get("managed_only") else \
            "every GPU nvshare manages here gated"
        say(job_id, f"scheduler cannot be reached ({exc}): task starts with the hook, "
                    f"{where}, on_daemon_loss={full.on_daemon_loss}")
        return placement, full
    except RequestFailed as exc:
        if exc.status != C.NVSHARE_ERR_NOJOB:
            say(job_id, f"scheduler refused the placement query: {exc}")
        return None


def valid_job_id(value: str | None) -> int | None:
    """slurm.valid_job_id, without importing slurm.py (subprocess, dataclasses)."""
    if value is None or not _JOB_ID.match(value.strip()):
        return None
    return int(value.strip())


def say(job_id: int | None, message: str) -> None:
    """A line of the TaskProlog's (also where nvshare-container asks: the same steps, said alike)."""
    from .jobenv import say as say_line
    say_line(ME, job_id, message)


def full_config(job_id: int | None, environ: dict[str, str]) -> Config | None:
    """The node's config through config.load (file only), or None after saying why it is bad."""
    cfg, error = config_or_fallback(environ)
    if error:
        say(job_id, f"bad config: {error}")
        return None
    return cfg


def config_or_fallback(environ: dict[str, str]) -> tuple[Config, str]:
    """The node's config through config.load (file only) and ''; for a file that config.load
    refuses, config.fallback's safe defaults and the error."""
    from ..base import config as config_mod
    file_only = {"NVSHARE_CONFIG": environ["NVSHARE_CONFIG"]} if "NVSHARE_CONFIG" in environ else {}
    try:
        return config_mod.load(environ=file_only), ""
    except config_mod.ConfigError as exc:
        return config_mod.fallback(file_only), str(exc)


def placement_without_daemon(job_id: int, cfg: Config,
                             environ: dict[str, str]) -> dict[str, Any] | None:
    """The job's GPUs when the daemon cannot be asked: its entry in the daemon's state.json, else
    (unless Slurm says the job holds no nvshare GPU here) every GPU the node manages."""
    from . import slurm
    from .jobenv import node_name
    from .statefile import state_jobs
    for job in state_jobs(cfg.state_dir) or []:
        if isinstance(job, dict) and job.get("job_id") == job_id:
            uuids = [u for u in job.get("gpus", []) if isinstance(u, str)]
            if uuids:
                return {"gpu_uuid": uuids}
    node = node_name(environ)
    try:
        gres = slurm.show_job(job_id, cfg.slurm_bin_dir, timeout=5.0, attempts=1).on_node(node)
        if not gres.holds_nvshare and not gres.gpu_index:
            return None
    except slurm.SlurmError:
        pass        # cannot tell: gating a job that needs none only makes it wait
    try:
        from .inventory import from_config
        uuids = [g.uuid for g in from_config(cfg).gpus()]
    except Exception:  # noqa: BLE001 - NVML missing or failing: the hook then gates every GPU
        uuids = []
    return {"gpu_uuid": [u for u in uuids if _UUID.match(u)], "managed_only": True}
