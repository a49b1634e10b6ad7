"""Tier 4 with two or more GPUs: each GPU is scheduled on its own, a two-GPU DDP job (NCCL) runs
correctly under the hook, and two such jobs on the same GPUs take gang turns. (Through Slurm:
scripts/gpu-two-gpu-proof.sh.)"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import GPU_COUNT, HERE, finish, train_cmd

pytestmark = pytest.mark.skipif(GPU_COUNT < 2, reason="needs two GPUs (the nvidia-h200-x2 machine)")


def _register_on(jobs, index: int | list[int]) -> tuple[int, list[str]]:
    jobs.next_job += 1
    indices = index if isinstance(index, list) else [index]
    name = f"gpu{'+'.join(map(str, indices))}-{jobs.next_job}"
    placement = jobs.sched.client().register_job(jobs.next_job, uid=0, gid=0, gpu_index=indices,
                                                  name=name, user="root")
    return jobs.next_job, placement["gpu_uuid"]


def _max_gap(result: dict) -> float:
    t = result["times"]
    return max(b - a for a, b in zip(t, t[1:], strict=False))


def test_a_job_on_one_gpu_never_waits_for_another_gpu(gpu_jobs):
    jobs = gpu_jobs(scheduling_mode="concurrent", switch_time_mode="fixed", switch_time_fixed=2.0)
    (ja, ua), (jc, uc), (jb, ub) = _register_on(jobs, 0), _register_on(jobs, 0), _register_on(jobs, 1)
    assert ua == uc != ub
    args = ("--steps", "300", "--width", "2048", "--batch", "1024")
    procs = [jobs.popen(train_cmd(*args), j, u) for j, u in ((ja, ua), (jc, uc), (jb, ub))]
    a, c, b = (finish(p) for p in procs)
    # GPU 0 was contended: its two jobs took 2 s turns, so each waited at least once.
    assert max(_max_gap(a), _max_gap(c)) > 1.5
    # The job alone on GPU 1 ran while they did, and never waited for a turn.
    assert b["times"][0] < max(a["times"][-1], c["times"][-1])
    assert _max_gap(b) < 0.5, _max_gap(b)


def _ddp(env: dict, *args: str) -> dict:
    res = subprocess.run([sys.executable, str(HERE / "ddp_train.py"), *(args or ("--steps", "60"))],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_two_gpu_ddp_job_runs_under_the_hook_with_the_same_losses(gpu_jobs):
    jobs = gpu_jobs()
    job, uuids = jobs.register(slots=2)
    assert len(set(uuids)) == 2
    plain = _ddp(jobs.env(job, uuids, hooked=False))
    hooked = _ddp(jobs.env(job, uuids, hooked=True))
    assert hooked["world"] == 2
    assert hooked["losses"] == plain["losses"]
    assert hooked["checksums"][0] == hooked["checksums"][1] == plain["checksums"][0]
    # Both ranks were the job's clients under the hook (each registered with the daemon).
    log = jobs.sched.log()
    assert all(f"pid {pid}" in log for pid in hooked["pids"]), log[-3000:]


def test_two_two_gpu_ddp_jobs_on_the_same_gpus_complete_in_gang_turns(gpu_jobs):
    # Two DDP jobs on the same two GPUs: with a lock per GPU they could each hold one GPU while
    # their collectives wait for the other (issue 11); gang turns give each job both or neither.
    jobs = gpu_jobs(scheduling_mode="concurrent", switch_time_mode="fixed", switch_time_fixed=1.0)
    args = ("--steps", "200", "--width", "4096", "--depth", "4", "--batch", "4096")  # ~5 s alone
    (ja, ua), (jb, ub) = _register_on(jobs, [0, 1]), _register_on(jobs, [0, 1])
    assert ua == ub and len(set(ua)) == 2
    alone = _ddp(jobs.env(ja, ua), *args)
    procs = [jobs.popen([sys.executable, str(HERE / "ddp_train.py"), *args], j, u)
             for j, u in ((ja, ua), (jb, ub))]
    a, b = (finish(p, timeout=600) for p in procs)
    assert a["loss_digest"] == b["loss_digest"] == alone["loss_digest"]
    # They shared: the training phases overlapped, and each job got its turns on both GPUs.
    assert max(a["start"], b["start"]) < min(a["end"], b["end"])
    log = jobs.sched.log()
    for job in (ja, jb):
        assert f"job {job}: a gang on GPUs" in log, log[-3000:]
