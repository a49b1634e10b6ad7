"""Every setting the hook reads from its environment is written down where a reader looks for it: a
row of docs/protocol.md's table of a job process's environment (what the TaskProlog writes and the
hook reads), and a mention in the user guide or the admin guide (who sets it). Before this test,
nine of the hook's settings (the leaks, lingering, the drain and daemon timeouts among them) had no
row in the protocol's table, and NVSHARE_LOG_LEVEL, NVSHARE_LOG_TIME and NVSHARE_ALLOC_BUDGET were in
neither guide."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def hook_settings() -> set[str]:
    """The names of the hook's environment settings: its string literals that are an NVSHARE_ name."""
    names: set[str] = set()
    for path in (REPO / "csrc").glob("*.c"):
        names |= set(re.findall(r'"(NVSHARE_[A-Z][A-Z0-9_]*)"', path.read_text()))
    return names


def environment_rows() -> set[str]:
    """The names in the first cells of protocol.md's table under "Environment of a job process"."""
    text = (DOCS / "protocol.md").read_text()
    section = text.split("## Environment of a job process", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| "):
            names |= set(re.findall(r"NVSHARE_[A-Z][A-Z0-9_]*", line.split("|")[1]))
    return names


def test_the_hook_reads_the_settings_this_test_knows_of():
    names = hook_settings()
    # a few that must be there: if the pattern stopped finding them, the tests below would say nothing
    assert {"NVSHARE_SOCKET", "NVSHARE_LOG_LEVEL", "NVSHARE_PROMPT_LEAK_MS", "NVSHARE_SWAP"} <= names, names
    assert len(names) >= 20, names


def test_every_setting_of_the_hook_has_a_row_in_the_protocols_environment_table():
    missing = sorted(hook_settings() - environment_rows())
    assert not missing, f"docs/protocol.md's environment table lacks {missing}"


def test_every_setting_of_the_hook_is_in_the_user_guide_or_the_admin_guide():
    guides = (DOCS / "user-guide.md").read_text() + (DOCS / "admin-guide.md").read_text()
    missing = sorted(n for n in hook_settings() if not re.search(rf"\b{n}\b", guides))
    assert not missing, f"neither guide names {missing}"
