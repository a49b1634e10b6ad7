"""Helpers of the hook tests (libnvshare.so under tests/c/build/nvtest against the fake CUDA driver and
the real nvshare-scheduler), shared by the test modules that run nvtest. Fixtures: conftest.py."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import FAKE_GPUS, REPO

C_DIR = REPO / "tests" / "c"
BUILD = C_DIR / "build"
NVTEST = BUILD / "nvtest"
GPU0, GPU1 = FAKE_GPUS[0]["uuid"], FAKE_GPUS[1]["uuid"]


def run_nvtest(lib: Path | None, args: list[str], env: dict | None = None, timeout: float = 60,
               via: str = "link") -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("NVSHARE_", "SLURM_", "FAKE_CUDA_"))}
    full_env["LD_LIBRARY_PATH"] = str(BUILD)
    if lib is not None:
        full_env["LD_PRELOAD"] = str(lib)
    full_env.update(env or {})
    return subprocess.run([str(NVTEST), f"--via={via}", *args], env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def start_nvtest(lib: Path, args: list[str], env: dict, preexec_fn=None) -> subprocess.Popen:
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("NVSHARE_", "SLURM_", "FAKE_CUDA_"))}
    full_env.update({"LD_LIBRARY_PATH": str(BUILD), "LD_PRELOAD": str(lib)}, **env)
    return subprocess.Popen([str(NVTEST), *args], env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn,
                            cwd="/" if preexec_fn else None)   # another user may not read ours


def finish(proc: subprocess.Popen, timeout: float = 60) -> str:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"nvtest did not finish:\n{out}\n{err}") from None
    assert proc.returncode == 0 and out.rstrip().endswith("done"), f"rc {proc.returncode}\n{out}\n{err}"
    proc.stderr_text = err  # type: ignore[attr-defined]
    return out


def run_together(sched, hook_lib: Path, procs: list, trace: Path, actions: list[str], jobs: int = 2,
                 timeout: float = 90, **env: str) -> list[tuple[int, str, int, int]]:
    """`jobs` jobs of the same nvtest actions on GPU 0, started together (registered as jobs 1,
    2, ...); the trace rows once all have finished."""
    for n in range(1, jobs + 1):
        job = Job(sched, n, trace, gpu_index=[0])
        procs.append(start_nvtest(hook_lib, ["init", "ctx:0", *actions], dict(job.env, **env)))
    for proc in procs:
        finish(proc, timeout=timeout)
    return read_trace(trace)


def whois(output: str) -> dict[str, tuple[str, str]]:
    found = {}
    for line in output.splitlines():
        if line.startswith("whois "):
            label, lib, sym = line[len("whois "):].rsplit(" ", 2)
            found[label] = (lib, sym)
    return found


def read_trace(path: Path) -> list[tuple[int, str, int, int]]:
    rows = []
    for line in path.read_text().splitlines():
        pid, gpu, start, end = line.split()[:4]   # FAKE_CUDA_TRACE_LAUNCH=1 adds a fifth (read_launches)
        rows.append((int(pid), gpu, int(start), int(end)))
    return rows


def read_launches(path: Path) -> list[tuple[int, str, int, int, int]]:
    """(pid, gpu, start_ns, end_ns, launched_ns) of each kernel the fake driver ran with
    FAKE_CUDA_TRACE_LAUNCH=1 (not barriers)."""
    return [(int(f[0]), f[1], int(f[2]), int(f[3]), int(f[4]))
            for f in (line.split() for line in path.read_text().splitlines()) if len(f) == 5]


def read_copies(path: Path) -> list[tuple[int, str, int, int]]:
    """(pid, dtoh|htod, start_ns, end_ns) of each swap chunk the fake driver copied, in the order
    written (FAKE_CUDA_COPY_LOG with FAKE_CUDA_SWAP_COPY_MS; CLOCK_MONOTONIC); none before the first."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(f[0]), f[1], int(f[3]), int(f[4])) for f in (line.split() for line in lines)]


def overlaps(trace, gpu: str) -> list[tuple]:
    rows = sorted((r for r in trace if r[1] == gpu), key=lambda r: r[2])
    bad = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if b[2] >= a[3]:
                break
            if a[0] != b[0]:
                bad.append((a, b))
    return bad


class Job:
    """A job registered with a running scheduler, and the environment of its processes."""

    def __init__(self, sched, job_id: int, trace: Path, gpu_index: list[int] | None = None,
                 slots: int = 1, share_class: str = "normal", multinode: bool = False,
                 uid: int | None = None, **env: str):
        extra = {"multinode": True} if multinode else {}
        uid = os.getuid() if uid is None else uid
        placement = sched.client().register_job(job_id, uid=uid, gid=uid if uid else os.getgid(),
                                                slots=0 if gpu_index else slots, gpu_index=gpu_index,
                                                share_class=share_class, **extra)
        self.gpus = placement["gpu_uuid"]
        self.env = {"NVSHARE_SOCKET": sched.socket, "NVSHARE_JOB_ID": str(job_id),
                    "SLURM_STEP_ID": "0", "CUDA_VISIBLE_DEVICES": ",".join(self.gpus),
                    "NVSHARE_MANAGED_GPUS": ",".join(self.gpus), "FAKE_CUDA_TRACE": str(trace),
                    **env}
