"""A one-node Slurm cluster on this host with an nvshare-scheduler, for scripts that run real jobs
through sbatch and srun (bench/two_gpu_proof.py, bench/interactive_step.py): Slurm installed in / or
unpacked under a root (../shared/tools/gpu-machine-slurm.sh, as scripts/demo.sh uses it),
nvshare-slurm run as `python -m nvshare_slurm.<module>` from the caller's PYTHONPATH. Every wait is
bounded and names what it waited for; a daemon that exits meanwhile is reported with the end of its
output. Also what those scripts share: their checks (Checks) and the tarball of the cluster's logs
(write_logs)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from nvshare_slurm.node import localcluster


class OneNodeSlurm:
    """munged, nvshare-scheduler, slurmctld and slurmd of this host as one node, all in `base`
    (emptied first); `Gres=nvshare:<slots>` count-only; stop() ends what start() started.
    `scheduler` holds nvshare.yaml lines beyond the socket, state dir and Slurm's bin dir; `env`
    goes to every daemon and every sbatch (so also to the jobs)."""

    def __init__(self, base: Path, slurm_root: str, slots: int, scheduler: list[str], env: dict):
        self.base, self.slurm_root, self.slots, self.scheduler = base, slurm_root, slots, scheduler
        self.sbin = Path(slurm_root) / "usr" / "sbin"
        self.bin_dir = Path(shutil.which("sbatch") or "/usr/bin/sbatch").parent
        self.host = localcluster.short_hostname()
        self.conf = self.base / "slurm.conf"
        self.nv_conf = self.base / "nvshare" / "nvshare.yaml"
        self.sched_log = self.base / "nvshare" / "scheduler.log"
        self.jobs = self.base / "jobs"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SLURM_", "NVSHARE_", "SBATCH_", "SRUN_"))}
        self.env.update(env, SLURM_CONF=str(self.conf))
        self.procs: list[subprocess.Popen] = []

    def write(self) -> None:
        stop_leftovers(list(self.base.glob("*.pid")) + [self.base / "munge" / "munged.pid"])
        shutil.rmtree(self.base, ignore_errors=True)
        for sub in ("state", "spool", "jobs", "munge", "nvshare"):
            (self.base / sub).mkdir(parents=True)
        os.chmod(self.base, 0o755)
        os.chmod(self.jobs, 0o1777)
        lines = [f"socket: {self.base}/nvshare/scheduler.sock", f"state_dir: {self.base}/nvshare/state",
                 f"slurm_bin_dir: {self.bin_dir}", *self.scheduler]
        self.nv_conf.write_text("\n".join(lines) + "\n")
        unpacked = self.slurm_root != "/"
        cluster = localcluster.one_node(
            self.base, name="nvsnode", partition="proof", gres=f"nvshare:{self.slots}",
            gres_conf=[f"NodeName={self.host} Name=nvshare Count={self.slots}"],
            cpus=max(8, os.cpu_count() or 8), slurm_root=self.slurm_root if unpacked else None,
            host=self.host, extra={"MinJobAge": "3600"})
        # Slurm may be unpacked and nvshare-slurm is this checkout: the wrappers say where Python
        # and Slurm's libraries are.
        localcluster.write(cluster, localcluster.Wrappers(
            str(self.nv_conf), localcluster.python_commands(sys.executable),
            {"PYTHONPATH": os.environ.get("PYTHONPATH", ""),
             "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")}))

    def start(self) -> None:
        self.write()
        key = self.base / "munge" / "munge.key"
        shutil.copy("/etc/munge/munge.key", key)
        os.chmod(key, 0o600)
        os.chmod(self.base / "munge", 0o700)
        m = self.base / "munge"
        self.spawn("munged", [str(self.sbin / "munged"), "-F", "--force", f"--socket={m}/munge.sock",
                              f"--key-file={key}", f"--log-file={m}/munged.log",
                              f"--pid-file={m}/munged.pid", f"--seed-file={m}/munged.seed"])
        self.wait_for(lambda: (m / "munge.sock").exists(), 10, "munged's socket")
        os.chmod(m, 0o755)
        self.spawn("scheduler", [sys.executable, "-m", "nvshare_slurm.daemon"],
                   extra={"NVSHARE_CONFIG": str(self.nv_conf)}, log=self.sched_log)
        self.wait_for(lambda: (self.base / "nvshare" / "scheduler.sock").exists(), 30,
                      "nvshare-scheduler's socket")
        self.spawn("slurmctld", [str(self.sbin / "slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self.wait_for(lambda: "UP" in self.run("scontrol", "ping").stdout, 30, "slurmctld")
        stepd = ["-d", str(self.sbin / "slurmstepd")] if self.slurm_root != "/" else []
        self.spawn("slurmd", [str(self.sbin / "slurmd"), "-D", "-N", self.host, "-f", str(self.conf),
                              *stepd])
        self.wait_for(lambda: self.run("sinfo", "-h", "-o", "%t").stdout.strip() == "idle", 60,
                      "the node to be idle")

    def spawn(self, name: str, argv: list[str], extra: dict | None = None,
              log: Path | None = None) -> None:
        log = log or self.base / f"{name}.out"
        with open(log, "ab") as out:     # the daemon has its own copy of the descriptor
            proc = subprocess.Popen(argv, env={**self.env, **(extra or {})}, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        proc.name, proc.log = name, log
        self.procs.append(proc)

    def wait_for(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited {dead[0].returncode} while waiting for "
                                   f"{what}: {tail(dead[0].log)}")
            if cond():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")

    def run(self, cmd: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([str(self.bin_dir / cmd), *args], env=self.env, text=True,
                                  capture_output=True, timeout=timeout, cwd=self.jobs)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(cmd, 124, "", f"{cmd} timed out")

    def job_state(self, job: str) -> dict:
        """`scontrol show job -o`'s fields of a job ({} once Slurm has forgotten it)."""
        out = self.run("scontrol", "show", "job", "-o", job).stdout
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def stop(self) -> None:
        if self.procs:
            self.run("scancel", "--full", "-u", "root", timeout=10)
            time.sleep(1)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()


# What a pid file of an earlier run may name; a pid reused since by anything else is left alone.
LEFTOVER_DAEMONS = {"slurmctld", "slurmd", "munged", "slurmstepd"}


def stop_leftovers(pidfiles) -> None:
    """A run killed hard may have left its daemons: stop those its pid files name, if each pid is
    still one of them."""
    for pidfile in pidfiles:
        try:
            pid = int(pidfile.read_text().split()[0])
            if Path(f"/proc/{pid}/comm").read_text().strip() in LEFTOVER_DAEMONS:
                os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError, IndexError):
            pass


def tail(path: Path, n: int = 2000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else f"({path} missing)"


class Checks:
    """A proof script's checks: each printed as it is made, kept as rows for its report (ok None:
    skipped, with why)."""

    def __init__(self):
        self.rows: list[dict] = []

    def __call__(self, part: str, name: str, ok, detail: str = "") -> bool:
        self.rows.append({"part": part, "check": name, "ok": bool(ok), "detail": detail})
        print(f"  {'PASS' if ok else 'FAIL'}  ({part}) {name}{': ' + detail if detail else ''}", flush=True)
        return bool(ok)

    def skip(self, part: str, name: str, why: str) -> None:
        self.rows.append({"part": part, "check": name, "ok": None, "detail": why})
        print(f"  SKIP  ({part}) {name}: {why}", flush=True)


def write_logs(base: Path, out: Path) -> None:
    """The cluster folder's files into the tarball `out`: slurm.conf, nvshare.yaml, the daemons'
    logs, the jobs' output; not sockets, keys, Slurm's state and spool, or the jobs' caches."""
    with tarfile.open(out, "w:gz") as tar:
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(base)
            if path.is_file() and path.suffix not in (".sock", ".key", ".seed") \
                    and rel.parts[0] not in ("state", "spool") and ".cache" not in rel.parts:
                tar.add(path, arcname=str(rel))
