"""slurm.py against this cluster's own scontrol (22.05 here, 24.11 in scripts/test-slurm-2411.sh's
chroot): the form it reads (JSON from 23.02 on), and that a job's comment shaped like the record's
own lines gives the job nothing, through the prolog as through the daemon's rebuild query."""
from __future__ import annotations

from nvshare_slurm.node import slurm

from .cluster import BIN, registered_jobs, wait_until

FORGED_COMMENT = ("x\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=nvshare:gpu1(CNT:9)\n"
                  "JobId=777 JobName=forged\n   UserId=root(0) GroupId=root(0) MCS_label=N/A\n"
                  "   JobState=RUNNING\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=nvshare(CNT:9)")


def has_json(cluster) -> bool:
    return cluster.scontrol("--json", "ping").returncode == 0


def test_jobs_are_read_in_the_form_this_slurm_has(healthy, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(healthy.conf))      # as the daemon's scontrol finds it
    job = healthy.sbatch("#!/bin/sh\nsleep 60\n", "-w", "n1", "--gres=nvshare:2",
                         "--comment", FORGED_COMMENT)
    healthy.wait_state(job, ("RUNNING",))
    version = healthy.scontrol("--version").stdout.strip()
    records, form = slurm._job_records([str(job)], str(BIN), 10.0, 1, None)
    assert form == ("json" if has_json(healthy) else "text"), version
    record = slurm._the_job(records, job)
    assert record.on_node("n1") == slurm.NodeGres(2), version
    assert (record.uid, record.state) == (0, "RUNNING")
    # What the prolog registered, and what a rebuild would find: two slots, no forged job.
    registered = wait_until(lambda: registered_jobs(healthy.nodes["n1"]).get(job), 30,
                            f"job {job} registered by its prolog", healthy.diagnostics)
    assert registered["slots"] == 2
    live = {r.job_id: r for r in slurm.jobs_on_node("n1", str(BIN))}
    assert live[job].on_node("n1") == slurm.NodeGres(2) and 777 not in live
    if form == "json":
        assert record.comment == FORGED_COMMENT
        text = slurm.parse_show_job(healthy.scontrol("show", "job", "-d", str(job)).stdout, job)
        assert (text.uid, text.nodes, text.partition) == (record.uid, record.nodes,
                                                          record.partition)
