"""The Python side stays a size a reader can hold (STYLE.md habit 9, issue 23): no class in the
package over 500 lines, no module over 700. Past them, split by concern before adding more.

And the maps stay whole (issue 41): every module of the package has its row in
docs/design-scheduler.md's module table, and every csrc/*.c its row in docs/design-hook.md's file
table, so that a reader who starts from the docs finds every part.

And the entry points stay thin (issue 41): none imports another (what two share has a module of
its own), the Slurm-facing ones load nothing of policy/ and no asyncio frame reader, and what each
loads is what docs/design-scheduler.md says. (tests/unit/test_layers.py holds every import to the
layers drawn there.)"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from helpers_imports import package_graph

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "nvshare_slurm"
MAX_CLASS_LINES = 500
MAX_MODULE_LINES = 700
MODULES = sorted(PACKAGE.rglob("*.py"))
SCHEDULER_DOC = REPO / "docs" / "design-scheduler.md"
HOOK_DOC = REPO / "docs" / "design-hook.md"


def test_the_package_is_found():
    assert len(MODULES) > 20 and (PACKAGE / "daemon.py") in MODULES


def module_id(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


@pytest.mark.parametrize("module", MODULES, ids=module_id)
def test_no_module_or_class_outgrows_a_reader(module):
    source = module.read_text()
    assert source.count("\n") <= MAX_MODULE_LINES, f"{module.name}: {source.count(chr(10))} lines"
    too_big = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.ClassDef) and node.end_lineno is not None
               and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES]
    assert too_big == [], f"{module.name}: classes over {MAX_CLASS_LINES} lines: {too_big}"


def table_rows(doc: Path, prefix: str) -> list[str]:
    """The paths named first in a table row of `doc` (`| \\`<prefix>...\\` | ... |`), in order."""
    pattern = re.compile(r"^\| `(" + re.escape(prefix) + r"[^`]+)` \|")
    return [m.group(1) for m in map(pattern.match, doc.read_text().splitlines()) if m]


def compare(named: list[str], present: set[str], doc: Path, what: str) -> None:
    twice = sorted({path for path in named if named.count(path) > 1})
    missing = sorted(present - set(named))
    stale = sorted(set(named) - present)
    assert not twice, f"{doc.name} has two rows for {twice}"
    assert not missing, f"{doc.name}'s {what} has no row for {missing}: add one saying what each is"
    assert not stale, f"{doc.name}'s {what} names {stale}, which do not exist"


def test_every_module_has_a_row_in_the_scheduler_design():
    """Entry points and Slurm-facing modules too; the path is the module's own, sub-package included."""
    present = {p.relative_to(REPO).as_posix() for p in MODULES if p.name != "__init__.py"}
    compare(table_rows(SCHEDULER_DOC, "nvshare_slurm/"), present, SCHEDULER_DOC, "module table")


def test_every_c_file_has_a_row_in_the_hook_design():
    named = table_rows(HOOK_DOC, "csrc/")
    present = {p.relative_to(REPO).as_posix() for p in (REPO / "csrc").glob("*.c")}
    compare([path for path in named if path.endswith(".c")], present, HOOK_DOC, "file table")
    gone = [path for path in named if not (REPO / path).exists()]
    assert not gone, f"{HOOK_DOC.name}'s file table names {gone}, which do not exist"


# ---- the entry points --------------------------------------------------------------------------

ENTRY_POINTS = sorted({target.split(":")[0].rsplit(".", 1)[1] for target in
                       tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
                       .values()})
GRAPH = package_graph(PACKAGE)     # {dotted module name: its imports}


def dotted(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_entry_points_are_found():
    assert {"daemon", "prolog", "epilog", "taskprolog", "container", "status"} <= set(ENTRY_POINTS)


@pytest.mark.parametrize("module", MODULES, ids=module_id)
def test_no_module_imports_an_entry_point(module):
    imports = GRAPH[dotted(module)]
    entries = {f"nvshare_slurm.{entry}" for entry in ENTRY_POINTS} - {dotted(module)}
    borrowed = sorted((imports.runtime | imports.typing) & entries)
    assert borrowed == [], f"{module_id(module)} imports the entry points {borrowed}: move what it " \
                           f"uses to a module of its own"


def loaded_modules(entry: str) -> set[str]:
    """The package's modules that importing nvshare_slurm.<entry> loads, in a fresh interpreter,
    named from the package (`policy.gpustate`); its packages' __init__.py not."""
    probe = (f"import sys, nvshare_slurm.{entry}\n"
             "print(' '.join(m.split('.', 1)[1] for m, mod in list(sys.modules.items()) "
             "if m.startswith('nvshare_slurm.') and not hasattr(mod, '__path__')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize("entry", ["prolog", "epilog", "taskprolog"])
def test_slurm_entry_points_load_no_policy(entry):
    loaded = loaded_modules(entry)
    policy = sorted(m for m in loaded if m.startswith("policy."))
    assert entry in loaded and policy == [], f"nvshare_slurm.{entry} loads policy modules {policy}"


@pytest.mark.parametrize("entry", [e for e in ENTRY_POINTS if e != "daemon"])
def test_only_the_daemon_loads_the_stream_reader(entry):
    assert "wire.proto" not in loaded_modules(entry), f"{entry}: use wire/wire.py, not wire/proto.py"


def documented_loads() -> dict[str, tuple[int, set[str]]]:
    """docs/design-scheduler.md's table of what each entry point loads: {entry: (modules, boxes)}."""
    row = re.compile(r"^\| `(\w+)` \| (\d+) \| ([^|]*) \|$")
    return {m[1]: (int(m[2]), set(re.findall(r"(\w+)/", m[3].split("(")[0])))
            for m in map(row.match, SCHEDULER_DOC.read_text().splitlines()) if m}


def test_every_entry_point_has_a_row_of_what_it_loads():
    assert sorted(documented_loads()) == ENTRY_POINTS, \
        f"{SCHEDULER_DOC.name}'s table of what the entry points load names {sorted(documented_loads())}"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_each_entry_point_loads_what_the_design_says(entry):
    loaded = loaded_modules(entry)
    boxes = {m.split(".")[0] + "/" for m in loaded if "." in m}
    count, documented = documented_loads()[entry]
    assert (len(loaded), boxes) == (count, {b + "/" for b in documented}), (
        f"nvshare_slurm.{entry} loads {len(loaded)} modules from {sorted(boxes)}; "
        f"{SCHEDULER_DOC.name} says {count} from {sorted(documented)}: update its table "
        f"(and keep the Slurm-facing ones light): {sorted(loaded)}")
