"""A real Slurm cluster (22.05 to 24.11) in a temp dir: its own munged, slurmctld, slurmd per node.

Every node runs on this machine (`slurmd -N <node>`, one port each). Each node gets its own
nvshare-scheduler config (socket, state dir, fake GPUs); Slurm's Prolog/Epilog/TaskProlog point at
small wrappers that choose the node's NVSHARE_CONFIG from SLURMD_NODENAME (slurmd passes no other
environment) and exec the installed entry points.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from nvshare_slurm.node import localcluster

# Where Slurm's daemons and commands are; a Slurm built into another prefix names its own.
SBIN = Path(os.environ.get("NVSHARE_TEST_SLURM_SBIN", "/usr/sbin"))
BIN = Path(os.environ.get("NVSHARE_TEST_SLURM_BIN", "/usr/bin"))
FAKE_GPUS = [
    {"uuid": "GPU-fa4e0000-0000-0000-0000-000000000000", "memory": "16G"},
    {"uuid": "GPU-fa4e0000-0000-0000-0000-000000000001", "memory": "16G"},
]


# The test cluster's share classes: its partitions stand in for a site's QOS names.
PRIORITY_CLASSES = {"partition": {"prod": "high", "scavenge": "low"}, "default": "normal"}


def entry_point(name: str) -> str:
    """The installed console script beside this interpreter (not a pyenv shim, which needs PATH)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} is not installed (pip install -e .)")
    return found


@dataclass
class Node:
    name: str
    port: int
    gres: str                      # the NodeName Gres= value
    gres_conf: list[str]           # gres.conf lines for this node
    workdir: Path
    settings: dict = field(default_factory=dict)

    @property
    def config_path(self) -> Path:
        return self.workdir / "nvshare.yaml"

    @property
    def socket(self) -> str:
        return str(self.workdir / "sched.sock")

    @property
    def log_path(self) -> Path:
        return self.workdir / "scheduler.log"


# A site's device confinement: task/cgroup, proctrack/cgroup and cgroup.conf ConstrainDevices=yes.
# cgroup v1 here (this machine mounts v1 with a devices controller); the GPU machine's is v2.
CONSTRAINED = {"proctrack": "proctrack/cgroup", "task_plugin": "task/cgroup,task/affinity"}
CONSTRAINED_CGROUP_CONF = localcluster.CgroupConf(version=1, constrain_devices=True)

# slurm.conf keys beyond what every local cluster has: Slurm's defaults said out loud, a finished
# job kept 10 minutes for `scontrol show job`, a slurmd that stops answering noticed in 30 s.
TEST_SLURM_CONF = {"SlurmctldDebug": "info", "SlurmdDebug": "info",
                   "SchedulerType": "sched/backfill", "SwitchType": "switch/none",
                   "MinJobAge": "600", "MessageTimeout": "10", "SlurmdTimeout": "30",
                   "InactiveLimit": "0"}


class SlurmCluster:
    def __init__(self, base: Path, nodes: list[tuple[str, str, list[str]]],
                 settings: dict[str, str] | None = None,
                 cgroup_conf: localcluster.CgroupConf | None = None, gres_types: str = "nvshare"):
        """settings: fields of localcluster.LocalCluster that replace the plain ones (proctrack,
        task_plugin, slurm_user, ...); cgroup_conf: the cluster's cgroup.conf, when it has one."""
        self.settings = dict(settings or {})
        self.cgroup_conf = cgroup_conf
        self.gres_types = gres_types
        self.base = base
        self.host = localcluster.short_hostname()
        self.ctld_port = localcluster.free_port()
        self.nodes: dict[str, Node] = {}
        for name, gres, gres_conf in nodes:
            workdir = base / name
            workdir.mkdir(parents=True)
            (base / "spool" / name).mkdir(parents=True)
            self.nodes[name] = Node(name, localcluster.free_port(), gres, gres_conf, workdir)
        self.conf = base / "slurm.conf"
        self.munge_socket = base / "munge" / "munge.sock"
        self.procs: dict[str, subprocess.Popen] = {}
        self.schedulers: dict[str, subprocess.Popen] = {}
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SLURM_", "NVSHARE_", "SBATCH_", "SRUN_"))}
        self.env["SLURM_CONF"] = str(self.conf)

    # ---- configuration -------------------------------------------------------------------------
    def description(self) -> localcluster.LocalCluster:
        """The cluster's Slurm files as nvshare_slurm.node.localcluster writes them: every node on this
        host, three partitions over all of them."""
        names = tuple(self.nodes)
        nodes = tuple(localcluster.Node(n.name, n.port, n.gres, tuple(n.gres_conf), cpus=8,
                                        real_memory=2000, hostname=self.host, one_socket=True)
                      for n in self.nodes.values())
        # Two partitions beside debug, over the same nodes, for share classes (no slurmdbd here,
        # so no QOS): see PRIORITY_CLASSES.
        partitions = (localcluster.Partition("debug", names, default=True, oversubscribe="NO"),
                      localcluster.Partition("prod", names, oversubscribe="NO"),
                      localcluster.Partition("scavenge", names, oversubscribe="NO"))
        return localcluster.LocalCluster(
            name="nvstest", base=self.base, host=self.host, ctld_port=self.ctld_port, nodes=nodes,
            partitions=partitions, gres_types=self.gres_types, per_node_files=True,
            cgroup=self.cgroup_conf, extra=TEST_SLURM_CONF, **self.settings)

    def wrappers(self) -> localcluster.Wrappers:
        # slurmd gives Prolog/Epilog only SLURM_* variables: the wrapper names the node's config
        # and Slurm's config for scontrol. TaskProlog runs as the user; it needs the node's config
        # too. A checkout under test given by PYTHONPATH (a second worktree) is what Slurm runs too.
        pythonpath = os.environ.get("PYTHONPATH")
        return localcluster.Wrappers(
            nvshare_config=f"{self.base}/{{node}}/nvshare.yaml",
            commands={kind: [entry_point("nvshare-" + kind)] for kind in localcluster.ENTRY_POINTS},
            env={"PYTHONPATH": pythonpath} if pythonpath else {})

    def write(self) -> None:
        b = self.base
        for sub in ("state", "jobs", "munge"):
            (b / sub).mkdir(exist_ok=True)
        os.chmod(b / "jobs", 0o1777)
        localcluster.write(self.description(), self.wrappers())
        for node in self.nodes.values():
            # node_name: every node runs on this host, so the host name names none of them.
            config = {"socket": node.socket, "state_dir": str(node.workdir / "state"),
                      "gpus": FAKE_GPUS, "log_level": "debug", "slurm_bin_dir": str(BIN),
                      "node_name": node.name, "priority_classes": PRIORITY_CLASSES}
            config.update(node.settings)
            node.config_path.write_text(yaml.safe_dump(config))
            os.chmod(node.workdir, 0o755)
        os.chmod(b, 0o755)

    # ---- processes -----------------------------------------------------------------------------
    def start(self, schedulers: bool = True) -> SlurmCluster:
        self.write()
        key = self.base / "munge" / "munge.key"
        shutil.copy("/etc/munge/munge.key", key)
        os.chmod(key, 0o600)
        os.chmod(self.base / "munge", 0o700)
        self._spawn("munged", [str(SBIN / "munged"), "-F", "--force",
                               f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--log-file={self.base}/munge/munged.log",
                               f"--pid-file={self.base}/munge/munged.pid",
                               f"--seed-file={self.base}/munge/munged.seed"])
        self._wait_for(lambda: self.munge_socket.exists(), 10, "munged socket")
        os.chmod(self.base / "munge", 0o755)
        for node in self.nodes.values():
            if schedulers:
                self.start_scheduler(node.name)
        self._spawn("slurmctld", [str(SBIN / "slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait_for(lambda: self.scontrol("ping").returncode == 0
                       and "UP" in self.scontrol("ping").stdout, 30, "slurmctld ping")
        for node in self.nodes.values():
            self._spawn(f"slurmd-{node.name}",
                        [str(SBIN / "slurmd"), "-D", "-N", node.name, "-f", str(self.conf)])
        self._wait_for(self._nodes_idle, 60, "nodes idle")
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.base / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def _wait_for(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited {proc.returncode} while waiting for {what}:\n"
                                       f"{self.tail(name)}")
            if cond():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.diagnostics()}")

    def _nodes_idle(self) -> bool:
        out = self.run([BIN / "sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        return all(states.get(n, "").startswith(("idle", "mix", "alloc")) for n in self.nodes)

    def start_scheduler(self, node: str) -> None:
        n = self.nodes[node]
        if os.path.exists(n.socket):
            os.unlink(n.socket)
        env = {k: v for k, v in self.env.items()}
        env["NVSHARE_CONFIG"] = str(n.config_path)
        log = open(n.log_path, "ab")
        proc = subprocess.Popen([sys.executable, "-m", "nvshare_slurm.daemon"], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.schedulers[node] = proc
        deadline = time.monotonic() + 15
        while not os.path.exists(n.socket):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nvshare-scheduler for {node} did not start:\n"
                                   f"{n.log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.05)

    def stop_scheduler(self, node: str) -> None:
        proc = self.schedulers.pop(node, None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop(self) -> None:
        # Cancel what is left so no job process outlives the cluster.
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run([BIN / "scancel", "--full", "-u", "root"], timeout=10)
            time.sleep(1)
        for name in [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for node in list(self.schedulers):
            self.stop_scheduler(node)

    # ---- commands ------------------------------------------------------------------------------
    def run(self, argv, timeout: float = 30, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([str(a) for a in argv], env=env or self.env, capture_output=True,
                                  text=True, timeout=timeout, **kw)
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(exc.cmd, 124, exc.stdout or "", f"timeout: {exc}")

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return self.run([BIN / "scontrol", *args], timeout=15)

    def sbatch(self, script: str, *args: str, cwd: str | None = None, env: dict | None = None) -> int:
        path = Path(tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.base / "jobs")[1])
        path.write_text(script)
        path.chmod(0o755)
        result = self.run([BIN / "sbatch", "--parsable", *args, str(path)],
                          cwd=cwd or str(self.base / "jobs"), env=env)
        if result.returncode != 0:
            raise RuntimeError(f"sbatch failed: {result.stderr}")
        return int(result.stdout.strip().split(";")[0])

    def job_field(self, job_id: int, key: str) -> str:
        out = self.scontrol("show", "job", "-o", str(job_id)).stdout
        for word in out.split():
            if word.startswith(key + "="):
                return word.split("=", 1)[1]
        return ""

    def wait_job(self, job_id: int, timeout: float = 60) -> str:
        """Wait until the job has left the queue and its epilog has run; returns its final state."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job_field(job_id, "JobState")
            if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED"):
                # COMPLETING ends after the epilog; also require no COMPLETING flag.
                return state
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} still {state} after {timeout}s\n{self.diagnostics()}")

    def wait_state(self, job_id: int, states: tuple[str, ...], timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job_field(job_id, "JobState")
            if state in states:
                return state
            time.sleep(0.1)
        raise TimeoutError(f"job {job_id} is {state}, not {states} after {timeout}s\n"
                           f"{self.diagnostics()}")

    def tail(self, name: str, chars: int = 3000) -> str:
        for path in (self.base / f"{name}.log", self.base / f"{name}.out"):
            if path.exists():
                return f"--- {path}\n" + path.read_text(errors="replace")[-chars:]
        return ""

    def diagnostics(self) -> str:
        parts = [self.run([BIN / "sinfo", "-R"]).stdout, self.run([BIN / "squeue"]).stdout,
                 self.run([BIN / "sinfo", "-N", "-o", "%N %T %C %m %e %G"]).stdout,
                 self.run([BIN / "squeue", "-t", "all", "-o", "%i %T %R %N"]).stdout]
        pending = self.run([BIN / "squeue", "-h", "-t", "PD", "-o", "%i"]).stdout.split()
        parts += [self.run([BIN / "scontrol", "show", "job", job]).stdout for job in pending[:3]]
        if pending:
            parts.append(self.run([BIN / "scontrol", "show", "node"]).stdout)
        parts.append(self.tail("slurmctld"))
        parts += [self.tail(f"slurmd-{n}") for n in self.nodes]
        parts += [f"--- {n.log_path}\n" + n.log_path.read_text(errors="replace")[-3000:]
                  for n in self.nodes.values() if n.log_path.exists()]
        return "\n".join(parts)


def need_real_slurm() -> None:
    """Skips the test, saying why, where a real cluster cannot run: not root, or no Slurm/munge."""
    if os.geteuid() != 0:
        pytest.skip("real-Slurm tests need root (slurmd runs jobs as their users)")
    missing = [p for p in ("slurmctld", "slurmd", "munged") if not (SBIN / p).exists()]
    if missing or not Path("/etc/munge/munge.key").exists():
        pytest.skip(f"real-Slurm tests need Slurm and munge installed (missing: "
                    f"{', '.join(missing) or '/etc/munge/munge.key'}); run scripts/install-demo-slurm.sh")


def slurm_version() -> tuple[int, int]:
    """(major, minor) of the Slurm the tests run: `slurmctld -V` says "slurm-wlm 24.11.5" or
    "slurm 22.05.8"."""
    out = subprocess.run([SBIN / "slurmctld", "-V"], capture_output=True, text=True, timeout=30).stdout
    major, minor = out.split()[-1].split(".")[:2]
    return int(major), int(minor)


def cluster_dir(prefix: str) -> Path:
    """A fresh directory for a cluster's files, that jobs of every user can read."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(base, 0o755)
    return base


def remove_cluster_dir(base: Path) -> None:
    if os.environ.get("NVSHARE_KEEP_CLUSTER"):
        print(f"cluster files kept in {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def running(cluster: SlurmCluster,
            before_stop: Callable[[SlurmCluster], None] = lambda c: None) -> Iterator[SlurmCluster]:
    """The cluster started; stopped and its files removed (or kept: NVSHARE_KEEP_CLUSTER) after."""
    try:
        cluster.start()
        yield cluster
    finally:
        before_stop(cluster)
        cluster.stop()
        remove_cluster_dir(cluster.base)


def job_dir(cluster: SlurmCluster, test_name: str) -> Path:
    """A directory under the cluster that every job of the test can write (jobs may run as other
    users)."""
    d = cluster.base / "jobs" / test_name[:40]
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    return d


def job_workdir(cluster: SlurmCluster, test_name: str) -> Iterator[Path]:
    """A workdir fixture's body (`yield from`): the test's job_dir, then root's jobs left queued or
    running are cancelled, so the next test of the module starts on an idle cluster."""
    yield job_dir(cluster, test_name)
    cluster.run([BIN / "scancel", "-u", "root"], timeout=10)


def stand_in_gpu(path: Path, major: int = 1, minor: int = 7) -> str:
    """A GPU's device file for a test: a character device with a live driver (/dev/full's 1:7 by
    default), so an open the device cgroup allows succeeds and one it denies fails with EPERM.
    Name it nvidia<N>, as the driver names a GPU's file: the hook asks the daemon for no other."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        os.mknod(path, 0o20666, os.makedev(major, minor))
    path.chmod(0o666)
    return str(path)


def client(node: Node):
    from nvshare_slurm.wire.client import Client
    return Client(node.socket, timeout=5.0)


def registered_jobs(node: Node) -> dict[int, dict]:
    from nvshare_slurm.wire.proto import C
    return {j["job_id"]: j for j in client(node).status(C.NVSHARE_STATUS_JOBS)["jobs"]}


def wait_until(cond, timeout: float, what: str, diagnostics=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}\n{diagnostics()}")


def read_env(path: Path) -> dict[str, str]:
    """A job's `env -0` output."""
    out = {}
    for item in path.read_bytes().split(b"\0"):
        if b"=" in item:
            key, value = item.split(b"=", 1)
            out[key.decode()] = value.decode(errors="replace")
    return out
