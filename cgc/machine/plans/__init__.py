"""Mesh kernels' plans: how each primitive runs on a rectangle of PEs, and what it costs.

A plan looks only at shapes and layouts: it decides where every operand must be and where the
results go, and counts the work (FMACs and vector-op cycles on the busiest PE) and the traffic
(wavelets per link, per PE ramp, hops) of every step. Plans are cached. The compiler's cost
queries and the simulator ask the same plans, so an estimate and a simulated run agree; the
simulator's arithmetic on the planned tiles is ``cgc.runtime.kernels``.

This module is the entry point: it holds the registry of kernels (``KERNELS``) and the cached
``plan``, and re-exports the vocabulary and the kernels of the modules it gathers:

* ``kernel``: operands, costs, plans, requests, the ``Kernel`` base and the helpers kernels
  share (arrival, multicast, reshape traffic);
* ``elementwise``: elementwise ops (a broadcast operand is multicast) and reductions
  (local, then a chain along the mesh rows or columns);
* ``epilogue``: a matmul with its weights scaled by columns and an epilogue on its product
  (``wse.fused_matmul``);
* ``matmul``: the soonest of SUMMA, split-K SUMMA, MeshGEMM and (for a resident B) the
  streaming kernel fed from inside its columns; the weight-streaming kernel when B streams in
  from MemoryX;
* ``attention``: fused attention and its gradient as a ring over the mesh rows, rotary
  embeddings;
* ``movement``: data movement (``flows`` counts the flows of the op's index map),
  pooling, col2im, gathers and scatters, scans and top-k.

A kernel's cycles split three ways, in this order of precedence: its arithmetic (compute),
bringing its operands where it needs them (arrival: relaid tensors, weights entering through
the edge), and the rest of its data movement that the arithmetic does not hide (broadcasts,
chains, gathers).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from functools import lru_cache
from typing import Any

from cgc.machine import reference
from cgc.machine.hardware.target import Target
from cgc.machine.movement.layout import Rect
from cgc.machine.plans.attention import Attention, AttentionGrad, CachedAttention, Rotary
from cgc.machine.plans.elementwise import OP_CYCLES, Elementwise, Reduce
from cgc.machine.plans.epilogue import FusedMatmul
from cgc.machine.plans.kernel import (
    RESIDENT,
    STREAM,
    WAFER,
    Attrs,
    Cost,
    Kernel,
    Operand,
    Plan,
    PlanRequest,
    Spec,
    arrival,
    multicast,
    reshape_traffic,
    vector_cycles,
)
from cgc.machine.plans.matmul import Matmul, MatmulTransposeA
from cgc.machine.plans.movement import (
    Broadcast,
    Col2Im,
    Indexed,
    Movement,
    Pool,
    Scan,
    Sort,
    patch_taps,
)

__all__ = [
    "KERNELS",
    "OP_CYCLES",
    "RESIDENT",
    "STREAM",
    "WAFER",
    "Attrs",
    "Broadcast",
    "Col2Im",
    "Cost",
    "Elementwise",
    "FusedMatmul",
    "Indexed",
    "Kernel",
    "Matmul",
    "MatmulTransposeA",
    "Movement",
    "Operand",
    "Plan",
    "PlanRequest",
    "Pool",
    "Reduce",
    "Scan",
    "Sort",
    "Spec",
    "arrival",
    "multicast",
    "patch_taps",
    "plan",
    "reshape_traffic",
    "vector_cycles",
]

KERNELS: dict[str, Kernel] = {
    **{name: Elementwise(name) for name in (*reference.UNARY, *reference.BINARY)},
    "select": Elementwise("select"),
    "cast": Elementwise("cast"),
    "bitcast": Elementwise("bitcast"),
    **{name: Reduce(name) for name in reference.REDUCE},
    "matmul": Matmul("matmul"),
    "matmul_transpose_a": MatmulTransposeA("matmul_transpose_a"),
    "fused_matmul": FusedMatmul("fused_matmul"),
    **{name: Movement(name) for name in reference.MOVEMENT if name != "broadcast_to"},
    "broadcast_to": Broadcast("broadcast_to"),
    "one_hot": Broadcast("one_hot"),
    "max_pool": Pool("max_pool"),
    "avg_pool": Pool("avg_pool"),
    "argmax_pool": Pool("argmax_pool"),
    "col2im": Col2Im("col2im"),
    **{
        name: Indexed(name)
        for name in ("gather", "gather_elements", "gather_nd", "scatter_elements", "scatter_nd")
    },
    "cumsum": Scan("cumsum"),
    "cumprod": Scan("cumprod"),
    "topk": Sort("topk"),
    "attention": Attention("attention"),
    "attention_grad": AttentionGrad("attention_grad"),
    "rotary": Rotary("rotary"),
    "cached_attention": CachedAttention("cached_attention"),
}
"""Every primitive's kernel, by mnemonic."""


def _freeze(value: Any) -> Hashable:
    """A hashable copy of an attribute value."""
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    frozen: Hashable = value
    return frozen


def _thaw(frozen: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in frozen}


@lru_cache(maxsize=4096)
def _cached_plan(
    name: str,
    target: Target,
    rect: Rect,
    operands: tuple[Operand, ...],
    frozen_attrs: tuple[tuple[str, Any], ...],
    results: tuple[Spec, ...],
) -> Plan:
    request = PlanRequest(target, rect, operands, _thaw(frozen_attrs), results)
    return KERNELS[name].plan(request)


def plan(
    name: str,
    target: Target,
    rect: Sequence[int],
    operands: Sequence[Operand],
    attrs: Attrs,
    results: Sequence[tuple[Sequence[int], str]],
) -> Plan:
    """The (cached) plan of primitive ``name`` (see ``PlanRequest``)."""
    x, y, w, h = rect
    frozen = _freeze(dict(attrs))
    assert isinstance(frozen, tuple)
    return _cached_plan(
        name,
        target,
        (x, y, w, h),
        tuple(operands),
        frozen,
        tuple((tuple(s), d) for s, d in results),
    )
