"""One user must not stall the others (issue 25, items 1, 3 and 4): frames are served round robin
over uids, an unresponsive user's clients lose their place for a period that grows with each miss,
a user's many clients take one turn per round, and a stopping daemon grants nothing.

The policy tests drive gpustate.py with a fake clock; the others run a real nvshare-scheduler with
the attacks made by an unprivileged uid (nobody)."""
from __future__ import annotations

import os
import select
import signal
import statistics
import time

import pytest

from conftest import become
from helpers_daemon import GPU0, NOBODY, OTHER, as_uid, wait_for_waiters
from lockclient import connect_and_register, gpu_frame, mem_frame
from nvshare_slurm.policy.gpustate import GpuState
from nvshare_slurm.policy.policytypes import DROP, GRANT, UNRESPONSIVE, GpuSettings
from nvshare_slurm.scheduler.registry import RegisteredClient
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C

GPU1_FLOOD = "GPU-fa4e0000-0000-0000-0000-000000000001"
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="acts as other uids: needs root")


# --- the policy: per-uid turns and the unresponsive penalty (item 3) -----------------------------

def policy(**settings) -> GpuState:
    base = dict(mode="concurrent", auto_share="turns", switch_time_mode="fixed",
                switch_time_fixed=1.0, memory_reserve_percent=0, max_runtime_sec=100,
                drop_grace_sec=4.0, turn_handoff=False)
    base.update(settings)
    return GpuState("GPU-test", 0, 16 << 30, GpuSettings(**base))


def user_client(n: int, uid: int) -> RegisteredClient:
    return RegisteredClient(n, n, 0, 1000 + n, f"u{uid}", uid=uid)


def granted(actions) -> list[int]:
    return [a.client.client_id for a in actions if a.kind == GRANT]


def test_one_users_many_clients_take_one_turn_per_round():
    """uid 100 queued three clients before uid 200's one: turns alternate between the users
    instead of giving uid 100 three turns in a row (FIFO)."""
    g = policy()
    x1, x2, x3, v = (user_client(1, 100), user_client(2, 100), user_client(3, 100),
                     user_client(9, 200))
    order = granted(g.request(x1, 0.0))
    for c, t in ((x2, 0.1), (x3, 0.2), (v, 0.3)):
        g.request(c, t)
    now = 0.5
    for _ in range(5):
        holder = order[-1]
        released = g.release(holder, now)
        g.request({1: x1, 2: x2, 3: x3, 9: v}[holder], now)   # it asks again at once
        order += granted(released)
        now += 0.5
    assert order == [1, 9, 2, 9, 3, 9]


def test_an_unresponsive_users_clients_lose_their_place_for_a_period_that_doubles():
    g = policy()
    x, x2, v = user_client(1, 100), user_client(2, 100), user_client(9, 200)
    assert granted(g.request(x, 0.0)) == [1]
    g.request(v, 0.0)
    assert [a.kind for a in g.tick(1.0) if a.client is x] == [DROP]
    assert g.tick(4.9) == []
    assert [(a.kind, a.client.client_id) for a in g.tick(5.0)] == [(UNRESPONSIVE, 1)]
    assert granted(g.release(1, 5.0)) == [9]            # the daemon revokes it (sender.py)
    first = g.lock.penalty_left(x, 5.0)
    assert first == pytest.approx(4.0)                  # drop_grace_sec after the first miss
    # Its clients ask and wait benched: v may release and ask again, x is still not granted.
    g.request(x, 5.1), g.request(x2, 5.2)
    assert g.client_state(1) == "waiting" and not g.queue
    assert granted(g.release(9, 6.0)) == [] and g.request(v, 6.0) != []
    assert g.next_deadline() == pytest.approx(9.0)      # when the penalty ends
    assert granted(g.tick(9.0)) == []                   # back in the queue, behind v's turn
    assert list(g.queue) == [1, 2]
    # The next miss of the same uid: a shorter grace, and twice the penalty.
    assert granted(g.release(9, 9.5)) == [1]
    g.request(v, 9.5)
    g.tick(10.5)                                        # DROP_LOCK to x (its interval is over)
    assert g.lock.grace_for(x, 4.0) == pytest.approx(2.0)
    assert [(a.kind, a.client.client_id) for a in g.tick(12.5)
            if a.kind == UNRESPONSIVE] == [(UNRESPONSIVE, 1)]
    g.release(1, 12.5)
    assert g.lock.penalty_left(x, 12.5) == pytest.approx(2 * first)
    statuses = {w["pid"]: w for w in g.status(12.6, [], [])["waiting"]}
    assert statuses[1002]["penalty_sec"] == pytest.approx(8.0, abs=0.2)


def test_a_holder_asked_to_move_memory_out_has_longer_by_what_it_moves():
    """Its DROP_LOCK asks 4 GiB out (what the waiter lacks): a first move out pins host memory as
    it goes (1.4-5.5 GB/s on the H100), and in mix4-mem on the fake driver an 8 GiB move outlasted
    the whole grace, which benched its owner and left the GPU idle. Its grace is drop_grace_sec and
    a second per GiB it was asked to move."""
    g = policy()
    x, v = user_client(1, 100), user_client(9, 200)
    g.mem_update(x, 0.0, 10 << 30, 0, 0)
    g.mem_update(v, 0.0, 0, 0, 10 << 30)                # in host memory: it does not fit beside x
    assert granted(g.request(x, 0.0)) == [1]
    g.request(v, 0.0)
    drops = [a for a in g.tick(1.0) if a.kind == DROP]
    assert [(a.client.client_id, a.bytes) for a in drops] == [(1, 4 << 30)]
    assert g.lock.deadlines(4.0) == [pytest.approx(1.0 + 4.0 + 4.0)]
    assert [a.kind for a in g.tick(8.9)] == []          # past drop_grace_sec: still moving
    assert [(a.kind, a.client.client_id) for a in g.tick(9.0)] == [(UNRESPONSIVE, 1)]
    assert g.lock.penalty_left(x, 9.0) == pytest.approx(4.0)


# --- the daemon: floods (item 1) ------------------------------------------------------------------

def _pin_last_cpu() -> None:
    """The attacker on a CPU of its own, as Slurm's cpuset confines a job."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[-1]})


def _flood_reports(sched, connections: int, ready_w: int) -> None:
    """In a forked child: nobody's registered connections pipeline MEM_UPDATE reports."""
    code = 1
    try:
        _pin_last_cpu()
        become(NOBODY)
        socks = []
        for _ in range(connections):
            sock, body = connect_and_register(sched.socket, 2)
            assert body.status == C.NVSHARE_OK
            sock.setblocking(False)
            socks.append(sock)
        batch = b"".join(mem_frame(GPU1_FLOOD, (1 + i % 7) << 20, 0, 0, 0) for i in range(7)) * 64
        os.write(ready_w, b"x")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            _, writable, _ = select.select([], socks, [], 1.0)
            for sock in writable:
                try:
                    sock.send(batch)
                except (BlockingIOError, InterruptedError):
                    pass
        code = 0
    finally:
        os._exit(code)


def _hand_overs(sched, job_id: int, count: int) -> list[float]:
    """Two clients of job_id take turns on GPU 0: seconds from one's release to the other's grant."""
    a, _ = connect_and_register(sched.socket, job_id)
    b, _ = connect_and_register(sched.socket, job_id)
    request = gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0)
    release = gpu_frame(C.NVSHARE_MSG_LOCK_RELEASED, GPU0, C.NVSHARE_RELEASE_IDLE)
    a.sendall(request)
    while proto.recv_frame(a).type != C.NVSHARE_MSG_LOCK_GRANT:   # HANDOFF, CONTENDED: on
        pass
    holder, waiter = a, b
    waiter.sendall(request)
    times = []
    for _ in range(count):
        start = time.perf_counter()
        holder.sendall(release)
        while proto.recv_frame(waiter).type != C.NVSHARE_MSG_LOCK_GRANT:
            pass
        times.append(time.perf_counter() - start)
        holder.sendall(request)
        holder, waiter = waiter, holder
    a.close()
    b.close()
    return times


@needs_root
def test_a_report_flood_of_one_uid_does_not_stall_another_uids_hand_over(scheduler_factory):
    """Before: eight of nobody's connections flooding MEM_UPDATE reports made each hand-over of
    root's pair take a quarter of a second (median), a registration or root's status most of one."""
    sched = scheduler_factory(scheduling_mode="concurrent", log_level="warning")
    client = sched.client()
    client.register_job(1, uid=0, gid=0, gpu_index=[0])
    client.register_job(2, uid=NOBODY, gid=NOBODY, gpu_index=[1])
    ready_r, ready_w = os.pipe()
    flooder = os.fork()
    if flooder == 0:
        _flood_reports(sched, 8, ready_w)
    try:
        assert os.read(ready_r, 1) == b"x"
        time.sleep(0.5)                              # the flood is under way
        times = _hand_overs(sched, 1, 100)
        start = time.perf_counter()
        sock, body = connect_and_register(sched.socket, 1)
        registered = time.perf_counter() - start
        sock.close()
        start = time.perf_counter()
        assert client.status()["gpus"]
        status = time.perf_counter() - start
    finally:
        os.kill(flooder, signal.SIGKILL)
        os.waitpid(flooder, 0)
        os.close(ready_r)
        os.close(ready_w)
    times.sort()
    assert statistics.median(times) < 0.02, times[-10:]
    assert times[int(0.9 * len(times))] < 0.1, times[-10:]
    assert body.status == C.NVSHARE_OK and registered < 1.0 and status < 1.0


# --- the daemon: unresponsive clients of one user (item 3) ----------------------------------------

@needs_root
def test_a_users_unresponsive_clients_cost_another_user_about_one_grace(scheduler_factory):
    """nobody's three clients ask for GPU 0 and never release; another user's pair takes 20
    turns. Before: each of the three took a turn plus the grace in every round (about 2 s per
    round), so the 20 turns took over 10 s."""
    sched = scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                              switch_time_fixed=0.1, drop_grace_sec=0.5, log_level="info")
    client = sched.client()
    client.register_job(2, uid=NOBODY, gid=NOBODY, gpu_index=[0])
    client.register_job(3, uid=OTHER, gid=OTHER, gpu_index=[0])
    ready_r, ready_w = os.pipe()
    hostile = os.fork()
    if hostile == 0:
        code = 1
        try:
            become(NOBODY)
            socks = [connect_and_register(sched.socket, 2)[0] for _ in range(3)]
            for sock in socks:
                sock.setblocking(False)
            os.write(ready_w, b"x")
            request = gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0)
            for _ in range(1200):                    # ask every 50 ms, read and ignore all
                for sock in socks:
                    try:
                        while sock.recv(65536):
                            pass
                    except (BlockingIOError, InterruptedError):
                        pass
                    sock.send(request)
                time.sleep(0.05)
            code = 0
        finally:
            os._exit(code)
    try:
        assert os.read(ready_r, 1) == b"x"
        wait_for_waiters(sched, 2)                  # one of them holds, the others wait

        def victim() -> int:
            start = time.monotonic()
            _hand_overs(sched, 3, 20)
            return min(250, int((time.monotonic() - start) * 10))   # tenths of a second

        took = as_uid(OTHER, victim) / 10
    finally:
        os.kill(hostile, signal.SIGKILL)
        os.waitpid(hostile, 0)
        os.close(ready_r)
        os.close(ready_w)
    assert took < 5.0, f"the pair's 20 turns took {took:.1f} s"
    assert "uid 65534 loses its place there" in sched.log()


# --- the daemon: shutdown (item 4) -----------------------------------------------------------------

def test_sigterm_grants_nothing_while_the_daemon_closes_its_connections(scheduler_factory):
    """Before: closing the holder's connection granted the next waiter that was still open,
    which then ran beside the holder's process (the daemon is gone, the hook runs on)."""
    sched = scheduler_factory(scheduling_mode="concurrent", log_level="debug")
    sched.client().register_job(1, uid=0, gid=0, gpu_index=[0])
    holder, _ = connect_and_register(sched.socket, 1)
    holder.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0))
    assert proto.recv_frame(holder).type == C.NVSHARE_MSG_LOCK_GRANT
    waiters = []
    for _ in range(16):
        sock, _ = connect_and_register(sched.socket, 1)
        sock.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0))
        waiters.append(sock)
    assert len(wait_for_waiters(sched, 16)) == 16
    sched.proc.send_signal(signal.SIGTERM)
    received = []
    for sock in waiters:
        sock.settimeout(10)
        while True:
            try:
                frame = proto.recv_frame(sock)
            except (ConnectionError, OSError, proto.ProtocolError):
                break
            received.append(frame.name)
        sock.close()
    holder.close()
    assert sched.proc.wait(10) == 0
    assert "LOCK_GRANT" not in " ".join(received), received
    assert "lock granted" not in sched.log().split("stopping: SIGTERM")[-1]


def test_a_restarted_daemon_grants_one_holder_at_a_time(scheduler_factory):
    """After a restart every client registers again: one holds, the other waits (no overlap)."""
    sched = scheduler_factory(scheduling_mode="concurrent")
    sched.client().register_job(1, uid=0, gid=0, gpu_index=[0])
    socks = []
    for _ in range(2):
        sock, _ = connect_and_register(sched.socket, 1)
        sock.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0))
        socks.append(sock)
    assert sched.stop() == 0
    for sock in socks:
        sock.close()
    sched.start()
    again = []
    for _ in range(2):
        sock, body = connect_and_register(sched.socket, 1)
        assert body.status == C.NVSHARE_OK
        sock.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0))
        sock.settimeout(0.5)
        again.append(sock)
    grants = 0
    for sock in again:                               # both read before either closes
        try:
            grants += proto.recv_frame(sock).type == C.NVSHARE_MSG_LOCK_GRANT
        except TimeoutError:
            pass
    for sock in again:
        sock.close()
    assert grants == 1
