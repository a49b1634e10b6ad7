"""nvshare.yaml: the example lists every key at its default; every bad value is refused by name."""
from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from pathlib import Path

import pytest
import yaml

from nvshare_slurm.base import config
from nvshare_slurm.base.config import Config, ConfigError
from nvshare_slurm.base.priority import ClassMap

EXAMPLE = Path(__file__).resolve().parents[2] / "slurm" / "nvshare.yaml.example"
FIELDS = [f.name for f in dataclasses.fields(Config)]
SETTING_RE = re.compile(r"^#([a-z_]+):(.*)$")  # "#key: value"; prose comments have "# "


def load_text(tmp_path: Path, text: str, environ: dict | None = None) -> Config:
    path = tmp_path / "nvshare.yaml"
    path.write_text(text)
    return config.load(path, environ=environ or {})


# --- the example file ---------------------------------------------------------------------------

def test_example_lists_every_key_once_at_its_default(tmp_path):
    settings = [m.group(1) for m in map(SETTING_RE.match, EXAMPLE.read_text().splitlines()) if m]
    assert sorted(settings) == sorted(FIELDS), "slurm/nvshare.yaml.example and Config differ"
    assert len(settings) == len(set(settings)), "a key is listed twice"
    # Uncommented, the example must be exactly the defaults.
    uncommented = "\n".join(line[1:] if SETTING_RE.match(line) else line
                            for line in EXAMPLE.read_text().splitlines())
    assert set(yaml.safe_load(uncommented)) == set(FIELDS)
    assert load_text(tmp_path, uncommented) == Config()


def test_example_as_shipped_is_all_defaults():
    assert config.load(EXAMPLE, environ={}) == Config()


# --- where the config comes from ----------------------------------------------------------------

def test_missing_file_means_defaults(tmp_path):
    assert config.load(tmp_path / "absent.yaml", environ={}) == Config()
    with pytest.raises(ConfigError, match="no such config file"):
        config.load(tmp_path / "absent.yaml", environ={}, require_file=True)


def test_empty_file_means_defaults(tmp_path):
    assert load_text(tmp_path, "") == Config()
    assert load_text(tmp_path, "# only comments\n") == Config()


def test_nvshare_config_names_the_file(tmp_path):
    path = tmp_path / "elsewhere.yaml"
    path.write_text("scheduling_mode: serial\n")
    env = {"NVSHARE_CONFIG": str(path)}
    assert config.config_path(env) == path
    assert config.config_path({}) == Path(config.DEFAULT_PATH)
    assert config.load(environ=env).scheduling_mode == "serial"


def test_environment_overrides_the_file(tmp_path):
    path = tmp_path / "nvshare.yaml"
    path.write_text("scheduling_mode: serial\nmax_runtime_sec: 60\n")
    env = {"NVSHARE_CONFIG": str(path), "NVSHARE_SCHEDULING_MODE": "concurrent",
           "NVSHARE_MEMORY_RESERVE_PERCENT": "10", "NVSHARE_MAX_RUNTIME_SEC": ""}
    cfg = config.load(environ=env)
    assert cfg.scheduling_mode == "concurrent"      # environment wins
    assert cfg.memory_reserve_percent == 10         # environment alone
    assert cfg.max_runtime_sec == 60                # empty variable: the file's value stays


def test_bad_environment_value_names_the_variable(tmp_path):
    with pytest.raises(ConfigError, match="NVSHARE_ON_DAEMON_LOSS.*'sometimes'"):
        config.load(tmp_path / "absent.yaml", environ={"NVSHARE_ON_DAEMON_LOSS": "sometimes"})


def test_unrelated_nvshare_variables_are_ignored(tmp_path):
    # A job's environment carries NVSHARE_JOB_ID, NVSHARE_MEM_LIMIT...: not config keys.
    env = {"NVSHARE_JOB_ID": "12", "NVSHARE_MEM_LIMIT": "20G", "NVSHARE_MANAGED_GPUS": "x"}
    assert config.load(tmp_path / "absent.yaml", environ=env) == Config()


# --- every key ----------------------------------------------------------------------------------

# key -> (a good non-default value as written in YAML, what it loads as, bad values)
KEYS = {
    "scheduling_mode": ("Serial", "serial", ["fast", 1, "", None]),
    "auto_share": ("CoRun", "corun", ["both", 1, "", None]),
    "burst_turns": (False, False, ["sometimes", 2, 0.0, "", ["off"], None]),
    "turn_handoff": ("off", False, ["later", 2, 1.0, "", ["on"], None]),
    "switch_time_mode": ("fixed", "fixed", ["sometimes", True]),
    "switch_time_fixed": ("2.5", 2.5, [0, -1, 86401, "ten", "nan", [1]]),
    "switch_time_multiplier": (5, 5.0, [0.5, 10001, "x"]),
    "switch_time_min": (0.5, 0.5, [0, 1e9, "inf"]),
    "swap_bandwidth": ("25G", 25 << 30, ["fast", "1K", -5, True, "12X"]),
    "swap": (False, False, ["sometimes", 2, 0.0, "", ["off"], None]),
    "swap_prepin": (True, True, ["sometimes", 2, 0.0, "", ["on"], None]),
    "memory_reserve_percent": (10, 10, [-1, 91, 5.5, "5%", True]),
    "max_runtime_sec": ("600", 600, [0, "1h", 1.5]),
    "idle_release_ms": (1, 1.0, [0, 60001]),
    "drop_grace_sec": (5, 5.0, [0, "soon"]),
    "unresponsive_holder": ("KILL", "kill", ["ignore", 0]),
    "socket": ("/tmp/n.sock", "/tmp/n.sock", ["relative.sock", "", 5]),
    "state_dir": ("/srv/nvshare", "/srv/nvshare", ["var/lib", None]),
    "slurm_user": ("slurmadm", "slurmadm", ["", 17, ["a"]]),
    "slurm_bin_dir": ("/opt/slurm/bin", "/opt/slurm/bin", ["bin"]),
    "on_daemon_loss": ("run", "run", ["crash"]),
    "rogue_process": ("kill", "kill", ["maim"]),
    "rogue_check_sec": (1, 1.0, [0.1, "often"]),
    "log_level": ("DEBUG", "debug", ["verbose"]),
    "max_connections_per_uid": (16, 16, [0, -1, "many", 1.5]),
    "node_name": ("gpu01", "gpu01", ["", "a b", "n1;rm", 5]),
    "metrics_port": ("9402", 9402, [-1, 65536, "http", 1.5, True]),
    "metrics_bind": ("0.0.0.0", "0.0.0.0", ["localhost", "", "1.2.3", "eth0", 5, "0.0.0.0/0"]),
    "metrics_user_labels": ("on", True, ["names", 2]),
    "usage_admin_comment": ("yes", True, ["maybe", 2, ""]),
    "site_task_prolog": ("/etc/slurm/task prolog", "/etc/slurm/task prolog",
                         ["taskprolog.site", "./t", 5, ["/t"], "/a\nb", "/a\x1bb", True]),
    "site_task_prolog_timeout": ("2.5", 2.5, [0, 0.05, 3601, "soon", "nan", True, [1]]),
    "suspend_check_sec": ("0.5", 0.5, [0, 0.01, 61, "often", True]),
    "suspend_slurm_poll_sec": ("0", 0.0, [0.1, -1, 3601, "never", True]),
    "gpus": ([{"uuid": "GPU-a", "memory": "1G"}], (config.GpuSpec("GPU-a", 1 << 30, 0),),
             ["GPU-a", [{"uuid": "GPU-a"}]]),
    "priority_classes": (
        {"qos": {"prod": "High"}, "partition": {"scavenge": "low"}, "interactive": "high",
         "comment": {"opportunistic": "low"}},
        ClassMap({"prod": "high"}, {"scavenge": "low"}, {"opportunistic": "low"}, "high"),
        ["high", {"qos": {"prod": "urgent"}}, {"qos": ["prod"]}, {"tier": {"a": "low"}},
         {"partition": {"a b": "low"}}, {"interactive": "yes"}, {"default": None}]),
}


def test_every_key_is_covered_here():
    assert sorted(KEYS) == sorted(FIELDS)


@pytest.mark.parametrize("key", sorted(KEYS))
def test_good_value_is_taken(tmp_path, key):
    written, loaded, _ = KEYS[key]
    assert getattr(load_text(tmp_path, yaml.safe_dump({key: written})), key) == loaded


@pytest.mark.parametrize("key,bad", [(k, b) for k in sorted(KEYS) for b in KEYS[k][2]])
def test_bad_value_is_refused_naming_the_key(tmp_path, key, bad):
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, yaml.safe_dump({key: bad}))
    assert str(info.value).startswith(f"{key} (from {tmp_path / 'nvshare.yaml'})")


# Environment values are always strings; an empty one means "not set", so blank stands for it.
ENV_BAD = {key: next((b for b in KEYS[key][2] if isinstance(b, str) and b), None)
           for key in KEYS if key != "gpus"}
ENV_BAD.update(idle_release_ms="0", slurm_user="  ", priority_classes="{qos: {prod: urgent}}")


@pytest.mark.parametrize("key", sorted(ENV_BAD))
def test_bad_value_from_environment_is_refused_naming_the_variable(tmp_path, key):
    bad = ENV_BAD[key]
    with pytest.raises(ConfigError, match=f"environment NVSHARE_{key.upper()}"):
        config.load(tmp_path / "absent.yaml", environ={f"NVSHARE_{key.upper()}": bad})


@pytest.mark.parametrize("text,value", [("off", False), ("on", True), ("'off'", False),
                                        ("No", False), ("TRUE", True), ("'1'", True)])
def test_swap_takes_yaml_and_word_spellings(tmp_path, text, value):
    assert load_text(tmp_path, f"swap: {text}\n").swap is value


@pytest.mark.parametrize("text,value", [("off", False), ("OFF", False), ("on", True),
                                        ("false", False), ("0", False), ("yes", True)])
def test_swap_from_environment(tmp_path, text, value):
    # NVSHARE_SWAP is also what the hook reads in a job: the same words mean the same there.
    assert config.load(tmp_path / "absent.yaml", environ={"NVSHARE_SWAP": text}).swap is value


def test_default_swap_bandwidth_is_20g():
    # ~50 GB/s pinned each way measured on an H100, out then in one after the other, with room
    # for slower links: 20 GiB/s
    assert Config().swap_bandwidth == 20 << 30 and Config().swap is True


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'scheduling_mod'"):
        load_text(tmp_path, "scheduling_mod: serial\n")


# --- sizes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,size", [
    ("80G", 80 << 30), ("512M", 512 << 20), ("512m", 512 << 20), ("1.5T", int(1.5 * (1 << 40))),
    ("10GiB", 10 << 30), ("4096", 4096), (4096, 4096), (" 2K ", 2048), ("0", 0),
])
def test_sizes(text, size):
    assert config.parse_size(text) == size


@pytest.mark.parametrize("text", ["80X", "G", "-1", "1e9", "", "ten", True, None, [1]])
def test_bad_sizes(text):
    with pytest.raises(ConfigError, match="memory"):
        config.parse_size(text, "memory")


def test_format_size_round_trips():
    for size in (80 << 30, 512 << 20, 1 << 40, 1000):
        assert config.parse_size(config.format_size(size)) == size


# --- gpus ---------------------------------------------------------------------------------------

def test_gpus_list_gets_indices_and_sizes(tmp_path):
    cfg = load_text(tmp_path,
                    "gpus:\n - {uuid: GPU-a, memory: 16G}\n - {uuid: GPU-b, memory: 1024}\n")
    assert cfg.gpus == (config.GpuSpec("GPU-a", 16 << 30, 0), config.GpuSpec("GPU-b", 1024, 1))
    assert cfg.as_dict()["gpus"] == [
        {"uuid": "GPU-a", "memory": 16 << 30, "index": 0, "device": "/dev/nvidia0"},
        {"uuid": "GPU-b", "memory": 1024, "index": 1, "device": "/dev/nvidia1"}]


def test_a_gpu_names_its_device_file(tmp_path):
    cfg = load_text(tmp_path, "gpus:\n - {uuid: GPU-a, memory: 1G, device: /tmp/fake/nvidia7}\n"
                              " - {uuid: GPU-b, memory: 1G}\n")
    assert [g.device_path for g in cfg.gpus] == ["/tmp/fake/nvidia7", "/dev/nvidia1"]


@pytest.mark.parametrize("gpus,message", [
    ("{uuid: GPU-a, memory: 1G}", "expected a list"),
    ("[GPU-a]", r"gpus \(from .*\)\[0\]: expected \{uuid"),
    ("[{uuid: GPU-a}]", r"\[0\]: expected \{uuid"),
    ("[{uuid: GPU-a, memory: 1G, index: 3}]", r"\[0\]: expected \{uuid"),
    ("[{uuid: GPU-a, memory: 1G}, {uuid: 'bad uuid', memory: 1G}]", r"\[1\]\.uuid: 'bad uuid'"),
    ("[{uuid: GPU-a, memory: 0}]", r"\[0\]\.memory: must be positive"),
    ("[{uuid: GPU-a, memory: lots}]", r"\[0\]\.memory.*'lots'"),
    ("[{uuid: GPU-a, memory: 1G}, {uuid: GPU-a, memory: 2G}]", "listed twice"),
    ("[{uuid: GPU-a, memory: 1G, device: dev/nvidia0}]", r"\[0\]\.device: 'dev/nvidia0' is not"),
    ("[{uuid: GPU-a, memory: 1G, device: '/dev/nv idia0'}]", r"\[0\]\.device: .* not an absolute"),
    ("[{uuid: GPU-a, memory: 1G, device: /dev/full}]", r"\[0\]\.device: .* named nvidia<N>"),
    ("[{uuid: GPU-a, memory: 1G}, {uuid: GPU-b, memory: 1G, device: /dev/nvidia0}]",
     "the same device file is listed twice"),
])
def test_bad_gpus_are_refused(tmp_path, gpus, message):
    with pytest.raises(ConfigError, match=message):
        load_text(tmp_path, f"gpus: {gpus}\n")


def test_gpus_from_environment(tmp_path):
    env = {"NVSHARE_GPUS": "[{uuid: GPU-e, memory: 2G}]"}
    assert config.load(tmp_path / "absent.yaml", environ=env).gpus == (
        config.GpuSpec("GPU-e", 2 << 30, 0),)


def test_gpus_environment_that_is_not_yaml_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="NVSHARE_GPUS"):
        config.load(tmp_path / "absent.yaml", environ={"NVSHARE_GPUS": "[{uuid: GPU-e"})


# --- files that are not a config ----------------------------------------------------------------

@pytest.mark.parametrize("text", ["- scheduling_mode: serial\n", "just a string\n", "42\n", "0\n",
                                  "false\n", "''\n"])
def test_yaml_that_is_not_a_mapping(tmp_path, text):
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_text(tmp_path, text)


def test_invalid_yaml_is_named(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read as YAML"):
        load_text(tmp_path, "scheduling_mode: [serial\n")


def test_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "nvshare.yaml"
    path.write_bytes(b"scheduling_mode: \xff\xfe\n")
    with pytest.raises(ConfigError, match=f"{path}: cannot be read"):
        config.load(path, environ={})


def test_a_directory_is_not_a_config(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        config.load(tmp_path, environ={})


def as_nobody(fn) -> tuple[str, str]:
    """Run fn() in a child with uid/gid 65534; ("ok"|exception class name, message)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report through the pipe, never return into pytest
        code = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                result = ("ok", repr(fn()))
            except Exception as exc:  # noqa: BLE001 - the parent asserts on the class
                result = (type(exc).__name__, str(exc))
            os.write(write_end, "\n".join(result).encode())
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "child failed before reporting"
    kind, _, message = data.partition("\n")
    return kind, message


@pytest.fixture
def public_dir():
    """A world-readable directory (tmp_path is under root's 0700 pytest dir)."""
    path = Path(tempfile.mkdtemp(prefix="nvs-cfg-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    for child in sorted(path.rglob("*"), reverse=True):
        child.chmod(0o700)
        child.unlink() if child.is_file() else child.rmdir()
    path.rmdir()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switches to uid 65534")


@needs_root
def test_unreadable_file_is_a_config_error(public_dir):
    path = public_dir / "nvshare.yaml"
    path.write_text("scheduling_mode: serial\n")
    path.chmod(0o600)
    kind, message = as_nobody(lambda: config.load(path, environ={}))
    assert kind == "ConfigError"
    assert str(path) in message and "Permission denied" in message


@needs_root
def test_file_in_unreadable_directory_is_a_config_error(public_dir):
    # /etc/nvshare 0700 and a user running nvshare-status: a clear message, not a traceback.
    secret = public_dir / "secret"
    secret.mkdir(mode=0o700)
    path = secret / "nvshare.yaml"
    path.write_text("scheduling_mode: serial\n")
    kind, message = as_nobody(lambda: config.load(path, environ={}))
    assert kind == "ConfigError"
    assert str(path) in message


# --- the fallback of a refused file (issue 26: the TaskProlog never starts a task ungated) ----------

@pytest.mark.parametrize("text", [
    "socket: /srv/s.sock\nstate_dir: /srv/st\non_daemon_loss: run\nscheduling_mode: never\n",
    "socket: /srv/s.sock   # ours\nstate_dir: /srv/st\non_daemon_loss: run\nswap: [x\n",
])
def test_fallback_keeps_the_usable_paths_and_waits(tmp_path, text):
    path = tmp_path / "n.yaml"
    path.write_text(text)
    with pytest.raises(config.ConfigError):
        config.load(path, environ={})
    cfg = config.fallback({"NVSHARE_CONFIG": str(path)})
    assert (cfg.socket, cfg.state_dir) == ("/srv/s.sock", "/srv/st")
    assert cfg.on_daemon_loss == "wait"      # the file's `run` is not trusted from a broken file


def test_fallback_of_unusable_lines_is_the_defaults(tmp_path):
    path = tmp_path / "n.yaml"
    path.write_text("socket: relative\nslurm_bin_dir: 5\nbogus: 1\n")
    assert config.fallback({"NVSHARE_CONFIG": str(path)}) == config.Config()
    assert config.fallback({"NVSHARE_CONFIG": str(tmp_path / "absent")}) == config.Config()
