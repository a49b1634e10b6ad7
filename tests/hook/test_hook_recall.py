"""DROP_LOCK(RECALL) against DROP_LOCK(TIMESLICE) in the hook (docs/protocol.md, lock protocol 4).

A turn that ran out while others waited tells the hook its pauses were too short to hand the GPU
over early: TIMESLICE halves its idle threshold. A RECALL ends a lent turn because its lender asks
again (docs/design-scheduler.md "Turns given back idle"), whatever the borrower did: its threshold
stays. A scripted daemon grants each request and drops it 50 ms later, with the reasons in turn.
"""
from __future__ import annotations

import re
import socket
import threading
from pathlib import Path

from helpers_hook import GPU0, finish, start_nvtest
from helpers_scripted import ScriptedDaemon
from nvshare_slurm import proto
from nvshare_slurm.proto import C

IDLE_US = 8000


class DroppingDaemon(ScriptedDaemon):
    def __init__(self, path: Path, reasons: list[int]):
        self.reasons = list(reasons)
        super().__init__(path)

    def serve(self, conn: socket.socket, number: int) -> None:
        try:
            while True:
                frame = proto.recv_frame(conn)
                if frame.type == C.NVSHARE_MSG_CLIENT_REGISTER:
                    conn.sendall(proto.encode(C.NVSHARE_MSG_CLIENT_REGISTER_REPLY,
                                              {"status": 0, "client_id": 1, "idle_release_us": IDLE_US},
                                              frame.seq))
                elif frame.type == C.NVSHARE_MSG_HEARTBEAT:
                    conn.sendall(proto.encode(C.NVSHARE_MSG_HEARTBEAT,
                                              {"timestamp_ns": frame.body().timestamp_ns}, frame.seq))
                elif frame.type == C.NVSHARE_MSG_LOCK_REQUEST and self.reasons:
                    uuid = proto.text(frame.body().gpu_uuid)
                    conn.sendall(proto.encode(C.NVSHARE_MSG_LOCK_GRANT, {"gpu_uuid": uuid}))
                    drop = proto.encode(C.NVSHARE_MSG_DROP_LOCK,
                                        {"gpu_uuid": uuid, "switch_ms": self.reasons.pop(0)})
                    threading.Timer(0.05, conn.sendall, (drop,)).start()
                elif frame.type == C.NVSHARE_MSG_LOCK_REQUEST:
                    conn.sendall(proto.encode(C.NVSHARE_MSG_LOCK_GRANT,
                                              {"gpu_uuid": proto.text(frame.body().gpu_uuid)}))
        except (OSError, ConnectionError, proto.ProtocolError):
            pass


def test_a_recall_keeps_the_idle_threshold_that_a_time_slice_halves(hook_lib, tmp_path, procs):
    reasons = [C.NVSHARE_DROP_RECALL, C.NVSHARE_DROP_TIMESLICE, C.NVSHARE_DROP_RECALL,
               C.NVSHARE_DROP_TIMESLICE]
    daemon = DroppingDaemon(tmp_path / "d.sock", reasons)
    env = {"NVSHARE_SOCKET": str(tmp_path / "d.sock"), "NVSHARE_JOB_ID": "281", "SLURM_STEP_ID": "0",
           "NVSHARE_MANAGED_GPUS": GPU0, "CUDA_VISIBLE_DEVICES": GPU0, "NVSHARE_LOG_LEVEL": "debug"}
    steps = ["init", "ctx:0"] + ["launch:100000", "sync", "sleep:150"] * len(reasons)
    proc = start_nvtest(hook_lib, steps, env)
    procs.append(proc)
    try:
        finish(proc, timeout=30)
    finally:
        daemon.stop()
    thresholds = [float(t) for t in re.findall(r"lock released \(dropped, held [\d.]+ ms, idle threshold "
                                               r"([\d.]+) ms", proc.stderr_text)]
    first = thresholds[0] if thresholds else 0.0
    assert first > 0 and thresholds == [first, first / 2, first / 2, first / 4], proc.stderr_text
