"""config.OVERRIDABLE is the one table of the settings an admin may change per GPU (issue 41). Every
row's bounds are taken, and just outside them refused, by each reader: the config file (here its
NVSHARE_<KEY> form, the same check), `nvshare-status update`'s parser, the real daemon's check of
ADMIN_UPDATE, and its check of the overrides state.json keeps."""
from __future__ import annotations

import math
from dataclasses import fields

import pytest

from helpers_daemon import GPU0, gpu_status
from nvshare_slurm import status
from nvshare_slurm.base import config
from nvshare_slurm.policy.policytypes import GpuSettings
from nvshare_slurm.scheduler.registry import overrides_from_json
from nvshare_slurm.wire.client import RequestFailed
from nvshare_slurm.wire.proto import C

ROWS = sorted(config.OVERRIDABLE)

# How each row is said to the status CLI (its word, and the text for each value the test gives)
# and to the daemon (ADMIN_UPDATE's field, and the wire's number for a value). A new row fails
# test_every_row_is_walked until it is said here.
CLI_WORD = {"mode": "mode", "switch_time_mode": "switch_time", "switch_time_fixed": "switch_time",
            "memory_reserve_percent": "memory_reserve_percent", "max_runtime_sec": "max_runtime_sec"}
CLI_TEXT = {"switch_time_mode": {"auto": "auto", "fixed": "30"}}
WIRE_FIELD = {"mode": "mode", "switch_time_mode": "switch_mode", "switch_time_fixed": "switch_time_ms",
              "memory_reserve_percent": "memory_reserve_percent", "max_runtime_sec": "max_runtime_sec"}
WIRE_CODES = {"mode": {"auto": C.NVSHARE_MODE_AUTO, "concurrent": C.NVSHARE_MODE_CONCURRENT,
                       "serial": C.NVSHARE_MODE_SERIAL},
              "switch_time_mode": {"auto": C.NVSHARE_SWITCH_AUTO, "fixed": C.NVSHARE_SWITCH_FIXED}}
WIRE_SCALE = {"switch_time_fixed": 1000}      # seconds in the table, milliseconds on the wire


def inside(setting: config.Setting) -> list:
    """The values each reader must take: every word, or both ends of the range."""
    return list(setting.choices) if setting.kind is str else [setting.low, setting.high]


def outside(setting: config.Setting) -> list:
    """Just outside: a word that is none of them, or the nearest number past each end."""
    if setting.kind is str:
        return ["sometimes"]
    if setting.kind is int:
        return [setting.low - 1, setting.high + 1]
    return [math.nextafter(setting.low, -math.inf), math.nextafter(setting.high, math.inf)]


def test_every_row_is_walked():
    assert set(ROWS) == set(CLI_WORD) == set(WIRE_FIELD)
    assert {key for key in ROWS if config.OVERRIDABLE[key].kind is str} == set(WIRE_CODES)


@pytest.mark.parametrize("key", ROWS)
def test_a_row_is_a_config_key_and_a_gpu_setting(key):
    setting = config.OVERRIDABLE[key]
    config_types = {f.name: f.type for f in fields(config.Config)}
    assert config_types[setting.config_key] == setting.kind.__name__
    assert key in {f.name for f in fields(GpuSettings)}
    assert setting.kind in (str, int, float)
    assert bool(setting.choices) == (setting.kind is str)
    assert setting.kind is str or (setting.low < setting.high and setting.unit)


@pytest.mark.parametrize("key", ROWS)
def test_the_config_reader_takes_the_bounds(key, tmp_path):
    setting = config.OVERRIDABLE[key]
    name = config.ENV_PREFIX + setting.config_key.upper()
    for value in inside(setting):
        cfg = config.load(tmp_path / "absent.yaml", environ={name: str(value)})
        assert getattr(cfg, setting.config_key) == value
    for value in outside(setting):
        with pytest.raises(config.ConfigError, match=setting.config_key):
            config.load(tmp_path / "absent.yaml", environ={name: str(value)})


def cli_text(key: str, value) -> str:
    return CLI_TEXT.get(key, {}).get(value, str(value))


@pytest.mark.parametrize("key", ROWS)
def test_the_status_cli_takes_the_bounds(key):
    setting = config.OVERRIDABLE[key]
    for value in inside(setting):
        _, fields_ = status.parse_update(["gpu=0", f"{CLI_WORD[key]}={cli_text(key, value)}"])
        expected = WIRE_CODES[key][value] if key in WIRE_CODES else \
            round(value * WIRE_SCALE.get(key, 1))
        assert fields_[WIRE_FIELD[key]] == expected
    for value in outside(setting):
        with pytest.raises(ValueError, match=CLI_WORD[key]):
            status.parse_update(["gpu=0", f"{CLI_WORD[key]}={cli_text(key, value)}"])


def wire_values(key: str, setting: config.Setting) -> tuple[list[int], list[int]]:
    """(taken, refused) numbers of ADMIN_UPDATE's field: just outside is one unit of the wire."""
    if key in WIRE_CODES:
        codes = WIRE_CODES[key]
        return [codes[word] for word in setting.choices], [max(codes.values()) + 1]
    scale = WIRE_SCALE.get(key, 1)
    low, high = round(setting.low * scale), round(setting.high * scale)
    return [low, high], [low - 1, high + 1]


@pytest.mark.parametrize("key", ROWS)
def test_the_daemon_takes_the_bounds(key, scheduler_factory):
    """Over the socket, as root: what nvshare-status sends, and the numbers next to it."""
    setting = config.OVERRIDABLE[key]
    sched = scheduler_factory(scheduling_mode="concurrent")
    taken, refused = wire_values(key, setting)
    for number in taken:
        sched.client().admin_update("0", **{WIRE_FIELD[key]: number})
        shown = gpu_status(sched, GPU0)
        if key == "mode":
            assert WIRE_CODES[key][shown["mode"]] == number
        elif key == "switch_time_mode":
            assert (shown["switch_time"] == "auto") == (number == C.NVSHARE_SWITCH_AUTO)
        elif key == "switch_time_fixed":
            assert shown["switch_time"] == number / WIRE_SCALE[key]
        else:
            assert shown[key] == number
    before = gpu_status(sched, GPU0)
    for number in refused:
        with pytest.raises(RequestFailed) as refusal:
            sched.client().admin_update("0", **{WIRE_FIELD[key]: number})
        assert refusal.value.status == C.NVSHARE_ERR_INVAL
    assert gpu_status(sched, GPU0) == before


@pytest.mark.parametrize("key", ROWS)
def test_state_json_overrides_take_the_bounds(key):
    setting = config.OVERRIDABLE[key]
    for value in inside(setting):
        assert overrides_from_json("GPU-x", {key: value}) == ({key: value}, [])
    for value in outside(setting):
        kept, problems = overrides_from_json("GPU-x", {key: value})
        assert kept == {} and len(problems) == 1 and "out of range" in problems[0]
