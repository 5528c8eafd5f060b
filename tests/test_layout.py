"""The package's shape: modules import downwards only (no import circle, type-only imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Top-level folders and the package each is installed as (pyproject's package-dir mapping).
FOLDERS = {"exonet": "exonet", "strategies": "exonet.strategies", "scenarios": "exonet.presets"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [*package.split("."), *path.relative_to(ROOT / folder).with_suffix("").parts]
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the exonet modules it imports anywhere in its source (function-level and TYPE_CHECKING too).

    ``from package import name`` depends on ``package.name`` when that is a module, else on the package.
    """
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, *([node.module] if node.module else [])])
                subs = {f"{base}.{alias.name}" for alias in node.names} & modules.keys()
                targets.update(subs)
                if len(subs) < len(node.names):
                    targets.add(base)
        deps = set()
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_circle_among_exonet_modules():
    graph = import_graph()
    assert "exonet.runtime.run" in graph and "exonet.strategies.base" in graph  # the walk sees the whole tree
    assert "exonet.runtime.node" in graph["exonet.runtime.run"]
    assert cycles(graph) == []


def test_the_top_level_keeps_the_face_the_shared_formats_and_the_leaf_utilities():
    """Everything else lives in the folder of its job (estimate/, study/, runtime/, validate/ ...)."""
    top = sorted(p.stem for p in (ROOT / "exonet").glob("*.py"))
    assert len(top) <= 12, top
