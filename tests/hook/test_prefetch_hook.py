"""PREFETCH through the real hook and daemon (docs/protocol.md "Swap" 8): a waiting job's swapped
memory comes back before its turn where it fits, and while the holder moves memory out for it.

The fake driver's device memory is shared between the processes (FAKE_CUDA_SHARED_MEMORY), so a
chunk brought back where the GPU has no room fails as on a real GPU. FAKE_CUDA_SWAP_COPY_MS makes
each chunk's copy take that long, and FAKE_CUDA_COPY_LOG records when each copy ran, by process.
"""
from __future__ import annotations

import socket
import time

from helpers_hook import GPU0, Job, finish, overlaps, read_copies, read_trace, start_nvtest
from lockclient import connect_and_register, gpu_frame, mem_frame

from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C

MiB = 1 << 20
COPY_MS = 300


def frame_of(sock: socket.socket, msg_type: int, timeout: float = 20.0):
    """The next frame of that type from the daemon (others are skipped), its body."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        frame = proto.recv_frame(sock)
        if frame.type == msg_type:
            return frame.body()
    raise AssertionError(f"no message {msg_type} from the daemon within {timeout}s")


def test_a_waiting_jobs_memory_comes_back_before_its_turn_where_it_fits(hook_lib, small_gpu, tmp_path,
                                                                        procs):
    """Job b's 512 MiB: half is moved out to make room for holder a's 700 MiB allocation. b then
    waits for the GPU; a frees 400 MiB in its turn, and b's half comes back (a 300 ms copy)
    while a still holds the GPU. At a's release b runs at once, its data intact."""
    sched = small_gpu(switch_time_mode="fixed", switch_time_fixed=30)
    trace, log, go = tmp_path / "trace", tmp_path / "copies", tmp_path / "go"
    b = Job(sched, 402, trace, gpu_index=[0], **sched.fake_env, FAKE_CUDA_SWAP_COPY_MS=str(COPY_MS),
            FAKE_CUDA_COPY_LOG=str(log))
    Job(sched, 401, trace, gpu_index=[0])
    proc = start_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{512 * MiB}", "fill:0:b5", "launch:1000", "sync",
                                   f"waitfile:{go}", "launch:1000", "sync", "check:0:b5", "stamp"], b.env)
    procs.append(proc)
    sock, _ = connect_and_register(sched.socket, 401)
    with sock:
        time.sleep(0.5)                                   # b has run and is idle
        sock.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0))
        frame_of(sock, C.NVSHARE_MSG_LOCK_GRANT)
        # a's 700 MiB do not fit beside b's 512: b moves a chunk out (its gate is shut)
        sock.sendall(mem_frame(GPU0, 0, 0, 0, 700 * MiB, seq=1))
        assert frame_of(sock, C.NVSHARE_MSG_MEM_REPLY).status == C.NVSHARE_OK
        sock.sendall(mem_frame(GPU0, 700 * MiB, 0, 0, 0))
        assert [way for _, way, _, _ in read_copies(log)] == ["dtoh"]
        go.touch()                                        # b asks for the GPU again: it waits
        time.sleep(0.5)
        freed = time.monotonic_ns()
        sock.sendall(mem_frame(GPU0, 300 * MiB, 0, 0, 0))  # a frees 400 MiB: room for b's chunk
        time.sleep(2 * COPY_MS / 1000 + 0.5)
        released = time.monotonic_ns()
        sock.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_RELEASED, GPU0, C.NVSHARE_RELEASE_DROPPED))
        out = finish(proc, timeout=30)
    assert f"check 0 rc=0 bytes={512 * MiB} bad=0" in out, out + proc.stderr_text
    moves = read_copies(log)
    assert [way for _, way, _, _ in moves] == ["dtoh", "htod"], moves
    _, _, back_start, back_end = moves[1]
    assert freed <= back_start and back_end < released, (freed, moves, released)
    assert "ahead of its turn" in proc.stderr_text
    # its first kernel after the release did not wait for a copy
    first_after = min(start for pid, gpu, start, _ in read_trace(trace) if start > released)
    assert first_after - released < COPY_MS * 1e6 / 2, (first_after - released) / 1e6


def test_memory_going_out_and_coming_in_at_a_switch_overlap(hook_lib, small_gpu, tmp_path, procs):
    """Two jobs of two 256 MiB chunks each take turns on a 768 MiB GPU (729.6 MiB usable): at each
    switch the holder moves both chunks out for the other's 512 MiB, and reports after the first;
    the next holder brings a chunk back into that room while the holder copies its second one
    out. Before, its copies in began only after the holder's last copy out."""
    sched = small_gpu(gpus=[{"uuid": GPU0, "memory": "768M"}], switch_time_mode="fixed",
                      switch_time_fixed=1.0)
    trace, log = tmp_path / "trace", tmp_path / "copies"
    env = dict(sched.fake_env, FAKE_CUDA_DEVICES=f"{GPU0}:768M", FAKE_CUDA_SWAP_COPY_MS="100",
               FAKE_CUDA_COPY_LOG=str(log))
    jobs = [Job(sched, 411 + n, trace, gpu_index=[0], **env) for n in range(2)]
    for n, job in enumerate(jobs):
        mark = f"{0xa1 + n:02x}"
        procs.append(start_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{512 * MiB}", f"fill:0:{mark}",
                                             "burst:50000:20:0", f"check:0:{mark}", "freeall"], job.env))
        time.sleep(0.3)
    try:
        outs = [finish(p, timeout=60) for p in procs]
    except AssertionError:
        print(sched.log_path.read_text()[:30000])
        raise
    for out, p in zip(outs, procs, strict=True):
        assert f"check 0 rc=0 bytes={512 * MiB} bad=0" in out, out + p.stderr_text
    assert overlaps(read_trace(trace), GPU0) == []
    moves = read_copies(log)
    both_ways = [(a, b) for a in moves for b in moves
                 if a[0] != b[0] and a[1] == "dtoh" and b[1] == "htod" and b[2] < a[3] and a[2] < b[3]]
    assert both_ways, "no copy in overlapped a copy out of the other job:\n" + "\n".join(map(str, moves)) \
        + "".join(p.stderr_text[-3000:] for p in procs)


def test_memory_born_in_host_memory_moves_without_copies_until_written(hook_lib, small_gpu, tmp_path,
                                                                       procs):
    """Job b's 512 MiB allocation is deferred (holder a has 700 MiB of the 1 GiB): born in host
    memory, with no contents. A prefetch brings it back while b waits; then a grows and b is asked
    to move it out again. Nothing was ever written there, so nothing is copied or pinned either
    way (on the H200 a waiter's deferred 67 GiB was copied out at 2.4 GB/s, pinning host memory
    for it, while the holder's allocations waited). b then runs, fills it and reads it back."""
    sched = small_gpu(switch_time_mode="fixed", switch_time_fixed=30)
    trace, log, go = tmp_path / "trace", tmp_path / "copies", tmp_path / "go"
    b = Job(sched, 402, trace, gpu_index=[0], **sched.fake_env, FAKE_CUDA_SWAP_COPY_MS=str(COPY_MS),
            FAKE_CUDA_COPY_LOG=str(log))
    Job(sched, 401, trace, gpu_index=[0])
    sock, _ = connect_and_register(sched.socket, 401)
    with sock:
        sock.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, GPU0))
        frame_of(sock, C.NVSHARE_MSG_LOCK_GRANT)
        sock.sendall(mem_frame(GPU0, 700 * MiB, 0, 0, 0))  # a report: no request of a running holder
        proc = start_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{512 * MiB}", "launch:1000", "sync",
                                       f"waitfile:{go}", "fill:0:b5", "check:0:b5", "stamp"], b.env)
        procs.append(proc)
        deadline = time.monotonic() + 15
        while "deferred" not in sched.log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "deferred" in sched.log_path.read_text(), sched.log_path.read_text()[-3000:]
        sock.sendall(mem_frame(GPU0, 300 * MiB, 0, 0, 0))  # a frees 400 MiB: b's memory comes back
        while "back before its turn" not in sched.log_path.read_text() \
                and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        assert "back before its turn" in sched.log_path.read_text(), sched.log_path.read_text()[-4000:]
        time.sleep(1.0)
        sock.sendall(mem_frame(GPU0, 300 * MiB, 0, 0, 600 * MiB, seq=2))   # a grows again
        assert frame_of(sock, C.NVSHARE_MSG_MEM_REPLY).status == C.NVSHARE_OK
        sock.sendall(mem_frame(GPU0, 900 * MiB, 0, 0, 0))
        time.sleep(0.5)
        sock.sendall(mem_frame(GPU0, 300 * MiB, 0, 0, 0))  # and frees it: room for b's turn
        go.touch()
        sock.sendall(gpu_frame(C.NVSHARE_MSG_LOCK_RELEASED, GPU0, C.NVSHARE_RELEASE_DROPPED))
        out = finish(proc, timeout=30)
    assert f"check 0 rc=0 bytes={512 * MiB} bad=0" in out, out + proc.stderr_text
    err = proc.stderr_text
    back, out_again = err.find(f"brought {512:.1f} MiB back ahead of its turn"), err.find("swapped out")
    assert 0 <= back < out_again, err
    assert "0 chunks pinned first" in err[out_again:].split("\n")[0], err
    assert read_copies(log) == [], read_copies(log)
