"""Per-job GPU accounting through real Slurm: when the epilog unregisters a job, the scheduler logs
what the job got from its shared GPU, with the numbers of the job's real GPU work (fake driver).
With usage_admin_comment on, a cluster without accounting storage (this one) cannot take the
AdminComment of a finished job: the scheduler's log says so, and the epilog still succeeds (the
node is not drained)."""
from __future__ import annotations

import re
import signal

import yaml

from .cluster import wait_until
from .helpers import submit


def test_scheduler_logs_the_jobs_gpu_usage_at_job_end(healthy, jobdir, nvtest):
    n2 = healthy.nodes["n2"]
    original = n2.config_path.read_text()
    settings = yaml.safe_load(original)
    settings["usage_admin_comment"] = True
    reloads = n2.log_path.read_text().count("reload: configuration reloaded")

    def reload(text: str, count: int) -> None:
        n2.config_path.write_text(text)          # the scheduler reads it again on SIGHUP
        healthy.schedulers["n2"].send_signal(signal.SIGHUP)
        wait_until(lambda: n2.log_path.read_text().count("reload: configuration reloaded") >= count,
                   10, "the scheduler's reload")

    reload(yaml.safe_dump(settings), reloads + 1)
    try:
        job = submit(healthy, nvtest, jobdir / "trace", "alloc:1073741824 burst:50000:10:1")
        assert healthy.wait_job(job, 60) == "COMPLETED", healthy.diagnostics()
        said = wait_until(lambda: re.search(rf"job {job}: GPU usage (not )?written to its "
                                            rf"AdminComment(.*)", n2.log_path.read_text()),
                          20, "AdminComment line")
    finally:
        reload(original, reloads + 2)
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
    # The scheduler says what became of the AdminComment, in its own log (a successful epilog's
    # output goes nowhere): here slurmctld calls the job finished and sacctmgr has no slurmdbd.
    assert said and said.group(1), said and said.group(0)
    assert "sacctmgr" in said.group(2), said.group(0)
