"""nvshare-status against a real nvshare-scheduler: what it shows, what it changes, how it fails."""
from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from nvshare_slurm import status
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.client import Client
from nvshare_slurm.wire.proto import C

GPU0 = "GPU-fa4e0000-0000-0000-0000-000000000000"
GPU1 = "GPU-fa4e0000-0000-0000-0000-000000000001"
DOWN_HINT = "(is the nvshare-scheduler service running?)"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No NVSHARE_* from the caller's shell; a config path that does not exist (= defaults)."""
    for name in list(os.environ):
        if name.startswith("NVSHARE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NVSHARE_CONFIG", str(tmp_path / "absent.yaml"))


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = status.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def records(text: str) -> list[str]:
    return [r for r in text.split("\n\n") if r.strip()]


def field(record: str, key: str) -> str:
    """The value of Key= in a record (values of the fields used here hold no spaces)."""
    for word in record.split():
        if word.startswith(key + "="):
            return word[len(key) + 1:]
    raise KeyError(f"{key} not in {record!r}")


# --- without a daemon ---------------------------------------------------------------------------

def test_daemon_down_is_one_line_exit_1(tmp_path):
    missing = tmp_path / "scheduler.sock"
    code, out, err = cli("--socket", str(missing))
    assert code == 1 and out == ""
    assert err == (f"nvshare-status: cannot reach nvshare-scheduler at {missing}: "
                   f"No such file or directory {DOWN_HINT}\n")


def test_daemon_down_uses_the_configured_socket(tmp_path, monkeypatch):
    cfg = tmp_path / "nvshare.yaml"
    cfg.write_text(f"socket: {tmp_path}/configured.sock\n")
    monkeypatch.setenv("NVSHARE_CONFIG", str(cfg))
    code, _, err = cli("show", "jobs")
    assert code == 1 and f"at {tmp_path}/configured.sock: No such file" in err


def test_socket_nobody_listens_on_as_a_process(tmp_path):
    # A stale socket file from a dead daemon: connection refused, one line, no traceback.
    path = tmp_path / "stale.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()
    proc = subprocess.run([sys.executable, "-m", "nvshare_slurm.status", "--socket", str(path)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"nvshare-status: cannot reach nvshare-scheduler at {path}: "
                                  "Connection refused")


def test_broken_config_is_one_line_exit_1(tmp_path, monkeypatch):
    cfg = tmp_path / "nvshare.yaml"
    cfg.write_text("scheduling_mode: auto\nsockett: /run/x.sock\n")
    monkeypatch.setenv("NVSHARE_CONFIG", str(cfg))
    code, out, err = cli("show", "gpus")
    assert (code, out) == (1, "")
    assert err == f"nvshare-status: {cfg}: unknown key 'sockett'\n"


@pytest.mark.parametrize("argv", [
    ["show", "nodes"], ["show", "job", "abc"], ["show", "job", "0"], ["show", "job", "-5"],
    ["show", "config", "x"], ["show", "gpu", "0", "extra"], ["--bogus"], ["update"],
    ["update", "gpu=0"], ["update", "mode=serial"], ["update", "gpu=0", "mode=fast"],
    ["update", "gpu=0", "switch_time=-1"], ["update", "gpu=0", "switch_time=nan"],
    ["update", "gpu=0", "memory_reserve_percent=95"], ["update", "gpu=0", "max_runtime_sec=1h"],
    ["update", "gpu=0", "colour=red"], ["update", "gpu=0", "mode"],
    ["update", "gpu=0", "mode=serial", "mode=auto"], ["update", "gpu=" + "x" * 64, "mode=auto"],
    ["update", "gpu=0\x1b[2J", "mode=auto"],
])
def test_bad_arguments_exit_2_before_connecting(argv, tmp_path, capsys):
    code = status.main(["--socket", str(tmp_path / "none.sock")] + argv)
    err = capsys.readouterr().err
    assert code == 2
    assert "usage: nvshare-status" in err
    assert "cannot reach" not in err  # refused before any connection
    assert "\x1b" not in err


def test_version_and_help(capsys):
    assert status.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "nvshare-status 0.1.0"
    assert status.main(["update", "--help"]) == 0
    assert "mode=auto|concurrent|serial" in capsys.readouterr().out


def test_update_words_become_admin_update_fields():
    gpu, fields = status.parse_update(["GPU=All", "mode=Concurrent", "switch_time=2.5",
                                       "max_runtime_sec=60", "memory_reserve_percent=0"])
    assert gpu == "all"
    assert fields == {"mode": C.NVSHARE_MODE_CONCURRENT, "switch_mode": C.NVSHARE_SWITCH_FIXED,
                      "switch_time_ms": 2500, "max_runtime_sec": 60, "memory_reserve_percent": 0}
    assert status.parse_update(["gpu=1", "switch_time=auto"]) == (
        "1", {"switch_mode": C.NVSHARE_SWITCH_AUTO})


def serve_once(path: str, reply: bytes) -> threading.Thread:
    """A socket that answers one request with `reply` (a daemon speaking a broken protocol)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def run():
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(reply)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("reply,reason", [
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "bad magic"),
    (proto.encode(C.NVSHARE_MSG_STATUS_REPLY, {"json_length": 5}, tail=b"{nope"), "Expecting"),
])
def test_bad_reply_is_one_line(tmp_path, reply, reason):
    path = str(tmp_path / "odd.sock")
    thread = serve_once(path, reply)
    code, out, err = cli("--socket", path, "show", "gpus")
    thread.join(5)
    assert (code, out) == (1, "")
    assert err.startswith("nvshare-status: bad reply from nvshare-scheduler: ") and reason in err
    assert err.count("\n") == 1


# --- against the real daemon --------------------------------------------------------------------

@pytest.fixture
def daemon(scheduler_factory):
    return scheduler_factory()


def test_show_gpus_is_the_default(daemon):
    code, out, err = cli("--socket", daemon.socket)
    assert (code, err) == (0, "")
    gpus = records(out)
    assert [field(g, "Index") for g in gpus] == ["0", "1"]
    assert [field(g, "UUID") for g in gpus] == [GPU0, GPU1]
    assert all(field(g, "Mode") == "auto" and field(g, "MemoryTotal") == "16.0G" for g in gpus)
    assert all(field(g, "Holders") == "(null)" and field(g, "Jobs") == "(null)" for g in gpus)
    assert cli("--socket", daemon.socket, "show", "gpus")[1] == out


def test_socket_comes_from_the_config(daemon, monkeypatch):
    monkeypatch.setenv("NVSHARE_CONFIG", str(daemon.config_path))
    code, out, _ = cli("show", "config", "-o")
    assert code == 0
    assert f"socket={daemon.socket} " in out and out.count("\n") == 1


def test_registered_job_is_shown(daemon):
    name = "train\n\x1b[31mred"
    placed = Client(daemon.socket).register_job(4242, uid=1000, gid=1000, slots=2, name=name,
                                                user="alice")
    assert placed["gpu_index"] == [0, 1]
    code, out, _ = cli("--socket", daemon.socket, "show", "jobs")
    assert code == 0
    [job] = records(out)
    assert job.startswith("JobId=4242 JobName=train\\n\\x1b[31mred User=alice(1000) ")
    assert field(job, "GPUIndex") == "0,1" and field(job, "Slots") == "2"
    assert "\x1b" not in out

    code, one, _ = cli("--socket", daemon.socket, "show", "job", "4242", "-o")
    assert code == 0 and one.count("\n") == 1 and one.startswith("JobId=4242 ")

    gpus = records(cli("--socket", daemon.socket, "show", "gpus")[1])
    assert [field(g, "Jobs") for g in gpus] == ["4242", "4242"]


def test_unknown_job_is_one_line_exit_1(daemon):
    code, out, err = cli("--socket", daemon.socket, "show", "job", "999")
    assert (code, out) == (1, "")
    assert err == "nvshare-status: job 999 is not registered with nvshare-scheduler on this node\n"


def test_show_one_gpu_by_index_or_uuid(daemon):
    by_index = cli("--socket", daemon.socket, "show", "gpu", "1")
    by_uuid = cli("--socket", daemon.socket, "show", "gpu", GPU1.lower())
    assert by_index[0] == by_uuid[0] == 0
    assert [field(r, "UUID") for r in records(by_index[1])] == [GPU1]
    assert [field(r, "UUID") for r in records(by_uuid[1])] == [GPU1]
    code, out, err = cli("--socket", daemon.socket, "show", "gpu", "7")
    assert (code, out) == (1, "")
    assert err == "nvshare-status: no GPU '7' managed by nvshare-scheduler on this node\n"


def test_json_round_trip(daemon):
    Client(daemon.socket).register_job(51, uid=1000, gid=1000, slots=1, name="j\u00e9\x07",
                                       user="bob")
    code, out, _ = cli("--socket", daemon.socket, "--json", "show", "jobs")
    assert code == 0
    shown = json.loads(out)
    direct = Client(daemon.socket).status(C.NVSHARE_STATUS_JOBS)
    shown.pop("time"), direct.pop("time")
    assert shown == direct
    assert shown["jobs"][0]["name"] == "j\u00e9\x07"  # exact in JSON, escaped on the terminal
    assert out.isascii() and "\x07" not in out
    # Options after the subcommand work too.
    code, out, _ = cli("--socket", daemon.socket, "show", "gpus", "--json")
    assert [g["memory_total"] for g in json.loads(out)["gpus"]] == [16 << 30, 16 << 30]


def test_update_changes_what_show_gpus_prints(daemon):
    code, out, err = cli("--socket", daemon.socket, "update", "gpu=0", "mode=serial",
                         "switch_time=7")
    assert (code, err) == (0, "")
    gpu0, gpu1 = records(cli("--socket", daemon.socket, "show", "gpus")[1])
    assert (field(gpu0, "Mode"), field(gpu0, "SwitchTime")) == ("serial", "7.0s")
    assert (field(gpu1, "Mode"), field(gpu1, "SwitchTime")) == ("auto", "auto")

    assert cli("--socket", daemon.socket, "update", "gpu=all", "max_runtime_sec=60",
               "memory_reserve_percent=10")[0] == 0
    gpus = records(cli("--socket", daemon.socket, "show", "gpus")[1])
    assert [field(g, "MaxRuntime") for g in gpus] == ["00:01:00", "00:01:00"]
    assert [field(g, "MemoryReservePercent") for g in gpus] == ["10", "10"]
    assert field(gpus[0], "Mode") == "serial"  # untouched by the second update


def test_update_of_an_unknown_gpu_is_refused(daemon):
    code, out, err = cli("--socket", daemon.socket, "update", "gpu=9", "mode=serial")
    assert (code, out) == (1, "")
    assert err.startswith("nvshare-status: update refused: ") and "9" in err
    assert err.count("\n") == 1


def as_nobody(*argv: str) -> tuple[int, str, str]:
    """nvshare-status run in a forked child with uid/gid 65534 (nothing from /root is needed:
    every module is already imported in this process)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            rc, out, err = cli(*argv)
            os.write(write_end, json.dumps([rc, out, err]).encode())
            code = 0
        except BaseException:  # noqa: BLE001 - the parent sees the exit status
            pass
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0, "child failed before reporting"
    rc, out, err = json.loads(data)
    return rc, out, err


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to uid 65534")
def test_update_by_an_unprivileged_user_is_refused(daemon):
    rc, out, err = as_nobody("--socket", daemon.socket, "update", "gpu=0", "mode=serial")
    assert (rc, out) == (1, "")
    assert err.startswith("nvshare-status: update refused: ") and err.count("\n") == 1
    assert "SlurmUser" in err  # the daemon's own message
    # Nothing changed, and the same user may still look.
    rc, out, _ = as_nobody("--socket", daemon.socket, "show", "gpus")
    assert rc == 0
    assert [field(g, "Mode") for g in records(out)] == ["auto", "auto"]


@pytest.fixture
def world_readable_tmp():
    path = Path(tempfile.mkdtemp(prefix="nvs-st-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to uid 65534")
def test_unreadable_config_as_a_user_is_one_line(world_readable_tmp, monkeypatch):
    cfg = world_readable_tmp / "nvshare.yaml"
    cfg.write_text("socket: /run/x.sock\n")
    cfg.chmod(0o600)
    monkeypatch.setenv("NVSHARE_CONFIG", str(cfg))
    rc, out, err = as_nobody("show", "gpus")
    assert (rc, out) == (1, "")
    assert err.startswith(f"nvshare-status: {cfg}: cannot be read") and err.count("\n") == 1


class FakeHook:
    """A client connection as libnvshare.so makes it: CLIENT_REGISTER, then lock traffic."""

    def __init__(self, path: str, job_id: int, step_id: int):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.sock.sendall(proto.encode(C.NVSHARE_MSG_CLIENT_REGISTER,
                                       {"job_id": job_id, "step_id": step_id, "pid": os.getpid()}))
        assert self.expect(C.NVSHARE_MSG_CLIENT_REGISTER_REPLY).status == C.NVSHARE_OK

    def expect(self, msg_type: int):
        frame = proto.recv_frame(self.sock)
        assert frame.name == proto.MSG_NAME[msg_type]
        return frame.body()

    def request_lock(self, uuid: str) -> None:
        self.sock.sendall(proto.encode(C.NVSHARE_MSG_LOCK_REQUEST, {"gpu_uuid": uuid}))

    def close(self) -> None:
        self.sock.close()


def test_holder_and_waiting_queue_are_shown(daemon):
    Client(daemon.socket).register_job(700, uid=0, gid=0, slots=1, name="queue", user="root")
    assert cli("--socket", daemon.socket, "update", "gpu=0", "mode=concurrent")[0] == 0
    holder = FakeHook(daemon.socket, 700, 0)
    waiter = FakeHook(daemon.socket, 700, C.NVSHARE_STEP_BATCH)
    try:
        holder.request_lock(GPU0)
        holder.expect(C.NVSHARE_MSG_LOCK_GRANT)
        waiter.request_lock(GPU0)
        holder.expect(C.NVSHARE_MSG_LOCK_CONTENDED)  # the waiter is queued now
        pid = os.getpid()
        [gpu0] = records(cli("--socket", daemon.socket, "show", "gpu", "0")[1])
        assert field(gpu0, "Holders").startswith(f"700.0(pid={pid},user=root,held=00:00:0")
        assert field(gpu0, "Waiting").startswith(f"700.batch(pid={pid},user=root,waiting=")
        assert field(gpu0, "Jobs") == "700"
        [job] = records(cli("--socket", daemon.socket, "show", "job", "700")[1])
        assert f"Client={pid} Step=700.0 GpuState=0:holding:0B" in job
        assert f"Client={pid} Step=700.batch GpuState=0:waiting:0B" in job

        holder.close()  # a client that goes away loses the lock at once
        waiter.expect(C.NVSHARE_MSG_LOCK_GRANT)
        [gpu0] = records(cli("--socket", daemon.socket, "show", "gpu", "0")[1])
        assert field(gpu0, "Holders").startswith("700.batch(")
        assert field(gpu0, "Waiting") == "(null)"
    finally:
        holder.close()
        waiter.close()


# --- scontrol's ENTITY=ID form (issue 26): what both guides show --------------------------------

@pytest.mark.parametrize("words", [["show", "job=4243"], ["show", "jobid=4243"],
                                   ["show", "-o", "job=4243"], ["-o", "show", "JOB=4243"]])
def test_show_job_equals_id_is_show_job_id(daemon, words):
    Client(daemon.socket).register_job(4243, uid=1000, gid=1000, slots=1, name="eq", user="alice")
    spaced = cli("--socket", daemon.socket, "-o", "show", "job", "4243")
    code, out, err = cli("--socket", daemon.socket, *words)
    assert (code, err) == (0, "")
    assert out.startswith("JobId=4243 JobName=eq ")
    if "-o" in words:
        assert out == spaced[1]


def test_show_gpu_equals_index(daemon):
    code, out, _ = cli("--socket", daemon.socket, "show", "gpu=1")
    assert code == 0 and [field(r, "UUID") for r in records(out)] == [GPU1]


def test_show_job_equals_unknown_and_bad(daemon, capsys):
    assert cli("--socket", daemon.socket, "show", "job=999")[2] == \
        "nvshare-status: job 999 is not registered with nvshare-scheduler on this node\n"
    assert status.main(["--socket", daemon.socket, "show", "job=abc"]) == 2
    assert "job id must be a positive integer, got 'abc'" in capsys.readouterr().err
    # An update's KEY=VALUE words are not touched.
    assert status.split_entity(["update", "gpu=0", "mode=serial"]) == ["update", "gpu=0", "mode=serial"]
    assert status.split_entity(["--socket", "job=1", "show", "--socket", "gpu=2", "job=3"]) == \
        ["--socket", "job=1", "show", "--socket", "gpu=2", "job", "3"]


def test_an_idle_gpu_from_the_config_shows_what_the_policy_will_do(daemon):
    """Issue 26: `Name=configured` and `Sharing=auto()` before any client came."""
    code, out, _ = cli("--socket", daemon.socket, "show", "gpu", "0")
    assert code == 0
    assert field(out, "Name") == "(null)"
    assert field(out, "Sharing") == "corun(idle)"
