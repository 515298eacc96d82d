"""Small IR modules for tests, built in Python (not parsed), and the stats contract."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.builder import ImplicitBuilder
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, NameLoc, NoneAttr, StringAttr, TensorType, f32
from xdsl.ir import Attribute, Block, Region, SSAValue

from cgc.dialects import context

STATS_FIELDS = (
    "mode",
    "target",
    "num_csx",
    "batch_size",
    "simulated_cycles",
    "simulated_seconds",
    "samples_per_second",
    "pe_utilization",
    "peak_pe_sram_bytes",
)
"""The fields DESIGN.md promises in ``cgc run --stats-json``."""


def T(*shape: int, el: Attribute = f32) -> TensorType:
    """``tensor<shape x el>``."""
    return TensorType(el, shape)


def loc(name: str) -> NameLoc:
    """``loc("name")``."""
    return NameLoc(StringAttr(name), NoneAttr())


def build(arg_types: Sequence[Attribute], body: Callable[..., Sequence[SSAValue]]) -> ModuleOp:
    """A module with ``func.func @main``; ``body(*args)`` builds the ops and returns results."""
    block = Block(arg_types=arg_types)
    with ImplicitBuilder(block):
        results = list(body(*block.args))
        func.ReturnOp(*results)
    fn = func.FuncOp("main", (list(arg_types), [r.type for r in results]), Region(block))
    return ModuleOp([fn])


def apply(module: ModuleOp, *passes) -> ModuleOp:
    """Runs passes in order, verifying after each."""
    ctx = context()
    for p in passes:
        p.apply(ctx, module)
        module.verify()
    return module
