"""Rewrite one "## " section of docs/benchmarks.md, leaving the others as they are."""
from __future__ import annotations

import re
from pathlib import Path


def replace_section(path: Path, heading: str, section: str) -> None:
    """Put `section` (which starts with "## <heading>...") where the section whose heading starts
    with `heading` is, up to the next "## " heading; append it when there is none."""
    current = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^## {re.escape(heading)}\b.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(current):
        current = pattern.sub(lambda _: section.rstrip("\n") + "\n\n", current, count=1)
    else:
        current = current.rstrip("\n") + "\n\n" + section
    path.write_text(current.rstrip("\n") + "\n")
