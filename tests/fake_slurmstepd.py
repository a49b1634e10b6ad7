"""A stand-in for slurmstepd, for tests of what the daemon reads of a job's process tree:

    python tests/fake_slurmstepd.py PIDFILE COMMAND [ARG ...]

names itself `slurmstepd` (its comm, as /proc/<pid>/stat shows it) and runs COMMAND under `sh` in a
process group of its own, as slurmstepd runs a batch script (the task: its parent is this process,
its group not this one's, so a SIGTSTP stops it). The task's pid goes to PIDFILE; this process
exits with the task's status."""
from __future__ import annotations

import ctypes
import subprocess
import sys

PR_SET_NAME = 15


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, b"slurmstepd", 0, 0, 0) != 0:
        print("fake_slurmstepd: prctl(PR_SET_NAME) failed", file=sys.stderr)
        return 1
    # `; exit $?`: the shell stays the task and runs COMMAND as its child (not exec'd in its place).
    task = subprocess.Popen(["/bin/sh", "-c", '"$@"; exit $?', "slurm_script", *sys.argv[2:]],
                            process_group=0)
    with open(sys.argv[1], "w", encoding="ascii") as fh:
        fh.write(f"{task.pid}\n")
    return task.wait()


if __name__ == "__main__":
    sys.exit(main())
