"""The epilog with the scheduler down at job end (issue 25 item 8), through real Slurm: while the
job is COMPLETING its node line shows an empty GRES=, and the epilog must still drain the node for
an nvshare job (it learns that from state.json or the job's request), and never for a job without
nvshare or one Slurm does not know."""
from __future__ import annotations

import shlex

from .cluster import BIN, registered_jobs, wait_until

WAIT = """#!/bin/sh
touch {started}
i=0; while [ ! -e {go} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
"""


def _drain_reason(cluster) -> str:
    return cluster.run([BIN / "sinfo", "-h", "-R", "-n", "n1", "-o", "%E"]).stdout.strip()


def _job(cluster, jobdir, name, *args):
    started, go = jobdir / f"{name}.started", jobdir / f"{name}.go"
    job = cluster.sbatch(WAIT.format(started=shlex.quote(str(started)),
                                     go=shlex.quote(str(go))), "-w", "n1", *args)
    wait_until(started.exists, 30, "job start", cluster.diagnostics)
    return job, go


def test_epilog_drains_when_the_scheduler_is_down_at_the_end_of_an_nvshare_job(healthy, jobdir):
    job, go = _job(healthy, jobdir, "down-end", "--gres=nvshare:1")
    assert job in registered_jobs(healthy.nodes["n1"])
    healthy.stop_scheduler("n1")
    go.touch()
    reason = wait_until(lambda: _drain_reason(healthy), 40, "n1 drained", healthy.diagnostics)
    assert "nvshare: scheduler not running" in reason
    log = healthy.nodes["n1"].log_path.read_text() if healthy.nodes["n1"].log_path.exists() else ""
    assert "not draining" not in log


def test_epilog_does_not_drain_for_a_job_without_nvshare(healthy, jobdir):
    job, go = _job(healthy, jobdir, "plain")
    healthy.stop_scheduler("n1")
    go.touch()
    assert healthy.wait_job(job) == "COMPLETED"
    assert "nvshare" not in _drain_reason(healthy)
