"""The TaskProlog's fast path: for a registered job and a plain config it imports neither cffi nor
yaml (bench/bench_taskprolog.py measures the time), and what it reads is what config.load reads.
Everything else goes to config.load and says the same thing it always said."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields

import pytest
import yaml
from conftest import FAKE_GPUS

from nvshare_slurm import taskprolog
from nvshare_slurm.base import config, taskconfig
from nvshare_slurm.base.config import Config
from nvshare_slurm.node import slurm, taskenv

# The modules the fast path must not import: cffi (and its parser), yaml, the standard library's
# slow ones, and ours that load them. (nvshare_slurm.wire.client is the one client, light since it
# holds jobquery's fast path.)
SLOW = ("cffi", "pycparser", "yaml", "_yaml", "asyncio", "dataclasses", "json",
        "nvshare_slurm.wire.proto", "nvshare_slurm.base.config", "nvshare_slurm.prolog",
        "nvshare_slurm.node.slurm")
# What the installed nvshare-taskprolog script runs, then a look at what it imported.
ENTRY = f"""
import sys
from nvshare_slurm.taskprolog import main
rc = main()
slow = sorted(m for m in sys.modules if m in {SLOW!r} or m.split(".")[0] in {SLOW!r})
print("imported:", ",".join(slow), file=sys.stderr)
sys.exit(rc)
"""


def run_entry(env: dict) -> tuple[list[str], str, list[str]]:
    """(stdout lines, stderr without the probe, the slow modules it imported)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NVSHARE_"))}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", ENTRY], env=full, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    *err, probe = out.stderr.strip().split("\n")
    assert probe.startswith("imported:")
    return out.stdout.splitlines(), "\n".join(err), [m for m in probe[10:].split(",") if m]


@pytest.fixture
def job(scheduler, tmp_path):
    """A registered job and a plain node config that names the scheduler's socket."""
    scheduler.client().register_job(41, uid=os.getuid(), gid=os.getgid(), slots=1)
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"# the node's config\nsocket: {scheduler.socket}   # the daemon\n"
                   "scheduling_mode: auto\nswap: Off\n\nlog_level: info\n")
    return {"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": str(cfg)}


def test_fast_path_imports_neither_cffi_nor_yaml(job, scheduler):
    lines, err, slow = run_entry(job)
    assert slow == [] and err == ""
    assert lines[0].startswith("export LD_PRELOAD=") and lines[0].endswith("libnvshare.so")
    for line in (f"export CUDA_VISIBLE_DEVICES={FAKE_GPUS[0]['uuid']}",
                 f"export NVSHARE_SOCKET={scheduler.socket}", "export NVSHARE_JOB_ID=41",
                 "export NVSHARE_ON_DAEMON_LOSS=wait", "export NVSHARE_SWAP=off"):
        assert line in lines


def test_swap_prepin_in_the_config_exports_it_to_every_task(job, tmp_path):
    cfg = tmp_path / "node.yaml"
    cfg.write_text(cfg.read_text() + "swap_prepin: true\n")
    lines, err, slow = run_entry(job)
    assert slow == [] and err == ""
    assert "export NVSHARE_SWAP_PREPIN=1" in lines


def test_the_check_sees_a_slow_path(job, tmp_path):
    # A quoted value is left to config.load: same exports, and the probe sees yaml loaded.
    cfg = tmp_path / "node.yaml"
    cfg.write_text(cfg.read_text().replace("scheduling_mode: auto", 'scheduling_mode: "auto"'))
    fast_lines, _, _ = run_entry(job)
    lines, err, slow = run_entry(job)
    assert lines == fast_lines and err == ""
    assert "yaml" in slow and "cffi" not in slow


def test_an_unregistered_job_prints_nothing_on_the_fast_path(job):
    lines, err, slow = run_entry(dict(job, SLURM_JOB_ID="42"))
    assert lines == [] and err == "" and slow == []


@pytest.mark.parametrize("line, error", [
    ("schedulng_mode: auto", "unknown key 'schedulng_mode'"),
    ("socket: run/s.sock", "must be an absolute path"),
    ("on_daemon_loss: later", "'later' is not one of wait, run"),
    ("swap: maybe", "expected true or false"),
    ('scheduling_mode: "sometimes"', "'sometimes' is not one of"),
    ("scheduling_mode: [serial", "cannot be read as YAML"),
])
def test_a_bad_config_says_what_config_load_says(job, tmp_path, line, error):
    cfg = tmp_path / "node.yaml"
    cfg.write_text(cfg.read_text() + line + "\n")
    lines, err, _ = run_entry(job)
    # Never ungated (issue 26): the hook still comes, on safe defaults, and the error is said.
    assert lines[0].startswith("export LD_PRELOAD=") and "export NVSHARE_JOB_ID=41" in lines
    assert "export NVSHARE_ON_DAEMON_LOSS=wait" in lines
    assert "nvshare-taskprolog: job 41: bad config: " in err
    assert "task starts with the hook on safe defaults" in err
    assert error in err
    with pytest.raises(config.ConfigError) as exc:
        config.load(cfg, environ={})
    assert " ".join(str(exc.value).split()) in err     # say() keeps it to one line


def test_plain_config_with_the_daemon_down_still_exports_the_hook(tmp_path):
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"socket: {tmp_path}/gone.sock\nstate_dir: {tmp_path}/state\n"
                   f"slurm_bin_dir: {tmp_path}\non_daemon_loss: run\ngpus:\n"
                   "- uuid: GPU-fa4e0000-0000-0000-0000-000000000000\n  memory: 16G\n")
    env = {"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "n1", "NVSHARE_CONFIG": str(cfg)}
    import io
    out = io.StringIO()
    assert taskprolog.run(env, out=out, wait_sec=0.2) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("export LD_PRELOAD=")
    assert "export NVSHARE_MANAGED_GPUS=GPU-fa4e0000-0000-0000-0000-000000000000" in lines
    assert "export NVSHARE_ON_DAEMON_LOSS=run" in lines


# --- taskconfig reads what config.load reads, or nothing -----------------------------------------

PLAIN = [
    "",
    "# only comments\n\n   # indented\n",
    "socket: /run/x/s.sock\n",
    "socket: /a #comment\non_daemon_loss: RUN\nswap: yes\n",
    "swap: FALSE\nmax_runtime_sec: 600\nswap_bandwidth: 20G\n",
    "swap: oN\nnode_name: n-01.x\n",
    "swap_prepin: True\nswap: no\n",
    "gpus:\n- uuid: GPU-1\n  memory: 16G\n-   uuid: GPU-2\n    memory: 1T\nsocket: /s\n",
    "gpus:\n  - uuid: GPU-1\n    memory: 16G\n# c\nswap: off\n",
    # Flow style, as scripts/demo.sh writes it (issue 26: it cost a full config.load per task).
    "gpus: [{uuid: GPU-fa4e0000-0000-0000-0000-000000000000, memory: 16G}]\nswap: off\n",
    "gpus: [{uuid: GPU-1, memory: 16G},\n  {uuid: GPU-2, memory: 1T}]\nsocket: /s\n",
    "priority_classes: {qos: {prod: high}, default: normal}\non_daemon_loss: run\n",
    yaml.safe_dump({"socket": "/tmp/s.sock", "swap": False, "on_daemon_loss": "run",
                    "scheduling_mode": "serial", "switch_time_fixed": 2.5}),
]
NOT_PLAIN = [
    "socket: '/run/s.sock'\n", 'socket: "/s"\n', "socket: /a#b\n", "socket:\n  /s\n",
    "socket: relative\n", "socket:\n", "socket: /a\nsocket: /b\n", "Socket: /a\n",
    "on_daemon_loss: never\n", "swap_prepin: 1\n", "swap: 1\n", "swap: maybe\n", "swap: [on]\n",
    "swap: !!bool on\n",
    "swap: &a on\n", "---\nswap: on\n", "swap: on\n...\n", "socket:\t/s\n", "socket: /s\r\n",
    "\ufeffsocket: /s\n", "socket: /a b\n", "socket: {x: 1}\n", "socket:/s\n", " socket: /s\n",
    "scheduling_mode: auto\n  more\n", "-socket: /s\n", "%YAML 1.1\n---\nswap: on\n",
    "socket: |\n  /s\n", "not_a_key: 1\n",
    "gpus: [{uuid: a}]\ngpus: [{uuid: b}]\n", "not_a_key: [1]\n", "site_task_prolog: [/x]\n",
    "site_task_prolog_timeout: {a: 1}\n",
]


def load_file_only(path) -> Config:
    return config.load(path, environ={})


@pytest.mark.parametrize("text", PLAIN)
def test_taskconfig_reads_a_plain_file_as_config_load_does(tmp_path, text):
    path = tmp_path / "n.yaml"
    path.write_text(text)
    fast = taskconfig.read(str(path))
    full = load_file_only(path)
    assert fast is not None
    assert (fast.socket, fast.on_daemon_loss, fast.swap, fast.swap_prepin) == \
        (full.socket, full.on_daemon_loss, full.swap, full.swap_prepin)


@pytest.mark.parametrize("text", NOT_PLAIN)
def test_taskconfig_leaves_anything_else_to_config_load(tmp_path, text):
    path = tmp_path / "n.yaml"
    path.write_text(text)
    assert taskconfig.read(str(path)) is None


def test_taskconfig_leaves_a_missing_or_unreadable_file_to_config_load(tmp_path):
    assert taskconfig.read(str(tmp_path / "absent.yaml")) is None
    assert taskconfig.read(str(tmp_path)) is None
    assert taskconfig.read("") is None
    (tmp_path / "latin1.yaml").write_bytes(b"socket: /s\xe9\n")
    assert taskconfig.read(str(tmp_path / "latin1.yaml")) is None


def test_taskconfig_defaults_and_keys_are_config_s():
    # KEYS is read from config.py's text; a key it missed would only send its configs to the slow
    # path; this keeps them fast.
    assert taskconfig.KEYS == {f.name for f in fields(Config)}
    assert taskconfig.DEFAULT_PATH == config.DEFAULT_PATH
    fast, full = taskconfig.TaskConfig(), Config()
    assert (fast.socket, fast.on_daemon_loss, fast.swap, fast.swap_prepin) == \
        (full.socket, full.on_daemon_loss, full.swap, full.swap_prepin)


@pytest.mark.parametrize("value", [None, "", "0", "1", " 12 ", "01", "1;id", "abc", "9999999999",
                                   "12345678901", "\u0661\u0662", "-3", "3 4"])
def test_job_id_check_is_slurm_s(value):
    assert taskenv.valid_job_id(value) == slurm.valid_job_id(value)
