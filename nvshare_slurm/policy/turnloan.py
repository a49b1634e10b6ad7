"""The rest of a turn given back idle: lent or kept for its holder, never lost (issue 27).

A holder of an exclusive turn gives the lock back once it has been idle for its hook's threshold
while others wait (LOCK_RELEASED with the IDLE flag), so that the GPU need not sit idle through a
host pause. Before, that cost it the rest of its turn: it asked again a few milliseconds later and
waited behind every other job's whole turn. On the H100 three equal PyTorch trainings in 1 s turns
held the GPU 7.8 s, 2.3 s and 11.0 s of the same 21 s, and in a second run one of them made 4
steps in 15 s: a job that lost its turns in host hiccups measured itself from the short pieces it
got and never caught up. Now the rest of the turn, until `until`, stays the holder's:

- **Lent** (the rule): the next waiter is granted at once, as before, and the holder's next request
  within its turn drops the borrowers (DROP_LOCK, TIMESLICE, with a HANDOFF when no memory moves):
  it holds next, until the turn's end it had. A borrower that gives the lock back before `until`
  keeps its place: it is next after the lender, so its own turn is not lost either. A loan that
  reaches `until` without the lender back becomes the borrower's own turn.
- **Kept** (where the waiters' drains are more than ten of the holder's pauses, demand.py's
  lends_turn: the lender would wait far longer for a borrower's drain than the GPU would sit
  idle): the GPU is held for the holder for two of its mean pauses (KEEP_MIN_SEC..KEEP_MAX_SEC)
  before the next waiter is granted, and lent after.

Only exclusive turns, and only while every client's memory fits on the GPU (a borrower that had to
bring its memory back would pay a swap for a loan it may lose at once). A pure record, no clock:
GpuState (gpustate.py) decides with it and sends what it says.
"""
from __future__ import annotations

from dataclasses import dataclass, field

KEEP_MIN_SEC = 0.002     # the GPU is kept at least this long for a holder that gave it back idle
KEEP_MAX_SEC = 0.1       # and at most this long (then it is lent)
KEEP_PAUSES = 2.0        # how many of its mean pauses


def keep_for(pause: float) -> float:
    """How long the GPU is kept for a holder whose mean pause is `pause`."""
    return min(KEEP_MAX_SEC, max(KEEP_MIN_SEC, KEEP_PAUSES * pause))


@dataclass
class Loan:
    lender: int                  # the client whose exclusive turn it is
    until: float                 # when that turn ends
    hold_until: float            # kept for it until then, lent after
    lent: bool                   # granted to others meanwhile
    borrowers: set[int] = field(default_factory=set)   # granted exclusively from it


@dataclass
class TurnLoans:
    loan: Loan | None = None
    # Clients to put first in the queue on their next request, in this order: a lender that
    # came back, then borrowers that gave the lock back before their own turn began.
    first: list[int] = field(default_factory=list)
    # When the turn of a client granted from a loan began, for its "held while others wait"
    # clock: a lender granted again continues its turn where it began, and a borrower's own turn
    # begins where the lent one ends.
    began: dict[int, float] = field(default_factory=dict)

    def active(self, now: float) -> Loan | None:
        """The loan until the turn's end; a kept one is lent once its hold is over."""
        loan = self.loan
        if loan is None:
            return None
        if now >= loan.until:
            self.loan = None
            return None
        if not loan.lent and now >= loan.hold_until:
            loan.lent = True
        return loan

    def kept_for(self, now: float) -> int | None:
        """The client the GPU is kept for now (nobody else is granted exclusively), if any."""
        loan = self.active(now)
        return loan.lender if loan is not None and not loan.lent else None

    def deadline(self) -> float | None:
        """When a kept turn is lent (the next waiter is granted then)."""
        loan = self.loan
        return min(loan.until, loan.hold_until) if loan is not None and not loan.lent else None

    def give_back(self, lender: int, now: float, until: float, keep: float | None) -> None:
        """The exclusive holder `lender` gave the lock back idle, its turn running until `until`:
        keep the GPU for it `keep` seconds, then lend the rest (None: lend it at once)."""
        self.loan = Loan(lender, until, now + (keep or 0.0), keep is None)
        self.began.clear()

    def granted(self, client_id: int, exclusive: bool, now: float, turn_length: float) -> None:
        """A grant: the lender goes on with its turn; anyone else granted exclusively from a lent
        turn borrows it."""
        if client_id in self.first:
            self.first.remove(client_id)
        loan = self.active(now)
        if loan is None:
            return
        if client_id == loan.lender:
            self.began = {client_id: loan.until - turn_length}
            self.loan = None
        elif exclusive and loan.lent:
            loan.borrowers.add(client_id)
            self.began[client_id] = loan.until

    def released(self, client_id: int, now: float) -> None:
        """A borrower gave the lock back before the loan ended: it is next after the lender."""
        loan = self.active(now)
        if loan is not None and client_id in loan.borrowers:
            loan.borrowers.discard(client_id)
            if client_id not in self.first:
                self.first.append(client_id)
        self.began.pop(client_id, None)

    def lender_back(self, client_id: int, now: float) -> Loan | None:
        """The lender asks again within its turn: it goes first (the loan, to drop its borrowers)."""
        loan = self.active(now)
        if loan is None or client_id != loan.lender:
            return None
        if client_id not in self.first:
            self.first.insert(0, client_id)
        return loan

    def turn_began(self, client_id: int) -> float | None:
        """When the turn of a holder granted from a loan began, once (None for any other)."""
        return self.began.pop(client_id, None)

    def forget(self, client_id: int) -> None:
        """The client is gone or suspended: it lends, borrows and goes first no more."""
        if self.loan is not None:
            if self.loan.lender == client_id:
                self.loan = None
            else:
                self.loan.borrowers.discard(client_id)
        if client_id in self.first:
            self.first.remove(client_id)
        self.began.pop(client_id, None)
