"""Issue 42's interactive srun step (bench/interactive_step.py) run end to end on the fake driver: its
own one-node Slurm, an `srun --gres=nvshare:1` step as nobody alone and beside an `sbatch
--gres=nvshare:1` training of another user. The GPU machine runs the same orchestration, parsing and
checks with PyTorch payloads. The latency target is a figure of the report, not asserted here: on a
loaded CI machine the fake driver's numbers are not a GPU's."""
from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from .cluster import SBIN

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "interactive_step.py"


def run_step(out: Path, *options: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NVSHARE_"))}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, str(SCRIPT), str(out), *options], env=env,
                          capture_output=True, text=True, timeout=timeout)


def need_cluster() -> None:
    if os.geteuid() != 0:
        pytest.skip("the run starts slurmctld, slurmd and munged: needs root")
    if not (SBIN / "slurmd").exists() or not Path("/etc/munge/munge.key").exists():
        pytest.skip("needs Slurm and munge installed (scripts/install-demo-slurm.sh)")
    for user in ("nobody", "daemon"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            pytest.skip(f"needs the user {user}")


def test_the_step_alone_and_beside_another_users_training_through_slurm(tmp_path):
    need_cluster()
    proc = run_step(tmp_path, "--fake", "--seconds", "5", "--every", "0.5",
                    "--variant", "NVSHARE_HOLD_SHAPES=off")
    result = tmp_path / "result.json"
    assert result.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(result.read_text())
    log = proc.stdout
    assert proc.returncode == 0 and report["passed"], log[-4000:]
    assert report["device"] == "fake driver"
    assert log.count("  PASS  ") == len(report["checks"]) == 27, log[-3000:]
    names = [c["check"] for c in report["checks"]]
    for words, count in (("exited 0", 3), ("ran as nobody", 3), ("ran as daemon", 3),
                         ("ran under the hook", 6), ("made its commands", 3), ("completed with exit 0", 3),
                         ("the scheduler registered", 4), ("stepped through the step's whole window", 2)):
        assert sum(words in n for n in names) == count, (words, names)
    assert sorted({c["part"] for c in report["checks"]}) == ["a", "b", "c", "d"]
    parts = report["parts"]
    alone, shared = parts["a"], parts["c"]["step"]
    # Every command timed, alone and beside the training, and the figures come from them.
    for rec in (alone, shared):
        assert rec["commands"] == len(rec["latencies_ms"]) >= 7
        assert 0 < rec["p50_ms"] <= rec["p99_ms"] <= rec["max_ms"]
    # Three jobs: the step's alone, the training alone, the training with the step's job beside it;
    # the step's job beside the training is a job of its own, distinct from the training's.
    variant = parts["d"]["step"]
    jobs = {alone["env"]["job"], parts["b"]["job"], parts["c"]["training"]["job"], shared["env"]["job"],
            parts["d"]["training"]["job"], variant["env"]["job"]}
    assert len(jobs) == 6, jobs
    # The variant's setting reached both of its jobs and neither of the others'.
    said = "NVSHARE_HOLD_SHAPES=off"
    assert variant["commands"] >= 7 and report["figures"]["variant"]["env"] == said
    for rec in (variant, parts["d"]["training"]):
        assert rec["env"].get("NVSHARE_HOLD_SHAPES") == "off", rec["env"]
    for rec in (alone, parts["b"], shared, parts["c"]["training"]):
        assert "NVSHARE_HOLD_SHAPES" not in rec["env"], rec["env"]
    assert report["figures"]["variant"]["shared_p99_ms"] == variant["p99_ms"]
    f = report["figures"]
    assert f["alone_p99_ms"] == alone["p99_ms"] and f["shared_p99_ms"] == shared["p99_ms"]
    assert f["target"].startswith(("met (", "missed (")) and "within 1 ms of alone" in f["target"]
    assert f["train_alone_steps_per_s"] > 0 and f["train_shared_steps_per_s"] > 0
    assert f["train_over_alone"] == pytest.approx(f["train_shared_steps_per_s"]
                                                  / f["train_alone_steps_per_s"])
    md = (tmp_path / "results.md").read_text()
    assert "| alone |" in md and "| beside the training |" in md and f["target"] in md
    assert f"| beside the training, {said} |" in md and report["figures"]["variant"]["target"] in md
    assert {p.name for p in tmp_path.iterdir()} == {"result.json", "results.md", "logs.tar.gz"}


def test_a_server_as_an_srun_step_beside_another_users_training_through_slurm(tmp_path):
    """--server: the srun step serves requests arriving at random (on the fake driver burst's 3 ms
    requests, 30 ms apart; on a GPU serve_torch's model.generate, graph decoder or CNN), alone and
    beside the training; its target is its p99 over alone. With --duty 1:1 the training beside it
    steps 1 s and idles 1 s in turn: the requests beside it stepping and beside it idle are told apart
    in the same run (the target against idle), and its steps/s is over its stepping phases."""
    need_cluster()
    proc = run_step(tmp_path, "--fake", "--server", "serve", "--seconds", "5", "--duty", "1:1")
    result = tmp_path / "result.json"
    assert result.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(result.read_text())
    assert proc.returncode == 0 and report["passed"], proc.stdout[-4000:]
    names = [c["check"] for c in report["checks"]]
    assert len(names) == 18, names
    for words, count in (("the server's srun step (serve) exited 0", 2), ("ran as nobody", 2),
                         ("the server served its requests (at least 83)", 2), ("ran as daemon", 2),
                         ("stepped through the step's whole window", 1), ("the scheduler registered", 2),
                         ("commands beside the training stepping and beside it idle", 1)):
        assert sum(words in n for n in names) == count, (words, names)
    assert not any("made its commands" in n for n in names), names
    parts = report["parts"]
    alone, shared = parts["a"], parts["c"]["step"]
    for rec in (alone, shared):   # requests of 3 ms of GPU work: none served in less
        assert rec["commands"] == len(rec["latencies_ms"]) >= 83
        assert 3.0 <= rec["p50_ms"] <= rec["p99_ms"] <= rec["max_ms"]
        # the offline settings (the GPU machine has no network for transformers to look for)
        assert rec["env"].get("HF_HUB_OFFLINE") == "1", rec["env"]
    jobs = {alone["env"]["job"], parts["b"]["job"], parts["c"]["training"]["job"], shared["env"]["job"]}
    assert len(jobs) == 4, jobs
    f = report["figures"]
    assert f["target"].startswith(("met (", "missed (")) and "p99 at most 1.2 x alone" in f["target"], f
    assert f"{f['shared_p99_ms'] / f['alone_p99_ms']:.2f}x" in f["target"]
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# A server (serve) as an srun step beside a training (fake driver")
    assert "| the server |" in md and f["target"] in md and "| beside the training |" in md
    # --duty: the training's idle phases (1 s each, about 2 in the 5 s window), the requests in each
    # kind of phase (30 ms apart: 0.75 s a phase less a request's length gives 15 or more a phase)
    idle = parts["c"]["training"]["result"]["idle"]
    assert len(idle) >= 2 and all(0.95 < b - a < 3.0 for a, b in idle), idle
    d = f["duty"]
    assert d["busy"]["n"] >= 15 and d["idle"]["n"] >= 15, d
    assert 3.0 <= d["busy"]["p50_ms"] <= d["busy"]["p99_ms"] and 3.0 <= d["idle"]["p50_ms"], d
    assert abs(d["x_idle_p99"] - d["busy"]["p99_ms"] / d["idle"]["p99_ms"]) < 1e-9
    assert f["duty_target"].startswith(("met (", "missed (")), f
    assert f"{d['x_idle_p99']:.2f}x" in f["duty_target"], f
    assert "Interleaved (--duty 1:1" in md and f["duty_target"] in md
    # the training's steps/s over its stepping phases: near its rate alone (20 ms steps), not half of it
    assert f["train_shared_steps_per_s"] > 0.6 * f["train_alone_steps_per_s"], f


@pytest.mark.parametrize("options, words", [
    (["--step-user", "nobody", "--train-user", "nobody"], "must differ"),
    (["--train-user", "no-such-user-nvs"], "no user 'no-such-user-nvs'"),
    (["--variant", "LD_PRELOAD=/tmp/x.so"], "NAME=VALUE of a hook setting"),
    (["--train-precision", "bf16"], "the PyTorch training's: not with --fake"),
    (["--server", "gen"], "gen, gengraph and cnn need a GPU"),
    (["--server", "llama"], "invalid choice: 'llama'"),
    (["--duty", "2"], "--duty '2' is not RUN:IDLE"),
], ids=["one user for both", "a user who does not exist", "a variant that is no hook setting",
        "a PyTorch precision for the fake driver's training", "a PyTorch server on the fake driver",
        "a server that does not exist", "a duty without its idle part"])
def test_users_it_cannot_use_are_refused_before_anything_starts(tmp_path, options, words):
    proc = run_step(tmp_path / "out", "--fake", *options, timeout=60)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
