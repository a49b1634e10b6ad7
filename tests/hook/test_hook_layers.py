"""libnvshare.so's files call one way (issue 23, docs/design-hook.md "Layers and files").

Each csrc/*.c is compiled to an object with the build's own flags (buildtools/hook_build.py); an edge
A -> B is drawn wherever an undefined symbol of A.o (a function or a global) is defined in B.o. The
graph must have no cycle, and every edge must go down the layer order that docs/design-hook.md
lists: that block is the one place the order is written, so the document and the code agree.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "csrc"
DESIGN = REPO / "docs" / "design-hook.md"
LAYERS_MARK = "<!-- hook layers: read by tests/hook/test_hook_layers.py -->"

sys.path.insert(0, str(REPO / "buildtools"))
from hook_build import HOOK_CFLAGS  # noqa: E402
from helpers_imports import find_cycle  # noqa: E402


def documented_layers() -> list[list[str]]:
    """The rows of the layer block in docs/design-hook.md, top first."""
    text = DESIGN.read_text()
    assert LAYERS_MARK in text, f"{DESIGN} has no layer block ({LAYERS_MARK})"
    block = text.split(LAYERS_MARK, 1)[1].split("```", 2)[1]
    return [line.split() for line in block.splitlines() if line.strip()]


def symbols(obj: Path) -> tuple[set[str], set[str]]:
    """(defined global symbols, undefined symbols) of an object file."""
    out = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == "U":
            undefined.add(fields[1])
        elif len(fields) == 3 and fields[1].isupper() and fields[1] != "U":
            defined.add(fields[2])
    return defined, undefined


def file_graph(objects: dict[str, Path]) -> dict[str, set[str]]:
    """{source: {sources whose definitions it uses}}."""
    defined, undefined = {}, {}
    for name, obj in objects.items():
        defined[name], undefined[name] = symbols(obj)
    owner = {}
    for name, syms in defined.items():
        for sym in syms:
            assert sym not in owner, f"{sym} is defined in both {owner[sym]} and {name}"
            owner[sym] = name
    return {name: {owner[s] for s in undefined[name] if s in owner and owner[s] != name}
            for name in objects}


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> dict[str, set[str]]:
    if shutil.which("cc") is None or shutil.which("nm") is None:
        pytest.skip("needs cc and nm")
    out = tmp_path_factory.mktemp("objects")
    objects = {}
    for source in sorted(CSRC.glob("*.c")):
        obj = out / (source.stem + ".o")
        built = subprocess.run(["cc", *HOOK_CFLAGS, f"-I{CSRC}", "-c", str(source), "-o", str(obj)],
                               capture_output=True, text=True)
        assert built.returncode == 0, built.stderr
        objects[source.name] = obj
    return file_graph(objects)


def test_the_cycle_finder_names_a_cycle():
    assert find_cycle({"a.c": {"b.c"}, "b.c": {"c.c"}, "c.c": {"a.c"}}) == ["a.c", "b.c", "c.c", "a.c"]
    assert find_cycle({"a.c": {"b.c", "c.c"}, "b.c": {"c.c"}, "c.c": set()}) is None


def test_the_files_of_the_hook_call_in_no_circle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "the hook's files call in a circle: " + " -> ".join(cycle)


def test_every_call_goes_down_the_documented_layers(graph):
    layers = documented_layers()
    row = {}
    for i, files in enumerate(layers):
        for name in files:
            assert name not in row, f"{name} is listed twice in {DESIGN.name}'s layer block"
            row[name] = i
    assert set(row) == set(graph), (
        f"{DESIGN.name}'s layer block and csrc/*.c differ: not listed {sorted(set(graph) - set(row))}, "
        f"listed but absent {sorted(set(row) - set(graph))}")
    print("hook layers, top to bottom:")
    for i, files in enumerate(layers):
        calls = sorted(set().union(*(graph[f] for f in files)))
        print(f"  {i + 1:2d}  {' '.join(files):24s} calls {' '.join(calls) or 'nothing of the hook'}")
    upward = [f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a]) if row[b] <= row[a]]
    assert not upward, "calls that do not go down the layers of docs/design-hook.md: " + ", ".join(upward)
