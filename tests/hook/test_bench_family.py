"""bench/bench_family.py (issue 12's benchmark family) on the fake driver, with the real hook and
daemon: the harness the lead runs on the GPU must measure every unit, keep what it measured across
calls, and keep misses in its table. The numbers of a fake-driver run mean nothing; these tests
check what a user of the benchmark would notice."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO

BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))
import bench_family  # noqa: E402


@pytest.fixture(scope="module")
def built() -> None:
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("make and a C compiler are needed (the hook, the fake driver, tests/gpu/burst.c)")
    import nvshare_slurm
    if not nvshare_slurm.libnvshare_path().exists():
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=REPO, check=True,
                       capture_output=True)
    subprocess.run(["make", "-s", "-C", str(REPO / "tests" / "c")], check=True, capture_output=True)
    bench_family.build_burst()


def family(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "bench_family.py"), *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)


def test_smoke_run_measures_every_arm_then_resumes_with_the_rest(built, tmp_path):
    first = family("--out", str(tmp_path / "a"), "--smoke-cpu", "--seconds", "0.3",
                   "--members", "pair-b30-g5-fixed", "--arms", "serial,colocate,mps,nvshare")
    assert first.returncode == 0, first.stdout + first.stderr
    res = json.loads((tmp_path / "a" / "results.json").read_text())
    arms = res["members"]["pair-b30-g5-fixed"]
    assert arms["mps"]["status"] == "skipped"            # no MPS without a GPU, and it says so
    for arm in ("serial", "colocate", "nvshare"):
        assert arms[arm]["status"] == "ok", arms[arm]
    assert len(arms["nvshare"]["jobs"]) == 2
    steps = bench_family.MEMBERS["pair-b30-g5-fixed"].steps(0.3)
    assert all(j["steps"] == steps for j in arms["nvshare"]["jobs"])
    # The ratios come from this run's own serial arm: both jobs' steps, one job after the other.
    serial = arms["serial"]
    assert [j["proc"][0] >= i["proc"][1]
            for i, j in zip(serial["jobs"], serial["jobs"][1:], strict=False)] == [True]
    assert serial["train_phase"] == pytest.approx(sum(j["train_s"] for j in serial["jobs"]))
    assert arms["colocate"]["x_serial"] == pytest.approx(arms["colocate"]["train_phase"]
                                                         / serial["train_phase"])
    assert arms["nvshare"]["lock_intervals"], "the scheduler's log gave who held the GPU when"
    assert "| pair-b30-g5-fixed | 2 |" in first.stdout
    assert (tmp_path / "a" / "timeline_family_pair.svg").read_text().startswith("<svg")

    second = family("--out", str(tmp_path / "b"), "--smoke-cpu", "--seconds", "0.3", "--resume",
                    str(tmp_path / "a" / "results.json"), "--members", "pair-b30-g5-fixed,compute2-g20",
                    "--arms", "serial,colocate")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "pair-b30-g5-fixed/serial: running" not in second.stdout    # measured before: kept
    res2 = json.loads((tmp_path / "b" / "results.json").read_text())
    assert res2["members"]["pair-b30-g5-fixed"]["nvshare"]["t0"] == arms["nvshare"]["t0"]
    assert res2["members"]["compute2-g20"]["colocate"]["status"] == "ok"


def test_diagnostic_arms_and_each_jobs_start_up_phases(built, tmp_path):
    """colocate-hook preloads the hook with no daemon (it passes through), nvshare-corun-noswap runs
    corun with NVSHARE_SWAP=off; every job's start-up phases are kept, in order, per round."""
    run = family("--out", str(tmp_path), "--smoke-cpu", "--seconds", "0.3", "--hook-debug",
                 "--members", "pair-b30-g5-fixed", "--arms", "serial,colocate-hook,nvshare-corun-noswap")
    assert run.returncode == 0, run.stdout + run.stderr
    arms = json.loads((tmp_path / "results.json").read_text())["members"]["pair-b30-g5-fixed"]
    for arm in ("colocate-hook", "nvshare-corun-noswap"):
        assert arms[arm]["status"] == "ok", arms[arm]
        for job in arms[arm]["jobs"]:
            ph = job["phases"]
            order = ["exec", "init", "context", "module", "alloc", "slots", "warm", "first_step"]
            assert list(ph) == order, ph
            assert all(ph[a] <= ph[b] for a, b in zip(order, order[1:], strict=False)), ph
        assert arms[arm]["repeats"][0]["phases_ms"] == [j["phases"] for j in arms[arm]["jobs"]]
    logs = tmp_path / "logs"
    hook_err = (logs / "pair-b30-g5-fixed-colocate-hook-0.err").read_text()
    assert "connected to nvshare-scheduler" not in hook_err    # no daemon: the hook only passed through
    corun_err = (logs / "pair-b30-g5-fixed-nvshare-corun-noswap-0.err").read_text()
    assert re.search(r"pid \d+: @\d+\.\d{6} gpu \S+: lock granted \(shared", corun_err), corun_err
    assert "lock granted (shared" in corun_err and "NVSHARE_SWAP" not in corun_err


def test_units_past_the_time_budget_are_left_pending(built, tmp_path):
    run = family("--out", str(tmp_path), "--smoke-cpu", "--seconds", "0.3", "--time-budget", "1",
                 "--members", "pair-b10-g5-fixed", "--arms", "serial,colocate")
    assert run.returncode == 0, run.stdout + run.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["pending"] == ["pair-b10-g5-fixed/serial", "pair-b10-g5-fixed/colocate"]
    assert "Not measured (time budget): pair-b10-g5-fixed/serial" in run.stdout


def test_rounds_past_the_time_budget_are_left_pending_by_name(built, tmp_path):
    run = family("--out", str(tmp_path), "--smoke-cpu", "--seconds", "0.3", "--time-budget", "1",
                 "--members", "pair-b10-g5-fixed", "--arms", "serial,colocate", "--repeat", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["pending"] == ["pair-b10-g5-fixed/serial", "pair-b10-g5-fixed/colocate",
                              "pair-b10-g5-fixed/colocate round 2"]


def test_phases_set_every_arms_start_offsets_alike(built, tmp_path):
    """--phases 0,0.5: round 1 starts both jobs' steps together, round 2 half a step (8.3 ms of
    pair-b30-g5's 16.7) apart, in each arm alike; the corun summary pairs the arms round by round."""
    run = family("--out", str(tmp_path), "--smoke-cpu", "--seconds", "0.3", "--repeat", "2",
                 "--phases", "0,0.5", "--members", "pair-b30-g5-fixed",
                 "--arms", "serial,colocate,nvshare-corun")
    assert run.returncode == 0, run.stdout + run.stderr
    arms = json.loads((tmp_path / "results.json").read_text())["members"]["pair-b30-g5-fixed"]
    for arm in ("colocate", "nvshare-corun"):
        runs = sorted(arms[arm]["repeats"], key=lambda e: e["round"])
        assert [e["start_phase"] for e in runs] == [0.0, 0.5]
        for e, want in zip(runs, (0.0, 5 / 0.3 / 2), strict=True):
            assert e["start_at_late_ms"] == [0.0, 0.0], e     # start-ups ended before the set time
            assert max(e["first_step_offsets_ms"]) == pytest.approx(want, abs=2.0), e
    assert "φ0.5: " in run.stdout
    assert re.search(r"`auto_share: corun` against plain co-location "
                     r".*pair-b30-g5-fixed \d\.\d{3} \(2 rounds\)",
                     run.stdout), run.stdout
    assert "start_phase" not in arms["serial"]


def test_burst_start_at_in_the_past_starts_at_once_and_says_how_late(built):
    cmd = [str(bench_family.BURST), "--ipm", "100", "--gpu-ms", "2", "--host-ms", "1", "--steps", "2",
           "--start-at", f"{time.time() - 5:.6f}"]
    env = {"LD_LIBRARY_PATH": str(REPO / "tests" / "c" / "build"), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["start_at_late_ms"] >= 5000 and len(out["step_starts"]) == 2


def test_bad_selections_are_clear_errors(tmp_path):
    run = family("--out", str(tmp_path), "--members", "pair-b99-g5-fixed")
    assert run.returncode == 2 and "unknown member(s): pair-b99-g5-fixed" in run.stderr
    run = family("--out", str(tmp_path), "--arms", "serial,turns")
    assert run.returncode == 2 and "unknown arm(s): turns" in run.stderr
    run = family("--out", str(tmp_path), "--phases", "0,1.5")
    assert run.returncode == 2 and "--phases: each phase is a fraction of a step" in run.stderr
    run = family("--out", str(tmp_path), "--phases", "0,half")
    assert run.returncode == 2 and "--phases: not a list of numbers: 0,half" in run.stderr


def test_burst_rejects_what_it_cannot_run(built):
    bad = subprocess.run([str(bench_family.BURST), "--ipm", "100", "--gpu-ms", "5", "--steps", "3"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "one of --host-ms/--host-ratio" in bad.stderr
    bad = subprocess.run([str(bench_family.BURST), "--gpu-ms", "-5"], capture_output=True, text=True)
    assert bad.returncode == 2 and "not a non-negative number: -5" in bad.stderr


def test_burst_gpu_times_on_the_fake_driver_says_it_recorded_nothing(built):
    """The fake driver runs no PTX: every measured launch is unrecorded, none shows as a kernel."""
    env = {"LD_LIBRARY_PATH": str(REPO / "tests" / "c" / "build"), "PATH": "/usr/bin:/bin"}
    cmd = [str(bench_family.BURST), "--ipm", "100", "--gpu-ms", "2", "--host-ms", "1", "--steps", "3"]
    timed = subprocess.run([*cmd, "--gpu-times"], capture_output=True, text=True, env=env, timeout=30)
    assert timed.returncode == 0, timed.stderr
    res = json.loads(timed.stdout)
    assert res["gpu_kernels"] == [] and res["gpu_kernels_unrecorded"] == 3 * res["kernels_per_step"]
    plain = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30)
    assert plain.returncode == 0 and "gpu_kernels" not in plain.stdout


def ms(x: float) -> int:
    return round(x * 1_000_000)


def test_switch_gaps_are_the_idle_gpu_between_two_jobs_kernels():
    # Job 0 runs 0-10 ms and 25-30 ms, job 1 runs 12-20 ms then 20.5-24 ms: two switches idle
    # 2 ms and 1 ms; the gap of 0.5 ms inside job 1 is its own, not a switch.
    a = [[ms(0), ms(10)], [ms(25), ms(30)]]
    b = [[ms(12), ms(20)], [ms(20.5), ms(24)]]
    sw = bench_family.switch_gaps([b, a], phase_s=0.030)    # the order of the jobs does not matter
    assert sw["kernels"] == 4 and sw["switches"] == 2 and sw["overlapping"] == 0
    assert sw["p50_ms"] == pytest.approx(1.0) and sw["p90_ms"] == pytest.approx(2.0)
    assert sw["mean_ms"] == pytest.approx(1.5) and sw["total_ms"] == pytest.approx(3.0)
    assert sw["phase_share"] == pytest.approx(0.1)


def test_switch_gaps_count_overlaps_apart_and_measure_from_the_latest_end():
    # Time slices: job 1's kernel starts inside job 0's long one (an overlap, not idle); job 0's next
    # kernel starts 1 ms after the long one ended, which ended after job 1's short one.
    a = [[ms(0), ms(10)], [ms(11), ms(12)]]
    b = [[ms(2), ms(4)]]
    sw = bench_family.switch_gaps([a, b])
    assert sw["switches"] == 2 and sw["overlapping"] == 1
    assert sw["p50_ms"] == pytest.approx(1.0) and "phase_share" not in sw
    assert bench_family.switch_gaps([[], []]) is None              # no kernel times (fake driver)
    alone = bench_family.switch_gaps([a, []])
    assert alone["switches"] == 0 and "p50_ms" not in alone


def test_repeated_rounds_run_serial_once_and_rotate_the_other_arms():
    assert bench_family.rounds(["serial", "colocate", "mps", "nvshare"], 4) == [
        ["serial", "colocate", "mps", "nvshare"], ["mps", "nvshare", "colocate"],
        ["nvshare", "colocate", "mps"], ["colocate", "mps", "nvshare"]]
    assert bench_family.rounds(["nvshare"], 2) == [["nvshare"], ["nvshare"]]


def test_named_only_arms_run_where_arms_names_them():
    assert bench_family.OPTIONAL_ARMS["nvshare-nohandoff"] == {"turn_handoff": False}
    for m in bench_family.MEMBERS.values():
        assert not set(bench_family.arms_of(m)) & {"nvshare-turns", "nvshare-lockturns", "nvshare-nohandoff"}


def test_smoke_repeat_keeps_every_round_and_resumes_the_missing_ones(built, tmp_path):
    args = ("--smoke-cpu", "--seconds", "0.2", "--members", "compute2-g20",
            "--arms", "serial,colocate,nvshare")
    first = family("--out", str(tmp_path / "a"), *args, "--repeat", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    order = [line.split(": ")[1] for line in first.stdout.splitlines() if ": running" in line]
    assert order == ["compute2-g20/serial", "compute2-g20/colocate", "compute2-g20/nvshare",
                     "compute2-g20/nvshare round 2", "compute2-g20/colocate round 2"]
    arms = json.loads((tmp_path / "a" / "results.json").read_text())["members"]["compute2-g20"]
    assert [e["round"] for e in arms["serial"]["repeats"]] == [0]
    for arm in ("colocate", "nvshare"):
        runs = arms[arm]["repeats"]
        assert [e["round"] for e in runs] == [0, 1] and all(e["status"] == "ok" for e in runs)
        assert runs[0]["train_phase"] == arms[arm]["train_phase"]        # the first run, kept in full
        serial_phase = arms["serial"]["train_phase"]
        assert all(e["x_serial"] == pytest.approx(e["train_phase"] / serial_phase) for e in runs)
        assert len(runs[1]["first_step_offsets_ms"]) == 2 and min(runs[1]["first_step_offsets_ms"]) == 0
    assert "| compute2-g20 | serial | 1 | 1 (reference) |" in first.stdout
    assert "|  | nvshare | 2 |" in first.stdout

    more = family("--out", str(tmp_path / "b"), *args, "--repeat", "3", "--resume",
                  str(tmp_path / "a" / "results.json"))
    assert more.returncode == 0, more.stdout + more.stderr
    ran = [line for line in more.stdout.splitlines() if ": running" in line]
    assert len(ran) == 2 and all("round 3" in line for line in ran)
    arms = json.loads((tmp_path / "b" / "results.json").read_text())["members"]["compute2-g20"]
    assert [e["round"] for e in arms["nvshare"]["repeats"]] == [0, 1, 2]


def test_report_shows_switch_idle_for_compute_bound_members():
    res = fake_results([12.0, 12.6], colocate=11.0, mps=11.5)
    res["members"]["compute2-g20"] = res["members"].pop("pair-b30-g20-fixed")
    res["members"]["compute2-g20"]["nvshare"]["switch"] = {
        "kernels": 4000, "switches": 200, "overlapping": 3, "total_ms": 126.0, "p50_ms": 0.412,
        "p90_ms": 0.95, "mean_ms": 0.63, "phase_share": 0.01}
    bench_family.derive(res)
    assert "| compute2-g20 | 0.412/0.950 (1.0 %), 200 (3) |" in bench_family.table(res)


def test_report_shows_each_arms_ratio_over_the_rounds_beside_the_start_offsets():
    res = fake_results([12.0, 12.6], colocate=11.0, mps=11.5)
    arms = res["members"]["pair-b30-g20-fixed"]
    arms["serial"]["repeats"] = [{"round": 0, "status": "ok", "train_phase": 20.0}]
    arms["nvshare"]["repeats"] = [
        {"round": 0, "status": "ok", "train_phase": 12.6, "first_step_offsets_ms": [0.0, 12.3]},
        {"round": 1, "status": "ok", "train_phase": 14.0, "first_step_offsets_ms": [3.5, 0.0]},
        {"round": 2, "status": "failed"}]
    bench_family.derive(res)
    lines = bench_family.table(res)
    assert "| pair-b30-g20-fixed | serial | 1 | 1 (reference) |  |  |  |" in lines
    row = next(line for line in lines if line.startswith("|  | nvshare | 3 |"))
    assert "| 0.665 | 0.630 | 0.700 | 12.3 (0.630); 3.5 (0.700); – (failed) |" in row
    assert any("serial arm ran once per member" in line for line in lines)


def fake_results(nvshare_times: list[float], colocate: float, mps: float) -> dict:
    """A pair member whose jobs take 10 s each alone (20 s serial): the arms' training phases."""
    def arm(phase, times=None):
        r = {"status": "ok", "train_phase": phase, "jobs": []}
        if times:
            r["max_min"] = max(times) / min(times)
        return r
    return {"members": {"pair-b30-g20-fixed": {
        "serial": arm(20.0, [10.0, 10.0]), "colocate": arm(colocate), "mps": arm(mps),
        "nvshare": arm(max(nvshare_times), nvshare_times)}}, "pending": []}


def test_a_missed_target_stays_in_the_table():
    res = fake_results([12.0, 12.6], colocate=11.0, mps=11.5)   # nvshare 0.63 x serial, best 0.55
    bench_family.derive(res)
    nv = res["members"]["pair-b30-g20-fixed"]["nvshare"]
    assert nv["x_serial"] == pytest.approx(0.63)
    assert nv["vs_best"] == pytest.approx(0.63 / 0.55)
    row = next(line for line in bench_family.table(res) if line.startswith("| pair-b30-g20-fixed"))
    assert "**missed** <=1.05x best" in row and "0.630" in row
    assert "max/min" not in row.split("missed")[1]                 # 1.05 apart: fair enough

    unfair = fake_results([8.0, 10.4], colocate=11.0, mps=11.5)    # fast, but one job 30 % behind
    bench_family.derive(unfair)
    row = next(line for line in bench_family.table(unfair) if line.startswith("| pair-b30-g20-fixed"))
    assert "**missed** max/min<=1.15" in row and "<=1.05x best" not in row


def test_interactive_batch_rate_is_set_against_one_batch_job_alone():
    res = {"members": {"interactive-1batch": {
        "serial": {"status": "ok", "train_phase": 6.0, "batch_steps_per_s": 50.0},
        "nvshare": {"status": "ok", "train_phase": 6.1, "batch_steps_per_s": 49.5,
                    "probe": {"p50_ms": 2.0, "p90_ms": 4.0, "max_ms": 9.0, "commands": 40}}}}, "pending": []}
    bench_family.derive(res)
    assert res["members"]["interactive-1batch"]["nvshare"]["batch_vs_alone"] == pytest.approx(0.99)
    assert res["targets"]["interactive-1batch"] == {"p90<=10ms": True, "batch loss<=2%": True}


def test_batch_rate_counts_whole_steps_between_ends():
    ends = [0.05 + 0.02 * i for i in range(200)]                  # 50 steps/s, from 0.05 s on
    assert bench_family.step_rate(ends, 1.0, 3.0) == pytest.approx(50.0)
    assert bench_family.step_rate(ends, 1.0, 1.03) is None         # too few to say


def test_report_puts_the_family_into_the_adaptive_section(tmp_path, monkeypatch):
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\n## Adaptive sharing (issue 12) (H100)\nearlier runs\n\n"
                    "## Priority classes (issue 14)\nprio\n")
    monkeypatch.setattr(bench_family, "DOCS", docs)
    monkeypatch.setattr(bench_family, "FIGURES", tmp_path / "fig")
    res = fake_results([12.0, 12.6], colocate=11.0, mps=11.5)
    res.update(gpu={"name": "H100", "driver": "580"}, date="2026-11-23", command="bench_family.py --part 1",
               settings={"seconds": 3},
               calibration={"ipm": 50000, "grid": 528, "block": 256, "startup_s": 0.3})
    d = tmp_path / "run"
    d.mkdir()
    (d / "results.json").write_text(json.dumps(res))
    merged = bench_family.merge([d / "results.json"])
    bench_family.write_docs(merged, [d])
    bench_family.write_docs(merged, [d])                          # a second report replaces, not adds
    text = docs.read_text()
    assert text.count(bench_family.BEGIN) == 1
    assert text.index("earlier runs") < text.index(bench_family.BEGIN) < text.index("## Priority classes")
    assert "| pair-b30-g20-fixed | 2 |" in text


def test_report_compares_a_members_arms_within_one_run(tmp_path):
    """--report over two calls that both measured a member: its ratios stay those of one call
    (its serial arm, its calibration). A later call that only re-ran nvshare, on a GPU 1.5x as
    fast, must not be set against the first call's serial arm."""
    def run(name: str, res: dict, ipm: float) -> Path:
        res.update(gpu={"name": "H100", "driver": "580"}, date="2026-11-23", command=name,
                   calibration={"ipm": ipm})
        d = tmp_path / name
        d.mkdir()
        (d / "results.json").write_text(json.dumps(res))
        return d / "results.json"

    first = run("first", fake_results([12.0, 12.6], colocate=11.0, mps=11.5), 50000)
    again = fake_results([8.0, 8.4], colocate=7.3, mps=7.7)       # every time 1.5x shorter
    partial = {"members": {"pair-b30-g20-fixed": {"nvshare": again["members"]["pair-b30-g20-fixed"]
                                                  ["nvshare"]}}, "pending": []}
    merged = bench_family.merge([first, run("partial", partial, 75000)])
    nv = merged["members"]["pair-b30-g20-fixed"]["nvshare"]
    assert nv["x_serial"] == pytest.approx(12.6 / 20.0)            # the first call's own arms
    assert nv["max_min"] == pytest.approx(12.6 / 12.0)

    whole = run("whole", fake_results([8.0, 8.4], colocate=7.3, mps=7.7), 75000)
    merged = bench_family.merge([first, whole])
    arms = merged["members"]["pair-b30-g20-fixed"]
    assert arms["nvshare"]["x_serial"] == pytest.approx(8.4 / 20.0)   # the later call, whole
    assert arms["colocate"]["x_serial"] == pytest.approx(7.3 / 20.0)


def test_gpu_bench_report_compares_a_workloads_arms_within_one_run(tmp_path):
    """The same rule for bench/gpu_bench.py's workloads, with the calibration they ran with."""
    import gpu_bench

    def run(name: str, arms: dict, step_ms: float) -> Path:
        res = {"gpu": {"name": "H100"}, "date": "2026-11-23", "command": name, "solo": {},
               "calibration": {"W3": {"step_ms": step_ms}}, "pending": [],
               "workloads": {"W3": {a: {"status": "ok", "makespan": t + 1, "train_phase": t}
                                    for a, t in arms.items()}}}
        d = tmp_path / name
        d.mkdir()
        (d / "results.json").write_text(json.dumps(res))
        return d / "results.json"

    first = run("first", {"serial": 24.0, "colocate": 30.0, "nvshare-auto": 25.0}, 70.0)
    merged = gpu_bench.merge([first, run("partial", {"nvshare-auto": 12.0}, 35.0)])
    w3 = merged["workloads"]["W3"]
    assert w3["nvshare-auto"]["train_vs_serial"] == pytest.approx(25.0 / 24.0)
    assert merged["calibration"]["W3"]["step_ms"] == 70.0
    merged = gpu_bench.merge([first, run("whole", {"serial": 12.0, "nvshare-auto": 12.6,
                                                   "colocate": 15.0}, 35.0)])
    assert merged["workloads"]["W3"]["nvshare-auto"]["train_vs_serial"] == pytest.approx(12.6 / 12.0)
    assert merged["calibration"]["W3"]["step_ms"] == 35.0
