"""Registered jobs, connected clients, and their persistence in state_dir/state.json.

state.json holds the jobs (with placements) and the admins' per-GPU overrides, so a restarted
daemon places nothing twice and keeps `update gpu=...` settings. Clients are not persisted: they
reconnect and register again. Writes go to a temp file, fsync, rename (never a half-written file).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import log

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


@dataclass
class Client:
    """One connected libnvshare.so process."""
    client_id: int
    job_id: int
    step_id: int
    pid: int
    uid: int
    user: str
    mem_limit: int
    connection: Any = None            # the daemon's connection object
    gpus: set[str] = field(default_factory=set)
    ungated: set[str] = field(default_factory=set)   # GPUs it asked for that are not its job's


class StateFileError(Exception):
    pass


class Registry:
    def __init__(self, state_dir: str):
        self.state_dir = Path(state_dir)
        self.jobs: dict[int, Job] = {}
        self.clients: dict[int, Client] = {}
        self.job_clients: dict[int, dict[int, Client]] = {}
        self.gpu_overrides: dict[str, dict[str, Any]] = {}
        self._next_client_id = 1

    @property
    def path(self) -> Path:
        return self.state_dir / "state.json"

    # --- jobs and clients ----------------------------------------------------------------------

    def add_job(self, job: Job) -> None:
        self.jobs[job.job_id] = job
        self.job_clients.setdefault(job.job_id, {})

    def remove_job(self, job_id: int) -> Job | None:
        self.job_clients.pop(job_id, None)
        return self.jobs.pop(job_id, None)

    def add_client(self, job_id: int, step_id: int, pid: int, uid: int, user: str,
                   mem_limit: int, connection: Any) -> Client:
        client = Client(self._next_client_id, job_id, step_id, pid, uid, user, mem_limit,
                        connection)
        self._next_client_id += 1
        self.clients[client.client_id] = client
        self.job_clients.setdefault(job_id, {})[client.client_id] = client
        return client

    def remove_client(self, client_id: int) -> Client | None:
        client = self.clients.pop(client_id, None)
        if client is not None:
            self.job_clients.get(client.job_id, {}).pop(client_id, None)
        return client

    def client_pids(self) -> set[int]:
        return {c.pid for c in self.clients.values()}

    # --- persistence ---------------------------------------------------------------------------

    def save(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        data = {"version": STATE_VERSION,
                "jobs": [asdict(j) for j in self.jobs.values()],
                "gpu_overrides": self.gpu_overrides}
        tmp = self.path.with_name(f".state.json.{os.getpid()}.tmp")
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.state_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def load(self, known_gpus: set[str]) -> None:
        """Jobs and overrides from state.json. A broken file is kept aside, never overwritten."""
        if not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
                raise StateFileError(f"unknown state version {data.get('version')!r}"
                                     if isinstance(data, dict) else "not a JSON object")
            jobs = [Job(**j) for j in data.get("jobs", [])]
            overrides = {str(k): dict(v) for k, v in data.get("gpu_overrides", {}).items()}
        except (OSError, ValueError, TypeError, StateFileError) as exc:
            aside = self.path.with_name(f"state.json.broken-{int(time.time())}")
            os.replace(self.path, aside)
            log.get().error(f"state: {self.path} cannot be read ({exc}); moved to {aside}, "
                            f"starting with no registered jobs")
            return
        for job in jobs:
            missing = [u for u in job.gpus if u not in known_gpus]
            if missing:
                log.get().warning(f"job {job.job_id}: placed GPUs {missing} are gone from this "
                                  f"node; dropping them from its placement")
                keep = [i for i, u in enumerate(job.gpus) if u in known_gpus]
                job.gpus = [job.gpus[i] for i in keep]
                job.gpu_index = [job.gpu_index[i] for i in keep]
            if job.gpus:
                self.add_job(job)
        self.gpu_overrides = {k: v for k, v in overrides.items() if k in known_gpus}
