"""The rest of a turn given back idle (nvshare_slurm/policy/turnloan.py, issue 27), driven with a fake
clock. A holder that gives the GPU back idle keeps its turn: where the waiters' drains are long
against its pauses the GPU waits for it a little, else (and after that) it is lent and the holder
gets it back first; a borrower keeps its own place."""
from __future__ import annotations

from test_policy import G, client, gpu, kinds

from nvshare_slurm.policy.demand import Demand
from nvshare_slurm.policy.policytypes import CONTENDED, DROP, GRANT, HANDOFF
from nvshare_slurm.wire.proto import C

LONG_PAUSES = Demand(busy=0.5, burst=0.2, gap=0.2)    # 200 ms pauses
SHORT_PAUSES = Demand(busy=0.7, burst=0.02, gap=0.01)  # 10 ms pauses
QUEUED = 0.05                                          # a compute-bound job's drain: 50 ms
BUSY = Demand(busy=1.0, burst=1.0, gap=0.001)          # a compute-bound job


def pair(a_demand: Demand | None, b_demand: Demand | None = BUSY, b_drain: float | None = QUEUED,
         c_at: float | None = None):
    """a holds from 0.0 (its demand reported, if given); b (compute-bound unless said, its recent
    drain `b_drain`) waits from 1.0, so a's turn ends at 11.0; c, if `c_at`, waits from then."""
    g = gpu()
    a, b = client(1), client(2)
    g.request(a, 0.0)
    if a_demand is not None:
        g.report_demand(a, a_demand, 0.5)
    if b_demand is not None:
        g.report_demand(b, b_demand, 0.5)
    if b_drain is not None:
        g.demand.drained(2, b_drain, 0.5)
    g.request(b, 1.0)
    if c_at is not None:
        g.request(client(3), c_at)
    return g, a, b


def lent_pair():
    """a holds; b waits from 1.0 (a's turn ends at 11.0); a gives the GPU back idle at 2.0, and
    b has not drained yet: lent."""
    g, a, b = pair(LONG_PAUSES, None, None)
    assert g.next_deadline() == 11.0
    assert kinds(g.release(1, 2.0, idle=True)) == [(GRANT, 2)]   # the GPU is not left idle
    return g, a, b


def test_a_holder_back_within_its_turn_takes_it_back_and_keeps_its_end():
    g, a, b = lent_pair()
    back = g.request(a, 2.01)
    assert kinds(back) == [(HANDOFF, 1), (DROP, 2)]              # b drains, then a runs
    assert back[1].value == C.NVSHARE_DROP_TIMESLICE and back[0].source is b
    assert kinds(g.release(2, 2.02)) == [(GRANT, 1)]
    assert kinds(g.request(b, 2.03)) == [(CONTENDED, 1)]
    assert g.next_deadline() == 11.0                             # not a new turn: the lent one's end
    assert kinds(g.tick(11.0)) == [(HANDOFF, 2), (DROP, 1)]      # then b's own turn


def test_a_short_pause_is_kept_for_its_holder_where_the_waiter_drains_long():
    """b, compute-bound, drains 50 ms, five of a's 10 ms pauses: the GPU waits two of its pauses
    (20 ms) for it, and its turn goes on to the same end."""
    g, a, b = pair(SHORT_PAUSES)
    assert g.release(1, 2.0, idle=True) == []
    assert g.next_deadline() == 2.02
    assert kinds(g.request(a, 2.015)) == [(GRANT, 1), (CONTENDED, 1)]
    assert g.next_deadline() == 11.0


def test_a_kept_turn_is_lent_when_its_holder_stays_away_longer():
    """Kept 20 ms, then lent: back at 30 ms it takes its turn back."""
    g, a, b = pair(SHORT_PAUSES)
    assert g.release(1, 2.0, idle=True) == []
    assert g.tick(2.019) == []
    assert kinds(g.tick(2.02)) == [(GRANT, 2)]
    assert kinds(g.request(a, 2.03)) == [(HANDOFF, 1), (DROP, 2)]
    assert kinds(g.release(2, 2.031)) == [(GRANT, 1)]


def test_a_holder_that_has_not_reported_lends():
    """No DEMAND yet, so no pause to weigh against b's drain: lent, which does not waste the GPU."""
    g, a, b = pair(None)
    assert kinds(g.release(1, 2.0, idle=True)) == [(GRANT, 2)]


def test_pauses_lend_or_keep_by_the_waiters_drain():
    """Lent to a bursty b whatever its drain (it lends back in its turn: a bursty pair fills each
    other's pauses), and to a compute-bound b that drains within two of a's pauses; kept (then
    lent) where a compute-bound b drains longer."""
    bursty = Demand(busy=0.67, burst=0.008, gap=0.004)
    for b_demand, drain, lent in ((bursty, 0.012, True), (BUSY, 0.015, True), (BUSY, 0.05, False)):
        g, _, _ = pair(SHORT_PAUSES, b_demand, drain)
        assert (kinds(g.release(1, 2.0, idle=True)) == [(GRANT, 2)]) == lent, (b_demand, drain)


def test_a_long_kept_absence_is_lent_after_keep_max():
    g, _, _ = pair(Demand(busy=0.5, burst=0.2, gap=0.08), BUSY, 1.0)   # kept 160 ms, at most 100
    assert g.release(1, 2.0, idle=True) == []
    assert g.next_deadline() == 2.1
    assert kinds(g.tick(2.1)) == [(GRANT, 2)]                  # then lent


def test_a_plain_release_gives_the_turn_away():
    """Without the IDLE flag (the holder let go for good, or was dropped) nothing is lent."""
    g, a, _ = pair(None, None, None)
    assert kinds(g.release(1, 2.0)) == [(GRANT, 2)]
    assert kinds(g.request(a, 2.01)) == [(CONTENDED, 2)]         # it waits for b's turn


def test_a_loan_ends_with_the_lent_turn():
    g, a, b = lent_pair()
    assert kinds(g.request(a, 11.0)) == [(CONTENDED, 2)]         # too late: b's turn now
    assert g.next_deadline() == 21.0                             # from the lent turn's end


def test_a_borrower_dropped_for_the_lender_is_next_after_it():
    """Three jobs: b borrowed a's turn, then c borrowed it from b; a comes back and drops c;
    after a, b has its own turn before c."""
    g, a, b = pair(LONG_PAUSES, None, None, c_at=1.0)
    c = g.clients[3]
    assert kinds(g.release(1, 2.0, idle=True)) == [(GRANT, 2), (CONTENDED, 2)]
    assert kinds(g.release(2, 3.0, idle=True)) == [(GRANT, 3)]   # b idle too: c borrows
    assert kinds(g.request(a, 3.5)) == [(HANDOFF, 1), (DROP, 3)]
    assert kinds(g.request(b, 3.6)) == []
    assert kinds(g.release(3, 3.7)) == [(GRANT, 1), (CONTENDED, 1)]
    g.request(c, 3.8)
    assert list(g.queue) == [2, 3]                               # b, whose turn it never had, first
    assert g.next_deadline() == 11.0
    assert kinds(g.tick(11.0)) == [(HANDOFF, 2), (DROP, 1)]


def test_a_borrowers_own_turn_begins_where_the_lent_one_ends():
    g, _, _ = pair(LONG_PAUSES, None, None, c_at=1.5)
    g.release(1, 2.0, idle=True)
    assert g.next_deadline() == 21.0                             # 11.0 + one interval
    assert kinds(g.tick(20.9)) == []
    assert kinds(g.tick(21.0)) == [(HANDOFF, 3), (DROP, 2)]


def test_nothing_is_lent_where_a_switch_moves_memory():
    """Memory that does not fit: a borrower would bring its memory back for a loan it may lose."""
    g, a, b = pair(LONG_PAUSES, None, None)
    g.mem_update(a, 1.5, 12 * G, 12 * G, 0)
    g.mem_update(b, 1.5, 12 * G, 0, 0)
    g.release(1, 2.0, idle=True)
    assert all(kind != DROP for kind, _ in kinds(g.request(a, 2.01)))


def test_a_lender_gone_or_suspended_lends_no_more():
    g, a, b = lent_pair()
    g.remove_client(1, 2.005)
    assert g.loans.loan is None and g.loans.first == []
    assert kinds(g.request(client(3), 2.01)) == [(CONTENDED, 2)]

