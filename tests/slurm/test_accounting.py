"""Per-job GPU accounting through real Slurm: when the epilog unregisters a job, the scheduler logs
what the job got from its shared GPU, with the numbers of the job's real GPU work (fake driver).
With usage_admin_comment on, a cluster without accounting storage (this one) cannot take the
AdminComment of a finished job: the epilog says so and still succeeds (the node is not drained)."""
from __future__ import annotations

import re

import yaml

from .helpers import submit


def test_scheduler_logs_the_jobs_gpu_usage_at_job_end(healthy, jobdir, nvtest):
    n2 = healthy.nodes["n2"]
    original = n2.config_path.read_text()
    settings = yaml.safe_load(original)
    settings["usage_admin_comment"] = True
    n2.config_path.write_text(yaml.safe_dump(settings))   # the epilog reads it at every job end
    try:
        job = submit(healthy, nvtest, jobdir / "trace", "alloc:1073741824 burst:50000:10:1")
        assert healthy.wait_job(job, 60) == "COMPLETED", healthy.diagnostics()
    finally:
        n2.config_path.write_text(original)
    line = re.search(rf"job {job}: unregistered \(\d+ clients disconnected\); GPU usage: (.*)",
                     n2.log_path.read_text())
    assert line, n2.log_path.read_text()[-2000:]
    match = re.fullmatch(r"gpu0 held=(\d+\.\d)s wait=(\d+\.\d)s peak=1\.0G swapped=0B turns=(\d+)",
                         line.group(1).strip())
    assert match, line.group(1)
    assert float(match.group(1)) >= 0.5            # ten kernels of 50 ms held the GPU
    assert int(match.group(3)) >= 1
    state = healthy.scontrol("show", "node", "n2").stdout
    assert "DRAIN" not in state, state
