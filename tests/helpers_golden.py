"""Golden files (tests/data/golden/) of the text users read, shared by the test modules that render it.
NVSHARE_UPDATE_GOLDEN=1 rewrites them: review the diff."""
from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("NVSHARE_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} missing: run with NVSHARE_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(encoding="utf-8")
