"""Gang turns (nvshare_slurm/policy/gang.py) over per-GPU states, driven with a fake clock.

`Node` plays the daemon: it sends each event to one GPU, then runs the gang pass, and collects
what would go out. `simulate` plays compute-bound clients that never idle: a DROP_LOCK is
answered after a short drain, then the client asks again at once, unless the test makes its
drain wait for a peer rank (the NCCL case): then it releases only once that peer holds its GPU.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from nvshare_slurm.policy.gang import GangPolicy
from nvshare_slurm.policy.gpustate import GpuState
from nvshare_slurm.policy.policytypes import (CONTENDED, DROP, GRANT, HANDOFF, SWAP_OUT, UNRESPONSIVE,
                                              GANG_STEP_WINDOW_MIN, ClientInfo, GpuSettings)

G = 1 << 30


class Node:
    def __init__(self, n_gpus: int = 2, **settings):
        base = dict(mode="concurrent", switch_time_mode="fixed", switch_time_fixed=1.0,
                    memory_reserve_percent=0, drop_grace_sec=4.0)
        base.update(settings)
        self.gpus = [GpuState(f"GPU-{i}", i, 16 * G, GpuSettings(**base)) for i in range(n_gpus)]
        self.policy = GangPolicy()
        self.clients: dict[int, tuple[ClientInfo, int]] = {}     # id -> (client, GPU index)
        self.sent: list[tuple[int, str, int]] = []

    def job(self, job_id: int, *gpus: int) -> None:
        self.policy.add_job(job_id, [self.gpus[i] for i in gpus])

    def client(self, cid: int, job: int, gpu: int) -> ClientInfo:
        info = ClientInfo(cid, job, 0, 1000 + cid, "user")
        self.clients[cid] = (info, gpu)
        return info

    def _pass(self, gpu: GpuState, actions, now: float) -> list[tuple[str, int]]:
        found = [(gpu.index, a) for a in actions]
        found += [(g.index, a) for g, acts in self.policy.schedule(now) for a in acts]
        result = [(a.kind, a.client.client_id) for _, a in found]
        self.sent += [(i, a.kind, a.client.client_id) for i, a in found]
        return result

    def request(self, cid: int, now: float):
        info, gpu = self.clients[cid]
        return self._pass(self.gpus[gpu], self.gpus[gpu].request(info, now), now)

    def release(self, cid: int, now: float):
        gpu = self.gpus[self.clients[cid][1]]
        return self._pass(gpu, gpu.release(cid, now), now)

    def stuck(self, cid: int, now: float) -> str:
        info, gpu = self.clients[cid]
        note = self.policy.drain_stuck(self.gpus[gpu], info, now)
        self._pass(self.gpus[gpu], self.gpus[gpu].tick(now), now)
        return note

    def tick(self, now: float):
        out = []
        for gpu in self.gpus:
            out += self._pass(gpu, gpu.tick(now), now)
        return out

    def deadline(self) -> float | None:
        return min((d for g in self.gpus if (d := g.next_deadline()) is not None), default=None)

    def holding(self) -> dict[int, set[int]]:
        """job -> GPU indices it holds now."""
        held: dict[int, set[int]] = {}
        for gpu in self.gpus:
            for holder in gpu.holders.values():
                held.setdefault(holder.client.job_id, set()).add(gpu.index)
        return held


def never_half(node: Node, gangs: dict[int, set[int]]) -> None:
    """No two gangs hold GPUs at once when their GPU sets overlap; no two jobs share a GPU."""
    held = node.holding()
    for a, b in itertools.combinations([j for j in held if j in gangs], 2):
        assert not gangs[a] & gangs[b], f"gangs {a} and {b} hold {held[a]} and {held[b]}"
    for gpu in node.gpus:
        assert len({h.client.job_id for h in gpu.holders.values()}) <= 1, gpu.holders


def simulate(node: Node, until: float, gangs: dict[int, set[int]], start: list[int],
             waits_for: dict[int, int] | None = None, drain: float | dict[int, float] = 0.01,
             step: float = 0.05, behind: set[int] | None = None) -> dict[int, float]:
    """Compute-bound clients from `start` (request order, `step` apart) until `until`.
    Returns the seconds each client held its GPU. `waits_for`: client -> peer whose grant its
    drain needs (a collective in flight). `drain`: seconds from DROP_LOCK to release (per client
    when a dict). `behind`: clients that each DROP_LOCK catches one collective behind their
    peer (between two collectives, nothing in flight): the peer's drain then needs them to be
    granted again after the DROP_LOCK."""
    waits_for = waits_for or {}
    behind = behind or set()
    drains = drain if isinstance(drain, dict) else {cid: drain for cid in node.clients}
    held: dict[int, float] = {cid: 0.0 for cid in node.clients}
    since: dict[int, float] = {}
    releases: dict[int, float] = {}       # cid -> when its drain ends
    now = 0.0
    pending_starts = [(i * step, cid) for i, cid in enumerate(start)]

    def holders() -> set[int]:
        return {cid for g in node.gpus for cid in g.holders}

    reached: set[int] = set()         # dropped clients whose peer reached the collective

    def react(actions, now):
        for kind, cid in actions:
            if kind == DROP:
                releases.setdefault(cid, now + drains[cid])
                if waits_for.get(cid) in holders() and waits_for[cid] not in behind:
                    reached.add(cid)
            elif kind == GRANT:
                reached.update(c for c, peer in waits_for.items() if peer == cid and c in releases)

    while now < until:
        for at, cid in [p for p in pending_starts if p[0] <= now]:
            pending_starts.remove((at, cid))
            react(node.request(cid, now), now)
        for cid, at in sorted(releases.items(), key=lambda kv: kv[1]):
            if at > now or cid not in holders():
                if cid not in holders():
                    releases.pop(cid)
                continue
            peer = waits_for.get(cid)
            if peer in holders() and peer not in behind:
                reached.add(cid)
            if peer is not None and cid not in reached:
                continue                   # its collective waits for a peer that is shut out
            releases.pop(cid)
            reached.discard(cid)
            held[cid] += now - since.pop(cid, now)
            react(node.release(cid, now), now)
            react(node.request(cid, now), now)
        react(node.tick(now), now)
        for cid in holders():
            since.setdefault(cid, now)
        never_half(node, gangs)
        nexts = [t for t in [node.deadline(), *releases.values(),
                             *(p[0] for p in pending_starts)] if t is not None and t > now]
        now = min(nexts + [now + 0.25, until])
    for cid, t in since.items():
        held[cid] += until - t
    return held


def two_gangs() -> tuple[Node, dict[int, set[int]]]:
    node = Node()
    node.job(1, 0, 1)
    node.job(2, 0, 1)
    node.client(11, 1, 0), node.client(12, 1, 1)
    node.client(21, 2, 0), node.client(22, 2, 1)
    return node, {1: {0, 1}, 2: {0, 1}}


def test_a_gang_gets_all_its_gpus_at_its_first_request():
    node, _ = two_gangs()
    assert node.request(11, 0.0) == [(GRANT, 11)]
    assert node.policy.status(1)["state"] == "running"
    assert node.request(22, 0.1) == [(CONTENDED, 11)]          # GPU 1 is job 1's turn too
    assert node.policy.status(2)["state"] == "waiting"
    assert "gang job 1 goes first" in node.policy.status(2)["why"]
    assert node.request(12, 0.2) == [(GRANT, 12), (CONTENDED, 12)]
    assert node.holding() == {1: {0, 1}}


@pytest.mark.parametrize("order", list(itertools.permutations([11, 12, 21, 22])))
def test_two_gangs_on_the_same_gpus_never_each_hold_half(order):
    """Every request order, ranks that never idle, collectives that make a drain wait for the
    peer rank: both gangs get turns, never half each, and share the GPUs evenly."""
    node, gangs = two_gangs()
    peers = {11: 12, 12: 11, 21: 22, 22: 21}
    held = simulate(node, 20.0, gangs, list(order), waits_for=peers)
    for seconds in held.values():
        assert seconds == pytest.approx(10.0, abs=1.5), held
    assert held[11] == pytest.approx(held[12], abs=0.2) and held[21] == pytest.approx(held[22],
                                                                                     abs=0.2)


@pytest.mark.parametrize("order", list(itertools.permutations([11, 12, 21, 22])))
def test_a_rank_caught_between_collectives_at_each_end_costs_no_stall(order):
    """Issue 15: every end of turn catches rank x2 between two collectives (it releases at once)
    while rank x1 has launched the next one, whose drain needs x2 granted again. Both gangs still
    share evenly, the GPUs are busy all along, and no drain is taken as stuck (a second each).
    Before: 30 stuck drains in 20 s, and the gang that started first kept both GPUs."""
    node, gangs = two_gangs()
    held = simulate(node, 20.0, gangs, list(order), waits_for={11: 12, 12: 11, 21: 22, 22: 21},
                    drain={11: 0.01, 12: 0.0005, 21: 0.01, 22: 0.0005}, behind={12, 22})
    assert [n for n in node.policy.notes if "stuck" in n] == []
    for seconds in held.values():
        assert seconds == pytest.approx(10.0, abs=1.0), held
    assert sum(held.values()) > 0.98 * 2 * 20.0           # two GPUs, 20 s


def test_without_gangs_the_same_jobs_deadlock():
    """The control: per-GPU turns alone let each job hold half, and the drains never end."""
    node = Node()
    for cid, job, gpu in [(11, 1, 0), (12, 1, 1), (21, 2, 0), (22, 2, 1)]:
        node.client(cid, job, gpu)
    held = simulate(node, 20.0, {}, [11, 22, 12, 21], waits_for={11: 12, 12: 11, 21: 22, 22: 21})
    assert held[12] == 0 and held[21] == 0          # each waits for a GPU the other never frees


def test_a_gang_beside_single_gpu_jobs_takes_turns_as_a_unit_and_starves_no_one():
    node = Node()
    node.job(1, 0, 1)
    node.client(11, 1, 0), node.client(12, 1, 1)
    node.client(30, 3, 0), node.client(40, 4, 1)             # single-GPU jobs on each GPU
    gangs = {1: {0, 1}}
    held = simulate(node, 40.0, gangs, [30, 11, 40, 12], waits_for={11: 12, 12: 11})
    assert held[11] == pytest.approx(held[12], abs=0.2)
    for cid in (11, 12, 30, 40):
        assert held[cid] == pytest.approx(20.0, abs=2.5), held
    # Whenever the gang held one GPU it held the other (checked at each step by never_half for
    # jobs; here for the gang's own turns): its grants on the two GPUs came together.
    grants = [(i, cid) for i, kind, cid in node.sent if kind == GRANT and cid in (11, 12)]
    assert len(grants) >= 10
    for first, second in zip(grants[::2], grants[1::2], strict=False):
        assert {first[1], second[1]} == {11, 12}


def test_single_gpu_jobs_fill_a_gpu_the_gang_does_not_use_and_give_way_at_once():
    node = Node()
    node.job(1, 0, 1)
    node.client(11, 1, 0), node.client(12, 1, 1), node.client(40, 4, 1)
    assert node.request(11, 0.0) == [(GRANT, 11)]
    assert node.request(40, 0.1) == [(GRANT, 40)]             # GPU 1 is free for now
    assert node.request(12, 0.2) == [(DROP, 40)]              # the gang runs: no slice to wait
    assert node.release(40, 0.25) == [(GRANT, 12)]
    assert node.request(40, 0.3) == [(CONTENDED, 11), (CONTENDED, 12)]


def test_the_turn_ends_on_all_gpus_together():
    node, _ = two_gangs()
    node.request(11, 0.0), node.request(12, 0.0)
    node.request(21, 0.5)
    assert node.deadline() == pytest.approx(1.5)
    assert sorted(node.tick(1.5)) == [(DROP, 11), (DROP, 12)]
    assert node.policy.status(1)["state"] == "ending"
    assert node.release(11, 1.6) == []
    assert node.request(11, 1.6) == []                         # no grant while the turn ends
    # All released: job 2's turn, told at once that job 1 waits again.
    assert node.release(12, 1.7) == [(GRANT, 21), (CONTENDED, 21)]
    assert node.request(22, 1.8) == [(GRANT, 22), (CONTENDED, 22)]


def test_a_stuck_drain_gets_its_peer_granted_then_the_turn_ends_again():
    node, _ = two_gangs()
    node.request(11, 0.0), node.request(12, 0.0), node.request(21, 0.5)
    node.tick(1.5)                                             # DROP to 11 and 12
    assert node.release(12, 1.6) == []                         # 12 had nothing in flight
    assert node.request(12, 1.6) == []                         # ... and must reach the collective
    note = node.stuck(11, 2.0)                                 # 11's collective waits for 12
    assert "gets its waiting clients granted" in note
    assert (1, GRANT, 12) in node.sent[-3:]
    assert node.release(11, 2.1) == []                         # the collective finished
    assert node.request(11, 2.1) == [(GRANT, 11), (DROP, 11), (DROP, 12)]   # whole: end again
    node.release(11, 2.2)
    assert node.release(12, 2.2) == [(GRANT, 21)]
    assert [k for k in node.sent if k[1] == UNRESPONSIVE] == []


@pytest.mark.parametrize("interval,after", [(0.1, 1.0), (0.5, 1.0), (1.5, 1.5), (10.0, 2.0)])
def test_a_drain_that_never_reports_is_taken_as_stuck_after_about_a_turn(interval, after):
    """A hook without DRAIN_STUCK, whose peer asks only once steps are over (one interval after
    the end, at least GANG_STEP_WINDOW_MIN, at most `after`): the same resolution, after one turn (at
    least 1 s, at most half of drop_grace_sec, 4 s here)."""
    node, _ = two_gangs()
    for gpu in node.gpus:
        gpu.settings = replace(gpu.settings, switch_time_fixed=interval)
    node.request(11, 0.0), node.request(12, 0.0), node.request(21, 0.0)
    dropped = interval
    node.tick(dropped)
    node.release(12, dropped + 0.01)
    asked = dropped + min(max(interval, GANG_STEP_WINDOW_MIN), after)
    if asked >= dropped + after:
        assert node.request(12, asked) == [(GRANT, 12)]
    else:
        assert node.request(12, asked) == []
        assert node.deadline() == pytest.approx(dropped + after)
        assert node.tick(dropped + after - 0.01) == []
        assert node.tick(dropped + after) == [(GRANT, 12)]
    assert any("taken as a stuck drain" in n for n in node.policy.notes)


def test_a_rank_that_asks_while_its_peer_drains_gets_one_step_at_once():
    """Issue 15's stall: the turn ends just as rank 12 gives its GPU back idle; its next request
    is for its half of the collective that rank 11's drain waits for. It gets a grant with
    DROP_LOCK right behind, milliseconds later, not a second later as a stuck drain."""
    node, _ = two_gangs()
    node.request(11, 0.0), node.request(12, 0.0), node.request(21, 0.5)
    assert sorted(node.tick(1.5)) == [(DROP, 11), (DROP, 12)]
    assert node.release(12, 1.501) == []                       # idle, crossing the DROP_LOCK
    assert node.request(12, 1.503) == []
    assert node.deadline() == pytest.approx(1.505)
    assert node.tick(1.505) == [(GRANT, 12), (DROP, 12)]       # one step
    assert node.policy.status(1)["state"] == "ending"
    assert node.request(22, 1.51) == []                        # GPUs still job 1's
    assert node.release(11, 1.53) == []                        # the collective completed
    assert node.release(12, 1.53) == [(GRANT, 21), (GRANT, 22)]
    assert node.policy.notes == []                             # nothing taken as stuck


def test_ranks_that_release_together_take_no_step():
    """Ranks that finish their last collective together release within a millisecond: the
    first to ask again does not step one collective ahead of the other."""
    node, _ = two_gangs()
    node.request(11, 0.0), node.request(12, 0.0), node.request(21, 0.5)
    node.tick(1.5)
    assert node.release(11, 1.52) == [] and node.request(11, 1.52) == []
    assert node.deadline() == pytest.approx(1.522)
    assert node.release(12, 1.521) == [(GRANT, 21), (CONTENDED, 21)]
    assert [(i, k, c) for i, k, c in node.sent if c == 11 and k == GRANT] == [(0, GRANT, 11)]


def test_a_stuck_single_gpu_holder_keeps_its_turn_and_is_not_unresponsive_while_it_reports():
    node = Node()
    node.client(30, 3, 0), node.client(31, 5, 0)
    node.request(30, 0.0), node.request(31, 0.1)
    assert node.tick(1.1) == [(HANDOFF, 31), (DROP, 30)]
    note = node.stuck(30, 2.0)
    assert "keeps the GPU" in note
    assert node.tick(5.1) == []                                # grace runs from the report
    node.stuck(30, 5.5)
    assert node.tick(9.4) == []
    assert node.tick(9.5) == [(UNRESPONSIVE, 30)]             # silent for a whole grace
    assert node.release(30, 9.6) == [(GRANT, 31)]


def test_a_gang_waits_behind_single_gpu_clients_that_waited_longer():
    node = Node()
    node.job(1, 0, 1)
    node.client(11, 1, 0), node.client(30, 3, 0), node.client(31, 5, 0)
    node.request(30, 0.0), node.request(31, 0.1)
    assert node.request(11, 0.2) == []
    assert "waited longer on GPU 0" in node.policy.status(1)["why"]
    node.tick(1.1)                                             # 30's slice ends: 31 is next
    assert node.release(30, 1.2) == [(GRANT, 31), (CONTENDED, 31)]
    assert node.policy.status(1)["state"] == "claiming"
    assert node.request(30, 1.3) == []                         # behind the gang now
    assert node.tick(2.2) == [(DROP, 31)]
    assert node.release(31, 2.3) == [(GRANT, 11), (CONTENDED, 11)]     # 30 waits behind it


def test_a_gang_that_goes_away_frees_its_gpus():
    node, _ = two_gangs()
    node.request(11, 0.0), node.request(22, 0.1)
    assert node._pass(node.gpus[0], node.gpus[0].remove_client(11, 0.2), 0.2) == [(GRANT, 22)]
    node.policy.remove_job(1)
    assert all(g.lock.turn is None or g.lock.turn.job_id == 2 for g in node.gpus)


def test_a_step_moves_no_memory_out():
    """A rank that catches up op by op would otherwise bring its memory back and move it out
    again at every step. The end of the turn asks for room; a step does not ask again."""
    node = Node()
    node.job(1, 0, 1)
    rank0, rank1 = node.client(11, 1, 0), node.client(12, 1, 1)
    single = node.client(40, 4, 1)
    gpu = node.gpus[1]
    node.request(11, 0.0), node.request(12, 0.0)
    gpu.mem_update(rank1, 0.0, 12 * G, 0, 0)
    gpu.mem_update(single, 0.0, 0, 0, 8 * G)                  # swapped out, waits to come back
    node.request(40, 0.5)
    assert sorted(node.tick(1.5)) == [(DROP, 11), (DROP, 12)]
    assert gpu.holders[12].drop_bytes == 4 * G                 # room for 40: 8 GiB - 4 GiB free
    gpu.mem_update(rank1, 1.51, 8 * G, 0, 4 * G)               # moved, released, asks again
    node.release(12, 1.51), node.request(12, 1.51)
    step = gpu.tick(1.512)
    assert [(a.kind, a.client.client_id, a.bytes) for a in step] == [(GRANT, 12, 0), (DROP, 12, 0)]
    assert rank0.client_id in node.gpus[0].holders             # rank 0 still drains


def test_a_step_withheld_for_room_does_not_rerun_every_pass(monkeypatch):
    """A rank whose step waits for room (a swap-out asked of an idle client): every later event
    on these GPUs ran the gang pass's eight rounds, each ticking both GPUs to withhold the same
    grant again. The GPU retries itself once room changes; the step is granted then."""
    node = Node()
    node.job(1, 0, 1)
    node.client(11, 1, 0)
    rank1 = node.client(12, 1, 1)
    single = node.client(40, 4, 1)
    gpu = node.gpus[1]
    node.request(11, 0.0), node.request(12, 0.0)
    gpu.mem_update(rank1, 0.0, 8 * G, 0, 0)
    gpu.mem_update(single, 0.0, 4 * G, 0, 0)                  # idle, resident: can move out
    node.request(40, 0.5)
    assert sorted(node.tick(1.5)) == [(DROP, 11), (DROP, 12)]
    gpu.mem_update(rank1, 1.51, 0, 0, 14 * G)                 # moved out, released, asks again
    node.release(12, 1.51), node.request(12, 1.51)
    assert node.tick(1.512) == [(SWAP_OUT, 40)]               # room for its step first
    ticks = []
    real_tick = GpuState.tick
    monkeypatch.setattr(GpuState, "tick", lambda self, now: ticks.append(self.index)
                        or real_tick(self, now))
    assert node.tick(1.513) == [] and node.tick(1.514) == []
    assert len(ticks) == 2 * 2, ticks          # the two GPUs' own ticks; the gang pass adds none
    moved, _ = gpu.mem_update(single, 1.52, 2 * G, 0, 2 * G)  # 40 moved 2 GiB out: room
    assert node._pass(gpu, moved, 1.52) == [(GRANT, 12), (DROP, 12)]
