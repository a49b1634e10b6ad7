"""Status text from status JSON: golden files for what a user reads, and hostile text kept inert.

Golden files: tests/data/golden/<sample>.json -> <sample>.<view>[.oneliner].txt.
Regenerate after an intended change with NVSHARE_UPDATE_GOLDEN=1 and review the diff.
"""
from __future__ import annotations

import json
import time
import unicodedata

import pytest

from helpers_golden import GOLDEN, check_golden
from nvshare_slurm.node import render

VIEWS = {"gpus": render.render_gpus, "jobs": render.render_jobs, "config": render.render_config}
CASES = [("gpus", "gpus"), ("jobs", "jobs"), ("hostile", "jobs"), ("hostile", "gpus"),
         ("config", "config"), ("hostile", "config"), ("empty", "gpus"), ("empty", "jobs")]


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """Registered= is local time; golden files are written in UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def sample(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.json").read_text())


@pytest.mark.parametrize("oneliner", [False, True], ids=["records", "oneliner"])
@pytest.mark.parametrize("sample_name,view", CASES)
def test_golden(sample_name, view, oneliner):
    text = VIEWS[view](sample(sample_name), oneliner=oneliner)
    suffix = ".oneliner.txt" if oneliner else ".txt"
    check_golden(f"{sample_name}.{view}{suffix}", text)


def unsafe_chars(text: str) -> list[str]:
    return [ch for ch in text if ch != "\n" and unicodedata.category(ch) in
            {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}]


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("oneliner", [False, True])
def test_hostile_text_never_reaches_the_terminal(view, oneliner):
    text = VIEWS[view](sample("hostile"), oneliner=oneliner)
    assert unsafe_chars(text) == []
    text.encode("utf-8")  # lone surrogates from the JSON are escaped, not printed
    if oneliner:
        # A newline inside a job name must not start a fake record.
        records = 1 if view == "config" else len(sample("hostile")[view])
        assert text.count("\n") == records
    if view == "jobs":
        assert "pwned\\x07" in text and "\\x1b[2J" in text


def test_hostile_job_name_shown_escaped_and_cut():
    text = render.render_jobs(sample("hostile"))
    records = text.split("\n\n")
    assert len(records) == 2
    first = records[0].splitlines()[0]
    assert first.startswith("JobId=66 JobName=evil\\n\\x1b[2J\\x1b]0;pwned\\x07 tab\\there \\\\x41 "
                            "\\u202eemag\\ud800 User=mallory\\r\\nroot(6666)")
    long_name = records[1].splitlines()[0]
    assert f"JobName={'x' * render.MAX_TEXT}... " in long_name
    assert "User=\ufffd\ufffdbytes(6667)" in long_name  # replacement characters are printable


def test_gpu_record_shows_queue_in_order_and_holders():
    text = render.render_gpus(sample("gpus"))
    gpu0 = text.split("\n\n")[0]
    assert "Holders=1234.0(pid=4242,user=alice,held=00:01:15,shared,class=high)," \
           "1235.batch(pid=4300,user=bob,held=00:00:03,shared)" in gpu0   # normal: not shown
    assert "1236.interactive(pid=4400,user=carol,waiting=00:00:12,class=low)" in gpu0
    waiting = gpu0.index("1236.interactive(")
    assert waiting < gpu0.index("1237.2(")
    assert "MemoryTotal=16.0G MemoryUsed=3.0G MemoryReserved=819.2M MemoryUsable=15.2G" in gpu0
    assert "Rogue=999(512.0M)" in gpu0
    gpu1 = text.split("\n\n")[1]
    assert "Mode=serial SwitchTime=30.0s" in gpu1 and "MaxRuntime=1-01:01:01" in gpu1
    assert "Holders=(null)" in gpu1 and "Waiting=(null)" in gpu1


def test_oneliner_is_one_line_per_record():
    text = render.render_gpus(sample("gpus"), oneliner=True)
    lines = text.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("Index=0 UUID=GPU-fa4e0000-0000-0000-0000-000000000000 ")
    assert lines[1].startswith("Index=1 ")
    # Every word of the multi-line record is on the one line.
    records = render.render_gpus(sample("gpus")).split("\n\n")
    assert lines[0].split() == records[0].split()


@pytest.mark.parametrize("value,expected", [
    (0, "0B"), (1023, "1023B"), (1024, "1.0K"), (512 << 20, "512.0M"), (16 << 30, "16.0G"),
    (int(1.5 * (1 << 40)), "1.5T"), (None, "(null)"), ("junk\n", "junk\\n"),
])
def test_human_size(value, expected):
    assert render.human_size(value) == expected


@pytest.mark.parametrize("seconds,expected", [
    (0, "00:00:00"), (59.9, "00:00:59"), (3600, "01:00:00"), (90061, "1-01:01:01"),
    (-5, "00:00:00"),
])
def test_duration(seconds, expected):
    assert render.duration(seconds) == expected


def test_safe_escapes_are_unambiguous():
    # A literal backslash-n typed by a user and a real newline must not look the same.
    assert render.safe("a\\nb") != render.safe("a\nb")
    assert render.safe("\x00\x7f\x85\u2028\U000e0001") == "\\x00\\x7f\\x85\\u2028\\U000e0001"
    assert render.safe("é中😀") == "é中😀"
    cut = render.safe("\n" * 100, limit=11)
    assert cut == "\\n" * 5 + "..."  # cut between escapes, never inside one


def test_missing_fields_render_as_null():
    # An older or newer daemon may leave fields out: show (null), do not crash.
    text = render.render_gpus({"node": "n", "gpus": [{"index": 3}]})
    assert text.startswith("Index=3 UUID=(null) Node=n Name=(null)")
    text = render.render_jobs({"jobs": [{"job_id": 5, "clients": [{"pid": 1}]}]})
    assert "JobId=5 JobName=(null) User=(null)" in text and "Client=1 Step=5.(null)" in text


def test_no_empty_parentheses_and_no_index_read_as_a_count():
    """Issue 26: `Sharing=auto()` and `GPUs=0` (an index that reads as a count)."""
    text = render.render_gpus({"gpus": [{"index": 0, "sharing": "corun", "sharing_reason": ""}]})
    assert "   Sharing=corun\n" in text and "()" not in text
    job = render.render_jobs({"jobs": [{"job_id": 5, "slots": 1, "gpu_index": [0]}]})
    assert "Slots=1 GPUIndex=0 " in job and "GPUs=" not in job
