"""scripts/install.sh refuses a Python that other users cannot run (issue 26): pyenv's under /root
(mode 0700) made every task of every job on the node fail in the TaskProlog (status 126). Tried as
`nobody`, as a job's user would; nothing is installed. A stand-in for pyenv's interpreter: a link
to the system Python inside a 0700 directory."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO


def need_root_and_nobody() -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser (tries the Python as nobody)")
    try:
        subprocess.run(["id", "nobody"], check=True, capture_output=True)
    except subprocess.CalledProcessError:
        pytest.skip("no user nobody")


def test_install_refuses_a_python_only_root_can_run():
    need_root_and_nobody()
    private = Path(tempfile.mkdtemp(prefix="nvshare-pyenv-", dir="/tmp"))
    try:
        os.chmod(private, 0o700)
        python = private / "python3"
        python.symlink_to(os.path.realpath(sys.executable))
        prefix = private.parent / (private.name + "-venv")
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHARE_")}
        env.update(NVSHARE_PREFIX=str(prefix), NVSHARE_VENV_PYTHON=str(python))
        run = subprocess.run(["bash", str(REPO / "scripts" / "install.sh")], env=env,
                             capture_output=True, text=True, timeout=120)
        out = run.stdout + run.stderr
        assert run.returncode == 1, out
        assert f"ERROR: other users cannot run {python}" in out
        assert "NVSHARE_VENV_PYTHON=/usr/bin/python3" in out
        assert not prefix.exists()          # refused before anything was installed
        # The same interpreter, reachable by everyone, is accepted by the check.
        os.chmod(private, 0o755)
        ok = subprocess.run(["runuser", "-u", "nobody", "--", str(python), "-c", "pass"])
        assert ok.returncode == 0
    finally:
        shutil.rmtree(private, ignore_errors=True)
