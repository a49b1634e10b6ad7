"""nvshare-taskprolog: Slurm TaskProlog (the job's user, before every task of every step).

Prints `export NAME=value` lines that slurmstepd puts in the task's environment: the hook
(LD_PRELOAD), the placed GPUs (CUDA_VISIBLE_DEVICES, NVSHARE_MANAGED_GPUS), the daemon's socket,
the job id, the daemon-loss policy and, when the config turns swap off, NVSHARE_SWAP=off (and
NVSHARE_SWAP_PREPIN=1 with swap_prepin). Jobs the daemon does not know print nothing.

A site's own TaskProlog (config `site_task_prolog`; Slurm takes only one) runs from here, beside
the query to the daemon, for every job: its output comes first and unchanged, nvshare's exports
after it (LD_PRELOAD keeps the site's entries after the hook), and its exit status is this
program's, so a site program that fails still fails the task (sitetask.py).

A config file that config.load refuses must not hand out an ungated task either: the TaskProlog
then asks the daemon with config.fallback's settings (the file's socket where that line alone is
usable, on_daemon_loss=wait), exports the hook for a job it placed, and says why on stderr.

A daemon that cannot be reached (restarting, or its backlog full under a flood) must not hand out
an ungated task on a shared GPU: the TaskProlog then still exports the hook, with the job's GPUs
from the daemon's state.json when it can read them, else every GPU the node manages, unless
Slurm says the job holds nothing of nvshare here. The hook then follows on_daemon_loss (wait).

Slurm reads each stdout line literally up to the newline, with no quoting: every value printed here
is checked to be one line of plain characters, and user-controlled text (an existing LD_PRELOAD) is
only passed on when it is safe. The config comes from the node's file (NVSHARE_CONFIG or
/etc/nvshare/nvshare.yaml) only, never from NVSHARE_* overrides in the job's environment.

It runs for every task (`srun -n 64` runs it 64 times), so the way through for a registered job
imports no yaml (bench/bench_taskprolog.py measures it): taskconfig reads the settings it needs
from a plain config file, client.query_job asks the daemon with wire.py's codec. Every
other way (a config taskconfig does not read, the daemon unreachable, an error to report) imports
what it needs when it gets there.
"""
from __future__ import annotations

import os
import re
import sys
import time

from . import libnvshare_file, taskconfig
from .jobenv import DAEMON_WAIT_SEC

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TextIO

    from .config import Config

ME = "nvshare-taskprolog"
CHAIN_VAR = "NVSHARE_TASKPROLOG_PID"   # in the site's program's environment only
USAGE = """usage: nvshare-taskprolog

Slurm TaskProlog of nvshare-slurm (TaskProlog=/path/to/nvshare-taskprolog in slurm.conf). Run by
slurmstepd as the job's user before each task; prints `export NAME=value` lines for the task's
environment (LD_PRELOAD, CUDA_VISIBLE_DEVICES, NVSHARE_SOCKET, ...) for jobs with nvshare GPUs on
this node, nothing for other jobs. Reads SLURM_JOB_ID and the node's config (NVSHARE_CONFIG or
/etc/nvshare/nvshare.yaml). When the config names a site_task_prolog, runs that program first,
prints its output before nvshare's lines, and exits with its status; otherwise always exits 0.
"""
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


def run(environ: dict[str, str], out: TextIO = sys.stdout,
        wait_sec: float = DAEMON_WAIT_SEC) -> int:
    """The site's TaskProlog's output (when the config names one), then nvshare's exports; the
    site's exit status, else 0."""
    job_id = valid_job_id(environ.get("SLURM_JOB_ID"))
    config_path = environ.get("NVSHARE_CONFIG", taskconfig.DEFAULT_PATH)
    cfg: Config | taskconfig.TaskConfig | None = taskconfig.read(config_path)
    config_error = ""
    if cfg is None:
        cfg, config_error = config_or_fallback(environ)
    site = start_site(None if config_error else cfg, config_path, environ)
    found = None
    if job_id is not None:
        try:
            found = placement_of(job_id, cfg, environ, wait_sec)
        except Exception as exc:  # noqa: BLE001 - the site's program is still collected below
            say(job_id, f"internal error, task starts without nvshare: {type(exc).__name__}: {exc}")
    if config_error:
        # Never ungated on a managed GPU: a job the scheduler placed gets the hook, with the
        # file's socket where that line alone is usable and on_daemon_loss=wait.
        say(job_id, f"bad config: {config_error}; " +
            (f"task starts with the hook on safe defaults (socket {cfg.socket}, "
             f"on_daemon_loss={cfg.on_daemon_loss})" if found is not None
             else "the job holds no nvshare GPU here: nothing to export"))
    status, existing_preload = 0, environ.get("LD_PRELOAD")
    if site is not None:
        result = site.finish()
        write_bytes(out, result.output)
        if result.output:
            from .sitetask import changes
            existing_preload = changes(result.output).get("LD_PRELOAD", existing_preload)
        if result.status:
            say(job_id, f"site TaskProlog: {result.problem}: the task fails (status {result.status})")
        status = result.status
    if found is not None and job_id is not None:     # found only where job_id is a job's
        placement, cfg = found
        try:
            lines = export_lines(job_id, placement, cfg, libnvshare_file(), existing_preload)
        except UnsafeValue as exc:
            say(job_id, f"task starts without nvshare: {exc}")
            return status
        # Bytes: an LD_PRELOAD entry that is not UTF-8 goes on as it was, whatever the locale.
        write_bytes(out, "".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape"))
    return status


def placement_of(job_id: int, cfg: Config | taskconfig.TaskConfig, environ: dict[str, str],
                 wait_sec: float) -> tuple[dict[str, Any], Config | taskconfig.TaskConfig] | None:
    """The job's placement and the config to export it with, or None: nothing to export.
    Imported here, so that the site's TaskProlog already runs while these load."""
    from .client import DaemonUnavailable, RequestFailed, query_job
    from .wire import C
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


def start_site(cfg: Config | taskconfig.TaskConfig | None, config_path: str,
               environ: dict[str, str]) -> Any:
    """The site's TaskProlog, started (sitetask.SiteTaskProlog, or sitetask.NotStarted when the
    config cannot say which), or None when there is none to run: none configured, or this process
    is one that another nvshare-taskprolog started as the site's."""
    if chained(environ):
        return None
    program: str | None
    if cfg is not None:
        program, timeout = cfg.site_task_prolog, cfg.site_task_prolog_timeout
    else:       # a config that config.load refuses still names the site's program
        program, timeout = taskconfig.site_task_prolog_line(config_path), \
            taskconfig.TaskConfig().site_task_prolog_timeout
        if program is None:
            from .sitetask import NotStarted
            return NotStarted(f"{config_path} cannot be read, and it may name one "
                              f"(site_task_prolog) that must run")
    if not program:
        return None
    from .sitetask import SiteTaskProlog
    return SiteTaskProlog(program, timeout, dict(environ, **{CHAIN_VAR: str(os.getpid())}))


def chained(environ: dict[str, str]) -> bool:
    """Whether an nvshare-taskprolog started this one as the site's TaskProlog (a site program
    that runs nvshare-taskprolog again), so that it does not start the site's program again. The
    variable names that process, which must be an ancestor: a job cannot skip the site's program
    by setting it."""
    value = environ.get(CHAIN_VAR)
    if not value or not value.isdigit():
        return False
    pid = os.getppid()
    for _ in range(8):
        if str(pid) == value:
            return True
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                pid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def write_bytes(out: TextIO, data: bytes) -> None:
    """data on out's byte stream, whatever the locale's encoding (a StringIO gets text)."""
    if not data:
        return
    out.flush()
    buffer = getattr(out, "buffer", None)
    if buffer is not None:
        buffer.write(data)
        buffer.flush()
    else:
        out.write(data.decode("utf-8", "surrogateescape"))


def valid_job_id(value: str | None) -> int | None:
    """slurm.valid_job_id, without importing slurm.py (subprocess, dataclasses)."""
    if value is None or not _JOB_ID.match(value.strip()):
        return None
    return int(value.strip())


def say(job_id: int | None, message: str) -> None:
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
    from . import config as config_mod
    file_only = {"NVSHARE_CONFIG": environ["NVSHARE_CONFIG"]} if "NVSHARE_CONFIG" in environ else {}
    try:
        return config_mod.load(environ=file_only), ""
    except config_mod.ConfigError as exc:
        return config_mod.fallback(file_only), str(exc)


def placement_without_daemon(job_id: int, cfg: Config,
                             environ: dict[str, str]) -> dict[str, Any] | None:
    """The job's GPUs when the daemon cannot be asked: its entry in the daemon's state.json, else
    (unless Slurm says the job holds no nvshare GPU here) every GPU the node manages."""
    import json
    from pathlib import Path

    from . import slurm
    from .jobenv import node_name
    try:
        state = json.loads((Path(cfg.state_dir) / "state.json").read_text())
        for job in state.get("jobs", []):
            if isinstance(job, dict) and job.get("job_id") == job_id:
                uuids = [u for u in job.get("gpus", []) if isinstance(u, str)]
                if uuids:
                    return {"gpu_uuid": uuids}
    except (OSError, ValueError, AttributeError):
        pass
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0
    try:
        return run(dict(os.environ))
    except Exception as exc:  # noqa: BLE001 - a TaskProlog failure fails the task; say why, run
        say(valid_job_id(os.environ.get("SLURM_JOB_ID")),
            f"internal error, task starts without nvshare: {type(exc).__name__}: {exc}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
