"""Tier 4: real NVIDIA GPU. Everything here skips where NVML finds no GPU (CI)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _gpu_count() -> int:
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


GPU_COUNT = _gpu_count()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="no NVIDIA GPU (NVML found none): tier-4 GPU tests run on the GPU machine")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if GPU_COUNT == 0:
                item.add_marker(skip)


class GpuJobs:
    """Register jobs with a real daemon (NVML inventory) and run processes under the hook."""

    def __init__(self, sched, workdir: Path):
        self.sched = sched
        self.workdir = workdir
        self.next_job = 1000

    def register(self, slots: int = 1) -> tuple[int, list[str]]:
        self.next_job += 1
        placement = self.sched.client().register_job(self.next_job, uid=0, gid=0, slots=slots,
                                                     name=f"gpu-test-{self.next_job}", user="root")
        return self.next_job, placement["gpu_uuid"]

    def env(self, job_id: int, uuids: list[str], hooked: bool = True) -> dict:
        from nvshare_slurm import libnvshare_path
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHARE_")}
        env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
        if hooked:
            # NVSHARE_TEST_LIB: another build of the hook (an older one, to show a test fails with it).
            env.update({"LD_PRELOAD": os.environ.get("NVSHARE_TEST_LIB") or str(libnvshare_path()),
                        "NVSHARE_SOCKET": self.sched.socket,
                        "NVSHARE_JOB_ID": str(job_id), "NVSHARE_MANAGED_GPUS": ",".join(uuids),
                        "SLURM_STEP_ID": "0"})
        return env

    def popen(self, args: list[str], job_id: int, uuids: list[str], hooked: bool = True,
              out: Path | None = None) -> subprocess.Popen:
        return subprocess.Popen(args, env=self.env(job_id, uuids, hooked), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)


def train_cmd(*extra: str) -> list[str]:
    # Host-made batches: these tests' step counts and switch intervals were set for the step time
    # that a CPU data loader gives (about 4x the GPU-drawn one of the benchmarks); later options win.
    return [sys.executable, str(HERE / "train.py"), "--data", "cpu", *extra]


def finish(proc: subprocess.Popen, timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:{out[-2000:]}\nstderr:{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def gpu_jobs(scheduler_factory, tmp_path):
    def make(**settings):
        sched = scheduler_factory(gpus=[], **settings)
        return GpuJobs(sched, tmp_path)
    return make


@pytest.fixture(scope="session")
def nvcc():
    path = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(path):
        pytest.skip("nvcc not installed")
    return path
