"""Jobs through real Slurm: registration by the prolog, the job environment from the taskprolog,
cleanup by the epilog, and what happens when the scheduler is down or restarts."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from nvshare_slurm import libnvshare_path

from .cluster import registered_jobs, read_env, wait_until, BIN

# The job writes its environment, then waits (at most 60 s) for the test to let it finish. The file
# appears only once complete (write, then rename): the test reads it as soon as it exists.
HOLD = """#!/bin/sh
env -0 > {out}.part && mv {out}.part {out}
i=0; while [ ! -e {go} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
"""


def hold_job(cluster, tmp, *args, name="hold", cwd=None):
    out, go = tmp / f"{name}.env", tmp / f"{name}.go"
    job = cluster.sbatch(HOLD.format(out=shlex.quote(str(out)), go=shlex.quote(str(go))), *args,
                         cwd=cwd)
    return job, out, go


def test_job_without_nvshare_is_untouched(healthy, jobdir):
    job, out, go = hold_job(healthy, jobdir, "-w", "n1")
    wait_until(out.exists, 30, "job start", healthy.diagnostics)
    env = read_env(out)
    assert "LD_PRELOAD" not in env and not [k for k in env if k.startswith("NVSHARE_")]
    assert job not in registered_jobs(healthy.nodes["n1"])
    go.touch()
    assert healthy.wait_job(job) == "COMPLETED"
    assert f"job {job}" not in healthy.nodes["n1"].log_path.read_text()


def test_nvshare_job_is_registered_hooked_shown_and_cleaned_up(healthy, jobdir):
    n1 = healthy.nodes["n1"]
    job, out, go = hold_job(healthy, jobdir, "-w", "n1", "--gres=nvshare:1", name="one")
    wait_until(out.exists, 30, "job start", healthy.diagnostics)
    env = read_env(out)
    entry = registered_jobs(n1)[job]
    assert len(entry["gpus"]) == 1
    assert env["LD_PRELOAD"].split(":")[0] == str(libnvshare_path())
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVSHARE_MANAGED_GPUS"] == entry["gpus"][0]
    assert env["NVSHARE_SOCKET"] == n1.socket and env["NVSHARE_JOB_ID"] == str(job)
    assert env["NVSHARE_ON_DAEMON_LOSS"] == "wait"
    status = healthy.run([Path(sys.executable).parent / "nvshare-status", "--json"],
                         env={**healthy.env, "NVSHARE_CONFIG": str(n1.config_path)})
    assert status.returncode == 0, status.stderr
    assert str(job) in status.stdout
    go.touch()
    assert healthy.wait_job(job) == "COMPLETED"
    wait_until(lambda: job not in registered_jobs(n1), 10, "epilog unregisters the job")


def test_two_slots_get_two_distinct_gpus(healthy, jobdir):
    job, out, go = hold_job(healthy, jobdir, "-w", "n1", "--gres=nvshare:2", name="two")
    wait_until(out.exists, 30, "job start", healthy.diagnostics)
    gpus = read_env(out)["CUDA_VISIBLE_DEVICES"].split(",")
    assert len(gpus) == 2 and len(set(gpus)) == 2
    assert sorted(registered_jobs(healthy.nodes["n1"])[job]["gpus"]) == sorted(gpus)
    go.touch()
    assert healthy.wait_job(job) == "COMPLETED"


def test_typed_gres_follows_slurms_choice(healthy, jobdir):
    job, out, go = hold_job(healthy, jobdir, "-w", "n2", "--gres=nvshare:gpu1:1", name="typed")
    wait_until(out.exists, 30, "job start", healthy.diagnostics)
    entry = registered_jobs(healthy.nodes["n2"])[job]
    assert entry["gpu_index"] == [1]
    assert read_env(out)["CUDA_VISIBLE_DEVICES"] == entry["gpus"][0]
    go.touch()
    assert healthy.wait_job(job) == "COMPLETED"


def test_two_node_job_is_placed_by_each_nodes_daemon(healthy, jobdir):
    out = jobdir / "steps"
    script = (f"#!/bin/sh\n{BIN}/srun -N2 -n2 sh -c "
              f"'echo $SLURMD_NODENAME $NVSHARE_SOCKET $CUDA_VISIBLE_DEVICES' > {out}\n")
    job = healthy.sbatch(script, "-N2", "--gres=nvshare:1")
    assert healthy.wait_job(job, 60) == "COMPLETED", out.read_text() if out.exists() else ""
    seen = {line.split()[0]: line.split()[1:] for line in out.read_text().splitlines()}
    assert set(seen) == {"n1", "n2"}
    for node, (sock, gpus) in seen.items():
        assert sock == healthy.nodes[node].socket and gpus.startswith("GPU-")
    for node in ("n1", "n2"):
        assert f"job {job}" in healthy.nodes[node].log_path.read_text()
        assert job not in registered_jobs(healthy.nodes[node])


HOSTILE_NAMES = ["we'ird $(touch /tmp/nvs-pwned) \"q\" `id` ;x", "  spaced  name ", "a\\b%n%s"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_job_names_and_directories(healthy, jobdir, name):
    cwd = jobdir / "a'; echo foo $(id)"
    cwd.mkdir()
    cwd.chmod(0o777)
    job, out, go = hold_job(healthy, cwd, "-w", "n1", "--gres=nvshare:1", "-J", name, cwd=str(cwd),
                            name="h")
    wait_until(out.exists, 30, "job start", healthy.diagnostics)
    env = read_env(out)
    entry = registered_jobs(healthy.nodes["n1"])[job]
    assert entry["name"] == name.strip() or entry["name"] == name
    assert env["NVSHARE_JOB_ID"] == str(job) and env["CUDA_VISIBLE_DEVICES"] == entry["gpus"][0]
    assert not Path("/tmp/nvs-pwned").exists()
    go.touch()
    assert healthy.wait_job(job) == "COMPLETED"


def test_hostile_environment_values_stay_literal(healthy, jobdir):
    odd = "/x y.so:/a'b.so"
    job, out, go = hold_job(healthy, jobdir, "-w", "n1", "--gres=nvshare:1",
                            "--export=ALL,LD_PRELOAD=" + odd, name="envodd")
    wait_until(out.exists, 30, "job start", healthy.diagnostics)
    preload = read_env(out)["LD_PRELOAD"].split(":")
    assert preload[0] == str(libnvshare_path())
    assert preload[1:] == ["/x", "y.so", "/a'b.so"]     # ld.so's own separators: ':' and ' '
    go.touch()
    assert healthy.wait_job(job) == "COMPLETED"


def test_scheduler_down_at_job_start_drains_node_and_requeues(healthy, jobdir):
    healthy.stop_scheduler("n1")
    job, out, go = hold_job(healthy, jobdir, "-w", "n1", "--gres=nvshare:1", name="down")
    reason = wait_until(lambda: healthy.run([BIN / "sinfo", "-h", "-R", "-n", "n1", "-o", "%E"])
                        .stdout.strip(), 40, "n1 drained", healthy.diagnostics)
    assert "nvshare: scheduler not running" in reason
    assert not out.exists()                      # the job never ran ungated
    # Slurm requeues it (held) once the epilog has run.
    healthy.wait_state(job, ("PENDING", "REQUEUE_HOLD"), 40)
    assert int(healthy.job_field(job, "Restarts")) >= 1 or healthy.job_field(job, "Reason")
    # The admin starts the scheduler and resumes the node: the job runs, placed.
    healthy.start_scheduler("n1")
    healthy.scontrol("update", "nodename=n1", "state=resume")
    healthy.scontrol("release", str(job))
    healthy.scontrol("update", f"jobid={job}", "starttime=now")   # requeue delays it ~2 min
    wait_until(out.exists, 60, "requeued job starts", healthy.diagnostics)
    assert read_env(out)["NVSHARE_JOB_ID"] == str(job)
    go.touch()
    assert healthy.wait_job(job) == "COMPLETED"


def test_scheduler_restart_while_job_runs_keeps_it_and_epilog_cleans_up(healthy, jobdir):
    n1 = healthy.nodes["n1"]
    job, out, go = hold_job(healthy, jobdir, "-w", "n1", "--gres=nvshare:1", name="restart")
    wait_until(out.exists, 30, "job start", healthy.diagnostics)
    before = registered_jobs(n1)[job]["gpus"]
    healthy.stop_scheduler("n1")
    healthy.start_scheduler("n1")
    assert registered_jobs(n1)[job]["gpus"] == before
    go.touch()
    assert healthy.wait_job(job) == "COMPLETED"
    wait_until(lambda: job not in registered_jobs(n1), 10, "epilog unregisters after restart")
    assert "nvshare: " not in healthy.run([BIN / "sinfo", "-h", "-R"]).stdout


def test_lost_state_is_rebuilt_from_slurm_while_jobs_run(healthy, jobdir):
    """state.json deleted while the scheduler is down: the restarted scheduler asks Slurm which
    jobs run on its node and registers them again, so their tasks stay gated and the epilog finds
    them (issue 9)."""
    n1 = healthy.nodes["n1"]
    job, out, go = hold_job(healthy, jobdir, "-w", "n1", "--gres=nvshare:1", name="lost")
    wait_until(out.exists, 30, "job start", healthy.diagnostics)
    healthy.stop_scheduler("n1")
    (n1.workdir / "state" / "state.json").unlink()
    healthy.start_scheduler("n1")
    wait_until(lambda: job in registered_jobs(n1), 20, "job rebuilt from Slurm",
               healthy.diagnostics)
    assert "rebuilt from Slurm on node n1" in n1.log_path.read_text()
    go.touch()
    assert healthy.wait_job(job) == "COMPLETED"
    wait_until(lambda: job not in registered_jobs(n1), 10, "epilog unregisters the rebuilt job")
    assert "nvshare: " not in healthy.run([BIN / "sinfo", "-h", "-R"]).stdout


def test_scancel_runs_the_epilog(healthy, jobdir):
    n1 = healthy.nodes["n1"]
    job, out, go = hold_job(healthy, jobdir, "-w", "n1", "--gres=nvshare:1", name="cancel")
    wait_until(out.exists, 30, "job start", healthy.diagnostics)
    assert job in registered_jobs(n1)
    healthy.run([BIN / "scancel", str(job)])
    assert healthy.wait_job(job) == "CANCELLED"
    wait_until(lambda: job not in registered_jobs(n1), 15, "epilog after scancel")
