"""A site's own TaskProlog chained by nvshare-taskprolog (config site_task_prolog).

Each test runs the TaskProlog entry point as slurmstepd would (a process whose stdout is read,
whose exit status decides whether the task starts), then applies its output the way slurmstepd
does, and checks what the task would see: the site's variables, unsets and print lines, nvshare's
exports, LD_PRELOAD holding both, and the site's exit status kept. tests/slurm/test_site_scripts.py
does the same through real Slurm.
"""
from __future__ import annotations

import ctypes
import io
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import FAKE_GPUS

from nvshare_slurm import libnvshare_file, taskprolog
from nvshare_slurm.base import config, taskconfig
from nvshare_slurm.node import sitetask

HOOK = libnvshare_file()


def system_library(name: str) -> str:
    """A library's path as the dynamic linker finds it: LD_PRELOAD in these tests must name real,
    harmless libraries, since the site's program and the task start with it."""
    ctypes.CDLL(name)
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith("/" + name):
            return line.split()[-1]
    raise AssertionError(f"{name} not mapped")


JOB_LIB, SITE_LIB, SITE_LIB2 = (system_library(n) for n in ("libm.so.6", "libdl.so.2", "librt.so.1"))
GPU0 = FAKE_GPUS[0]["uuid"]
SLOW = ("cffi", "pycparser", "yaml", "_yaml")
# The entry point as installed, then a look at what it imported.
ENTRY = f"""
import sys
from nvshare_slurm.taskprolog import main
rc = main()
slow = sorted(m for m in sys.modules if m.split(".")[0] in {SLOW!r})
print("imported:", ",".join(slow), file=sys.stderr)
sys.exit(rc)
"""


class Task:
    """One TaskProlog run: its status, its raw stdout, and the task's environment after Slurm
    applied that stdout to `before`."""

    def __init__(self, status: int, stdout: bytes, stderr: str, before: dict[str, str],
                 elapsed: float):
        self.status, self.stdout, self.stderr, self.elapsed = status, stdout, stderr, elapsed
        self.env = dict(before)
        for name, value in sitetask.changes(stdout).items():
            if value is None:
                self.env.pop(name, None)
            else:
                self.env[name] = value
        # What slurmstepd writes to the task's stdout: each `print ` line, without the word.
        self.printed = [line[6:].lstrip() for line in stdout.decode(errors="replace").split("\n")
                        if line.startswith("print ")]
        self.imported = [m for m in stderr.strip().rsplit("imported:", 1)[-1].strip().split(",") if m]


def run_task(env: dict[str, str], timeout: float = 60) -> Task:
    before = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NVSHARE_"))}
    before.update(env)
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", ENTRY], env=before, capture_output=True,
                         timeout=timeout, stdin=subprocess.DEVNULL)
    return Task(out.returncode, out.stdout, out.stderr.decode(errors="replace"), before,
                time.monotonic() - started)


def script(tmp_path: Path, body: str, name: str = "site-taskprolog") -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def node_config(tmp_path: Path, socket: str, site: str = "", extra: str = "") -> str:
    path = tmp_path / "node.yaml"
    path.write_text(f"socket: {socket}\nsite_task_prolog: {site}\n{extra}")
    return str(path)


@pytest.fixture
def job(scheduler):
    """A job the scheduler has placed on GPU 0."""
    scheduler.client().register_job(41, uid=os.getuid(), gid=os.getgid(), slots=1)
    return scheduler


SITE = """\
echo "export SITE_DIR=/scratch/$SLURM_JOB_ID"
echo "print site: welcome $(id -un)"
echo "unset SITE_UNSET_ME"
echo "export LD_PRELOAD={site_lib}:$LD_PRELOAD"
echo "export CUDA_VISIBLE_DEVICES=7"
echo "a line Slurm ignores"
echo "site stderr" >&2
"""


def test_both_outputs_reach_the_task(job, tmp_path):
    cfg = node_config(tmp_path, job.socket, script(tmp_path, SITE.format(site_lib=SITE_LIB)))
    task = run_task({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": cfg, "LD_PRELOAD": JOB_LIB,
                     "SITE_UNSET_ME": "1"})
    assert task.status == 0, task.stderr
    lines = task.stdout.decode().splitlines()
    # The site's output first and unchanged (its stderr too: Slurm reads both from one pipe).
    user = pwd.getpwuid(os.getuid()).pw_name
    assert lines[:7] == ["export SITE_DIR=/scratch/41", f"print site: welcome {user}",
                         "unset SITE_UNSET_ME", f"export LD_PRELOAD={SITE_LIB}:{JOB_LIB}",
                         "export CUDA_VISIBLE_DEVICES=7", "a line Slurm ignores", "site stderr"]
    assert task.env["SITE_DIR"] == "/scratch/41" and "SITE_UNSET_ME" not in task.env
    assert task.printed == [lines[1][6:]]
    # nvshare's after it: its own values win, LD_PRELOAD is the hook and then the site's entries.
    assert task.env["LD_PRELOAD"] == f"{HOOK}:{SITE_LIB}:{JOB_LIB}"
    assert task.env["CUDA_VISIBLE_DEVICES"] == GPU0
    assert task.env["NVSHARE_JOB_ID"] == "41" and task.env["NVSHARE_SOCKET"] == job.socket
    assert task.imported == [], "the fast path stays fast with a site TaskProlog"


@pytest.mark.parametrize("site_line, job_preload, expected", [
    ("unset LD_PRELOAD", JOB_LIB, HOOK),
    (f"export LD_PRELOAD={SITE_LIB} {SITE_LIB2}", JOB_LIB, f"{HOOK}:{SITE_LIB}:{SITE_LIB2}"),
    (f"export LD_PRELOAD={HOOK}:{SITE_LIB}", "", f"{HOOK}:{SITE_LIB}"),
    ("export OTHER=1", JOB_LIB, f"{HOOK}:{JOB_LIB}"),
    (f"export LD_PRELOAD={SITE_LIB}\nunset LD_PRELOAD\nexport LD_PRELOAD={SITE_LIB2}", "",
     f"{HOOK}:{SITE_LIB2}"),
])
def test_ld_preload_is_the_hook_then_what_the_site_left(job, tmp_path, site_line, job_preload,
                                                          expected):
    cfg = node_config(tmp_path, job.socket, script(tmp_path, f"cat <<'EOF'\n{site_line}\nEOF\n"))
    task = run_task({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": cfg, "LD_PRELOAD": job_preload})
    assert task.status == 0, task.stderr
    assert task.env["LD_PRELOAD"] == expected


def test_a_job_nvshare_does_not_serve_gets_the_site_output_alone_byte_for_byte(job, tmp_path):
    raw = b"export A=\xff\xfe\nprint \xe2\x9c\x93 ok\nexport LAST=no newline"
    site = tmp_path / "site"
    site.write_bytes(b"#!/bin/sh\nprintf '" + raw.replace(b"\n", b"\\n") + b"'\n")
    site.chmod(0o755)
    cfg = node_config(tmp_path, job.socket, str(site))
    for env in ({"SLURM_JOB_ID": "42"}, {}):           # unknown job; no job at all
        task = run_task({**env, "NVSHARE_CONFIG": cfg})
        assert (task.status, task.stdout) == (0, raw + b"\n"), task.stderr


def test_output_after_a_nul_is_what_slurm_would_drop(job, tmp_path):
    cfg = node_config(tmp_path, job.socket,
                      script(tmp_path, "printf 'export A=1\\n\\0export B=2\\n'\n"))
    task = run_task({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": cfg})
    assert task.stdout.startswith(b"export A=1\nexport LD_PRELOAD=")
    assert b"\0" not in task.stdout and "B" not in task.env
    assert task.env["NVSHARE_JOB_ID"] == "41"


@pytest.mark.parametrize("body, status, kept", [
    ("echo export SITE=1\nexit 3\n", 3, True),              # kept, as Slurm would fail the task
    ("echo export SITE=1\nkill -9 $$\n", 1, False),         # Slurm applies nothing of it
])
def test_a_failing_site_taskprolog_fails_the_task_with_nvshare_s_exports_printed(
        job, tmp_path, body, status, kept):
    cfg = node_config(tmp_path, job.socket, script(tmp_path, body))
    task = run_task({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": cfg})
    assert task.status == status
    assert ("SITE" in task.env) == kept
    assert task.env["NVSHARE_JOB_ID"] == "41" and task.env["LD_PRELOAD"].startswith(HOOK)
    assert "nvshare-taskprolog: job 41: site TaskProlog: " in task.stderr
    assert f"the task fails (status {status})" in task.stderr


@pytest.mark.parametrize("body", [
    # Hangs, with a child in its process group that would hold the pipe open.
    "echo export SITE=1\nsleep 60 &\necho $! > {pids}\nsleep 60\n",
    # Closes its output and goes on.
    "exec >&- 2>&-\nsleep 60 &\necho $! > {pids}\nwait\n",
])
def test_a_hanging_site_taskprolog_is_killed_with_its_group_and_fails_the_task(job, tmp_path,
                                                                                body):
    pids = tmp_path / "pids"
    cfg = node_config(tmp_path, job.socket, script(tmp_path, body.format(pids=pids)),
                      "site_task_prolog_timeout: 1\n")
    task = run_task({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": cfg})
    assert task.status == 1 and task.elapsed < 10
    assert "still ran after 1 s: killed with its process group" in task.stderr
    assert "SITE" not in task.env and task.env["NVSHARE_JOB_ID"] == "41"
    child = int(pids.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or \
        Path(f"/proc/{child}/stat").read_text().split(") ")[1][0] == "Z"


@pytest.mark.parametrize("make", [
    lambda tmp_path: str(tmp_path / "absent"),
    lambda tmp_path: script(tmp_path, "") and str(tmp_path),                  # a directory
    lambda tmp_path: (tmp_path / "noexec").write_text("#!/bin/sh\n") and str(tmp_path / "noexec"),
])
def test_a_site_taskprolog_that_cannot_run_fails_the_task_as_in_slurm(job, tmp_path, make):
    cfg = node_config(tmp_path, job.socket, make(tmp_path))
    task = run_task({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": cfg})
    assert task.status == sitetask.EXEC_FAILED
    assert "site TaskProlog: cannot run " in task.stderr
    assert task.env["NVSHARE_JOB_ID"] == "41"


def test_the_site_taskprolog_runs_in_the_task_s_environment(job, tmp_path):
    seen = tmp_path / "seen"
    body = (f"env > {seen}.env\nid -u > {seen}.uid\nreadlink /proc/$$/fd/0 > {seen}.stdin\n"
            f"ps -o pgid= -p $$ | tr -d ' ' > {seen}.pgid\necho $$ > {seen}.pid\n")
    cfg = node_config(tmp_path, job.socket, script(tmp_path, body))
    task = run_task({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": cfg, "SLURM_TASK_PID": "777",
                     "JOB_SETTING": "x y"})
    assert task.status == 0, task.stderr
    env = dict(line.split("=", 1) for line in Path(f"{seen}.env").read_text().splitlines()
               if "=" in line)
    assert env["SLURM_JOB_ID"] == "41" and env["SLURM_TASK_PID"] == "777"
    assert env["JOB_SETTING"] == "x y"
    assert Path(f"{seen}.uid").read_text().strip() == str(os.getuid())
    assert Path(f"{seen}.stdin").read_text().strip() == "/dev/null"
    assert Path(f"{seen}.pgid").read_text().strip() == Path(f"{seen}.pid").read_text().strip()


def test_a_site_program_that_runs_nvshare_taskprolog_again_does_not_recurse(job, tmp_path):
    # A site wrapper around nvshare-taskprolog, named as the site's own by mistake.
    wrapper = script(tmp_path, f"exec {sys.executable} -m nvshare_slurm.taskprolog\n", "wrapper")
    cfg = node_config(tmp_path, job.socket, wrapper, "site_task_prolog_timeout: 20\n")
    task = run_task({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": cfg})
    assert task.status == 0 and task.elapsed < 15, task.stderr
    assert task.stdout.count(b"export NVSHARE_JOB_ID=41\n") == 2


def test_a_job_cannot_skip_the_site_taskprolog_by_naming_an_ancestor_it_does_not_have(job,
                                                                                    tmp_path):
    cfg = node_config(tmp_path, job.socket, script(tmp_path, "echo export SITE=1\n"))
    for forged in ("1", str(os.getpid() + 100000), "", "x"):
        task = run_task({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": cfg,
                         taskprolog.CHAIN_VAR: forged})
        assert task.env.get("SITE") == "1", forged


def test_a_slow_site_program_is_waited_for_within_its_timeout(job, tmp_path):
    cfg = node_config(tmp_path, job.socket, script(tmp_path, "sleep 0.5\necho export SITE=1\n"),
                      "site_task_prolog_timeout: 5\n")
    task = run_task({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": cfg})
    assert task.status == 0 and task.elapsed >= 0.5
    assert task.env["SITE"] == "1" and task.env["NVSHARE_JOB_ID"] == "41"


def test_the_site_keys_default_alike_in_both_readers():
    fast, full = taskconfig.TaskConfig(), config.Config()
    assert (fast.site_task_prolog, fast.site_task_prolog_timeout) == \
        (full.site_task_prolog, full.site_task_prolog_timeout) == ("", 30.0)


# --- a config that config.load refuses ------------------------------------------------------------

@pytest.mark.parametrize("site_line", ["site_task_prolog: {site}", "site_task_prolog: '{site}'",
                                       'site_task_prolog: "{site}"  # the site\'s'])
def test_a_broken_config_still_runs_the_site_taskprolog(job, tmp_path, site_line):
    site = script(tmp_path, "echo export SITE=1\n")
    path = tmp_path / "node.yaml"
    path.write_text(f"socket: {job.socket}\n{site_line.format(site=site)}\nscheduling_mode: x: y\n")
    task = run_task({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": str(path)})
    assert task.status == 0
    # Never ungated (issue 26): the socket line alone is usable, so the job gets its placement.
    assert task.env.get("SITE") == "1" and task.env.get("NVSHARE_JOB_ID") == "41"
    assert task.env["NVSHARE_ON_DAEMON_LOSS"] == "wait"
    assert "bad config: " in task.stderr and "task starts with the hook on safe defaults" in task.stderr


@pytest.mark.parametrize("text", [
    "site_task_prolog: relative\nswap: [x\n",
    "site_task_prolog: /a\nsite_task_prolog: /b\nswap: [x\n",
])
def test_a_broken_config_naming_an_unusable_site_taskprolog_fails_the_task(job, tmp_path, text):
    path = tmp_path / "node.yaml"
    path.write_text(text)
    task = run_task({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": str(path)})
    assert task.status == 1
    assert "(site_task_prolog) that must run: the task fails" in task.stderr


def test_a_config_naming_no_site_taskprolog_exits_0_as_before(job, tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text("swap: [x\n")
    task = run_task({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": str(path)})
    # Status 0 as before; the hook is exported on safe defaults (no usable socket line: the
    # default socket, unreachable here, so every managed GPU gated and on_daemon_loss=wait).
    assert task.status == 0 and task.env["LD_PRELOAD"].startswith(HOOK)
    assert task.env["NVSHARE_ON_DAEMON_LOSS"] == "wait"


# --- taskconfig reads the two keys as config.load does ------------------------------------------

@pytest.mark.parametrize("text", [
    "site_task_prolog: /etc/slurm/taskprolog.site\n",
    "site_task_prolog: /etc/slurm/tp  # the site program\nsite_task_prolog_timeout: 2.5\n",
    "site_task_prolog:\nsite_task_prolog_timeout: 3600\n",
    "site_task_prolog:\n",
    "site_task_prolog_timeout: 0.1\n",
    "site_task_prolog_timeout: 1_0\n",
])
def test_taskconfig_reads_the_site_keys_as_config_load_does(tmp_path, text):
    path = tmp_path / "n.yaml"
    path.write_text(text)
    fast, full = taskconfig.read(str(path)), config.load(path, environ={})
    assert fast is not None
    assert (fast.site_task_prolog, fast.site_task_prolog_timeout) == \
        (full.site_task_prolog, full.site_task_prolog_timeout)


@pytest.mark.parametrize("text", [
    "site_task_prolog: relative\n", "site_task_prolog: '/q'\n", "site_task_prolog:\n  /indented\n",
    "site_task_prolog: /a b\n", "site_task_prolog_timeout: 0\n", "site_task_prolog_timeout: nan\n",
    "site_task_prolog_timeout: 3601\n", "site_task_prolog_timeout: soon\n",
    "site_task_prolog_timeout:\n", "site_task_prolog_timeout: 0x10\n",
])
def test_taskconfig_leaves_other_site_values_to_config_load(tmp_path, text):
    path = tmp_path / "n.yaml"
    path.write_text(text)
    assert taskconfig.read(str(path)) is None


def test_an_indented_value_is_config_load_s_reading():
    # What the fast reader refuses above: YAML takes the indented line as the value.
    assert yaml.safe_load("site_task_prolog:\n  /indented\n") == {"site_task_prolog": "/indented"}


@pytest.mark.parametrize("text, found", [
    ("swap: [x\n", ""),
    ("site_task_prolog: /s/tp\nswap: [x\n", "/s/tp"),
    ("site_task_prolog:   '/s/t p'   # c\n", "/s/t p"),
    ("site_task_prolog:\n", ""),
    ("  site_task_prolog: /nested/elsewhere\n", ""),
    ("site_task_prolog: tp\n", None),
    ("site_task_prolog: /a\nsite_task_prolog: /a\n", None),
    ("site_task_prolog: [/a]\n", None),
])
def test_the_site_line_of_a_broken_config(tmp_path, text, found):
    path = tmp_path / "n.yaml"
    path.write_text(text)
    assert taskconfig.site_task_prolog_line(str(path)) == found


def test_the_site_line_of_a_missing_or_unreadable_config(tmp_path):
    assert taskconfig.site_task_prolog_line(str(tmp_path / "absent.yaml")) == ""
    assert taskconfig.site_task_prolog_line(str(tmp_path)) is None


# --- parsing as slurmstepd parses ---------------------------------------------------------------

def test_changes_parse_a_taskprolog_output_as_slurmstepd_does():
    out = (b"export A=1\nexport  B =x=y \nexport C\nunset  D  \nunset \n print E=no\n"
           b" export F=no\nexport G=1\nunset G\nexport LD_PRELOAD=\n")
    assert sitetask.changes(out) == {"A": "1", "B": "x=y ", "D": None, "G": None, "LD_PRELOAD": ""}


def test_nvshare_s_lines_keep_bytes_that_are_not_utf8_whatever_the_locale(job, tmp_path):
    cfg = node_config(tmp_path, job.socket)
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
    preload = b"/job/lib\xff.so".decode("utf-8", "surrogateescape")
    status = taskprolog.run({"SLURM_JOB_ID": "41", "NVSHARE_CONFIG": cfg, "LD_PRELOAD": preload},
                            out=out)
    out.flush()
    assert status == 0
    assert f"export LD_PRELOAD={HOOK}:".encode() + b"/job/lib\xff.so\n" in raw.getvalue()
