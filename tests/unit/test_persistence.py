"""state.json (jobs, placements, admin overrides) and rogue-process handling with a fake inventory."""
from __future__ import annotations

import asyncio
import json
import subprocess

from nvshare_slurm.base import config
from nvshare_slurm.daemon import Daemon
from nvshare_slurm.node.inventory import GpuInfo, GpuProcess
from nvshare_slurm.scheduler.registry import Job, Registry


def test_state_round_trip_and_atomic_write(tmp_path):
    reg = Registry(str(tmp_path / "state"))
    reg.add_job(Job(12, 1000, 1000, "alice", "train", 1, ["GPU-a"], [0]))
    reg.gpu_overrides["GPU-a"] = {"mode": "serial"}
    reg.save()
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["state.json"]  # no temp left
    again = Registry(str(tmp_path / "state"))
    again.load({"GPU-a"})
    assert again.jobs[12].user == "alice" and again.jobs[12].gpus == ["GPU-a"]
    assert again.gpu_overrides == {"GPU-a": {"mode": "serial"}}


def test_a_state_file_of_the_version_with_a_job_wide_cap_still_loads(tmp_path):
    """Before 0.1.0 every job entry had mem_limit (always 0: nothing set it): read and dropped."""
    reg = Registry(str(tmp_path))
    reg.add_job(Job(12, 1000, 1000, "alice", "train", 1, ["GPU-a"], [0]))
    reg.save()
    state = json.loads((tmp_path / "state.json").read_text())
    for entry in state["jobs"]:
        entry["mem_limit"] = 0
    (tmp_path / "state.json").write_text(json.dumps(state))
    again = Registry(str(tmp_path))
    again.load({"GPU-a"})
    assert again.jobs[12].user == "alice" and not hasattr(again.jobs[12], "mem_limit")


def test_gone_gpus_are_dropped_from_restored_placements(tmp_path):
    reg = Registry(str(tmp_path))
    reg.add_job(Job(1, 0, 0, "root", "", 2, ["GPU-a", "GPU-b"], [0, 1]))
    reg.add_job(Job(2, 0, 0, "root", "", 1, ["GPU-b"], [1]))
    reg.save()
    again = Registry(str(tmp_path))
    again.load({"GPU-a"})
    assert again.jobs[1].gpus == ["GPU-a"] and again.jobs[1].gpu_index == [0]
    assert 2 not in again.jobs


def test_broken_state_file_is_kept_aside_not_lost(tmp_path):
    (tmp_path / "state.json").write_text("{not json")
    reg = Registry(str(tmp_path))
    reg.load({"GPU-a"})
    assert reg.jobs == {}
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("state.json.broken-")]
    assert len(aside) == 1 and aside[0].read_text() == "{not json"


class FakeInventory:
    def __init__(self, procs):
        self.procs = procs

    def gpus(self):
        return [GpuInfo("GPU-a", 0, "fake", 16 << 30)]

    def processes(self, uuid):
        return list(self.procs.get(uuid, []))

    def driver_memory(self, uuid):
        return None


def _daemon(tmp_path, procs, policy):
    cfg = config.Config(state_dir=str(tmp_path), socket=str(tmp_path / "s"),
                        rogue_process=policy)
    return Daemon(cfg, inventory=FakeInventory(procs))


def test_rogue_process_reported_after_two_checks(tmp_path):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        d = _daemon(tmp_path, {"GPU-a": [GpuProcess(victim.pid, 1 << 30)]}, "warn")
        asyncio.run(d.check_rogues())
        gpus = json.loads(d.status(1)[1])["gpus"]
        assert gpus[0]["rogue"] == []               # a fresh process may still be registering
        asyncio.run(d.check_rogues())
        gpus = json.loads(d.status(1)[1])["gpus"]
        assert gpus[0]["rogue"] == [{"pid": victim.pid, "memory": 1 << 30}]
        assert victim.poll() is None                # warn: not killed
    finally:
        victim.kill()
        victim.wait()


def test_rogue_process_killed_with_kill_policy_registered_clients_spared(tmp_path):
    victim = subprocess.Popen(["sleep", "30"])
    client = subprocess.Popen(["sleep", "30"])
    try:
        d = _daemon(tmp_path, {"GPU-a": [GpuProcess(victim.pid, 1), GpuProcess(client.pid, 1)]},
                    "kill")
        d.registry.add_client(1, 0, client.pid, 0, "root", 0, None)
        asyncio.run(d.check_rogues())
        asyncio.run(d.check_rogues())
        assert victim.wait(timeout=5) == -9
        assert client.poll() is None
    finally:
        for proc in (victim, client):
            proc.kill()
            proc.wait()
