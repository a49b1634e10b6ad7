"""The per-job GPU usage line at job end and its AdminComment (written by the scheduler), against
the real scheduler and a recorded-output scontrol stand-in (tests/conftest.py's fake_slurm)."""
from __future__ import annotations

import json

import pytest

from conftest import FAKE_GPUS
from lockclient import ClientProc
from nvshare_slurm import epilog
from nvshare_slurm.scheduler.admincomment import merge
from helpers_daemon import wait_for_log
from helpers_slurm import DATA, slurm_env

GPU0 = FAKE_GPUS[0]["uuid"]
G = 1 << 30


def run_a_turn(sched, job_id: int) -> None:
    sched.client().register_job(job_id, uid=0, gid=0, gpu_index=[0])
    proc = ClientProc(sched.socket, job_id, 0)
    try:
        proc.send(f"request {GPU0}")
        proc.expect("grant", gpu=GPU0)
        proc.send(f"mem {GPU0} {G} 0 0 0")
        proc.send(f"release {GPU0}")
        proc.expect("released", gpu=GPU0)
    finally:
        proc.close()


def comment_scheduler(scheduler_factory, fake_slurm, **settings):
    """A scheduler that asks the fake scontrol (node n7: the recorded job runs on n1, so the
    rebuild at start registers nothing) and writes AdminComment."""
    return scheduler_factory(slurm_bin_dir=str(fake_slurm.bindir), node_name="n7",
                             usage_admin_comment=True, **settings)


def test_scheduler_writes_the_usage_line_to_admin_comment(tmp_path, fake_slurm, scheduler_factory,
                                                          capsys):
    """At job end the scheduler puts its usage line into the job's AdminComment, beside what the
    site and other nodes wrote, replacing this node's earlier part, and logs that it did."""
    record = tmp_path / "record.txt"
    record.write_text((DATA / "count_only_1.txt").read_text().replace(
        "   Power=\n", "   Power=\n   AdminComment=site note | nvshare n7: stale\n"))
    calls = fake_slurm(str(record))
    sched = comment_scheduler(scheduler_factory, fake_slurm)
    run_a_turn(sched, 1)
    env = slurm_env(tmp_path, fake_slurm.bindir, 1, socket_path=sched.socket)
    assert epilog.run(env, wait_sec=2) == 0
    err = capsys.readouterr().err
    assert "nvshare-epilog: job 1: GPU usage on n1: gpu0 held=" in err
    assert "peak=1.0G swapped=0B turns=1" in err
    wait_for_log(sched, "job 1: GPU usage written to its AdminComment (scontrol)")
    update = [c for c in calls.read_text().splitlines() if c.startswith("update")]
    assert len(update) == 1
    assert update[0].startswith("update JobId=1 AdminComment=site note | nvshare n7: gpu0 held=")
    assert "stale" not in update[0]


def test_without_admin_comment_the_usage_is_only_logged(tmp_path, fake_slurm, scheduler_factory):
    calls = fake_slurm("count_only_1.txt")
    sched = scheduler_factory(slurm_bin_dir=str(fake_slurm.bindir), node_name="n7")
    run_a_turn(sched, 2)
    env = slurm_env(tmp_path, fake_slurm.bindir, 2, socket_path=sched.socket)
    assert epilog.run(env, wait_sec=2) == 0
    wait_for_log(sched, "job 2: unregistered (0 clients disconnected); GPU usage: gpu0 held=")
    assert "AdminComment" not in sched.log()
    assert not calls.exists() or "update" not in calls.read_text()


def test_an_admin_comment_slurm_refuses_is_logged_by_the_scheduler(tmp_path, fake_slurm,
                                                                    scheduler_factory):
    """The epilog ran as ever (it succeeds, the node is not drained); before, its complaint went
    to slurmd, which drops what a successful epilog prints: the refusal was seen nowhere."""
    fake_slurm("count_only_1.txt", exit_code=1)            # scontrol cannot describe the job
    sched = comment_scheduler(scheduler_factory, fake_slurm)
    run_a_turn(sched, 3)
    env = slurm_env(tmp_path, fake_slurm.bindir, 3, socket_path=sched.socket)
    assert epilog.run(env, wait_sec=2) == 0
    wait_for_log(sched, "job 3: GPU usage not written to its AdminComment: scontrol show job -d 3")


def test_merge_admin_comment_keeps_others_and_replaces_this_node():
    assert merge("", "n1", "x") == "nvshare n1: x"
    assert merge("nvshare n2: y", "n1", "x") == "nvshare n2: y | nvshare n1: x"
    assert merge("site | nvshare n1: old", "n1", "x") == "site | nvshare n1: x"


def test_a_finished_job_gets_its_admin_comment_through_the_accounting_database(tmp_path):
    """slurmctld refuses to update a finished job (Slurm 22.05, in the epilog): sacctmgr takes it."""
    from nvshare_slurm.node import slurm
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    for name, body in (("scontrol", 'echo "slurm_update error: Job has already finished" >&2; '
                                    "exit 1"),
                       ("sacctmgr", "exit 0")):
        script = bindir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{body}\n')
        script.chmod(0o755)
    assert slurm.set_admin_comment(5, "nvshare n1: gpu0 held=1.0s", str(bindir)) == "sacctmgr"
    assert calls.read_text().splitlines()[-1] == \
        "sacctmgr -i modify job where jobid=5 set AdminComment=nvshare n1: gpu0 held=1.0s"
    (bindir / "sacctmgr").write_text("#!/bin/sh\necho 'no database' >&2\nexit 1\n")
    with pytest.raises(slurm.SlurmError) as info:
        slurm.set_admin_comment(5, "x", str(bindir))
    assert "Job has already finished" in str(info.value) and "no database" in str(info.value)


# --- the scheduler down at job end: drain only when the job can have left state here -----------
# (issue 25 item 8: while the job is COMPLETING its node line shows GRES= empty, so the node line
# cannot say whether it held nvshare; what the daemon recorded, or the job's request, can.)

def _down_env(tmp_path, bindir, job_id: int, state_jobs: list[int] | None):
    state = tmp_path / "state"
    if state_jobs is not None:
        state.mkdir()
        (state / "state.json").write_text(json.dumps({"version": 1, "gpu_overrides": {}, "jobs": [
            {"job_id": j, "uid": 0, "gid": 0, "user": "root", "name": "", "slots": 1,
             "gpus": [GPU0], "gpu_index": [0]} for j in state_jobs]}))
    return slurm_env(tmp_path, bindir, job_id, NVSHARE_STATE_DIR=str(state))


def _completing_record(tmp_path, gres_line: bool = False, nvshare: bool = True):
    text = (DATA / "count_only_1.txt").read_text().replace("JobState=RUNNING",
                                                           "JobState=COMPLETING")
    if not gres_line:
        text = text.replace("GRES=nvshare(CNT:1)", "GRES=")
    if not nvshare:
        text = text.replace("   TresPerNode=gres:nvshare:1\n", "")
    path = tmp_path / "completing.txt"
    path.write_text(text)
    return str(path)


def _drained(calls) -> bool:
    return calls.exists() and "update nodename=n1 state=drain" in calls.read_text()


def test_epilog_drains_for_a_completing_nvshare_job_with_the_scheduler_down(tmp_path, fake_slurm,
                                                                           capsys):
    calls = fake_slurm(_completing_record(tmp_path))
    env = _down_env(tmp_path, fake_slurm.bindir, 1, state_jobs=None)   # no state file at all
    assert epilog.run(env, wait_sec=0.2) == 1
    assert _drained(calls)
    assert "nvshare: scheduler not running" in capsys.readouterr().err


def test_epilog_drains_for_a_registered_job_whatever_slurm_says(tmp_path, fake_slurm):
    calls = fake_slurm(_completing_record(tmp_path, nvshare=False))
    env = _down_env(tmp_path, fake_slurm.bindir, 1, state_jobs=[1])
    assert epilog.run(env, wait_sec=0.2) == 1 and _drained(calls)


def test_epilog_leaves_a_job_without_nvshare_alone_with_the_scheduler_down(tmp_path, fake_slurm,
                                                                          capsys):
    calls = fake_slurm(_completing_record(tmp_path, nvshare=False))
    env = _down_env(tmp_path, fake_slurm.bindir, 1, state_jobs=[2])
    assert epilog.run(env, wait_sec=0.2) == 0 and not _drained(calls)
    assert "not draining" in capsys.readouterr().err


def _scontrol(bindir, complaint: str):
    script = bindir / "scontrol"
    calls = bindir.parent / "calls"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\ncase \"$1\" in show|--json) "
                      f"echo '{complaint}' >&2; exit 1;; esac\nexit 0\n")
    script.chmod(0o755)
    return calls


def test_epilog_by_hand_for_a_job_slurm_does_not_know_never_drains(tmp_path, fake_slurm):
    calls = _scontrol(fake_slurm.bindir, "slurm_load_jobs error: Invalid job id specified")
    env = _down_env(tmp_path, fake_slurm.bindir, 4242, state_jobs=[1])
    assert epilog.run(env, wait_sec=0.2) == 0 and not _drained(calls)


def test_epilog_with_slurm_down_too_trusts_the_daemons_record(tmp_path, fake_slurm):
    calls = _scontrol(fake_slurm.bindir, "slurm_load_jobs error: Unable to contact slurm "
                                         "controller (connect failure)")
    env = _down_env(tmp_path, fake_slurm.bindir, 3, state_jobs=[1])       # not registered
    assert epilog.run(env, wait_sec=0.2) == 0 and not _drained(calls)
    (tmp_path / "state" / "state.json").unlink()
    assert epilog.run(env, wait_sec=0.2) == 1 and _drained(calls)          # cannot tell: drain
