#!/usr/bin/env python3
"""What an allocation costs with the hook: cuMemAlloc + cuMemFree pairs, side by side in one run.

Arms, each the same program (tests/c/build/nvtest: init, context, then N pairs of alloc:SIZE and
free:0 between two clock stamps) against a real nvshare-scheduler:
  plain      no hook
  hook       libnvshare.so in a registered job (small allocations from the budget each answer leaves)
  hook-ask   the same with NVSHARE_ALLOC_BUDGET=off (a question to the daemon for every allocation)
Sizes below 2 MiB are the small ones; larger ones are backed to be swappable and always ask.
Every arm runs --rounds times in rotated order; the report gives the median microseconds per pair
and each hooked arm over plain.

  python3 bench/bench_alloc.py --out DIR [--count 1000] [--rounds 3] [--sizes 4096,262144,67108864]
  python3 bench/bench_alloc.py --out DIR --smoke-cpu     # the fake driver of tests/c, no GPU

It writes DIR/results.json and prints a markdown table (docs/benchmarks.md keeps it).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import REPO, Scheduler, clean_env, gpu_info  # noqa: E402

NVTEST = REPO / "tests" / "c" / "build" / "nvtest"
SMOKE_UUID = "GPU-fa4e0000-0000-0000-0000-000000000000"
ARMS = ("plain", "hook", "hook-ask")


def build() -> None:
    subprocess.run(["make", "-s", "-C", str(REPO / "tests" / "c")], check=True)
    from nvshare_slurm import libnvshare_path
    if not libnvshare_path().exists():
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=REPO, check=True)


def pairs_us(env: dict, size: int, count: int) -> float:
    """Microseconds per alloc+free pair, from the program's own clock stamps."""
    steps = ["init", "ctx:0", "stamp"] + [s for _ in range(count) for s in (f"alloc:{size}", "free:0")] \
        + ["stamp"]
    run = subprocess.run([str(NVTEST), *steps], env=env, capture_output=True, text=True, timeout=600)
    failed = [line for line in run.stdout.splitlines() if "rc=" in line and not line.endswith("rc=0")]
    if run.returncode != 0 or failed:
        raise RuntimeError(f"nvtest failed (rc {run.returncode}): {failed[:3]} {run.stderr[-800:]}")
    stamps = [int(line.split()[1]) for line in run.stdout.splitlines() if line.startswith("stamp ")]
    return (stamps[1] - stamps[0]) / count / 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="4096,262144,67108864")
    ap.add_argument("--smoke-cpu", action="store_true")
    args = ap.parse_args()
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes: not a list of byte counts: {args.sizes}")
    if args.count < 1 or args.rounds < 1 or any(s < 1 for s in sizes):
        ap.error("--count, --rounds and every size must be 1 or more")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    build()
    info = gpu_info(args.smoke_cpu)
    base = clean_env()
    if args.smoke_cpu:
        base.update(LD_LIBRARY_PATH=str(REPO / "tests" / "c" / "build"),
                    FAKE_CUDA_DEVICES=f"{SMOKE_UUID}:16G")
    else:
        base["CUDA_VISIBLE_DEVICES"] = info["uuid"]
    work = Path(tempfile.mkdtemp(prefix="nvalloc-", dir="/tmp"))
    sched = Scheduler("auto", work / "sched", out / "scheduler.log",
                      [{"uuid": SMOKE_UUID, "memory": "16G"}] if args.smoke_cpu else None,
                      {"log_level": "info"})
    times: dict[str, dict[int, list[float]]] = {a: {s: [] for s in sizes} for a in ARMS}
    try:
        _, hooked = sched.job_env(base)
        envs = {"plain": base, "hook": hooked, "hook-ask": dict(hooked, NVSHARE_ALLOC_BUDGET="off")}
        for rnd in range(args.rounds):
            order = ARMS[rnd % len(ARMS):] + ARMS[:rnd % len(ARMS)]
            for size in sizes:
                for arm in order:
                    times[arm][size].append(pairs_us(envs[arm], size, args.count))
    finally:
        sched.stop()
    med = {a: {s: statistics.median(v) for s, v in by.items()} for a, by in times.items()}
    results = {"gpu": info, "date": datetime.date.today().isoformat(), "count": args.count,
               "rounds": args.rounds, "command": "python3 bench/bench_alloc.py " + " ".join(sys.argv[1:]),
               "us_per_pair": {a: {str(s): v for s, v in by.items()} for a, by in times.items()}}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    lines = [f"### cuMemAlloc + cuMemFree with the hook ({info['name']}, {results['date']})", "",
             f"Measured with `{results['command']}`: {args.count} pairs per run, {args.rounds} rounds, "
             "arms rotated; the median µs per pair.", "",
             "| size | plain µs | hook µs | hook-ask µs | hook / plain | hook-ask / plain |",
             "|---|---|---|---|---|---|"]
    for s in sizes:
        p, h, a = med["plain"][s], med["hook"][s], med["hook-ask"][s]
        lines.append(f"| {s} | {p:.1f} | {h:.1f} | {a:.1f} | {h / p:.2f} | {a / p:.2f} |")
    text = "\n".join(lines) + "\n"
    (out / "alloc.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
