"""nvshare-taskprolog: Slurm TaskProlog (the job's user, before every task of every step).

Prints `export NAME=value` lines that slurmstepd puts in the task's environment: the hook
(LD_PRELOAD), the placed GPUs (CUDA_VISIBLE_DEVICES, NVSHARE_MANAGED_GPUS), the daemon's socket,
the job id, the daemon-loss policy and, when the config turns swap off, NVSHARE_SWAP=off (and
NVSHARE_SWAP_PREPIN=1 with swap_prepin). Jobs the daemon does not know print nothing. The lines
and the placement they come from are taskenv.py's, which nvshare-container uses too.

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
import sys

from . import libnvshare_file
from .base import taskconfig
from .node.jobenv import DAEMON_WAIT_SEC
from .node.taskenv import UnsafeValue, config_or_fallback, export_lines, placement_of, say, valid_job_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TextIO

    from .base.config import Config

CHAIN_VAR = "NVSHARE_TASKPROLOG_PID"   # in the site's program's environment only
USAGE = """usage: nvshare-taskprolog

Slurm TaskProlog of nvshare-slurm (TaskProlog=/path/to/nvshare-taskprolog in slurm.conf). Run by
slurmstepd as the job's user before each task; prints `export NAME=value` lines for the task's
environment (LD_PRELOAD, CUDA_VISIBLE_DEVICES, NVSHARE_SOCKET, ...) for jobs with nvshare GPUs on
this node, nothing for other jobs. Reads SLURM_JOB_ID and the node's config (NVSHARE_CONFIG or
/etc/nvshare/nvshare.yaml). When the config names a site_task_prolog, runs that program first,
prints its output before nvshare's lines, and exits with its status; otherwise always exits 0.
"""


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
            from .node.sitetask import changes
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
            from .node.sitetask import NotStarted
            return NotStarted(f"{config_path} cannot be read, and it may name one "
                              f"(site_task_prolog) that must run")
    if not program:
        return None
    from .node.sitetask import SiteTaskProlog
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
