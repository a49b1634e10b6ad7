"""bench/bench_alloc.py on the fake driver: every arm measured with a real daemon, a table written,
and bad arguments refused clearly."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

BENCH = REPO / "bench" / "bench_alloc.py"


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=REPO, text=True, capture_output=True,
                          timeout=300)


def test_smoke_run_measures_every_arm_and_size(tmp_path):
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("make and a C compiler are needed")
    run = bench("--out", str(tmp_path), "--smoke-cpu", "--count", "40", "--rounds", "2",
                "--sizes", "4096,4194304")
    assert run.returncode == 0, run.stdout + run.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    assert set(res["us_per_pair"]) == {"plain", "hook", "hook-ask"}
    for arm, by_size in res["us_per_pair"].items():
        assert set(by_size) == {"4096", "4194304"}
        assert all(len(v) == 2 and all(x > 0 for x in v) for v in by_size.values()), (arm, by_size)
    assert "| 4096 |" in run.stdout and "| 4194304 |" in run.stdout
    assert (tmp_path / "alloc.md").read_text() == run.stdout.rstrip("\n") + "\n"


def test_bad_arguments_are_clear_errors(tmp_path):
    run = bench("--out", str(tmp_path), "--sizes", "4k")
    assert run.returncode == 2 and "--sizes: not a list of byte counts: 4k" in run.stderr
    run = bench("--out", str(tmp_path), "--count", "0")
    assert run.returncode == 2 and "must be 1 or more" in run.stderr
