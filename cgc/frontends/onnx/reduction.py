"""ONNX reductions."""

from __future__ import annotations

import numpy as np

from cgc.dialects import wse
from cgc.frontends.onnx.importer import Importer, Node, axis_of, register, shape_of

AXES_AS_INPUT = {"ReduceSum": 13}
"""The opset from which a reduction takes its axes as an input (18 for the others)."""

REDUCTIONS = {
    "ReduceMean": wse.ReduceMeanOp,
    "ReduceSum": wse.ReduceSumOp,
    "ReduceMax": wse.ReduceMaxOp,
    "ReduceMin": wse.ReduceMinOp,
}


def reduction_axes(im: Importer, node: Node, rank: int) -> list[int] | None:
    """The sorted axes a reduction node reduces, or None when it reduces nothing (empty axes
    with noop_with_empty_axes)."""
    if im.opset >= AXES_AS_INPUT.get(node.op_type, 18):
        given = im.optional_static(node, 1)
        noop = bool(node.attr("noop_with_empty_axes", 0))
    else:
        given = node.attr("axes", None)
        noop = False
    axes = [] if given is None else [int(a) for a in np.ravel(given)]
    if not axes:
        return None if noop else list(range(rank))
    return sorted({axis_of(a, rank, "axes") for a in axes})


@register(*REDUCTIONS)
def _reduce(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    axes = reduction_axes(im, node, len(shape_of(x)))
    if axes is None:
        return [x]
    keepdims = bool(node.attr("keepdims", 1))
    return [im.emit(REDUCTIONS[node.op_type](x, axes, keepdims))]
