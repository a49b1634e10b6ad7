"""The package's import graph, read from its source with ast: what tests/unit/test_layers.py holds
against docs/design-scheduler.md's layers, and tests/unit/test_house.py against the entry points;
and find_cycle, which tests/hook/test_hook_layers.py uses for the hook's files too.

A module is named by its dotted name (`nvshare_slurm.policy.gpustate`; a package by its own name, for
its __init__.py). An import of a name that is a module (`from ..wire import proto`) is an arrow to
that module; of any other name (`from .. import __version__`, `from .gpustate import GpuState`), to
the module or package it is taken from. Imports inside functions count like those at the top: they
run too, only later. Imports under `if TYPE_CHECKING:` never run; they are kept apart.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Imports:
    """One module's arrows to modules of its package."""
    runtime: set[str] = field(default_factory=set)
    typing: set[str] = field(default_factory=set)     # only under `if TYPE_CHECKING:`
    # the names the TYPE_CHECKING imports bind, for the check that they are used in annotations only
    typing_names: set[str] = field(default_factory=set)


def module_names(package: Path) -> dict[str, Path]:
    """{dotted name: file} of every module and package under `package` (a directory)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(source: str, name: str, is_package: bool, known: set[str]) -> Imports:
    """The arrows of the module `name` (its text `source`) to the modules in `known`."""
    here = name if is_package else name.rpartition(".")[0]
    found = Imports()

    def targets(node: ast.Import | ast.ImportFrom) -> set[str]:
        if isinstance(node, ast.Import):
            return {alias.name for alias in node.names if alias.name in known}
        if node.level:
            base = here.split(".")
            base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        if module not in known:
            return set()
        return {f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names}

    def bound(node: ast.Import | ast.ImportFrom) -> set[str]:
        return {(a.asname or a.name).split(".")[0] for a in node.names}

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child.test):
                for stmt in child.body:
                    visit_one(stmt, True)
                for stmt in child.orelse:
                    visit_one(stmt, typing_only)
                continue
            visit_one(child, typing_only)

    def visit_one(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            arrows = targets(node) - {name}
            if typing_only:
                found.typing |= arrows
                if arrows:
                    found.typing_names |= bound(node)
            else:
                found.runtime |= arrows
        visit(node, typing_only)

    visit(ast.parse(source), False)
    found.typing -= found.runtime
    return found


def package_graph(package: Path) -> dict[str, Imports]:
    """{module: its Imports} for every module and package under `package`."""
    names = module_names(package)
    return {name: imports_of(path.read_text(), name, path.name == "__init__.py", set(names))
            for name, path in names.items()}


def used_at_run_time(source: str, names: set[str]) -> list[str]:
    """Where a module uses one of `names` outside annotations and TYPE_CHECKING blocks, as
    ["line N: name"]: names imported for type checking only would be unbound there."""
    uses: list[str] = []

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node.test):
            parts: list[ast.AST] = list(node.orelse)
        elif isinstance(node, ast.arg):
            parts = []                                    # its annotation is all it holds
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None),
                     *node.decorator_list, *node.body]     # not its annotations
        elif isinstance(node, ast.AnnAssign):
            parts = [node.target] + ([node.value] if node.value is not None else [])
        else:
            if isinstance(node, ast.Name) and node.id in names:
                uses.append(f"line {node.lineno}: {node.id}")
            parts = list(ast.iter_child_nodes(node))
        for part in parts:
            walk(part)

    walk(ast.parse(source))
    return uses


def has_postponed_annotations(source: str) -> bool:
    return any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
               and any(a.name == "annotations" for a in node.names) for node in ast.parse(source).body)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None
