"""What a holder's grant says of the others on its GPU under adaptive sharing with burst turns:
co-runners take turns burst by burst (BURSTS), and a turn holder beside them waits out their
prompt bursts (YIELD). Pure: the holders in, GRANT Actions out; gpustate.py calls it each pass.

Co-runners are the holders that are not turn-takers. Their hooks take turns burst by burst through
the GPU's page; a turn-taker does not (a compute-bound job's bursts never end: a light client beside
it would wait for them). But a co-runner whose bursts are short and rare (a request served, a
command at a prompt: the hook decides from its own demand, csrc/burst.c) runs its burst at once,
and everyone told to yield launches nothing new until it ends: co-runners by BURSTS, the turn holder
by YIELD, which it is told while co-runners with bursts hold beside it, or while a prompt client
that holds nothing now is registered (its next burst then finds waits in the holder's queue).
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from ..wire.proto import C
from .policytypes import GRANT, Action, Holder


def yields_beside(holders: Mapping[int, Holder], client_id: int, prompt_idle: bool = False) -> bool:
    """Does a turn holder granted now wait out prompt bursts: does a co-runner with bursts hold, or
    is a prompt client registered that holds nothing now (`prompt_idle`, demand.py's
    prompt_ready: its next burst must find the holder's queue with waits in it)?"""
    return prompt_idle or any(h.bursts and h.drop_at is None
                              for cid, h in holders.items() if cid != client_id)


def regrant(holders: Mapping[int, Holder], takers: Collection[int], switch_ms: int,
            out: list[Action], prompt_idle: bool = False) -> None:
    """A holder whose grant says otherwise hears it again with the right flags: one granted while
    it had not reported yet, one that turned busy or light, one that holds an exclusive grant from
    turns that are over, a turn holder whose co-runners came or went, or beside which a prompt
    client that holds nothing came or went (`prompt_idle`). Its hook just re-arms. A
    holder granted earlier in this pass has that grant's Action in `out` changed instead: one
    grant, never two."""
    granted = {a.client.client_id: i for i, a in enumerate(out) if a.kind == GRANT}
    for cid, holder in holders.items():
        if holder.drop_at is not None:
            continue
        bursts = cid not in takers
        yields = not bursts and yields_beside(holders, cid, prompt_idle)
        if holder.bursts == bursts and holder.yields == yields:
            continue
        if holder.bursts != bursts:
            holder.shared = True
        holder.bursts, holder.yields = bursts, yields
        if cid in granted:
            i = granted[cid]
            flags = C.NVSHARE_GRANT_SHARED if holder.shared else out[i].flags
            out[i] = replace(out[i], flags=flags, bursts=bursts, yields=yields)
            continue
        flags = C.NVSHARE_GRANT_SHARED if holder.shared else C.NVSHARE_GRANT_EXCLUSIVE
        out.append(Action(GRANT, holder.client, flags, switch_ms, bursts=bursts, yields=yields))
