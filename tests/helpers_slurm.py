"""Slurm glue without a cluster: recorded scontrol outputs and a job's environment for the prolog,
epilog and TaskProlog, shared by the test modules that run them (fake_slurm: conftest.py)."""
from __future__ import annotations

from pathlib import Path

import yaml

DATA = Path(__file__).parent / "data" / "scontrol"


def slurm_env(tmp_path, bindir, job_id, socket_path=None, priority_classes=None, **extra):
    cfg = tmp_path / "nvshare.yaml"
    settings = {"socket": socket_path or str(tmp_path / "none.sock"), "slurm_bin_dir": str(bindir)}
    if priority_classes is not None:
        settings["priority_classes"] = priority_classes
    cfg.write_text(yaml.safe_dump(settings))
    env = {"SLURM_JOB_ID": str(job_id), "SLURMD_NODENAME": "n1", "SLURM_JOB_UID": "0",
           "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root", "NVSHARE_CONFIG": str(cfg)}
    env.update(extra)
    return env
