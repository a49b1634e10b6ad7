"""Where a server's requests spent their time, from kernel_trace.py's files of the server and of the job
beside it (issue 42: why some stretches of model.generate's requests ran at 40 ms and others at 55).

    python3 bench/kernel_overlap.py SERVER.json SERVER.ktrace [OTHER.ktrace] [--rows]

SERVER.json is serve_torch.py's result line (arrivals, step_starts, times: epoch seconds). Per request,
from its start to its result (its service, without the wait behind the request before), in ms:
  gpu      the server's own GPU work (the union of its kernels, copies and sets)
  stall    the server's work ready on the GPU and not running: per kernel, its start less the later of
           its launch call's end and the end of the work before it on its stream (alone this is the
           launch latency, some us a kernel; beside another job, the hardware's switch to the other
           context and its kernel under way)
  sync     the server's host in synchronising calls (*Synchronize, cudaMemcpy/cuMemcpy without Async)
  launch   the server's host in launch calls (*Launch*), and how many
  other    the other job's GPU work in the request (the union), how many of its records, the longest
  cpu      the serving thread's CPU time (serve_torch's cpu_ms), where the result has it
summarize() compares the slower half of the requests with the faster half, metric by metric: which of
them grew by what the service grew. Pure functions (tests/unit/test_kernel_trace.py).
"""
from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys

SYNC_WORDS = ("Synchronize",)
METRICS = ("service", "gpu", "stall", "sync", "launch", "launches", "other", "other_n", "other_longest")


def union_in(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """The length of the union of spans (sorted by start) within [lo, hi]."""
    total, end = 0.0, lo
    for a, b in spans:
        if b <= end:
            continue
        if a >= hi:
            break
        a = max(a, end)
        b = min(b, hi)
        if b > a:
            total += b - a
            end = b
    return total


def spans_of(trace: dict, t0_ns: int) -> list[tuple[float, float]]:
    """A trace's GPU records as (start, end) in us from t0_ns (an epoch ns), by start."""
    shift = (trace["t0_ns"] - t0_ns) / 1000
    return sorted((shift + r[0], shift + r[0] + r[1]) for r in trace["gpu"])


def stalls(trace: dict) -> list[tuple[float, float]]:
    """Per GPU record with a launch time: (its start, how long it was ready before it ran), us from the
    trace's t0_ns."""
    last: dict = {}
    out = []
    for start, dur, _name, _kind, stream, launched in trace["gpu"]:
        prev = last.get(stream)
        last[stream] = start + dur
        if launched is None:
            continue
        ready = launched if prev is None else max(launched, prev)
        out.append((start, max(0.0, start - ready)))
    return out


class Spans:
    """Items (start, end, ...) sorted by start, and those that overlap [lo, hi) found by bisection."""

    def __init__(self, items: list[tuple]):
        self.items = sorted(items, key=lambda x: x[0])
        self.starts = [x[0] for x in self.items]
        self.longest = max((x[1] - x[0] for x in self.items), default=0.0)

    def overlapping(self, lo: float, hi: float) -> list[tuple]:
        i = bisect.bisect_left(self.starts, lo - self.longest)
        j = bisect.bisect_left(self.starts, hi)
        return [x for x in self.items[i:j] if x[1] > lo]


def requests(server: dict, trace: dict, other: dict | None) -> list[dict]:
    """One row per request of server (serve_torch's result) with the metrics above, in ms."""
    t0 = trace["t0_ns"]   # every time below in us from it
    t0_s = t0 / 1e9
    own = Spans(spans_of(trace, t0))
    waits = sorted(stalls(trace))
    wait_starts = [t for t, _ in waits]
    names = trace["names"]
    host = Spans([(h[0], h[0] + h[1], names[h[2]]) for h in trace.get("host", [])])
    theirs = Spans(spans_of(other, t0) if other else [])
    rows = []
    cpu = server.get("cpu_ms")
    cpu = cpu if cpu and len(cpu) == len(server["times"]) else None
    for k, (arrival, s, e) in enumerate(zip(server["arrivals"], server["step_starts"], server["times"],
                                            strict=True)):
        lo, hi = (s - t0_s) * 1e6, (e - t0_s) * 1e6
        i, j = bisect.bisect_left(wait_starts, lo), bisect.bisect_left(wait_starts, hi)
        row = {"arrival": arrival, "start": s, "service": (e - s) * 1000,
               "gpu": union_in(own.overlapping(lo, hi), lo, hi) / 1000,
               "stall": sum(w for _, w in waits[i:j]) / 1000}
        calls = host.overlapping(lo, hi)
        row["sync"] = sum(min(b, hi) - max(a, lo) for a, b, n in calls
                          if any(w in n for w in SYNC_WORDS) or n in ("cudaMemcpy", "cuMemcpy")) / 1000
        launches = [(a, b) for a, b, n in calls if "Launch" in n]
        row["launch"] = sum(min(b, hi) - max(a, lo) for a, b in launches) / 1000
        row["launches"] = len(launches)
        inside = theirs.overlapping(lo, hi)
        row["other"] = union_in(inside, lo, hi) / 1000
        row["other_n"] = len(inside)
        row["other_longest"] = max(((b - a) / 1000 for a, b in inside), default=0.0)
        if cpu is not None:
            row["cpu"] = cpu[k]
        rows.append(row)
    return rows


def summarize(rows: list[dict]) -> dict:
    """The faster and the slower half of the requests (by service): each metric's mean in both, and the
    slower half's excess over the faster."""
    if len(rows) < 2:
        return {"n": len(rows)}
    ranked = sorted(rows, key=lambda r: r["service"])
    half = len(ranked) // 2
    fast, slow = ranked[:half], ranked[-half:]
    out: dict = {"n": len(rows)}
    for m in METRICS + (("cpu",) if all("cpu" in r for r in rows) else ()):
        f = statistics.fmean(r[m] for r in fast)
        s = statistics.fmean(r[m] for r in slow)
        out[m] = {"fast": round(f, 3), "slow": round(s, 3), "excess": round(s - f, 3)}
    return out


def markdown(summary: dict) -> str:
    if summary.get("n", 0) < 2:
        return f"(n {summary.get('n', 0)}: too few requests)"
    lines = ["| ms per request (mean) | faster half | slower half | excess |", "|---|---|---|---|"]
    for m in METRICS + (("cpu",) if "cpu" in summary else ()):
        v = summary[m]
        lines.append(f"| {m} | {v['fast']:.2f} | {v['slow']:.2f} | {v['excess']:+.2f} |")
    return "\n".join(lines)


def load_result(path: str, what: str = "serve_torch") -> dict:
    """serve_torch's result (or `what`'s: burst's has its latencies too): the last line of the file that
    is a JSON object with its latencies."""
    with open(path) as fh:
        for line in reversed(fh.read().splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if "latencies_ms" in doc:
                    return doc
    raise SystemExit(f"kernel_overlap: no {what} result line in {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("server_json")
    ap.add_argument("server_trace")
    ap.add_argument("other_trace", nargs="?")
    ap.add_argument("--rows", action="store_true", help="every request's row too (JSON lines)")
    args = ap.parse_args()
    server = load_result(args.server_json)
    with open(args.server_trace) as fh:
        trace = json.load(fh)
    other = None
    if args.other_trace:
        with open(args.other_trace) as fh:
            other = json.load(fh)
    rows = requests(server, trace, other)
    print(markdown(summarize(rows)))
    if args.rows:
        for r in rows:
            print(json.dumps({k: round(v, 3) if isinstance(v, float) and k not in ("arrival", "start") else v
                              for k, v in r.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
