"""libnvshare.so under what real CUDA programs do (issue 10): graph capture, stream-ordered pools,
the app's own virtual memory, a drain that cannot finish. (CUDA 13's entry points are among
test_hook.py's cuGetProcAddress cases; a daemon that hangs is test_hook_stall.py's.)

Against the fake driver (tests/c) and, where the daemon's behaviour is the point, a scripted daemon
that speaks the protocol from Python (ScriptedDaemon). Each test fails with the hook before issue 10
(NVSHARE_TEST_LIB=/path/to/old/libnvshare.so shows it).
"""
from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C
from helpers_hook import GPU0, GPU1, Job, finish, overlaps, read_trace, run_nvtest, start_nvtest

MIB = 1 << 20


@pytest.fixture
def concurrent(scheduler_factory):
    return scheduler_factory(scheduling_mode="concurrent", switch_time_mode="fixed",
                             switch_time_fixed=30.0)


def wait_for_line(proc, text: str, timeout: float = 20.0) -> None:
    """Reads proc's stdout until a line containing text (the process goes on running)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"no '{text}' from nvtest: {''.join(seen)}")


def memory_used(sched, gpu: str) -> int:
    return {g["uuid"]: g for g in sched.client().status()["gpus"]}[gpu]["memory_used"]


def wait_memory(sched, gpu: str, want: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    used = -1
    while time.monotonic() < deadline:
        used = memory_used(sched, gpu)
        if used == want:
            return used
        time.sleep(0.05)
    return used


# ---- graph capture ------------------------------------------------------------------------------

def test_a_hand_over_waits_for_an_open_graph_capture(hook_lib, concurrent, tmp_path, procs):
    """A waiter arrives while the holder has a capture open and submits nothing: the keeper must not
    synchronise (that invalidates the capture, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED at its end)."""
    trace = tmp_path / "trace"
    holder = Job(concurrent, 201, trace, gpu_index=[0])
    waiter = Job(concurrent, 202, trace, gpu_index=[0])
    first = start_nvtest(hook_lib, ["init", "ctx:0", "launch:1000", "sync", "capture:20000:3:1500", "sync"],
                         holder.env)
    procs.append(first)
    wait_for_line(first, "sync ok")
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "launch:50000", "sync"], waiter.env))
    out = finish(first)
    finish(procs[1])
    assert "capture rc=0 replayed" in out, out
    rows = read_trace(trace)
    assert overlaps(rows, GPU0) == []
    replay = [r for r in rows if r[0] == first.pid and r[3] - r[2] >= 59_000_000]
    assert len(replay) == 1, "the captured kernels did not replay as one graph"


# ---- memory the hook did not see ----------------------------------------------------------------

def shown_until(lib: Path, sched, procs, job: Job, make: list[str], shown: int, undo: str,
                undone: str) -> None:
    """Runs `make`, checks the daemon shows `shown` bytes on GPU0 while the process holds on, then
    after the `undo` action (which prints `undone`) that it shows none."""
    proc = start_nvtest(lib, ["init", "ctx:0", *make, "sleep:20000", undo, "sleep:20000"], job.env)
    procs.append(proc)
    assert wait_memory(sched, GPU0, shown) == shown
    wait_for_line(proc, undone, timeout=30)
    assert wait_memory(sched, GPU0, 0) == 0


def test_memory_a_pool_keeps_after_free_is_reported(hook_lib, scheduler, tmp_path, procs):
    """cudaMallocAsync with a pool that keeps freed memory (PyTorch's backend:cudaMallocAsync): the
    GPU memory stays taken after cuMemFreeAsync, so the daemon must go on seeing it until a trim."""
    job = Job(scheduler, 211, tmp_path / "trace", gpu_index=[0])
    shown_until(hook_lib, scheduler, procs, job, ["poolkeep", f"asyncalloc:{64 * MIB}", "asyncfreeall"],
                64 * MIB, "pooltrim", "pooltrim ok")


def test_a_released_handle_counts_until_it_is_unmapped(hook_lib, scheduler, tmp_path, procs):
    job = Job(scheduler, 212, tmp_path / "trace", gpu_index=[0])
    shown_until(hook_lib, scheduler, procs, job, [f"vmkeep:{4 * MIB}"], 4 * MIB, "vmdrop", "vmdrop ok")


def test_cuda_arrays_are_counted(hook_lib, scheduler, tmp_path, procs):
    job = Job(scheduler, 214, tmp_path / "trace", gpu_index=[0])
    shown_until(hook_lib, scheduler, procs, job, ["array:1024:1024"], 16 * MIB,  # float4
                "arrayfree", "arrayfree ok")


def test_device_total_memory_is_the_jobs_limit(hook_lib, scheduler, tmp_path):
    job = Job(scheduler, 213, tmp_path / "trace", gpu_index=[0], NVSHARE_MEM_LIMIT="1G")
    out = run_nvtest(hook_lib, ["init", "ctx:0", "totalmem"], env=job.env)
    assert f"totalmem {1 << 30}" in out.stdout, out.stdout + out.stderr


# ---- contexts -----------------------------------------------------------------------------------

def drained_before_the_waiter(lib: Path, sched, tmp_path: Path, procs, steps: list[str], ready: str) -> None:
    """Runs `steps` (a 400 ms kernel somewhere, then host work) in one job; once it printed `ready`,
    a second job waits for the GPU. The first job's release must wait for that kernel."""
    trace = tmp_path / "trace"
    first_job, other = Job(sched, 271, trace, gpu_index=[0]), Job(sched, 272, trace, gpu_index=[0])
    first = start_nvtest(lib, ["init", *steps, "sleep:1500"], first_job.env)
    procs.append(first)
    wait_for_line(first, ready, timeout=60)
    procs.append(start_nvtest(lib, ["init", "ctx:0", "launch:20000", "sync"], other.env))
    finish(first)
    finish(procs[1])
    rows = read_trace(trace)
    assert len(rows) == 2 and overlaps(rows, GPU0) == []


def test_work_in_the_300th_context_is_drained_too(hook_lib, concurrent, tmp_path, procs):
    """The context table used to stop at 256 entries: work in later contexts ran on after release."""
    drained_before_the_waiter(hook_lib, concurrent, tmp_path, procs, ["manyctx:0:300", "launch:400000"],
                              "launch ok")


# ---- a daemon that is there but does not behave -------------------------------------------------

class ScriptedDaemon:
    """A socket that answers CLIENT_REGISTER, then follows a script; records what the hook sends
    as (monotonic time, type, body) and answers heartbeats and questions."""

    def __init__(self, path: Path, drop_after_grant: float | None = None,
                 drop_bytes: int = 0):
        self.path = str(path)
        self.drop_after_grant = drop_after_grant
        self.drop_bytes = drop_bytes
        self.dropped: set[str] = set()
        self.received: list[tuple[float, int, object]] = []
        self.cond = threading.Condition()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(1)
        self.conn: socket.socket | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _send(self, msg_type: int, fields: dict, seq: int = 0) -> None:
        assert self.conn is not None
        self.conn.sendall(proto.encode(msg_type, fields, seq))

    def _serve(self) -> None:
        self.conn, _ = self.server.accept()
        self.server.close()  # one connection: a reconnect finds nobody
        try:
            while True:
                frame = proto.recv_frame(self.conn)
                with self.cond:
                    self.received.append((time.monotonic(), frame.type, frame.body()))
                    self.cond.notify_all()
                if frame.type == C.NVSHARE_MSG_CLIENT_REGISTER:
                    self._send(C.NVSHARE_MSG_CLIENT_REGISTER_REPLY, {"status": 0, "client_id": 1}, frame.seq)
                elif frame.type == C.NVSHARE_MSG_HEARTBEAT:
                    self._send(C.NVSHARE_MSG_HEARTBEAT, {"timestamp_ns": frame.body().timestamp_ns},
                               frame.seq)
                elif frame.type == C.NVSHARE_MSG_MEM_UPDATE and frame.body().request:
                    self._send(C.NVSHARE_MSG_MEM_REPLY, {"status": 0, "available": 8 << 30,
                                                         "total": 16 << 30}, frame.seq)
                elif frame.type == C.NVSHARE_MSG_LOCK_REQUEST:
                    uuid = proto.text(frame.body().gpu_uuid)
                    self._send(C.NVSHARE_MSG_LOCK_GRANT, {"gpu_uuid": uuid})
                    if self.drop_after_grant is not None and uuid not in self.dropped:
                        self.dropped.add(uuid)  # once per GPU: the next grant keeps it
                        threading.Timer(self.drop_after_grant, self._send,
                                        (C.NVSHARE_MSG_DROP_LOCK, {"gpu_uuid": uuid,
                                                                   "bytes": self.drop_bytes})).start()
        except (OSError, ConnectionError, proto.ProtocolError):
            pass

    def wait_for(self, msg_type: int, timeout: float = 20.0, gpu: str | None = None) -> tuple[float, object]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for t, kind, body in self.received:
                    if kind == msg_type and (gpu is None or proto.text(body.gpu_uuid) == gpu):
                        return t, body
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no message {msg_type}; got {[k for _, k, _ in self.received]}")
                self.cond.wait(left)


def scripted_env(sock: Path, trace: Path, **extra: str) -> dict:
    return {"NVSHARE_SOCKET": str(sock), "NVSHARE_JOB_ID": "231", "SLURM_STEP_ID": "0",
            "NVSHARE_MANAGED_GPUS": GPU0, "CUDA_VISIBLE_DEVICES": GPU0, "FAKE_CUDA_TRACE": str(trace),
            **extra}


def test_small_allocations_ask_the_daemon_once_per_budget(hook_lib, tmp_path, procs):
    """With 8 GiB of headroom, 100 allocations of 256 KiB (25 MiB) ask the daemon twice: the
    first, then once each time the 16 MiB budget an answer leaves is spent; every one of them is
    still reported, so the daemon's last word on this process is all 25 MiB."""
    daemon = ScriptedDaemon(tmp_path / "d.sock")
    proc = start_nvtest(hook_lib, ["init", "ctx:0"] + [f"alloc:{256 << 10}"] * 100 + ["sleep:300"],
                        scripted_env(tmp_path / "d.sock", tmp_path / "trace"))
    procs.append(proc)
    out = finish(proc)
    assert out.count("rc=0") == 100, out
    updates = [body for _, kind, body in daemon.received if kind == C.NVSHARE_MSG_MEM_UPDATE]
    asks = [body for body in updates if body.request]
    assert len(asks) == 2, [(b.request, b.allocated) for b in asks]
    # The second ask comes once 16 MiB were admitted without asking after the first one.
    assert asks[1].allocated == (1 + 64) * (256 << 10)
    assert updates[-1].allocated == 100 * (256 << 10) and not updates[-1].request


def test_memory_reports_are_merged_not_sent_per_allocation(hook_lib, tmp_path, procs):
    """300 alloc/free pairs of 4 KiB back to back: the reports wait a moment for newer numbers
    (docs/design-hook.md, "Memory"), so the daemon reads fewer of them than there were pairs, and
    the last one, 0 bytes held, still arrives while the program sleeps."""
    daemon = ScriptedDaemon(tmp_path / "d.sock")
    steps = ["init", "ctx:0"] + ["alloc:4096", "free:0"] * 300 + ["sleep:300"]
    proc = start_nvtest(hook_lib, steps, scripted_env(tmp_path / "d.sock", tmp_path / "trace"))
    procs.append(proc)
    assert finish(proc).count("free rc=0") == 300
    reports = [b for _, kind, b in daemon.received if kind == C.NVSHARE_MSG_MEM_UPDATE and not b.request]
    assert 1 <= len(reports) < 300, len(reports)
    assert reports[-1].allocated == 0


@pytest.mark.parametrize("setting, asks", [("off", 20), ("maybe", 1)])
def test_alloc_budget_off_asks_for_every_allocation(hook_lib, tmp_path, procs, setting, asks):
    """NVSHARE_ALLOC_BUDGET=off: a question for each small allocation; a value that is neither on
    nor off is said and taken as on."""
    daemon = ScriptedDaemon(tmp_path / "d.sock")
    proc = start_nvtest(hook_lib, ["init", "ctx:0"] + [f"alloc:{256 << 10}"] * 20 + ["sleep:200"],
                        scripted_env(tmp_path / "d.sock", tmp_path / "trace", NVSHARE_ALLOC_BUDGET=setting))
    procs.append(proc)
    assert finish(proc).count("rc=0") == 20
    got = [b for _, kind, b in daemon.received if kind == C.NVSHARE_MSG_MEM_UPDATE and b.request]
    assert len(got) == asks
    assert ("NVSHARE_ALLOC_BUDGET=maybe is neither 'on' nor 'off'; using 'on'" in proc.stderr_text) \
        == (setting == "maybe")


def test_a_stuck_drain_on_one_gpu_does_not_hold_up_another(hook_lib, tmp_path, procs):
    """GPU0's drain waits for a 2 s kernel; GPU1, asked to release meanwhile, must not wait for it
    (the context table's lock was held across GPU0's synchronise)."""
    daemon = ScriptedDaemon(tmp_path / "d.sock", drop_after_grant=0.2)
    trace = tmp_path / "trace"
    env = scripted_env(tmp_path / "d.sock", trace, NVSHARE_DRAIN_TIMEOUT_MS="300",
                       NVSHARE_MANAGED_GPUS=f"{GPU0},{GPU1}")
    proc = start_nvtest(hook_lib, ["init", "thread:0:2000000:1", "sleep:300", "thread:1:1000:1", "join",
                                   "sleep:300"], env)
    procs.append(proc)
    released_1, _ = daemon.wait_for(C.NVSHARE_MSG_LOCK_RELEASED, gpu=GPU1)
    released_0, _ = daemon.wait_for(C.NVSHARE_MSG_LOCK_RELEASED, gpu=GPU0)
    finish(proc)
    gpu0_kernel = next(r for r in read_trace(trace) if r[1] == GPU0)
    assert released_1 * 1e9 < gpu0_kernel[3] - 0.5e9, "GPU1's release waited for GPU0's kernel"
    assert released_0 * 1e9 >= gpu0_kernel[3]


def test_a_drain_past_its_deadline_is_reported_and_the_lock_kept(hook_lib, tmp_path, procs):
    """DROP_LOCK while a 1.5 s kernel runs, drain deadline 300 ms: DRAIN_STUCK after about 300 ms,
    and LOCK_RELEASED only once the kernel has ended (never while the work still runs)."""
    daemon = ScriptedDaemon(tmp_path / "d.sock", drop_after_grant=0.1)
    trace = tmp_path / "trace"
    proc = start_nvtest(hook_lib, ["init", "ctx:0", "launch:1500000", "sync", "sleep:1000"],
                        scripted_env(tmp_path / "d.sock", trace, NVSHARE_DRAIN_TIMEOUT_MS="300"))
    procs.append(proc)
    stuck_at, stuck = daemon.wait_for(C.NVSHARE_MSG_DRAIN_STUCK)
    released_at, _ = daemon.wait_for(C.NVSHARE_MSG_LOCK_RELEASED)
    finish(proc)
    kernel = read_trace(trace)[0]
    assert stuck.bytes >= 300
    assert stuck_at < released_at
    assert released_at * 1e9 >= kernel[3], "LOCK_RELEASED was sent while the kernel still ran"
    assert "did not finish within 300 ms" in proc.stderr_text


def test_a_job_the_daemon_learns_late_is_still_gated(hook_lib, scheduler, tmp_path, procs):
    """CLIENT_REGISTER before the daemon knows the job (a restart rebuilding from Slurm): the hook
    asks again for a few seconds instead of running unshared at once."""
    env = {"NVSHARE_SOCKET": scheduler.socket, "NVSHARE_JOB_ID": "241", "SLURM_STEP_ID": "0",
           "FAKE_CUDA_TRACE": str(tmp_path / "trace")}
    proc = start_nvtest(hook_lib, ["init", "ctx:0", "launch:1000", "sync"], env)
    procs.append(proc)
    time.sleep(1.0)
    placement = scheduler.client().register_job(241, uid=os.getuid(), gid=os.getgid(), slots=1)
    assert placement["gpu_uuid"]
    finish(proc, timeout=30)
    assert "refused this process" not in proc.stderr_text
    deadline = time.monotonic() + 5
    while "client registered" not in scheduler.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "client registered" in scheduler.log()


# ---- swappable memory looks like cuMemAlloc's ---------------------------------------------------

def test_the_range_of_a_swappable_pointer_is_its_whole_allocation(hook_lib, scheduler, tmp_path):
    """300 MiB are mapped as a 256 MiB and a 44 MiB chunk; the driver alone would describe the chunk."""
    job = Job(scheduler, 251, tmp_path / "trace", gpu_index=[0])
    out = run_nvtest(hook_lib, ["init", "ctx:0", f"range:{300 * MIB}:{260 * MIB}"], env=job.env)
    assert f"range rc=0 base_off=0 size={300 * MIB} attr rc=0 base_off=0 size={300 * MIB}" in out.stdout, \
        out.stdout + out.stderr


def test_a_reset_device_leaves_no_dead_context_to_drain(hook_lib, concurrent, tmp_path, procs):
    """cudaDeviceReset destroys the primary context; the keeper must not push it at the next
    hand-over (the real driver may crash on it; the fake driver says so on stderr)."""
    trace = tmp_path / "trace"
    holder, other = Job(concurrent, 281, trace, gpu_index=[0]), Job(concurrent, 282, trace, gpu_index=[0])
    first = start_nvtest(hook_lib, ["init", "ctx:0", "launch:1000", "sync", "reset:0", "ctx:0",
                                    "launch:200000", "sleep:1500"], holder.env)
    procs.append(first)
    wait_for_line(first, "launch ok")
    wait_for_line(first, "launch ok")
    procs.append(start_nvtest(hook_lib, ["init", "ctx:0", "launch:20000", "sync"], other.env))
    finish(first)
    finish(procs[1])
    assert "destroyed context" not in first.stderr_text
    assert overlaps(read_trace(trace), GPU0) == []


def test_work_on_a_green_context_stream_is_drained(hook_lib, concurrent, tmp_path, procs):
    """A green context is a context of its own: synchronising the primary one does not wait for it."""
    drained_before_the_waiter(hook_lib, concurrent, tmp_path, procs, ["ctx:0", "greenlaunch:400000"],
                              "greenlaunch ok")


@pytest.mark.parametrize("peer", [False, True])
def test_memory_a_peer_gpu_may_reach_is_not_swapped(hook_lib, tmp_path, procs, peer):
    """Once GPU1's context may access GPU0's memory, GPU1's kernels could touch it past GPU0's gate:
    a DROP_LOCK that asks GPU0 to move its memory out must leave it where it is."""
    daemon = ScriptedDaemon(tmp_path / "d.sock", drop_after_grant=0.3, drop_bytes=64 * MIB)
    steps = ["init", "ctx:1", *(["peer:0"] if peer else []), "ctx:0", f"alloc:{64 * MIB}", "launch:1000",
             "sync", "sleep:1500"]
    proc = start_nvtest(hook_lib, steps, scripted_env(tmp_path / "d.sock", tmp_path / "trace"))
    procs.append(proc)
    _, released = daemon.wait_for(C.NVSHARE_MSG_LOCK_RELEASED)
    finish(proc)
    assert released.bytes == (0 if peer else 64 * MIB)


def test_freeing_swappable_memory_waits_for_its_own_gpu(hook_lib, tmp_path, procs):
    """cuMemFree from a thread whose current context is on GPU1 must still wait for GPU0's kernel
    before the memory is unmapped (cuMemFree's contract)."""
    ScriptedDaemon(tmp_path / "d.sock")
    trace = tmp_path / "trace"
    proc = start_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{4 * MIB}", "launch:400000", "ctx:1", "freeall",
                                   "stamp"], scripted_env(tmp_path / "d.sock", trace))
    procs.append(proc)
    out = finish(proc)
    freed_at = int(out.split("stamp ")[1].split()[0])
    kernel_end = read_trace(trace)[0][3]
    assert freed_at >= kernel_end, "the memory was unmapped while GPU0's kernel could still use it"
