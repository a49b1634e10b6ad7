"""GPU device files behind a device cgroup (Slurm's ConstrainDevices=yes), hook and daemon.

The stand-in GPUs are character devices with a live driver (/dev/full's 1:7, /dev/random's 1:8) made
with mknod, so that a process the cgroup allows opens them and one it denies gets EPERM. The fake
CUDA driver opens each GPU's file at cuInit and at every new context, as the real one opens
/dev/nvidia<minor>; the daemon passes its own descriptor to a process of the job the GPU was placed
on, which sits in that job's cgroup. Needs root and cgroup v1's devices controller (this CI machine);
cgroup v2 machines are covered by the real-Slurm test on the GPU machine.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

import pytest

from conftest import FAKE_GPUS, REPO, become
from nvshare_slurm.scheduler import devices

BUILD = REPO / "tests" / "c" / "build"
NVTEST = BUILD / "nvtest"
DEVICES_ROOT = Path("/sys/fs/cgroup/devices")
STAND_INS = [(1, 7), (1, 8)]
NOBODY = 65534


# ---- what a process's cgroup says (no root needed) ---------------------------------------------

@pytest.mark.parametrize("text,jobs", [
    ("4:devices:/slurm/uid_1000/job_42/step_0/task_0\n", {42}),
    ("4:devices:/slurm_n1/uid_0/job_7/step_batch\n1:cpu:/slurm_n1/uid_0/job_7\n", {7}),
    ("0::/system.slice/slurmstepd.scope/job_1234/step_3/user/task_0\n", {1234}),
    ("0::/system.slice/vm_slurmstepd.scope/job_1/step_batch/user/task_0\n", {1}),   # H100, 22.05
    ("0::/user.slice/user-1000.slice/user@1000.service/job_42\n", set()),   # not Slurm's
    ("0::/slurmish/job_x/job_12a\n", set()),
    ("", set()),
])
def test_the_slurm_job_of_a_cgroup_path(text, jobs):
    assert devices.slurm_jobs_of_cgroup(text) == jobs


# ---- hook, fake driver, daemon and a real device cgroup ----------------------------------------

@pytest.fixture(scope="module")
def cgroups():
    if os.geteuid() != 0:
        pytest.skip("device cgroups need root")
    if not (DEVICES_ROOT / "devices.deny").exists():
        pytest.skip("no cgroup v1 devices controller here (cgroup v2: see tests/gpu and the "
                    "GPU machine's Slurm pass)")
    top = DEVICES_ROOT / f"nvstest-{uuidlib.uuid4().hex[:8]}"
    top.mkdir()
    made: list[Path] = [top]
    for major, minor in STAND_INS:
        (top / "devices.deny").write_text(f"c {major}:{minor} rwm")

    def job_cgroup(job_id: int) -> Path:
        path = top / "slurm_test" / "uid_0" / f"job_{job_id}" / "step_0"
        for part in reversed([path, *path.parents]):
            if part != top and top in part.parents and not part.exists():
                part.mkdir()
                made.append(part)
        return path

    yield job_cgroup
    for path in reversed(made):
        for _ in range(50):
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@pytest.fixture(scope="module")
def stand_ins():
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    d = Path(tempfile.mkdtemp(prefix="nvs-dev-", dir="/tmp"))    # other users reach it too
    d.chmod(0o755)
    paths = []
    for i, (major, minor) in enumerate(STAND_INS):
        path = d / f"nvidia{i}"
        os.mknod(path, 0o20666, os.makedev(major, minor))
        path.chmod(0o666)
        paths.append(str(path))
    yield paths
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def node(scheduler_factory, stand_ins, hook_lib_built):
    gpus = [dict(g, device=stand_ins[i]) for i, g in enumerate(FAKE_GPUS)]
    return scheduler_factory(gpus=gpus)


@pytest.fixture(scope="module")
def hook_lib_built():
    import nvshare_slurm
    lib = nvshare_slurm.libnvshare_path()
    if not lib.exists():
        subprocess.run(["python3", "setup.py", "-q", "build_ext", "--inplace"], cwd=REPO,
                       check=True, capture_output=True)
    subprocess.run(["make", "-s", "-C", str(REPO / "tests" / "c")], check=True, capture_output=True)
    return lib


def run_in_cgroup(cgroup: Path, args: list[str], env: dict, hook: Path | None, uid: int = 0,
                  timeout: float = 60) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("NVSHARE_", "SLURM_", "FAKE_CUDA_", "LD_PRELOAD"))}
    full.update(LD_LIBRARY_PATH=str(BUILD), **env)
    if hook is not None:
        full["LD_PRELOAD"] = str(hook)

    def enter() -> None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        if uid:
            become(uid)

    return subprocess.run([str(NVTEST), *args], env=full, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=enter)


def job_env(node, job_id: int, stand_ins: list[str], log: Path) -> dict:
    return {"NVSHARE_SOCKET": node.socket, "NVSHARE_JOB_ID": str(job_id), "SLURM_STEP_ID": "0",
            "FAKE_CUDA_DEVICES": ",".join(f"{g['uuid']}:16G:{p}"
                                          for g, p in zip(FAKE_GPUS, stand_ins, strict=True)),
            "FAKE_CUDA_DEVICE_LOG": str(log)}


def device_opens(log: Path) -> list[tuple[str, int]]:
    """(device file, fd or -errno) of every open the fake driver made."""
    if not log.exists():
        return []
    return [(line.split()[1], int(line.split()[2])) for line in log.read_text().splitlines()]


def test_the_cgroup_denies_the_gpu_without_the_hook(cgroups, stand_ins, node, tmp_path):
    node.client().register_job(101, uid=0, gid=0, gpu_index=[0])
    log = tmp_path / "opens"
    out = run_in_cgroup(cgroups(101), ["init"], job_env(node, 101, stand_ins, log), hook=None)
    assert "error cuInit rc=100" in out.stdout, out.stdout + out.stderr
    assert device_opens(log) == [(stand_ins[0], -1), (stand_ins[1], -1)]     # EPERM, both


def test_a_job_process_reaches_exactly_its_gpu_through_the_daemon(cgroups, stand_ins, node,
                                                                  hook_lib_built, tmp_path):
    placed = node.client().register_job(102, uid=0, gid=0, gpu_index=[0])
    assert placed["gpu_index"] == [0]
    log = tmp_path / "opens"
    out = run_in_cgroup(cgroups(102), ["init", "count", "ctx:0", "launch:1000:2", "sync"],
                        job_env(node, 102, stand_ins, log), hook=hook_lib_built)
    assert out.returncode == 0 and "count 1" in out.stdout, out.stdout + out.stderr
    opens = device_opens(log)
    assert [fd >= 0 for path, fd in opens if path == stand_ins[0]] == [True, True]  # init, context
    assert [fd for path, fd in opens if path == stand_ins[1]] == [-1]    # not placed there: EPERM
    assert "not the device file of a GPU job 102 was placed on" in out.stderr
    assert f"job 102: {stand_ins[0]} opened for its processes" in node.log()


def test_a_process_in_another_jobs_cgroup_is_refused(cgroups, stand_ins, node, hook_lib_built,
                                                     tmp_path):
    node.client().register_job(103, uid=0, gid=0, gpu_index=[0])
    log = tmp_path / "opens"
    out = run_in_cgroup(cgroups(104), ["init"], job_env(node, 103, stand_ins, log),
                        hook=hook_lib_built)
    assert "error cuInit rc=100" in out.stdout, out.stdout + out.stderr
    assert "is in the cgroup of job 104, not job 103's" in out.stderr
    assert all(fd == -1 for _, fd in device_opens(log))


def test_another_users_process_is_refused(cgroups, stand_ins, node, hook_lib_built, tmp_path):
    node.client().register_job(105, uid=0, gid=0, gpu_index=[0])
    log = Path(tempfile.mkdtemp(prefix="nvs-log-", dir="/tmp")) / "opens"
    log.parent.chmod(0o777)
    out = run_in_cgroup(cgroups(105), ["init"], job_env(node, 105, stand_ins, log),
                        hook=hook_lib_built, uid=NOBODY)
    shutil.rmtree(log.parent, ignore_errors=True)
    assert "error cuInit rc=100" in out.stdout, out.stdout + out.stderr
    assert f"uid {NOBODY} may not open devices for job 105 of uid 0" in out.stderr


def test_open_and_fopen_without_cuda_get_the_device_as_nvml_would(cgroups, stand_ins, node,
                                                                  hook_lib_built, tmp_path):
    node.client().register_job(106, uid=0, gid=0, gpu_index=[1])
    dev0, dev1 = stand_ins
    out = run_in_cgroup(cgroups(106), [f"open:{dev1}", f"fopen:{dev1}", f"open:{dev0}"],
                        job_env(node, 106, stand_ins, tmp_path / "opens"), hook=hook_lib_built)
    assert f"open {dev1} ok cloexec=1" in out.stdout, out.stdout + out.stderr
    assert f"fopen {dev1} ok cloexec=1" in out.stdout
    assert f"open {dev0} errno=1" in out.stdout       # placed on GPU 1 only


def test_without_the_daemon_opens_fail_as_the_cgroup_says_and_soon(cgroups, stand_ins, node,
                                                                   hook_lib_built, tmp_path):
    node.client().register_job(107, uid=0, gid=0, gpu_index=[0])
    node.stop()
    dev0 = stand_ins[0]
    started = time.monotonic()
    out = run_in_cgroup(cgroups(107), [f"open:{dev0}"] * 3,
                        job_env(node, 107, stand_ins, tmp_path / "opens"), hook=hook_lib_built)
    took = time.monotonic() - started
    assert out.stdout.count(f"open {dev0} errno=1") == 3, out.stdout + out.stderr
    assert "cannot reach nvshare-scheduler" in out.stderr
    # The first open waits for a daemon that may be restarting; the next ones do not wait again.
    assert took < 20, took
