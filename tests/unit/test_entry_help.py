"""`--help` of the Slurm entry points and the node helper: help on stdout, exit 0, nothing else done.

Slurm runs nvshare-prolog and nvshare-epilog with no arguments; an admin trying `--help` by hand must
get help, not a Prolog run that complains about SLURM_JOB_ID (or, as root, drains the node).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MODULES = {"nvshare-prolog": "prolog", "nvshare-epilog": "epilog", "nvshare-node-config": "nodeconfig"}


@pytest.mark.parametrize("command", sorted(MODULES))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_help_and_exits_0(command, flag, tmp_path):
    installed = Path(sys.executable).parent / command
    argv = [str(installed)] if installed.exists() else [sys.executable, "-m",
                                                         f"nvshare_slurm.{MODULES[command]}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NVSHARE_"))}
    env["NVSHARE_CONFIG"] = str(tmp_path / "absent.yaml")
    out = subprocess.run(argv + [flag], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert out.stdout.startswith(f"usage: {command} ")
    assert f"{command}: " in out.stdout      # the module's description, not only the usage line
