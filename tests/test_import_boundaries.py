"""The package rules of STYLE.md, held on every module's imports (those inside functions too, read
with ``ast``): no import cycle among the modules; ``forensics`` imports nothing of ``replay``,
``reports`` or ``kvforensics``; an adapter (a module or package of ``forensics.adapters`` other than
``base``) imports of the project only the adapters' contract ``forensics.adapters.base``, its own
modules and the leaf modules ``forensics.ids`` and ``forensics.errors`` (which import nothing of the
project), and besides them only the standard library and the declared dependencies."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("forensics", "replay", "reports", "kvforensics")
UPPER = ("replay", "reports", "kvforensics")
ADAPTERS = "forensics.adapters"
#: Modules of forensics that import nothing of the project, which adapters may use: the id types
#: (a DP pool's node name) and the error hierarchy.
LEAVES = ("forensics.ids", "forensics.errors")


class Import(NamedTuple):
    """One import statement's target: a module of the project by its name, or an outside one by
    its top-level name; where it is written."""

    module: str
    project: bool
    line: int


def _modules() -> dict[str, Path]:
    """Every module of the project's packages, by its dotted name (a package by its own)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[Import]:
    """What the module imports, every statement wherever it is (a function's body, ``TYPE_CHECKING``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            # (``from a import b``: the module a.b where there is one, else a name of a)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in dict.fromkeys(targets):  # (``from a import b, c``, two names of a: one import)
            project = target.split(".")[0] in PACKAGES
            yield Import(target if project else target.split(".")[0], project, node.lineno)


IMPORTS = {name: list(_imports(name, path)) for name, path in MODULES.items()}


def _where(name: str, imp: Import) -> str:
    return f"{MODULES[name].relative_to(ROOT)}:{imp.line}: {name} imports {imp.module}"


def _cycles() -> list[list[str]]:
    """The import cycles among the project's modules: each strongly connected group of more than one
    module (or a module importing itself), by Tarjan's algorithm."""
    graph = {name: sorted({i.module for i in imports if i.project and i.module in MODULES})
             for name, imports in IMPORTS.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph[v]:
                groups.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for v in graph:
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return groups


def _cycle_text(group: list[str]) -> str:
    """One cycle through a group, each step where it is written."""
    members = set(group)
    path, at = [group[0]], group[0]
    seen = {at}
    steps = []
    while True:
        imp = next(i for i in IMPORTS[at] if i.module in members and (i.module == group[0] or i.module not in seen))
        steps.append(_where(at, imp))
        if imp.module == group[0]:
            break
        at = imp.module
        seen.add(at)
        path.append(at)
    return " -> ".join([*path, group[0]]) + "\n    " + "\n    ".join(steps)


def test_no_module_imports_another_that_imports_it_back() -> None:
    cycles = _cycles()
    assert not cycles, "import cycles:\n" + "\n".join(_cycle_text(group) for group in cycles)


def test_forensics_imports_nothing_of_replay_reports_or_kvforensics() -> None:
    upward = [_where(name, imp) for name, imports in IMPORTS.items() if name.split(".")[0] == "forensics"
              for imp in imports if imp.project and imp.module.split(".")[0] in UPPER]
    assert not upward, "forensics imports upward:\n" + "\n".join(upward)


def _declared() -> set[str]:
    """The top-level names the declared dependencies (pyproject's ``dependencies``) install."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {_normal(re.split(r"[\s<>=!~;\[(]", spec, maxsplit=1)[0]) for spec in project["dependencies"]}
    return {top for top, dists in importlib.metadata.packages_distributions().items()
            if any(_normal(d) in names for d in dists)}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _adapter_of(name: str) -> str | None:
    """The adapter a module belongs to (``forensics.adapters.sglang`` for its modules), None for
    the registry, the contract and any module outside the adapters."""
    parts = name.split(".")
    if parts[:2] != ADAPTERS.split(".") or len(parts) < 3 or parts[2] == "base":
        return None
    return ".".join(parts[:3])


def test_an_adapter_imports_only_the_contract_its_own_modules_and_declared_dependencies() -> None:
    outside = set(sys.stdlib_module_names) | _declared()
    wrong = []
    for name, imports in IMPORTS.items():
        if name != ADAPTERS and not name.startswith(ADAPTERS + "."):
            continue
        adapter = _adapter_of(name)
        for imp in imports:
            if not imp.project:
                ok = imp.module in outside
            elif adapter is None:  # the registry and the contract: the adapters, and the leaves
                ok = imp.module.startswith(ADAPTERS + ".") or imp.module in LEAVES
            else:
                ok = imp.module in (f"{ADAPTERS}.base", *LEAVES) or _adapter_of(imp.module) == adapter
            if not ok:
                wrong.append(_where(name, imp))
    assert not wrong, "adapters import what they may not:\n" + "\n".join(wrong)


def test_the_leaves_adapters_may_import_import_nothing_of_the_project() -> None:
    wrong = [_where(name, imp) for name in LEAVES for imp in IMPORTS[name] if imp.project]
    assert not wrong, "\n".join(wrong)
