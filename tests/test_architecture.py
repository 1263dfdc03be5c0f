"""The package's shape, checked: no import cycles (function-local and ``TYPE_CHECKING`` imports
counted), no pickleshard module imported inside a function, a short top level, small modules.

The layers themselves (which package may import which) are the import-linter contract in
``pyproject.toml``, run by ``make lint``; this file checks what that contract cannot see.
Imports are read from the source with :mod:`ast` (no module is imported), the compiled core's
from its ``.pyx``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pickleshard

PACKAGE = Path(pickleshard.__file__).parent
ROOT = "pickleshard"
CORE = f"{ROOT}._cscan"  # the compiled core: loaded by name in picklekit.compiled
MAX_TOP_LEVEL = 8
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _target(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, tree: ast.AST, is_package: bool) -> Iterator[tuple[ast.stmt, str]]:
    """Every import of a pickleshard module in ``tree``, as ``(node, module imported)``."""
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _target(module, is_package, node)
            names = [f"{base}.{a.name}" for a in node.names]
            names = [n if n in MODULES else base for n in names]
        for name in names:
            while name not in MODULES and "." in name:
                name = name.rsplit(".", 1)[0]  # a name inside a module: the module
            if name.split(".")[0] == ROOT and name != module:
                yield node, name  # type: ignore[misc]


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for _, target in _imports(module, tree, path.name == "__init__.py"):
            edges[module].add(target)
    edges[f"{ROOT}.picklekit.compiled"].add(CORE)
    pyx = (PACKAGE / "_cscan.pyx").read_text()
    edges[CORE] = set()
    for line in re.findall(r"^from \.([\w.]+) import ([\w, ]+)", pyx, re.M):
        base = f"{ROOT}.{line[0]}"
        for name in line[1].split(","):
            sub = f"{base}.{name.split(' as ')[0].strip()}"
            edges[CORE].add(sub if sub in MODULES else base)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in edges:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    """Counting every import, wherever it is written (the package root excepted: importing any
    module runs ``pickleshard/__init__``, which re-exports the public names)."""
    edges = _graph()
    edges.pop(ROOT)
    for targets in edges.values():
        targets.discard(ROOT)
    assert _cycles(edges) == []


def test_no_pickleshard_module_is_imported_inside_a_function() -> None:
    """A function-local import hides a dependency (and a cycle) from the contract; optional
    third-party backends (pyarrow, lmdb, fsspec, torch...) stay lazy, with their install hint."""
    offenders = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                body = ast.Module(body=fn.body, type_ignores=[])
                for node, target in _imports(module, body, path.name == "__init__.py"):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {target}")
    assert sorted(set(offenders)) == []


def test_a_short_top_level() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


def test_modules_stay_small() -> None:
    """One concern a module: none past ~450 lines (the compiled core, one file by Cython's
    needs, excepted)."""
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
