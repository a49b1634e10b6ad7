"""The package's modules import one way (issue 41, docs/design-scheduler.md "Who may call whom").

The boxes of docs/design-scheduler.md's layer block are the package's sub-packages (`policy/`), its
top-level modules (the entry points) and its own `__init__.py`, in rows, top row first. Every import
of one module of the package by another, at the top or inside a function, is an arrow (ast, through
tests/helpers_imports.py). An arrow stays inside its box or goes to a box on a lower row: never up,
never across a row (boxes on one row know nothing of each other, so the entry points import none of
each other). Inside a box, the modules import in no circle.

Imports under `if TYPE_CHECKING:` never run. They are counted apart and may close a circle inside a
box (that is what they are for), but they cross boxes only downwards too, and what they bind is used
in annotations only (with postponed annotations), never at run time.

That block is the one place the order is written, as docs/design-hook.md's is for csrc/
(tests/hook/test_hook_layers.py): the document and the code agree.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers_imports import (Imports, find_cycle, has_postponed_annotations, imports_of, module_names,
                             package_graph, used_at_run_time)

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "nvshare_slurm"
DESIGN = REPO / "docs" / "design-scheduler.md"
LAYERS_MARK = "<!-- scheduler layers: read by tests/unit/test_layers.py -->"


def documented_layers(text: str) -> list[list[str]]:
    """The rows of the layer block, top first: `daemon.py`, `policy/`, `__init__.py`."""
    assert LAYERS_MARK in text, f"{DESIGN} has no layer block ({LAYERS_MARK})"
    block = text.split(LAYERS_MARK, 1)[1].split("```", 2)[1]
    return [line.split() for line in block.splitlines() if line.strip()]


def box_of(module: str, packages: set[str]) -> str:
    """The box of a dotted module name: its sub-package (`policy/`), else its own file (`daemon.py`,
    `__init__.py` for the package itself)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return parts[1] + "/" if len(parts) > 2 or module in packages else parts[1] + ".py"


def against_layers(graph: dict[str, set[str]], box: dict[str, str], row: dict[str, int]) -> list[str]:
    """The arrows between boxes that do not go down a row, as "a -> b (box a row 2, box b row 2)"."""
    return [f"{a} -> {b} ({box[a]} on row {row[box[a]] + 1}, {box[b]} on row {row[box[b]] + 1})"
            for a in sorted(graph) for b in sorted(graph[a])
            if box[a] != box[b] and row[box[b]] <= row[box[a]]]


@pytest.fixture(scope="module")
def graph() -> dict[str, Imports]:
    return package_graph(PACKAGE)


@pytest.fixture(scope="module")
def layers(graph) -> tuple[dict[str, str], dict[str, int]]:
    """({module: its box}, {box: its row}), the block checked against the package's folders."""
    rows = documented_layers(DESIGN.read_text())
    row = {}
    for i, boxes in enumerate(rows):
        for name in boxes:
            assert name not in row, f"{name} is listed twice in {DESIGN.name}'s layer block"
            row[name] = i
    packages = {name for name, path in module_names(PACKAGE).items() if path.name == "__init__.py"}
    box = {module: box_of(module, packages) for module in graph}
    present = set(box.values())
    assert present == set(row), (
        f"{DESIGN.name}'s layer block and {PACKAGE.name}/ differ: not listed {sorted(present - set(row))}, "
        f"listed but absent {sorted(set(row) - present)}")
    return box, row


# ---- the checker, on graphs small enough to see -------------------------------------------------

def test_the_checker_names_an_arrow_up_and_one_across_a_row():
    assert [box_of(m, {"p.low"}) for m in ("p", "p.top", "p.low", "p.low.a")] == [
        "__init__.py", "top.py", "low/", "low/"]
    box = {"p.top": "top.py", "p.other": "other.py", "p.low.a": "low/", "p.low.b": "low/"}
    row = {"top.py": 0, "other.py": 0, "low/": 1}
    assert against_layers({"p.top": {"p.low.a"}, "p.low.a": {"p.low.b"}}, box, row) == []
    assert against_layers({"p.low.b": {"p.top"}}, box, row) == [
        "p.low.b -> p.top (low/ on row 2, top.py on row 1)"]
    assert against_layers({"p.top": {"p.other"}}, box, row) == [
        "p.top -> p.other (top.py on row 1, other.py on row 1)"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_reader_sees_every_kind_of_import(tmp_path):
    """Relative and absolute, a module or a name, at the top, in a function, under TYPE_CHECKING."""
    pkg = tmp_path / "p"
    for path in ("__init__.py", "top.py", "low/__init__.py", "low/a.py", "low/b.py", "mid/__init__.py",
                 "mid/c.py"):
        (pkg / path).parent.mkdir(parents=True, exist_ok=True)
        (pkg / path).write_text("")
    source = ("from __future__ import annotations\n"
              "from typing import TYPE_CHECKING\n"
              "from . import b\n"
              "from .. import VERSION\n"
              "if TYPE_CHECKING:\n"
              "    from ..mid.c import C\n"
              "def f(x: C) -> C:\n"
              "    from ..top import main\n"
              "    import p.mid.c\n"
              "    return main(x)\n")
    found = imports_of(source, "p.low.a", False, set(module_names(pkg)))
    assert found.runtime == {"p.low.b", "p", "p.top", "p.mid.c"}
    assert found.typing == set() and found.typing_names == {"C"}      # p.mid.c runs too, in f
    found = imports_of(source.replace("    import p.mid.c\n", ""), "p.low.a", False, set(module_names(pkg)))
    assert found.typing == {"p.mid.c"}
    assert used_at_run_time(source, {"C"}) == []
    assert used_at_run_time(source + "ALIAS = list[C]\nisinstance(1, C)\n", {"C"}) == [
        "line 11: C", "line 12: C"]
    assert module_names(pkg)["p.low"] == pkg / "low" / "__init__.py"


# ---- the package -------------------------------------------------------------------------------

def test_the_graph_is_found(graph):
    assert len(graph) > 40
    assert "nvshare_slurm.policy.gpustate" in graph["nvshare_slurm.daemon"].runtime


def test_every_arrow_goes_down_the_documented_layers(graph, layers):
    box, row = layers
    runtime = {m: imports.runtime for m, imports in graph.items()}
    typing = {m: imports.typing for m, imports in graph.items()}
    rows = documented_layers(DESIGN.read_text())
    packages = {m for m, path in module_names(PACKAGE).items() if path.name == "__init__.py"} - {PACKAGE.name}
    print(f"scheduler layers, top to bottom ({len(set(box.values()))} boxes on {len(rows)} rows):")
    for i, boxes in enumerate(rows):
        for name in boxes:
            modules = sorted(m for m in graph if box[m] == name and m not in packages)
            calls = sorted({box[t] for m in modules for t in runtime[m]} - {name})
            types = sorted({box[t] for m in modules for t in typing[m]} - {name} - set(calls))
            plural = "s" if len(modules) > 1 else " "
            print(f"  {i + 1}  {name:13s} {len(modules):2d} module{plural}, imports "
                  f"{' '.join(calls) or 'nothing of the package'}"
                  + (f"; for types only {' '.join(types)}" if types else ""))
    arrows = {(box[a], box[b]) for a in runtime for b in runtime[a] if box[a] != box[b]}
    typed = {(box[a], box[b]) for a in typing for b in typing[a] if box[a] != box[b]} - arrows
    print(f"  {len(arrows)} arrows between boxes, {len(typed)} more for types only; "
          f"{sum(map(len, runtime.values()))} imports between modules, "
          f"{sum(map(len, typing.values()))} more under TYPE_CHECKING")
    upward = against_layers(runtime, box, row)
    assert not upward, (f"imports against the layers of {DESIGN.name} (an arrow up, or across a row): "
                        + "; ".join(upward))
    upward = against_layers(typing, box, row)
    assert not upward, (f"TYPE_CHECKING imports against the layers of {DESIGN.name}: " + "; ".join(upward))


def test_the_modules_import_in_no_circle(graph):
    cycle = find_cycle({m: imports.runtime for m, imports in graph.items()})
    assert cycle is None, "modules of the package import in a circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("module", sorted(module_names(PACKAGE).items()), ids=lambda item: item[0])
def test_type_checking_imports_are_for_annotations_only(module, graph):
    name, path = module
    bound = graph[name].typing_names
    if not bound:
        return
    source = path.read_text()
    assert has_postponed_annotations(source), (f"{path.name} imports {sorted(bound)} under TYPE_CHECKING: "
                                               "it needs `from __future__ import annotations`")
    used = used_at_run_time(source, bound)
    assert used == [], f"{path.name} uses names it imports under TYPE_CHECKING at run time: {used}"


@pytest.mark.parametrize("init", sorted(p for p in PACKAGE.glob("*/__init__.py")),
                         ids=lambda p: p.parent.name)
def test_the_sub_packages_are_only_folders(init):
    """An import of a sub-package's module loads its __init__.py first: the TaskProlog's import time
    holds only while that loads nothing."""
    body = ast.parse(init.read_text()).body
    code = [node for node in body
            if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    assert code == [], f"{init.relative_to(REPO)} holds code; keep it empty"
