"""Registered jobs, connected clients, and their persistence in state_dir/state.json.

state.json holds the jobs (with placements) and the admins' per-GPU overrides, so a restarted
daemon places nothing twice and keeps `update gpu=...` settings. Clients are not persisted: they
reconnect and register again. Writes go to a temp file, fsync, rename (never a half-written file).

Each job's JSON is made once, when it is added, so a snapshot of the whole file costs one join,
whatever the number of jobs; the daemon writes snapshots off its event loop (statekeeper.py).
Loading checks every job on its own: one damaged entry is left out and reported, never fatal.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import log
from .policytypes import ClientInfo
from .priority import RANK

STATE_VERSION = 1


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
    mem_limit: int = 0
    registered: float = field(default_factory=time.time)
    rebuilt: bool = False      # registered from Slurm's record after state was lost: its placement
    #                            may not be the one its running processes were given (see adopt)
    share_class: str = "normal"        # high | normal | low (priority.py), from the prolog
    class_reason: str = "default"      # why: "qos prod", "partition scavenge", ...


@dataclass(eq=False)
class RegisteredClient(ClientInfo):
    """One connected libnvshare.so process: the one record of it. The policy queues and grants
    this very object as its ClientInfo; the fields below are the daemon's only."""
    uid: int = 0
    connection: Any = None            # the daemon's connection object
    gpus: set[str] = field(default_factory=set)
    ungated: set[str] = field(default_factory=set)   # GPUs it asked for that are not its job's


class StateFileError(Exception):
    pass


@dataclass
class LoadResult:
    """What load() found: complete is False when state was missing, unreadable or partly bad."""
    complete: bool
    problems: list[str] = field(default_factory=list)


_JOB_FIELDS: dict[str, type | tuple[type, ...]] = {
    "job_id": int, "uid": int, "gid": int, "user": str, "name": str, "slots": int,
    "gpus": list, "gpu_index": list, "mem_limit": int, "registered": (int, float),
    "rebuilt": bool, "share_class": str, "class_reason": str}
_OPTIONAL = {"mem_limit", "registered", "rebuilt", "share_class", "class_reason"}


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
    if not 0 < item["job_id"] < 1 << 32 or item["uid"] < 0 or item["gid"] < 0:
        raise ValueError("job_id, uid or gid out of range")
    gpus, index = item["gpus"], item["gpu_index"]
    if not all(isinstance(u, str) for u in gpus) or \
            not all(isinstance(i, int) and not isinstance(i, bool) for i in index):
        raise ValueError("gpus must be strings and gpu_index integers")
    if len(gpus) != len(index):
        raise ValueError(f"{len(gpus)} gpus but {len(index)} gpu_index entries")
    if item.get("share_class", "normal") not in RANK:
        raise ValueError(f"share_class {item['share_class']!r} is not one of {', '.join(RANK)}")
    return Job(**item)

class Registry:
    def __init__(self, state_dir: str):
        self.state_dir = Path(state_dir)
        self.jobs: dict[int, Job] = {}
        self.clients: dict[int, RegisteredClient] = {}
        self.job_clients: dict[int, dict[int, RegisteredClient]] = {}
        self.gpu_overrides: dict[str, dict[str, Any]] = {}
        self._next_client_id = 1
        self._encoded: dict[int, str] = {}

    @property
    def path(self) -> Path:
        return self.state_dir / "state.json"

    # --- jobs and clients ----------------------------------------------------------------------

    def add_job(self, job: Job) -> None:
        self.jobs[job.job_id] = job
        self.job_clients.setdefault(job.job_id, {})
        self.job_changed(job)

    def job_changed(self, job: Job) -> None:
        """After a change to a registered job: its JSON for the next snapshot."""
        self._encoded[job.job_id] = json.dumps(asdict(job), sort_keys=True)

    def remove_job(self, job_id: int) -> Job | None:
        self.job_clients.pop(job_id, None)
        self._encoded.pop(job_id, None)
        return self.jobs.pop(job_id, None)

    def add_client(self, job_id: int, step_id: int, pid: int, uid: int, user: str,
                   mem_limit: int, connection: Any,
                   share_class: str = "normal") -> RegisteredClient:
        client = RegisteredClient(self._next_client_id, job_id, step_id, pid, user=user,
                                  mem_limit=mem_limit, share_class=share_class, uid=uid,
                                  connection=connection)
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
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
                raise StateFileError(f"unknown state version {data.get('version')!r}"
                                     if isinstance(data, dict) else "not a JSON object")
            entries = data.get("jobs", [])
            if not isinstance(entries, list):
                raise StateFileError("jobs is not a list")
        except (OSError, ValueError, StateFileError) as exc:
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
            self.gpu_overrides = {str(k): dict(v) for k, v in overrides.items()
                                  if k in known_gpus and isinstance(v, dict)}
        else:
            result.complete = False
            log.get().error(f"state: {self.path}: gpu_overrides is not an object; left out")
        return result
