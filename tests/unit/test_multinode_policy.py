"""Multi-node jobs' turns (issue 40; nvshare_slurm/policy/gang.py "Multi-node jobs"), on a fake clock.

Each node's scheduler decides alone, from the same inputs on every node: the jobs registered by
their prologs, each flagged multi-node from slurmctld's record. A multi-node job takes its turns as
a gang of its GPUs here, and a multi-node job of a lower id on one of them goes first for its whole
life (prolog to epilog), so every node runs the same one: the lowest id of those it holds. Two
`Node`s (tests/unit/test_gang_policy.py's daemon stand-in) stand for two nodes: the order must not
depend on which node heard what first (skew), nor on a node's restart; and a holder whose drain
waits for its ranks on another node is never revoked into running beside another job.
"""
from __future__ import annotations

from test_gang_policy import Node

from nvshare_slurm.policy.policytypes import DROP, GRANT, UNRESPONSIVE

X, Y = 701, 702


def multinode_node(*jobs: int, local: int | None = None, **settings) -> Node:
    node = Node(n_gpus=1, **settings)
    for job_id in jobs:
        node.policy.add_job(job_id, [node.gpus[0]], multinode=True)
    return node


def holding(node: Node) -> set[int]:
    return set(node.holding())


def test_every_node_runs_the_lowest_id_whatever_order_its_requests_came_in():
    n1, n2 = multinode_node(X, Y), multinode_node(Y, X)       # registered in either order
    for node in (n1, n2):
        node.client(1, X, 0)
        node.client(2, Y, 0)
    assert n1.request(1, 0.0) == [(GRANT, 1)]                 # n1 hears X first ...
    assert n2.request(2, 0.0) == []                           # ... n2 hears Y first: it waits
    assert (GRANT, 1) in n2.request(1, 0.01)
    n1.request(2, 0.01)
    # Turns end and begin again (1 s turns while someone waits): X keeps running on both nodes,
    # its ranks asking again after each drop; Y never runs while X is registered.
    now = 0.02
    while now < 10.0:
        for node in (n1, n2):
            for kind, cid in node.tick(now):
                if kind == DROP:
                    node.release(cid, now)
                    node.request(cid, now)
            assert holding(node) <= {X}, (now, node.holding())
        now += 0.05
    for node in (n1, n2):                                     # X's epilog on each node
        node.release(1, now)
        node.policy.remove_job(X)
        node.tick(now + 0.01)
        assert holding(node) == {Y}
        assert "multi-node job" not in node.policy.status(Y)["why"]


def test_the_order_holds_after_a_nodes_scheduler_restarts():
    """A restarted scheduler rebuilds its jobs from state.json in whatever order: still X first."""
    node = multinode_node(Y, X)
    node.client(2, Y, 0)
    node.client(1, X, 0)
    assert node.request(2, 0.0) == []
    status = node.policy.status(Y)
    assert status["multinode"] and f"multi-node job {X} goes first" in status["why"]
    assert (GRANT, 1) in node.request(1, 0.01)


def test_a_holder_whose_drain_waits_on_another_node_is_never_revoked():
    """Before: the holder could not finish its collective (its peer rank waited on the other
    node), was revoked at drop_grace_sec and ran ungated beside the next holder, whose kernels
    then overlapped its own. Now a node's own job waits for the drain instead, however long: the
    drain ends when the peer rank runs, and that rank's node runs the lowest-id multi-node job,
    so every wait ends (the lowest id holds on all its nodes)."""
    node = multinode_node(X, drop_grace_sec=4.0)
    node.client(1, X, 0)
    local = node.client(3, 900, 0)                          # a single-node job here
    assert node.request(1, 0.0) == [(GRANT, 1)]
    node.request(3, 0.1)
    sent = []
    now = 0.2
    while now < 60.0:
        sent += node.tick(now)
        now += 0.1
    assert (DROP, 1) in sent                                # its turn ended: asked to release
    assert (UNRESPONSIVE, 1) not in sent                    # ... and never revoked
    assert (GRANT, local.client_id) not in sent             # nobody runs beside it
    assert holding(node) == {X}
    now += 0.1
    assert (GRANT, 3) in node.release(1, now)               # its drain ended: the local job runs


def test_single_node_jobs_take_turns_with_the_multinode_job_there():
    node = multinode_node(X)
    node.client(1, X, 0)
    node.client(3, 900, 0)
    node.request(1, 0.0)
    node.request(3, 0.0)
    turns = []
    now = 0.01
    while now < 8.0:
        for kind, cid in node.tick(now):
            if kind == DROP:
                node.release(cid, now)
                node.request(cid, now)
        turns.append(next(iter(node.holding()), None))
        now += 0.05
    assert {X, 900} <= set(turns)                           # both ran
