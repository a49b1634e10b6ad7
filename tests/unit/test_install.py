"""scripts/install.sh on a node without Slurm: it installs nvshare-slurm, says what is missing and
how sites get it, and never calls a package manager for Slurm or munge.

Run in a private mount namespace (unshare -m) where Slurm's and munge's commands are hidden (a
non-executable /dev/null bound over each) and apt-get and dnf are stubs that record their calls,
so the machine's own Slurm and packages stay as they are. The venv is a temp dir, never /opt/nvshare.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import REPO

HIDDEN = ["slurmd", "slurmctld", "scontrol", "sbatch", "srun", "munged", "munge"]


@pytest.mark.timeout(600)
def test_install_on_a_node_without_slurm_installs_no_slurm(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a private mount namespace hides Slurm)")
    calls = tmp_path / "package-manager-calls"
    stub = tmp_path / "stub"
    stub.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {shlex.quote(str(calls))}\nexit 1\n")
    stub.chmod(0o755)
    masks = [f"mount --bind /dev/null {shlex.quote(path)}"
             for name in HIDDEN for path in {shutil.which(name) or "", f"/usr/sbin/{name}",
                                             f"/usr/bin/{name}"} if path and os.path.exists(path)]
    masks += [f"mount --bind {shlex.quote(str(stub))} {shlex.quote(path)}"
              for path in (shutil.which("apt-get"), shutil.which("dnf")) if path]
    prefix = Path(tempfile.mkdtemp(prefix="nvshare-install-", dir="/tmp")) / "venv"
    os.chmod(prefix.parent, 0o755)   # the job's user must reach it
    script = " && ".join(masks + [f"bash {shlex.quote(str(REPO / 'scripts' / 'install.sh'))}"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHARE_")}
    # A Python other users can run (not pyenv's under /root) keeps install.sh's warning about that out.
    env.update(NVSHARE_PREFIX=str(prefix), NVSHARE_VENV_PYTHON=shutil.which("python3", path="/usr/bin")
               or "python3")
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=580)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert not calls.exists(), f"install.sh called a package manager: {calls.read_text()}"
    assert "WARNING: this node has no slurmd scontrol" in out
    assert "this script never installs" in out
    assert "apt-get install slurmd slurm-client munge" in out and "dnf install" in out
    assert (prefix / "bin" / "nvshare-scheduler").exists() and (prefix / "bin" / "nvshare-prolog").exists()
    assert (prefix / "share" / "nvshare-slurm" / "slurm.conf.snippet").exists()
    # Everything under the prefix is readable by the job's user (the TaskProlog runs as them).
    modes = [p.stat().st_mode for p in prefix.rglob("*") if not p.is_symlink()]
    assert all(m & 0o004 for m in modes)
    shutil.rmtree(prefix.parent)
