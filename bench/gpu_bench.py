"""GPU benchmark harness (issue 5): workloads x arms, side by side in one run on the GPU machine.

Workloads (tests/gpu/train.py, fixed seeds, batches drawn on the GPU):
  W1  compute-bound transformer training, GPU saturated
  W2  bursty: the same model on small batches with host think time, GPU busy about 30 %
  W3  two trainings that each hold about 60 % of GPU memory, so they cannot both fit
Each workload is calibrated first (one short solo run): its step count is set so that one job alone
trains for --train-seconds (W3: --w3-train-seconds), and W2's sleep so that the GPU is busy
--busy-fraction of the time. Every arm then runs the same two jobs (seeds 1 and 2):
  serial              one job, then the other, no hook
  colocate            both at once, no hook
  mps                 both at once under NVIDIA MPS (a private nvidia-cuda-mps-control)
  nvshare-auto|concurrent|serial
                      both at once under libnvshare.so and a real nvshare-scheduler (NVML
                      inventory, debug log) in that scheduling mode, every other setting default
Solo: one job alone without and with the hook, alternating (A B A B ...) after the calibration run.

  python3 bench/gpu_bench.py --out DIR [--workloads W1,W2,W3] [--arms serial,...] [--solo W1|'']
                             [--time-budget SECONDS] [--resume RESULTS_JSON] [--launch-result FILE]
  python3 bench/gpu_bench.py --report DIR [DIR ...]

DIR/results.json is rewritten after every arm, so a run cut short keeps what it measured; units that
do not fit --time-budget are listed as pending and run by a later call with --resume. Job logs go to
DIR/logs/, figures to DIR/*.png. --report merges the results of one or more runs, puts the figures
under docs/bench-results/ and rewrites the "## GPU" section of docs/benchmarks.md (the other
sections stay). --smoke-cpu runs the whole harness on the CPU with tiny jobs (no GPU, no MPS), to
check it where there is no GPU; its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "tests" / "gpu" / "train.py"
# train.py's options for a tiny model on the CPU (smoke runs), after the workload's: later ones win
CPU_TRAIN_ARGS = ["--device", "cpu", "--width", "64", "--heads", "4", "--seq", "16", "--depth", "2",
                  "--batch", "4"]
DOCS = REPO / "docs" / "benchmarks.md"
FIGURES = REPO / "docs" / "bench-results"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from docsection import replace_section  # noqa: E402  (bench/, beside this script)


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    args: tuple[str, ...]           # model and batch; steps and sleep come from calibration
    bursty: bool = False
    mem_fraction: float = 0.0       # ballast per job, as a fraction of the GPU's memory
    grow_fraction: float = 0.0      # grown over the first GROW_STEPS steps, as a fraction


TRANSFORMER = ("--model", "transformer", "--width", "1024", "--heads", "16", "--seq", "256")
WORKLOADS = {
    "W1": Workload("W1", "compute-bound transformer training (GPU saturated)",
                   TRANSFORMER + ("--depth", "8", "--batch", "32")),
    "W2": Workload("W2", "bursty: small batches with host think time (GPU busy ~30 %)",
                   TRANSFORMER + ("--depth", "8", "--batch", "8"), bursty=True),
    "W3": Workload("W3", "two trainings of ~60 % of GPU memory each (they cannot both fit)",
                   TRANSFORMER + ("--depth", "4", "--batch", "16"), mem_fraction=0.6),
    # issue 39's swap pair of PyTorch jobs: 48 % of the GPU at start and 5 % more grown in 30
    # pieces over the first steps (a caching allocator warming up), so the pair does not fit
    "W3g": Workload("W3g", "two trainings of ~53 % of GPU memory each, 5 % of it grown in 30 steps",
                    TRANSFORMER + ("--depth", "4", "--batch", "16"), mem_fraction=0.48,
                    grow_fraction=0.05),
    "W4": Workload("W4", "bursty with short steps and short host pauses (GPU busy ~30 %)",
                   TRANSFORMER + ("--depth", "2", "--batch", "2"), bursty=True),
}
ARMS = ["serial", "colocate", "mps", "nvshare-auto", "nvshare-concurrent", "nvshare-serial"]
# From issue 5: the training-phase ratio of the pair to serial that nvshare should reach (W3: makespan).
GROW_STEPS = 30
TARGETS = {"W1": ("train", 0.98), "W2": ("train", 0.55), "W3": ("makespan", 1.05),
           "W3g": ("makespan", 1.10),   # issue 39: 8 s jobs within 1.10, 40 s and longer 1.03
           "W4": ("train", "best")}   # issue 12: at most 1.05 x the better of colocate and MPS
CALIBRATION_STEPS = 25
SEEDS = (1, 2)


def log(msg: str) -> None:
    print(f"gpu_bench: {msg}", flush=True)


PROBE_SLACK_MS = 1.0   # issue 42: an interactive step's p99 within this of its p99 alone


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def spread(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "max": max(values), "mean": statistics.fmean(values)}


# --- the GPU and its utilisation ------------------------------------------------------------------

def gpu_info(smoke: bool) -> dict:
    if smoke:
        return {"name": "CPU smoke test (no GPU)", "memory": 2 << 30, "free": 2 << 30,
                "driver": "-", "uuid": "GPU-fa4e0000-0000-0000-0000-000000000000", "smoke": True}
    import pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)

    def text(value):
        return value.decode() if isinstance(value, bytes) else value
    return {"name": text(pynvml.nvmlDeviceGetName(handle)), "memory": mem.total, "free": mem.free,
            "driver": text(pynvml.nvmlSystemGetDriverVersion()),
            "uuid": text(pynvml.nvmlDeviceGetUUID(handle)), "count": pynvml.nvmlDeviceGetCount()}


class UtilSampler(threading.Thread):
    """NVML utilisation of GPU 0 every 100 ms, for per-arm means."""

    def __init__(self, smoke: bool):
        super().__init__(daemon=True)
        self.smoke = smoke
        self.samples: list[tuple[float, int]] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        if self.smoke:
            return
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        while not self.stop_flag.is_set():
            try:
                self.samples.append((time.time(), pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            except pynvml.NVMLError:
                pass
            time.sleep(0.1)

    def mean(self, t0: float, t1: float) -> float | None:
        values = [u for t, u in self.samples if t0 <= t <= t1]
        return statistics.fmean(values) if values else None


# --- running jobs -----------------------------------------------------------------------------------

def clean_env(also_drop: tuple[str, ...] = ()) -> dict:
    """This environment without nvshare, MPS or preload settings of ours (and also_drop's prefixes),
    so none leaks into a job."""
    drop = ("NVSHARE_", "CUDA_MPS_", "LD_PRELOAD", *also_drop)
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Job:
    """One train.py process, its output in files (no pipe to fill up)."""

    def __init__(self, name: str, cmd: list[str], env: dict, logdir: Path):
        self.name = name
        self.cmd = cmd
        self.env = env
        self.out_path = logdir / f"{name}.out"
        self.err_path = logdir / f"{name}.err"
        self.proc: subprocess.Popen | None = None
        self.start = self.end = 0.0
        self.timed_out = False

    def launch(self) -> None:
        self.start = time.time()
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, cwd=str(REPO))

    def wait(self, deadline: float) -> None:
        assert self.proc is not None
        try:
            self.proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.proc.kill()
            self.proc.wait()
        self.end = time.time()

    def result(self) -> dict:
        assert self.proc is not None
        err = self.err_path.read_text(errors="replace")
        res: dict = {"name": self.name, "rc": self.proc.returncode, "proc_start": self.start,
                     "proc_end": self.end}
        lines = self.out_path.read_text(errors="replace").strip().splitlines()
        if self.proc.returncode == 0 and lines:
            try:
                res.update(json.loads(lines[-1]))
                res["status"] = "ok"
                return res
            except json.JSONDecodeError:
                pass
        if self.timed_out:
            res["status"] = "timeout"
        elif "out of memory" in err.lower():
            res["status"] = "oom"
        else:
            res["status"] = "failed"
        res["error"] = err[-2000:]
        return res


def run_jobs(jobs: list[Job], together: bool, timeout: float) -> list[dict]:
    deadline = time.time() + timeout
    try:
        if together:
            for job in jobs:
                job.launch()
            for job in jobs:
                job.wait(deadline)
        else:
            for job in jobs:
                job.launch()
                job.wait(deadline)
    finally:  # interrupted (SIGTERM from timeout): leave no job running on the GPU
        kill_running(jobs)
    return [job.result() for job in jobs]


def kill_running(jobs: list[Job]) -> None:
    for job in jobs:
        if job.proc is not None and job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait()


def train_phase(res: dict) -> float:
    return res["times"][-1] - res["step_starts"][0]


# --- nvshare-scheduler and MPS ------------------------------------------------------------------

def run_daemon_with_us_timestamps() -> int:
    """The daemon as installed, its log timestamps in microseconds (hand-overs take well under 1 ms)."""
    import logging

    def format_time(self, record, datefmt=None):
        return datetime.datetime.fromtimestamp(record.created).strftime("%Y-%m-%d %H:%M:%S.%f")
    logging.Formatter.formatTime = format_time  # type: ignore[method-assign]
    from nvshare_slurm import daemon
    return daemon.main([])


class SchedulerProcess:
    """The process of a real nvshare-scheduler, its output in log_path; start() returns once it
    listens on self.socket (or raises with the end of its log), stop() ends it."""

    socket: str

    def start(self, argv: list[str], env: dict, log_path: Path) -> None:
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=str(REPO))
        deadline = time.time() + 20
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError("nvshare-scheduler did not start: "
                                   + log_path.read_text(errors="replace")[-1500:])
            time.sleep(0.05)

    def stop(self) -> None:
        if self.log.closed:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Scheduler(SchedulerProcess):
    """A real nvshare-scheduler with its own socket, state and debug log."""

    def __init__(self, mode: str, workdir: Path, log_path: Path, gpus_yaml: list | None,
                 extra: dict | None = None, daemon_env: dict | None = None):
        """extra: more settings for nvshare.yaml (bench_family.py's corun arm sets auto_share);
        daemon_env: the daemon's own environment beside ours (bench_soak.py's fake NVML)."""
        import yaml
        workdir.mkdir(parents=True, exist_ok=True)
        self.socket = str(workdir / "s.sock")
        self.settings = {"socket": self.socket, "state_dir": str(workdir / "state"),
                         "scheduling_mode": mode, "log_level": "debug"}
        if gpus_yaml:
            self.settings["gpus"] = gpus_yaml
        self.settings.update(extra or {})
        (workdir / "nvshare.yaml").write_text(yaml.safe_dump(self.settings))
        env = clean_env()
        env["NVSHARE_CONFIG"] = str(workdir / "nvshare.yaml")
        env.update(daemon_env or {})
        self.start([sys.executable, str(Path(__file__).resolve()), "--run-daemon"], env, log_path)
        from nvshare_slurm.wire.client import Client
        self.client = Client(self.socket)
        self.next_job = 500

    def job_env(self, base: dict, share_class: str = "normal", uid: int | None = None,
                name: str = "bench") -> tuple[int, dict]:
        """A job registered (of `uid`, as user u<uid>, else ours) and its processes' environment."""
        from nvshare_slurm import libnvshare_path
        self.next_job += 1
        place = self.client.register_job(self.next_job, uid=os.getuid() if uid is None else uid,
                                         gid=os.getgid() if uid is None else uid, slots=1,
                                         name=f"{name}{self.next_job}",
                                         user="root" if uid is None else f"u{uid}",
                                         share_class=share_class,
                                         class_reason="bench" if share_class != "normal" else "")
        env = dict(base)
        env.update(LD_PRELOAD=str(libnvshare_path()), NVSHARE_SOCKET=self.socket,
                   NVSHARE_JOB_ID=str(self.next_job), NVSHARE_MANAGED_GPUS=",".join(place["gpu_uuid"]),
                   CUDA_VISIBLE_DEVICES=",".join(place["gpu_uuid"]), SLURM_STEP_ID="0")
        return self.next_job, env


class Mps:
    """A private MPS control daemon (its own pipe and log directories)."""

    def __init__(self, workdir: Path):
        self.env = clean_env()
        self.env.update(CUDA_MPS_PIPE_DIRECTORY=str(workdir / "mps-pipe"),
                        CUDA_MPS_LOG_DIRECTORY=str(workdir / "mps-log"))
        for d in ("mps-pipe", "mps-log"):
            (workdir / d).mkdir(parents=True, exist_ok=True)
        self.log_dir = workdir / "mps-log"
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=self.env, check=True, timeout=30,
                       capture_output=True)
        time.sleep(1)

    def client_env(self, base: dict) -> dict:
        return dict(base, **{k: v for k, v in self.env.items() if k.startswith("CUDA_MPS")})

    def stop(self) -> None:
        try:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=self.env,
                           timeout=20, capture_output=True)
        except subprocess.TimeoutExpired:
            log("MPS control did not quit within 20 s")
        for _ in range(100):  # the server exits after the control daemon; the next arm needs the GPU
            if subprocess.run(["pgrep", "-x", "nvidia-cuda-mps-server"], capture_output=True).returncode:
                break
            time.sleep(0.1)


# --- the scheduler's log: who held the GPU when, hand-over latency ------------------------------

LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[,.](\d+) nvshare-scheduler: (?:gpu (\S+): )?"
                      r"job (\d+) step (\d+) pid (\d+): (.*)$")


def log_time(stamp: str, frac: str) -> float:
    """A log line's time: "YYYY-mm-dd HH:MM:SS" and its fraction's digits (milli- or microseconds)."""
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp() + int(frac) / 10 ** len(frac)


def job_log_lines(text: str) -> list[tuple[float, int, int, str]]:
    """(time, job, pid, what) of each of the scheduler's lines about a job's process."""
    lines = []
    for line in text.splitlines():
        m = LOG_LINE.match(line)
        if m:
            stamp, frac, _gpu, job, _step, pid, what = m.groups()
            lines.append((log_time(stamp, frac), int(job), int(pid), what))
    return lines


def parse_scheduler_log(text: str) -> list[tuple[float, int, int, str]]:
    """(time, job, pid, event) with event one of grant, release, ask, gone."""
    events = []
    for t, job, pid, what in job_log_lines(text):
        if what.startswith("lock granted"):
            kind = "grant"
        elif what.startswith("lock released"):
            kind = "release"
        elif what.startswith(("lock dropped", "others wait")):
            kind = "ask"
        elif what.startswith("client disconnected"):
            kind = "gone"
        else:
            continue
        events.append((t, job, pid, kind))
    return events


def lock_analysis(events: list[tuple[float, int, int, str]]) -> dict:
    """Holding intervals per job; hand-over = a release that left the GPU free -> the next grant to
    another process; yield = the daemon asking a holder to give the lock up -> its release."""
    holding: dict[int, tuple[float, int]] = {}   # pid -> (since, job)
    asked: dict[int, float] = {}
    intervals: dict[int, list[list[float]]] = {}
    handover, yields = [], []
    freed: tuple[float, int] | None = None       # (when, by pid) the GPU last became free
    for t, job, pid, kind in events:
        if kind == "grant":
            if not holding and freed is not None and freed[1] != pid:
                handover.append((t - freed[0]) * 1000)
            freed = None
            holding[pid] = (t, job)
        elif kind == "ask":
            asked.setdefault(pid, t)
        elif kind in ("release", "gone") and pid in holding:
            since, holder_job = holding.pop(pid)
            intervals.setdefault(holder_job, []).append([since, t])
            if kind == "release" and pid in asked:
                yields.append((t - asked[pid]) * 1000)
            asked.pop(pid, None)
            if not holding and kind == "release":
                freed = (t, pid)
    return {"intervals": intervals, "handover_ms": spread(handover), "yield_ms": spread(yields),
            "turns": sum(len(v) for v in intervals.values())}


SWAP_LINE = re.compile(r"swapped (out|in) ([\d.]+) MiB in ([\d.]+) ms \(([\d.]+) GB/s\)")


def swap_stats(stderr: str) -> dict:
    out = {}
    for direction in ("out", "in"):
        moves = [(float(mib), float(ms), float(gbs)) for d, mib, ms, gbs in SWAP_LINE.findall(stderr)
                 if d == direction]
        out[direction] = {"count": len(moves), "GiB": sum(m[0] for m in moves) / 1024,
                          "seconds": sum(m[1] for m in moves) / 1000,
                          "GBps_median": statistics.median([m[2] for m in moves]) if moves else None}
    return out


# --- calibration, solo, arms --------------------------------------------------------------------

class Harness:
    """One call of a benchmark (this one, bench_family.py): DIR/results.json rewritten after every
    unit, job logs in DIR/logs/, a scratch directory, and --time-budget counted from the start."""

    def __init__(self, args: argparse.Namespace, out: Path, results: dict, scratch_prefix: str):
        self.args = args
        self.out = out
        self.results = results
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix=scratch_prefix))
        self.smoke = args.smoke_cpu
        self.t_start = time.time()

    def left(self) -> float:
        if not self.args.time_budget:
            return float("inf")
        return self.args.time_budget - (time.time() - self.t_start)

    def save(self) -> None:
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1))
        tmp.replace(self.out / "results.json")

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def start_results(args: argparse.Namespace, fresh) -> dict:
    """--resume's results, or fresh(); with the --launch-result file's numbers."""
    if args.resume:
        results = json.loads(Path(args.resume).read_text())
        results["resumed"] = True
    else:
        results = fresh()
    if args.launch_result:
        results["launch"] = parse_launch(Path(args.launch_result))
    return results


def merged_report(args: argparse.Namespace, merge) -> tuple[dict, list[Path]]:
    """--report DIR ...: merge(their results.json files), with --launch-result's numbers if given."""
    dirs = [Path(d) for d in args.report]
    results = merge([d / "results.json" for d in dirs])
    if args.launch_result:
        results["launch"] = parse_launch(Path(args.launch_result)) or results.get("launch")
    return results, dirs


def sigterm_interrupts() -> None:
    """`timeout` ends a run with SIGTERM: raise KeyboardInterrupt instead, so that the run's
    `finally` leaves no job on the GPU and saves what was measured."""
    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)


class Bench(Harness):
    def __init__(self, args: argparse.Namespace, out: Path, results: dict):
        super().__init__(args, out, results, "nvbench-")
        self.info = results["gpu"]
        self.sampler = UtilSampler(self.smoke)
        self.sampler.start()
        self.gpus_yaml = ([{"uuid": self.info["uuid"], "memory": "16G"}] if self.smoke else None)
        self.reserve_percent = getattr(args, "memory_reserve_percent", 0)
        self.extra = {"memory_reserve_percent": self.reserve_percent} if self.reserve_percent \
            else None

    def fits(self, unit: str, estimate: float) -> bool:
        if estimate + 10 <= self.left():
            return True
        log(f"{unit}: about {estimate:.0f} s, {self.left():.0f} s of the time budget left: not run now")
        if unit not in self.results["pending"]:
            self.results["pending"].append(unit)
        self.save()
        return False

    def train_cmd(self, wl: Workload, steps: int, seed: int, sleep_ms: float = 0.0) -> list[str]:
        cmd = [sys.executable, str(TRAIN), *wl.args, "--steps", str(steps), "--seed", str(seed)]
        if wl.mem_fraction:
            cmd += ["--mem-gb", f"{self.ballast_gb(wl):.2f}"]
        if wl.grow_fraction:
            grow = wl.grow_fraction * (16 << 30 if self.smoke else self.sized_memory()) / (1 << 30)
            cmd += ["--grow-gb", f"{grow:.2f}", "--grow-steps", str(GROW_STEPS)]
        if sleep_ms:
            cmd += ["--sleep-ms", f"{sleep_ms:.2f}"]
        if self.smoke:  # later options win: a tiny model on the CPU
            cmd += CPU_TRAIN_ARGS
        return cmd

    def ballast_gb(self, wl: Workload) -> float:
        if self.smoke:
            return 0.25
        return wl.mem_fraction * self.sized_memory() / (1 << 30)

    def sized_memory(self) -> float:
        """The memory the workloads are sized to: the GPU's, or with --memory-reserve-percent that
        of a GPU whose usable 95 % is what the daemon leaves usable here (46 on an H200: an
        H100's 80 GB)."""
        return self.info["memory"] * (100 - self.reserve_percent) / 95 if self.reserve_percent \
            else self.info["memory"]

    def base_env(self) -> dict:
        env = clean_env()
        if not self.smoke:
            env["CUDA_VISIBLE_DEVICES"] = self.info["uuid"]
        return env

    def calibrate(self, wl: Workload) -> dict:
        if wl.name in self.results["calibration"]:
            return self.results["calibration"][wl.name]
        job = Job(f"{wl.name}-calibration", self.train_cmd(wl, CALIBRATION_STEPS, SEEDS[0]),
                  self.base_env(), self.logs)
        res = run_jobs([job], together=False, timeout=240)[0]
        if res["status"] != "ok":
            raise RuntimeError(f"{wl.name} calibration run failed ({res['status']}): "
                               f"{res.get('error', '')}")
        durations = [e - s for s, e in zip(res["step_starts"], res["times"], strict=True)][3:]
        step_s = statistics.median(durations)
        target = self.args.w3_train_seconds if wl.mem_fraction else self.args.train_seconds
        sleep_s = step_s * (1 - self.args.busy_fraction) / self.args.busy_fraction if wl.bursty else 0.0
        steps = max(20, min(20000, round(target / (step_s + sleep_s))))
        cal = {"step_ms": step_s * 1000, "sleep_ms": sleep_s * 1000, "steps": steps,
               "startup_s": res["step_starts"][0] - res["proc_start"],
               "expected_train_s": steps * (step_s + sleep_s), "args": list(wl.args),
               "ballast_gb": self.ballast_gb(wl) if wl.mem_fraction else 0.0}
        self.results["calibration"][wl.name] = cal
        self.save()
        log(f"{wl.name} calibrated: {cal['step_ms']:.1f} ms per step, sleep {cal['sleep_ms']:.1f} ms, "
            f"{steps} steps (~{cal['expected_train_s']:.0f} s alone), startup {cal['startup_s']:.1f} s")
        return cal

    def estimate(self, wl: Workload, arm: str, cal: dict) -> float:
        one = cal["startup_s"] + cal["expected_train_s"] + 1
        busy = cal["step_ms"] / (cal["step_ms"] + cal["sleep_ms"])
        pair = cal["startup_s"] + cal["expected_train_s"] * max(1.0, 2 * busy) * 1.15 + 2
        if arm in ("serial", "nvshare-serial"):
            est = 2 * one
        elif wl.mem_fraction and arm in ("colocate", "mps"):
            est = one                                       # the second job cannot allocate
        elif wl.mem_fraction:
            est = 2 * one + 4 * cal["ballast_gb"] / 10       # turns plus swaps at >= 10 GB/s
        else:
            est = pair
        return est + (4 if arm == "mps" else 0)

    def solo(self, wl: Workload) -> None:
        if wl.name in self.results["solo"]:
            return
        cal = self.calibrate(wl)
        steps = max(20, round(self.args.solo_train_seconds / (cal["step_ms"] / 1000)))
        rounds = self.args.solo_rounds
        estimate = 2 * rounds * (cal["startup_s"] + steps * cal["step_ms"] / 1000 + 1)
        if not self.fits(f"solo/{wl.name}", estimate):
            return
        log(f"solo {wl.name}: {rounds} x (no hook, hook), {steps} steps each")
        sched = None
        runs = []
        try:
            sched = Scheduler("auto", self.work / f"solo-{wl.name}",
                              self.logs / f"solo-{wl.name}-scheduler.log", self.gpus_yaml, self.extra)
            for r in range(rounds):
                for hooked in (False, True):  # A B A B: drift falls on both sides alike
                    env = sched.job_env(self.base_env())[1] if hooked else self.base_env()
                    name = f"solo-{wl.name}-{r}-{'hook' if hooked else 'plain'}"
                    res = run_jobs([Job(name, self.train_cmd(wl, steps, SEEDS[0]), env, self.logs)],
                                   together=False, timeout=estimate + 120)[0]
                    if res["status"] != "ok":
                        raise RuntimeError(f"{name}: {res['status']}: {res.get('error', '')[-800:]}")
                    runs.append({"hooked": hooked, "train_s": train_phase(res),
                                 "makespan_s": res["proc_end"] - res["proc_start"],
                                 "losses": res["losses"]})
        except Exception as exc:  # noqa: BLE001 - a failed unit is a result, not the end of the run
            self.results["solo"][wl.name] = {"status": "failed", "error": str(exc)[-2000:]}
            self.save()
            log(f"solo {wl.name} failed: {str(exc)[:300]}")
            return
        finally:
            if sched is not None:
                sched.stop()
        plain = [r for r in runs if not r["hooked"]]
        hooked = [r for r in runs if r["hooked"]]
        solo = {"status": "ok", "steps": steps, "rounds": rounds,
                "runs": [{k: v for k, v in r.items() if k != "losses"} for r in runs],
                "ratio_train": statistics.median(h["train_s"] / p["train_s"]
                                                 for p, h in zip(plain, hooked, strict=True)),
                "ratio_makespan": statistics.median(h["makespan_s"] / p["makespan_s"]
                                                    for p, h in zip(plain, hooked, strict=True)),
                "ratio_of_medians_train": statistics.median(h["train_s"] for h in hooked)
                / statistics.median(p["train_s"] for p in plain),
                "losses_identical": all(r["losses"] == runs[0]["losses"] for r in runs)}
        self.results["solo"][wl.name] = solo
        self.save()
        log(f"solo {wl.name}: hook/no hook training phase x{solo['ratio_train']:.4f}, makespan "
            f"x{solo['ratio_makespan']:.4f}, losses identical: {solo['losses_identical']}")

    def arm(self, wl: Workload, arm: str) -> None:
        done = self.results["workloads"].setdefault(wl.name, {})
        if arm in done:
            return
        cal = self.calibrate(wl)
        estimate = self.estimate(wl, arm, cal)
        unit = f"{wl.name}/{arm}"
        if not self.fits(unit, estimate):
            return
        timeout = 2 * estimate + 45
        log(f"{unit}: running (about {estimate:.0f} s, at most {timeout:.0f} s)")
        base = self.base_env()
        cmds = [self.train_cmd(wl, cal["steps"], seed, cal["sleep_ms"]) for seed in SEEDS]
        names = [f"{wl.name}-{arm}-job{i}" for i in range(len(SEEDS))]
        extra: dict = {}
        sched = mps = None
        t0 = time.time()
        try:
            if arm in ("serial", "colocate"):
                jobs = [Job(n, c, base, self.logs) for n, c in zip(names, cmds, strict=True)]
            elif arm == "mps":
                if self.smoke:
                    raise RuntimeError("no MPS without a GPU")
                mps = Mps(self.work / f"mps-{wl.name}")
                jobs = [Job(n, c, mps.client_env(base), self.logs) for n, c in zip(names, cmds, strict=True)]
            else:
                mode = arm.split("-", 1)[1]
                sched = Scheduler(mode, self.work / f"{wl.name}-{arm}",
                                  self.logs / f"{wl.name}-{arm}-scheduler.log", self.gpus_yaml,
                                  self.extra)
                jobs = []
                for n, c in zip(names, cmds, strict=True):
                    job_id, env = sched.job_env(base)
                    if wl.mem_fraction:
                        env["NVSHARE_LOG_LEVEL"] = "debug"   # the hook logs each swap with its rate
                    jobs.append(Job(n, c, env, self.logs))
                    extra.setdefault("job_ids", []).append(job_id)
                extra["scheduler"] = {k: v for k, v in sched.settings.items() if k in ("scheduling_mode",)}
            results = run_jobs(jobs, together=arm != "serial", timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - a failed arm is a result, not the end of the run
            if isinstance(exc, subprocess.CalledProcessError):
                exc = RuntimeError(f"{exc}: {exc.stderr or exc.stdout}")
            done[arm] = {"status": "failed", "error": str(exc)[-2000:], "makespan": time.time() - t0}
            self.save()
            log(f"{unit}: failed to run: {str(exc)[:300]}")
            return
        finally:
            if sched is not None:
                sched.stop()
            if mps is not None:
                mps.stop()
        res = self.summarize(wl, arm, results)
        res.update(extra)
        if sched is not None:
            lock = lock_analysis(parse_scheduler_log(sched.log_path.read_text(errors="replace")))
            by_job = {job_id: i for i, job_id in enumerate(extra.get("job_ids", []))}
            res["lock"] = {"handover_ms": lock["handover_ms"], "yield_ms": lock["yield_ms"],
                           "turns": lock["turns"]}
            res["lock_intervals"] = {str(by_job.get(j, j)): [[s - res["t0"], e - res["t0"]] for s, e in iv]
                                     for j, iv in lock["intervals"].items()}
            if wl.mem_fraction:
                res["swap"] = [swap_stats(Path(j.err_path).read_text(errors="replace")) for j in jobs]
        done[arm] = res
        self.save()
        log(f"{unit}: {res['status']}, makespan {res['makespan']:.1f} s"
            + (f", training phase {res['train_phase']:.1f} s" if "train_phase" in res else "")
            + (f", GPU util {res['gpu_util']:.0f} %" if res.get("gpu_util") is not None else ""))

    def summarize(self, wl: Workload, arm: str, jobs: list[dict]) -> dict:
        t0 = min(j["proc_start"] for j in jobs)
        t1 = max(j["proc_end"] for j in jobs)
        statuses = [j["status"] for j in jobs]
        status = "ok" if all(s == "ok" for s in statuses) else next(
            s for s in ("oom", "timeout", "failed") if s in statuses)
        res: dict = {"status": status, "t0": t0, "makespan": t1 - t0, "gpu_util": self.sampler.mean(t0, t1),
                     "jobs": []}
        for j in jobs:
            entry = {"status": j["status"], "proc": [j["proc_start"] - t0, j["proc_end"] - t0]}
            if j["status"] == "ok":
                entry.update(train_s=train_phase(j), steps=len(j["times"]),
                             steps_per_s=len(j["times"]) / train_phase(j),
                             busy_fraction=j.get("busy_fraction"), ballast_ok=j.get("ballast_ok"),
                             loss_last=j["losses"][-1], losses=j["losses"],
                             steps_spans=[[round(s - t0, 4), round(e - t0, 4)]
                                          for s, e in zip(j["step_starts"], j["times"], strict=True)])
            else:
                entry["error"] = j.get("error", "")[-600:]
            res["jobs"].append(entry)
        ok = [j for j in jobs if j["status"] == "ok"]
        if status == "ok":
            if arm == "serial":  # the pair's training, back to back, without the second startup
                res["train_phase"] = sum(train_phase(j) for j in jobs)
            else:
                res["train_phase"] = max(j["times"][-1] for j in ok) - min(j["step_starts"][0] for j in ok)
        serial = self.results["workloads"].get(wl.name, {}).get("serial")
        if arm != "serial" and serial and serial.get("status") == "ok" and ok:
            res["losses_match_serial"] = all(
                a.get("losses") == b.get("losses") for a, b in zip(res["jobs"], serial["jobs"], strict=True)
                if a["status"] == "ok")
        return res

    def close(self) -> None:
        self.sampler.stop_flag.set()
        super().close()


def relative(results: dict) -> None:
    """Ratios to the serial arm of the same workload, computed once everything is in; units
    measured since they were left pending are no longer pending."""
    done = {f"{w}/{a}" for w, arms in results["workloads"].items() for a in arms}
    done |= {f"solo/{w}" for w in results.get("solo", {})}
    done |= {f"calibration/{w}" for w in results.get("calibration", {})}
    results["pending"] = [u for u in results.get("pending", []) if u not in done]
    for arms in results["workloads"].values():
        serial = arms.get("serial")
        for res in arms.values():
            if not (serial and serial.get("status") == "ok" and res.get("status") == "ok"):
                continue
            res["makespan_vs_serial"] = res["makespan"] / serial["makespan"]
            res["train_vs_serial"] = res["train_phase"] / serial["train_phase"]
            res["throughput_vs_serial"] = serial["train_phase"] / res["train_phase"]


# --- figures ------------------------------------------------------------------------------------

def plots(results: dict, out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []
    colors = ["#1f77b4", "#ff7f0e"]
    for wname, arms in results["workloads"].items():
        if not arms:
            continue
        names = [a for a in ARMS if a in arms]
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        x = range(len(names))
        ok = [arms[a].get("status") == "ok" for a in names]
        axes[0].bar([i - 0.2 for i in x],
                    [arms[a]["makespan"] if o else 0 for a, o in zip(names, ok, strict=True)], 0.4,
                    label="makespan", color="#3a7")
        axes[0].bar([i + 0.2 for i in x],
                    [arms[a].get("train_phase", 0) if o else 0 for a, o in zip(names, ok, strict=True)],
                    0.4, label="training phase", color="#8c8")
        for i, (a, o) in enumerate(zip(names, ok, strict=True)):
            if not o:
                axes[0].text(i, 0.5, arms[a].get("status", "?").upper(), ha="center", va="bottom",
                             rotation=90, fontsize=9, color="#a00")
        axes[0].set_ylabel("seconds")
        axes[0].legend(fontsize=7)
        axes[0].set_title("makespan and training phase")
        thr = [arms[a].get("throughput_vs_serial", 0) for a in names]
        axes[1].bar(list(x), thr, color=["#48c" if a.startswith("nvshare") else "#999" for a in names])
        axes[1].axhline(1.0, color="k", lw=0.8)
        target = TARGETS.get(wname)
        if target and target[0] == "train" and isinstance(target[1], float):
            axes[1].axhline(1 / target[1], color="#c33", lw=0.8, ls="--", label=f"target {1 / target[1]:.2f}")
            axes[1].legend(fontsize=7)
        axes[1].set_title("aggregate throughput vs serial")
        util = [arms[a].get("gpu_util") or 0 for a in names]
        axes[2].bar(list(x), util, color="#a6c")
        axes[2].set_ylim(0, 100)
        axes[2].set_title("mean GPU utilisation % (NVML)")
        for ax in axes:
            ax.set_xticks(list(x))
            ax.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
        fig.suptitle(f"{wname}: {WORKLOADS[wname].description}", fontsize=10)
        fig.tight_layout()
        path = out / f"makespan_{wname}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

        fig, axes = plt.subplots(len(names), 1, figsize=(11, 0.95 * len(names) + 1.2), sharex=True,
                                 squeeze=False)
        for ax, a in zip(axes[:, 0], names, strict=True):
            res = arms[a]
            if not res.get("jobs"):
                ax.text(0.01, 0.5, f"{res.get('status', '?')}: {res.get('error', '')[:110]}",
                        transform=ax.transAxes, va="center", fontsize=7, color="#a00")
            for j, job in enumerate(res.get("jobs", [])):
                held = res.get("lock_intervals", {}).get(str(j), [])
                if held:
                    ax.broken_barh([(s, e - s) for s, e in held], (j - 0.45, 0.9), color=colors[j], alpha=0.2)
                spans = job.get("steps_spans", [])
                if spans:
                    ax.broken_barh([(s, e - s) for s, e in spans], (j - 0.25, 0.5), color=colors[j])
                lo, hi = job["proc"]
                ax.plot([lo, hi], [j, j], color=colors[j], lw=0.6, ls=":")
                if job["status"] != "ok":
                    ax.text(hi, j, f" {job['status'].upper()}", va="center", fontsize=8, color="#a00")
            ax.set_yticks([0, 1])
            ax.set_yticklabels(["job 0", "job 1"], fontsize=7)
            ax.set_ylim(-0.6, 1.6)
            ax.set_ylabel(a, rotation=0, ha="right", va="center", fontsize=8)
        axes[-1, 0].set_xlabel("seconds since the arm's first process started. Dark: training steps; "
                               "light: nvshare lock held; dotted: process alive")
        fig.suptitle(f"{wname}: which job ran when", fontsize=10)
        fig.tight_layout()
        path = out / f"timeline_{wname}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def try_plots(results: dict, out: Path) -> list[Path]:
    try:
        return plots(results, out)
    except ImportError as exc:
        log(f"no figures ({exc}); `--report` copies those of the run")
    except Exception as exc:  # a figure must not cost the measurements
        log(f"figures failed: {exc!r}")
    return []


# --- the report ---------------------------------------------------------------------------------

def fmt(value, spec: str = ".2f", missing: str = "–") -> str:
    return missing if value is None else format(value, spec)


def summary_rows(results: dict) -> list[list[str]]:
    rows = []
    for wname, arms in results["workloads"].items():
        for arm in [a for a in ARMS if a in arms]:
            r = arms[arm]
            lock = r.get("lock", {}).get("handover_ms", {})
            rows.append([wname, arm, r.get("status", "?"), fmt(r.get("makespan"), ".1f"),
                         fmt(r.get("makespan_vs_serial"), ".3f"), fmt(r.get("train_phase"), ".1f"),
                         fmt(r.get("train_vs_serial"), ".3f"), fmt(r.get("gpu_util"), ".0f"),
                         fmt(lock.get("p50"), ".2f")])
    return rows


def print_summary(results: dict) -> None:
    head = ["wl", "arm", "status", "makespan", "x serial", "train", "x serial", "util%", "handover ms"]
    rows = [head] + summary_rows(results)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    for wname, solo in results.get("solo", {}).items():
        if solo.get("status") == "ok":
            print(f"solo {wname}: hook/no hook training x{solo['ratio_train']:.4f}, makespan "
                  f"x{solo['ratio_makespan']:.4f}, losses identical {solo['losses_identical']}")
    if results.get("launch"):
        la = results["launch"]
        print(f"launch: {la['plain_ns']:.1f} ns without, {la['hook_ns']:.1f} ns with the hook, "
              f"ratio {la['ratio']:.3f} (median of {la['rounds']} rounds)")
    if results.get("pending"):
        print("not run (time budget): " + ", ".join(results["pending"]))


def target_line(wname: str, arms: dict) -> str:
    kind, limit = TARGETS[wname]
    key = "train_vs_serial" if kind == "train" else "makespan_vs_serial"
    if limit == "best":
        others = [arms[a][key] for a in ("colocate", "mps") if arms.get(a, {}).get(key) is not None]
        if not others:
            return "Target (issue 12): at most 1.05 x the better of colocate and MPS: not run."
        limit = round(1.05 * min(others), 3)
    parts = []
    for arm in ("nvshare-auto", "nvshare-concurrent", "nvshare-serial"):
        r = arms.get(arm)
        if not r:
            continue
        if r.get(key) is None:
            parts.append(f"{arm} {r.get('status')}")
        else:
            parts.append(f"{arm} {r[key]:.3f} {'met' if r[key] <= limit else 'missed'}")
    what = "training phase" if kind == "train" else "makespan"
    issue = "issue 12" if TARGETS[wname][1] == "best" else "issue 5"
    return (f"Target ({issue}): nvshare pair at most {limit} of serial ({what}): "
            + (", ".join(parts) or "not run") + ".")


METHOD = (
    "Each arm runs the same two jobs (tests/gpu/train.py, seeds 1 and 2, batches drawn on the GPU). "
    "Makespan = first process start to last exit; training phase = first step to last step (serial: "
    "the two jobs' training phases added, so the second start-up is not counted); throughput vs "
    "serial = serial training phase / the arm's. GPU util = NVML mean over the makespan. Hand-over = "
    "a holder's release leaving the GPU free to the next grant to the other job; yield = the daemon "
    "asking a holder to give the lock up to its release; both from the scheduler's debug log "
    "(microsecond timestamps). nvshare arms use every default but `scheduling_mode`.")


def solo_lines(results: dict) -> list[str]:
    lines = []
    for w, s in results.get("solo", {}).items():
        if s.get("status") != "ok":
            lines.append(f"Solo {w}: failed: `{s.get('error', '')[:200]}`")
            continue
        runs = ", ".join(f"{'hook' if r['hooked'] else 'plain'} {r['train_s']:.2f} s" for r in s["runs"])
        verdict = "met" if s["ratio_train"] <= 1.01 else "missed"
        lines.append(
            f"One {w} job alone ({s['steps']} steps), without and with the hook alternately ({runs}): "
            f"training phase x{s['ratio_train']:.4f}, makespan x{s['ratio_makespan']:.4f} (median of "
            f"per-round ratios); final losses bit-identical: {s['losses_identical']}. "
            f"Target within 1 %: {verdict}.")
    launch = results.get("launch")
    if launch:
        lines += ["", f"Kernel launch (bench/bench_launch.sh, {launch['rounds']} interleaved rounds of "
                      f"{launch['launches']} empty-kernel launches each, lock held): "
                      f"{launch['plain_ns']:.1f} ns without, {launch['hook_ns']:.1f} ns with the hook, "
                      f"{launch['overhead_ns']:+.1f} ns (ratio of medians {launch['ratio']:.3f})."]
    return lines


ARM_HEADER = ["| arm | result | makespan s | vs serial | training s | vs serial | throughput vs serial | "
              "steps/s per job | GPU util % | hand-over ms p50 / p99 | yield ms p50 | turns |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]


def arm_row(arm: str, r: dict) -> str:
    if r.get("status") != "ok":
        why = {"oom": "out of memory", "timeout": "timed out"}.get(r.get("status"), "failed")
        failed = [f"job {i}" for i, j in enumerate(r.get("jobs", [])) if j["status"] != "ok"]
        if failed:
            why += f" ({', '.join(failed)})"
        cells = [arm, why, fmt(r.get("makespan"), ".1f")] + [""] * 5 + [fmt(r.get("gpu_util"), ".0f")]
        return "| " + " | ".join(cells + ["", "", ""]) + " |"
    lock = r.get("lock")
    cells = [arm, "ok", f"{r['makespan']:.1f}", fmt(r.get("makespan_vs_serial"), ".3f"),
             f"{r['train_phase']:.1f}", fmt(r.get("train_vs_serial"), ".3f"),
             fmt(r.get("throughput_vs_serial"), ".2f"),
             ", ".join(f"{j['steps_per_s']:.2f}" for j in r["jobs"]), fmt(r.get("gpu_util"), ".0f")]
    if lock:
        ho, yi = lock["handover_ms"], lock["yield_ms"]
        cells += [f"{fmt(ho.get('p50'), '.3f')} / {fmt(ho.get('p99'), '.3f')}", fmt(yi.get("p50"), ".1f"),
                  str(lock["turns"])]
    else:
        cells += ["", "", ""]
    return "| " + " | ".join(cells) + " |"


def workload_notes(wname: str, arms: dict) -> list[str]:
    lines = [target_line(wname, arms)]
    serial = arms.get("serial", {})
    busy = [j["busy_fraction"] for j in serial.get("jobs", []) if j.get("busy_fraction") is not None]
    if WORKLOADS[wname].bursty and busy:
        lines.append(f"GPU busy fraction of one job alone (its step time over wall time): "
                     f"{statistics.fmean(busy):.2f}; NVML utilisation over the serial arm "
                     f"{fmt(serial.get('gpu_util'), '.0f')} %.")
    same = [a for a, r in arms.items() if r.get("losses_match_serial")]
    differ = [a for a, r in arms.items() if r.get("losses_match_serial") is False]
    if same or differ:
        lines.append("Losses bit-identical to the serial arm's: " + (", ".join(same) or "none")
                     + (f"; differ: {', '.join(differ)}" if differ else "") + ".")
    for arm, r in arms.items():
        for i, sw in enumerate(r.get("swap", [])):
            if sw["out"]["count"] or sw["in"]["count"]:
                lines.append(
                    f"{arm} job {i}: swapped out {sw['out']['GiB']:.1f} GiB in {sw['out']['count']} moves "
                    f"({fmt(sw['out']['GBps_median'], '.1f')} GB/s median), in {sw['in']['GiB']:.1f} GiB "
                    f"in {sw['in']['count']} ({fmt(sw['in']['GBps_median'], '.1f')} GB/s).")
        for i, j in enumerate(r.get("jobs", [])):
            if j.get("ballast_ok") is False:
                lines.append(f"{arm} job {i}: its ballast memory came back CHANGED.")
    return lines


def markdown(results: dict, figures: str = "bench-results") -> str:
    gpu = results["gpu"]
    command = results.get("command", "python3 bench/gpu_bench.py")
    lines = [f"## GPU ({gpu['name']}, {gpu['memory'] / (1 << 30):.0f} GiB, driver {gpu['driver']}, "
             f"{results['date']})", "",
             f"Measured with `{command}`"
             + (" (and `--resume` to finish within the time budget)" if results.get("resumed") else "")
             + "; raw numbers in the run's results.json, every job's output in its logs/.", METHOD, ""]
    if results["calibration"]:
        lines += ["| workload | model | step ms alone | sleep ms | steps per job | one job alone, s |",
                  "|---|---|---|---|---|---|"]
        for w, c in results["calibration"].items():
            model = " ".join(c["args"]).replace("--", "")
            if c.get("ballast_gb"):
                model += f", ballast {c['ballast_gb']:.1f} GiB"
            lines.append(f"| {w} | {model} | {c['step_ms']:.1f} | {c['sleep_ms']:.1f} | {c['steps']} | "
                         f"{c['expected_train_s']:.1f} |")
        lines.append("")
    solo = solo_lines(results)
    if solo:
        lines += ["### Hook overhead", "", *solo, ""]
    for wname, arms in results["workloads"].items():
        if not arms:
            continue
        lines += [f"### {wname}: {WORKLOADS[wname].description}", "", *ARM_HEADER]
        lines += [arm_row(arm, arms[arm]) for arm in ARMS if arm in arms]
        lines += ["", *workload_notes(wname, arms), "",
                  f"![{wname} makespan, throughput, utilisation]({figures}/makespan_{wname}.png)", "",
                  f"![{wname} timeline]({figures}/timeline_{wname}.png)", ""]
    if results.get("pending"):
        lines += ["Not measured (time budget): " + ", ".join(results["pending"]) + ".", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def merge_runs(paths: list[Path], merge_into) -> dict:
    """The first run's results.json with each later one's merged in by merge_into(merged, later),
    and every run's command and date."""
    merged: dict = {}
    for p in paths:
        res = json.loads(p.read_text())
        if not merged:
            merged = res
            continue
        merge_into(merged, res)
        merged["command"] = f"{merged.get('command', '')}` and `{res.get('command', '')}"
        if res["date"] not in merged["date"]:
            merged["date"] += f", {res['date']}"
    return merged


def completeness(arms: dict) -> tuple[bool, int]:
    """How much of a workload (or family member) one run measured: its serial arm (every ratio's
    reference), then how many arms ran to the end."""
    return (arms.get("serial", {}).get("status") == "ok",
            sum(1 for r in arms.values() if r.get("status") == "ok"))


def merge(paths: list[Path]) -> dict:
    def merge_into(merged: dict, res: dict) -> None:
        merged.setdefault("solo", {}).update(res.get("solo", {}))
        for w, arms in res.get("workloads", {}).items():
            # A workload's arms, and the calibration they ran with, stay those of one run: the
            # ratios are to that run's serial arm.
            if completeness(arms) >= completeness(merged["workloads"].get(w, {})):
                merged["workloads"][w] = arms
                if w in res.get("calibration", {}):
                    merged.setdefault("calibration", {})[w] = res["calibration"][w]
        for w, cal in res.get("calibration", {}).items():
            merged.setdefault("calibration", {}).setdefault(w, cal)
        if res.get("launch"):
            merged["launch"] = res["launch"]
    merged = merge_runs(paths, merge_into)
    for p in paths[1:]:
        merged["pending"] = sorted(set(merged.get("pending", []))
                                   | set(json.loads(p.read_text()).get("pending", [])))
    # A unit one run left pending and a later run measured is not pending any more.
    measured = {f"{w}/{a}" for w, arms in merged.get("workloads", {}).items() for a in arms}
    merged["pending"] = [u for u in merged.get("pending", []) if u not in measured]
    relative(merged)
    return merged


def write_docs(results: dict, dirs: list[Path]) -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    if not try_plots(results, FIGURES):
        for d in dirs:  # no matplotlib here: the figures the run drew
            for png in d.glob("*.png"):
                shutil.copy(png, FIGURES / png.name)
    replace_section(DOCS, "GPU", markdown(results))
    log(f"wrote the GPU section of {DOCS.relative_to(REPO)} and its figures in {FIGURES.relative_to(REPO)}/")


def parse_launch(path: Path) -> dict | None:
    for line in reversed(path.read_text(errors="replace").splitlines()):
        if line.startswith("result {"):
            return json.loads(line[len("result "):])
    log(f"{path}: no `result {{...}}` line (bench_launch.sh output expected)")
    return None


def main() -> int:
    if sys.argv[1:2] == ["--run-daemon"]:
        return run_daemon_with_us_timestamps()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="directory for results.json, figures and logs")
    ap.add_argument("--report", nargs="+", metavar="DIR",
                    help="rewrite docs/benchmarks.md's GPU section from these runs' results.json")
    ap.add_argument("--workloads", default="W1,W2,W3")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--solo", default="W1", help="workloads for the solo hook-overhead run ('' for none)")
    ap.add_argument("--solo-rounds", type=int, default=2)
    ap.add_argument("--train-seconds", type=float, default=15.0, help="W1/W2: one job's training alone")
    ap.add_argument("--w3-train-seconds", type=float, default=12.0)
    ap.add_argument("--solo-train-seconds", type=float, default=10.0)
    ap.add_argument("--busy-fraction", type=float, default=0.3, help="W2's GPU busy fraction")
    ap.add_argument("--time-budget", type=float, default=0.0,
                    help="seconds for this call; units that would not fit are left pending")
    ap.add_argument("--resume", metavar="RESULTS_JSON", help="start from an earlier call's results")
    ap.add_argument("--launch-result", metavar="FILE", help="bench/bench_launch.sh output to include")
    ap.add_argument("--smoke-cpu", action="store_true", help="check the harness without a GPU")
    ap.add_argument("--memory-reserve-percent", type=int, default=0, metavar="PERCENT",
                    help="the daemon keeps this much of the GPU unused and the workloads are sized "
                         "to what is left (46 on an H200: an H100's usable memory)")
    args = ap.parse_args()
    if args.report:
        results, dirs = merged_report(args, merge)
        write_docs(results, dirs)
        print_summary(results)
        return 0
    if not args.out:
        ap.error("--out DIR (or --report DIR)")
    unknown = [w for w in args.workloads.split(",") + args.solo.split(",") if w and w not in WORKLOADS]
    unknown += [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        ap.error(f"unknown workload or arm: {', '.join(unknown)}")
    if not 0 < args.busy_fraction < 1:
        ap.error("--busy-fraction must be between 0 and 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = start_results(args, lambda: {
        "gpu": gpu_info(args.smoke_cpu), "date": datetime.date.today().isoformat(),
        "host": socket.gethostname(), "command": "python3 bench/gpu_bench.py " + " ".join(sys.argv[1:]),
        "settings": {k: v for k, v in vars(args).items() if k not in ("report", "out")},
        "calibration": {}, "solo": {}, "workloads": {}, "pending": []})
    bench = Bench(args, out, results)
    log(f"{results['gpu']['name']}, {results['gpu']['memory'] / (1 << 30):.1f} GiB "
        f"({results['gpu']['free'] / (1 << 30):.1f} free), driver {results['gpu']['driver']}; out {out}")
    interrupted = False
    sigterm_interrupts()
    try:
        workloads = [WORKLOADS[w] for w in args.workloads.split(",") if w]
        solo = [WORKLOADS[w] for w in args.solo.split(",") if w]
        for w in workloads + solo:  # calibrate first: the time budget needs the estimates
            if w.name in results["calibration"]:
                continue
            if bench.left() < 60:
                if f"calibration/{w.name}" not in results["pending"]:
                    results["pending"].append(f"calibration/{w.name}")
                continue
            try:
                bench.calibrate(w)
            except Exception as exc:  # noqa: BLE001 - the other workloads still run
                results.setdefault("errors", {})[w.name] = str(exc)[-2000:]
                log(f"{w.name}: calibration failed, its arms are skipped: {str(exc)[-400:]}")
        for w in solo:
            if w.name in results["calibration"]:
                bench.solo(w)
        for w in workloads:
            if w.name not in results["calibration"]:
                continue
            for arm in args.arms.split(","):
                bench.arm(w, arm)
            relative(results)
            bench.save()
            try_plots(results, out)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: results.json holds what was measured")
    finally:
        relative(results)
        bench.save()
        bench.close()
    figures = try_plots(results, out)
    (out / "benchmarks-gpu.md").write_text(markdown(results))
    print_summary(results)
    log(f"results in {out}/results.json, figures: {', '.join(p.name for p in figures) or 'none'}")
    return 1 if interrupted else 0


if __name__ == "__main__":
    raise SystemExit(main())
