"""Smaller things a first day met (issue 26): log lines that name Slurm's steps as Slurm does, a
client that exits while the daemon passes it a descriptor (the normal end, not a warning), and
nvshare-node-config naming a missing --config file rather than an NVML failure."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys

from nvshare_slurm import connection
from nvshare_slurm.policytypes import ClientInfo
from nvshare_slurm.proto import C


def test_log_labels_name_slurms_special_steps():
    assert ClientInfo(1, 12, 0xFFFFFFFB, 99).label() == "job 12 step batch pid 99"
    assert ClientInfo(1, 12, 0xFFFFFFFC, 99).label() == "job 12 step extern pid 99"
    assert ClientInfo(1, 12, 0xFFFFFFFA, 99).label() == "job 12 step interactive pid 99"
    assert ClientInfo(1, 12, 3, 99).label() == "job 12 step 3 pid 99"


class _Listener:
    def __init__(self):
        self.lines: list[tuple[int, str]] = []

    def throttle(self, key, level, message):
        self.lines.append((level, message))


class _Transport:
    def get_write_buffer_size(self) -> int:
        return 0


def test_a_descriptor_for_a_client_that_exited_is_not_a_warning():
    listener = _Listener()
    conn = connection.Connection(listener, pid=1, uid=1000, gid=1000)
    ours, theirs = socket.socketpair()
    theirs.close()                       # the client process exited
    conn.transport, conn.sock = _Transport(), ours
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        assert conn.send_with_fd(C.NVSHARE_MSG_BURST_PAGE, {}, fd) is False
    finally:
        os.close(fd)
        ours.close()
    [(level, message)] = listener.lines
    assert "cannot pass a file descriptor" in message
    assert level == logging.DEBUG


def test_node_config_names_a_missing_config_file(tmp_path):
    """Already so since commit 111130b; kept here as the issue's reproduction."""
    missing = tmp_path / "nonexistent.yaml"
    run = subprocess.run([sys.executable, "-m", "nvshare_slurm.nodeconfig", "--config", str(missing)],
                         capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if not k.startswith("NVSHARE_")})
    assert run.returncode != 0
    assert str(missing) in run.stderr and "no such config file" in run.stderr
    assert "NVML" not in run.stderr and "Traceback" not in run.stderr

