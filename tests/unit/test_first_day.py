"""Smaller things a first day met (issue 26): log lines that name Slurm's steps as Slurm does, a
client that exits while the daemon passes it a descriptor (the normal end, not a warning), and
nvshare-node-config naming a missing --config file rather than an NVML failure."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys

from nvshare_slurm.policy.policytypes import ClientInfo
from nvshare_slurm.scheduler import connection
from nvshare_slurm.wire.proto import C


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



# --- `--gres=nvshare:2` on typed GRES: two distinct GPUs, as the user guide promises -------------

def test_untyped_request_on_typed_gres_gets_distinct_gpus(tmp_path, fake_slurm, scheduler_factory,
                                                           capsys):
    from helpers_slurm import slurm_env
    from nvshare_slurm import prolog
    sched = scheduler_factory()
    fake_slurm("typed_untyped_request.txt")           # Slurm packed nvshare:gpu0(CNT:2)
    env = slurm_env(tmp_path, fake_slurm.bindir, 4, socket_path=sched.socket,
                    SLURMD_NODENAME="n2")
    assert prolog.run(env, wait_sec=2.0) == 0
    job = sched.client().status(C.NVSHARE_STATUS_JOB, 4)["jobs"][0]
    assert job["gpu_index"] == [0, 1]
    assert "untyped request, Slurm counted them on GPU(s) [0]" in capsys.readouterr().err


def test_typed_request_keeps_slurms_gpu(tmp_path, fake_slurm, scheduler_factory):
    from helpers_slurm import slurm_env
    from nvshare_slurm import prolog
    sched = scheduler_factory()
    fake_slurm("typed_gpu1_2.txt")                    # --gres=nvshare:gpu1:2
    env = slurm_env(tmp_path, fake_slurm.bindir, 3, socket_path=sched.socket,
                    SLURMD_NODENAME="n2")
    assert prolog.run(env, wait_sec=2.0) == 0
    assert sched.client().status(C.NVSHARE_STATUS_JOB, 3)["jobs"][0]["gpu_index"] == [1]


def test_asked_untyped():
    from nvshare_slurm.prolog import asked_untyped
    assert asked_untyped("gres:nvshare:2") and asked_untyped("gres/nvshare:2,,")
    assert asked_untyped("gres/nvshare") and asked_untyped("gres/gpu:1,gres/nvshare:3")
    assert not asked_untyped("gres:nvshare:gpu1:2") and not asked_untyped("gres/nvshare:gpu0:1")
    assert not asked_untyped("") and not asked_untyped("gres/nvsharex:2")


# --- usage_admin_comment without accounting storage: the daemon says why, at start --------------

def _fake_scontrol(tmp_path, storage: str):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "scontrol"
    script.write_text(f"#!/bin/sh\n[ \"$1 $2\" = 'show config' ] || exit 1\n"
                      f"echo 'AccountingStorageHost   = (null)'\n"
                      f"echo 'AccountingStorageType   = {storage}'\n")
    script.chmod(0o755)
    return str(bindir)


def test_admin_comment_without_slurmdbd_is_logged_at_start(tmp_path, scheduler_factory):
    from helpers_daemon import wait_for_log
    sched = scheduler_factory(usage_admin_comment=True,
                              slurm_bin_dir=_fake_scontrol(tmp_path, "accounting_storage/none"))
    wait_for_log(sched, "usage_admin_comment: true, but Slurm keeps no accounting "
                        "(AccountingStorageType=accounting_storage/none)")


def test_admin_comment_with_slurmdbd_is_quiet(tmp_path):
    from nvshare_slurm.base import config
    from nvshare_slurm.scheduler import sitecheck
    cfg = config.Config(usage_admin_comment=True,
                        slurm_bin_dir=_fake_scontrol(tmp_path, "accounting_storage/slurmdbd"))
    assert sitecheck.admin_comment_problem(cfg) == ""
    assert sitecheck.admin_comment_problem(config.Config(slurm_bin_dir=cfg.slurm_bin_dir)) == ""
