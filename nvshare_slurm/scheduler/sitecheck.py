"""What the scheduler checks of the site's Slurm once at start and logs where an admin reads it
(`journalctl -u nvshare-scheduler`): slurmd keeps no output of a Prolog or Epilog that succeeds,
so a setting that cannot work must be said by the daemon, not by the epilog of every job.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ..base.config import Config

NO_ACCOUNTING = ("", "accounting_storage/none")


def accounting_storage(slurm_bin_dir: str, timeout: float = 10.0) -> str | None:
    """AccountingStorageType from `scontrol show config`, or None when scontrol cannot tell."""
    env = dict(os.environ)
    env.setdefault("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    try:
        result = subprocess.run([str(Path(slurm_bin_dir) / "scontrol"), "show", "config"],
                                capture_output=True, text=True, errors="replace", timeout=timeout,
                                env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    for line in result.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "AccountingStorageType":
            return value.strip()
    return ""


def admin_comment_problem(cfg: Config) -> str:
    """Why `usage_admin_comment: true` cannot fill AdminComment on this cluster, or ''."""
    if not cfg.usage_admin_comment:
        return ""
    storage = accounting_storage(cfg.slurm_bin_dir)
    if storage is None or storage not in NO_ACCOUNTING:
        return ""
    return (f"usage_admin_comment: true, but Slurm keeps no accounting (AccountingStorageType="
            f"{storage or '(unset)'}): slurmctld refuses AdminComment for a finished job and "
            f"sacctmgr needs slurmdbd, so AdminComment stays empty; each job's GPU usage line is "
            f"in this log at unregistration")
