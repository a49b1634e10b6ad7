"""Every kernel, copy and set one PyTorch process ran on the GPU, with their times since the epoch, so that
two processes' timelines can be laid side by side (issue 42: what ran beside a server's slow requests).

serve_torch.py and tests/gpu/train.py take --kernel-trace FILE (bench_mixes.py --gpu-times passes it):

    trace = KernelTrace(path, host=True)   # host: the CUDA runtime and driver calls too, each with its
    trace.start()                          # host time (a server: which of its time was launches, which
    ...                                    # synchronises)
    trace.stop()                           # writes FILE: compact JSON, see compact()

It is torch.profiler with CUDA activities (CUPTI): no CPU operator events, so a host-bound server pays for
its launches being recorded (a few us each), not for every operator. The profiler's timestamps have a base
of their own; start() and stop() each launch one anchor kernel (torch.cuda._sleep) just after reading
time.time_ns(), and the anchor's runtime call (a host timestamp) gives the offset to the epoch: the
largest of the anchors' (a call can only come later than its read: the first one after start() came up
to 12 ms late on the H200, the profiler setting itself up).

compact(chrome_trace, anchors) is pure (tests/unit/test_kernel_trace.py runs it on a made-up trace), and
so is kernel_overlap.py, which reads these files.
"""
from __future__ import annotations

import json
import os
import tempfile
import time

ANCHOR = "spin_kernel"            # torch.cuda._sleep's kernel
GPU_CATS = {"kernel": "k", "gpu_memcpy": "c", "gpu_memset": "s"}
HOST_CATS = ("cuda_runtime", "cuda_driver")


def compact(trace: dict, anchors: list[int], host: bool) -> dict:
    """A chrome trace of torch.profiler (its traceEvents, "ts" and "dur" in us, args.correlation) and
    the epoch ns read just before each anchor kernel's launch, in order (the largest offset counts), to:
      {"t0_ns": epoch ns that the times below count from, "offsets_ns": [per anchor], "anchor": "runtime"
       (each anchor's runtime call found), "kernel" (only its GPU start: later by the launch's latency) or
       "none" (no anchor found: times are the profiler's own, t0_ns 0),
       "names": [...], "gpu": [[start_us, dur_us, name, kind k|c|s, stream, launched_us or null], ...]
       by start, "host": [[start_us, dur_us, name], ...] by start (with host)}
    Times are us from t0_ns, to 0.1 us; launched_us is the end of the runtime or driver call that made the
    GPU record (its correlation: the work was in the queue from then), where the trace has it; the anchors
    are left out."""
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"
              and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    calls = [e for e in events if e.get("cat") in HOST_CATS]
    by_corr = {}
    for e in calls:
        c = (e.get("args") or {}).get("correlation")
        if c is not None:
            by_corr.setdefault(c, e)
    marks = [e for e in gpu if ANCHOR in str(e.get("name", ""))]
    offsets, kind = [], "none"
    for epoch_ns, mark in zip(anchors, marks, strict=False):   # the anchors were launched in order
        call = by_corr.get((mark.get("args") or {}).get("correlation"))
        if call is not None:
            offsets.append(epoch_ns - round(call["ts"] * 1000))
            kind = "runtime" if kind in ("none", "runtime") else "mixed"
        else:
            offsets.append(epoch_ns - round(mark["ts"] * 1000))
            kind = "kernel" if kind in ("none", "kernel") else "mixed"
    offset = max(offsets) if offsets else 0   # a call late after its epoch read gives a lower one
    ts0 = min((e["ts"] for e in gpu), default=0.0)   # profiler us; t0_ns on the epoch
    t0_ns = round(ts0 * 1000) + offset
    names: list[str] = []
    index: dict[str, int] = {}

    def name_of(e: dict) -> int:
        n = str(e.get("name", ""))[:120]
        if n not in index:
            index[n] = len(names)
            names.append(n)
        return index[n]

    def rel(ts: float) -> float:
        return round(ts - ts0, 1)

    out_gpu = []
    for e in gpu:
        if ANCHOR in str(e.get("name", "")):
            continue
        args = e.get("args") or {}
        call = by_corr.get(args.get("correlation"))
        out_gpu.append([rel(e["ts"]), round(e["dur"], 1), name_of(e), GPU_CATS[e["cat"]], args.get("stream"),
                        rel(call["ts"] + call["dur"]) if call is not None else None])
    out = {"t0_ns": t0_ns, "offsets_ns": offsets, "anchor": kind, "names": names, "gpu": out_gpu}
    if host:
        out["host"] = [[rel(e["ts"]), round(e["dur"], 1), name_of(e)]
                       for e in sorted(calls, key=lambda e: e["ts"])]
    return out


class KernelTrace:
    """The profiler of one process over start() .. stop(); FILE gets compact()'s JSON. Without a path it
    does nothing (the scripts' default)."""

    def __init__(self, path: str, host: bool = False):
        self.path, self.host = path, host
        self.prof = None
        self.anchors: list[int] = []

    def anchor(self) -> None:
        import torch
        torch.cuda.synchronize()
        self.anchors.append(time.time_ns())
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()

    def start(self) -> None:
        if not self.path or self.prof is not None:
            return
        from torch.profiler import ProfilerActivity, profile
        self.prof = profile(activities=[ProfilerActivity.CUDA])
        self.prof.start()
        self.anchor()   # on the H200 the first launch after start() came 0.2-12 ms after its epoch read
        self.anchor()

    def stop(self) -> None:
        if self.prof is None:
            return
        self.anchor()
        self.prof.stop()
        fd, tmp = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            self.prof.export_chrome_trace(tmp)
            with open(tmp) as fh:
                trace = json.load(fh)
        finally:
            os.unlink(tmp)
        self.prof = None
        with open(self.path, "w") as fh:
            json.dump(compact(trace, self.anchors, self.host), fh, separators=(",", ":"))
