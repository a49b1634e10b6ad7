"""Priority classes (issue 14) side by side in one run on a GPU: does a `high` training keep its
speed beside `low` ones, and do the `low` ones use the time it leaves?

Scenarios: one compute-bound `high` training (W1 of bench/gpu_bench.py) beside one and beside two
`low` trainings, the low ones compute-bound (W1) or bursty (W1's model, GPU busy --low-busy of the
time). Arms, each the same jobs started together:
  alone      each job alone (the references)
  colocate   all at once, no hook
  mps        all at once under NVIDIA MPS
  mps-pct    MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=--low-pct on the low jobs only
  nvshare    libnvshare.so and a real nvshare-scheduler, defaults; the high job registered `high`,
             the low ones `low` (as the prolog would from the site's priority_classes)
  lows-only  the low jobs alone together under nvshare: what they take of a GPU by themselves
Reported per scenario and arm:
  high_vs_alone    the high job's throughput against alone (training phase alone / here); target >= 0.95
  low_vs_alone     each low job's throughput against alone
  low_vs_leftover  how well the low jobs used the time the high job left: (the high job's training
                   phase here + the lows-only time) / the time until the last low job ended; 1.0 =
                   they ran back to back with the high job's work and lost nothing else. For a
                   compute-bound high job the leftover is after it (or in its gaps).

  python3 bench/bench_priority.py --out DIR [--lows 1,2] [--low-kinds compute,bursty]
                                  [--arms alone,colocate,mps,mps-pct,nvshare,lows-only]

Not run yet: written without the GPU machine (its time in that session was spent). Results go to
DIR/priority.json and a Markdown table on stdout for docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import (TRAIN, WORKLOADS, Job, Mps, Scheduler, log, run_jobs,  # noqa: E402
                       train_phase)
from bench_interactive import prepare  # noqa: E402

SEEDS = (1, 2, 3)
ARMS = ("alone", "colocate", "mps", "mps-pct", "nvshare", "lows-only")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--lows", default="1,2", help="numbers of low jobs beside the high one")
    ap.add_argument("--low-kinds", default="compute,bursty")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--steps", type=int, default=200, help="W1 steps of the high job (~24 s alone)")
    ap.add_argument("--low-steps", type=int, default=200)
    ap.add_argument("--low-busy", type=float, default=0.3, help="bursty low jobs: GPU busy share")
    ap.add_argument("--low-pct", type=int, default=20,
                    help="mps-pct: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of each low job")
    args = ap.parse_args()
    out, logs, base = prepare(args.out)
    w1 = WORKLOADS["W1"]
    results: dict = {"steps": args.steps, "low_steps": args.low_steps, "low_busy": args.low_busy,
                     "low_pct": args.low_pct, "scenarios": {}}

    def cmd(seed: int, steps: int, busy: float = 0.0) -> list[str]:
        extra = ["--busy-fraction", str(busy)] if busy else []
        return [sys.executable, str(TRAIN), *w1.args, "--steps", str(steps), "--seed", str(seed),
                *extra]

    def save() -> None:
        (out / "priority.json").write_text(json.dumps(results, indent=1))

    for kind in args.low_kinds.split(","):
        busy = args.low_busy if kind == "bursty" else 0.0
        for n in [int(x) for x in args.lows.split(",")]:
            name = f"high+{n}low-{kind}"
            high_cmd = cmd(SEEDS[0], args.steps)
            low_cmds = [cmd(SEEDS[1 + i % 2], args.low_steps, busy) for i in range(n)]
            scenario: dict = {"arms": {}}
            results["scenarios"][name] = scenario
            for arm in args.arms.split(","):
                key = f"{name}-{arm}"
                log(f"{key}: running")
                scenario["arms"][arm] = run_arm(arm, key, high_cmd, low_cmds, base, logs, args)
                save()
            summarise(scenario)
            save()
            log(f"{name}: {json.dumps(scenario.get('summary'))}")
    print_table(results)
    return 0


def run_arm(arm: str, key: str, high_cmd: list[str], low_cmds: list[list[str]], base: dict,
            logs: Path, args: argparse.Namespace) -> dict:
    sched = mps = None
    try:
        if arm == "alone":
            res = run_jobs([Job(f"{key}-high", high_cmd, base, logs)]
                           + [Job(f"{key}-low{i}", c, base, logs) for i, c in enumerate(low_cmds)],
                           False, 1800)
            return entry(res[0], res[1:])
        n = len(low_cmds)
        if arm in ("nvshare", "lows-only"):
            sched = Scheduler("auto", logs / f"{key}-sched", logs / f"{key}-scheduler.log", None)
            high_env = sched.job_env(base, "high")[1] if arm == "nvshare" else base
            low_envs = [sched.job_env(base, "low")[1] for _ in range(n)]
        elif arm in ("mps", "mps-pct"):
            mps = Mps(logs / f"{key}-mps")
            high_env = mps.client_env(base)
            low_envs = [mps.client_env(base) for _ in range(n)]
            if arm == "mps-pct":
                for env in low_envs:
                    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(args.low_pct)
        else:
            high_env, low_envs = base, [base] * n
        jobs = [Job(f"{key}-low{i}", c, low_envs[i], logs) for i, c in enumerate(low_cmds)]
        if arm != "lows-only":
            jobs.insert(0, Job(f"{key}-high", high_cmd, high_env, logs))
        res = run_jobs(jobs, True, 1800)
        return entry(res[0], res[1:]) if arm != "lows-only" else entry(None, res)
    finally:
        if sched is not None:
            sched.stop()
        if mps is not None:
            mps.stop()


def entry(high: dict | None, lows: list[dict]) -> dict:
    """Times of one arm: training phases, and the span from the first start to the last end."""
    ran = ([high] if high else []) + lows
    ok = all(r["status"] == "ok" for r in ran)
    out: dict = {"status": [r["status"] for r in ran]}
    if high is not None and high["status"] == "ok":
        out["high_train_s"] = train_phase(high)
        out["high_end"] = high["times"][-1]
    out["low_train_s"] = [train_phase(r) if r["status"] == "ok" else None for r in lows]
    if ok:
        out["start"] = min(r["proc_start"] for r in ran)
        out["lows_end"] = max(r["times"][-1] for r in lows)
    return out


def summarise(scenario: dict) -> None:
    arms = scenario["arms"]
    alone = arms.get("alone", {})
    lows_only = arms.get("lows-only", {})
    lows_span = (lows_only["lows_end"] - lows_only["start"]) if "start" in lows_only else None
    summary = {}
    for arm, e in arms.items():
        if arm in ("alone", "lows-only"):
            continue
        row: dict = {}
        if e.get("high_train_s") and alone.get("high_train_s"):
            row["high_vs_alone"] = alone["high_train_s"] / e["high_train_s"]
        row["low_vs_alone"] = [a / t if a and t else None for a, t in
                               zip(alone.get("low_train_s", []), e.get("low_train_s", []))]
        if lows_span and "start" in e and e.get("high_train_s"):
            row["low_vs_leftover"] = (e["high_train_s"] + lows_span) / (e["lows_end"] - e["start"])
        summary[arm] = row
    scenario["summary"] = summary


def print_table(results: dict) -> None:
    print("| scenario | arm | high vs alone | low vs alone | low vs leftover |")
    print("|---|---|---|---|---|")
    for name, scenario in results["scenarios"].items():
        for arm, row in scenario.get("summary", {}).items():
            high = row.get("high_vs_alone")
            lows = ", ".join(f"{x:.3f}" for x in row.get("low_vs_alone", []) if x) or "-"
            left = row.get("low_vs_leftover")
            print(f"| {name} | {arm} | {high:.3f} | {lows} | {left:.3f} |" if high and left else
                  f"| {name} | {arm} | {high if high else '-'} | {lows} | {left if left else '-'} |")


if __name__ == "__main__":
    raise SystemExit(main())
