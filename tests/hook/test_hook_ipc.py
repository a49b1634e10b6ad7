"""CUDA IPC of swappable memory: cudaIpcGetMemHandle/cudaIpcOpenMemHandle between two processes of a
job, with swap on, as PyTorch's CUDA tensor sharing and vLLM's custom all-reduce use them.

The real driver refuses legacy IPC on virtual-memory allocations (seen on the H100), so the hook
exports the allocation's chunks as file descriptors and serves them to the importer over a unix
socket. The fake driver backs chunks with memfd, so an importer that maps the fds really shares the
exporter's bytes, and a chunk that swapped out and back would no longer be the one the importer maps.
"""
from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

import pytest

from conftest import become
from helpers_daemon import OTHER, as_uid, gpu_status
from helpers_hook import Job, finish, run_nvtest, start_nvtest

MiB = 1 << 20
SHARED = 64 * MiB        # the exported allocation: fixed on the GPU once exported
OTHER_BYTES = 400 * MiB  # the exporter's swappable rest: 464 MiB + the third job's 600 > 972 usable
RECORD = struct.Struct("<QIIQQQIIQQ")  # csrc/ipc.c's struct ipc_record
REQUEST = struct.Struct("<QQII")
REPLY = struct.Struct("<QiI")
INVALID_VALUE, INVALID_HANDLE = 1, 400


def wait_for_file(path: Path, proc, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"exporter ended early:\n{proc.communicate()}"
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)


def start_exporter(hook_lib, procs, job, handle: Path, size: int, hold: str,
                   before: tuple[str, ...] = ()):
    """An nvtest of `job` that exports `size` bytes through `handle`, keeps them for `hold` (its next
    action) and frees everything; returned once the handle is written."""
    exporter = start_nvtest(hook_lib, ["init", "ctx:0", *before, f"ipcput:{size}:{handle}", hold, "freeall"],
                            job.env)
    procs.append(exporter)
    wait_for_file(handle, exporter)
    return exporter


def ask_exporter(handle: bytes, token_xor: int = 0) -> tuple[bytes, int]:
    """The importer's request, made by hand: (the reply, how many fds came with it)."""
    magic, pid, export_id, token, *_ = RECORD.unpack(handle)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(5)
        sock.connect(f"\0nvshare-ipc-{pid}-{token:016x}")
        sock.send(REQUEST.pack(magic, token ^ token_xor, export_id, 0))
        data, fds, _, _ = socket.recv_fds(sock, 64, 16)
        if data:
            _, fds, _, _ = socket.recv_fds(sock, 64, 16)
        for fd in fds:
            os.close(fd)
        return data, len(fds)


def test_two_processes_share_swappable_memory_while_a_third_job_forces_swaps(hook_lib, small_gpu,
                                                                             tmp_path, procs):
    sched = small_gpu()
    trace = tmp_path / "trace"
    handle = tmp_path / "handle"
    job = Job(sched, 401, trace, gpu_index=[0], **sched.fake_env)
    other = Job(sched, 402, trace, gpu_index=[0], **sched.fake_env)
    exporter = start_exporter(hook_lib, procs, job, handle, SHARED, "ipcwait:b2:60000",
                              before=(f"alloc:{OTHER_BYTES}",))
    # The exported 64 MiB now count as fixed: they can no longer leave the GPU.
    deadline = time.monotonic() + 10
    while gpu_status(sched)["memory_fixed"] < SHARED:
        assert time.monotonic() < deadline, gpu_status(sched)
        time.sleep(0.05)
    third = start_nvtest(hook_lib, ["init", "ctx:0", "pattern:629145600:3:50000"], other.env)
    procs.append(third)
    # The third job makes the exporter give memory up: only its other allocation can go.
    deadline = time.monotonic() + 30
    while gpu_status(sched)["memory_swapped"] == 0:
        assert time.monotonic() < deadline, "the exporter never swapped"
        time.sleep(0.02)
    importer = start_nvtest(hook_lib, ["init", "ctx:0", f"ipcget:{handle}:{SHARED}", "ipcclose"], job.env)
    procs.append(importer)
    out_imp = finish(importer, timeout=120)
    out_third = finish(third, timeout=120)
    out_exp = finish(exporter, timeout=120)
    # The importer read the exporter's bytes and its writes reached the exporter, through swaps.
    assert "ipcget rc=0" in out_imp and "ipcget read ok" in out_imp, out_imp + importer.stderr_text
    assert "ipcclose rc=0" in out_imp, out_imp
    assert "ipcput rc=0" in out_exp and "ipcwait ok first_half=intact" in out_exp, \
        out_exp + exporter.stderr_text
    assert "pattern ok rounds=3" in out_third, out_third + third.stderr_text
    assert "swapped out" in exporter.stderr_text
    assert "exported" in exporter.stderr_text and "fixed on the GPU" in exporter.stderr_text


def exported_to_attack(hook_lib, small_gpu, tmp_path, procs, job_id: int, hold: str):
    """An exporter of 4 MiB for tests that act as another uid: (the exporter, its handle's bytes)."""
    if os.getuid() != 0:
        pytest.skip("acts as another uid: needs root")
    sched = small_gpu()
    handle = tmp_path / "handle"
    job = Job(sched, job_id, tmp_path / "trace", gpu_index=[0], **sched.fake_env)
    exporter = start_exporter(hook_lib, procs, job, handle, 4 * MiB, hold)
    return exporter, handle.read_bytes()


def refused(record: bytes) -> bool:
    """Asked as whoever runs this: no reply and no fd (or the connection dropped)."""
    try:
        data, n_fds = ask_exporter(record)
    except OSError:
        return True
    return not data and n_fds == 0


def test_another_uid_cannot_fetch_the_memory(hook_lib, small_gpu, tmp_path, procs):
    exporter, record = exported_to_attack(hook_lib, small_gpu, tmp_path, procs, 411, "sleep:3000")
    # The job's own user gets the chunk (the request is right) ...
    data, n_fds = ask_exporter(record)
    assert REPLY.unpack(data)[1] == 0 and n_fds == 1
    # A request without the token (someone who guessed the socket's name) is refused.
    data, n_fds = ask_exporter(record, token_xor=1)
    assert REPLY.unpack(data)[1] == INVALID_HANDLE and n_fds == 0
    # ... another uid with the very same handle gets nothing, not even a reply.
    assert as_uid(OTHER, lambda: 0 if refused(record) else 1) == 0
    out = finish(exporter)
    assert "ipcput rc=0" in out
    assert "refused a request from pid" in exporter.stderr_text and f"uid {OTHER}" in exporter.stderr_text


def test_forged_garbage_and_stale_handles_give_cuda_errors(hook_lib, small_gpu, tmp_path, procs):
    sched = small_gpu()
    handle = tmp_path / "handle"
    job = Job(sched, 421, tmp_path / "trace", gpu_index=[0], **sched.fake_env)
    exporter = start_exporter(hook_lib, procs, job, handle, 4 * MiB, "sleep:2000")
    garbage = tmp_path / "garbage"
    garbage.write_bytes(os.urandom(64))
    wrong_token = tmp_path / "wrong-token"
    fields = list(RECORD.unpack(handle.read_bytes()))
    fields[3] ^= 1  # the token: the check no longer matches either
    wrong_token.write_bytes(RECORD.pack(*fields))
    live = run_nvtest(hook_lib, ["init", "ctx:0", f"ipcraw:{handle}:5a", f"ipcraw:{garbage}:",
                                 f"ipcraw:{wrong_token}:"], job.env)
    assert live.returncode == 0 and live.stdout.rstrip().endswith("done"), live.stdout + live.stderr
    assert live.stdout.count(f"ipcraw rc={INVALID_VALUE}") == 3, live.stdout  # torn, driver's, forged
    finish(exporter)
    # The exporter is gone: its handle no longer opens, and nothing crashes.
    stale = run_nvtest(hook_lib, ["init", "ctx:0", f"ipcraw:{handle}:"], job.env)
    assert f"ipcraw rc={INVALID_HANDLE}" in stale.stdout and stale.stdout.rstrip().endswith("done"), \
        stale.stdout + stale.stderr


def serve_as_exporter(uid: int, record: bytes, batch: int, n_fds: int, tag: str, hold: float = 8.0):
    """Someone of `uid` listening under the socket name of a handle whose exporter is gone: it
    answers like an exporter (status 0), then sends one message that says `batch` fds and carries
    `n_fds` memfds named `tag`, filled with the exporter's byte (0xa1). Returns its pid once it
    listens; it serves one importer, then stays `hold` seconds so the importer's side can be looked at."""
    magic, pid, _, token, size, *_ = RECORD.unpack(record)
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.close(ready_r)
            become(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
                listener.bind(f"\0nvshare-ipc-{pid}-{token:016x}")
                listener.listen(4)
                listener.settimeout(20)
                os.write(ready_w, b"1")
                conn, _ = listener.accept()
                with conn:
                    conn.settimeout(5)
                    conn.recv(64)
                    fds = []
                    for _ in range(n_fds):
                        fd = os.memfd_create(tag)
                        os.write(fd, b"\xa1" * size)
                        fds.append(fd)
                    conn.send(REPLY.pack(magic, 0, 1))
                    socket.send_fds(conn, [struct.pack("<I", batch)], fds)
                    for fd in fds:
                        os.close(fd)
                    time.sleep(hold)
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1", "the stand-in exporter never listened"
    os.close(ready_r)
    return child


def open_fds_named(pid: int, tag: str) -> int:
    """How many of pid's open files are memfds named tag."""
    fd_dir = Path(f"/proc/{pid}/fd")
    count = 0
    for entry in fd_dir.iterdir():
        try:
            count += f"memfd:{tag}" in os.readlink(entry)
        except OSError:
            pass
    return count


def test_a_handle_opens_only_memory_of_the_jobs_own_user(hook_lib, small_gpu, tmp_path, procs):
    """Socket names are public (/proc/net/unix lists them with the token), and a name is free again
    once its exporter is gone: another user who binds it must not hand the job its own memory, which
    the job would then read and write as the exporter's."""
    if os.getuid() != 0:
        pytest.skip("acts as another uid: needs root")
    sched = small_gpu()
    handle = tmp_path / "handle"
    job = Job(sched, 431, tmp_path / "trace", gpu_index=[0], **sched.fake_env)
    exporter = start_exporter(hook_lib, procs, job, handle, 4 * MiB, "sleep:10")
    finish(exporter)
    impostor = serve_as_exporter(OTHER, handle.read_bytes(), batch=1, n_fds=1, tag="impostor", hold=0)
    try:
        importer = run_nvtest(hook_lib, ["init", "ctx:0", f"ipcget:{handle}:{4 * MiB}"], job.env)
    finally:
        os.waitpid(impostor, 0)
    assert f"ipcget rc={INVALID_HANDLE}" in importer.stdout, importer.stdout + importer.stderr
    assert "ipcget read" not in importer.stdout
    assert f"uid {OTHER}" in importer.stderr, importer.stderr


def test_an_exporter_that_sends_fewer_fds_than_it_says_leaves_none_open(hook_lib, small_gpu, tmp_path,
                                                                         procs):
    """An exporter that breaks off mid-way (or lies): the fds that did come are closed, not kept, so no
    GPU memory stays held by a failed open until the importer exits."""
    sched = small_gpu()
    handle = tmp_path / "handle"
    job = Job(sched, 441, tmp_path / "trace", gpu_index=[0], **sched.fake_env)
    exporter = start_exporter(hook_lib, procs, job, handle, 4 * MiB, "sleep:10")
    finish(exporter)
    # The record names one chunk; the message says 2 and carries 1.
    server = serve_as_exporter(os.getuid(), handle.read_bytes(), batch=2, n_fds=1, tag="half-sent")
    try:
        importer = start_nvtest(hook_lib, ["init", "ctx:0", f"ipcraw:{handle}:", "sleep:3000"], job.env)
        procs.append(importer)
        deadline = time.monotonic() + 20
        while True:
            line = importer.stdout.readline()
            assert line, f"importer ended early: {importer.communicate()}"
            if line.startswith("ipcraw rc="):
                break
            assert time.monotonic() < deadline
        assert line.strip() == f"ipcraw rc={INVALID_HANDLE}", line
        assert open_fds_named(importer.pid, "half-sent") == 0
        finish(importer)
    finally:
        os.kill(server, 9)
        os.waitpid(server, 0)


def test_another_users_connections_cannot_flood_the_jobs_log(hook_lib, small_gpu, tmp_path, procs):
    """The socket's name is public: every refused connection writing a line let another user fill the
    job's output file at will. The first refusal is logged; the rest are counted into a later line."""
    exporter, record = exported_to_attack(hook_lib, small_gpu, tmp_path, procs, 451, "sleep:2000")
    assert as_uid(OTHER, lambda: 0 if all(refused(record) for _ in range(200)) else 1) == 0
    # The job's own user still gets its memory at once.
    data, n_fds = ask_exporter(record)
    assert REPLY.unpack(data)[1] == 0 and n_fds == 1
    out = finish(exporter)
    assert "ipcput rc=0" in out
    lines = [line for line in exporter.stderr_text.splitlines() if "refused a request from pid" in line]
    assert 1 <= len(lines) <= 2, "\n".join(lines[:5])
    assert f"uid {OTHER}" in lines[0]


def test_a_driver_that_refuses_exportable_memory_keeps_swappable_allocations(hook_lib, small_gpu,
                                                                             tmp_path):
    """The GPU says it supports fd handles but cuMemCreate refuses them: the hook finds out once,
    makes its chunks without the handle type, and allocations stay swappable and usable; only CUDA
    IPC on them is lost, with a clean error and one line saying so."""
    sched = small_gpu()
    job = Job(sched, 431, tmp_path / "trace", gpu_index=[0], FAKE_CUDA_NO_FD_CREATE="1",
              **sched.fake_env)
    out = run_nvtest(hook_lib, ["init", "ctx:0", f"pattern:{8 * MiB}:2:1000", "copy",
                                f"ipcput:{MiB}:{tmp_path / 'handle'}"], env=job.env)
    assert "pattern ok rounds=2" in out.stdout and "copy ok" in out.stdout, out.stdout + out.stderr
    assert "ipcput rc=0" not in out.stdout and "ipcput rc=" in out.stdout, out.stdout
    assert "cannot be made exportable" in out.stderr, out.stderr
    assert "no virtual memory management" not in out.stderr
