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
    "cgc.files": 1,
    "cgc.machine": 2,
    "cgc.options": 3,
    "cgc.dialects": 4,
    "cgc.runtime": 4,
    "cgc.frontends": 5,
    "cgc.passes": 5,
    "cgc.compiler": 6,
    "cgc.tools": 7,
    "cgc": 8,
    "cgc.cli": 9,
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
    """What ``path`` imports of cgc: modules, and names as ``module.name``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "cgc" or name.startswith("cgc.")}


def import_graph() -> nx.DiGraph:
    """Modules of cgc as nodes, an edge per import."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for imported in imports(path):
            # `from cgc.machine.hardware import dtypes` imports a module, `from cgc import compile`
            # a name of the module cgc
            target = imported if imported in modules else imported.rpartition(".")[0]
            if target in modules and target != name:
                graph.add_edge(name, target)
    return graph


GRAPH = import_graph()


def test_the_graph_is_read():
    # the check itself must see imports, inside functions too
    assert GRAPH.has_edge("cgc.runtime.vm", "cgc.machine.timing.cost")
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


def test_no_cycle_between_modules():
    # The edges are import statements; a package's node is its __init__. A module importing a
    # name through its package (`from cgc.machine.plans import Plan`) uses the __init__, and
    # an __init__ importing that module back is a real cycle (one of the two would run
    # half-initialized), so it counts. Python loading a package before its submodules is no
    # edge: the submodule uses none of the __init__'s names, and an __init__ importing its own
    # submodules is no cycle.
    assert sorted(sorted(cycle) for cycle in nx.simple_cycles(GRAPH)) == []


@pytest.mark.parametrize("module", ["cgc.tools.report", "cgc.tools.picture"])
def test_inspecting_an_artifact_imports_no_runtime(module):
    # cgc inspect estimates with the floor's timing models, the ones the simulator asks
    assert sorted(m for m in nx.descendants(GRAPH, module) if part(m) == "cgc.runtime") == []


def test_the_floor_imports_nothing_above_it():
    above = sorted(
        f"{a} -> {b}"
        for a, b in GRAPH.edges
        if part(a) == "cgc.machine" and part(b) not in ("cgc.machine", "cgc.errors", "cgc.files")
    )
    assert above == []


ROOMS = {
    "hardware": 0,
    "training": 0,
    "reference": 1,
    "movement": 2,
    "sparse": 3,
    "plans": 4,
    "program": 4,
    "timing": 5,
}
"""The floor's rooms (``cgc.machine``'s sub-packages) and their levels: a room imports only
rooms of a lower level; the floor's front door (``cgc.machine``) stands above them all."""


def room(module: str) -> str | None:
    pieces = module.split(".")
    return pieces[2] if len(pieces) > 2 and pieces[:2] == ["cgc", "machine"] else None


def test_the_floor_is_in_rooms():
    loose = sorted(
        m for m in GRAPH if part(m) == "cgc.machine" and m != "cgc.machine" and room(m) not in ROOMS
    )
    assert loose == []


def test_no_room_of_the_floor_imports_a_room_above_it():
    upward = sorted(
        f"{a} -> {b}"
        for a, b in GRAPH.edges
        if room(a) in ROOMS
        and room(a) != room(b)
        and part(b) == "cgc.machine"
        and (room(b) not in ROOMS or ROOMS[room(b)] >= ROOMS[room(a)])
    )
    assert upward == []


def test_the_runtime_never_imports_the_compiler_or_the_ir():
    reached = nx.descendants(GRAPH, "cgc.runtime.cluster") | nx.descendants(
        GRAPH, "cgc.runtime.trainer"
    )
    assert (
        sorted(
            m
            for m in reached
            if part(m)
            not in ("cgc.machine", "cgc.errors", "cgc.files", "cgc.options", "cgc.runtime")
        )
        == []
    )


def a_pass(module: str) -> str | None:
    """The pass a module of ``cgc.passes`` belongs to (its module, or its package)."""
    pieces = module.split(".")
    return pieces[2] if len(pieces) > 2 and pieces[:2] == ["cgc", "passes"] else None


def test_no_pass_imports_another_pass():
    passes = {a_pass(m) for m in GRAPH} - {None}
    assert len(passes) == 14  # one module or package per pass, nothing else
    assert (
        sorted(
            f"{a} -> {b}"
            for a, b in GRAPH.edges
            if a_pass(a) and a_pass(b) and a_pass(a) != a_pass(b)
        )
        == []
    )
