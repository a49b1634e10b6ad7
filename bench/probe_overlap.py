"""Where a probe's or a burst server's requests waited, from burst's --gpu-times of every job in one arm
of bench_mixes (issue 42: mix3's 1 ms probe read 2.7-3.3 ms at p99 on the H200, 1.1 alone).

    python3 bench/probe_overlap.py PROBE.out OTHER.out [OTHER.out ...] [--rows]

Each file is a burst job's output (its JSON line: step_starts, issued, times in epoch seconds,
gpu_kernels as [start_ns, end_ns] of the GPU's %globaltimer, one clock for every context). The
globaltimer is put on the epoch by the probe's own requests: the smallest (synchronise returned) less
(its last kernel's end) is the offset, where the synchronise returned at once. Per request, in ms:
  hook     its launches held on the host (issued less start)
  queue    its first kernel's start less its launches' return: the GPU ran others' kernels meanwhile
  run      its kernels' first start to last end (time-slices shared with others' kernels stretch it)
  back     its synchronise's return less its last kernel's end
  busy_n   how many other jobs had a kernel running when its launches returned
  left     the longest time any such kernel still ran from then
  other    others' GPU work (the union) from its launches' return to its last kernel's end
summarize() compares the slower tenth of the requests with the rest, metric by metric. Pure functions
(tests/unit/test_probe_overlap.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_overlap import load_result, union_in  # noqa: E402

METRICS = ("latency", "hook", "queue", "run", "back", "busy_n", "left", "other")


def load(path: str) -> dict:
    """A burst job's result line (kernel_overlap.load_result)."""
    return load_result(path, "burst")


def per_step(job: dict) -> list[list[tuple[int, int]]]:
    """A job's recorded kernels by step (kernels_per_step each, in launch order); [] where some were
    not recorded (the fake driver, or past burst's slots): their order to steps is then unknown."""
    kernels = [tuple(k) for k in job.get("gpu_kernels") or []]
    per = job.get("kernels_per_step") or 0
    if not per or job.get("gpu_kernels_unrecorded") or len(kernels) < per * len(job["times"]):
        return []
    return [kernels[i * per:(i + 1) * per] for i in range(len(job["times"]))]


def offset_s(job: dict, steps: list[list[tuple[int, int]]]) -> float:
    """Epoch seconds less globaltimer seconds, from the job's own steps (see the module's text)."""
    return min(t - max(e for _, e in ks) / 1e9 for t, ks in zip(job["times"], steps, strict=True) if ks)


def requests(probe: dict, others: list[dict]) -> list[dict]:
    """One row per request of probe with the metrics above (ms), every time on the epoch."""
    steps = per_step(probe)
    if not steps:
        raise SystemExit("probe_overlap: the probe's kernels were not all recorded (run with --gpu-times)")
    off = offset_s(probe, steps)
    theirs = []   # (start, end, job) in epoch seconds
    for j, job in enumerate(others):
        theirs += [(a / 1e9 + off, b / 1e9 + off, j) for a, b in job.get("gpu_kernels") or []]
    theirs.sort()
    spans = [(a, b) for a, b, _ in theirs]
    rows = []
    for s, issued, t, ks in zip(probe["step_starts"], probe["issued"], probe["times"], steps, strict=True):
        first = min(a for a, _ in ks) / 1e9 + off
        last = max(b for _, b in ks) / 1e9 + off
        running = [(b, j) for a, b, j in theirs if a <= issued < b]
        rows.append({"latency": (t - s) * 1000, "hook": (issued - s) * 1000,
                     "queue": max(0.0, first - issued) * 1000, "run": (last - first) * 1000,
                     "back": (t - last) * 1000, "busy_n": len({j for _, j in running}),
                     "left": max(((b - issued) * 1000 for b, _ in running), default=0.0),
                     "other": union_in(spans, issued, last) * 1000})
    return rows


def summarize(rows: list[dict]) -> dict:
    """The slower tenth of the requests (by latency, at least one) against the rest: each metric's
    mean in both and the difference; and how often 0, 1 and 2+ other jobs had a kernel running."""
    if len(rows) < 2:
        return {"n": len(rows)}
    ranked = sorted(rows, key=lambda r: r["latency"])
    tail = max(1, len(ranked) // 10)
    rest, slow = ranked[:-tail], ranked[-tail:]
    out: dict = {"n": len(rows), "slow_n": tail}
    for m in METRICS:
        f = statistics.fmean(r[m] for r in rest)
        s = statistics.fmean(r[m] for r in slow)
        out[m] = {"rest": round(f, 3), "slow": round(s, 3), "excess": round(s - f, 3)}
    out["busy_share"] = {str(k): round(sum(1 for r in rows if min(r["busy_n"], 2) == k) / len(rows), 3)
                         for k in (0, 1, 2)}
    return out


def markdown(summary: dict) -> str:
    if summary.get("n", 0) < 2:
        return f"(n {summary.get('n', 0)}: too few requests)"
    lines = [f"| ms per request (mean) | the rest | the slowest {summary['slow_n']} | excess |",
             "|---|---|---|---|"]
    for m in METRICS:
        v = summary[m]
        lines.append(f"| {m} | {v['rest']:.2f} | {v['slow']:.2f} | {v['excess']:+.2f} |")
    b = summary["busy_share"]
    lines.append(f"\nOther jobs with a kernel running at a request's launch: none {b['0']:.0%}, "
                 f"one {b['1']:.0%}, two or more {b['2']:.0%}.")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("probe")
    ap.add_argument("others", nargs="+")
    ap.add_argument("--rows", action="store_true", help="every request's row, slowest first, as JSON")
    args = ap.parse_args()
    rows = requests(load(args.probe), [load(p) for p in args.others])
    if args.rows:
        for r in sorted(rows, key=lambda r: -r["latency"]):
            print(json.dumps({k: round(v, 3) for k, v in r.items()}))
    print(markdown(summarize(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
