"""bench/bench_mixes.py (issue 27's mixed nodes) on the fake driver, with the real hook and daemon:
every arm of a mix is in the table, the swap pair has its span figure, and each mix its timeline.
The numbers of a fake-driver run mean nothing."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO
from test_bench_family import built  # noqa: F401  (the fixture: hook, fake driver, burst built)

BENCH = REPO / "bench"


def test_smoke_run_has_every_arm_the_swap_pairs_span_and_a_timeline_per_mix(built, tmp_path):  # noqa: F811
    run = subprocess.run([sys.executable, str(BENCH / "bench_mixes.py"), "--out", str(tmp_path),
                          "--mixes", "swap2,mix3", "--arms", "serial,colocate,nvshare", "--seconds", "1",
                          "--smoke-cpu"], cwd=REPO, text=True, capture_output=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    for mix in ("swap2", "mix3"):
        arms = res["mixes"][mix]
        assert sorted(arms) == ["colocate", "nvshare", "serial"]
        assert all(r["status"] == "ok" for r in arms.values()), arms
        assert arms["nvshare"]["done_x_serial"] > 0 and "done_x_serial" not in arms["serial"]
        svg = (tmp_path / f"timeline_{mix}.svg").read_text()
        assert svg.count("<rect") > 10 and "nvshare" in svg and ">serial<" not in svg
    table = (tmp_path / "table.md").read_text()
    assert "| swap2 | all | all done / serial |" in table
    assert all(len(e["spans"]) == e["steps"] for e in res["mixes"]["swap2"]["nvshare"]["jobs"])


def test_smoke_mix4_mem_every_job_finishes(built, tmp_path):  # noqa: F811
    """Issue 27's node: two memory-heavy jobs that do not fit together beside a training, the
    bursty job and a probe, with the real hook and daemon: every job finishes, and no holder is
    found unresponsive. One 4 s run on 6512b79 here lost a job that way (the turn holder was asked
    to move all its memory out and outlasted the drain grace), but the run depends on when the
    bursty job's reports flip: it passed in 3 of 3 others. tests/unit/test_mixes.py and
    test_fairness.py pin the fixes down on a fake clock."""
    run = subprocess.run([sys.executable, str(BENCH / "bench_mixes.py"), "--out", str(tmp_path),
                          "--mixes", "mix4-mem", "--arms", "nvshare", "--seconds", "3",
                          "--smoke-cpu"], cwd=REPO, text=True, capture_output=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    arm = json.loads((tmp_path / "results.json").read_text())["mixes"]["mix4-mem"]["nvshare"]
    assert [j["status"] for j in arm["jobs"]] == ["ok"] * 5, arm["jobs"]
    log = (tmp_path / "logs" / "mix4-mem-nvshare-scheduler.log").read_text()
    assert "did not release in time" not in log and "has not released the lock" not in log
