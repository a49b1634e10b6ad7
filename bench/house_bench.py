#!/usr/bin/env python3
"""Two builds of libnvshare.so side by side on the fake driver: a house change's before and after.

A refactoring of the hook (issue 41: no behaviour change) must cost nothing where the hook is hot.
This builds the hook twice with the same compiler and flags (buildtools/hook_build.py of each
tree), "before" from a git revision (`git archive`, no worktree), "after" from the working tree
(a copy taken at the start), and measures both in one run, in rounds, the side that goes first
alternating from round to round (A B, B A, A B, ...):

  launch       ns per cuLaunchKernel through the hook, lock held, no contention (bench/bench_launch.c,
               its child mode: LAUNCHES empty kernels after a warm-up; also without the hook, for scale)
  alloc        ns per cuMemAlloc_v2 through the hook, a real nvshare-scheduler answering: a small size
               (admitted from the budget each answer leaves) and a swappable one (a question each),
               each followed by its cuMemFree_v2 (tests/c/nvtest's allocfree action)
  hand-over    two processes of 2 ms kernels (a synchronise after each) in exclusive turns of
               SWITCH_MS (auto_share: turns, switch_time_mode: fixed): the GPU's idle time from one
               holder's last kernel's end to the next holder's first kernel's start, from the fake
               driver's trace; p50 and p99 over every switch of every round. Twice: passed by the
               HANDOFF eventfd (turn_handoff: true, the default) and by the daemon's grant
               (turn_handoff: false: LOCK_RELEASED, then LOCK_GRANT, which runs the grant path).

The daemon is the working tree's, started as the tests start it (tests/conftest.py's Scheduler:
the fake GPUs, debug log). Prints a table (before, after, after/before) and writes it as markdown
with --out; --json writes every sample.

  python3 bench/house_bench.py [--before e9cdbdd] [--rounds 6] [--out FILE.md] [--json FILE]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
for path in (str(REPO), str(TESTS)):
    if path not in sys.path:
        sys.path.insert(0, path)
from conftest import FAKE_GPUS, Scheduler  # noqa: E402
from gpu_bench import percentile  # noqa: E402
from helpers_hook import BUILD, NVTEST  # noqa: E402

GPU0 = FAKE_GPUS[0]["uuid"]
SMALL, SWAPPABLE = 4096, 4 << 20
SIDES = ("before", "after")


def log(msg: str) -> None:
    print(f"house_bench: {msg}", flush=True)


# ---- building the two libraries --------------------------------------------------------------

def build_hook(tree: Path, out: Path) -> Path:
    """libnvshare.so from tree/csrc with tree/buildtools/hook_build.py's flags."""
    flags = runpy.run_path(str(tree / "buildtools" / "hook_build.py"))
    sources = sorted(str(p.relative_to(tree)) for p in (tree / "csrc").glob("*.c"))
    lib = out / "libnvshare.so"
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc", *flags["HOOK_CFLAGS"], "-Icsrc", "-shared", *sources, *flags["HOOK_LDFLAGS"],
                    "-o", str(lib), *(f"-l{name}" for name in flags["HOOK_LIBRARIES"])],
                   cwd=tree, check=True)
    return lib


def build(work: Path, before: str) -> dict[str, Path]:
    revision = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", before], check=True,
                              capture_output=True, text=True).stdout.strip()
    trees = {side: work / "src" / side for side in SIDES}
    trees["before"].mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "csrc", "buildtools"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(trees["before"])], input=archive, check=True)
    for part in ("csrc", "buildtools"):
        shutil.copytree(REPO / part, trees["after"] / part)
    libs = {side: build_hook(trees[side], work / "lib" / side) for side in SIDES}
    subprocess.run(["make", "-s", "-C", str(REPO / "tests" / "c")], check=True)
    subprocess.run(["cc", "-O2", "-std=gnu11", "-Wall", "-o", str(work / "bench_launch"),
                    str(REPO / "bench" / "bench_launch.c"), "-ldl"], check=True)
    log(f"before = {revision} ({libs['before']}), after = the working tree ({libs['after']})")
    return libs


# ---- the measurements ------------------------------------------------------------------------

def base_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVSHARE_", "SLURM_", "FAKE_CUDA_"))}
    env["LD_LIBRARY_PATH"] = str(BUILD)
    env["PYTHONPATH"] = str(REPO)
    env.pop("LD_PRELOAD", None)
    return env


class Jobs:
    """Jobs registered with one scheduler, on fake GPU 0."""

    def __init__(self, sched: Scheduler):
        self.sched = sched
        self.next = 0

    def env(self, lib: Path | None, **extra: str) -> dict:
        self.next += 1
        self.sched.client().register_job(self.next, uid=os.getuid(), gid=os.getgid(), gpu_index=[0])
        env = base_env()
        env.update(NVSHARE_SOCKET=self.sched.socket, NVSHARE_JOB_ID=str(self.next), SLURM_STEP_ID="0",
                   CUDA_VISIBLE_DEVICES=GPU0, NVSHARE_MANAGED_GPUS=GPU0, **extra)
        if lib is not None:
            env["LD_PRELOAD"] = str(lib)
        return env


def launch_ns(work: Path, env: dict, launches: int) -> float:
    run = subprocess.run([str(work / "bench_launch"), str(launches)], env=dict(env, BENCH_LAUNCH_CHILD="1"),
                         capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise RuntimeError(f"bench_launch failed: {run.stdout} {run.stderr[-1500:]}")
    return float(run.stdout.split()[0])   # issue time per launch (the second figure adds the sync)


def alloc_ns(env: dict, counts: dict[int, int]) -> dict[int, float]:
    """Median ns per cuMemAlloc_v2 for each size (nvtest's allocfree: each one freed at once)."""
    steps = ["init", "ctx:0"] + [f"allocfree:{size}:{n}" for size, n in counts.items()]
    run = subprocess.run([str(NVTEST), *steps], env=env, capture_output=True, text=True, timeout=300)
    found = {}
    for line in run.stdout.splitlines():
        fields = line.split()
        if fields[:1] == ["allocfree"] and fields[-1] == "rc=0":
            found[int(fields[1])] = float(fields[4])
    if run.returncode != 0 or set(found) != set(counts):
        raise RuntimeError(f"nvtest allocfree failed (rc {run.returncode}): {run.stdout[-800:]} "
                           f"{run.stderr[-800:]}")
    return found


def handover_gaps_ms(work: Path, lib: Path, handoff: bool, switch_ms: float, kernels: int,
                     tag: str) -> list[float]:
    """GPU idle time at each switch between two processes taking exclusive turns."""
    workdir = Path(tempfile.mkdtemp(prefix="h", dir=work / "sched"))
    sched = Scheduler(workdir, {"auto_share": "turns", "turn_handoff": handoff,
                                "switch_time_mode": "fixed", "switch_time_fixed": switch_ms / 1000})
    sched.start()
    trace = workdir / "trace"
    try:
        jobs = Jobs(sched)
        procs = [subprocess.Popen([str(NVTEST), "init", "ctx:0", f"burst:2000:{kernels}:0"],
                                  env=jobs.env(lib, FAKE_CUDA_TRACE=str(trace)), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            if proc.returncode != 0 or not out.rstrip().endswith("done"):
                raise RuntimeError(f"{tag}: nvtest failed (rc {proc.returncode}): {out[-500:]} {err[-1500:]}")
    finally:
        sched.stop()
    rows = []
    for line in trace.read_text().splitlines():
        pid, gpu, start, end = line.split()[:4]
        if gpu == GPU0:
            rows.append((int(pid), int(start), int(end)))
    rows.sort(key=lambda r: r[1])
    gaps = [(b[1] - a[2]) / 1e6 for a, b in zip(rows, rows[1:], strict=False) if a[0] != b[0]]
    overlapping = [g for g in gaps if g < 0]
    if overlapping:
        raise RuntimeError(f"{tag}: {len(overlapping)} switches overlapped (two holders at once)")
    shutil.rmtree(workdir, ignore_errors=True)
    return gaps


# ---- one run ---------------------------------------------------------------------------------

METRICS = [  # key, label, unit
    ("launch", "launch, ns per cuLaunchKernel (lock held)", "ns"),
    ("alloc_small", f"allocation, ns per cuMemAlloc_v2 of {SMALL // 1024} KiB (budget)", "ns"),
    ("alloc_swappable", f"allocation, ns per cuMemAlloc_v2 of {SWAPPABLE >> 20} MiB (swappable, asks)", "ns"),
    ("handoff_p50", "hand-over by HANDOFF eventfd, p50", "ms"),
    ("handoff_p99", "hand-over by HANDOFF eventfd, p99", "ms"),
    ("grant_p50", "hand-over by grant (turn_handoff off), p50", "ms"),
    ("grant_p99", "hand-over by grant (turn_handoff off), p99", "ms"),
]


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="nvs-house-", dir="/tmp"))
    (work / "sched").mkdir()
    os.chmod(work, 0o755)
    samples: dict[str, dict[str, list[float]]] = {side: {} for side in (*SIDES, "none")}

    def add(side: str, key: str, value: float | list[float]) -> None:
        samples[side].setdefault(key, []).extend(value if isinstance(value, list) else [value])

    try:
        libs = build(work, args.before)
        daemon_dir = work / "sched" / "main"
        daemon_dir.mkdir()
        sched = Scheduler(daemon_dir, {})
        sched.start()
        jobs = Jobs(sched)
        try:
            started = time.monotonic()
            for r in range(args.rounds):
                order = SIDES if r % 2 == 0 else SIDES[::-1]
                for side in order:
                    lib = libs[side]
                    add(side, "launch", launch_ns(work, jobs.env(lib), args.launches))
                    sizes = alloc_ns(jobs.env(lib),
                                     {SMALL: args.small_allocs, SWAPPABLE: args.swappable_allocs})
                    add(side, "alloc_small", sizes[SMALL])
                    add(side, "alloc_swappable", sizes[SWAPPABLE])
                    for handoff, key in ((True, "handoff"), (False, "grant")):
                        gaps = handover_gaps_ms(work, lib, handoff, args.switch_ms, args.kernels,
                                                f"round {r + 1} {side} {key}")
                        add(side, key, gaps)
                        add(side, f"{key}_round_p50", percentile(gaps, 50))
                        add(side, f"{key}_round_p99", percentile(gaps, 99))
                add("none", "launch", launch_ns(work, jobs.env(None), args.launches))
                log(f"round {r + 1}/{args.rounds} done ({time.monotonic() - started:.0f} s): "
                    + ", ".join(f"{side} launch {samples[side]['launch'][-1]:.1f} ns, "
                                f"small {samples[side]['alloc_small'][-1]:.0f} ns, "
                                f"swappable {samples[side]['alloc_swappable'][-1] / 1000:.1f} us"
                                for side in SIDES))
        finally:
            sched.stop()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    figures: dict[str, dict[str, float]] = {}
    for side in SIDES:
        s = samples[side]
        figures[side] = {"launch": statistics.median(s["launch"]),
                         "alloc_small": statistics.median(s["alloc_small"]),
                         "alloc_swappable": statistics.median(s["alloc_swappable"]),
                         "handoff_p50": percentile(s["handoff"], 50),
                         "handoff_p99": percentile(s["handoff"], 99),
                         "grant_p50": percentile(s["grant"], 50), "grant_p99": percentile(s["grant"], 99),
                         "switches_handoff": len(s["handoff"]), "switches_grant": len(s["grant"])}
        for key in ("launch", "alloc_small", "alloc_swappable", "handoff_round_p50", "handoff_round_p99",
                    "grant_round_p50", "grant_round_p99"):
            figures[side][f"{key}_range"] = (min(s[key]), max(s[key]))
    return {"date": datetime.date.today().isoformat(), "before": args.before, "rounds": args.rounds,
            "settings": {k: getattr(args, k) for k in ("launches", "small_allocs", "swappable_allocs",
                                                        "kernels", "switch_ms")},
            "machine": f"{platform.node()}, {os.cpu_count()} cores", "figures": figures,
            "launch_without_hook": statistics.median(samples["none"]["launch"]), "samples": samples}


def shown(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:.3f} ms"
    return f"{value:.1f} ns" if value < 10000 else f"{value / 1000:.1f} us"


def table(result: dict) -> str:
    f = result["figures"]
    lines = ["| measure | before | after | after / before |", "|---|---|---|---|"]
    for key, label, unit in METRICS:
        b, a = f["before"][key], f["after"][key]
        lines.append(f"| {label} | {shown(b, unit)} | {shown(a, unit)} | {a / b:.3f} |")
    s = result["settings"]
    lines.append("")
    lines.append(f"{result['rounds']} rounds, the side that went first alternating; launch: median of "
                 f"the rounds' {s['launches']:,} launches each ({result['launch_without_hook']:.1f} ns "
                 f"without the hook); allocation: median of the rounds' medians of {s['small_allocs']} and "
                 f"{s['swappable_allocs']} calls; hand-over: every switch of every round pooled "
                 f"({f['before']['switches_handoff']} / {f['after']['switches_handoff']} by HANDOFF, "
                 f"{f['before']['switches_grant']} / {f['after']['switches_grant']} by grant), two "
                 f"processes of {s['kernels']} kernels of 2 ms each in {s['switch_ms']:g} ms turns.")
    lines.append("")
    lines.append("The rounds one by one (lowest - highest of the rounds):")
    lines.append("")
    lines.append("| measure | before | after |")
    lines.append("|---|---|---|")
    for key, label, unit in (("launch", "launch", "ns"), ("alloc_small", "allocation 4 KiB", "ns"),
                             ("alloc_swappable", "allocation 4 MiB", "ns"),
                             ("handoff_round_p50", "HANDOFF p50", "ms"),
                             ("handoff_round_p99", "HANDOFF p99", "ms"),
                             ("grant_round_p50", "grant p50", "ms"), ("grant_round_p99", "grant p99", "ms")):
        cells = [" - ".join(shown(v, unit) for v in f[side][f"{key}_range"]) for side in SIDES]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="e9cdbdd", help="the git revision built as 'before'")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--launches", type=int, default=200000)
    ap.add_argument("--small-allocs", type=int, default=2000)
    ap.add_argument("--swappable-allocs", type=int, default=200)
    ap.add_argument("--kernels", type=int, default=1000,
                    help="kernels of 2 ms per process per hand-over run")
    ap.add_argument("--switch-ms", type=float, default=20.0)
    ap.add_argument("--out", help="write the table here as markdown")
    ap.add_argument("--json", help="write every sample here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    # The daemon (tests/conftest.py's Scheduler: python -m nvshare_slurm.daemon) is this tree's.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    result = run(args)
    text = table(result)
    print(text)
    if args.out:
        Path(args.out).write_text(f"Measured {result['date']} ({result['machine']}), before = {args.before}, "
                                  f"after = the working tree; fake driver.\n\n{text}\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
