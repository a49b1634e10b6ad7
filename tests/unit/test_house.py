"""The Python side stays a size a reader can hold (STYLE.md habit 9, issue 23): no class in the
package over 500 lines, no module over 700. Past them, split by concern before adding more."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nvshare_slurm"
MAX_CLASS_LINES = 500
MAX_MODULE_LINES = 700
MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_package_is_found():
    assert len(MODULES) > 20 and (PACKAGE / "daemon.py") in MODULES


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.name)
def test_no_module_or_class_outgrows_a_reader(module):
    source = module.read_text()
    assert source.count("\n") <= MAX_MODULE_LINES, f"{module.name}: {source.count(chr(10))} lines"
    too_big = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.ClassDef) and node.end_lineno is not None
               and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES]
    assert too_big == [], f"{module.name}: classes over {MAX_CLASS_LINES} lines: {too_big}"
