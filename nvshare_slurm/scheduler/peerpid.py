"""Who a connecting client is when it runs in its own PID namespace (a container).

The hook sends its own getpid(), which inside a container's PID namespace is a small number of that
namespace (often 1): it names nothing the daemon can look at. SO_PEERCRED's pid is the kernel's
word, translated into the daemon's namespace, so the daemon uses that pid for everything (status,
rogue matching, kills). A message pid that differs from it is accepted only where the kernel says
the peer's innermost pid is that number (NSpid in /proc/<pid>/status), and only for a process
that sits in the Slurm cgroup of the job it names: a container started by a job step stays in the
step's cgroup (crun --cgroup-manager=disabled, enroot, Apptainer), so the job is the kernel's word
too, not only the message's.
"""
from __future__ import annotations

from .devices import cgroup_jobs_of_pid


def namespace_pids(pid: int) -> list[int] | None:
    """The process's pid in the reader's PID namespace, then in each nested one down to its own
    (the NSpid line of /proc/<pid>/status); None when the process is gone or the kernel has no
    NSpid (before Linux 4.1)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return [int(p) for p in line.split()[1:]]
    except (OSError, ValueError):
        return None
    return None


def namespaced_peer_problem(peer_pid: int, message_pid: int, job_id: int) -> str | None:
    """Why a client whose CLIENT_REGISTER names message_pid, while SO_PEERCRED says peer_pid, may
    not attach to job_id; None when it may (a process of a PID namespace inside the job's cgroup)."""
    mismatch = f"pid {message_pid} in the message is not the connecting process {peer_pid}"
    pids = namespace_pids(peer_pid)
    if not pids or len(pids) < 2:
        return mismatch
    if pids[-1] != message_pid:
        return f"{mismatch} (pid {pids[-1]} in its own PID namespace)"
    jobs = cgroup_jobs_of_pid(peer_pid)
    if job_id not in jobs:
        where = (f"the cgroup of job {', '.join(map(str, sorted(jobs)))}" if jobs
                 else "no Slurm job's cgroup")
        return (f"process {peer_pid} runs in a PID namespace (pid {message_pid} there) and is in "
                f"{where}, not job {job_id}'s: a container must run inside its job step's cgroup")
    return None
