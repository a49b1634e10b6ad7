"""Fixtures shared by every tier: a real nvshare-scheduler on a temporary socket with configured GPUs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

# Two fake GPUs; tests/c/fake_cuda.c reports the same UUIDs by default (FAKE_CUDA_DEVICES).
FAKE_GPUS = [
    {"uuid": "GPU-fa4e0000-0000-0000-0000-000000000000", "memory": "16G"},
    {"uuid": "GPU-fa4e0000-0000-0000-0000-000000000001", "memory": "16G"},
]
REPO = Path(__file__).resolve().parent.parent


def become(uid: int) -> None:
    """This (forked) process drops root for uid: the attacks in tests are a user's."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


class Scheduler:
    """A running nvshare-scheduler process (python -m nvshare_slurm.daemon) with its own config."""

    def __init__(self, workdir: Path, settings: dict):
        self.workdir = workdir
        self.socket = str(workdir / "scheduler.sock")
        self.state_dir = str(workdir / "state")
        self.config_path = workdir / "nvshare.yaml"
        self.log_path = workdir / "scheduler.log"
        # No scontrol in workdir: a daemon that starts without state finds no Slurm to rebuild
        # from at once (tests of the rebuild give it a fake scontrol).
        config = {"socket": self.socket, "state_dir": self.state_dir, "gpus": FAKE_GPUS,
                  "log_level": "debug", "slurm_bin_dir": str(workdir)}
        config.update(settings)
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHARE_")}
        env["NVSHARE_CONFIG"] = str(self.config_path)
        return env

    def start(self, timeout: float = 10.0, preexec_fn=None) -> Scheduler:
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "nvshare_slurm.daemon"],
                                     env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     preexec_fn=preexec_fn)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nvshare-scheduler exited {self.proc.returncode}:\n{self.log()}")
            if os.path.exists(self.socket):
                return self
            time.sleep(0.02)
        raise RuntimeError(f"nvshare-scheduler did not create its socket:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def restart(self) -> Scheduler:
        self.stop()
        return self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self):
        from nvshare_slurm.client import Client
        return Client(self.socket)


@pytest.fixture
def scheduler_factory(tmp_path):
    """Start schedulers with settings: scheduler_factory(scheduling_mode="serial")."""
    started: list[Scheduler] = []
    # Short Unix socket paths: tmp_path can exceed the 108-byte sun_path limit.
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="nvs-", dir="/tmp"))
    os.chmod(base, 0o755)

    def make(start: bool = True, **settings) -> Scheduler:
        workdir = base / f"d{len(started)}"
        workdir.mkdir()
        sched = Scheduler(workdir, settings)
        started.append(sched)
        return sched.start() if start else sched

    yield make
    for sched in started:
        sched.stop()
    import shutil
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def scheduler(scheduler_factory):
    return scheduler_factory()
