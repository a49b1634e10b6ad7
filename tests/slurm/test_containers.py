"""Slurm's OCI containers (`srun --container=BUNDLE`) with crun, configured by the shipped
slurm/oci.conf.example: each container gets the hook and the daemon's socket from
nvshare-container, registers from its own PID namespace, and is gated.

The bundle is a plain `crun spec` bundle (its own PID, mount, IPC, UTS and network namespaces)
whose small rootfs binds the node's /usr and /etc read-only, the fake driver's build directory and
the test's directory: nothing of nvshare-slurm's. Its own cluster: one node with one fake GPU in
serial mode, proctrack/cgroup and task/cgroup (a container's process is known by its step's
cgroup). The jobs run as root; crun's state lies under --root=/tmp/ as the example says.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from nvshare_slurm.wire.proto import C

from .cluster import (BIN, CONSTRAINED, CONSTRAINED_CGROUP_CONF, FAKE_GPUS, SlurmCluster, client,
                      cluster_dir, entry_point, job_dir, need_real_slurm, running, wait_until)
from .helpers import BUILD, REPO_C

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "slurm" / "oci.conf.example"
CRUN = "/usr/bin/crun"
GPU = FAKE_GPUS[0]["uuid"]
NODE = "k1"
# This machine mounts cgroup v1 with a cgroup2 hierarchy beside it (hybrid), which crun refuses
# even with --cgroup-manager=disabled: the shim runs it in a mount namespace of its own without
# that mount (made private first, so the unmount stays there; not / itself, which in
# scripts/test-slurm-2411.sh's chroot is no mount point). It changes nothing else; on a machine
# without that mount, crun itself runs.
CRUN_SHIM = """#!/bin/sh
if grep -q ' /sys/fs/cgroup/unified cgroup2 ' /proc/mounts; then
    exec unshare --mount --propagation unchanged sh -c \\
        'mount --make-rprivate /sys/fs/cgroup && umount /sys/fs/cgroup/unified && exec {crun} "$@"' \\
        crun "$@"
fi
exec {crun} "$@"
"""


def oci_conf(base: Path) -> str:
    """slurm/oci.conf.example with the install prefix filled in (the test venv's
    nvshare-container, given its node's config, as every entry point of the test cluster is)
    and crun through the shim."""
    text = EXAMPLE.read_text()
    container = f"{entry_point('nvshare-container')} oci --config {base}/%n/nvshare.yaml"
    assert "/opt/nvshare/bin/nvshare-container oci" in text
    text = text.replace("/opt/nvshare/bin/nvshare-container oci", container)
    return text.replace(f"{CRUN} ", f"{base}/crun-shim ")


def make_bundle(path: Path, binds: list[str]) -> Path:
    """`crun spec`'s bundle, with its rootfs of read-only binds of the node's /usr and /etc (the
    node's programs and libraries, as an image would carry them) and of `binds`."""
    path.mkdir()
    subprocess.run([CRUN, "spec"], cwd=path, check=True, capture_output=True)
    rootfs = path / "rootfs"
    rootfs.mkdir()
    config = json.loads((path / "config.json").read_text())
    config["process"]["terminal"] = False
    mounts = config["mounts"]
    for name in ("bin", "lib", "lib64", "sbin", "usr", "etc"):
        host = Path("/") / name
        if host.is_symlink():            # merged /usr: /bin -> usr/bin
            (rootfs / name).symlink_to(os.readlink(host))
        elif host.is_dir():
            (rootfs / name).mkdir()
            mounts.append({"destination": f"/{name}", "type": "bind", "source": str(host),
                           "options": ["rbind", "ro"]})
    for bind in binds:
        mounts.append({"destination": bind, "type": "bind", "source": bind,
                       "options": ["rbind", "rw" if "jobs" in bind else "ro"]})
    # Every mount point made here, before any container starts: two containers of one bundle
    # starting together otherwise race to create them (crun: "cannot mkdir `sys`: File exists").
    for mount in mounts:
        target = rootfs / mount["destination"].lstrip("/")
        if not target.is_symlink():
            target.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


@pytest.fixture(scope="module")
def oci_site():
    need_real_slurm()
    if not Path(CRUN).exists():
        pytest.skip(f"{CRUN} is not installed (scripts/install-demo-slurm.sh installs crun)")
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    if not Path("/sys/fs/cgroup/devices/devices.deny").exists():
        pytest.skip("this machine has no cgroup v1 hierarchy with a devices controller, which "
                    "this cluster's cgroup.conf names")
    subprocess.run(["make", "-s", "-C", str(REPO_C)], check=True, capture_output=True)
    base = cluster_dir("nvsoci-")
    cluster = SlurmCluster(base, [(NODE, "nvshare:4", [f"NodeName={NODE} Name=nvshare Count=4"])],
                           settings=CONSTRAINED, cgroup_conf=CONSTRAINED_CGROUP_CONF)
    # rogue_check_sec: how often the daemon looks for a task without the hook (the last test).
    cluster.nodes[NODE].settings.update(gpus=[FAKE_GPUS[0]], scheduling_mode="serial",
                                        rogue_check_sec=0.5)
    (base / "crun-shim").write_text(CRUN_SHIM.format(crun=CRUN))
    (base / "crun-shim").chmod(0o755)
    with running(cluster):
        # oci.conf beside slurm.conf: slurmstepd reads it for each step with --container.
        (base / "oci.conf").write_text(oci_conf(base))
        yield cluster


@pytest.fixture
def workdir(oci_site, request):
    yield job_dir(oci_site, request.node.name)
    oci_site.run([BIN / "scancel", "-u", "root"], timeout=10)


def start_container_job(site: SlurmCluster, bundle: Path, trace: Path, actions: str,
                        out: Path) -> subprocess.Popen:
    env = dict(site.env, LD_LIBRARY_PATH=str(BUILD), FAKE_CUDA_TRACE=str(trace))
    argv = [str(BIN / "srun"), f"--container={bundle}", "--gres=nvshare:1", "-w", NODE, "-n1",
            str(BUILD / "nvtest"), "init", "ctx:0", *shlex.split(actions)]
    return subprocess.Popen(argv, env=env, stdout=out.open("wb"), stderr=subprocess.STDOUT)


def kernels(trace: Path, label: str) -> list[tuple[str, int, int]]:
    """(label, start_ns, end_ns) of each kernel in one job's trace: inside their containers both
    jobs' processes have the same pid, so each job writes a trace of its own."""
    rows = []
    for line in trace.read_text().splitlines():
        _pid, gpu, start, end = line.split()
        if gpu == GPU:
            rows.append((label, int(start), int(end)))
    return rows


def test_two_container_jobs_register_from_their_pid_namespaces_and_take_turns(oci_site, workdir):
    bundle = make_bundle(workdir / "bundle", [str(BUILD), str(workdir)])
    node = oci_site.nodes[NODE]
    procs = {}
    for name in ("a", "b"):
        procs[name] = start_container_job(oci_site, bundle, workdir / f"trace.{name}",
                                          "burst:50000:60:1", workdir / f"{name}.out")

    def diagnostics() -> str:
        return oci_site.diagnostics() + "".join(
            f"\n--- job {name}'s output\n" + (workdir / f"{name}.out").read_text(errors="replace")
            for name in procs)

    # Both containers' clients at once: one holds the GPU, the other waits its turn. Each job's
    # work lasts 3 s: with 1 s, CI's 24.11 run launched b's step 1.0 s after a's, as a ended.
    registered = wait_until(
        lambda: (lambda jobs: jobs if len(jobs) == 2 else None)(
            [j for j in client(node).status(C.NVSHARE_STATUS_JOBS)["jobs"] if j["clients"]]),
        60, "both containers' clients registered", diagnostics)
    for proc in procs.values():
        assert proc.wait(90) == 0
    outputs = {name: (workdir / f"{name}.out").read_text(errors="replace") for name in procs}
    for name, text in outputs.items():
        assert text.rstrip().endswith("done"), f"job {name}:\n{text}\n{diagnostics()}"
    log = node.log_path.read_text(errors="replace")
    for job in registered:
        (peer,) = job["clients"]
        # The daemon knows each by its pid on the node, which is not the one inside the container.
        assert f"job {job['job_id']} " in log and f"pid {peer['pid']}" in log
        assert peer["pid"] > 1
        assert "client registered from a PID namespace" in log.split(f"pid {peer['pid']}", 1)[1]
    rows = sorted(kernels(workdir / "trace.a", "a") + kernels(workdir / "trace.b", "b"),
                  key=lambda r: r[1])
    assert len(rows) == 120 and {r[0] for r in rows} == {"a", "b"}
    overlapping = [(x, y) for x, y in zip(rows, rows[1:], strict=False)
                   if x[0] != y[0] and y[1] < x[2]]
    turns = 1 + sum(1 for x, y in zip(rows, rows[1:], strict=False) if x[0] != y[0])
    assert overlapping == [] and turns == 2, rows


def test_a_container_without_the_hook_is_reported_in_its_output_status_and_log(oci_site, workdir):
    """A site whose oci.conf runs crun itself (no nvshare-container): on 22.05 the TaskProlog's
    exports never reach the container, on 24.11 the hook is not mounted there. The job is not
    silently ungated: the daemon finds its process (the CUDA driver mapped, the hook not) in the
    job's cgroup, logs it once, nvshare-status shows the job Ungated, and the job's output says so."""
    conf = oci_site.base / "oci.conf"
    shipped = conf.read_text()
    # The shipped RunTimeRun less its nvshare-container part: crun with the same flags.
    plain = "\n".join('RunTimeRun="' + line.split(" -- ", 1)[1] if line.startswith("RunTimeRun=")
                      else line for line in shipped.splitlines() if not line.startswith("#")) + "\n"
    assert "nvshare-container" not in plain and 'RunTimeRun="' in plain, plain
    conf.write_text(plain)
    try:
        bundle = make_bundle(workdir / "bundle", [str(BUILD), str(workdir)])
        node = oci_site.nodes[NODE]
        out = workdir / "plain.out"
        proc = start_container_job(oci_site, bundle, workdir / "trace.plain",
                                   "burst:50000:80:20", out)

        def diagnostics() -> str:
            return (oci_site.diagnostics() + f"\n--- oci.conf\n{plain}\n--- the job's output\n"
                    + out.read_text(errors="replace"))

        ungated = wait_until(
            lambda: [j for j in client(node).status(C.NVSHARE_STATUS_JOBS)["jobs"]
                     if j.get("unhooked")] or None,
            60, "the job shown without the hook", diagnostics)
        assert proc.wait(90) == 0, diagnostics()
        (job,) = ungated
        assert not job["clients"]          # nothing registered: the hook never loaded
        text = out.read_text(errors="replace")
        assert f"nvshare: job {job['job_id']}: pid" in text and "its GPU work is not gated" in text, \
            diagnostics()
        log = node.log_path.read_text(errors="replace")
        assert log.count(f"job {job['job_id']}: pid") >= 1 and "without libnvshare.so" in log
        assert log.count("the job's output says so") == 1, diagnostics()
    finally:
        conf.write_text(shipped)
