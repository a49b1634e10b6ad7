"""nvshare-status: scontrol-style view of nvshare-scheduler, and admin updates.

    nvshare-status [show gpus]          every GPU: memory, mode, holders, waiting queue
    nvshare-status show gpu 0|GPU-...   one GPU
    nvshare-status show jobs | job ID   registered jobs and their clients (also job=ID, jobid=ID)
    nvshare-status show config          the daemon's configuration
    nvshare-status update gpu=0|GPU-...|all mode=serial switch_time=30 ...   (root / SlurmUser)

Exit status: 0 done, 1 the daemon is unreachable or refused or the thing asked for does not exist,
2 bad arguments. Errors are one line on stderr, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO
from collections.abc import Sequence

from . import __version__
from .base import config
from .node import render
from .wire.client import Client, DaemonUnavailable, RequestFailed
from .wire.wire import C, ProtocolError

PROG = "nvshare-status"

MODES = {"auto": C.NVSHARE_MODE_AUTO, "concurrent": C.NVSHARE_MODE_CONCURRENT,
         "serial": C.NVSHARE_MODE_SERIAL}
UPDATE_KEYS = ("mode", "switch_time", "memory_reserve_percent", "max_runtime_sec")
_INT32_MAX = 2 ** 31 - 1


class Failure(Exception):
    """One line for stderr, exit status 1."""


def _common_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """Output/connection options; on subcommands they default to SUPPRESS so that an option given
    before the subcommand is not reset by the subparser."""
    default = argparse.SUPPRESS if suppress else None
    flag_default = argparse.SUPPRESS if suppress else False
    out = parser.add_argument_group("output")
    out.add_argument("-o", "--oneliner", action="store_true", default=flag_default,
                     help="one record per line")
    out.add_argument("--json", action="store_true", default=flag_default,
                     help="the daemon's status JSON as it is (exact numbers)")
    conn = parser.add_argument_group("connection")
    conn.add_argument("--socket", metavar="PATH", default=default,
                      help="the daemon's socket (default: `socket` of the config file, "
                           f"NVSHARE_CONFIG or {config.DEFAULT_PATH})")


# `show job=12` as scontrol takes it (and as the guides write it): the same as `show job 12`.
_ENTITY_ALIASES = {"job": "job", "jobid": "job", "jobs": "jobs", "gpu": "gpu", "gpus": "gpus"}


def split_entity(argv: Sequence[str]) -> list[str]:
    """argv with the word after `show` split where it is ENTITY=ID (job=12, jobid=12, gpu=0)."""
    words = list(argv)
    index, skip_value = 0, False
    while index < len(words):
        word = words[index]
        if skip_value:
            skip_value = False
        elif word == "--socket":
            skip_value = True
        elif word == "--":
            return words
        elif not word.startswith("-"):
            if word != "show":
                return words            # another command (update): its KEY=VALUE words stay
            later = index + 1
            while later < len(words) and words[later].startswith("-") and words[later] != "--":
                later += 2 if words[later] == "--socket" else 1
            if later < len(words):
                entity, sep, name = words[later].partition("=")
                if sep and entity.lower() in _ENTITY_ALIASES:
                    words[later:later + 1] = [_ENTITY_ALIASES[entity.lower()], name]
            return words
        index += 1
    return words


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Show nvshare GPU sharing on this node; update it (root or SlurmUser).",
        epilog="Without a command: show gpus. `show job=ID` and `show gpu=ID` work as in scontrol.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    _common_options(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    show = commands.add_parser("show", help="show gpus, a gpu, jobs, a job or the config",
                               description="Show GPUs, jobs or the daemon's configuration.")
    _common_options(show, suppress=True)
    show.set_defaults(subparser=show)
    show.add_argument("entity", nargs="?", default="gpus",
                      choices=("gpus", "gpu", "jobs", "job", "config"),
                      help="what to show (default: gpus)")
    show.add_argument("name", nargs="?", metavar="ID",
                      help="gpu: NVML index or UUID; job: Slurm job id")

    update = commands.add_parser(
        "update", help="change a GPU's scheduling (root or SlurmUser)",
        description="Change scheduling of one GPU or all GPUs at run time (root or SlurmUser).",
        epilog="keys: gpu=<index|uuid|all> (required), mode=auto|concurrent|serial, "
               "switch_time=auto|<seconds>, memory_reserve_percent=N, max_runtime_sec=N")
    _common_options(update, suppress=True)
    update.set_defaults(subparser=update)
    update.add_argument("assignments", nargs="+", metavar="KEY=VALUE")
    return parser


# --- update arguments ---------------------------------------------------------------------------

def _ranged(key: str, value: float, setting: config.Setting) -> None:
    """The limits of config.OVERRIDABLE, so that an update cannot set what the file would refuse."""
    low, high = setting.low, setting.high
    if not low <= value <= high:
        raise ValueError(f"{key}={value:g} is outside {low:g}..{high:g}")


def parse_update(assignments: Sequence[str]) -> tuple[str, dict[str, int]]:
    """(gpu, admin_update fields) from gpu=... key=value words; ValueError names the bad word."""
    values: dict[str, str] = {}
    for word in assignments:
        key, sep, value = word.partition("=")
        key = key.strip().lower()
        if not sep or not value.strip():
            raise ValueError(f"expected KEY=VALUE, got {render.safe(word)!r}")
        if key not in ("gpu",) + UPDATE_KEYS:
            raise ValueError(f"unknown key {render.safe(key)!r}; "
                             f"keys: gpu, {', '.join(UPDATE_KEYS)}")
        if key in values:
            raise ValueError(f"{key} given twice")
        values[key] = value.strip()
    if "gpu" not in values:
        raise ValueError("gpu=<index|uuid|all> is required")
    gpu = values.pop("gpu")
    if not gpu.isprintable() or len(gpu.encode()) >= C.NVSHARE_UUID_LEN:
        raise ValueError(f"gpu={render.safe(gpu)!r} is not an index, a UUID or all")
    if gpu.lower() == "all":
        gpu = "all"
    if not values:
        raise ValueError(f"nothing to update: give one of {', '.join(UPDATE_KEYS)}")
    fields: dict[str, int] = {}
    if "mode" in values:
        mode = values["mode"].lower()
        if mode not in MODES:
            raise ValueError(f"mode={render.safe(mode)!r} is not one of {', '.join(MODES)}")
        fields["mode"] = MODES[mode]
    if "switch_time" in values:
        text = values["switch_time"].lower()
        if text == "auto":
            fields["switch_mode"] = C.NVSHARE_SWITCH_AUTO
        else:
            seconds = _number(text, "switch_time", "auto or seconds", float)
            _ranged("switch_time", seconds, config.OVERRIDABLE["switch_time_fixed"])
            fields["switch_mode"] = C.NVSHARE_SWITCH_FIXED
            fields["switch_time_ms"] = min(_INT32_MAX, max(1, round(seconds * 1000)))
    for key in ("memory_reserve_percent", "max_runtime_sec"):
        if key in values:
            number = _number(values[key], key, "an integer", int)
            _ranged(key, number, config.OVERRIDABLE[key])
            fields[key] = int(number)
    return gpu, fields


def _number(text: str, key: str, expected: str, kind: type) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{key}={render.safe(text)!r}: expected {expected}") from None
    if value != value:  # NaN
        raise ValueError(f"{key}={text}: expected {expected}")
    return value


# --- commands -----------------------------------------------------------------------------------

def _socket_path(args: argparse.Namespace) -> str:
    if args.socket:
        return str(args.socket)
    try:
        return config.load().socket
    except config.ConfigError as exc:
        raise Failure(str(exc)) from None


def _find_gpu(gpus: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for gpu in gpus:
        if str(gpu.get("index")) == name or str(gpu.get("uuid", "")).lower() == name.lower():
            return gpu
    raise Failure(f"no GPU {render.safe(name)!r} managed by nvshare-scheduler on this node")


def _job_id(text: str) -> int:
    try:
        job_id = int(text)
    except ValueError:
        job_id = -1
    if not 0 < job_id < 2 ** 32:
        raise argparse.ArgumentTypeError(f"job id must be a positive integer, got {text!r}")
    return job_id


def check_arguments(args: argparse.Namespace) -> None:
    """What argparse cannot check alone, before anything connects: usage error (exit 2)."""
    subparser: argparse.ArgumentParser = args.subparser
    if args.command == "update":
        try:
            args.gpu, args.fields = parse_update(args.assignments)
        except ValueError as exc:
            subparser.error(str(exc))
        return
    if args.entity == "config" and args.name is not None:
        subparser.error("show config takes no ID")
    if args.entity in ("job", "jobs") and args.name is not None:
        try:
            args.job_id = _job_id(args.name)
        except argparse.ArgumentTypeError as exc:
            subparser.error(str(exc))


def run_show(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    entity, name = args.entity, args.name
    if entity == "config":
        status = client.status(C.NVSHARE_STATUS_CONFIG)
        text = render.render_config(status, args.oneliner)
    elif entity in ("gpu", "gpus"):
        status = client.status(C.NVSHARE_STATUS_GPUS)
        if name is not None:
            status = dict(status, gpus=[_find_gpu(status.get("gpus") or [], name)])
        text = render.render_gpus(status, args.oneliner)
    elif entity in ("job", "jobs") and name is not None:
        job_id = args.job_id
        try:
            status = client.status(C.NVSHARE_STATUS_JOB, job_id)
        except RequestFailed as exc:
            if exc.status == C.NVSHARE_ERR_NOJOB:
                raise Failure(f"job {job_id} is not registered with nvshare-scheduler on this "
                              "node") from None
            raise
        text = render.render_jobs(status, args.oneliner)
    else:
        status = client.status(C.NVSHARE_STATUS_JOBS)
        text = render.render_jobs(status, args.oneliner)
    if args.json:
        # ensure_ascii: control characters and non-ASCII leave as \\u escapes, safe on a terminal.
        text = json.dumps(status, indent=2) + "\n"
    out.write(text)
    return 0


def run_update(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    try:
        message = client.admin_update(args.gpu, **args.fields)
    except RequestFailed as exc:
        raise Failure(f"update refused: {render.safe(exc.message, None) or exc}") from None
    if message:
        out.write(render.safe(message, None) + "\n")
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    for stream in (out, err):
        # A node with a non-UTF-8 locale must not turn a job name into a UnicodeEncodeError.
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass
    parser = build_parser()
    try:
        args = parser.parse_args(split_entity(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # usage error (2), --help or --version (0)
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        args.command, args.entity, args.name, args.subparser = "show", "gpus", None, parser
    try:
        check_arguments(args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        client = Client(_socket_path(args))
        if args.command == "update":
            return run_update(client, args, out)
        return run_show(client, args, out)
    except DaemonUnavailable as exc:
        err.write(f"{PROG}: {exc} (is the nvshare-scheduler service running?)\n")
    except RequestFailed as exc:
        err.write(f"{PROG}: nvshare-scheduler answered {render.safe(exc, None)}\n")
    except (ProtocolError, ValueError) as exc:  # ValueError: a reply that is not JSON
        err.write(f"{PROG}: bad reply from nvshare-scheduler: {render.safe(exc, None)}\n")
    except Failure as exc:
        err.write(f"{PROG}: {exc}\n")
    except BrokenPipeError:  # `nvshare-status | head`: quiet, and no second error at exit
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
