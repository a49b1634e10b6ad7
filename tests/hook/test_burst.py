"""Co-runners take turns burst by burst (csrc/burst.c, nvshare_slurm/scheduler/burstpage.py): the daemon
hands each adaptive co-runner its GPU's sealed page before the grant; the hooks' bursts then take
turns through it, with no daemon round trip; nothing a job writes into the page holds another back
for long."""
from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
import struct
import threading
import time

import pytest

from conftest import FAKE_GPUS
from lockclient import connect_and_register, gpu_frame
from nvshare_slurm.scheduler.burstpage import PAGE_BYTES
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C
from helpers_hook import GPU0 as TRACE_GPU0, Job, finish, read_trace, start_nvtest

GPU0 = FAKE_GPUS[0]["uuid"]
BURSTY = {"busy_ppm": 600_000, "burst_us": 5000, "gap_us": 3300}   # 60 % busy, 5 ms bursts


def recv_exact_with_fds(sock: socket.socket, size: int) -> tuple[bytes, list[int]]:
    data, fds = b"", []
    while len(data) < size:
        chunk, got, _, _ = socket.recv_fds(sock, size - len(data), 4)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
        fds += got
    return data, fds


def recv_frame_with_fds(sock: socket.socket) -> tuple[proto.Frame, list[int]]:
    head, fds = recv_exact_with_fds(sock, proto.HDR_SIZE)
    msg_type, length, seq = proto.decode_header(head)
    payload, more = recv_exact_with_fds(sock, length)
    return proto.Frame(msg_type, seq, payload), fds + more


def bursty_client(sched, job: int) -> socket.socket:
    """A registered client of job `job` on GPU 0 that reported bursty demand and asked."""
    sched.client().register_job(job, uid=0, gid=0, gpu_index=[0])
    sock, _ = connect_and_register(sched.socket, job)
    sock.sendall(proto.encode(C.NVSHARE_MSG_DEMAND, {"gpu_uuid": GPU0, **BURSTY}))
    sock.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0))
    return sock


def until_grant(sock: socket.socket) -> list[tuple[proto.Frame, list[int]]]:
    got = []
    while True:
        frame, fds = recv_frame_with_fds(sock)
        got.append((frame, fds))
        if frame.type == C.NVSHARE_MSG_LOCK_GRANT:
            return got


def page_of(frames) -> int:
    """The descriptor of the one BURST_PAGE, which comes right before the grant."""
    assert [f.type for f, _ in frames] == [C.NVSHARE_MSG_BURST_PAGE, C.NVSHARE_MSG_LOCK_GRANT]
    page, fds = frames[0]
    assert proto.text(page.body().gpu_uuid) == GPU0 and len(fds) == 1
    assert frames[1][0].body().flags == C.NVSHARE_GRANT_SHARED | C.NVSHARE_GRANT_BURSTS
    return fds[0]


def test_each_co_runner_gets_the_gpus_sealed_page_once_before_its_grant(scheduler):
    a, b = bursty_client(scheduler, 1), bursty_client(scheduler, 2)
    fds = []
    try:
        fds = [page_of(until_grant(a)), page_of(until_grant(b))]
        for fd in fds:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW and seals & fcntl.F_SEAL_SEAL
            assert os.fstat(fd).st_size == PAGE_BYTES
            with pytest.raises(PermissionError):
                os.ftruncate(fd, 0)     # no job can shrink it under the others (SIGBUS)
        one, two = (mmap.mmap(fd, PAGE_BYTES) for fd in fds)
        one[:4] = struct.pack("I", 0xC0FFEE)
        assert struct.unpack("I", two[:4])[0] == 0xC0FFEE   # one page for the GPU
        one.close()
        two.close()
        # Given back and asked again: the connection has the page already.
        a.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_RELEASED, GPU0, C.NVSHARE_RELEASE_IDLE))
        a.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0))
        again = until_grant(a)
        assert [f.type for f, _ in again] == [C.NVSHARE_MSG_LOCK_GRANT]
        assert again[0][0].body().flags == C.NVSHARE_GRANT_SHARED | C.NVSHARE_GRANT_BURSTS
        assert again[0][1] == []
    finally:
        for fd in fds:
            os.close(fd)
        a.close()
        b.close()


@pytest.mark.parametrize("settings", [{"auto_share": "corun"}, {"burst_turns": False}])
def test_plain_co_running_sends_no_page(scheduler_factory, settings):
    sched = scheduler_factory(**settings)
    a = bursty_client(sched, 1)
    try:
        frames = until_grant(a)
        assert [f.type for f, _ in frames] == [C.NVSHARE_MSG_LOCK_GRANT]
        assert frames[0][0].body().flags == C.NVSHARE_GRANT_SHARED and frames[0][1] == []
    finally:
        a.close()


def test_a_client_that_sends_a_page_is_cut_off_and_the_others_go_on(scheduler):
    scheduler.client().register_job(1, uid=0, gid=0, gpu_index=[0])
    sock, _ = connect_and_register(scheduler.socket, 1)
    with open(os.devnull, "rb") as f:
        socket.send_fds(sock, [gpu_frame(C.NVSHARE_MSG_BURST_PAGE, GPU0)], [f.fileno()])
        sock.settimeout(5)
        assert sock.recv(1 << 16) == b""            # closed
    sock.close()
    assert "BURST_PAGE is not a message a peer may send" in scheduler.log()
    b = bursty_client(scheduler, 2)
    try:
        os.close(page_of(until_grant(b)))
    finally:
        b.close()


@contextlib.contextmanager
def squatted_page(scheduler, job_id: int, write):
    """A hostile co-runner, job `job_id`: it maps the GPU's burst page and, once the yielded
    start() is called, calls write(page) every millisecond until the block ends."""
    hostile = bursty_client(scheduler, job_id)
    fd = page_of(until_grant(hostile))
    page = mmap.mmap(fd, PAGE_BYTES)
    stop = threading.Event()

    def squat():
        while not stop.is_set():
            write(page)
            time.sleep(0.001)

    squatter = threading.Thread(target=squat, daemon=True)
    try:
        yield squatter.start
    finally:
        stop.set()
        if squatter.is_alive():
            squatter.join()
        page.close()
        os.close(fd)
        hostile.close()


def kernel_spans(rows, pid):
    return sorted((r[2], r[3]) for r in rows if r[0] == pid and r[1] == TRACE_GPU0)


def test_a_job_that_holds_the_page_forever_costs_a_co_runner_little(hook_lib, scheduler,
                                                                     tmp_path, procs):
    """A hostile co-runner writes its own token into the page's owner word every millisecond and
    never runs a burst. A bursty job beside it waits at most about its own burst for the page, a
    few times in a row, then co-runs without looking at the page for a second: it finishes within
    25 % of its time alone, and its log says why. (Its bursts, 5 ms at a third busy, would be
    prompt ones, which wait for nobody: NVSHARE_PROMPT_BURSTS=off keeps them ordinary here.)"""
    def own_the_page(page):
        page[:4] = struct.pack("I", 0xBAD0BAD)   # the owner word

    with squatted_page(scheduler, 3, own_the_page) as squat:
        squat()
        trace = tmp_path / "trace"
        job = Job(scheduler, 4, trace, gpu_index=[0])
        steps, burst_ms, pause_ms = 100, 5, 10
        proc = start_nvtest(hook_lib, ["init", "ctx:0", f"burst:{burst_ms * 1000}:{steps}:{pause_ms}"],
                            dict(job.env, NVSHARE_LOG_LEVEL="debug", NVSHARE_PROMPT_BURSTS="off"))
        procs.append(proc)
        finish(proc, timeout=60)
    spans = kernel_spans(read_trace(trace), proc.pid)
    took = (spans[-1][1] - spans[0][0]) / 1e9
    alone = steps * (burst_ms + pause_ms) / 1000
    print(f"{took:.2f} s for {alone:.2f} s alone")
    assert took <= 1.25 * alone, (took, alone)
    assert "bursts take turns" in proc.stderr_text, proc.stderr_text[-2000:]   # granted, or again
    assert "waited in vain" in proc.stderr_text, proc.stderr_text[-2000:]
