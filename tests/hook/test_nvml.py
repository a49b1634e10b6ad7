"""NVML inside a managed job says what CUDA says (csrc/nvml.c), against the fake libnvidia-ml.so.1
(tests/c/fake_nvml.c) read by tests/c/nvmltest.c the two ways tools read it: dlsym (pynvml, nvidia-smi)
and linked (a C program).

The job's view: only the GPUs the TaskProlog gave it (CUDA_VISIBLE_DEVICES by UUID), counted and
numbered from 0; on a managed GPU the memory limit as total and the job's own use as used; only the
job's processes. Outside a job, and on a GPU the job's sharing does not cover, NVML is untouched.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import FAKE_GPUS, REPO, become

BUILD = REPO / "tests" / "c" / "build"
GPU0, GPU1 = FAKE_GPUS[0]["uuid"], FAKE_GPUS[1]["uuid"]
G = 1 << 30
READERS = ["nvmltest", "nvmltest_linked"]


def parse(out: str) -> dict:
    """nvmltest's lines -> {"count": n, "devs": {i: {...}}, "procs": {i: {pid: used}}, ...}."""
    seen: dict = {"devs": {}, "mem": {}, "mem2": {}, "probe": {}, "procs": {}, "procs1": {}, "detail": {},
                  "handle_rc": {}}
    for line in out.splitlines():
        w = line.split()
        if w[0] == "pid":
            seen["pid"] = int(w[1])
        elif w[0] == "count":
            seen["count"] = int(w[4]) if w[2] == "0" else None
        elif w[0] == "dev":
            seen["devs"][int(w[1])] = {"uuid": w[3], "index": int(w[5]), "name": " ".join(w[7:])}
        elif w[0] in ("mem", "mem2"):
            seen[w[0]][int(w[1])] = {w[k]: int(w[k + 1]) for k in range(2, len(w), 2)}
        elif w[0] == "probe":
            seen["probe"][int(w[1])] = (int(w[3]), int(w[5]))
        elif w[0] in ("proc", "proc1", "detail"):
            key = {"proc": "procs", "proc1": "procs1", "detail": "detail"}[w[0]]
            seen[key].setdefault(int(w[1]), {})[int(w[3])] = int(w[5])
        elif w[0] == "pname":
            seen.setdefault("names", {})[int(w[1])] = (int(w[3]), w[5])
        elif w[0] == "handle":
            seen["handle_rc"][int(w[1])] = int(w[3])
    return seen


def job_env(hook_lib: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NVSHARE_", "SLURM_", "CUDA_VISIBLE", "FAKE_NVML"))}
    env.update({"LD_PRELOAD": str(hook_lib), "LD_LIBRARY_PATH": str(BUILD)})
    env.update(extra)
    return env


def in_job(hook_lib: Path, job: int = 77, visible: str = GPU1, managed: str | None = None, **extra) -> dict:
    """The environment nvshare-taskprolog gives a task of job 77 placed on `visible`."""
    return job_env(hook_lib, NVSHARE_JOB_ID=str(job), NVSHARE_SOCKET="/nonexistent/nvshare.sock",
                   CUDA_VISIBLE_DEVICES=visible, NVSHARE_MANAGED_GPUS=managed or visible, **extra)


def read_nvml(reader: str, env: dict, preexec=None, cwd: Path | None = None) -> dict:
    exe = (cwd or BUILD) / reader
    out = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=30,
                         preexec_fn=preexec, cwd=str(cwd or BUILD))
    assert out.returncode == 0, out.stderr
    assert "nvshare" not in out.stderr, out.stderr   # nothing to say: no refusal, no error line
    return parse(out.stdout)


@pytest.fixture
def sleeper(procs):
    """A process of job 77 (its environment names the job) and one of job 78."""
    def start(job: int, preexec=None) -> int:
        env = {"PATH": os.environ["PATH"], "NVSHARE_JOB_ID": str(job)}
        p = subprocess.Popen(["sleep", "60"], env=env, preexec_fn=preexec)
        procs.append(p)
        return p.pid
    return start


@pytest.mark.parametrize("reader", READERS)
def test_outside_a_job_nvml_is_the_devices(hook_lib, reader, sleeper):
    other = sleeper(78)
    procs_spec = f"{GPU1}:{other}:1G,{GPU1}:1:2G"
    plain = read_nvml(reader, {**job_env(hook_lib), "LD_PRELOAD": "", "FAKE_NVML_PROCS": procs_spec})
    hooked = read_nvml(reader, {**job_env(hook_lib), "FAKE_NVML_PROCS": procs_spec})
    plain.pop("pid"), hooked.pop("pid")
    assert hooked == plain
    assert hooked["count"] == 2 and hooked["procs"][1] == {other: G, 1: 2 * G}
    assert hooked["mem"][1]["total"] == 16 * G


@pytest.mark.parametrize("reader", READERS)
def test_a_job_sees_its_gpu_its_limit_its_use_and_its_processes(hook_lib, reader, sleeper):
    mine, theirs = sleeper(77), sleeper(78)
    env = in_job(hook_lib, NVSHARE_MEM_LIMIT="4G",
                 FAKE_NVML_PROCS=f"{GPU1}:{mine}:1G,{GPU1}:{theirs}:3G,{GPU1}:1:2G,{GPU1}:self:512M")
    seen = read_nvml(reader, env)
    me = seen["pid"]
    # One GPU, numbered 0, the one the job was given; index 1 does not exist for it.
    assert seen["count"] == 1
    assert seen["devs"][0]["uuid"] == GPU1 and seen["devs"][0]["index"] == 0
    assert seen["devs"][0]["name"] == "Fake GPU 1"            # untouched calls pass through
    assert seen["handle_rc"][1] == 2                           # NVML_ERROR_INVALID_ARGUMENT
    # Memory: the limit as total, the job's 1.5 GiB as used, free within both.
    assert seen["mem"][0] == {"rc": 0, "total": 4 * G, "free": int(2.5 * G), "used": int(1.5 * G)}
    assert seen["mem2"][0] == {"rc": 0, "total": 4 * G, "reserved": 0, "free": int(2.5 * G),
                               "used": int(1.5 * G)}
    # Processes: the job's two, in every call version; the size probe counts only those.
    want = {mine: G, me: G // 2}
    assert seen["probe"][0] == (7, 2)                          # NVML_ERROR_INSUFFICIENT_SIZE, 2
    assert seen["procs"][0] == want and seen["procs1"][0] == want and seen["detail"][0] == want


@pytest.mark.parametrize("reader", READERS)
def test_another_jobs_process_has_no_name(hook_lib, reader, sleeper):
    """nvidia-smi lists processes from NVML's private table and names each pid: another job's
    process is not named (NVML_ERROR_NOT_FOUND, as for a process that is gone); the job's is."""
    mine, theirs = sleeper(77), sleeper(78)
    seen = read_nvml(reader, in_job(hook_lib, NVMLTEST_NAMES=f"{mine},{theirs},1"))
    assert seen["names"] == {mine: (0, f"proc{mine}"), theirs: (6, "-"), 1: (6, "-")}
    plain = read_nvml(reader, {**job_env(hook_lib), "NVMLTEST_NAMES": f"{theirs}"})
    assert plain["names"] == {theirs: (0, f"proc{theirs}")}


@pytest.mark.parametrize("reader", READERS)
def test_without_a_limit_total_is_the_devices_and_free_stays_the_devices(hook_lib, reader, sleeper):
    mine = sleeper(77)
    env = in_job(hook_lib, visible=f"{GPU0},{GPU1}", FAKE_NVML_PROCS=f"{GPU0}:{mine}:2G,{GPU0}:1:9G")
    seen = read_nvml(reader, env)
    assert seen["count"] == 2 and [seen["devs"][i]["uuid"] for i in (0, 1)] == [GPU0, GPU1]
    assert seen["mem"][0] == {"rc": 0, "total": 16 * G, "free": 12 * G, "used": 2 * G}
    assert seen["procs"][0] == {mine: 2 * G}
    assert seen["mem"][1]["used"] == 0 and seen["procs"].get(1) is None


def test_visible_order_numbers_the_gpus(hook_lib, sleeper):
    """CUDA_VISIBLE_DEVICES in reverse order: NVML's index 0 is the GPU CUDA calls device 0."""
    seen = read_nvml("nvmltest", in_job(hook_lib, visible=f"{GPU1},{GPU0}"))
    assert seen["devs"][0]["uuid"] == GPU1 and seen["devs"][0]["index"] == 0
    assert seen["devs"][1]["uuid"] == GPU0 and seen["devs"][1]["index"] == 1


def test_a_gpu_the_sharing_does_not_cover_is_the_devices(hook_lib, sleeper):
    """GPU0 visible but not managed (NVSHARE_MANAGED_GPUS names GPU1 only): its view is NVML's."""
    theirs = sleeper(78)
    env = in_job(hook_lib, visible=f"{GPU0},{GPU1}", managed=GPU1, NVSHARE_MEM_LIMIT="4G",
                 FAKE_NVML_PROCS=f"{GPU0}:{theirs}:3G,{GPU1}:{theirs}:3G")
    seen = read_nvml("nvmltest", env)
    assert seen["mem"][0]["total"] == 16 * G and seen["procs"][0] == {theirs: 3 * G}
    assert seen["mem"][1]["total"] == 4 * G and seen["procs"].get(1) is None


def test_another_users_process_is_hidden_even_when_it_claims_the_job(hook_lib, sleeper):
    """As nobody: root's process whose environment names job 77 is not readable, so not the job's;
    nobody's own process of job 77 is."""
    nobody = 65534
    work = Path(tempfile.mkdtemp(prefix="nvs-nvml-", dir="/tmp"))   # other users reach it too
    try:
        check_as_nobody(hook_lib, sleeper, work, nobody)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_as_nobody(hook_lib: Path, sleeper, work: Path, nobody: int) -> None:
    for name in ("nvmltest", "libnvidia-ml.so.1"):
        shutil.copy(BUILD / name, work / name)
    lib = work / "libnvshare.so"
    shutil.copy(hook_lib, lib)
    os.chmod(work, 0o755)
    roots = sleeper(77)
    mine = sleeper(77, preexec=lambda: become(nobody))
    env = in_job(lib, FAKE_NVML_PROCS=f"{GPU1}:{roots}:1G,{GPU1}:{mine}:2G")
    env["LD_LIBRARY_PATH"] = str(work)
    seen = read_nvml("nvmltest", env, preexec=lambda: become(nobody), cwd=work)
    assert seen["procs"][0] == {mine: 2 * G}
    assert seen["mem"][0]["used"] == 2 * G


PYNVML_READER = """
import pynvml
pynvml.nvmlInit()
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    m = pynvml.nvmlDeviceGetMemoryInfo(h)
    ps = sorted((p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
    print(i, pynvml.nvmlDeviceGetUUID(h), m.total, m.used, m.free, ps)
"""


def test_pynvml_sees_the_jobs_view(hook_lib, sleeper):
    """pynvml (nvidia-ml-py: ctypes, dlsym) as nvitop and frameworks' checks use it."""
    pytest.importorskip("pynvml")
    mine = sleeper(77)
    env = in_job(hook_lib, NVSHARE_MEM_LIMIT="4G", FAKE_NVML_PROCS=f"{GPU1}:{mine}:1G,{GPU1}:1:2G")
    out = subprocess.run([sys.executable, "-c", PYNVML_READER], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"0 {GPU1} {4 * G} {G} {3 * G} [({mine}, {G})]"]
