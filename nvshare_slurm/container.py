"""nvshare-container: the hook, the daemon's socket and the TaskProlog's environment for a managed
job's container, which Slurm's TaskProlog exports alone do not reach.

    nvshare-container oci [--config PATH] JOB_ID BUNDLE -- RUNTIME [ARG ...]
        Slurm OCI (`srun --container`), as oci.conf's RunTimeRun: adds to BUNDLE/config.json the
        bind mounts of libnvshare.so and of the socket's directory and the TaskProlog's variables
        (LD_PRELOAD, CUDA_VISIBLE_DEVICES, NVSHARE_*), then runs RUNTIME (crun or runc run).
    nvshare-container enroot [--config PATH]
        pyxis/enroot, from the hook /etc/enroot/hooks.d/nvshare.sh: appends the same mounts to
        $ENROOT_MOUNTS and the variables to $ENROOT_ENVIRON, for the job $SLURM_JOB_ID.

Slurm 22.05 writes config.json before the TaskProlog runs, so its exports never reach the
container; 24.11 writes them, but the files they name are not mounted. Under pyxis the enroot
hooks run before the TaskProlog. So the exports are asked of the daemon here, exactly as the
TaskProlog asks (taskenv.placement_of, export_lines), and both versions get the same
config.json. Each mount lands at the path it has on the node, so LD_PRELOAD and NVSHARE_SOCKET
mean the same inside and out; they come after the runtime's own mounts (enroot's tmpfs on /tmp
and /var/run included), so nothing hides them.

A job without nvshare GPUs on this node runs unchanged. A managed job whose container cannot be
given the hook does not start: exit status 1, and the job's output says why; never an ungated task.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from . import libnvshare_file
from .base import taskconfig
from .node.jobenv import DAEMON_WAIT_SEC
from .node.jobenv import say as say_line
from .node.taskenv import UnsafeValue, export_lines, full_config, placement_of, valid_job_id

ME = "nvshare-container"


class ContainerError(Exception):
    """A managed job's container cannot be given the hook (the task must not start)."""


def job_exports(job_id: int, config_path: str, existing_preload: str | None,
                wait_sec: float = DAEMON_WAIT_SEC) -> tuple[dict[str, str], str] | None:
    """The TaskProlog's variables for the job, and the daemon's socket path; None for a job with
    no nvshare GPUs on this node (nothing to add)."""
    environ = {"SLURM_JOB_ID": str(job_id), "NVSHARE_CONFIG": config_path}
    cfg: Any = taskconfig.read(config_path) or full_config(job_id, environ)
    if cfg is None:
        raise ContainerError(f"the config {config_path} cannot be read")
    found = placement_of(job_id, cfg, environ, wait_sec)
    if found is None:
        return None
    placement, cfg = found
    try:
        lines = export_lines(job_id, placement, cfg, libnvshare_file(), existing_preload)
    except UnsafeValue as exc:
        raise ContainerError(str(exc)) from None
    exports = dict(line[len("export "):].split("=", 1) for line in lines)
    return exports, cfg.socket


def mounts(socket_path: str) -> list[tuple[str, str]]:
    """(path, kind) to bind into the container at the same path: the hook (a file) and the
    directory of the daemon's socket (a directory, so a restarted daemon's new socket shows)."""
    hook = libnvshare_file()
    if not os.path.isfile(hook):
        raise ContainerError(f"the hook {hook} is not installed")
    directory = os.path.dirname(socket_path) or "/"
    if directory == "/":
        raise ContainerError(f"the socket {socket_path} lies in / itself: set `socket:` to a "
                             f"path in a directory of its own (the default /run/nvshare/...)")
    return [(hook, "file"), (directory, "dir")]


# ---- Slurm OCI: config.json ----------------------------------------------------------------------

def edit_oci_config(config: dict[str, Any], exports: dict[str, str],
                    binds: list[tuple[str, str]]) -> dict[str, Any]:
    """config.json with each export set in process.env (replacing a variable of the same name)
    and a read-only bind mount of each path appended after the bundle's own mounts."""
    process = config.setdefault("process", {})
    env = [e for e in process.get("env") or [] if isinstance(e, str)
           and e.split("=", 1)[0] not in exports]
    process["env"] = env + [f"{name}={value}" for name, value in exports.items()]
    added = [{"destination": path, "type": "bind", "source": path,
              "options": ["bind", "ro", "nosuid", "nodev"]} for path, _kind in binds]
    config["mounts"] = list(config.get("mounts") or []) + added
    return config


def oci_env_value(config: dict[str, Any], name: str) -> str | None:
    for entry in (config.get("process") or {}).get("env") or []:
        if isinstance(entry, str) and entry.startswith(name + "="):
            return entry.split("=", 1)[1]
    return None


def write_atomically(path: str, text: str) -> None:
    """Replace path by a new file (the bundle directory is the job user's; config.json, on
    Slurm 22.05, root's and read-only to the user)."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".config.json.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def prepare_bundle(job_id: int, bundle: str, config_path: str,
                   wait_sec: float = DAEMON_WAIT_SEC) -> bool:
    """Add the hook to BUNDLE/config.json; False when the job has no nvshare GPUs here."""
    path = os.path.join(bundle, "config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ContainerError(f"cannot read {path}: {exc}") from None
    if not isinstance(config, dict):
        raise ContainerError(f"{path} is not a JSON object")
    found = job_exports(job_id, config_path, oci_env_value(config, "LD_PRELOAD"), wait_sec)
    if found is None:
        return False
    exports, socket_path = found
    edit_oci_config(config, exports, mounts(socket_path))
    try:
        write_atomically(path, json.dumps(config, indent=2) + "\n")
    except OSError as exc:
        raise ContainerError(f"cannot rewrite {path}: {exc}") from None
    return True


# ---- enroot: $ENROOT_MOUNTS and $ENROOT_ENVIRON ----------------------------------------------------

def enroot_mount_lines(binds: list[tuple[str, str]]) -> list[str]:
    """fstab lines for $ENROOT_MOUNTS; x-create makes the mount point (on enroot's tmpfs /var/run
    too, which the hooks' mounts come after)."""
    for path, _kind in binds:
        if any(c.isspace() for c in path):
            raise ContainerError(f"{path!r} holds white space, which an fstab line cannot carry")
    return [f"{path} {path} none x-create={kind},bind,ro,nosuid,nodev,private"
            for path, kind in binds]


def enroot_hook(environ: dict[str, str], config_path: str,
                wait_sec: float = DAEMON_WAIT_SEC) -> bool:
    """Append the mounts and variables for the job of SLURM_JOB_ID; False when there is none
    (not a Slurm task, or no nvshare GPUs here)."""
    job_id = valid_job_id(environ.get("SLURM_JOB_ID"))
    if job_id is None:
        return False
    files = {}
    for name in ("ENROOT_MOUNTS", "ENROOT_ENVIRON"):
        files[name] = environ.get(name, "")
        if not files[name]:
            raise ContainerError(f"${name} is not set: run from an enroot hook")
    found = job_exports(job_id, config_path, environ.get("LD_PRELOAD"), wait_sec)
    if found is None:
        return False
    exports, socket_path = found
    mount_lines = enroot_mount_lines(mounts(socket_path))
    try:
        with open(files["ENROOT_MOUNTS"], "a", encoding="utf-8") as fh:
            fh.write("".join(line + "\n" for line in mount_lines))
        with open(files["ENROOT_ENVIRON"], "a", encoding="utf-8") as fh:
            fh.write("".join(f"{name}={value}\n" for name, value in exports.items()))
    except OSError as exc:
        raise ContainerError(f"cannot append to enroot's files: {exc}") from None
    return True


# ---- the command ----------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=ME, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="runtime", required=True)
    oci = sub.add_parser("oci", help="oci.conf's RunTimeRun: edit the bundle, run the runtime")
    oci.add_argument("--config", metavar="PATH", help="nvshare.yaml (default: NVSHARE_CONFIG or "
                                                      f"{taskconfig.DEFAULT_PATH})")
    oci.add_argument("job_id", metavar="JOB_ID", help="the job (oci.conf: %%j)")
    oci.add_argument("bundle", metavar="BUNDLE", help="the bundle Slurm wrote (oci.conf: %%b)")
    oci.add_argument("command", nargs=argparse.REMAINDER, metavar="-- RUNTIME [ARG ...]")
    enroot = sub.add_parser("enroot", help="an enroot hook: append to $ENROOT_MOUNTS, "
                                           "$ENROOT_ENVIRON")
    enroot.add_argument("--config", metavar="PATH", help="nvshare.yaml (default: NVSHARE_CONFIG "
                                                         f"or {taskconfig.DEFAULT_PATH})")
    return parser


def main(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> int:
    args = _parser().parse_args(argv)
    env = dict(os.environ if environ is None else environ)
    config_path = args.config or env.get("NVSHARE_CONFIG") or taskconfig.DEFAULT_PATH
    if args.runtime == "enroot":
        job_id = valid_job_id(env.get("SLURM_JOB_ID"))
        try:
            enroot_hook(env, config_path)
        except ContainerError as exc:
            say_line(ME, job_id, f"enroot: {exc}: the container does not start (its GPU work "
                                 f"would not be gated)")
            return 1
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    job_id = valid_job_id(args.job_id)
    if job_id is None or not command:
        _parser().error("oci needs JOB_ID BUNDLE -- RUNTIME [ARG ...]")
    try:
        prepare_bundle(job_id, args.bundle, config_path)
    except ContainerError as exc:
        say_line(ME, job_id, f"oci: {exc}: the container does not start (its GPU work would not "
                             f"be gated)")
        return 1
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        say_line(ME, job_id, f"oci: cannot run {command[0]}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
