"""bench/kernel_trace.py's compact form of a torch.profiler trace, and bench/kernel_overlap.py's account of
where a server's requests spent their time beside another job's GPU work (issue 42), on made-up traces."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import kernel_overlap  # noqa: E402
from kernel_trace import compact  # noqa: E402

BASE_US = 5_000_000.0


def near(ms: float):
    return pytest.approx(ms, abs=1e-3)

            # the profiler's own time base: 5 s after something


def x(cat: str, name: str, ts: float, dur: float, corr: int | None = None, stream: int = 7) -> dict:
    args = {} if corr is None else {"correlation": corr}
    if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
        args["stream"] = stream
    return {"ph": "X", "cat": cat, "name": name, "ts": BASE_US + ts, "dur": dur, "args": args}


def chrome(anchor_calls: bool = True) -> dict:
    ev = [
        {"ph": "M", "name": "process_name"},                       # not an X event: ignored
        x("kernel", "at::cuda::spin_kernel(long)", 10.0, 2.0, 1),
        x("kernel", "gemm", 100.0, 50.0, 2),
        x("gpu_memcpy", "Memcpy DtoH", 160.0, 4.0, 3),
        x("kernel", "at::cuda::spin_kernel(long)", 900.0, 2.0, 4),
        x("kernel", "orphan", 200.0, 1.0),                           # no correlation: no launch time
        x("cuda_runtime", "cudaLaunchKernel", 90.0, 5.0, 2),
        x("cuda_runtime", "cudaMemcpyAsync", 150.0, 3.0, 3),
        x("cuda_runtime", "cudaStreamSynchronize", 153.0, 12.0),
    ]
    if anchor_calls:
        ev += [x("cuda_runtime", "cudaLaunchKernel", 8.0, 1.0, 1),
               x("cuda_runtime", "cudaLaunchKernel", 898.0, 1.0, 4)]
    return {"traceEvents": ev}


def test_compact_puts_every_record_on_the_epoch_through_its_anchors_runtime_call():
    epoch0 = 1_700_000_000_000_000_000
    # the anchors' runtime calls began at profiler 8 us and 898 us: epoch0 and epoch0 + 890 us
    out = compact(chrome(), [epoch0, epoch0 + 890_000], host=True)
    assert out["anchor"] == "runtime"
    assert out["offsets_ns"] == [epoch0 - round((BASE_US + 8) * 1000)] * 2
    # t0 is the first GPU record's start (the first anchor, 2 us after its call)
    assert out["t0_ns"] == epoch0 + 2_000
    names = out["names"]
    kept = [(r[0], r[1], names[r[2]], r[3], r[4], r[5]) for r in out["gpu"]]
    assert kept == [(90.0, 50.0, "gemm", "k", 7, 85.0),      # launched: its call's end (90 + 5 - 10)
                    (150.0, 4.0, "Memcpy DtoH", "c", 7, 143.0),
                    (190.0, 1.0, "orphan", "k", 7, None)]  # the anchors left out
    assert [names[h[2]] for h in out["host"]] == ["cudaLaunchKernel", "cudaLaunchKernel", "cudaMemcpyAsync",
                                                  "cudaStreamSynchronize", "cudaLaunchKernel"]
    assert "host" not in compact(chrome(), [epoch0, epoch0 + 890_000], host=False)
    # a first anchor whose call came 12 ms after its epoch read (the profiler setting up): the second
    # anchor's offset, the larger, counts
    late = compact(chrome(), [epoch0 - 12_000_000, epoch0 + 890_000], host=False)
    assert late["offsets_ns"][1] - late["offsets_ns"][0] == 12_000_000 and late["t0_ns"] == out["t0_ns"]
    json.dumps(out)   # it is written as JSON


def test_compact_falls_back_to_the_anchor_kernels_start_and_says_so():
    out = compact(chrome(anchor_calls=False), [1_000_000_000], host=False)
    assert out["anchor"] == "kernel"
    assert out["t0_ns"] == 1_000_000_000          # the anchor kernel's own start is the epoch read
    nothing = compact({"traceEvents": [x("kernel", "gemm", 1.0, 1.0)]}, [], host=False)
    assert nothing["anchor"] == "none" and nothing["offsets_ns"] == []
    assert compact({"traceEvents": "not a list of events"}, [], host=False)["gpu"] == []


def test_union_in_counts_overlaps_once_and_only_inside_the_window():
    spans = [(0, 10), (5, 15), (20, 30), (40, 50)]
    assert kernel_overlap.union_in(spans, 0, 100) == 15 + 10 + 10
    assert kernel_overlap.union_in(spans, 8, 25) == 7 + 5
    assert kernel_overlap.union_in(spans, 31, 39) == 0
    assert kernel_overlap.union_in([], 0, 10) == 0


def trace(t0_ns: int, gpu: list, host: list | None = None) -> dict:
    names = ["k", "cudaLaunchKernel", "cudaStreamSynchronize"]
    out = {"t0_ns": t0_ns, "names": names, "gpu": [[s, d, 0, "k", 1, launched] for s, d, launched in gpu]}
    if host is not None:
        out["host"] = [[s, d, names.index(n)] for s, d, n in host]
    return out


def test_requests_split_a_slow_request_into_its_own_work_its_stalls_and_the_other_jobs():
    t0 = 1_000_000_000_000_000_000     # ns since the epoch
    s = t0 / 1e9
    # two requests of 10 ms: the first alone; in the second its kernel was ready at 12 ms and ran at
    # 15 ms, while the other job's 4 ms kernel ran from 11 to 15 ms
    server = {"arrivals": [s, s + 0.010], "step_starts": [s, s + 0.010], "times": [s + 0.010, s + 0.020]}
    own = trace(t0, [(1000.0, 2000.0, 990.0), (15000.0, 2000.0, 12000.0)],
                host=[(900.0, 90.0, "cudaLaunchKernel"), (1000.0, 2100.0, "cudaStreamSynchronize"),
                      (11900.0, 100.0, "cudaLaunchKernel"), (12000.0, 5100.0, "cudaStreamSynchronize")])
    other = trace(t0, [(11000.0, 4000.0, None), (25000.0, 1000.0, None)])
    rows = kernel_overlap.requests(server, own, other)
    assert [r["service"] for r in rows] == pytest.approx([10.0, 10.0], abs=1e-3)
    assert rows[0]["gpu"] == near(2.0) and rows[1]["gpu"] == near(2.0)
    assert rows[0]["stall"] == near(0.01) and rows[1]["stall"] == near(3.0)
    assert rows[0]["other"] == 0 and rows[1]["other"] == near(4.0)
    assert rows[1]["other_n"] == 1 and rows[1]["other_longest"] == near(4.0)
    assert rows[1]["sync"] == near(5.1) and rows[1]["launch"] == near(0.1)
    assert rows[1]["launches"] == 1
    alone = kernel_overlap.requests(server, own, None)
    assert [r["other"] for r in alone] == [0.0, 0.0] and "cpu" not in alone[0]
    # the serving thread's CPU time, where serve_torch gave it: a row each, and a line in the summary
    timed = kernel_overlap.requests(dict(server, cpu_ms=[9.5, 6.0]), own, other)
    assert [r["cpu"] for r in timed] == [9.5, 6.0]
    assert "| cpu |" in kernel_overlap.markdown(kernel_overlap.summarize(timed))
    assert "| cpu |" not in kernel_overlap.markdown(kernel_overlap.summarize(rows))


def test_summarize_says_which_metric_grew_with_the_slow_half():
    rows = [{m: 0.0 for m in kernel_overlap.METRICS} for _ in range(4)]
    for r, (service, other) in zip(rows, [(40, 1), (41, 2), (55, 14), (56, 15)], strict=True):
        r.update(service=float(service), other=float(other))
    out = kernel_overlap.summarize(rows)
    assert out["n"] == 4
    assert out["service"] == {"fast": 40.5, "slow": 55.5, "excess": 15.0}
    assert out["other"]["excess"] == 13.0 and out["stall"]["excess"] == 0.0
    text = kernel_overlap.markdown(out)
    assert "| other | 1.50 | 14.50 | +13.00 |" in text
    assert kernel_overlap.summarize(rows[:1]) == {"n": 1}
    assert "too few" in kernel_overlap.markdown({"n": 1})


def test_load_result_takes_serve_torchs_line_and_says_when_there_is_none(tmp_path):
    f = tmp_path / "out"
    f.write_text('warming up\n{"latencies_ms": [1.0], "arrivals": []}\n{"other": 1}\n')
    assert kernel_overlap.load_result(str(f))["latencies_ms"] == [1.0]
    f.write_text("nothing\n{broken\n")
    with pytest.raises(SystemExit, match="no serve_torch result line"):
        kernel_overlap.load_result(str(f))
