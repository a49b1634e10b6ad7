"""The daemon's state_dir/state.json, read: the one reader, bounded before it parses.

The daemon restores its state with read() (registry.py); the epilog (is the job listed?) and the
TaskProlog (the job's GPUs, while the daemon cannot be asked) read the job list with state_jobs(),
read only, never moving the file aside. Before it is parsed, the file's size and nesting depth are
bounded: a deeply nested file would otherwise raise RecursionError in the parser.

It imports nothing of the policy or the daemon: the epilog and the TaskProlog load it.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

# state.json of 100,000 jobs is about 40 MB; its deepest value (a job's gpus) lies at depth 4.
STATE_MAX_BYTES = 64 << 20
STATE_MAX_DEPTH = 8


class StateFileError(Exception):
    pass


def nesting_depth(text: str) -> int:
    """The deepest nesting of [ and { in JSON text, strings left out."""
    depth = deepest = 0
    for match in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def read(path: str | os.PathLike[str]) -> Any:
    """The file's JSON; OSError, ValueError (not UTF-8, not JSON) or StateFileError (too large, too
    deeply nested) when it cannot be read."""
    path = Path(path)
    size = path.stat().st_size
    if size > STATE_MAX_BYTES:
        raise StateFileError(f"{size} bytes, more than {STATE_MAX_BYTES}")
    text = path.read_text(errors="strict")
    depth = nesting_depth(text)
    if depth > STATE_MAX_DEPTH:
        raise StateFileError(f"nested {depth} deep, more than {STATE_MAX_DEPTH}")
    return json.loads(text)


def state_jobs(state_dir: str) -> list[Any] | None:
    """The job entries of state_dir/state.json, unchecked (read only); None when there is no file,
    it cannot be read, or it holds no job list."""
    try:
        entries = read(Path(state_dir) / "state.json").get("jobs")
    except (OSError, ValueError, AttributeError, RecursionError, StateFileError):
        return None
    return entries if isinstance(entries, list) else None


def job_in_state(state_dir: str, job_id: int) -> bool | None:
    """Whether the daemon's state.json lists the job (for the epilog while the daemon is down);
    None when there is no file or it cannot be read."""
    entries = state_jobs(state_dir)
    if entries is None:
        return None
    return any(isinstance(e, dict) and e.get("job_id") == job_id for e in entries)
