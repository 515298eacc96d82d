"""The plan of a fused matmul (``wse.fused_matmul``): the matmul's own plan (``plans.matmul``),
its weights scaled by columns where they are kept, and its epilogue applied to each tile of the
product as the tile is finished, instead of elementwise kernels passing over the result.

* The scales (a batch norm's gain folded into the filter) multiply B's columns where B is
  kept: a resident B once, when the program loads; a streamed B in MemoryX, which sends the
  scaled rows. No run pays for them; a resident scale keeps its vector on one row of the
  product's columns.
* The extras come to the product's tiles as an elementwise op's operands do, but a vector of
  columns that is a weight or constant (a bias) is kept on every PE of the product's grid,
  beside its tile of B, where a run would multicast it along the rows; one computed on the
  wafer (a folded normalization's shift) is multicast, a residual arrives in the product's
  layout.
* The epilogue's ops cost their vector cycles on the product's tile, as elementwise kernels
  would, but a first step that adds an extra to the product: the accumulator starts at the
  extra instead of zero (``C = A B + C``: a bias, a residual) and the sum costs nothing more.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import NO_TRAFFIC
from cgc.machine.plans.elementwise import brought, op_cycles
from cgc.machine.plans.kernel import (
    STREAM,
    WAFER,
    Cost,
    Kernel,
    Operand,
    Plan,
    PlanRequest,
    arrival,
)
from cgc.machine.plans.matmul import Matmul

Step = tuple[str, list[int]]
"""An epilogue step as its instruction holds it: the op and its operands' indices among the
product, the extras and the steps before."""


class FusedMatmul(Kernel):
    """A matmul with its weights scaled by columns and an epilogue on its product."""

    def plan(self, q: PlanRequest) -> Plan:
        a, b = q.operands[:2]
        count = q.attrs["scales"]
        scales, extras = q.operands[2 : 2 + count], q.operands[2 + count :]
        ((shape, dtype),) = q.results
        # B is one matrix: the product folds (A arrives folded as the matmul alone takes it),
        # and the result is the same matrix in another view
        rows = a.shape[:-1] if len(a.shape) >= 2 else (1,)
        product = ((*rows, b.shape[-1]), dtype)
        core = Matmul("matmul").plan(replace(q, operands=(a, b), attrs={}, results=(product,)))
        held = core.outputs[0]
        product_at = Layout(tuple(shape), dtype, held.row0, held.col0, held.h, held.w, fold=True)
        kept = [_scale_layout(scale, product_at) for scale in scales]
        inputs: list[Layout | None] = [*core.inputs, *kept]
        # the epilogue and the result are where an elementwise op would put them: an
        # algorithm that leaves its product elsewhere (MeshGEMV's vector) moves it there
        out = Layout.on(shape, dtype, q.rect, fold=True)
        traffic = arrive = arrival(Operand(tuple(shape), dtype, WAFER, product_at), out)
        scratch = out.tile_bytes if arrive.cycles else 0
        for scale, at in zip(scales, kept, strict=True):
            moved = NO_TRAFFIC if at is None else arrival(scale, at)
            traffic, arrive = traffic + moved, arrive + moved
        brought_extras = [brought(operand, out, beside=True) for operand in extras]
        for extra in brought_extras:
            traffic, arrive = traffic + extra.traffic, arrive + extra.arrival
            scratch += extra.scratch
            inputs.append(extra.layout)
        steps: list[Step] = [(name, refs) for name, refs in q.attrs["epilogue"]]
        # the accumulator starting at an extra adds it without an op of its own
        free = 1 if steps and starts_accumulator(*steps[0], len(extras)) else 0
        extra_layouts = [extra.layout for extra in brought_extras]
        compute = sum(
            op_cycles(name, out.tile_elements, _divisor(name, refs, extra_layouts), dtype, q.target)
            for name, refs in steps[free:]
        )
        cost = core.cost
        return Plan(
            tuple(inputs),
            (out,),
            Cost(
                cycles=cost.cycles + traffic.cycles + compute,
                flops=cost.flops + prod(shape) * (len(steps) - free),
                fmacs=cost.fmacs,
                traffic=cost.traffic + traffic,
                scratch_bytes=cost.scratch_bytes + scratch,
                compute_cycles=cost.compute_cycles + compute,
                arrival_cycles=cost.arrival_cycles + arrive.cycles,
            ),
            {**core.detail, "epilogue": [name for name, _ in steps]},
            core.resident_tiles,
        )


def starts_accumulator(name: str, refs: list[int], extras: int) -> bool:
    """Whether an epilogue's first step adds an extra to the product: the accumulator can
    start at the extra."""
    if name != "add":
        return False
    product, extra = sorted(refs)
    return product == 0 and 1 <= extra <= extras


def _divisor(name: str, refs: list[int], extras: list[Layout]) -> int | None:
    """The elements a PE holds of a division's divisor when it is an extra (a vector of the
    columns, a scalar); None otherwise."""
    if name == "div" and 1 <= refs[1] <= len(extras):
        return extras[refs[1] - 1].tile_elements
    return None


def _scale_layout(scale: Operand, out: Layout) -> Layout | None:
    """Where a scale is kept: a stream is consumed as B's rows arrive (None); else on the
    first row of the product's columns."""
    if scale.source == STREAM:
        return None
    return Layout(scale.shape, scale.dtype, out.row0, out.col0, 1, out.w)
