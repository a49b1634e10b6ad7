"""nvshare-container against a real nvshare-scheduler: the enroot hook (slurm/enroot-hook) run with
the environment enroot gives hooks, and the Slurm OCI bundle edit (oci.conf's RunTimeRun).

enroot is not installed here: its order of mounts is replayed instead (runtime.sh: the system
fstab's tmpfs on /tmp and /var/run first, then the hooks' $ENROOT_MOUNTS), in a mount namespace
of the test's own, and the daemon is reached through the container's root.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKE_GPUS, REPO
from nvshare_slurm import container, libnvshare_file

JOB = 31
HOOK_SCRIPT = REPO / "slurm" / "enroot-hook"
ENTRY = [sys.executable, "-m", "nvshare_slurm.container"]


@pytest.fixture
def sched(scheduler_factory):
    s = scheduler_factory()
    s.client().register_job(JOB, uid=os.getuid(), gid=os.getgid(), gpu_index=[0])
    return s


def hook_script(tmp_path: Path) -> Path:
    """slurm/enroot-hook with the install prefix filled in: this interpreter's module."""
    text = HOOK_SCRIPT.read_text()
    assert "exec /opt/nvshare/bin/nvshare-container enroot" in text
    script = tmp_path / "nvshare.sh"
    script.write_text(text.replace("/opt/nvshare/bin/nvshare-container",
                                   " ".join(ENTRY)))
    script.chmod(0o755)
    return script


def run_enroot_hook(tmp_path: Path, sched, **env: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    mounts, environ = tmp_path / "fstab", tmp_path / "environ"
    # What enroot's runtime exports to hooks; pyxis passes the job's environment (SLURM_*).
    mounts.write_text("")
    environ.write_text("PATH=/usr/bin:/bin\n")
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ENROOT_MOUNTS": str(mounts),
            "ENROOT_ENVIRON": str(environ), "ENROOT_ROOTFS": str(tmp_path / "rootfs"),
            "ENROOT_PID": str(os.getpid()), "NVSHARE_CONFIG": str(sched.config_path),
            "PYTHONPATH": str(REPO), **env}
    result = subprocess.run([str(hook_script(tmp_path))], env=full, capture_output=True, text=True,
                            timeout=30)
    return result, mounts, environ


def test_enroot_hook_appends_the_mounts_and_the_taskprologs_variables(tmp_path, sched):
    result, mounts, environ = run_enroot_hook(tmp_path, sched, SLURM_JOB_ID=str(JOB),
                                              SLURM_STEP_ID="0", LD_PRELOAD="/usr/lib/site.so")
    assert result.returncode == 0, result.stderr
    socket_dir = os.path.dirname(sched.socket)
    assert mounts.read_text().splitlines() == [
        f"{libnvshare_file()} {libnvshare_file()} none x-create=file,bind,ro,nosuid,nodev,private",
        f"{socket_dir} {socket_dir} none x-create=dir,bind,ro,nosuid,nodev,private"]
    lines = environ.read_text().splitlines()
    assert lines[0] == "PATH=/usr/bin:/bin"          # enroot's own lines stay first
    added = dict(line.split("=", 1) for line in lines[1:])
    assert added["LD_PRELOAD"] == f"{libnvshare_file()}:/usr/lib/site.so"
    assert added["NVSHARE_SOCKET"] == sched.socket and added["NVSHARE_JOB_ID"] == str(JOB)
    assert added["CUDA_VISIBLE_DEVICES"] == added["NVSHARE_MANAGED_GPUS"] == FAKE_GPUS[0]["uuid"]


def test_enroot_hook_adds_nothing_outside_a_managed_job(tmp_path, sched):
    for env in ({}, {"SLURM_JOB_ID": "999"}):      # not a Slurm task; a job without nvshare here
        result, mounts, environ = run_enroot_hook(tmp_path, sched, **env)
        assert result.returncode == 0, result.stderr
        assert mounts.read_text() == "" and environ.read_text() == "PATH=/usr/bin:/bin\n"


def test_enroot_hook_mounts_reach_the_daemon_past_enroots_tmpfs(tmp_path, sched):
    """enroot's order: tmpfs on the rootfs's /tmp and /var/run, then the hooks' fstab. The socket's
    directory (under /tmp here) and the hook must show through, and the daemon answer there."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux) for a mount namespace")
    result, mounts, _ = run_enroot_hook(tmp_path, sched, SLURM_JOB_ID=str(JOB))
    assert result.returncode == 0, result.stderr
    rootfs = tmp_path / "rootfs"
    (rootfs / "run").mkdir(parents=True)
    (rootfs / "var").mkdir()
    (rootfs / "var" / "run").symlink_to("../run")
    replay = f"""
import os, socket, subprocess, sys
rootfs = {str(rootfs)!r}
def mount(*args):
    subprocess.run(["mount", *args], check=True)
for point in ("/tmp", "/run"):       # 10-system.fstab: tmpfs /tmp, tmpfs /var/run (-> /run)
    os.makedirs(rootfs + point, exist_ok=True)
    mount("-t", "tmpfs", "tmpfs", rootfs + point)
for line in open({str(mounts)!r}):
    source, target, _type, options = line.split()[:4]
    target = rootfs + target
    if "x-create=file" in options:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    else:
        os.makedirs(target, exist_ok=True)
    mount("--bind", source, target)
    mount("-o", "remount,bind,ro", target)
sys.path.insert(0, {str(REPO)!r})
from nvshare_slurm.wire.client import Client
print(len(Client(rootfs + {sched.socket!r}, timeout=5.0).status()["gpus"]),
      os.path.getsize(rootfs + {libnvshare_file()!r}) > 0)
"""
    seen = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                           replay], capture_output=True, text=True, timeout=30)
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.split() == [str(len(FAKE_GPUS)), "True"]


def crun_spec_config() -> dict:
    """The parts of `crun spec`'s config.json that nvshare-container touches."""
    return {"ociVersion": "1.0.0", "process": {"terminal": False, "args": ["nvtest"],
                                               "env": ["PATH=/usr/bin:/bin", "LD_PRELOAD=/u.so"]},
            "root": {"path": "rootfs", "readonly": True},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}]}


def run_oci(tmp_path: Path, sched, job_id: int) -> subprocess.CompletedProcess:
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps(crun_spec_config()))
    # The "runtime" prints the config.json it is handed.
    return subprocess.run([*ENTRY, "oci", "--config", str(sched.config_path), str(job_id),
                           str(bundle), "--", "/bin/cat", str(bundle / "config.json")],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=30)


def test_oci_bundle_gets_the_hook_the_socket_and_the_variables(tmp_path, sched):
    result = run_oci(tmp_path, sched, JOB)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    env = dict(e.split("=", 1) for e in config["process"]["env"])
    assert env["LD_PRELOAD"] == f"{libnvshare_file()}:/u.so" and env["PATH"] == "/usr/bin:/bin"
    assert env["NVSHARE_SOCKET"] == sched.socket and env["NVSHARE_JOB_ID"] == str(JOB)
    assert env["CUDA_VISIBLE_DEVICES"] == FAKE_GPUS[0]["uuid"]
    assert [m["destination"] for m in config["mounts"]] == \
        ["/proc", libnvshare_file(), os.path.dirname(sched.socket)]
    assert all(m["source"] == m["destination"] and "ro" in m["options"]
               for m in config["mounts"][1:])
    assert config["process"]["args"] == ["nvtest"] and config["root"]["readonly"] is True


def test_oci_bundle_of_a_job_without_nvshare_runs_unchanged(tmp_path, sched):
    result = run_oci(tmp_path, sched, 999)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == crun_spec_config()


def test_oci_managed_job_without_the_hook_does_not_start(tmp_path, sched, monkeypatch, capsys):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(crun_spec_config()))
    monkeypatch.setattr(container, "libnvshare_file", lambda: str(tmp_path / "missing.so"))
    ran = tmp_path / "ran"
    status = container.main(["oci", "--config", str(sched.config_path), str(JOB), str(bundle),
                             "--", "/usr/bin/touch", str(ran)], environ={})
    assert status == 1 and not ran.exists()
    err = capsys.readouterr().err
    assert f"nvshare-container: job {JOB}: oci: the hook {tmp_path}/missing.so is not installed" in err
    assert "the container does not start" in err
    assert json.loads((bundle / "config.json").read_text()) == crun_spec_config()
