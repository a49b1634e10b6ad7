"""Per-job GPU accounting (nvshare_slurm/scheduler/accounting.py) driven by the real policy with a
fake clock."""
from __future__ import annotations

import pytest

from nvshare_slurm.policy.gpustate import GpuState
from nvshare_slurm.policy.policytypes import ClientInfo, GpuSettings
from nvshare_slurm.scheduler.accounting import UsageLedger, usage_line

G = 1 << 30


def gpu(**settings) -> GpuState:
    base = dict(mode="concurrent", switch_time_mode="fixed", switch_time_fixed=10.0,
                memory_reserve_percent=0, max_runtime_sec=100, drop_grace_sec=5.0)
    base.update(settings)
    return GpuState("GPU-acct", 0, 16 * G, GpuSettings(**base))


def client(n: int, job: int) -> ClientInfo:
    return ClientInfo(n, job, 0, 1000 + n, "user", 0)


class Run:
    """The GPU and the ledger, observed after every step as the daemon does."""

    def __init__(self, g: GpuState):
        self.g = g
        self.ledger = UsageLedger()

    def __call__(self, now: float, step) -> None:
        step(now)
        self.ledger.observe(self.g, now)

    def usage(self, job: int, now: float) -> dict:
        return self.ledger.job_usage(job, now)[self.g.uuid]


def test_turns_held_and_wait_seconds_add_up_to_the_timeline():
    run = Run(gpu())
    a, b = client(1, 10), client(2, 20)
    run(0.0, lambda t: run.g.request(a, t))
    run(1.0, lambda t: run.g.request(b, t))        # b waits from 1.0
    run(11.0, lambda t: run.g.tick(t))             # a's turn ends: DROP_LOCK at 11.0
    run(11.5, lambda t: run.g.release(1, t))       # drained 0.5 s later; b holds from 11.5
    run(12.0, lambda t: run.g.request(a, t))       # a waits from 12.0
    run(15.0, lambda t: run.g.release(2, t))       # b gives it back early; a holds from 15.0
    ua, ub = run.usage(10, 20.0), run.usage(20, 20.0)
    assert ua["held_sec"] == pytest.approx(11.5 + 5.0)        # 0..11.5 and 15..20 (still holding)
    assert ua["wait_sec"] == pytest.approx(3.0)               # 12..15
    assert ub["held_sec"] == pytest.approx(3.5)               # 11.5..15
    assert ub["wait_sec"] == pytest.approx(10.5)              # 1..11.5
    assert (ua["turns"], ub["turns"]) == (2, 1)
    counters = run.ledger.gpus[run.g.uuid]
    assert counters.handovers == 3
    assert counters.drains == 1 and counters.drain_sec == pytest.approx(0.5)


def test_a_job_with_two_processes_counts_its_time_once():
    run = Run(gpu(mode="serial"))                  # serial: a job's clients hold together
    a1, a2, b = client(1, 10), client(2, 10), client(3, 20)
    run(0.0, lambda t: run.g.request(a1, t))
    run(1.0, lambda t: run.g.request(a2, t))
    run(2.0, lambda t: run.g.request(b, t))
    run(4.0, lambda t: run.g.remove_client(1, t))  # a2 still holds: job 10 still holds
    run(6.0, lambda t: run.g.remove_client(2, t))  # job 10 gone from the GPU; b holds from 6.0
    ua, ub = run.usage(10, 8.0), run.usage(20, 8.0)
    assert ua["held_sec"] == pytest.approx(6.0)
    assert ua["wait_sec"] == 0
    assert ub["wait_sec"] == pytest.approx(4.0) and ub["held_sec"] == pytest.approx(2.0)


def test_peak_memory_and_swapped_bytes():
    run = Run(gpu(mode="auto", auto_share="turns"))
    a = client(1, 10)
    run(0.0, lambda t: run.g.request(a, t))
    run(0.1, lambda t: run.g.mem_update(a, t, 6 * G, G, 0, 0, 0, 0))
    run(0.2, lambda t: run.g.mem_update(a, t, 2 * G, G, 0, 0, 0, 0))     # freed some
    run(0.3, lambda t: run.g.mem_update(a, t, G, G, 3 * G, 0, 0, 0))     # 3 GiB moved out
    run(0.4, lambda t: run.g.mem_update(a, t, 4 * G, G, 0, 0, 0, 0))     # and back in
    u = run.usage(10, 1.0)
    assert u["peak_memory"] == 6 * G
    assert u["swapped_out"] == 3 * G
    counters = run.ledger.gpus[run.g.uuid]
    assert counters.swap_out_bytes == 3 * G and counters.swap_in_bytes == 3 * G
    run(0.5, lambda t: run.g.mem_update(a, t, G, G, 2 * G, 0, 0, 0))     # 2 GiB out again
    run(0.6, lambda t: run.g.remove_client(1, t))                       # gone: nothing came back
    assert counters.swap_out_bytes == 5 * G and counters.swap_in_bytes == 3 * G
    assert run.usage(10, 1.0)["swapped_out"] == 5 * G


def test_forget_job_and_usage_line():
    run = Run(gpu())
    run(0.0, lambda t: run.g.request(client(1, 10), t))
    usage = run.ledger.job_usage(10, 2.5)
    line = usage_line(usage, {run.g.uuid: 0})
    assert line == "gpu0 held=2.5s wait=0.0s peak=0B swapped=0B turns=1"
    run.ledger.forget_job(10)
    assert run.ledger.job_usage(10, 3.0) == {}
    assert usage_line({}) == "no GPU work"
