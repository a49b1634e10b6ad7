"""The hook's side of the protocol in Python, for tests and the bench.

As a program (one real client process, like one CUDA process under libnvshare.so):

    python tests/lockclient.py --socket S --job 12 [--step 0] [--mem-limit BYTES]
                               [--on-contended release|ignore] [--on-drop release|ignore]
                               [--reconnect] [--swap]

reads commands on stdin, one a line:
    request UUID [BUSY_SEC]   ask for the lock; once granted it is "busy" BUSY_SEC (default 0)
    release UUID [no_room]    give the lock back (LOCK_RELEASED, flags IDLE, or NO_ROOM)
    mem UUID ALLOC FIXED SWAPPED REQUEST [FLAGS]
                              MEM_UPDATE (seq counts up from 1); also what --swap moves
    stuck UUID MS             DRAIN_STUCK: asked to release, its work there has not finished
                              after MS milliseconds (use with --on-drop ignore)
    demand UUID BUSY_PPM BURST_US GAP_US
                              DEMAND: what the process asks of the GPU lately
    quit
and prints one JSON line per event: registered, grant, contended, drop, released, mem_reply,
prepare_swap_out, swapped_in, reply, closed, reconnected. "t" is CLOCK_MONOTONIC, comparable
between processes.

--swap moves memory like libnvshare.so (docs/protocol.md "Swap"), with the numbers of the last
`mem` command: DROP_LOCK `bytes` and PREPARE_SWAP_OUT `bytes` move swappable memory to "host"
(MEM_UPDATE first, then for a drop LOCK_RELEASED DROPPED|SWAPPED); a grant brings all swapped
memory back (MEM_UPDATE).

As a module: ClientProc starts that program and lets a test wait for its events.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C


def register_frame(job_id: int, step_id: int, pid: int, mem_limit: int = 0) -> bytes:
    return proto.encode(C.NVSHARE_MSG_CLIENT_REGISTER, {"job_id": job_id, "step_id": step_id,
                                                         "pid": pid, "mem_limit": mem_limit})


def gpu_frame(msg_type: int, uuid: str, flags: int = 0, moved: int = 0) -> bytes:
    return proto.encode(msg_type, {"gpu_uuid": uuid, "flags": flags, "bytes": moved})


def mem_frame(uuid: str, allocated: int, fixed: int, swapped: int, request: int,
              flags: int = 0, seq: int = 0) -> bytes:
    return proto.encode(C.NVSHARE_MSG_MEM_UPDATE, {"gpu_uuid": uuid, "allocated": allocated,
                                                    "fixed": fixed, "swapped": swapped,
                                                    "request": request, "flags": flags}, seq)


def connect_and_register(path: str, job_id: int, step_id: int = 0, mem_limit: int = 0,
                         timeout: float = 10.0) -> tuple[socket.socket, Any]:
    """A registered client socket and the CLIENT_REGISTER_REPLY body."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    sock.sendall(register_frame(job_id, step_id, os.getpid(), mem_limit))
    reply = proto.recv_frame(sock)
    return sock, reply.body()


class _Hook:
    """The program: a registered connection that behaves like libnvshare.so."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.held: dict[str, float] = {}       # uuid -> busy until (monotonic)
        self.wanted: dict[str, float] = {}     # uuid -> busy seconds of a pending request
        self.contended: set[str] = set()
        self.memory: dict[str, list[int]] = {}  # uuid -> [allocated, fixed, swapped] (--swap)
        self.seq = 0

    def emit(self, event: str, **fields: Any) -> None:
        fields.update(event=event, t=time.monotonic())
        with self.lock:
            sys.stdout.write(json.dumps(fields) + "\n")
            sys.stdout.flush()

    def send(self, data: bytes) -> None:
        sock = self.sock
        if sock is not None:
            try:
                sock.sendall(data)
            except OSError:
                pass

    def register(self) -> bool:
        try:
            self.sock, body = connect_and_register(self.args.socket, self.args.job,
                                                   self.args.step, self.args.mem_limit)
        except (OSError, ConnectionError) as exc:
            self.emit("register_failed", error=str(exc))
            return False
        self.sock.settimeout(None)
        self.emit("registered", status=int(body.status), client_id=int(body.client_id),
                  message=proto.text(body.message))
        return body.status == C.NVSHARE_OK

    def release(self, uuid: str, flags: int, moved: int = 0) -> None:
        with self.state_lock:
            if self.held.pop(uuid, None) is None:
                return
        self.contended.discard(uuid)
        self.send(gpu_frame(C.NVSHARE_MSG_LOCK_RELEASED, uuid, flags, moved))
        self.emit("released", gpu=uuid, flags=flags, bytes=moved)

    def swap_out(self, uuid: str, wanted: int) -> int:
        """Move up to `wanted` swappable bytes to "host memory" and report it; bytes moved."""
        mem = self.memory.setdefault(uuid, [0, 0, 0])
        moved = min(wanted, mem[0] - mem[1])
        mem[0] -= moved
        mem[2] += moved
        self.send(mem_frame(uuid, *mem, 0))
        return moved

    def swap_in(self, uuid: str) -> None:
        mem = self.memory.get(uuid)
        if mem and mem[2]:
            back, mem[0], mem[2] = mem[2], mem[0] + mem[2], 0
            self.send(mem_frame(uuid, *mem, 0))
            self.emit("swapped_in", gpu=uuid, bytes=back)

    def release_when_idle(self, uuid: str) -> None:
        delay = self.held.get(uuid, 0) - time.monotonic()
        if delay > 0:
            threading.Timer(delay, self._idle_release, (uuid,)).start()
        else:
            self.release(uuid, C.NVSHARE_RELEASE_IDLE)

    def _idle_release(self, uuid: str) -> None:
        if uuid in self.contended:
            self.release(uuid, C.NVSHARE_RELEASE_IDLE)

    def on_frame(self, frame: proto.Frame) -> None:
        body = frame.body()
        if frame.type in (C.NVSHARE_MSG_LOCK_GRANT, C.NVSHARE_MSG_LOCK_CONTENDED,
                          C.NVSHARE_MSG_DROP_LOCK, C.NVSHARE_MSG_PREPARE_SWAP_OUT):
            uuid = proto.text(body.gpu_uuid)
        if frame.type == C.NVSHARE_MSG_LOCK_GRANT:
            busy = self.wanted.pop(uuid, 0.0)
            self.held[uuid] = time.monotonic() + busy
            if self.args.swap:
                self.swap_in(uuid)
            self.emit("grant", gpu=uuid, flags=int(body.flags), switch_ms=int(body.switch_ms))
        elif frame.type == C.NVSHARE_MSG_LOCK_CONTENDED:
            self.emit("contended", gpu=uuid)
            if self.args.on_contended == "release" and uuid in self.held:
                self.contended.add(uuid)
                self.release_when_idle(uuid)
        elif frame.type == C.NVSHARE_MSG_DROP_LOCK:
            # Released before the event is told: a test that reacts to "drop" with a new request
            # must not overtake LOCK_RELEASED, as the hook never does.
            if self.args.on_drop == "release":
                moved = self.swap_out(uuid, int(body.bytes)) \
                    if self.args.swap and body.bytes else 0
                flags = C.NVSHARE_RELEASE_DROPPED | (C.NVSHARE_RELEASE_SWAPPED if moved else 0)
                self.release(uuid, flags, moved)
            self.emit("drop", gpu=uuid, reason=int(body.switch_ms), bytes=int(body.bytes))
        elif frame.type == C.NVSHARE_MSG_PREPARE_SWAP_OUT:
            self.emit("prepare_swap_out", gpu=uuid, bytes=int(body.bytes))
            if self.args.swap and uuid not in self.held:
                self.swap_out(uuid, int(body.bytes))
        elif frame.type == C.NVSHARE_MSG_MEM_REPLY:
            self.emit("mem_reply", gpu=proto.text(body.gpu_uuid), status=int(body.status),
                      flags=int(body.flags), available=int(body.available),
                      total=int(body.total), seq=frame.seq)
        elif frame.type == C.NVSHARE_MSG_REPLY:
            self.emit("reply", status=int(body.status), message=proto.text(body.message))
        else:
            self.emit("other", type=frame.name)

    def read_loop(self) -> None:
        while True:
            try:
                frame = proto.recv_frame(self.sock)
            except (OSError, ConnectionError, proto.ProtocolError) as exc:
                self.emit("closed", error=str(exc))
                if not self.args.reconnect or not self._reconnect():
                    os._exit(0)
                continue
            self.on_frame(frame)

    def _reconnect(self) -> bool:
        wanted = {**{u: 0.0 for u in self.held}, **self.wanted}
        self.held.clear()
        self.contended.clear()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.05)
            try:
                self.sock, body = connect_and_register(self.args.socket, self.args.job,
                                                       self.args.step, self.args.mem_limit)
            except (OSError, ConnectionError):
                continue
            self.sock.settimeout(None)
            self.emit("reconnected", status=int(body.status))
            if body.status != C.NVSHARE_OK:
                return False
            for uuid, busy in wanted.items():
                self.wanted[uuid] = busy
                self.send(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, uuid))
            return True
        return False

    def command(self, line: str) -> bool:
        words = line.split()
        if not words:
            return True
        if words[0] == "quit":
            return False
        if words[0] == "request":
            self.wanted[words[1]] = float(words[2]) if len(words) > 2 else 0.0
            self.send(gpu_frame(C.NVSHARE_MSG_LOCK_REQUEST, words[1]))
        elif words[0] == "release":
            no_room = len(words) > 2 and words[2] == "no_room"
            self.release(words[1], C.NVSHARE_RELEASE_NO_ROOM if no_room
                         else C.NVSHARE_RELEASE_IDLE)
        elif words[0] == "stuck":
            self.send(gpu_frame(C.NVSHARE_MSG_DRAIN_STUCK, words[1], 0, int(words[2])))
        elif words[0] == "mem":
            allocated, fixed, swapped, request = (int(w) for w in words[2:6])
            flags = int(words[6]) if len(words) > 6 else 0
            self.memory[words[1]] = [allocated, fixed, swapped]
            self.seq += 1
            self.send(mem_frame(words[1], allocated, fixed, swapped, request, flags, self.seq))
        elif words[0] == "demand":
            busy_ppm, burst_us, gap_us = (int(w) for w in words[2:5])
            spread = words[5] if len(words) > 5 else "0"     # "unknown": NVSHARE_SPREAD_UNKNOWN
            self.send(proto.encode(C.NVSHARE_MSG_DEMAND, {
                "gpu_uuid": words[1], "busy_ppm": busy_ppm, "burst_us": burst_us, "gap_us": gap_us,
                "gap_spread_ppm": C.NVSHARE_SPREAD_UNKNOWN if spread == "unknown" else int(spread)}))
        else:
            self.emit("error", error=f"unknown command {line.strip()!r}")
        return True


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--job", type=int, required=True)
    parser.add_argument("--step", type=int, default=0)
    parser.add_argument("--mem-limit", type=int, default=0)
    parser.add_argument("--on-contended", choices=("release", "ignore"), default="ignore")
    parser.add_argument("--on-drop", choices=("release", "ignore"), default="release")
    parser.add_argument("--reconnect", action="store_true")
    parser.add_argument("--swap", action="store_true", help="move memory as the hook does")
    args = parser.parse_args(argv)
    hook = _Hook(args)
    if not hook.register():
        return 1
    threading.Thread(target=hook.read_loop, daemon=True).start()
    for line in sys.stdin:
        if not hook.command(line):
            break
    return 0


class ClientProc:
    """One lockclient program run as a real process; the test reads its events."""

    def __init__(self, socket_path: str, job_id: int, step_id: int = 0, *options: str,
                 register: bool = True, wrap: tuple[str, ...] = ()):
        """wrap: a command that runs the program as its own child (fake_slurmstepd.py): then the
        program's pid is not self.pid."""
        self.proc = subprocess.Popen(
            [*wrap, sys.executable, os.path.abspath(__file__), "--socket", socket_path, "--job",
             str(job_id), "--step", str(step_id), *options],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.events: list[dict[str, Any]] = []
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        if register:
            reg = self.expect("registered")
            if reg["status"] != C.NVSHARE_OK:
                raise AssertionError(f"client of job {job_id} not registered: {reg}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(json.loads(line))
        self._queue.put(None)

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def expect(self, event: str, timeout: float = 5.0, **match: Any) -> dict[str, Any]:
        """The next unread event of that kind (and fields); AssertionError after timeout."""
        deadline = time.monotonic() + timeout
        while True:
            for item in self.events:
                if not item.get("_seen") and item["event"] == event and \
                        all(item.get(k) == v for k, v in match.items()):
                    item["_seen"] = True
                    return item
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"pid {self.pid}: no {event} {match} within {timeout}s; "
                                     f"events: {self.events}")
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if item is not None:
                self.events.append(item)

    def absent(self, event: str, within: float, **match: Any) -> None:
        """Assert that no such event arrives within `within` seconds."""
        try:
            got = self.expect(event, within, **match)
        except AssertionError:
            return
        raise AssertionError(f"pid {self.pid}: unexpected {event}: {got}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(run())
