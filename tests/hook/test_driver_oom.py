"""The hook never hands the application an out-of-memory that the policy did not decide (issue 39).

The driver frees an ended process's memory some time after it ended, and processes outside nvshare
hold memory the daemon never hears of: the daemon may admit an allocation the driver then has no
room for. The hook tells the daemon (MEM_UPDATE with NVSHARE_MEM_DRIVER_OOM and the driver's free
memory), waits for its answer and a back-off, and asks the driver again, until NVSHARE_OOM_WAIT_SEC;
only then does the program get CUDA_ERROR_OUT_OF_MEMORY, with one line saying why
(docs/design-hook.md "When the driver has no room for what was admitted").

Against the fake driver (tests/c), whose FAKE_CUDA_SHARED_MEMORY makes device memory run out across
processes: an unhooked nvtest takes most of the 1 GiB GPU behind the daemon's back (the memory that
an ended process leaves for a while), and a hooked job allocates what the daemon counts as free.
"""
from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import SMALL_GPU, SMALL_GPU_MEMORY
from helpers_hook import BUILD, NVTEST, Job, finish, start_nvtest
from helpers_scripted import ScriptedDaemon
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C

MiB = 1 << 20
OTHER_BYTES = 700 * MiB    # held outside nvshare: 324 MiB of the fake GPU's 1024 stay free
JOB_BYTES = 600 * MiB      # fits the daemon's 972.8 MiB, not the driver's 324
WAIT_LINE = "although nvshare admitted it; waiting up to"
FOUND_LINE = "the driver found room for the 600.0 MiB"
GAVE_UP = re.compile(r"out of memory: asked for 600\.0 MiB; nvshare-scheduler counted ([0-9.]+) MiB "
                     r"available to this job; the driver had ([0-9.]+) MiB free; gave up after ([0-9.]+) s "
                     r"\(NVSHARE_OOM_WAIT_SEC=1\): CUDA_ERROR_OUT_OF_MEMORY")

# Each way an admitted allocation reaches the driver, and what nvtest prints when it worked.
# cudaMalloc's (cuMemAlloc_v2) is swappable by default: the backing's cuMemCreate is what fails, and
# the question says NVSHARE_MEM_CAN_DEFER, so the daemon may answer it DEFERRED (made in host memory
# at once, resident at the job's next grant) instead of letting it wait.
PATHS = {
    "swappable": ([f"alloc:{JOB_BYTES}"], {}, f"alloc {JOB_BYTES} rc=0"),
    "cuMemAlloc": ([f"alloc:{JOB_BYTES}"], {"NVSHARE_SWAP": "off"}, f"alloc {JOB_BYTES} rc=0"),
    "cuMemCreate": ([f"vm:{JOB_BYTES}"], {}, "vm rc=0 data ok"),
    "cuMemAllocAsync": ([f"asyncalloc:{JOB_BYTES}"], {}, f"asyncalloc {JOB_BYTES} rc=0"),
    "cuArrayCreate": (["array:40960:960"], {}, "array rc=0"),   # float4: 600 MiB
}


def device_used(path: Path) -> int:
    """Device 0's used bytes on the fake driver's shared count."""
    try:
        return struct.unpack("<Q", path.read_bytes()[:8])[0]
    except (OSError, struct.error):
        return 0


def start_other(shared: Path, hold_ms: int) -> subprocess.Popen:
    """An nvtest without the hook that takes OTHER_BYTES of the GPU, holds them hold_ms and frees
    them; nvshare-scheduler never hears of it. Returns once the memory is taken."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NVSHARE_", "SLURM_", "FAKE_CUDA_")) and k != "LD_PRELOAD"}
    env.update({"LD_LIBRARY_PATH": str(BUILD), "FAKE_CUDA_DEVICES": f"{SMALL_GPU}:{SMALL_GPU_MEMORY}",
                "FAKE_CUDA_SHARED_MEMORY": str(shared)})
    proc = subprocess.Popen([str(NVTEST), "init", "ctx:0", f"alloc:{OTHER_BYTES}", f"sleep:{hold_ms}",
                             "freeall"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while device_used(shared) < OTHER_BYTES and time.monotonic() < deadline:
        time.sleep(0.01)
    assert device_used(shared) >= OTHER_BYTES, "the other process did not take its memory"
    return proc


def stamps(out: str) -> list[int]:
    return [int(line.split()[1]) for line in out.splitlines() if line.startswith("stamp ")]


@pytest.mark.parametrize("path", list(PATHS))
def test_an_allocation_the_driver_has_no_room_for_yet_succeeds_once_memory_is_freed(
        hook_lib, small_gpu, tmp_path, procs, path):
    """The other process frees its memory 1.5 s after taking it: the job's allocation, which the
    daemon admitted and the driver refused meanwhile, is made then, and the program sees no error."""
    sched = small_gpu()
    shared = Path(sched.fake_env["FAKE_CUDA_SHARED_MEMORY"])
    actions, env, ok = PATHS[path]
    other = start_other(shared, 1500)
    procs.append(other)
    job = Job(sched, 391, tmp_path / "trace", gpu_index=[0], **sched.fake_env, **env)
    proc = start_nvtest(hook_lib, ["init", "ctx:0", "stamp", *actions, "stamp"], job.env)
    procs.append(proc)
    out = finish(proc, timeout=30)
    assert ok in out, out + proc.stderr_text
    assert WAIT_LINE in proc.stderr_text, proc.stderr_text
    assert FOUND_LINE in proc.stderr_text, proc.stderr_text
    assert "CUDA_ERROR_OUT_OF_MEMORY" not in proc.stderr_text
    before, after = stamps(out)
    deferred = path == "swappable" and re.search(r"job 391 .*allocation of .* deferred", sched.log())
    assert after - before > 0.5e9 or deferred, "the allocation did not wait for the other process's free"
    assert other.wait(timeout=10) == 0


def test_with_the_wait_off_the_program_gets_the_drivers_out_of_memory(hook_lib, small_gpu, tmp_path, procs):
    """NVSHARE_OOM_WAIT_SEC=0, the same situation: the driver's answer goes to the program at once
    (the behaviour before issue 39), so the test above fails without the retry."""
    sched = small_gpu()
    shared = Path(sched.fake_env["FAKE_CUDA_SHARED_MEMORY"])
    procs.append(start_other(shared, 1500))
    job = Job(sched, 392, tmp_path / "trace", gpu_index=[0], NVSHARE_OOM_WAIT_SEC="0", **sched.fake_env)
    proc = start_nvtest(hook_lib, ["init", "ctx:0", "stamp", f"alloc:{JOB_BYTES}", "stamp"], job.env)
    procs.append(proc)
    out = finish(proc, timeout=30)
    assert f"alloc {JOB_BYTES} rc=2" in out, out     # CUDA_ERROR_OUT_OF_MEMORY
    before, after = stamps(out)
    assert after - before < 0.5e9
    assert WAIT_LINE not in proc.stderr_text


def test_past_the_deadline_the_program_gets_out_of_memory_and_one_line_why(
        hook_lib, small_gpu, tmp_path, procs):
    """The other process never frees: with NVSHARE_OOM_WAIT_SEC=1 the program gets
    CUDA_ERROR_OUT_OF_MEMORY after about a second, and its output one line with what it asked for,
    what the daemon counted available and what the driver had free. (Plain cuMemAlloc: swappable
    memory the daemon may make in host memory instead.)"""
    sched = small_gpu()
    shared = Path(sched.fake_env["FAKE_CUDA_SHARED_MEMORY"])
    procs.append(start_other(shared, 60000))
    job = Job(sched, 393, tmp_path / "trace", gpu_index=[0], NVSHARE_OOM_WAIT_SEC="1", NVSHARE_SWAP="off",
              **sched.fake_env)
    proc = start_nvtest(hook_lib, ["init", "ctx:0", "stamp", f"alloc:{JOB_BYTES}", "stamp"], job.env)
    procs.append(proc)
    out = finish(proc, timeout=30)
    assert f"alloc {JOB_BYTES} rc=2" in out, out + proc.stderr_text
    before, after = stamps(out)
    assert 0.9e9 < after - before < 3e9
    lines = [line for line in proc.stderr_text.splitlines() if GAVE_UP.search(line)]
    assert len(lines) == 1, proc.stderr_text
    available, driver_free, waited = (float(x) for x in GAVE_UP.search(lines[0]).groups())
    assert available >= JOB_BYTES / MiB          # the daemon counted it free: not a policy decision
    assert driver_free == (1024 * MiB - OTHER_BYTES) / MiB
    assert 0.9 < waited < 3
    assert proc.stderr_text.count("out of memory:") == 1


def test_an_allocation_over_the_memory_limit_is_refused_at_once(hook_lib, small_gpu, tmp_path, procs):
    """NVSHARE_MEM_LIMIT is the policy's: over it the program gets the out-of-memory at once,
    without waiting, also when the driver would have no room either."""
    sched = small_gpu()
    shared = Path(sched.fake_env["FAKE_CUDA_SHARED_MEMORY"])
    procs.append(start_other(shared, 60000))
    job = Job(sched, 394, tmp_path / "trace", gpu_index=[0], NVSHARE_MEM_LIMIT="512M", **sched.fake_env)
    proc = start_nvtest(hook_lib, ["init", "ctx:0", "stamp", f"alloc:{JOB_BYTES}", "stamp"], job.env)
    procs.append(proc)
    out = finish(proc, timeout=30)
    assert f"alloc {JOB_BYTES} rc=2" in out, out
    before, after = stamps(out)
    assert after - before < 0.5e9
    assert "over NVSHARE_MEM_LIMIT" in proc.stderr_text
    assert WAIT_LINE not in proc.stderr_text


class HoldingDaemon(ScriptedDaemon):
    """Registers the client, grants every lock, admits every allocation (8 GiB available); a
    question with NVSHARE_MEM_DRIVER_OOM is recorded and answered only `hold` seconds later."""

    def __init__(self, path: Path, hold: float):
        self.hold = hold
        self.driver_oom: list[tuple[int, object]] = []   # (when received, body)
        super().__init__(path)

    def serve(self, conn: socket.socket, number: int) -> None:
        try:
            while True:
                frame = proto.recv_frame(conn)
                body = frame.body()
                if frame.type == C.NVSHARE_MSG_CLIENT_REGISTER:
                    conn.sendall(proto.encode(C.NVSHARE_MSG_CLIENT_REGISTER_REPLY,
                                              {"status": 0, "client_id": 1}, frame.seq))
                elif frame.type == C.NVSHARE_MSG_HEARTBEAT:
                    conn.sendall(proto.encode(C.NVSHARE_MSG_HEARTBEAT, {"timestamp_ns": body.timestamp_ns},
                                              frame.seq))
                elif frame.type == C.NVSHARE_MSG_LOCK_REQUEST:
                    conn.sendall(proto.encode(C.NVSHARE_MSG_LOCK_GRANT,
                                              {"gpu_uuid": proto.text(body.gpu_uuid)}))
                elif frame.type == C.NVSHARE_MSG_MEM_UPDATE and body.request:
                    if body.flags & C.NVSHARE_MEM_DRIVER_OOM:
                        with self.cond:
                            self.driver_oom.append((time.monotonic_ns(), body))
                        threading.Timer(self.hold, self._answer, (conn, frame.seq)).start()
                        continue
                    self._answer(conn, frame.seq)
        except (OSError, ConnectionError, proto.ProtocolError):
            pass

    def _answer(self, conn: socket.socket, seq: int) -> None:
        try:
            conn.sendall(proto.encode(C.NVSHARE_MSG_MEM_REPLY, {"status": 0, "available": 8 << 30,
                                                                "total": 16 << 30}, seq))
        except OSError:
            pass


def test_the_daemon_hears_the_drivers_figures_and_may_hold_the_retry(hook_lib, tmp_path, procs):
    """The question carries the bytes, NVSHARE_MEM_DRIVER_OOM and the driver's free MiB; the hook
    asks the driver again only after the answer, which this daemon holds for 1.5 s although the
    other process freed its memory after 0.3 s."""
    daemon = HoldingDaemon(tmp_path / "d.sock", hold=1.5)
    try:
        shared = tmp_path / "device-memory"
        env = {"NVSHARE_SOCKET": str(tmp_path / "d.sock"), "NVSHARE_JOB_ID": "395", "SLURM_STEP_ID": "0",
               "NVSHARE_MANAGED_GPUS": SMALL_GPU, "CUDA_VISIBLE_DEVICES": SMALL_GPU,
               "FAKE_CUDA_DEVICES": f"{SMALL_GPU}:{SMALL_GPU_MEMORY}", "FAKE_CUDA_SHARED_MEMORY": str(shared)}
        procs.append(start_other(shared, 300))
        proc = start_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{JOB_BYTES}", "stamp"], env)
        procs.append(proc)
        out = finish(proc, timeout=30)
        assert f"alloc {JOB_BYTES} rc=0" in out, out + proc.stderr_text
        with daemon.cond:
            asked = list(daemon.driver_oom)
        assert len(asked) == 1, asked            # one question; the answer let the retry through
        when, body = asked[0]
        assert body.request == JOB_BYTES
        assert body.flags & C.NVSHARE_MEM_DRIVER_OOM and body.flags & C.NVSHARE_MEM_CAN_DEFER
        assert body.driver_free_mib == (1024 * MiB - OTHER_BYTES) // MiB
        assert stamps(out)[0] >= when + 1.4e9, "the driver was asked again before the daemon answered"
    finally:
        daemon.stop()


def test_without_a_daemon_the_hook_still_waits_for_the_driver(hook_lib, tmp_path, procs):
    """on_daemon_loss=run and nobody listening: the allocation passes unasked, and the driver's
    out-of-memory is still tried again with a back-off until the other process frees."""
    shared = tmp_path / "device-memory"
    env = {"NVSHARE_SOCKET": str(tmp_path / "nobody.sock"), "NVSHARE_JOB_ID": "396", "SLURM_STEP_ID": "0",
           "NVSHARE_MANAGED_GPUS": SMALL_GPU, "CUDA_VISIBLE_DEVICES": SMALL_GPU,
           "NVSHARE_ON_DAEMON_LOSS": "run",
           "FAKE_CUDA_DEVICES": f"{SMALL_GPU}:{SMALL_GPU_MEMORY}", "FAKE_CUDA_SHARED_MEMORY": str(shared)}
    procs.append(start_other(shared, 1500))
    proc = start_nvtest(hook_lib, ["init", "ctx:0", f"alloc:{JOB_BYTES}"], env)
    procs.append(proc)
    out = finish(proc, timeout=30)
    assert f"alloc {JOB_BYTES} rc=0" in out, out + proc.stderr_text
    assert WAIT_LINE in proc.stderr_text and FOUND_LINE in proc.stderr_text, proc.stderr_text
