"""A site's own Prolog, Epilog and TaskProlog beside nvshare's, through real Slurm, set up as
docs/admin-guide.md "Chaining a site's Prolog, Epilog and TaskProlog" says.

The cluster here is its own (one node, c1), because its site scripts fail on purpose and drain the
node. Prolog= and Epilog= name directories (`prolog.d/*`, `epilog.d/*`: a glob, which Slurm 22.05
and 24.11 both run in reverse alphabetical order, stopping at the first that fails):
prolog.d/50-site runs before prolog.d/00-nvshare, epilog.d/99-nvshare before epilog.d/50-site. The
node's nvshare.yaml names the site's TaskProlog (site_task_prolog), which nvshare-taskprolog runs.
Each site script logs that it ran and fails while a marker file exists.

Checks, as a user and the admin would see them: the task's environment holds the site's exports
and unsets and nvshare's exports, LD_PRELOAD the hook then the site's entries then the job's, the
site's print line in the job's output, for root's jobs and for jobs of `nobody`, with and without
nvshare GRES; a failing site prolog fails the Prolog with its own status (node drained, job
requeued held, nvshare's prolog never run, so nothing registered); the site epilog runs for every
job, and when it fails the node drains while nvshare's epilog has still unregistered the job; a
failing site TaskProlog fails the task with its status.
"""
from __future__ import annotations

import dataclasses
import ctypes
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvshare_slurm import libnvshare_file
from nvshare_slurm.node import localcluster

from .cluster import (BIN, SlurmCluster, cluster_dir, need_real_slurm, read_env, registered_jobs, running,
                      wait_until)

NODE = "c1"
GPU_UUIDS = {"GPU-fa4e0000-0000-0000-0000-000000000000", "GPU-fa4e0000-0000-0000-0000-000000000001"}


def system_library(name: str) -> str:
    """A real, harmless library to preload (the TaskProlog and the task start with LD_PRELOAD)."""
    ctypes.CDLL(name)
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith("/" + name):
            return line.split()[-1]
    raise AssertionError(f"{name} not mapped")


JOB_LIB, SITE_LIB = system_library("libm.so.6"), system_library("libdl.so.2")

# Site scripts as sites write them: Prolog and Epilog get no PATH. {base} is the cluster's dir.
SITE_PROLOG = """#!/bin/sh
PATH=/usr/bin:/bin
echo "prolog $SLURM_JOB_ID uid=$(id -u)" >> {base}/site.log
[ -e {base}/site-prolog-fails ] && {{ echo "site prolog: scratch not mounted" >&2; exit 3; }}
exit 0
"""
SITE_EPILOG = """#!/bin/sh
PATH=/usr/bin:/bin
echo "epilog $SLURM_JOB_ID uid=$(id -u)" >> {base}/site.log
[ -e {base}/site-epilog-fails ] && {{ echo "site epilog: cleanup failed" >&2; exit 4; }}
exit 0
"""
SITE_TASKPROLOG = """#!/bin/sh
echo "export SITE_SCRATCH=/scratch/$SLURM_JOB_ID"
echo "export SITE_UID=$(/usr/bin/id -u)"
echo "print site: hello from the site TaskProlog"
echo "unset SITE_UNSET_ME"
echo "export LD_PRELOAD={site_lib}${{LD_PRELOAD:+:$LD_PRELOAD}}"
echo "export CUDA_VISIBLE_DEVICES=site-choice"
[ -e {base}/site-taskprolog-fails ] && exit 5
exit 0
"""


class ChainedCluster(SlurmCluster):
    """SlurmCluster with prolog.d/ and epilog.d/ globs and a site TaskProlog in nvshare.yaml."""

    def __init__(self, base: Path):
        super().__init__(base, [(NODE, "nvshare:16", [f"NodeName={NODE} Name=nvshare Count=16"])])
        self.nodes[NODE].settings.update(site_task_prolog=str(base / "site-taskprolog"),
                                         site_task_prolog_timeout=20)

    def description(self) -> localcluster.LocalCluster:
        return dataclasses.replace(super().description(), prolog=f"{self.base}/prolog.d/*",
                                   epilog=f"{self.base}/epilog.d/*")

    def write(self) -> None:
        super().write()                     # prolog.sh, epilog.sh, taskprolog.sh: nvshare's
        b = self.base
        for kind, ours, site in (("prolog", "00-nvshare", SITE_PROLOG),
                                 ("epilog", "99-nvshare", SITE_EPILOG)):
            (b / f"{kind}.d").mkdir(exist_ok=True)
            link = b / f"{kind}.d" / ours
            if not link.is_symlink():
                link.symlink_to(b / f"{kind}.sh")
            (b / f"{kind}.d" / "50-site").write_text(site.format(base=b))
            (b / f"{kind}.d" / "50-site").chmod(0o755)
        (b / "site-taskprolog").write_text(SITE_TASKPROLOG.format(base=b, site_lib=SITE_LIB))
        (b / "site-taskprolog").chmod(0o755)

    def site_log(self) -> list[str]:
        path = self.base / "site.log"
        return path.read_text().splitlines() if path.exists() else []

    def slurmd_log(self) -> str:
        path = self.base / f"slurmd-{NODE}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def node_state(self) -> tuple[str, str]:
        out = self.run([BIN / "sinfo", "-h", "-N", "-n", NODE, "-o", "%T|%E"]).stdout
        state, _, reason = (out.splitlines() or [""])[0].partition("|")    # a line per partition
        return state.strip(), reason.strip()


@pytest.fixture(scope="module")
def site():
    need_real_slurm()

    def cancel_nobodys(cluster: SlurmCluster) -> None:
        cluster.run([BIN / "scancel", "--full", "-u", "nobody"], timeout=10)

    with running(ChainedCluster(cluster_dir("nvslurm-site-")), before_stop=cancel_nobodys) as cluster:
        yield cluster


@pytest.fixture
def chained(site):
    """The node serving jobs, no marker left; the test's jobs cancelled after it."""
    for marker in ("site-prolog-fails", "site-epilog-fails", "site-taskprolog-fails"):
        (site.base / marker).unlink(missing_ok=True)
    site.scontrol("update", f"nodename={NODE}", "state=resume")
    wait_until(site._nodes_idle, 30, "node serving jobs", site.diagnostics)
    yield site
    for user in ("root", "nobody"):
        site.run([BIN / "scancel", "-u", user], timeout=10)


@pytest.fixture
def jobdir(site, request):
    d = site.base / "jobs" / request.node.name[:60].replace("[", "-").replace("]", "")
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    return d


def submit(cluster, jobdir: Path, user: str, *args: str) -> int:
    """A batch job of `user` that writes its environment to env-<jobid>."""
    script = jobdir / "job.sh"
    script.write_text(f"#!/bin/sh\nenv -0 > {shlex.quote(str(jobdir))}/env-$SLURM_JOB_ID\n")
    script.chmod(0o755)
    argv = [BIN / "sbatch", "--parsable", "-w", NODE, "-o", str(jobdir / "out-%j"),
            f"--export=ALL,SITE_UNSET_ME=1,LD_PRELOAD={JOB_LIB}", *args, str(script)]
    if user != "root":
        argv = ["runuser", "-u", user, "--", *argv]
    result = cluster.run(argv, cwd=str(jobdir))
    assert result.returncode == 0, f"sbatch as {user}: {result.stderr}"
    return int(result.stdout.strip().split(";")[0])


def can_run_as(user: str) -> str:
    """'' when `user` can run this checkout's TaskProlog, else why not."""
    probe = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c",
                            "import nvshare_slurm.taskprolog, nvshare_slurm.node.sitetask"],
                           capture_output=True, text=True, timeout=60)
    return "" if probe.returncode == 0 else probe.stderr.strip()[-300:]


@pytest.mark.parametrize("user", ["root", "nobody"])
@pytest.mark.parametrize("gres", [True, False], ids=["nvshare", "no-gres"])
def test_site_and_nvshare_outputs_both_reach_the_task(chained, jobdir, user, gres):
    if user != "root" and shutil.which("runuser") is None:
        pytest.skip("needs runuser (util-linux)")
    if user != "root" and (why := can_run_as(user)):
        pytest.skip(f"{user} cannot run {sys.executable} with this checkout: {why}")
    uid = 0 if user == "root" else int(subprocess.check_output(["id", "-u", user]).decode())
    job = submit(chained, jobdir, user, *(["--gres=nvshare:1"] if gres else []))
    assert chained.wait_job(job, 60) == "COMPLETED", chained.diagnostics()
    env = read_env(jobdir / f"env-{job}")
    # The site's TaskProlog ran as the job's user, with the job's environment.
    assert env["SITE_SCRATCH"] == f"/scratch/{job}" and env["SITE_UID"] == str(uid)
    assert "SITE_UNSET_ME" not in env
    assert "site: hello from the site TaskProlog" in (jobdir / f"out-{job}").read_text()
    if gres:
        assert env["LD_PRELOAD"] == f"{libnvshare_file()}:{SITE_LIB}:{JOB_LIB}"
        assert env["CUDA_VISIBLE_DEVICES"] in GPU_UUIDS            # nvshare's placement wins
        assert env["NVSHARE_JOB_ID"] == str(job)
    else:
        assert env["LD_PRELOAD"] == f"{SITE_LIB}:{JOB_LIB}"        # the site's, untouched
        assert env["CUDA_VISIBLE_DEVICES"] == "site-choice"
        assert not [k for k in env if k.startswith("NVSHARE_")]
    # Both of the site's job scripts ran, as root, and nvshare's epilog unregistered the job.
    assert f"prolog {job} uid=0" in chained.site_log()
    assert f"epilog {job} uid=0" in chained.site_log()
    assert job not in registered_jobs(chained.nodes[NODE])


def test_a_failing_site_prolog_fails_the_prolog_with_its_status(chained, jobdir):
    (chained.base / "site-prolog-fails").touch()
    job = submit(chained, jobdir, "root", "--gres=nvshare:1")
    wait_until(lambda: "drain" in chained.node_state()[0].lower(), 60, "node drained",
               chained.diagnostics)
    # Slurm's own handling, as with the site's prolog alone: the node drains, the job is
    # requeued and held, and slurmd's log has the site script's status.
    wait_until(lambda: chained.job_field(job, "JobState") == "PENDING"
               and chained.job_field(job, "Priority") == "0", 60, "job requeued and held",
               chained.diagnostics)
    assert "prolog failed: rc:3" in chained.slurmd_log()
    assert f"prolog {job} uid=0" in chained.site_log()
    # Slurm stopped at the failing script: nvshare's prolog never registered the job.
    assert f"job {job}: registered for" not in chained.nodes[NODE].log_path.read_text()
    assert job not in registered_jobs(chained.nodes[NODE])
    # Slurm runs the Epilog of a job whose Prolog failed: both scripts, nvshare's a no-op.
    wait_until(lambda: f"epilog {job} uid=0" in chained.site_log(), 30, "the epilog ran",
               chained.diagnostics)

    # The site fixes its problem: a job then runs with both outputs. A new job, not the held one
    # released: Slurm 24.11 keeps the requeued job's credential revoked for a while and kills
    # its batch script as non-startable ("Job credential revoked"), whatever nvshare does.
    (chained.base / "site-prolog-fails").unlink()
    chained.run([BIN / "scancel", str(job)])
    chained.scontrol("update", f"nodename={NODE}", "state=resume")
    fixed = submit(chained, jobdir, "root", "--gres=nvshare:1")
    assert chained.wait_job(fixed, 90) == "COMPLETED", chained.diagnostics()
    env = read_env(jobdir / f"env-{fixed}")
    assert env.get("NVSHARE_JOB_ID") == str(fixed) and env["SITE_SCRATCH"] == f"/scratch/{fixed}", (
        (jobdir / f"out-{fixed}").read_text(errors="replace")[-2000:] + "\n--- scheduler log\n"
        + chained.nodes[NODE].log_path.read_text(errors="replace")[-3000:])


def test_a_failing_site_epilog_drains_and_nvshare_s_epilog_still_ran(chained, jobdir):
    (chained.base / "site-epilog-fails").touch()
    job = submit(chained, jobdir, "root", "--gres=nvshare:1")
    wait_until(lambda: "drain" in chained.node_state()[0].lower(), 60, "node drained",
               chained.diagnostics)
    assert "epilog failed: rc:4" in chained.slurmd_log()
    assert f"epilog {job} uid=0" in chained.site_log()
    # epilog.d/99-nvshare ran before the failing 50-site: the job is not left registered.
    assert read_env(jobdir / f"env-{job}")["NVSHARE_JOB_ID"] == str(job)
    assert job not in registered_jobs(chained.nodes[NODE])
    assert f"job {job}: unregistered (" in chained.nodes[NODE].log_path.read_text()


def test_a_failing_site_taskprolog_fails_the_task_with_its_status(chained, jobdir):
    (chained.base / "site-taskprolog-fails").touch()
    result = chained.run([BIN / "srun", "-w", NODE, "--gres=nvshare:1", "-o",
                          str(jobdir / "srun-%j.out"), "/bin/true"], cwd=str(jobdir), timeout=60)
    assert result.returncode == 5, (result.returncode, result.stderr)
    # The task's failure, not the node's: it goes back to serving jobs.
    wait_until(lambda: chained.node_state()[0] in ("idle", "mixed"), 30, "node serving jobs",
               lambda: f"{chained.node_state()}\n{chained.diagnostics()}")
