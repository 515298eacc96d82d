"""The data flow of cgc, read from its imports: frontend -> IR -> passes -> lowering ->
artifact -> runtime, every package standing on the machine floor, no arrow upward and no
cycle between packages.

Every ``import`` statement of every module counts, inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent / "cgc"

LEVELS = {
    "cgc.errors": 0,
    "cgc.version": 0,
    "cgc.machine": 1,
    "cgc.dialects": 2,
    "cgc.runtime": 2,
    "cgc.frontends": 3,
    "cgc.passes": 3,
    "cgc.compiler": 4,
    "cgc.tools": 5,
    "cgc": 6,
    "cgc.cli": 7,
}
"""Each part's level: a part may import only parts of a lower level (and itself)."""


def part(module: str) -> str:
    """The part of cgc a module belongs to: its package, or a top-level module."""
    pieces = module.split(".")
    name = ".".join(pieces[:2])
    return name if name in LEVELS else "cgc"


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT.parent).with_suffix("")
    pieces = list(relative.parts)
    if pieces[-1] == "__init__":
        pieces.pop()
    return ".".join(pieces)


def imports(path: Path) -> set[str]:
    """The cgc modules ``path`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "cgc" or name.startswith("cgc.")}


def import_graph() -> nx.DiGraph:
    """Modules of cgc as nodes, an edge per import."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for imported in imports(path):
            # `from cgc.machine import dtypes` imports the module cgc.machine.dtypes
            target = imported if imported in modules else imported.rpartition(".")[0]
            if target in modules and target != name:
                graph.add_edge(name, target)
    return graph


GRAPH = import_graph()


def test_the_graph_is_read():
    # the check itself must see imports, inside functions too
    assert GRAPH.has_edge("cgc.runtime.vm", "cgc.machine.cost")
    assert GRAPH.has_edge("cgc.cli", "cgc.compiler.driver")
    assert len(GRAPH) > 60


@pytest.mark.parametrize("name", sorted(LEVELS))
def test_no_arrow_upward(name):
    upward = sorted(
        f"{a} -> {b}"
        for a, b in GRAPH.edges
        if part(a) == name and part(b) != name and LEVELS[part(b)] >= LEVELS[name]
    )
    assert upward == []


def test_no_cycle_between_parts():
    parts = nx.DiGraph((part(a), part(b)) for a, b in GRAPH.edges if part(a) != part(b))
    assert list(nx.simple_cycles(parts)) == []


def test_the_floor_imports_nothing_above_it():
    above = sorted(
        f"{a} -> {b}"
        for a, b in GRAPH.edges
        if part(a) == "cgc.machine" and part(b) not in ("cgc.machine", "cgc.errors")
    )
    assert above == []


def test_the_runtime_never_imports_the_compiler_or_the_ir():
    reached = nx.descendants(GRAPH, "cgc.runtime.cluster") | nx.descendants(
        GRAPH, "cgc.runtime.trainer"
    )
    assert (
        sorted(m for m in reached if part(m) not in ("cgc.machine", "cgc.errors", "cgc.runtime"))
        == []
    )


def test_no_pass_imports_another_pass():
    passes = [m for m in GRAPH if m.startswith("cgc.passes.")]
    assert len(passes) == 11  # one module per pass, nothing else
    assert sorted(f"{a} -> {b}" for a, b in GRAPH.edges if a in passes and b in passes) == []
