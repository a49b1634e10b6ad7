"""Issue 12's benchmark family: bursty, compute-bound and interactive members, every arm side by side.

Each job is tests/gpu/burst.c (built here into bench/build/burst): a C program on the driver API that
starts in a fraction of a second and repeats one step: a burst of FMA-bound kernels (about 1 ms each,
every SM busy) calibrated to GPU_MS alone, a cuCtxSynchronize, then a host pause. Members:
  pair-bB-gG-fixed|prop   two equal bursty jobs: busy B % of the time alone, G ms of GPU work per step;
                          the pause is fixed (G (100-B)/B ms) or proportional to each step's measured
                          wall time (the same ratio, so a slowed step also pauses longer)
                          (18; part 1: busy 10 and 30 %, and 60 % with 50 ms; part 2: the rest)
  bursty3/4-b30-g20-fixed three and four such jobs on one GPU                                 (part 2)
  compute2/3-g20          two and three compute-bound jobs (20 ms steps, no pause)          (part 2)
  interactive-1/2batch    a ~1 ms burst every 100 ms (an srun user at a prompt) beside one and two
                          compute-bound jobs                                                (part 2)
Arms, one member after the other and every arm of a member back to back: serial (the jobs one after
the other, no hook: the reference; interactive: one batch job, then the probe, each alone), colocate
(no hook), mps (a private MPS control daemon), nvshare (libnvshare.so and a real nvshare-scheduler,
every setting default) and, on a few members, nvshare-corun (`auto_share: corun`). Named with
--arms: nvshare-turns (`auto_share: turns`), nvshare-lockturns (`burst_turns: false`: bursty
co-runners take turns of the lock instead of burst by burst) and nvshare-nohandoff (`turn_handoff:
false`: the exclusive turn passes through the daemon's round trip, not from holder to next holder).
--repeat N runs each member's arms N times, each round's order rotated by one (serial once: the
reference of every round), and reports how far each arm's ratio moves and the jobs' first-step offsets.

Reported per member, as ratios against arms of the same run: the training phase (first step to last
step) over serial; nvshare against 1.05 x the best of colocate and MPS; compute-bound nvshare against
1.01x serial; max/min training time of the equal jobs (<= 1.15); interactive p50/p90/max latency of the
burst (p90 <= 10 ms) and the batch jobs' steps/s while the probe runs against one batch job alone
(loss <= 2 %). Every member stays in the table, met or not. Every job records its kernels' start and
end on the GPU's clock (burst --gpu-times), so each arm but serial reports the GPU's idle time where
it passed from one job to another (switch_gaps; a table for the compute-bound members).

  python3 bench/bench_family.py --out DIR --part 1|2|all [--members NAME,...] [--arms ...]
                                [--seconds 3] [--repeat N] [--time-budget S] [--resume RESULTS_JSON]
                                [--launch-result FILE] [--smoke-cpu]
  python3 bench/bench_family.py --report DIR [DIR ...]    # merge runs into docs/benchmarks.md
  python3 bench/bench_family.py --list

DIR/results.json is rewritten after every unit (member/arm); units that do not fit --time-budget are
left pending for a later call with --resume. DIR/timeline_<kind>.json and .svg (no matplotlib needed)
show which job ran when. --smoke-cpu runs it all on the fake driver of tests/c with the real hook and
daemon (MPS arms skipped); its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import (REPO, Harness, Job, Mps, Scheduler, clean_env, completeness, fmt,  # noqa: E402
                       gpu_info, lock_analysis, log_time, merge_runs, merged_report, parse_scheduler_log,
                       percentile, run_jobs, sigterm_interrupts, start_results)

BURST_SRC = REPO / "tests" / "gpu" / "burst.c"
BURST = REPO / "bench" / "build" / "burst"
DOCS = REPO / "docs" / "benchmarks.md"
FIGURES = REPO / "docs" / "bench-results"
BEGIN, END = "<!-- bench_family:begin -->", "<!-- bench_family:end -->"
SMOKE_UUID = "GPU-fa4e0000-0000-0000-0000-000000000000"
ARMS = ["serial", "colocate", "colocate-hook", "mps", "nvshare", "nvshare-corun", "nvshare-corun-noswap",
        "nvshare-turns", "nvshare-lockturns", "nvshare-nohandoff"]
OPTIONAL_ARMS = {"nvshare-corun": {"auto_share": "corun"},     # arm: its config beside the defaults
                 "nvshare-turns": {"auto_share": "turns"},
                 "nvshare-lockturns": {"burst_turns": False},
                 "nvshare-nohandoff": {"turn_handoff": False},
                 "nvshare-corun-noswap": {"auto_share": "corun"}}
OPTIONAL_ARM_ENV = {"nvshare-corun-noswap": {"NVSHARE_SWAP": "off"}}   # arm: its jobs' environment beside
# Run where --arms names them. colocate-hook: co-location with libnvshare.so preloaded but no daemon (the
# hook passes every call through): what loading the hook alone costs, beside what its daemon does.
NAMED_ONLY_ARMS = ("colocate-hook", "nvshare-corun-noswap", "nvshare-turns", "nvshare-lockturns",
                   "nvshare-nohandoff")
PROBE_EVERY_MS = 100.0
PROBE_GPU_MS = 1.0
MIN_STEPS = 10


def log(msg: str) -> None:
    print(f"bench_family: {msg}", flush=True)


def step_rate(ends: list[float], lo: float = float("-inf"), hi: float = float("inf")) -> float | None:
    """Steps per second between the first and the last step that ended in [lo, hi]: counting ends in
    a window and dividing by its length would miss up to a step, about 1 % of a 2 s window."""
    inside = [t for t in ends if lo <= t <= hi]
    if len(inside) < 3:
        return None
    return (len(inside) - 1) / (inside[-1] - inside[0])


@dataclass(frozen=True)
class Member:
    name: str
    kind: str                 # pair | multi | compute | interactive
    jobs: int                 # equal jobs (interactive: batch jobs beside the probe)
    busy: float               # GPU busy fraction of one job alone
    gpu_ms: float             # GPU work per step
    host: str                 # fixed | prop (the pause); compute-bound: fixed 0
    part: int
    corun: bool = False       # also run the nvshare-corun arm
    scale: float = 1.0        # x --seconds (interactive: a longer probe window, more commands)

    @property
    def ratio(self) -> float:
        return (1 - self.busy) / self.busy

    def job_args(self) -> list[str]:
        if self.host == "prop":
            return ["--gpu-ms", str(self.gpu_ms), "--host-ratio", f"{self.ratio:.6f}"]
        return ["--gpu-ms", str(self.gpu_ms), "--host-ms", f"{self.gpu_ms * self.ratio:.3f}"]

    def steps(self, seconds: float) -> int:
        return max(MIN_STEPS, round(seconds * self.scale * 1000 / (self.gpu_ms / self.busy)))


def members() -> dict[str, Member]:
    out = []
    corun_pairs = {("30", "5", "fixed"), ("30", "20", "fixed"), ("60", "5", "prop")}
    for busy in (10, 30, 60):
        for gpu in (5, 20, 50):
            for host in ("fixed", "prop"):
                # busy 60 % with 5 and 20 ms steps go to part 2: the parts then take about the same time
                part = 2 if busy == 60 and gpu < 50 else 1
                out.append(Member(f"pair-b{busy}-g{gpu}-{host}", "pair", 2, busy / 100, gpu, host, part,
                                  corun=(str(busy), str(gpu), host) in corun_pairs))
    out += [Member("bursty3-b30-g20-fixed", "multi", 3, 0.3, 20, "fixed", 2),
            Member("bursty4-b30-g20-fixed", "multi", 4, 0.3, 20, "fixed", 2),
            Member("compute2-g20", "compute", 2, 1.0, 20, "fixed", 2, corun=True),
            Member("compute3-g20", "compute", 3, 1.0, 20, "fixed", 2),
            Member("interactive-1batch", "interactive", 1, 1.0, 20, "fixed", 2, corun=True, scale=2),
            Member("interactive-2batch", "interactive", 2, 1.0, 20, "fixed", 2, scale=2)]
    return {m.name: m for m in out}


MEMBERS = members()
TIMELINE_OF = {"pair": "pair-b30-g20-fixed", "multi": "bursty4-b30-g20-fixed", "compute": "compute2-g20",
               "interactive": "interactive-1batch"}


def arms_of(m: Member) -> list[str]:
    """The member's arms when --arms does not name them: nvshare-corun only on the members flagged
    for it, NAMED_ONLY_ARMS on none."""
    return [a for a in ARMS if a not in NAMED_ONLY_ARMS and (a != "nvshare-corun" or m.corun)]


def rounds(arms: list[str], repeat: int) -> list[list[str]]:
    """The arms of each of `repeat` rounds: serial once, in the first (every round's ratios are to
    it), the others rotated so that round r starts at the r-th: no arm always runs first on a cold
    GPU or right after the same neighbour."""
    rest = [a for a in arms if a != "serial"]
    out = []
    for r in range(repeat):
        k = r % len(rest) if rest else 0
        out.append((["serial"] if r == 0 and "serial" in arms else []) + rest[k:] + rest[:k])
    return out


def unit_name(member: str, arm: str, rnd: int) -> str:
    return f"{member}/{arm}" if rnd == 0 else f"{member}/{arm} round {rnd + 1}"


def rounds_run(r: dict | None) -> set[int]:
    """The rounds an arm has a result for; a result from before --repeat is round 0."""
    if r is None:
        return set()
    return {e["round"] for e in r["repeats"]} if "repeats" in r else {0}


def switch_gaps(kernels_by_job: list[list[list[int]]], phase_s: float | None = None) -> dict | None:
    """How long the GPU sat idle each time it passed from one job to another, from every job's
    kernels as [start_ns, end_ns] on the GPU's one clock (burst --gpu-times). The kernels of all jobs
    by start; where one belongs to another job than the kernel before it, a switch, whose gap is its
    start minus the latest end so far. A negative gap: it started while another job's kernel was on
    the GPU (co-location, MPS), so no idle time; those are counted apart. phase_s: the training
    phase, for the share of it the switches' idle time took."""
    by_start = sorted((start, end, job)
                      for job, kernels in enumerate(kernels_by_job) for start, end in kernels)
    if not by_start:
        return None
    gaps_ms = []
    latest_end, prev_job = by_start[0][1], by_start[0][2]
    for start, end, job in by_start[1:]:
        if job != prev_job:
            gaps_ms.append((start - latest_end) / 1e6)
        latest_end = max(latest_end, end)
        prev_job = job
    idle = [g for g in gaps_ms if g >= 0]
    out: dict = {"kernels": len(by_start), "switches": len(gaps_ms), "overlapping": len(gaps_ms) - len(idle),
                 "total_ms": round(sum(idle), 4)}
    if idle:
        out.update(p50_ms=round(percentile(idle, 50), 4), p90_ms=round(percentile(idle, 90), 4),
                   mean_ms=round(statistics.fmean(idle), 4))
    if phase_s:
        out["phase_share"] = sum(idle) / 1000 / phase_s
    return out


# --- the workload program -------------------------------------------------------------------------

def build_burst() -> None:
    if BURST.exists() and BURST.stat().st_mtime >= BURST_SRC.stat().st_mtime:
        return
    BURST.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc", "-O2", "-std=gnu11", "-Wall", "-I", str(REPO / "csrc"), "-o", str(BURST),
                    str(BURST_SRC), "-ldl", "-lm"], check=True)


def burst_env(smoke: bool, gpu: dict) -> dict:
    """A burst job's environment, before its arm adds the hook or MPS (also bench_mixes.py's):
    the fake driver's one 16G GPU with --smoke-cpu, else the real GPU that gpu_info() found."""
    env = clean_env()
    if smoke:
        env["LD_LIBRARY_PATH"] = str(REPO / "tests" / "c" / "build")
        env["FAKE_CUDA_DEVICES"] = f"{SMOKE_UUID}:16G"
    else:
        env["CUDA_VISIBLE_DEVICES"] = gpu["uuid"]
    return env


# --- one run -----------------------------------------------------------------------------------------

class Family(Harness):
    def __init__(self, args: argparse.Namespace, out: Path, results: dict):
        super().__init__(args, out, results, "nvfamily-")
        self.gpus_yaml = [{"uuid": SMOKE_UUID, "memory": "16G"}] if self.smoke else None
        self.estimated = self.took = 0.0    # over the units run so far: scales later estimates

    def base_env(self) -> dict:
        return burst_env(self.smoke, self.results["gpu"])

    def calibrate(self) -> None:
        if "calibration" in self.results:
            return
        job = Job("calibration", [str(BURST), "--calibrate"], self.base_env(), self.logs)
        res = run_jobs([job], together=False, timeout=120)[0]
        if res["status"] != "ok":
            raise RuntimeError(f"calibration failed: {res.get('error', '')[-800:]}")
        self.results["calibration"] = {k: res[k] for k in ("ipm", "grid", "block", "startup_s")}
        self.save()
        log(f"calibrated: {res['ipm']:.0f} FMA iterations per ms per thread, grid {res['grid']} x "
            f"{res['block']}, CUDA start-up {res['startup_s']:.2f} s")

    # commands; --gpu-times everywhere: the fake driver runs no PTX, so it records nothing there,
    # but its buffer's copies still pass through the hook as on the GPU
    def job_cmd(self, m: Member, seconds: float) -> list[str]:
        return [str(BURST), "--ipm", f"{self.results['calibration']['ipm']:.3f}", *m.job_args(),
                "--steps", str(m.steps(seconds)), "--gpu-times"]

    def probe_cmd(self, seconds: float, delay: float) -> list[str]:
        return [str(BURST), "--ipm", f"{self.results['calibration']['ipm']:.3f}", "--gpu-ms",
                str(PROBE_GPU_MS), "--host-ms", str(PROBE_EVERY_MS), "--seconds", f"{seconds:.2f}",
                "--start-delay", f"{delay:.2f}", "--gpu-times"]

    def probe_window(self, m: Member) -> tuple[float, float]:
        """(start delay, seconds) of the probe: it begins once the batch jobs are in their steps and
        ends before the fastest can finish."""
        s = self.args.seconds * m.scale
        return min(1.0, 0.25 * s), 0.6 * s

    def estimate(self, m: Member, arm: str) -> float:
        s = self.args.seconds
        one = m.steps(s) * m.gpu_ms / m.busy / 1000    # one job alone, seconds of steps
        start = self.results["calibration"]["startup_s"] + 0.3
        if arm == "serial":
            return (start + one) * (2 if m.kind == "interactive" else m.jobs)
        est = start + one * max(1.0, m.jobs * m.busy) * 1.2
        return est + (3.0 if arm == "mps" else 1.5 if arm.startswith("nvshare") else 0.0)

    def unit(self, m: Member, arm: str, rnd: int = 0) -> None:
        """Runs round rnd of the arm unless it ran before. The arm's first run to finish stays its
        result in full, as without --repeat; each run's summary goes into its "repeats"."""
        done = self.results["members"].setdefault(m.name, {})
        if rnd in rounds_run(done.get(arm)):
            return
        name = unit_name(m.name, arm, rnd)
        est = self.estimate(m, arm)
        slower = self.took / self.estimated if self.estimated else 1.0
        if est * max(1.0, slower) + 5 > self.left():
            log(f"{name}: about {est:.0f} s, {self.left():.0f} s of the time budget left: pending")
            if name not in self.results["pending"]:
                self.results["pending"].append(name)
            self.save()
            return
        log(f"{name}: running (about {est:.1f} s)")
        t0 = time.time()
        try:
            r = self.run_arm(m, arm, est, rnd)
        except Exception as exc:  # noqa: BLE001 - a failed unit is a result, not the end of the run
            if isinstance(exc, subprocess.CalledProcessError):
                exc = RuntimeError(f"{exc}: {exc.stderr or exc.stdout}")
            r = {"status": "failed", "error": str(exc)[-1500:]}
        self.estimated += est
        self.took += time.time() - t0
        if name in self.results["pending"]:
            self.results["pending"].remove(name)
        first = done.setdefault(arm, r)
        if "repeats" not in first:   # r, or a result from before --repeat: round 0, kept
            first["repeats"] = [] if first is r else [repeat_summary(first, 0)]
        first["repeats"].append(repeat_summary(r, rnd))
        self.save()
        sw = r.get("switch") or {}
        log(f"{name}: {r['status']}" + (f" ({r.get('error', '')[:200]})" if r["status"] != "ok" else "")
            + (f", training phase {r['train_phase']:.2f} s" if r.get("train_phase") else "")
            + (f", {sw['switches']} switches, idle p50 {fmt(sw.get('p50_ms'), '.3f')} ms" if sw else ""))

    def start_phase(self, m: Member, rnd: int) -> float | None:
        """--phases: the start phase of round rnd (interactive members keep their probe's delay)."""
        phases = getattr(self.args, "phase_list", [])
        return phases[rnd % len(phases)] if phases and m.kind != "interactive" else None

    def run_arm(self, m: Member, arm: str, est: float, rnd: int = 0) -> dict:
        s = self.args.seconds
        base = self.base_env()
        timeout = 3 * est + 30
        tag = m.name + "-" + arm
        delay, probe_s = self.probe_window(m)
        if arm == "serial":
            cmds = [self.job_cmd(m, s)] * (1 if m.kind == "interactive" else m.jobs)
            if m.kind == "interactive":
                cmds.append(self.probe_cmd(probe_s, delay))
            jobs = [Job(f"{tag}-{i}", c, base, self.logs) for i, c in enumerate(cmds)]
            return self.summarize(m, arm, run_jobs(jobs, together=False, timeout=timeout))
        cmds = [self.job_cmd(m, s) for _ in range(m.jobs)]
        phase = self.start_phase(m, rnd)
        if phase is not None:
            # Past every arm's start-up (MPS's and the hook's included): job i's first step at
            # i x phase of a step (its period alone) after job 0's.
            lead = 3 * self.results["calibration"]["startup_s"] + 1.0
            first = time.time() + lead
            period = m.gpu_ms / m.busy / 1000
            cmds = [c + ["--start-at", f"{first + i * phase * period:.6f}"] for i, c in enumerate(cmds)]
            timeout += lead
        if m.kind == "interactive":
            cmds.append(self.probe_cmd(probe_s, delay))
        sched = mps = None
        try:
            if arm == "colocate":
                envs = [base] * len(cmds)
            elif arm == "colocate-hook":
                from nvshare_slurm import libnvshare_path
                envs = [dict(base, LD_PRELOAD=str(libnvshare_path()))] * len(cmds)
            elif arm == "mps":
                if self.smoke:
                    return {"status": "skipped", "error": "no MPS without a GPU (smoke run)"}
                mps = Mps(self.work / f"mps-{m.name}")
                envs = [mps.client_env(base) for _ in cmds]
            else:
                extra = OPTIONAL_ARMS.get(arm, {})
                sched = Scheduler("auto", self.work / tag, self.logs / f"{tag}-scheduler.log",
                                  self.gpus_yaml, extra)
                registered = [sched.job_env(base) for _ in cmds]
                envs = [dict(env, **OPTIONAL_ARM_ENV.get(arm, {})) for _, env in registered]
                if self.args.hook_debug:   # each hand-over and threshold in the jobs' .err logs, timed
                    envs = [dict(env, NVSHARE_LOG_LEVEL="debug", NVSHARE_LOG_TIME="1") for env in envs]
            jobs = [Job(f"{tag}-{i}", c, e, self.logs)
                    for i, (c, e) in enumerate(zip(cmds, envs, strict=True))]
            results = run_jobs(jobs, together=True, timeout=timeout)
        finally:
            if sched is not None:
                sched.stop()
            if mps is not None:
                mps.stop()
        res = self.summarize(m, arm, results)
        if phase is not None:
            res["start_phase"] = phase
            res["start_at_late_ms"] = [j.get("start_at_late_ms") for j in results]
        if sched is not None:
            text = sched.log_path.read_text(errors="replace")
            lock = lock_analysis(parse_scheduler_log(text))
            index = {job_id: i for i, (job_id, _) in enumerate(registered)}
            res["lock"] = {"handover_ms": lock["handover_ms"], "turns": lock["turns"]}
            res["lock_intervals"] = {str(index.get(j, j)): [[round(a - res["t0"], 4), round(b - res["t0"], 4)]
                                                            for a, b in iv]
                                     for j, iv in lock["intervals"].items()}
            res["sharing"] = sharing_changes(text, res["t0"])
        return res

    def summarize(self, m: Member, arm: str, jobs: list[dict]) -> dict:
        t0 = min(j["proc_start"] for j in jobs)
        statuses = [j["status"] for j in jobs]
        status = "ok" if all(s == "ok" for s in statuses) else next(
            s for s in ("timeout", "oom", "failed") if s in statuses)
        res: dict = {"status": status, "t0": t0, "makespan": max(j["proc_end"] for j in jobs) - t0,
                     "jobs": []}
        for j in jobs:
            e = {"status": j["status"],
                 "proc": [round(j["proc_start"] - t0, 4), round(j["proc_end"] - t0, 4)]}
            if j["status"] == "ok" and j["times"]:
                e.update(train_s=j["times"][-1] - j["step_starts"][0], steps=len(j["times"]),
                         startup_s=j["startup_s"],
                         # burst's start-up phases, each one's end: where one job's start waited on another's
                         phases={k: round((v - t0) * 1000, 2) for k, v in
                                 ({"exec": j.get("start", j["proc_start"])} | j.get("phase_ends", {})
                                  | {"first_step": j["step_starts"][0]}).items()},
                         spans=[[round(a - t0, 4), round(b - t0, 4)]
                                for a, b in zip(j["step_starts"], j["times"], strict=True)])
            else:
                e["error"] = j.get("error", "")[-600:]
            res["jobs"].append(e)
        if status != "ok":
            return res
        probe = jobs[-1] if m.kind == "interactive" else None
        batch = jobs[:-1] if probe is not None else jobs
        trains = [j["times"][-1] - j["step_starts"][0] for j in batch]
        res["max_min"] = max(trains) / min(trains)   # serial: how far equal jobs differ anyway
        if arm == "serial":  # the training phases added: the second job's start-up is not counted
            res["train_phase"] = sum(trains)
            res["gpu_ms_alone"] = statistics.median(x for j in batch for x in j["latencies_ms"])
            res["busy_alone"] = statistics.fmean(
                sum(b - a for a, b in zip(j["step_starts"], j["times"], strict=True)) / t
                for j, t in zip(batch, trains, strict=True))
        else:
            res["train_phase"] = max(j["times"][-1] for j in batch) - min(j["step_starts"][0] for j in batch)
            firsts = [j["step_starts"][0] for j in batch]   # co-runners in phase or not, by chance
            res["first_step_offsets_ms"] = [round((t - min(firsts)) * 1000, 2) for t in firsts]
            # Not in serial: there a switch is the next job's start-up.
            switch = switch_gaps([j.get("gpu_kernels") or [] for j in jobs], res["train_phase"])
            if switch:
                switch["unrecorded"] = sum(j.get("gpu_kernels_unrecorded", 0) for j in jobs)
                res["switch"] = switch
        if probe is not None:
            lat = probe["latencies_ms"]
            res["probe"] = {"p50_ms": percentile(lat, 50), "p90_ms": percentile(lat, 90), "max_ms": max(lat),
                            "commands": len(lat)}
            w0, w1 = probe["step_starts"][0], probe["times"][-1]
            if arm == "serial":  # the batch job ran alone, before the probe: its own rate
                res["batch_steps_per_s"] = step_rate(batch[0]["times"])
            else:  # the batch jobs' steps while the probe ran, added up: the GPU's batch throughput
                rates = [step_rate(j["times"], w0, w1) for j in batch]
                res["batch_steps_per_s"] = None if None in rates else sum(rates)
                res["batch_outlasted_probe"] = all(j["times"][-1] >= w1 for j in batch)
        return res


def repeat_summary(r: dict, rnd: int) -> dict:
    """What the report compares across rounds (derive adds x_serial)."""
    keep = ("status", "train_phase", "first_step_offsets_ms", "switch", "start_phase", "start_at_late_ms")
    return {"round": rnd, **{k: r[k] for k in keep if k in r},
            "phases_ms": [j.get("phases") for j in r.get("jobs", [])]}


SHARING_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[,.](\d+) nvshare-scheduler: "
                          r"gpu \S+: sharing: (\S+) \((.*)\)$")


def sharing_changes(text: str, t0: float) -> list[list]:
    """[seconds since t0, sharing, reason] for each change the daemon logged."""
    out = []
    for line in text.splitlines():
        mt = SHARING_LINE.match(line)
        if mt:
            stamp, frac, how, why = mt.groups()
            out.append([round(log_time(stamp, frac) - t0, 3), how, why])
    return out


# --- ratios and targets ------------------------------------------------------------------------

def derive(results: dict) -> None:
    """Ratios of every member's arms to its serial arm, and the issue's targets; run after any change."""
    done = {unit_name(m, a, k) for m, arms in results["members"].items() for a, r in arms.items()
            for k in rounds_run(r)}
    results["pending"] = [u for u in results.get("pending", []) if u not in done]
    for name, arms in results["members"].items():
        m = MEMBERS.get(name)
        ref = arms.get("serial", {})
        if not m or ref.get("status") != "ok":
            continue
        # Interactive: one batch job ran in the serial arm; N of them back to back take N times it.
        serial = ref["train_phase"] * (m.jobs if m.kind == "interactive" else 1)
        for arm, r in arms.items():
            if arm != "serial" and r.get("status") == "ok":
                r["x_serial"] = r["train_phase"] / serial
                if m.kind == "interactive" and ref.get("batch_steps_per_s") and r.get("batch_steps_per_s"):
                    r["batch_vs_alone"] = r["batch_steps_per_s"] / ref["batch_steps_per_s"]
            for e in r.get("repeats", []) if arm != "serial" else []:
                if e.get("status") == "ok":
                    e["x_serial"] = e["train_phase"] / serial
        targets = {}
        nv = arms.get("nvshare", {})
        if m.kind == "interactive":
            if nv.get("probe"):
                targets["p90<=10ms"] = nv["probe"]["p90_ms"] <= 10.0
            if nv.get("batch_vs_alone") is not None:
                targets["batch loss<=2%"] = nv["batch_vs_alone"] >= 0.98
        else:
            others = [arms[a]["x_serial"] for a in ("colocate", "mps") if arms.get(a, {}).get("x_serial")]
            if nv.get("x_serial") is not None and others:
                targets["<=1.05x best"] = nv["x_serial"] <= 1.05 * min(others)
                nv["vs_best"] = nv["x_serial"] / min(others)
            if m.kind == "compute" and nv.get("x_serial") is not None:
                targets["<=1.01x serial"] = nv["x_serial"] <= 1.01
            if nv.get("max_min") is not None:
                targets["max/min<=1.15"] = nv["max_min"] <= 1.15
        results.setdefault("targets", {})[name] = targets


def chose(r: dict) -> str:
    """What the adaptive daemon chose, longest-lasting first (from its logged changes)."""
    changes = r.get("sharing") or []
    if not changes:
        return "–"
    end = r.get("makespan", changes[-1][0])
    held: dict[str, float] = {}
    for (t, how, _), nxt in zip(changes, changes[1:] + [[end, "", ""]], strict=True):
        held[how] = held.get(how, 0.0) + max(0.0, nxt[0] - t)
    return "/".join(sorted(held, key=held.get, reverse=True)) + f" ({len(changes)} changes)"


def verdict(targets: dict) -> str:
    if not targets:
        return "not measured"
    missed = [k for k, ok in targets.items() if not ok]
    return "met" if not missed else "**missed** " + ", ".join(missed)


def table(results: dict) -> list[str]:
    lines = []
    mem = results["members"]
    ordered = [n for n in MEMBERS if n in mem]
    bursty = [n for n in ordered if MEMBERS[n].kind in ("pair", "multi", "compute")]
    if bursty:
        # nvshare-lockturns and nvshare-nohandoff get a column only where a run has them.
        shown = ["colocate", "mps", "nvshare", "nvshare-corun"] + [
            a for a in ("nvshare-lockturns", "nvshare-nohandoff") if any(a in mem[n] for n in bursty)]
        heads = {"nvshare-corun": "corun", "nvshare-lockturns": "lock turns",
                 "nvshare-nohandoff": "no hand-off", "mps": "MPS"}
        lines += ["| member | jobs | GPU ms alone | busy alone | max/min serial | "
                  + " | ".join(heads.get(a, a) for a in shown)
                  + " | nvshare / best | max/min nvshare | nvshare chose | targets |",
                  "|---" * (9 + len(shown)) + "|"]
        for n in bursty:
            arms, m = mem[n], MEMBERS[n]
            ref = arms.get("serial", {})
            nv = arms.get("nvshare", {})
            lines.append("| " + " | ".join([
                n, str(m.jobs), fmt(ref.get("gpu_ms_alone"), ".1f"), fmt(ref.get("busy_alone"), ".2f"),
                fmt(ref.get("max_min"), ".3f") if ref.get("status") == "ok" else ref.get("status", "–"),
                *[cell(arms.get(a)) for a in shown],
                fmt(nv.get("vs_best"), ".3f"), fmt(nv.get("max_min"), ".3f"), chose(nv),
                verdict(results.get("targets", {}).get(n, {}))]) + " |")
        lines += ["", f"Columns colocate … {heads[shown[-1]]}: the training phase (first step to last) "
                  "over serial's "
                  "(the jobs' training phases one after the other, start-ups not counted); below 1 is "
                  "faster than one job after the other. nvshare / best: nvshare over the better of "
                  "colocate and MPS (target ≤ 1.05). max/min serial: the same jobs alone, how far equal "
                  "jobs differ without sharing.", ""]
    inter = [n for n in ordered if MEMBERS[n].kind == "interactive"]
    if inter:
        lines += ["| member | arm | probe p50 ms | p90 ms | max ms | commands | batch steps/s vs alone | "
                  "nvshare chose | targets |", "|---|---|---|---|---|---|---|---|---|"]
        for n in inter:
            for arm in ARMS:
                r = mem[n].get(arm)
                if r is None:
                    continue
                p = r.get("probe", {})
                status = "" if r.get("status") == "ok" else f" ({r.get('status')})"
                lines.append("| " + " | ".join([
                    n if arm == "serial" else "", arm + status, fmt(p.get("p50_ms"), ".2f"),
                    fmt(p.get("p90_ms"), ".2f"), fmt(p.get("max_ms"), ".2f"), str(p.get("commands", "–")),
                    "1 (reference)" if arm == "serial" else fmt(r.get("batch_vs_alone"), ".3f"),
                    chose(r) if arm.startswith("nvshare") else "",
                    verdict(results.get("targets", {}).get(n, {})) if arm == "nvshare" else ""]) + " |")
        lines.append("")
    return lines + switch_table(results) + repeat_table(results)


def switch_table(results: dict) -> list[str]:
    """The compute-bound members' idle GPU at hand-overs, per arm that has kernel times."""
    mem = results["members"]
    names = [n for n in MEMBERS if n in mem and MEMBERS[n].kind == "compute"]
    shown = [a for a in ARMS if a != "serial" and any((mem[n].get(a) or {}).get("switch") for n in names)]
    if not shown:
        return []
    lines = ["| member | " + " | ".join(shown) + " |", "|---" * (1 + len(shown)) + "|"]
    for n in names:
        cells = [switch_cell((mem[n].get(a) or {}).get("switch")) for a in shown]
        lines.append("| " + " | ".join([n, *cells]) + " |")
    return lines + ["", "Switch idle ms p50/p90 (per cent of the phase), switches (overlapping): the GPU's "
                    "idle time each time it passed from one job's kernel to another's, from the kernels' "
                    "start and end on the GPU's clock (%globaltimer); the per cent is all those gaps over "
                    "the training phase. An overlapping switch started while another job's kernel was "
                    "still on the GPU (time slices, MPS): no idle time, not in the percentiles.", ""]


def switch_cell(sw: dict | None) -> str:
    if not sw:
        return "–"
    share = f"{sw['phase_share'] * 100:.1f} %" if sw.get("phase_share") is not None else "–"
    return (f"{fmt(sw.get('p50_ms'), '.3f')}/{fmt(sw.get('p90_ms'), '.3f')} ({share}), "
            f"{sw['switches']} ({sw['overlapping']})")


def repeat_table(results: dict) -> list[str]:
    """Members whose arms ran more than once: how far an arm's ratio to serial moves between runs,
    beside each run's first-step offsets (pairs that start in phase may stay so)."""
    mem = results["members"]
    names = [n for n in MEMBERS if n in mem and any(len(r.get("repeats", [])) > 1 for r in mem[n].values())]
    if not names:
        return []
    lines = ["| member | arm | runs | × serial mean | min | max "
             "| each run: first-step offsets ms (× serial) |",
             "|---|---|---|---|---|---|---|"]
    for n in names:
        first = True
        for arm in ARMS:
            r = mem[n].get(arm)
            if r is None:
                continue
            runs = sorted(r.get("repeats", []), key=lambda e: e["round"])
            if arm == "serial":
                row = [str(len(runs) or 1), "1 (reference)", "", "", ""]
            else:
                xs = [e["x_serial"] for e in runs if e.get("x_serial") is not None]
                each = "; ".join(
                    (f"φ{e['start_phase']:g}: " if e.get("start_phase") is not None else "")
                    + ("/".join(f"{o:.1f}" for o in sorted(e.get("first_step_offsets_ms", []))[1:]) or "–")
                    + (f" ({e['x_serial']:.3f})" if e.get("x_serial") is not None
                       else f" ({e.get('status')})")
                    for e in runs)
                row = [str(len(runs)), fmt(statistics.fmean(xs) if xs else None, ".3f"),
                       fmt(min(xs) if xs else None, ".3f"), fmt(max(xs) if xs else None, ".3f"), each]
            lines.append("| " + " | ".join([n if first else "", arm, *row]) + " |")
            first = False
    return lines + ["", "Each round ran the member's arms in an order rotated by one; the serial arm ran "
                    "once per member, the reference every round's ratio is to. Offsets: each job's first "
                    "step after the first job's; φ: the start phase the round set (--phases, a fraction "
                    "of a step: job i's first step i × φ of a step after job 0's).", ""]


def cell(r: dict | None) -> str:
    if r is None:
        return "–"
    if r.get("status") != "ok":
        return r.get("status", "?")
    return fmt(r.get("x_serial"), ".3f")


def paired_ratio(a: dict, b: dict) -> tuple[float, int]:
    """a over b: the mean of their ratios round by round where both ran more than one round (each
    round's arms started alike, at one --phases phase), else their first runs'; and how many rounds."""
    xa = {e["round"]: e["x_serial"] for e in a.get("repeats", []) if e.get("x_serial")}
    xb = {e["round"]: e["x_serial"] for e in b.get("repeats", []) if e.get("x_serial")}
    both = sorted(set(xa) & set(xb))
    if len(both) > 1:
        return statistics.fmean(xa[k] / xb[k] for k in both), len(both)
    return a["x_serial"] / b["x_serial"], 1


def summary(results: dict) -> list[str]:
    t = results.get("targets", {})
    met = sum(1 for v in t.values() if v and all(v.values()))
    lines = [f"Members with every target met: {met} of {len(t)}."]
    corun = [(n, *paired_ratio(a["nvshare-corun"], a["colocate"]))
             for n, a in results["members"].items()
             if a.get("nvshare-corun", {}).get("x_serial") and a.get("colocate", {}).get("x_serial")]
    if corun:
        lines.append("`auto_share: corun` against plain co-location (same jobs, same run"
                     + ("; the mean over rounds, each round's two arms at the same start phase"
                        if any(k > 1 for _, _, k in corun) else "") + "): "
                     + ", ".join(f"{n} {v:.3f}" + (f" ({k} rounds)" if k > 1 else "") for n, v, k in corun)
                     + ".")
    la = results.get("launch")
    if la:
        lines.append(f"Kernel launch with the demand sampler on (bench/bench_launch.sh, "
                     f"{la['rounds']} rounds "
                     f"of {la['launches']} empty-kernel launches, lock held): {la['plain_ns']:.1f} ns "
                     f"without, {la['hook_ns']:.1f} ns with the hook ({la['overhead_ns']:+.1f} ns).")
    if results.get("pending"):
        lines.append("Not measured (time budget): " + ", ".join(results["pending"]) + ".")
    return lines


# --- timelines: JSON and SVG (no matplotlib on either machine) ---------------------------------

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]


def timeline(results: dict, name: str) -> dict | None:
    arms = results["members"].get(name)
    if not arms:
        return None
    rows = []
    for arm in ARMS:
        r = arms.get(arm)
        if r and r.get("jobs") and arm != "serial":
            rows.append({"arm": arm, "status": r.get("status"),
                         "jobs": [{"spans": j.get("spans", []), "proc": j["proc"], "status": j["status"]}
                                  for j in r["jobs"]],
                         "lock": r.get("lock_intervals", {})})
    return {"member": name, "rows": rows}


def svg(tl: dict, window: float = 2.0) -> str:
    """Each arm a band, each job a lane: dark = its steps (burst + synchronise), light = it held
    nvshare's lock. The first `window` seconds after the first step, so single bursts stay visible."""
    lanes = sum(len(r["jobs"]) for r in tl["rows"])
    W, left, lane_h, gap = 900, 130, 14, 10
    height = 40 + lanes * lane_h + len(tl["rows"]) * gap + 30
    starts = [j["spans"][0][0] for r in tl["rows"] for j in r["jobs"] if j["spans"]]
    t0 = min(starts) if starts else 0.0
    scale = (W - left - 10) / window
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" '
           f'font-size="11">', f'<rect width="{W}" height="{height}" fill="white"/>',
           f'<text x="8" y="16" font-size="13">{tl["member"]}: which job ran when (first {window:g} s of '
           f'steps; dark: a step, light: nvshare lock held)</text>']
    y = 30
    for r in tl["rows"]:
        out.append(f'<text x="8" y="{y + lane_h * len(r["jobs"]) / 2 + 4:.0f}">{r["arm"]}'
                   f'{"" if r["status"] == "ok" else " (" + str(r["status"]) + ")"}</text>')
        for i, j in enumerate(r["jobs"]):
            c = COLORS[i % len(COLORS)]
            for a, b in r["lock"].get(str(i), []):
                a, b = max(a, t0), min(b, t0 + window)
                if b > a:
                    out.append(f'<rect x="{left + (a - t0) * scale:.1f}" y="{y}" '
                               f'width="{(b - a) * scale:.2f}" '
                               f'height="{lane_h - 2}" fill="{c}" opacity="0.25"/>')
            for a, b in j["spans"]:
                if a > t0 + window:
                    break
                b = min(b, t0 + window)
                out.append(f'<rect x="{left + (a - t0) * scale:.1f}" y="{y + 3}" '
                           f'width="{max(0.5, (b - a) * scale):.2f}" height="{lane_h - 8}" fill="{c}"/>')
            y += lane_h
        y += gap
    for k in range(int(window / 0.25) + 1):
        x = left + k * 0.25 * scale
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="black"/>'
                   f'<text x="{x - 8:.1f}" y="{y + 16}">{k * 0.25:g}</text>')
    out.append(f'<text x="{W - 60}" y="{y + 16}">seconds</text></svg>')
    return "\n".join(out) + "\n"


def write_timelines(results: dict, where: Path) -> list[Path]:
    written = []
    for kind, name in TIMELINE_OF.items():
        if name not in results["members"]:  # a run of other members: the first of this kind it has
            name = next((n for n in results["members"] if n in MEMBERS and MEMBERS[n].kind == kind), name)
        tl = timeline(results, name)
        if not tl or not tl["rows"]:
            continue
        (where / f"timeline_family_{kind}.json").write_text(json.dumps(tl))
        path = where / f"timeline_family_{kind}.svg"
        path.write_text(svg(tl))
        written.append(path)
    return written


# --- the report ----------------------------------------------------------------------------------

def markdown(results: dict, figures: list[Path]) -> str:
    gpu, cal = results["gpu"], results.get("calibration", {})
    lines = [BEGIN, f"### The family ({gpu['name']}, driver {gpu['driver']}, {results['date']})", "",
             f"Measured with `{results['command']}`; every arm of a member ran in the same call, back to "
             f"back. Jobs: tests/gpu/burst.c ({fmt(cal.get('ipm'), '.0f')} FMA iterations/ms per thread, "
             f"grid {cal.get('grid')} × {cal.get('block')}, 1 ms kernels, CUDA start-up "
             f"{fmt(cal.get('startup_s'), '.2f')} s), {results['settings']['seconds']:g} s of steps per job "
             f"alone (at least {MIN_STEPS} steps). "
             "Interactive: a 1 ms burst every 100 ms, latency from its first launch to its synchronise "
             "returning; batch steps/s counted while the probe runs, against one batch job alone."
             + "".join(f" Another call calibrated {fmt(c.get('ipm'), '.0f')} iterations/ms (its members "
                       "are compared within that call)." for c in results.get("calibrations", []) if c),
             "",
             *table(results), *summary(results), ""]
    for f in figures:
        lines += [f"![{f.stem}](bench-results/{f.name})", ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def write_docs(results: dict, dirs: list[Path]) -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    figures = write_timelines(results, FIGURES)
    section = markdown(results, figures)
    text = DOCS.read_text()
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section.rstrip("\n") + text[text.index(END) + len(END):]
    else:  # at the end of the "Adaptive sharing (issue 12)" section, before the next "## "
        head = re.search(r"^## Adaptive sharing \(issue 12\).*?(?=^## |\Z)", text, re.S | re.M)
        if not head:
            raise SystemExit(f"{DOCS}: no '## Adaptive sharing (issue 12)' section to put the family in")
        text = text[:head.end()].rstrip("\n") + "\n\n" + section + "\n" + text[head.end():]
    DOCS.write_text(text)
    log(f"wrote the family into {DOCS} and {len(figures)} timelines into {FIGURES}/")


def merge(paths: list[Path]) -> dict:
    def merge_into(merged: dict, res: dict) -> None:
        for name, arms in res["members"].items():
            # A member's arms stay those of one run: its ratios are to that run's serial arm, on
            # that run's calibration. Mixing in another run's arms compared them across calls.
            if completeness(arms) >= completeness(merged["members"].get(name, {})):
                merged["members"][name] = arms
        merged["pending"] = merged.get("pending", []) + res.get("pending", [])
        merged["launch"] = res.get("launch") or merged.get("launch")
        if res.get("calibration", {}).get("ipm") != merged.get("calibration", {}).get("ipm"):
            merged.setdefault("calibrations", []).append(res.get("calibration"))
    merged = merge_runs(paths, merge_into)
    derive(merged)
    return merged


def selected(args: argparse.Namespace, ap: argparse.ArgumentParser) -> list[Member]:
    if args.members:
        names = args.members.split(",")
        unknown = [n for n in names if n not in MEMBERS]
        if unknown:
            ap.error(f"unknown member(s): {', '.join(unknown)} (--list shows them)")
        return [MEMBERS[n] for n in names]
    if args.part not in ("1", "2", "all"):
        ap.error("--part must be 1, 2 or all")
    return [m for m in MEMBERS.values() if args.part == "all" or m.part == int(args.part)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--report", nargs="+", metavar="DIR")
    ap.add_argument("--list", action="store_true", help="the members, their part and arms")
    ap.add_argument("--part", default="all")
    ap.add_argument("--members", help="comma-separated member names (instead of --part)")
    ap.add_argument("--arms", help="comma-separated; these arms on every member (default: every arm "
                    f"but {', '.join(NAMED_ONLY_ARMS)}, nvshare-corun only on the members flagged for it)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N", help="run each member's arms N times, "
                    "their order rotated each round; serial once (the reference of every round)")
    ap.add_argument("--seconds", type=float, default=3.0, help="steps of one job alone, in seconds "
                    "(interactive members: twice that)")
    ap.add_argument("--time-budget", type=float, default=0.0)
    ap.add_argument("--resume", metavar="RESULTS_JSON")
    ap.add_argument("--launch-result", metavar="FILE", help="bench/bench_launch.sh output to include")
    ap.add_argument("--phases", metavar="LIST", help="comma-separated fractions of a step (e.g. 0,0.25,0.5): "
                    "round r starts job i's first step i x phases[r mod n] of a step after job 0's, in "
                    "every arm but serial (burst --start-at), so arms meet equal start phases")
    ap.add_argument("--hook-debug", action="store_true", help="the hook's debug log in the nvshare arms")
    ap.add_argument("--smoke-cpu", action="store_true", help="fake driver, real hook and daemon, no MPS")
    args = ap.parse_args()
    if args.list:
        for m in MEMBERS.values():
            print(f"part {m.part}  {m.name:24} {m.jobs} jobs  busy {m.busy:.0%}  {m.gpu_ms:g} ms/step  "
                  f"{m.host:5}  {m.steps(args.seconds)} steps  arms {','.join(arms_of(m))}")
        return 0
    if args.report:
        results, dirs = merged_report(args, merge)
        write_docs(results, dirs)
        print("\n".join(table(results) + summary(results)))
        return 0
    if not args.out:
        ap.error("--out DIR (or --report DIR, or --list)")
    wanted = args.arms.split(",") if args.arms else []
    bad = [a for a in wanted if a not in ARMS]
    if bad:
        ap.error(f"unknown arm(s): {', '.join(bad)}; arms are {', '.join(ARMS)}")
    if args.seconds <= 0:
        ap.error("--seconds must be above 0")
    if args.repeat < 1:
        ap.error("--repeat must be 1 or more")
    try:
        args.phase_list = [float(x) for x in args.phases.split(",")] if args.phases else []
    except ValueError:
        ap.error(f"--phases: not a list of numbers: {args.phases}")
    if any(not 0 <= x < 1 for x in args.phase_list):
        ap.error("--phases: each phase is a fraction of a step, from 0 up to (not including) 1")
    todo = selected(args, ap)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    build_burst()
    results = start_results(args, lambda: {
        "gpu": gpu_info(args.smoke_cpu), "date": datetime.date.today().isoformat(),
        "host": socket.gethostname(), "command": "python3 bench/bench_family.py " + " ".join(sys.argv[1:]),
        "settings": {"seconds": args.seconds, "smoke": args.smoke_cpu}, "members": {}, "pending": []})
    fam = Family(args, out, results)
    sigterm_interrupts()
    interrupted = False
    try:
        fam.calibrate()
        plan = [(m, rnd, order) for m in todo
                for rnd, order in enumerate(rounds([a for a in ARMS if a in wanted] if wanted else arms_of(m),
                                                   args.repeat))]
        to_run = [(m, a) for m, rnd, order in plan for a in order
                  if rnd not in rounds_run(results["members"].get(m.name, {}).get(a))]
        log(f"{len(to_run)} units to run, about {sum(fam.estimate(m, a) for m, a in to_run):.0f} s "
            f"({len(todo)} members, {args.repeat} round(s))")
        for m, rnd, order in plan:  # serial first: the budget check of the others needs nothing from it
            for arm in order:
                fam.unit(m, arm, rnd)
            derive(results)
            fam.save()
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: results.json holds what was measured")
    finally:
        derive(results)
        fam.save()
        fam.close()
    figures = write_timelines(results, out)
    (out / "family.md").write_text(markdown(results, figures))
    print("\n".join(table(results) + summary(results)))
    log(f"results in {out}/results.json, table in {out}/family.md, timelines: "
        f"{', '.join(p.name for p in figures) or 'none'}")
    return 1 if interrupted else 0


if __name__ == "__main__":
    raise SystemExit(main())
