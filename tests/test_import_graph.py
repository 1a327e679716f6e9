"""Boundaries: no import cycles between modules, nor between the top-level packages.

The graph is built with ``ast`` from the sources (every ``import`` statement, including those
inside functions: a deferred import is still a dependency), over ``planner``, ``cli``, ``models``
and ``clusters``. Dependencies point one way: ``cli -> planner, models, clusters``;
``models, clusters -> planner``; ``planner`` imports none of them (and never click or rich).
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("planner", "cli", "models", "clusters")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> nx.DiGraph:
    modules = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    up = here[:len(here) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # "from pkg import module" depends on the module, "from mod import name" on
                # mod (a package's __init__ runs for any submodule import: not an edge)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            for target in targets:
                # the longest known module the import names
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph.add_edge(name, target)
    return graph


GRAPH = import_graph()


def test_graph_is_real():
    assert GRAPH.number_of_nodes() > 60
    assert GRAPH.has_edge("planner.solve.search", "planner.solve.inner")
    assert GRAPH.has_edge("cli.commands", "planner.solve.search")


def test_no_module_cycles():
    cycles = [sorted(c) for c in nx.strongly_connected_components(GRAPH) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_a_cycle_is_detected(tmp_path):
    graph = nx.DiGraph([("planner.a", "planner.b"), ("planner.b", "planner.a")])
    assert [len(c) for c in nx.strongly_connected_components(graph)] == [2]


def test_no_package_cycles():
    packages = nx.DiGraph()
    for a, b in GRAPH.edges:
        pa, pb = a.split(".")[0], b.split(".")[0]
        if pa != pb:
            packages.add_edge(pa, pb)
    cycles = [sorted(c) for c in nx.strongly_connected_components(packages) if len(c) > 1]
    assert not cycles, f"package cycles: {cycles}"
    assert not any(packages.has_edge("planner", other) for other in ("cli", "models", "clusters"))


@pytest.mark.parametrize("ui", ["click", "rich"])
def test_planner_never_imports_ui(ui):
    offenders = []
    for path in (ROOT / "planner").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == ui or n.startswith(ui + ".") for n in names):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders
