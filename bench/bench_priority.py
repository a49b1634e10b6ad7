"""Priority classes (issue 14) side by side in one run on a GPU: does a `high` training keep its
speed beside `low` ones, and do the `low` ones use the time it leaves?

Scenarios: one compute-bound `high` training (W1 of bench/gpu_bench.py) beside one and beside two
`low` trainings, the low ones compute-bound (W1), bursty (W1's model, a host pause after every
step so that the GPU is busy --busy-fraction of the time) or memory-heavy (mem: W1 holding a
ballast of --low-mem of the GPU's memory, beside a high job holding --high-mem: they do not fit
together, so the low jobs must be swapped out for it; its reference is that high job alone). W1 is
calibrated once (25 steps alone): every training then runs for about --train-seconds alone. The
references (each kind of job alone) run once; then per scenario these arms, the same jobs, the high
one started --high-delay after the low ones (it arrives on a GPU they already use, as a production
job on a node they soak up):
  colocate   no hook (not by default: it does not fit one 8-minute run)
  mps        under NVIDIA MPS (a private control daemon)
  mps-pct    MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=--low-pct on the low jobs only
  nvshare    libnvshare.so and a real nvshare-scheduler, every setting default except the site's
             priority_classes map (QOS prod -> high, partition scavenge -> low). Each job gets its
             class and its environment the way a Slurm job does: nvshare-prolog registers it
             (reading the job's record from a stand-in scontrol) and nvshare-taskprolog prints its
             environment. While the jobs run, `nvshare-status show jobs` must show Class= for each;
             the arm fails otherwise, and the lines seen are kept.
  lows-only  the low jobs alone together under nvshare: what they take of a GPU by themselves
Reported per scenario and arm:
  high_vs_alone    the high job's steady throughput against alone (alone / here); target >= 0.95
  low_vs_alone     each low job's throughput over its whole training phase (its waits for the
                   high job included) against alone
  low_vs_leftover  (the high job's training here + the lows-only span) / the span until the last
                   low job ended: 1.0 = the low jobs ran in the time the high job left and lost
                   nothing else. "Steady" leaves out each job's first WARMUP steps (its own
                   start-up: allocator, cuBLAS), alone and here alike.

  python3 bench/bench_priority.py --out DIR [--lows 1,2] [--low-kinds compute,bursty,mem]
                                  [--arms nvshare,lows-only,mps-pct,mps[,colocate]]
                                  [--train-seconds 4] [--time-budget 420] [--high-delay 2]
  python3 bench/bench_priority.py --report DIR    (the docs/benchmarks.md section from DIR)
  python3 bench/bench_priority.py --smoke-cpu --out DIR

DIR/priority.json is rewritten after every unit; units that would not fit --time-budget are listed
as skipped. --smoke-cpu runs everything on the CPU: the jobs are tests/c's nvtest on the fake driver
(kernels of --smoke-kernel-ms), the scheduler and Slurm glue are the real ones, MPS arms are left
out; its numbers only check the harness and the class path.
"""
from __future__ import annotations

import argparse
import datetime
import grp
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import (TRAIN, WORKLOADS, Job, Mps, SchedulerProcess, gpu_info, job_log_lines,  # noqa: E402
                       kill_running, log, run_jobs, sigterm_interrupts)
from gpu_bench import clean_env as bench_env  # noqa: E402
from bench_interactive import prepare  # noqa: E402
from docsection import replace_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "benchmarks.md"
SECTION = "Priority classes (issue 14)"
FAKE_BUILD = REPO / "tests" / "c" / "build"
FAKE_GPU = "GPU-fa4e0000-0000-0000-0000-000000000000"   # tests/c/fake_cuda.c's first GPU
# In the order they run: what the issue asks first, so a short budget cuts colocate, then MPS.
ARMS = ("nvshare", "lows-only", "mps-pct", "mps", "colocate")
DEFAULT_ARMS = ("nvshare", "lows-only", "mps-pct", "mps")
CALIBRATION_STEPS = 25
WARMUP = 3
NODE = "benchnode"
LOW_KINDS = ("compute", "bursty", "mem")
FAKE_GPU_BYTES = 16 << 30   # tests/c/fake_cuda.c's device size when FAKE_CUDA_DEVICES names none
# The site's map in the nvshare arm, and the Slurm facts of the jobs it classifies.
CLASS_MAP = {"qos": {"prod": "high"}, "partition": {"scavenge": "low"}, "default": "normal"}
HIGH_JOB = {"qos": "prod", "partition": "gpu", "want": "high(qos prod)"}
LOW_JOB = {"qos": "normal", "partition": "scavenge", "want": "low(partition scavenge)"}


def clean_env() -> dict:
    """bench/gpu_bench.py's, and no Slurm or fake-driver settings either: each job gets its own."""
    return bench_env(also_drop=("SLURM_", "FAKE_CUDA_"))


# --- the jobs ------------------------------------------------------------------------------------

def steady(res: dict) -> float:
    """Seconds per step after the warm-up steps (the job's own start-up, alone and here alike)."""
    starts, ends = res["step_starts"], res["times"]
    skip = min(WARMUP, len(starts) - 1)
    return (ends[-1] - starts[skip]) / (len(starts) - skip)


def train_s(res: dict) -> float:
    return res["times"][-1] - res["step_starts"][0]


def fake_job(argv: list[str]) -> int:
    """--fake-job STEPS KERNEL_MS SLEEP_MS [MEM_BYTES]: train.py's output from nvtest on the fake
    driver, MEM_BYTES of device memory taken first (a ballast), then one kernel per step,
    synchronised, then the host pause (a bursty job's think time)."""
    steps, kernel_ms, sleep_ms = int(argv[0]), float(argv[1]), float(argv[2])
    mem = int(argv[3]) if len(argv) > 3 else 0
    actions = ["init", "ctx:0"] + ([f"alloc:{mem}"] if mem else [])
    for _ in range(steps):
        actions += ["stamp", f"launch:{int(kernel_ms * 1000)}", "sync", "stamp"]
        if sleep_ms > 0:
            actions.append(f"sleep:{int(round(sleep_ms))}")
    offset = time.time() - time.monotonic()   # nvtest's stamps are CLOCK_MONOTONIC, as this one
    done = subprocess.run([str(FAKE_BUILD / "nvtest"), *actions], capture_output=True, text=True)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        return done.returncode
    stamps = [int(line.split()[1]) / 1e9 + offset for line in done.stdout.splitlines()
              if line.startswith("stamp ")]
    print(json.dumps({"step_starts": stamps[0::2], "times": stamps[1::2], "losses": []}))
    return 0


class Jobs:
    """The commands of the benchmark's jobs: train.py on the GPU, the fake driver's nvtest in smoke."""

    def __init__(self, smoke: bool, smoke_kernel_ms: float):
        self.smoke = smoke
        self.kernel_ms = smoke_kernel_ms

    def cmd(self, steps: int, seed: int, sleep_ms: float = 0.0, mem_bytes: int = 0) -> list[str]:
        """mem_bytes: a ballast the job holds (and touches every step on a GPU) besides its model."""
        if self.smoke:
            return [sys.executable, str(Path(__file__).resolve()), "--fake-job", str(steps),
                    str(self.kernel_ms), f"{sleep_ms:.2f}", str(mem_bytes)]
        extra = ["--sleep-ms", f"{sleep_ms:.2f}"] if sleep_ms else []
        extra += ["--mem-gb", f"{mem_bytes / (1 << 30):.2f}"] if mem_bytes else []
        return [sys.executable, str(TRAIN), *WORKLOADS["W1"].args, "--steps", str(steps),
                "--seed", str(seed), *extra]


# --- a scheduler with the site's class map, and jobs registered as Slurm would --------------------

class ClassScheduler(SchedulerProcess):
    """A real nvshare-scheduler whose config maps QOS prod to high and partition scavenge to low,
    and a stand-in scontrol that describes the benchmark's jobs to nvshare-prolog."""

    def __init__(self, workdir: Path, log_path: Path, smoke: bool):
        import yaml
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.bindir = workdir / "slurm-bin"
        self.bindir.mkdir(exist_ok=True)
        scontrol = self.bindir / "scontrol"
        # `scontrol show job -d ID` prints that job's record; without ID (the daemon's rebuild) all.
        scontrol.write_text('#!/bin/sh\nd=$(dirname "$0")\nif [ -n "$4" ]; then cat "$d/job-$4.txt"; '
                            'else cat "$d"/job-*.txt 2>/dev/null; fi\nexit 0\n')
        scontrol.chmod(0o755)
        # The socket in a short folder of its own: AF_UNIX paths end at 107 bytes, and DIR may be deep.
        self.sockdir = tempfile.mkdtemp(prefix="nvprio-")
        self.socket = os.path.join(self.sockdir, "s.sock")
        settings = {"socket": self.socket, "state_dir": str(workdir / "state"), "log_level": "debug",
                    "slurm_bin_dir": str(self.bindir), "node_name": NODE,
                    "priority_classes": CLASS_MAP}
        if smoke:
            settings["gpus"] = [{"uuid": FAKE_GPU, "memory": "16G"}]
        self.config = workdir / "nvshare.yaml"
        self.config.write_text(yaml.safe_dump(settings))
        self.env = clean_env()
        self.env["NVSHARE_CONFIG"] = str(self.config)
        self.start([sys.executable, "-m", "nvshare_slurm.daemon"], self.env, log_path)
        self.next_job = 700

    def slurm_job(self, base: dict, facts: dict, name: str) -> tuple[int, dict]:
        """Register a job through nvshare-prolog and build its task's environment with
        nvshare-taskprolog, as slurmd and slurmstepd run them; (job id, environment)."""
        self.next_job += 1
        job_id = self.next_job
        uid, gid = os.getuid(), os.getgid()
        user, group = pwd.getpwuid(uid).pw_name, grp.getgrgid(gid).gr_name
        (self.bindir / f"job-{job_id}.txt").write_text(
            f"JobId={job_id} JobName={name}\n"
            f"   UserId={user}({uid}) GroupId={group}({gid}) MCS_label=N/A\n"
            f"   Priority=1 Nice=0 Account=(null) QOS={facts['qos']}\n"
            f"   JobState=RUNNING Reason=None Dependency=(null)\n"
            f"   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0\n"
            f"   Partition={facts['partition']} AllocNode:Sid=localhost:1\n"
            f"   NodeList={NODE}\n   BatchHost={NODE}\n"
            f"   JOB_GRES=nvshare:1\n"
            f"     Nodes={NODE} CPU_IDs=0 Mem=0 GRES=nvshare(CNT:1)\n"
            f"   Comment=(null)\n")
        slurm_env = dict(self.env, SLURM_JOB_ID=str(job_id), SLURM_JOB_UID=str(uid),
                         SLURM_JOB_GID=str(gid), SLURM_JOB_USER=user, SLURMD_NODENAME=NODE)
        prolog = subprocess.run([sys.executable, "-m", "nvshare_slurm.prolog"], env=slurm_env,
                                capture_output=True, text=True, timeout=30, cwd=str(REPO))
        if prolog.returncode != 0 or f"class {facts['want']}" not in prolog.stderr:
            raise RuntimeError(f"nvshare-prolog for job {job_id} ({facts}): rc {prolog.returncode}: "
                               f"{prolog.stderr.strip()[-600:]}")
        task = subprocess.run([sys.executable, "-m", "nvshare_slurm.taskprolog"],
                              env=dict(slurm_env, SLURM_STEP_ID="0"), capture_output=True,
                              text=True, timeout=30, cwd=str(REPO))
        env = dict(base, SLURM_JOB_ID=str(job_id), SLURM_STEP_ID="0")
        for line in task.stdout.splitlines():
            if line.startswith("export ") and "=" in line:
                key, value = line[len("export "):].split("=", 1)
                env[key] = value
        if "LD_PRELOAD" not in env or "NVSHARE_SOCKET" not in env:
            raise RuntimeError(f"nvshare-taskprolog for job {job_id} printed no hook: "
                               f"{task.stdout!r} {task.stderr[-600:]!r}")
        return job_id, env

    def status_jobs(self) -> str:
        done = subprocess.run([sys.executable, "-m", "nvshare_slurm.status", "--socket", self.socket,
                               "-o", "show", "jobs"], env=self.env, capture_output=True, text=True,
                              timeout=20, cwd=str(REPO))
        return done.stdout if done.returncode == 0 else f"rc {done.returncode}: {done.stderr}"

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.sockdir, ignore_errors=True)


def handovers(log_text: str, high_job: int | None) -> dict:
    """From the scheduler's debug log: how often the high job was granted the GPU (1 = it took it
    once and kept it), how often it was asked to give it back when idle, and how long each low
    holder dropped while the high job was there took from its DROP_LOCK to its release: the
    drain the high job runs beside (the low jobs' turns among themselves afterwards not counted)."""
    events = job_log_lines(log_text)
    high = [when for when, job, _, _ in events if job == high_job]
    first, last = (min(high), max(high)) if high else (0.0, 0.0)
    drops: dict[int, float] = {}
    drains: list[float] = []
    grants = contended = 0
    for when, job, pid, what in events:
        if job == high_job:
            grants += what.startswith("lock granted")
            contended += what.startswith("others wait, asked to release")
        elif what.startswith("lock dropped") and first <= when <= last:
            drops[pid] = when
        elif what.startswith("lock released") and pid in drops:
            drains.append((when - drops.pop(pid)) * 1000)
    return {"high_grants": grants, "high_asked_when_idle": contended,
            "low_drain_ms": [round(d, 1) for d in drains]}


class ClassWatch(threading.Thread):
    """While the jobs run: `nvshare-status show jobs` until every job shows its class with a
    client attached (the process is really running under the hook, in that job)."""

    def __init__(self, sched: ClassScheduler, want: dict[int, str]):
        super().__init__(daemon=True)
        self.sched, self.want = sched, want
        self.seen: dict[int, str] = {}
        self.sample = ""
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set() and len(self.seen) < len(self.want):
            text = self.sched.status_jobs()
            for line in text.splitlines():
                for job_id in self.want:
                    if line.startswith(f"JobId={job_id} ") and " Clients=(null)" not in line:
                        cls = next((w[len("Class="):] for w in _fields(line) if w.startswith("Class=")),
                                   "")
                        if cls:
                            self.seen[job_id] = cls
                            self.sample = text
            self.stop_flag.wait(0.3)

    def verdict(self) -> str:
        wrong = {j: self.seen.get(j, "not seen") for j, w in self.want.items() if self.seen.get(j) != w}
        return "ok" if not wrong else "wrong class: " + ", ".join(
            f"job {j} {seen} (want {self.want[j]})" for j, seen in wrong.items())


def _fields(line: str) -> list[str]:
    """The Key=value words of a oneliner record; a value with a space ("high(qos prod)") stays one."""
    out: list[str] = []
    for word in line.split(" "):
        if "=" in word.split("(", 1)[0] or not out:
            out.append(word)
        else:
            out[-1] += " " + word
    return out


# --- the benchmark ------------------------------------------------------------------------------

class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.smoke = args.smoke_cpu
        if self.smoke:
            self.out = Path(args.out)
            self.logs = self.out / "logs"
            self.logs.mkdir(parents=True, exist_ok=True)
            self.base = clean_env()
            self.base["LD_LIBRARY_PATH"] = str(FAKE_BUILD)
        else:
            self.out, self.logs, base = prepare(args.out)
            self.base = {k: v for k, v in base.items() if not k.startswith(("SLURM_", "FAKE_CUDA_"))}
        self.jobs = Jobs(self.smoke, args.smoke_kernel_ms)
        # The high job starts this much after the low ones (their start-up is shorter in smoke).
        self.high_delay = args.high_delay if args.high_delay is not None else (0.3 if self.smoke else 2.0)
        self.gpu_bytes = FAKE_GPU_BYTES if self.smoke else gpu_info(smoke=False)["memory"]
        self.t0 = time.time()
        self.results: dict = {
            "date": datetime.date.today().isoformat(), "smoke": self.smoke,
            "command": "python3 bench/bench_priority.py " + " ".join(sys.argv[1:]),
            "settings": {k: v for k, v in vars(args).items() if k not in ("out", "report")},
            "class_map": CLASS_MAP, "calibration": {}, "alone": {}, "scenarios": {}, "skipped": []}
        self.results["high_delay"] = self.high_delay
        if not self.smoke:
            self.results["gpu"] = gpu_name()

    def save(self) -> None:
        tmp = self.out / "priority.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1))
        tmp.replace(self.out / "priority.json")

    def left(self) -> float:
        return self.args.time_budget - (time.time() - self.t0) if self.args.time_budget else 1e9

    def fits(self, unit: str, estimate: float) -> bool:
        if estimate <= self.left():
            return True
        log(f"{unit}: about {estimate:.0f} s, {self.left():.0f} s left: skipped")
        self.results["skipped"].append(unit)
        self.save()
        return False

    def calibrate(self) -> dict:
        res = run_jobs([Job("calibration", self.jobs.cmd(CALIBRATION_STEPS, 1), self.base, self.logs)],
                       False, 240)[0]
        if res["status"] != "ok":
            raise RuntimeError(f"calibration failed ({res['status']}): {res.get('error', '')[-800:]}")
        steps = [e - s for s, e in zip(res["step_starts"], res["times"], strict=True)]
        step_s = statistics.median(steps[WARMUP:])
        busy = self.args.busy_fraction
        sleep_s = step_s * (1 - busy) / busy
        target = self.args.train_seconds
        cal = {"step_ms": step_s * 1000, "startup_s": res["step_starts"][0] - res["proc_start"],
               "compute_steps": max(20, round(target / step_s)),
               "bursty_steps": max(10, round(target / (step_s + sleep_s))),
               "bursty_sleep_ms": sleep_s * 1000}
        self.results["calibration"] = cal
        self.save()
        log(f"calibrated: {cal['step_ms']:.1f} ms a step, start-up {cal['startup_s']:.1f} s; "
            f"compute {cal['compute_steps']} steps, bursty {cal['bursty_steps']} steps + "
            f"{cal['bursty_sleep_ms']:.0f} ms pauses (~{target:.0f} s each alone)")
        return cal

    def cmds(self, kind: str, n: int) -> tuple[list[str], list[list[str]]]:
        cal = self.results["calibration"]
        if kind == "mem":   # the high job's ballast and a low one's do not fit together
            high = self.jobs.cmd(cal["compute_steps"], 1, mem_bytes=self.mem_bytes("high"))
            lows = [self.jobs.cmd(cal["compute_steps"], 2 + i, mem_bytes=self.mem_bytes("low"))
                    for i in range(n)]
            return high, lows
        high = self.jobs.cmd(cal["compute_steps"], 1)
        if kind == "bursty":
            lows = [self.jobs.cmd(cal["bursty_steps"], 2 + i, cal["bursty_sleep_ms"]) for i in range(n)]
        else:
            lows = [self.jobs.cmd(cal["compute_steps"], 2 + i) for i in range(n)]
        return high, lows

    def mem_bytes(self, who: str) -> int:
        """The mem scenario's ballast of the high job or of each low one."""
        fraction = self.args.high_mem if who == "high" else self.args.low_mem
        return int(fraction * self.gpu_bytes)

    def alone(self, kinds: list[str]) -> None:
        """Each kind of job alone, once: the references of every scenario. A compute-bound low
        job is the high job's training with another seed: the same work, so the same reference.
        The mem scenario's high job holds a ballast: "high-mem" is its own reference."""
        cal = self.results["calibration"]
        refs = ["high"] + [k for k in kinds if k != "compute"] + (["high-mem"] if "mem" in kinds else [])
        for kind in refs:
            if not self.fits(f"alone/{kind}", cal["startup_s"] + self.args.train_seconds + 3):
                continue
            if kind in ("high", "compute"):
                cmd = self.cmds("compute", 0)[0]
            elif kind == "high-mem":
                cmd = self.cmds("mem", 0)[0]
            else:
                cmd = self.cmds(kind, 1)[1][0]
            res = run_jobs([Job(f"alone-{kind}", cmd, self.base, self.logs)], False, 300)[0]
            self.results["alone"][kind] = job_entry(res)
            if kind == "high":
                self.results["alone"]["compute"] = self.results["alone"]["high"]
            self.save()
            log(f"alone/{kind}: {json.dumps(self.results['alone'][kind])}")

    def estimate(self, arm: str, kind: str, n: int) -> float:
        cal = self.results["calibration"]
        t = self.args.train_seconds
        busy = self.args.busy_fraction if kind == "bursty" else 1.0
        gpu_work = (0 if arm == "lows-only" else t) + n * t * busy
        span = max(t, gpu_work * 1.1)
        delay = 0.0 if arm == "lows-only" else self.high_delay
        # mem: each low job's ballast out and back in, at a few GB/s
        swap = 2 * n * self.mem_bytes("low") / 5e9 if kind == "mem" and arm != "lows-only" else 0.0
        return cal["startup_s"] + delay + span + swap + (3 if arm.startswith("mps") else 1)

    def arm(self, name: str, kind: str, n: int, arm: str) -> dict | None:
        unit = f"{name}/{arm}"
        estimate = self.estimate(arm, kind, n)
        if not self.fits(unit, estimate):
            return None
        log(f"{unit}: running (about {estimate:.0f} s)")
        high_cmd, low_cmds = self.cmds(kind, n)
        key = f"{name}-{arm}"
        sched = mps = watch = None
        high_id = None
        extra: dict = {}
        try:
            if arm in ("nvshare", "lows-only"):
                sched = ClassScheduler(self.logs / f"{key}-sched", self.logs / f"{key}-scheduler.log",
                                       self.smoke)
                want: dict[int, str] = {}
                high_env = self.base
                if arm == "nvshare":
                    high_id, high_env = sched.slurm_job(self.base, HIGH_JOB, f"{key}-high")
                    want[high_id] = HIGH_JOB["want"]
                low_envs = []
                for i in range(n):
                    job_id, env = sched.slurm_job(self.base, LOW_JOB, f"{key}-low{i}")
                    want[job_id] = LOW_JOB["want"]
                    low_envs.append(env)
                watch = ClassWatch(sched, want)
            elif arm in ("mps", "mps-pct"):
                mps = Mps(self.logs / f"{key}-mps")
                high_env = mps.client_env(self.base)
                low_envs = [mps.client_env(self.base) for _ in range(n)]
                if arm == "mps-pct":
                    for env in low_envs:
                        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(self.args.low_pct)
            else:
                high_env, low_envs = self.base, [self.base] * n
            jobs = [Job(f"{key}-low{i}", c, low_envs[i], self.logs) for i, c in enumerate(low_cmds)]
            if arm != "lows-only":
                jobs.insert(0, Job(f"{key}-high", high_cmd, high_env, self.logs))
            if watch is not None:
                watch.start()
            res = run_late_first(jobs, self.high_delay if arm != "lows-only" else 0.0,
                                 min(2 * estimate + 60, max(estimate, self.left()) + 30))
            if watch is not None:
                watch.stop_flag.set()
                watch.join(30)
                extra = {"classes": watch.verdict(), "classes_seen": watch.seen,
                         "status_sample": watch.sample.splitlines()}
            if sched is not None:
                sched.stop()   # its log complete
                extra["handovers"] = handovers(sched.log_path.read_text(errors="replace"),
                                               high_id if arm == "nvshare" else None)
        except Exception as exc:  # noqa: BLE001 - a failed arm is a result, not the end of the run
            log(f"{unit} failed: {str(exc)[-600:]}")
            return {"status": ["failed"], "error": str(exc)[-2000:]}
        finally:
            if watch is not None:
                watch.stop_flag.set()
            if sched is not None:
                sched.stop()
            if mps is not None:
                mps.stop()
        entry = arm_entry(res[0] if arm != "lows-only" else None, res if arm == "lows-only" else res[1:])
        entry.update(extra)
        return entry

    def run(self) -> None:
        kinds = self.args.low_kinds.split(",")
        self.calibrate()
        self.alone(kinds)
        arms = [a for a in self.args.arms.split(",") if not (self.smoke and a.startswith("mps"))]
        lows = [int(x) for x in self.args.lows.split(",")]
        planned = sum(self.estimate(a, k, n) for k in kinds for n in lows for a in arms)
        log(f"arms planned: about {planned:.0f} s, {self.left():.0f} s of the budget left")
        for kind in kinds:
            for n in lows:
                name = f"high+{n}low-{kind}"
                scenario = self.results["scenarios"].setdefault(name, {"kind": kind, "lows": n,
                                                                       "arms": {}})
                for arm in arms:
                    entry = self.arm(name, kind, n, arm)
                    if entry is not None:
                        scenario["arms"][arm] = entry
                        summarise(self.results, name)
                        self.save()
                        log(f"{name}/{arm}: {json.dumps(scenario.get('summary', {}).get(arm))}"
                            + (f" classes {entry.get('classes')}" if "classes" in entry else ""))


def run_late_first(jobs: list[Job], delay: float, timeout: float) -> list[dict]:
    """The low jobs (jobs[1:]) at once, the high job (jobs[0]) `delay` seconds later: it arrives
    on a GPU the low jobs already use, as a production job does on a node they soak up. With no
    delay, all at once (jobs[0] first, as run_jobs does)."""
    deadline = time.time() + timeout
    order = jobs[1:] + jobs[:1] if delay else jobs
    try:
        for job in order:
            if job is jobs[0] and delay:
                time.sleep(delay)
            job.launch()
        for job in jobs:
            job.wait(deadline)
    finally:  # interrupted: leave no job running on the GPU
        kill_running(jobs)
    return [job.result() for job in jobs]


def gpu_name() -> str:
    info = gpu_info(smoke=False)
    return f"{info['name']}, driver {info['driver']}"


def job_entry(res: dict) -> dict:
    if res["status"] != "ok":
        return {"status": res["status"], "error": res.get("error", "")[-800:]}
    return {"status": "ok", "train_s": train_s(res), "step_s": steady(res),
            "start": res["proc_start"], "end": res["times"][-1]}


def arm_entry(high: dict | None, lows: list[dict]) -> dict:
    """Times of one arm: each job's training and steady step, and the span until the last low ended."""
    ran = ([high] if high else []) + lows
    out: dict = {"status": [r["status"] for r in ran]}
    if high is not None:
        out["high"] = job_entry(high)
    out["lows"] = [job_entry(r) for r in lows]
    if all(r["status"] == "ok" for r in ran):
        out["start"] = min(r["proc_start"] for r in ran)
        out["lows_end"] = max(r["times"][-1] for r in lows)
    return out


def summarise(results: dict, name: str) -> None:
    scenario = results["scenarios"][name]
    alone = results["alone"]
    high_ref = alone.get("high-mem" if scenario["kind"] == "mem" else "high", {}).get("step_s")
    arms = scenario["arms"]
    lows_only = arms.get("lows-only", {})
    lows_span = lows_only["lows_end"] - lows_only["start"] if "start" in lows_only else None
    summary = {}
    for arm, e in arms.items():
        row: dict = {"ok": all(s == "ok" for s in e["status"]) and e.get("classes", "ok") == "ok"}
        if arm != "lows-only" and high_ref and e.get("high", {}).get("step_s"):
            row["high_vs_alone"] = high_ref / e["high"]["step_s"]
        # A low job's whole training phase, its waits for the high job included: what it got.
        low_ref = alone.get(scenario["kind"], {}).get("train_s")   # mem: a low job with its ballast
        row["low_vs_alone"] = [low_ref / x["train_s"] if low_ref and x.get("train_s") else None
                               for x in e.get("lows", [])]
        if arm != "lows-only" and lows_span and "start" in e:
            row["low_vs_leftover"] = (e["high"]["train_s"] + lows_span) / (e["lows_end"] - e["start"])
        summary[arm] = row
    scenario["summary"] = summary


# --- tables and the docs section -----------------------------------------------------------------

def fmt(x) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) else "–"


def table(results: dict) -> list[str]:
    lines = ["| scenario | arm | high vs alone | low vs alone | low vs leftover | classes seen | "
             "grants to high / low drain ms max |", "|---|---|---|---|---|---|---|"]
    for name, scenario in results["scenarios"].items():
        for arm, row in scenario.get("summary", {}).items():
            e = scenario["arms"][arm]
            lows = ", ".join(fmt(x) for x in row.get("low_vs_alone", [])) or "–"
            status = "" if all(s == "ok" for s in e["status"]) else " (" + "/".join(e["status"]) + ")"
            seen = ", ".join(sorted(set(e.get("classes_seen", {}).values()))) or "–"
            if e.get("classes", "ok") != "ok":
                seen = e["classes"]
            hand = e.get("handovers", {})
            drain = max(hand.get("low_drain_ms") or [0.0])
            hand_text = f"{hand['high_grants']} / {drain:.0f}" if hand.get("high_grants") else "–"
            lines.append(f"| {name} | {arm}{status} | {fmt(row.get('high_vs_alone'))} | {lows} | "
                         f"{fmt(row.get('low_vs_leftover'))} | {seen} | {hand_text} |")
    return lines


def verdicts(results: dict) -> list[str]:
    """Per scenario: the high job against the target under nvshare and the MPS arms."""
    out = []
    for name, scenario in results["scenarios"].items():
        parts = []
        for arm in ("nvshare", "mps-pct", "mps"):
            row = scenario.get("summary", {}).get(arm)
            if row and row.get("high_vs_alone"):
                met = "met" if row["high_vs_alone"] >= 0.95 else "missed"
                parts.append(f"{arm} {row['high_vs_alone']:.3f} ({met})")
        if parts:
            out.append(f"- {name}: high vs alone " + ", ".join(parts) + ".")
    return out


def markdown(results: dict) -> str:
    cal = results.get("calibration", {})
    alone = results.get("alone", {})
    settings = results["settings"]
    smoke = results.get("smoke")
    where = "CPU smoke run, fake driver: the numbers mean nothing" if smoke else results.get("gpu", "GPU")
    job = ("nvtest on the fake driver, one kernel a step" if smoke
           else "W1, the compute-bound transformer training of bench/gpu_bench.py")
    text = (f"`{results.get('command')}`: one command, every arm side by side. The jobs: {job}, "
            f"the high one started {results.get('high_delay', 0):g} s after the low ones (it arrives "
            "on a GPU they already use); "
            f"calibrated once ({cal.get('step_ms', 0):.1f} ms a step, start-up "
            f"{cal.get('startup_s', 0):.1f} s); each training runs ~{settings.get('train_seconds')} s "
            f"alone. Bursty low jobs pause {cal.get('bursty_sleep_ms', 0):.0f} ms on the host after "
            f"every step (GPU busy {settings.get('busy_fraction')}). Memory-heavy (mem) low jobs "
            f"hold a ballast of {settings.get('low_mem')} of the GPU's memory each, the high job one "
            f"of {settings.get('high_mem')}: they do not fit together, so the low ones are swapped out "
            "for it (its reference: that high job alone). The nvshare arm's jobs got their "
            "class as Slurm jobs do: nvshare-prolog classified them from their job record (QOS prod "
            "→ high, partition scavenge → low) and nvshare-taskprolog printed their environment; "
            "\"classes seen\" is what `nvshare-status show jobs` showed while they ran (the arm fails "
            "otherwise). High vs alone: the high job's steady step time (after "
            f"{WARMUP} warm-up steps; alone {fmt(alone.get('high', {}).get('step_s'))} s) against "
            "alone. Low vs alone: each low job's whole training phase, its waits included, against "
            "alone. Low vs leftover: (the high job's training + the lows-only span) / the span to "
            "the last low job's end; 1.0 = the low jobs lost nothing but the time the high job "
            "used. Grants to high: how often the scheduler granted the high job the GPU (1: it "
            "took it once and kept it); low drain: the longest time a low holder took from its "
            "DROP_LOCK to its release, which the high job runs beside (scheduler log). "
            "mps-pct: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="
            f"{settings.get('low_pct')} on the low jobs only. Target (issue 14): high vs alone ≥ 0.95.")
    lines = [f"## {SECTION} ({where}, {results.get('date')})", *textwrap.wrap(text, 100), ""]
    lines += table(results)
    lines += [""] + verdicts(results)
    if results.get("skipped"):
        lines += ["", "Not run (time budget): " + ", ".join(results["skipped"]) + "."]
    lines += ["", "Raw results: `priority.json` of the run (per job times, the status lines seen); "
              "every job's output in its logs/."]
    return "\n".join(lines) + "\n"


def main() -> int:
    if sys.argv[1:2] == ["--fake-job"]:
        return fake_job(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="directory for priority.json and logs/")
    ap.add_argument("--report", metavar="DIR",
                    help="write docs/benchmarks.md's priority section from DIR/priority.json")
    ap.add_argument("--lows", default="1,2", help="numbers of low jobs beside the high one")
    ap.add_argument("--low-kinds", default="compute,bursty",
                    help=f"of {','.join(LOW_KINDS)} (mem: they do not fit beside the high job)")
    ap.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                    help=f"of {','.join(ARMS)} (colocate is left out by default: it does not fit the "
                         "8 minutes, and the issue compares MPS)")
    ap.add_argument("--train-seconds", type=float, default=4.0, help="each training alone")
    ap.add_argument("--busy-fraction", type=float, default=0.3, help="bursty low jobs' GPU share")
    ap.add_argument("--high-mem", type=float, default=0.72,
                    help="mem: the high job's ballast, a fraction of the GPU's memory")
    ap.add_argument("--low-mem", type=float, default=0.28,
                    help="mem: each low job's ballast (default: two low jobs swapped out take 0.56 "
                         "of the GPU's memory in host memory)")
    ap.add_argument("--low-pct", type=int, default=20,
                    help="mps-pct: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of each low job")
    ap.add_argument("--time-budget", type=float, default=420.0,
                    help="seconds; units that would not fit are skipped (0: no limit)")
    ap.add_argument("--high-delay", type=float, default=None,
                    help="seconds the high job starts after the low ones (default 2; smoke 0.3), "
                         "so that it arrives on a GPU they already use")
    ap.add_argument("--smoke-cpu", action="store_true", help="check the harness without a GPU")
    ap.add_argument("--smoke-kernel-ms", type=float, default=10.0)
    args = ap.parse_args()
    if args.report:
        results = json.loads((Path(args.report) / "priority.json").read_text())
        # "Priority classes" as the key: docsection matches the heading up to a word boundary,
        # which "(issue 14)" does not end on.
        replace_section(DOCS, "Priority classes", markdown(results))
        print("\n".join(table(results)))
        log(f"wrote the '{SECTION}' section of {DOCS.relative_to(REPO)}")
        return 0
    if not args.out:
        ap.error("--out DIR (or --report DIR)")
    bad = [a for a in args.arms.split(",") if a not in ARMS]
    bad += [k for k in args.low_kinds.split(",") if k not in LOW_KINDS]
    if bad:
        ap.error(f"unknown arm or low kind: {', '.join(bad)}")
    if not 0 < args.busy_fraction < 1:
        ap.error("--busy-fraction must be between 0 and 1")
    if not (0 < args.high_mem < 1 and 0 < args.low_mem < 1 and args.high_mem + args.low_mem >= 1):
        ap.error("--high-mem and --low-mem: fractions of the GPU's memory that add up to 1 or more "
                 "(the jobs must not fit together)")
    if not 1 <= args.low_pct <= 100:
        ap.error("--low-pct must be 1..100")
    bench = Bench(args)
    sigterm_interrupts()
    try:
        bench.run()
    except KeyboardInterrupt:
        log("interrupted: priority.json holds what was measured")
    finally:
        bench.save()
        (bench.out / "benchmarks-priority.md").write_text(markdown(bench.results))
    print("\n".join(table(bench.results)))
    failed = [f"{n}/{a}" for n, s in bench.results["scenarios"].items()
              for a, row in s.get("summary", {}).items() if not row["ok"]]
    if failed:
        log(f"arms that failed or showed the wrong class: {', '.join(failed)}")
    log(f"{time.time() - bench.t0:.0f} s; results in {bench.out}/priority.json")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
