"""A site's Slurm: task/cgroup, proctrack/cgroup and ConstrainDevices=yes, as nearly every GPU site runs.

Slurm denies each job the device files of gres.conf's `gpu` lines that its GRES do not cover, and
`--gres=nvshare:N` covers none: the job's hook gets its GPU's device file from the daemon instead
(csrc/devices.c, nvshare_slurm/scheduler/devices.py). The stand-in GPUs are character devices with a live
driver (/dev/full's 1:7, /dev/random's 1:8), so an allowed open succeeds and a denied one fails
with EPERM. Node c1 has two GPUs, node c2 one. Its own cluster, beside the session's.
"""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from nvshare_slurm.wire.proto import C

from .cluster import (BIN, CONSTRAINED, CONSTRAINED_CGROUP_CONF, SlurmCluster, client, cluster_dir,
                      job_workdir, need_real_slurm, running, stand_in_gpu)

REPO_C = Path(__file__).resolve().parents[1] / "c"
BUILD = REPO_C / "build"
UUIDS = ["GPU-de5c0000-0000-0000-0000-000000000000", "GPU-de5c0000-0000-0000-0000-000000000001",
         "GPU-de5c0000-0000-0000-0000-000000000002"]
STAND_INS = {"c1": [(1, 7), (1, 8)], "c2": [(1, 7)]}


def node_gres(node: str, devices: list[str]) -> tuple[str, str, list[str]]:
    """What nvshare-node-config prints for the node: gpu GRES on the device files (so Slurm
    denies them to every job that does not hold them), nvshare slots beside them."""
    return (node, f"gpu:{len(devices)},nvshare:{4 * len(devices)}",
            [f"NodeName={node} Name=gpu File={d}" for d in devices]
            + [f"NodeName={node} Name=nvshare Count={4 * len(devices)}"])


@pytest.fixture(scope="module")
def site():
    need_real_slurm()
    if not Path("/sys/fs/cgroup/devices/devices.deny").exists():
        pytest.skip("this machine has no cgroup v1 devices controller (the GPU machine's cgroup "
                    "v2 pass is scripts/gpu-slurm-e2e.sh)")
    subprocess.run(["make", "-s", "-C", str(REPO_C)], check=True, capture_output=True)
    base = cluster_dir("nvscg-")
    devices = {node: [stand_in_gpu(base / "dev" / node / f"nvidia{i}", major, minor)
                      for i, (major, minor) in enumerate(numbers)]
               for node, numbers in STAND_INS.items()}
    cluster = SlurmCluster(base, [node_gres(n, d) for n, d in devices.items()],
                           settings=CONSTRAINED, cgroup_conf=CONSTRAINED_CGROUP_CONF,
                           gres_types="gpu,nvshare")
    uuids = iter(UUIDS)
    for node, paths in devices.items():
        cluster.nodes[node].settings["gpus"] = [{"uuid": next(uuids), "memory": "16G",
                                                 "device": p} for p in paths]
    cluster.devices = devices
    with running(cluster):
        yield cluster


@pytest.fixture
def workdir(site, request):
    yield from job_workdir(site, request.node.name)


def job_script(site, node: str, workdir: Path, name: str, actions: str, srun: str = "") -> str:
    """A job running nvtest with the node's GPUs named by their device files, as the real driver
    finds them; its opens go to <name>.opens, its kernels to the shared trace."""
    gpus = site.nodes[node].settings["gpus"]
    spec = ",".join(f"{g['uuid']}:16G:{g['device']}" for g in gpus)
    q = shlex.quote
    return (f"#!/bin/sh\nexport LD_LIBRARY_PATH={q(str(BUILD))}\n"
            f"export FAKE_CUDA_DEVICES={q(spec)}\n"
            f"export FAKE_CUDA_DEVICE_LOG={q(str(workdir / (name + '.opens')))}\n"
            f"export FAKE_CUDA_TRACE={q(str(workdir / 'trace'))}\n"
            f"{srun}{q(str(BUILD / 'nvtest'))} init count ctx:0 {actions} > "
            f"{q(str(workdir / (name + '.out')))} 2>&1\n")


def opens(workdir: Path, name: str) -> dict[str, list[int]]:
    """device file -> the fd (or -errno) of each open the job's driver made."""
    found: dict[str, list[int]] = {}
    path = workdir / f"{name}.opens"
    for line in (path.read_text().splitlines() if path.exists() else []):
        _, dev, fd = line.split()
        found.setdefault(dev, []).append(int(fd))
    return found


def output(workdir: Path, name: str) -> str:
    path = workdir / f"{name}.out"
    return path.read_text() if path.exists() else "(no output)"


def kernels_by_gpu(workdir: Path) -> dict[str, list[tuple[int, int, int]]]:
    rows: dict[str, list[tuple[int, int, int]]] = {}
    for line in (workdir / "trace").read_text().splitlines():
        pid, gpu, start, end = line.split()
        rows.setdefault(gpu, []).append((int(pid), int(start), int(end)))
    return {g: sorted(r, key=lambda x: x[1]) for g, r in rows.items()}


def test_an_nvshare_job_reaches_the_gpu_it_was_placed_on_and_no_other(site, workdir):
    job = site.sbatch(job_script(site, "c1", workdir, "a", "burst:20000:5:0"),
                      "-w", "c1", "--gres=nvshare:1")
    assert site.wait_job(job, 60) == "COMPLETED", output(workdir, "a") + site.diagnostics()
    out = output(workdir, "a")
    assert "count 1" in out and out.rstrip().endswith("done"), out
    found = opens(workdir, "a")
    reached = [d for d, fds in found.items() if all(fd >= 0 for fd in fds)]
    denied = [d for d, fds in found.items() if fds == [-1]]
    assert len(reached) == 1 and len(denied) == 1, found     # placed on one of c1's two GPUs
    assert sorted(reached + denied) == sorted(site.devices["c1"])
    assert len(found[reached[0]]) == 2                       # cuInit's open and the context's
    assert "opened for its processes" in site.nodes["c1"].log_path.read_text()


def test_a_job_without_gres_reaches_no_gpu(site, workdir):
    job = site.sbatch(job_script(site, "c1", workdir, "plain", "burst:1000:1:0"), "-w", "c1")
    assert site.wait_job(job, 60) == "FAILED"        # nvtest exits 2 when cuInit fails
    assert "error cuInit rc=100" in output(workdir, "plain")
    found = opens(workdir, "plain")
    assert found == {d: [-1] for d in site.devices["c1"]}, found     # EPERM from the cgroup


def test_an_in_job_srun_step_reaches_its_gpu(site, workdir):
    script = job_script(site, "c2", workdir, "step", "burst:10000:3:0",
                        srun="srun --gres=nvshare:1 -n1 ")
    job = site.sbatch(script, "-w", "c2", "--gres=nvshare:1")
    assert site.wait_job(job, 60) == "COMPLETED", output(workdir, "step") + site.diagnostics()
    out = output(workdir, "step")
    assert out.rstrip().endswith("done") and "count 1" in out, out
    assert all(fd >= 0 for fd in opens(workdir, "step")[site.devices["c2"][0]])


def test_two_nvshare_jobs_share_one_gpu_taking_turns(site, workdir):
    gpu = site.nodes["c2"].settings["gpus"][0]["uuid"]
    client(site.nodes["c2"]).admin_update(gpu, mode=C.NVSHARE_MODE_SERIAL)
    try:
        jobs = [site.sbatch(job_script(site, "c2", workdir, name, "burst:30000:8:0"),
                            "-w", "c2", "--gres=nvshare:1") for name in ("x", "y")]
        for job in jobs:
            assert site.wait_job(job, 90) == "COMPLETED", site.diagnostics()
    finally:
        client(site.nodes["c2"]).admin_update(gpu, mode=C.NVSHARE_MODE_AUTO)
    for name in ("x", "y"):
        assert output(workdir, name).rstrip().endswith("done"), output(workdir, name)
    rows = kernels_by_gpu(workdir)[gpu]
    assert len(rows) == 16 and len({r[0] for r in rows}) == 2
    overlapping = [(a, b) for a, b in zip(rows, rows[1:], strict=False) if a[0] != b[0] and b[1] < a[2]]
    assert overlapping == []          # gated: serial mode, one job after the other


def test_two_jobs_on_a_node_of_two_gpus_go_to_different_gpus(site, workdir):
    jobs = {name: site.sbatch(job_script(site, "c1", workdir, name, "burst:200000:5:0"),
                              "-w", "c1", "--gres=nvshare:1") for name in ("p", "q")}
    for name, job in jobs.items():
        assert site.wait_job(job, 60) == "COMPLETED", output(workdir, name) + site.diagnostics()
    reached = {name: [d for d, fds in opens(workdir, name).items() if all(fd >= 0 for fd in fds)]
               for name in jobs}
    assert all(len(r) == 1 for r in reached.values()), reached
    assert reached["p"] != reached["q"], reached
    assert set(kernels_by_gpu(workdir)) == {g["uuid"] for g in site.nodes["c1"].settings["gpus"]}


def test_a_job_of_two_slots_reaches_two_gpus(site, workdir):
    script = job_script(site, "c1", workdir, "two", "burst:10000:2:0 ctx:1 burst:10000:2:0")
    job = site.sbatch(script, "-w", "c1", "--gres=nvshare:2")
    assert site.wait_job(job, 60) == "COMPLETED", output(workdir, "two") + site.diagnostics()
    out = output(workdir, "two")
    assert "count 2" in out and out.rstrip().endswith("done"), out
    found = opens(workdir, "two")
    assert sorted(found) == sorted(site.devices["c1"]), found
    assert all(fd >= 0 for fds in found.values() for fd in fds), found


def test_an_salloc_allocation_runs_its_step_on_the_gpu(site, workdir):
    path = workdir / "salloc.sh"
    path.write_text(job_script(site, "c2", workdir, "salloc", "burst:10000:2:0", srun="srun -n1 "))
    path.chmod(0o755)
    done = site.run([BIN / "salloc", "-w", "c2", "--gres=nvshare:1", str(path)], timeout=60,
                    cwd=str(workdir))
    assert done.returncode == 0, done.stdout + done.stderr + site.diagnostics()
    out = output(workdir, "salloc")
    assert "count 1" in out and out.rstrip().endswith("done"), out
    assert all(fd >= 0 for fd in opens(workdir, "salloc")[site.devices["c2"][0]])
