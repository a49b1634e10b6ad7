"""Registered jobs, connected clients, and their persistence in state_dir/state.json.

state.json holds the jobs (with placements) and the admins' per-GPU overrides, so a restarted
daemon places nothing twice and keeps `update gpu=...` settings. Clients are not persisted: they
reconnect and register again. Writes go to a temp file, fsync, rename (never a half-written file).

Each job's JSON is made once, when it is added, so a snapshot of the whole file costs one join,
whatever the number of jobs; the daemon writes snapshots off its event loop (statekeeper.py).
Loading checks every job on its own: one damaged entry is left out and reported, never fatal.
statefile.py reads it, its size and nesting depth bounded before it is parsed (a deeply nested
file would otherwise raise RecursionError in the parser at every start: a crash loop), and every
job field and admin override is checked here by type and range, as `nvshare-status update` checks
them.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

from ..base import config, log
from ..base.priority import RANK
from ..node.statefile import read as read_state
from ..node.statefile import StateFileError
from ..policy.policytypes import ClientInfo
from .refusals import Refusals

STATE_VERSION = 1
TEXT_MAX = 4096              # a user or job name in an entry


@dataclass
class Job:
    job_id: int
    uid: int
    gid: int
    user: str
    name: str
    slots: int
    gpus: list[str]            # placed GPU UUIDs in placement order
    gpu_index: list[int]
    registered: float = field(default_factory=time.time)
    rebuilt: bool = False      # registered from Slurm's record after state was lost: its placement
    #                            may not be the one its running processes were given (see adopt)
    share_class: str = "normal"        # high | normal | low (priority.py), from the prolog
    class_reason: str = "default"      # why: "qos prod", "partition scavenge", ...
    provisional: bool = False  # known only from its own processes' re-registration (state lost,
    #                            Slurm not answering): confirmed or corrected once Slurm answers
    multinode: bool = False    # holds nvshare GPUs on other nodes too: turns in job-id order (gang.py)


@dataclass(eq=False)
class RegisteredClient(ClientInfo):
    """One connected libnvshare.so process: the one record of it. The policy queues and grants
    this very object as its ClientInfo; the fields below are the daemon's only."""
    uid: int = 0
    connection: Any = None            # the daemon's connection object
    gpus: set[str] = field(default_factory=set)
    ungated: set[str] = field(default_factory=set)   # GPUs it asked for that are not its job's


@dataclass
class LoadResult:
    """What load() found: complete is False when state was missing, unreadable or partly bad."""
    complete: bool
    problems: list[str] = field(default_factory=list)


_JOB_FIELDS: dict[str, type | tuple[type, ...]] = {
    "job_id": int, "uid": int, "gid": int, "user": str, "name": str, "slots": int,
    "gpus": list, "gpu_index": list, "mem_limit": int, "registered": (int, float),
    "rebuilt": bool, "share_class": str, "class_reason": str, "provisional": bool,
    "multinode": bool}
_OPTIONAL = {"mem_limit", "registered", "rebuilt", "share_class", "class_reason", "provisional",
             "multinode"}


def job_from_json(item: Any) -> Job:
    """A Job from one state.json entry; ValueError naming what is wrong."""
    if not isinstance(item, dict):
        raise ValueError("not an object")
    unknown = set(item) - set(_JOB_FIELDS)
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    for key, kind in _JOB_FIELDS.items():
        if key not in item:
            if key in _OPTIONAL:
                continue
            raise ValueError(f"{key} is missing")
        value = item[key]
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            raise ValueError(f"{key} is {type(value).__name__}, not {getattr(kind, '__name__', 'a number')}")
    if not 0 < item["job_id"] < 1 << 32 or not 0 <= item["uid"] < 1 << 32 or \
            not 0 <= item["gid"] < 1 << 32:
        raise ValueError("job_id, uid or gid out of range")
    if not 0 <= item["slots"] <= 1 << 16:
        raise ValueError("slots out of range")
    if not math.isfinite(item.get("registered", 0)):
        raise ValueError("registered is not a finite time")
    if any(len(item.get(k, "")) > TEXT_MAX for k in ("user", "name", "class_reason")):
        raise ValueError(f"user, name or class_reason longer than {TEXT_MAX} characters")
    gpus, index = item["gpus"], item["gpu_index"]
    if not all(isinstance(u, str) and 0 < len(u) <= 128 for u in gpus) or \
            not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1024
                    for i in index):
        raise ValueError("gpus must be GPU UUIDs and gpu_index GPU indices")
    if len(gpus) != len(index):
        raise ValueError(f"{len(gpus)} gpus but {len(index)} gpu_index entries")
    if item.get("share_class", "normal") not in RANK:
        raise ValueError(f"share_class {item['share_class']!r} is not one of {', '.join(RANK)}")
    # mem_limit: written before 0.1.0 lost its job-wide cap (nothing ever set it; NVSHARE_MEM_LIMIT
    # is per process): read and dropped, so a node upgraded in place keeps its jobs.
    return Job(**{k: v for k, v in item.items() if k != "mem_limit"})


def overrides_from_json(uuid: str, item: Any) -> tuple[dict[str, Any], list[str]]:
    """One GPU's admin overrides from state.json: the valid ones, and a line for each left out."""
    if not isinstance(item, dict):
        return {}, [f"gpu {log.escape(uuid)}: overrides are not an object"]
    kept, problems = {}, []
    for key, value in item.items():
        setting = config.OVERRIDABLE.get(key)
        if setting is None:
            problems.append(f"gpu {log.escape(uuid)}: override {log.escape(key)} is not one an "
                            f"admin can set")
        elif not setting.accepts(value):
            problems.append(f"gpu {log.escape(uuid)}: override {key}={log.escape(repr(value))} "
                            f"is of the wrong type or out of range")
        else:
            kept[key] = value
    return kept, problems


class Registry:
    def __init__(self, state_dir: str):
        self.state_dir = Path(state_dir)
        self.jobs: dict[int, Job] = {}
        self.clients: dict[int, RegisteredClient] = {}
        self.job_clients: dict[int, dict[int, RegisteredClient]] = {}
        self.gpu_overrides: dict[str, dict[str, Any]] = {}
        self._next_client_id = 1
        self._encoded: dict[int, str] = {}
        self.on_job_added: Callable[[int], None] | None = None   # statekeeper: parked questions
        self.refused = Refusals()         # client registrations refused lately (status)

    @property
    def path(self) -> Path:
        return self.state_dir / "state.json"

    # --- jobs and clients ----------------------------------------------------------------------

    def add_job(self, job: Job) -> None:
        self.jobs[job.job_id] = job
        self.job_clients.setdefault(job.job_id, {})
        self.job_changed(job)
        if self.on_job_added is not None:
            self.on_job_added(job.job_id)

    def job_changed(self, job: Job) -> None:
        """After a change to a registered job: its JSON for the next snapshot."""
        self._encoded[job.job_id] = json.dumps(asdict(job), sort_keys=True)

    def remove_job(self, job_id: int) -> Job | None:
        self.job_clients.pop(job_id, None)
        self._encoded.pop(job_id, None)
        return self.jobs.pop(job_id, None)

    def add_client(self, job_id: int, step_id: int, pid: int, uid: int, user: str,
                   mem_limit: int, connection: Any, share_class: str = "normal",
                   prefetch: bool = False) -> RegisteredClient:
        client = RegisteredClient(self._next_client_id, job_id, step_id, pid, user=user,
                                  mem_limit=mem_limit, share_class=share_class, prefetch=prefetch,
                                  uid=uid, connection=connection)
        self._next_client_id += 1
        self.clients[client.client_id] = client
        self.job_clients.setdefault(job_id, {})[client.client_id] = client
        return client

    def remove_client(self, client_id: int) -> RegisteredClient | None:
        client = self.clients.pop(client_id, None)
        if client is not None:
            self.job_clients.get(client.job_id, {}).pop(client_id, None)
        return client

    def client_pids(self) -> set[int]:
        return {c.pid for c in self.clients.values()}

    # --- persistence ---------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """state.json's content now: one join of the jobs' ready-made JSON."""
        overrides = json.dumps(self.gpu_overrides, sort_keys=True)
        jobs = ", ".join(self._encoded.values())
        return f'{{"version": {STATE_VERSION:d}, "gpu_overrides": {overrides}, "jobs": [{jobs}]}}\n'.encode()

    def write(self, data: bytes) -> None:
        """Put a snapshot in place: temp file, fsync, rename, fsync the directory. No event-loop
        state is touched, so this runs in a worker thread."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        tmp = self.path.with_name(f".state.json.{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.state_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def save(self) -> None:
        self.write(self.snapshot())

    def load(self, known_gpus: set[str]) -> LoadResult:
        """Jobs and overrides from state.json. A file that cannot be read at all is kept aside,
        never overwritten; a job entry that is damaged is left out. Either way the result says the
        state is incomplete, and the daemon asks Slurm for the jobs it lacks."""
        if not self.path.exists():
            return LoadResult(False, [f"{self.path} does not exist"])
        try:
            data = read_state(self.path)
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
                raise StateFileError(f"unknown state version {data.get('version')!r}"
                                     if isinstance(data, dict) else "not a JSON object")
            entries = data.get("jobs", [])
            if not isinstance(entries, list):
                raise StateFileError("jobs is not a list")
        except (OSError, ValueError, StateFileError, RecursionError) as exc:
            aside = self.path.with_name(f"state.json.broken-{int(time.time())}")
            try:
                os.replace(self.path, aside)
            except OSError as move_exc:
                aside = Path(f"(not moved: {move_exc})")
            log.get().error(f"state: {self.path} cannot be read ({log.escape(exc)}); moved to "
                            f"{aside}")
            return LoadResult(False, [f"{self.path} cannot be read"])
        result = LoadResult(True)
        for number, entry in enumerate(entries):
            try:
                job = job_from_json(entry)
                if job.job_id in self.jobs:
                    raise ValueError(f"job {job.job_id} is listed twice")
            except (ValueError, TypeError) as exc:
                result.complete = False
                result.problems.append(f"job entry {number}: {exc}")
                log.get().error(f"state: {self.path}: job entry {number} left out: "
                                f"{log.escape(exc)}")
                continue
            missing = [u for u in job.gpus if u not in known_gpus]
            if missing:
                log.get().warning(f"job {job.job_id}: placed GPUs {log.escape(missing)} are gone "
                                  f"from this node; dropping them from its placement")
                keep = [i for i, u in enumerate(job.gpus) if u in known_gpus]
                job.gpus = [job.gpus[i] for i in keep]
                job.gpu_index = [job.gpu_index[i] for i in keep]
            if job.gpus:
                self.add_job(job)
        overrides = data.get("gpu_overrides", {})
        if isinstance(overrides, dict):
            for uuid, item in overrides.items():
                if uuid not in known_gpus:
                    continue
                kept, problems = overrides_from_json(uuid, item)
                for problem in problems:
                    log.get().error(f"state: {self.path}: {problem}; left out")
                if kept:
                    self.gpu_overrides[uuid] = kept
        else:
            result.complete = False
            log.get().error(f"state: {self.path}: gpu_overrides is not an object; left out")
        return result
