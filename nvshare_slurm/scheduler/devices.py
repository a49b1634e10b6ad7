"""GPU device files under Slurm's device cgroup (ConstrainDevices=yes).

Slurm denies every job the GPU device files of gres.conf that its own GRES do not cover, and a
GRES without a Slurm plugin (nvshare) covers none, so a `--gres=nvshare:N` task cannot open
/dev/nvidia<minor>. The device cgroup is checked when a file is opened, never when it is used: the
daemon, which runs outside every job's cgroup, opens the device file of a GPU the job was placed on
and passes the descriptor to the task's hook (DEVICE_OPEN, SCM_RIGHTS). Only the GPUs nvshare
placed the job on can be had this way, only by a process of the job's uid that sits in that job's
Slurm cgroup, and only the daemon's own configured path is ever opened, never a name a client sent.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from collections.abc import Iterable

# Slurm's cgroup paths: v1 /slurm[_<node>]/uid_<uid>/job_<id>/step_<s>/...;
# v2 /system.slice/[<node>_]slurmstepd.scope/job_<id>/step_<s>/... (<node>_ where slurmd was built
# for several slurmd per host, as Debian's is)
_JOB_DIR = re.compile(r"^job_(\d+)$")


class Refused(Exception):
    """DEVICE_OPEN refused; status is an NVSHARE_ERR_* value, the text says why."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status


def slurm_jobs_of_cgroup(text: str) -> set[int]:
    """The Slurm job ids that a /proc/<pid>/cgroup text places the process in: a `job_<id>`
    directory below one whose name has `slurm` in it (slurm_<node>, <node>_slurmstepd.scope)."""
    jobs = set()
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        parts = path.split("/")
        for i, part in enumerate(parts):
            match = _JOB_DIR.match(part)
            if match and any("slurm" in p for p in parts[:i]):
                jobs.add(int(match.group(1)))
    return jobs


def cgroup_jobs_of_pid(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            return slurm_jobs_of_cgroup(fh.read(65536))
    except OSError:
        return set()


def device_number(path: str) -> tuple[int, int] | None:
    """(major, minor) of a character device file, None for anything else or a missing file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return os.major(st.st_rdev), os.minor(st.st_rdev)


@dataclass(frozen=True)
class DeviceRequest:
    job_id: int
    uid: int                 # SO_PEERCRED: the kernel's word, never the message's
    pid: int
    major: int
    minor: int


class GpuDevices:
    """Each managed GPU's device file, and which a job's process may have opened for it."""

    def __init__(self, paths: dict[str, str]):
        self.paths = dict(paths)     # GPU uuid -> device file

    def path_for(self, request: DeviceRequest, job_uid: int, job_gpus: Iterable[str],
                 errors: tuple[int, int]) -> str:
        """The device file to open for the request, or Refused. errors: (PERM, NOGPU) codes."""
        perm, nogpu = errors
        if request.uid not in (0, job_uid):
            raise Refused(perm, f"uid {request.uid} may not open devices for job "
                                f"{request.job_id} of uid {job_uid}")
        jobs = cgroup_jobs_of_pid(request.pid)
        if request.job_id not in jobs:
            where = (f"the cgroup of job {', '.join(map(str, sorted(jobs)))}" if jobs
                     else "no Slurm job's cgroup")
            raise Refused(perm, f"pid {request.pid} is in {where}, not job {request.job_id}'s")
        for uuid in job_gpus:
            path = self.paths.get(uuid)
            if path and device_number(path) == (request.major, request.minor):
                return path
        raise Refused(nogpu, f"device {request.major}:{request.minor} is not the device file "
                             f"of a GPU job {request.job_id} was placed on")


def open_device(path: str, access: int) -> int:
    """The daemon's own descriptor of the device file (the caller passes it on, then closes it).
    Blocking: a GPU's first open may initialise it, so callers run this off the event loop."""
    mode = access & os.O_ACCMODE
    if mode not in (os.O_RDONLY, os.O_WRONLY, os.O_RDWR):
        mode = os.O_RDWR
    fd = os.open(path, mode | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        if not stat.S_ISCHR(os.fstat(fd).st_mode):
            raise OSError(f"{path} is no longer a character device")
    except OSError:
        os.close(fd)
        raise
    return fd
