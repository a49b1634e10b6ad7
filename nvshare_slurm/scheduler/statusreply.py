"""The status JSON a STATUS_QUERY gets (and nvshare-status renders): the GPUs with their policy's
status, the jobs with their clients, usage and gang, or the configuration; cut to fit one frame.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from .. import __version__
from ..wire import proto
from ..wire.proto import C
from .daemoncore import Core
from .registry import Job

# Room for the STATUS_REPLY struct in front of the JSON.
STATUS_JSON_MAX = proto.MAX_PAYLOAD - proto.sizeof("nvshare_status_reply")


def status_reply(core: Core, what: int, job_id: int = 0) -> tuple[int, bytes]:
    """(status, tail): JSON on success, else the error message."""
    data: dict[str, Any] = {"node": socket.gethostname(), "time": time.time(),
                            "version": __version__, "daemon_pid": os.getpid()}
    now = core.now()
    if what == C.NVSHARE_STATUS_GPUS:
        placed: dict[str, list[int]] = {u: [] for u in core.gpus}
        for job in core.registry.jobs.values():
            for uuid in job.gpus:
                placed.setdefault(uuid, []).append(job.job_id)
        data["gpus"] = [g.status(now, core.rogues.for_status(g.uuid), placed[g.uuid])
                        for g in core.gpus.values()]
    elif what == C.NVSHARE_STATUS_JOBS:
        data["jobs"] = [_job_status(core, j) for j in core.registry.jobs.values()]
    elif what == C.NVSHARE_STATUS_JOB:
        found = core.registry.jobs.get(job_id)
        if found is None:
            return C.NVSHARE_ERR_NOJOB, f"job {job_id} is not registered on this node".encode()
        data["jobs"] = [_job_status(core, found)]
    elif what == C.NVSHARE_STATUS_CONFIG:
        data["config"] = core.cfg.as_dict()
    else:
        return C.NVSHARE_ERR_INVAL, f"unknown status query {what}".encode()
    if what != C.NVSHARE_STATUS_CONFIG:
        data["refused"] = core.registry.refused.for_status()
    return C.NVSHARE_OK, fit_status(data)


def _job_status(core: Core, job: Job) -> dict[str, Any]:
    clients = []
    for client in core.registry.job_clients.get(job.job_id, {}).values():
        gpus: dict[str, Any] = {}
        for uuid in sorted(client.gpus):
            gpu = core.gpus[uuid]
            use = gpu.usage.get(client.client_id)
            gpus[uuid] = {"allocated": use.allocated if use else 0,
                          "swapped": use.swapped if use else 0,
                          "state": core.suspends.state_of(client.client_id)
                          or gpu.client_state(client.client_id)}
        for uuid in sorted(client.ungated):
            gpus[uuid] = {"allocated": 0, "swapped": 0, "state": "ungated"}
        clients.append({"pid": client.pid, "step_id": client.step_id, "gpus": gpus})
    return {"job_id": job.job_id, "user": job.user, "uid": job.uid, "name": job.name,
            "slots": job.slots, "gpus": list(job.gpus), "gpu_index": list(job.gpu_index),
            "registered": job.registered, "clients": clients,
            "share_class": job.share_class, "class_reason": job.class_reason,
            "usage": core.ledger.job_usage(job.job_id, core.now()),
            "gang": core.gangs.status(job.job_id), "multinode": job.multinode,
            # processes of the job running without the hook (hookwatch.py): ungated there
            "unhooked": core.hooks.for_status(job.job_id),
            "provisional": job.provisional,
            # stopped or frozen processes, or Slurm's SUSPENDED (suspend.py): no turns meanwhile
            "suspended": core.suspends.for_status(job.job_id)}


def fit_status(data: dict[str, Any]) -> bytes:
    """The status JSON within one frame: when it does not fit, the longest prefix of its list
    ("gpus" or "jobs"; a lone job's "clients") that does, and "truncated" says what was left out."""
    text = json.dumps(data).encode()
    if len(text) <= STATUS_JSON_MAX:
        return text
    key = "gpus" if "gpus" in data else "jobs"
    items = data[key]
    if len(items) == 1 and "clients" in items[0]:
        job = dict(items[0])
        data[key] = [job]
        items, key, holder = job["clients"], "clients", job
    else:
        holder = data
    total = len(items)
    low, high = 0, total         # the most items that fit lies in [low, high)
    while high - low > 1:
        mid = (low + high) // 2
        holder[key] = items[:mid]
        data["truncated"] = {"list": key, "shown": mid, "total": total}
        if len(json.dumps(data).encode()) <= STATUS_JSON_MAX:
            low = mid
        else:
            high = mid
    holder[key] = items[:low]
    data["truncated"] = {"list": key, "shown": low, "total": total}
    return json.dumps(data).encode()
