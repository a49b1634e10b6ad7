"""PREFETCH (docs/protocol.md "Swap" 8): in turns, the next waiter brings its swapped memory back
into the room there is before its turn, and while the holder moves memory out for it. Fake clock,
the per-GPU policy alone (test_policy's 16 GiB GPU, no reserve, 10 s turns, 5 s grace)."""
from __future__ import annotations

from test_policy import G, client, gpu, moves

from nvshare_slurm.policy.gpumemory import PREFETCH_QUIET_SEC
from nvshare_slurm.policy.gpupause import suspend_client
from nvshare_slurm.policy.policytypes import CONTENDED, DROP, GRANT, HANDOFF, MEM_REPLY, PREFETCH, SWAP_OUT
from nvshare_slurm.wire.proto import C

DONE = C.NVSHARE_MEM_PREFETCH_DONE
SHORT = C.NVSHARE_MEM_PREFETCH_SHORT
HEADROOM = 16 * G * 2 // 100          # left free for a running holder's allocations
MiB = 1 << 20


def holder_and_swapped_waiter(resident: int = 6 * G, swapped: int = 8 * G):
    """a holds the GPU with `resident` (all swappable); b waits with `swapped` in host memory."""
    g = gpu()
    a, b = client(1), client(2)
    g.request(a, 0)
    g.mem_update(a, 0, resident, 0, 0)
    g.mem_update(b, 0, 0, 0, swapped)
    return g, a, b


def test_the_next_waiter_brings_back_what_fits_during_the_turn_and_its_grant_moves_nothing():
    g, a, b = holder_and_swapped_waiter(resident=6 * G, swapped=8 * G)   # 14G: it all fits
    # b fits beside a (a may give the GPU up when idle); room 10G less headroom: all of it
    assert moves(g.request(b, 1)) == [(CONTENDED, 1, 0), (PREFETCH, 2, 8 * G)]
    assert g.tick(2) == []                                     # one offer, not repeated
    assert g.memory.room() == 2 * G                            # the offer is memory on its way
    g.mem_update(b, 3, 8 * G, 0, 0, flags=DONE)
    assert g.memory.prefetching == {} and g.memory.room() == 2 * G
    actions = g.tick(11)
    # nothing to move at the switch: the turn passes by hand-over, as between resident jobs
    assert moves(actions) == [(HANDOFF, 2, 0), (DROP, 1, 0)]
    assert moves(g.release(1, 11.1)) == [(GRANT, 2, 0)]


def test_an_offer_leaves_headroom_to_the_running_holder_and_waits_for_its_answer():
    g, a, b = holder_and_swapped_waiter(resident=10 * G, swapped=10 * G)   # room 6G
    assert moves(g.request(b, 1)) == [(PREFETCH, 2, 6 * G - HEADROOM)]
    # its answer comes in two reports: only the one saying DONE ends the offer
    g.mem_update(b, 1.1, 4 * G, 0, 6 * G)
    assert 2 in g.memory.prefetching
    assert g.memory.prefetch_outstanding(2) == 2 * G - HEADROOM
    g.mem_update(b, 1.2, 6 * G - HEADROOM, 0, 4 * G + HEADROOM, flags=DONE)
    assert g.memory.prefetching == {} and g.memory.room() == HEADROOM
    assert g.tick(2) == []                                     # headroom only: nothing more


def test_the_holders_allocation_is_not_given_the_room_an_offer_took():
    g, a, b = holder_and_swapped_waiter(resident=10 * G, swapped=10 * G)
    assert moves(g.request(b, 1)) == [(PREFETCH, 2, 6 * G - HEADROOM)]
    # a asks for 2G while b's memory comes back into the room: the room left is the headroom
    actions, decision = g.mem_update(a, 2, 10 * G, 0, 0, 2 * G)
    assert decision is None                                    # it waits for room
    assert actions == []                                       # b is not asked while it prefetches
    actions, _ = g.mem_update(b, 2.1, 6 * G - HEADROOM, 0, 4 * G + HEADROOM, flags=DONE)
    assert moves(actions) == [(SWAP_OUT, 2, 2 * G - HEADROOM)]  # now b gives some back
    actions, _ = g.mem_update(b, 2.2, 4 * G, 0, 6 * G)
    assert [(x.kind, x.client.client_id) for x in actions] == [(MEM_REPLY, 1)]
    assert actions[0].reply.status == C.NVSHARE_OK


def test_a_prefetch_cut_short_is_not_offered_again_before_the_next_grant():
    g, a, b = holder_and_swapped_waiter(resident=10 * G, swapped=10 * G)
    g.request(b, 1)
    # the GPU had less room than counted (memory nvshare does not see): 1G came back
    g.mem_update(b, 1.1, 1 * G, 0, 9 * G, flags=DONE | SHORT)
    assert g.memory.prefetch_stalled == {2}
    g.mem_update(a, 2, 8 * G, 0, 0)                             # a frees 2G: room grows
    assert g.tick(3) == []
    actions = g.tick(11)
    assert moves(actions) == [(DROP, 1, 9 * G - (16 * G - 9 * G))]
    g.mem_update(a, 11.2, 6 * G, 0, 2 * G)
    assert moves(g.release(1, 11.3)) == [(GRANT, 2, 0)]
    assert g.memory.prefetch_stalled == set()                   # its grant ends the stall


def test_an_unanswered_offer_runs_out_and_gives_its_room_back():
    """A hook that does not know PREFETCH ignores it: after drop_grace_sec the room is free again
    and nothing more is offered to that client before its grant."""
    g, a, b = holder_and_swapped_waiter(resident=10 * G, swapped=10 * G)
    g.request(b, 1)
    assert g.next_deadline() == 6.0
    assert g.memory.room() == HEADROOM
    assert g.tick(6.0) == []
    assert g.memory.prefetching == {} and g.memory.prefetch_stalled == {2}
    assert g.memory.room() == 6 * G


def test_a_stopped_waiter_is_offered_nothing_and_its_offer_is_withdrawn():
    g, a, b = holder_and_swapped_waiter(resident=10 * G, swapped=10 * G)
    g.request(b, 1)
    suspend_client(g, 2, 2, stopped=True, move=0)
    assert g.memory.prefetching == {}
    assert PREFETCH not in [x.kind for x in g.tick(3)]


def test_the_holder_moving_out_and_the_next_one_coming_in_overlap():
    """Both 12G on a 16G GPU: at the switch a moves 8G out; each report on its way lets b bring
    back what a has freed so far, so b's grant finds only the last part still to come in."""
    g = gpu()
    a, b = client(1), client(2)
    g.request(a, 0)
    g.mem_update(a, 0, 12 * G, 0, 0)
    g.mem_update(b, 0, 4 * G, 0, 8 * G)                         # 16G resident: no room
    assert g.request(b, 1) == []
    actions = g.tick(11)
    assert moves(actions) == [(DROP, 1, 8 * G)]
    offered = []
    for done_out in (2, 4, 6):                                  # a's reports, 2G at a time
        actions, _ = g.mem_update(a, 11 + done_out / 10, (12 - done_out) * G, 0, done_out * G)
        offered += [x.bytes for x in actions if x.kind == PREFETCH]
        back = sum(offered)
        g.mem_update(b, 11 + done_out / 10 + 0.05, 4 * G + back, 0, 8 * G - back, flags=DONE)
    assert offered == [2 * G, 2 * G, 2 * G]
    g.mem_update(a, 11.8, 4 * G, 0, 8 * G)
    actions = g.release(1, 11.9)
    assert moves(actions) == [(GRANT, 2, 0)]                    # 2G left to come in, room 2G


def test_a_grant_does_not_wait_for_its_own_prefetch():
    g, a, b = holder_and_swapped_waiter(resident=10 * G, swapped=10 * G)
    g.request(b, 1)                                             # 6G less headroom on its way
    g.tick(11)                                                  # a must move 4G out
    g.mem_update(a, 11.5, 6 * G, 0, 4 * G)
    assert moves(g.release(1, 11.6)) == [(GRANT, 2, 0)]          # its offer still unanswered
    assert g.memory.prefetching == {}
    g.mem_update(b, 11.7, 6 * G, 0, 4 * G, flags=DONE)           # a late answer changes nothing
    assert g.memory.prefetch_stalled == set()


def test_no_offer_where_turns_are_not_the_rule():
    for mode in ("serial", "auto"):
        g = gpu(mode=mode, auto_share="corun")
        a, b = client(1), client(2)
        g.request(a, 0)
        g.mem_update(a, 0, 6 * G, 0, 0)
        g.mem_update(b, 0, 0, 0, 4 * G)
        assert PREFETCH not in [x.kind for x in g.request(b, 1)], mode


def test_a_small_room_is_not_offered_but_a_small_remainder_is():
    g, a, b = holder_and_swapped_waiter(resident=16 * G - HEADROOM - 20 * MiB, swapped=4 * G)
    assert g.request(b, 1) == []                                # 20 MiB: not worth an offer
    g2, a2, b2 = holder_and_swapped_waiter(resident=10 * G, swapped=10 * MiB)
    assert moves(g2.request(b2, 1)) == [(CONTENDED, 1, 0), (PREFETCH, 2, 10 * MiB)]


def test_an_offer_that_brought_nothing_back_waits_for_more_room():
    """b's chunks are 256 MiB; 200 MiB of room brings none of them back. The offer is not
    repeated at every event, only once the room has grown past it."""
    g, a, b = holder_and_swapped_waiter(resident=16 * G - HEADROOM - 200 * MiB, swapped=4 * G)
    assert moves(g.request(b, 1)) == [(PREFETCH, 2, 200 * MiB)]
    g.mem_update(b, 1.1, 0, 0, 4 * G, flags=DONE)               # nothing came back
    assert g.tick(2) == [] and g.mem_update(b, 2.1, 0, 0, 4 * G)[0] == []
    actions, _ = g.mem_update(a, 3, 16 * G - HEADROOM - 600 * MiB, 0, 0)   # a frees 400 MiB
    assert moves(actions) == [(PREFETCH, 2, 600 * MiB)]


def test_a_hook_that_does_not_say_it_answers_prefetch_is_offered_nothing():
    """An older hook (CLIENT_REGISTER without NVSHARE_CLIENT_PREFETCH) would leave the offer to
    run out after drop_grace_sec, and the holder's allocations waiting on it until then."""
    from dataclasses import replace
    g, a, b = holder_and_swapped_waiter(resident=6 * G, swapped=8 * G)
    old = replace(b, prefetch=False)
    assert moves(g.request(old, 1)) == [(CONTENDED, 1, 0)]
    assert g.memory.prefetching == {}


def test_a_report_in_the_middle_of_a_swap_out_is_not_its_answer():
    """A client moving memory out for PREPARE_SWAP_OUT reports after each chunk (MOVING) so that
    the head can bring its memory back meanwhile. Taken as the answer, the first such report ended
    the ask: nobody left to ask, the head was granted without the room it waits for."""
    g = gpu()
    head, idle = client(1), client(2)
    g.mem_update(idle, 0, 12 * G, 2 * G, 0)                      # room 4G, 10G of it can move
    g.mem_update(head, 0, 0, 0, 10 * G)
    assert moves(g.request(head, 1)) == [(PREFETCH, 1, 4 * G), (SWAP_OUT, 2, 6 * G)]
    g.mem_update(head, 1.1, 4 * G, 0, 6 * G, flags=DONE)
    actions, _ = g.mem_update(idle, 1.2, 11 * G, 2 * G, 1 * G, flags=C.NVSHARE_MEM_MOVING)
    assert moves(actions) == [(PREFETCH, 1, 1 * G)]              # the room so far, no grant yet
    assert 2 in g.memory.swap_asked
    g.mem_update(head, 1.3, 5 * G, 0, 5 * G, flags=DONE)
    actions, _ = g.mem_update(idle, 1.5, 6 * G, 2 * G, 6 * G)    # the last chunk: its answer
    assert moves(actions) == [(GRANT, 1, 0)]
    assert g.memory.swap_asked == {}


def test_no_offer_while_the_running_holder_grows_and_then_headroom_for_its_growth():
    """The holder's own allocations come first (issue 39): on the H200 a PyTorch job's caching
    allocator grew in 11 steps of 32-256 MiB in its first 3 s while the waiter's memory came back
    ahead of its turn, and each step waited ~90 ms for the waiter to move it back out (1.27x its
    solo time). Now no offer goes out until the holder has asked for nothing for
    PREFETCH_QUIET_SEC, and the offer leaves twice its largest recent request free."""
    g, a, b = holder_and_swapped_waiter(resident=6 * G, swapped=8 * G)
    _, decision = g.mem_update(a, 0.5, 6 * G, 0, 0, 512 * MiB)
    assert decision.status == C.NVSHARE_OK
    assert PREFETCH not in [x.kind for x in g.request(b, 1)]     # it grew 0.5 s ago
    g.mem_update(a, 1.2, 6 * G + 512 * MiB, 0, 0)
    assert 0.5 + PREFETCH_QUIET_SEC in g.memory.deadlines()    # a pass when it is quiet
    assert PREFETCH not in [x.kind for x in g.tick(2.4)]
    actions = g.tick(0.5 + PREFETCH_QUIET_SEC)
    room = 16 * G - 6 * G - 512 * MiB
    headroom = max(HEADROOM, 2 * 512 * MiB)
    assert moves(actions) == [(PREFETCH, 2, min(8 * G, room - headroom))]


def test_a_waiter_asked_to_give_its_prefetch_back_is_offered_nothing_more_before_its_turn():
    """The H200's 40 s swap pair: in the 5 s before a switch the waiter was offered 220-450 MiB
    about 60 times while the holder's allocations took it back each time."""
    g, a, b = holder_and_swapped_waiter(resident=10 * G, swapped=10 * G)
    assert moves(g.request(b, 1)) == [(PREFETCH, 2, 6 * G - HEADROOM)]
    g.mem_update(b, 1.2, 6 * G - HEADROOM, 0, 4 * G + HEADROOM, flags=DONE)
    _, decision = g.mem_update(a, 5, 10 * G, 0, 0, 2 * G)
    assert decision is None
    g.mem_update(b, 5.1, 4 * G, 0, 6 * G)                      # moved back out: room for a
    g.mem_update(a, 5.2, 12 * G, 0, 0)
    g.mem_update(a, 8, 10 * G, 0, 0)                           # a freed 2 GiB again: room grows
    assert PREFETCH not in [x.kind for x in g.tick(9)]
    assert g.memory.prefetch_stalled == {2}


def test_a_waiter_whose_memory_moved_out_for_the_holder_before_any_offer_gets_one_when_room_comes():
    """b waits for the GPU with all its memory on it; the holder's allocation needs room, so b moves
    part of it out. That is no prefetch given back (it was offered none): when the holder frees memory
    in its turn, b's part comes back before its turn. Before, any waiter asked to move memory out
    was offered nothing more, and on the fake driver (tests/hook/test_prefetch_hook.py) b's memory
    came back only with its grant whenever its request reached the daemon before the holder's
    allocation did."""
    g = gpu()
    a, b = client(1), client(2)
    g.request(a, 0)
    g.mem_update(a, 0, 6 * G, 0, 0)
    g.mem_update(b, 0, 8 * G, 0, 0)
    g.request(b, 0.5)
    actions, decision = g.mem_update(a, 1, 6 * G, 0, 0, 3 * G)   # 6 + 8 + 3 > 16: b moves 1G out
    assert decision is None and moves(actions) == [(SWAP_OUT, 2, 1 * G)]
    g.mem_update(b, 1.5, 7 * G, 0, 1 * G)                      # moved out: room for a
    g.mem_update(a, 1.6, 9 * G, 0, 0)
    assert g.memory.prefetch_stalled == set()
    # a frees 8G in its turn: room 8G, less twice its last request (6G) left for its growth
    actions, _ = g.mem_update(a, 1 + PREFETCH_QUIET_SEC + 1, 1 * G, 0, 0)
    assert moves(actions) == [(PREFETCH, 2, 1 * G)]
