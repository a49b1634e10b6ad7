"""state.json that cannot be trusted, and lost state while Slurm cannot be asked (issue 25 item 5):
a bad file or entry is left out with a line naming it, never a crash loop; a lost job is never run
unshared: its re-registering processes are accepted provisionally where their cgroup vouches for
them, and wait for Slurm otherwise."""
from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

from helpers_daemon import GPU0, GPU1, NOBODY, gpu_status, wait_for_log
from helpers_procs import JobCgroup, finish, read_line, start_client
from helpers_slurm import DATA
from lockclient import connect_and_register, gpu_frame
from nvshare_slurm.node.statefile import job_in_state, nesting_depth
from nvshare_slurm.scheduler.registry import Registry
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C


def _job(job_id: int, **changes) -> dict:
    job = {"job_id": job_id, "uid": 0, "gid": 0, "user": "root", "name": "", "slots": 1,
           "gpus": [GPU0], "gpu_index": [0]}
    job.update(changes)
    return job


def _write_state(state_dir: Path, data: dict | str) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "state.json").write_text(data if isinstance(data, str) else json.dumps(data))


def test_deeply_nested_state_is_kept_aside_not_a_crash_loop(scheduler_factory):
    sched = scheduler_factory(start=False)
    deep = '{"version": 1, "jobs": [], "gpu_overrides": {"x": ' + "[" * 200_000 + "]" * 200_000 \
        + "}}"
    _write_state(Path(sched.state_dir), deep)
    sched.start()
    time.sleep(0.3)
    assert sched.proc.poll() is None, sched.log()
    assert "nested 200002 deep" in sched.log()
    assert [p for p in Path(sched.state_dir).iterdir() if p.name.startswith("state.json.broken-")]
    sched.client().register_job(1, uid=0, gid=0, gpu_index=[0])      # and it serves
    sock, body = connect_and_register(sched.socket, 1)
    assert body.status == C.NVSHARE_OK


def test_nesting_depth_ignores_brackets_in_strings():
    assert nesting_depth('{"a": [1, {"b": "[[[{{{"}]}') == 3
    assert nesting_depth('"\\"[[["') == 0


def test_state_file_past_the_size_bound_is_refused(tmp_path, monkeypatch):
    from nvshare_slurm.node import statefile
    monkeypatch.setattr(statefile, "STATE_MAX_BYTES", 1000)
    _write_state(tmp_path, {"version": 1, "jobs": [_job(i) for i in range(1, 40)]})
    reg = Registry(str(tmp_path))
    assert not reg.load({GPU0}).complete and reg.jobs == {}


def test_bad_admin_overrides_are_dropped_by_name_and_locks_still_granted(scheduler_factory):
    sched = scheduler_factory(start=False, scheduling_mode="concurrent")
    _write_state(Path(sched.state_dir), {"version": 1, "jobs": [_job(1)], "gpu_overrides": {
        GPU0: {"switch_time_fixed": "5", "max_runtime_sec": -3, "mode": "serial",
               "drop_grace_sec": 0},
        GPU1: {"memory_reserve_percent": True, "switch_time_mode": "fixed",
               "switch_time_fixed": 2.5}}})
    sched.start()
    log = sched.log()
    assert "override switch_time_fixed='5' is of the wrong type or out of range" in log
    assert "override max_runtime_sec=-3" in log and "override drop_grace_sec is not one" in log
    assert "override memory_reserve_percent=True" in log
    assert gpu_status(sched, GPU0)["mode"] == "serial"          # the good one stays
    assert gpu_status(sched, GPU1)["switch_interval_sec"] == 2.5
    sock, body = connect_and_register(sched.socket, 1)
    sock.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0))
    assert proto.recv_frame(sock).type == C.NVSHARE_MSG_LOCK_GRANT
    assert sched.proc.poll() is None


def test_job_entries_out_of_range_are_left_out_one_by_one(tmp_path):
    _write_state(tmp_path, {"version": 1, "jobs": [
        _job(1), _job(2, slots=-1), _job(3, gpu_index=[-5]), _job(4, registered=float("inf")),
        _job(1, name="twice"), _job(5, uid=1 << 40)]})
    reg = Registry(str(tmp_path))
    result = reg.load({GPU0})
    assert sorted(reg.jobs) == [1] and not result.complete
    assert len(result.problems) == 5


def test_job_in_state_reads_without_moving_anything(tmp_path):
    assert job_in_state(str(tmp_path), 1) is None
    _write_state(tmp_path, {"version": 1, "jobs": [_job(4)]})
    assert job_in_state(str(tmp_path), 4) is True and job_in_state(str(tmp_path), 5) is False
    (tmp_path / "state.json").write_text("[" * 100_000)
    assert job_in_state(str(tmp_path), 4) is None
    assert (tmp_path / "state.json").exists()


# --- lost state, Slurm not answering -------------------------------------------------------------

def _scontrol_down_until(bindir: Path, flag: Path, record: Path) -> None:
    """scontrol that cannot reach slurmctld until `flag` exists, then prints `record`."""
    script = bindir / "scontrol"
    script.write_text(
        "#!/bin/sh\ncase \"$1\" in --json) echo \"scontrol: unrecognized option '--json'\" >&2;"
        f" exit 1;; esac\nif [ -e {flag} ]; then cat {record}; exit 0; fi\n"
        "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2\n"
        "exit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_lost_state_with_slurm_down_gates_processes_their_cgroup_vouches_for(scheduler_factory,
                                                                              tmp_path):
    sched = scheduler_factory(start=False, node_name="n1", scheduling_mode="concurrent")
    flag, record = tmp_path / "slurm-up", tmp_path / "record.txt"
    record.write_text((DATA / "count_only_1.txt").read_text()
                      .replace("JobId=1 ", "JobId=7 ").replace("root(0)", f"nobody({NOBODY})"))
    _scontrol_down_until(Path(sched.workdir), flag, record)
    job7 = JobCgroup(7, NOBODY)
    other = JobCgroup(8, NOBODY)
    env = {**os.environ, "NVSHARE_MANAGED_GPUS": GPU1}
    procs = []
    try:
        sched.start()
        wait_for_log(sched, "cannot rebuild the registry from Slurm")
        first = start_client(sched.socket, 7, GPU1, job7.enter(NOBODY), env)
        procs.append(first)
        assert read_line(first) == "registered 0"          # provisional, not "no such job"
        assert read_line(first) == "lock grant"
        second = start_client(sched.socket, 7, GPU1, job7.enter(NOBODY), env, wait=1.0)
        procs.append(second)
        assert read_line(second) == "registered 0"
        assert read_line(second) == "lock none"            # gated: the first one holds GPU1
        job = sched.client().status(C.NVSHARE_STATUS_JOB, 7)["jobs"][0]
        assert job["provisional"] is True and job["gpus"] == [GPU1] and job["uid"] == NOBODY
        # A process whose cgroup is another job's is not taken at its word: it waits for Slurm.
        stranger = start_client(sched.socket, 9, GPU1, other.enter(NOBODY), env, wait=1.5)
        procs.append(stranger)
        assert read_line(stranger) == "registered none"
        assert "accepted provisionally" in sched.log()
        flag.touch()                                       # Slurm answers again
        wait_for_log(sched, "job 7: accepted provisionally, now confirmed by Slurm", timeout=10)
        job = sched.client().status(C.NVSHARE_STATUS_JOB, 7)["jobs"][0]
        assert job["provisional"] is False and job["gpus"] == [GPU1]
    finally:
        for proc in procs:
            finish(proc)
        job7.close()
        other.close()


def test_lost_state_with_slurm_down_never_answers_no_such_job(scheduler_factory, tmp_path):
    """Before: one failed scontrol ended the rebuild, the parked client heard NOJOB and its hook
    ran unshared. Now it waits, and is answered as soon as its prolog registers the job."""
    sched = scheduler_factory(start=False, node_name="n1")
    _scontrol_down_until(Path(sched.workdir), tmp_path / "never", tmp_path / "none")
    sched.start()
    wait_for_log(sched, "cannot rebuild the registry from Slurm")
    waiting = start_client(sched.socket, 5, GPU0, wait=6.0)
    try:
        time.sleep(2.0)                                    # past the first retries
        sched.client().register_job(5, uid=0, gid=0, gpu_index=[0])
        assert read_line(waiting) == "registered 0"
        assert read_line(waiting) == "lock grant"
    finally:
        finish(waiting)
