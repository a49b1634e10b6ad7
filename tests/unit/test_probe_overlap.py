"""bench/probe_overlap.py: a probe's requests split into hook, queue, run and back, and the other jobs'
kernels running at each one's launch, from burst's --gpu-times (synthetic jobs, known answers)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import probe_overlap  # noqa: E402

OFF = 1_000.0   # epoch seconds less globaltimer seconds in these jobs
NS = 1e9


def gt(epoch_s: float) -> int:
    """An epoch time as the GPU's globaltimer reads it."""
    return round((epoch_s - OFF) * NS)


def probe_job(requests: list[tuple[float, float, float, float, float]]) -> dict:
    """A probe of one kernel a step: (start, issued, kernel start, kernel end, synchronise returned)."""
    return {"kernels_per_step": 1, "gpu_kernels_unrecorded": 0,
            "step_starts": [r[0] for r in requests], "issued": [r[1] for r in requests],
            "times": [r[4] for r in requests], "latencies_ms": [(r[4] - r[0]) * 1000 for r in requests],
            "gpu_kernels": [[gt(r[2]), gt(r[3])] for r in requests]}


def other_job(kernels: list[tuple[float, float]]) -> dict:
    return {"kernels_per_step": 1, "gpu_kernels_unrecorded": 0, "times": [b for _, b in kernels],
            "step_starts": [a for a, _ in kernels], "issued": [a for a, _ in kernels],
            "latencies_ms": [1.0] * len(kernels), "gpu_kernels": [[gt(a), gt(b)] for a, b in kernels]}


def test_a_request_that_met_two_kernels_under_way_reads_both_and_its_parts():
    # request 0: alone (launch 10.000, kernel 10.0001-10.0011, its synchronise back at once: the
    # clocks' offset); request 1: launches held 0.2 ms on the host, then two other jobs' kernels run
    # on 1.5 and 0.8 ms, its synchronise back 0.02 ms after its kernel
    probe = probe_job([(10.0, 10.0, 10.0001, 10.0011, 10.0011),
                       (20.0, 20.0002, 20.0017, 20.0027, 20.00272)])
    a = other_job([(19.9995, 20.0017)])            # started before the launch, 1.5 ms left
    b = other_job([(19.9990, 20.0010)])            # 0.8 ms left
    rows = probe_overlap.requests(probe, [a, b])
    assert rows[0]["busy_n"] == 0 and rows[0]["other"] == pytest.approx(0.0)
    assert rows[0]["queue"] == pytest.approx(0.1, abs=1e-3)
    assert rows[0]["back"] == pytest.approx(0.0, abs=1e-3)
    assert rows[1]["back"] == pytest.approx(0.02, abs=1e-3)
    r = rows[1]
    assert r["hook"] == pytest.approx(0.2, abs=1e-3)
    assert r["queue"] == pytest.approx(1.5, abs=1e-3)
    assert r["run"] == pytest.approx(1.0, abs=1e-3)
    assert r["busy_n"] == 2 and r["left"] == pytest.approx(1.5, abs=1e-3)
    assert r["other"] == pytest.approx(1.5, abs=1e-3)   # the union from the launch to the probe's end
    assert r["latency"] == pytest.approx(2.72, abs=1e-3)


def test_the_slowest_tenth_is_compared_with_the_rest():
    reqs, others = [], []
    for i in range(20):
        t = 100.0 + i
        slow = i in (3, 11)
        k0 = t + (0.0021 if slow else 0.0001)
        reqs.append((t, t, k0, k0 + 0.001, k0 + 0.001))
        if slow:
            others.append((t - 0.0001, t + 0.0021))
    s = probe_overlap.summarize(probe_overlap.requests(probe_job(reqs), [other_job(others)]))
    assert s["n"] == 20 and s["slow_n"] == 2
    assert s["queue"]["excess"] == pytest.approx(2.0, abs=1e-3)
    assert s["busy_share"] == {"0": 0.9, "1": 0.1, "2": 0.0}
    text = probe_overlap.markdown(s)
    assert "| queue | 0.10 | 2.10 | +2.00 |" in text and "one 10%" in text


def test_unrecorded_kernels_are_refused_not_misplaced(tmp_path):
    probe = probe_job([(10.0, 10.0, 10.0001, 10.0011, 10.00112)] * 2)
    probe["gpu_kernels_unrecorded"] = 1
    path = tmp_path / "probe.out"
    path.write_text("burst: starting\n" + json.dumps(probe) + "\n")
    other = tmp_path / "other.out"
    other.write_text(json.dumps(other_job([(9.0, 9.001)])) + "\n")
    run = subprocess.run([sys.executable, str(Path(probe_overlap.__file__)), str(path), str(other)],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "not all recorded" in run.stderr
