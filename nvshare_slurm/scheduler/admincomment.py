"""A job's GPU usage line in its AdminComment (usage_admin_comment: true).

The scheduler writes it when the epilog unregisters the job, in a worker thread, and logs what
became of it in its own log: written (through scontrol, or through sacctmgr once slurmctld calls
the job finished), or not and why. The epilog used to write it, and a Prolog or Epilog that
succeeds leaves nothing in slurmd.log, so a refusal was seen nowhere (issue 26).

Each node's epilog adds its own part, `nvshare <node>: <line>`, replacing that node's earlier one and
keeping what other nodes and the site wrote, joined by " | ".
"""
from __future__ import annotations

from ..node import slurm


def merge(existing: str, node: str, line: str) -> str:
    """`existing` with this node's nvshare part replaced by `nvshare <node>: line`."""
    mine = f"nvshare {node}:"
    kept = [part for part in existing.split(" | ") if part and not part.startswith(mine)]
    return " | ".join(kept + [f"{mine} {line}"])


def write(job_id: int, node: str, line: str, slurm_bin_dir: str) -> str:
    """Put this node's usage line into the job's AdminComment; returns the command that took it.
    Raises slurm.SlurmError with Slurm's words when neither would."""
    existing = slurm.show_job(job_id, slurm_bin_dir).admin_comment
    return slurm.set_admin_comment(job_id, merge(existing, node, line), slurm_bin_dir)
