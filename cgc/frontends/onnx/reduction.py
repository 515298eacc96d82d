"""ONNX reductions: the Reduce* family, ArgMax/ArgMin and TopK.

Every Reduce* op is a reduction of the WSE dialect between an elementwise step before it
(``abs`` for L1, a square for L2 and SumSquare) and one after it (``sqrt`` for L2, ``log`` for
LogSum); LogSumExp shifts by the maximum so that ``exp`` stays in range. The axes come as an
attribute before opset 13 (ReduceSum) or 18 (the others) and as an input from then on, where an
empty list means every axis, or no reduction at all with ``noop_with_empty_axes``. A reduction
over an empty set of values gives the op's identity (0 for sums, 1 for products, -inf for
maxima and log-sums, +inf for minima).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import NodeError, axis_of, cast, dtype_of, shape_of
from cgc.frontends.formulas import arg_extreme, square, top_k
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node
from cgc.machine import reference
from cgc.machine.hardware import dtypes

AXES_AS_INPUT = {"ReduceSum": 13}
"""The opset from which a reduction takes its axes as an input (18 for the others)."""

Step = Callable[[Importer, SSAValue], SSAValue]


def absolute(im: Importer, x: SSAValue) -> SSAValue:
    """``|x|``."""
    return im.emit(wse.AbsOp(x))


def square_root(im: Importer, x: SSAValue) -> SSAValue:
    """``sqrt(x)``."""
    return im.emit(wse.SqrtOp(x))


def logarithm(im: Importer, x: SSAValue) -> SSAValue:
    """``log(x)``."""
    return im.emit(wse.LogOp(x))


def reduced_shape(shape: tuple[int, ...], axes: list[int], keepdims: bool) -> tuple[int, ...]:
    """The shape of a reduction's result."""
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


@dataclass(frozen=True)
class Reduction:
    """One Reduce* op: ``after(reduce(before(x)))``, computed in float64 for integer inputs
    when ``floating`` (sqrt, log and exp are defined on floats)."""

    reduce: type[wse.ReduceOp]
    empty: Callable[[np.dtype], float | int | bool]
    """The result of reducing an empty set, by dtype."""
    before: Step | None = None
    after: Step | None = None
    floating: bool = False


REDUCTIONS: dict[str, Reduction] = {
    "ReduceSum": Reduction(wse.ReduceSumOp, lambda dt: 0),
    "ReduceMean": Reduction(wse.ReduceMeanOp, lambda dt: np.nan),
    "ReduceMax": Reduction(wse.ReduceMaxOp, reference.lowest),
    "ReduceMin": Reduction(wse.ReduceMinOp, reference.highest),
    "ReduceProd": Reduction(wse.ReduceProdOp, lambda dt: 1),
    "ReduceL1": Reduction(wse.ReduceSumOp, lambda dt: 0, before=absolute),
    "ReduceL2": Reduction(
        wse.ReduceSumOp, lambda dt: 0, before=square, after=square_root, floating=True
    ),
    "ReduceSumSquare": Reduction(wse.ReduceSumOp, lambda dt: 0, before=square),
    "ReduceLogSum": Reduction(wse.ReduceSumOp, lambda dt: -np.inf, after=logarithm, floating=True),
    "ReduceLogSumExp": Reduction(wse.ReduceSumOp, lambda dt: -np.inf, floating=True),
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


def log_sum_exp(im: Importer, x: SSAValue, axes: list[int], keepdims: bool) -> SSAValue:
    """``log(sum(exp(x)))`` over ``axes``, shifted by the (finite) maximum."""
    peak = im.emit(wse.ReduceMaxOp(x, axes, True))
    infinite = im.emit(wse.IsInfOp(peak))
    shift = im.emit(wse.StopGradientOp(im.emit(wse.SelectOp(infinite, im.scalar(0, x), peak))))
    total = im.emit(wse.ReduceSumOp(im.emit(wse.ExpOp(im.emit(wse.SubOp(x, shift)))), axes, True))
    result = im.emit(wse.AddOp(im.emit(wse.LogOp(total)), shift))
    if keepdims:
        return result
    return im.emit(wse.ReshapeOp(result, reduced_shape(shape_of(x), axes, False)))


def _apply(step: Step | None, im: Importer, x: SSAValue) -> SSAValue:
    return x if step is None else step(im, x)


def reduce_value(
    im: Importer, op_type: str, x: SSAValue, axes: list[int] | None, keepdims: bool
) -> SSAValue:
    """The result of Reduce op ``op_type`` over ``axes`` (None: no reduction, only the
    elementwise steps)."""
    spec = REDUCTIONS[op_type]
    dtype = dtype_of(x)
    shape = shape_of(x)
    if axes is not None and prod(shape) == 0:
        out = np.full(reduced_shape(shape, axes, keepdims), spec.empty(dtype))
        with np.errstate(invalid="ignore"):  # integers have no NaN or infinity: undefined
            return im.const(out.astype(dtype))
    if spec.floating and not dtypes.is_float(dtype):
        x = cast(im, x, "float64")
    if op_type == "ReduceLogSumExp":
        y = x if axes is None else log_sum_exp(im, x, axes, keepdims)
        return cast(im, y, dtype)
    y = _apply(spec.before, im, x)
    if axes is not None:
        y = im.emit(spec.reduce(y, axes, keepdims))
    return cast(im, _apply(spec.after, im, y), dtype)


@register(*REDUCTIONS)
def _reduce(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    axes = reduction_axes(im, node, len(shape_of(x)))
    keepdims = bool(node.attr("keepdims", 1))
    return [reduce_value(im, node.op_type, x, axes, keepdims)]


@register("ArgMax", "ArgMin")
def _arg_max_min(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    if not shape:
        raise NodeError("the input must have rank >= 1")
    axis = axis_of(int(node.attr("axis", 0)), len(shape))
    last = bool(node.attr("select_last_index", 0))
    index = arg_extreme(im, x, axis, node.op_type == "ArgMax", last)
    if not node.attr("keepdims", 1):
        index = im.emit(wse.ReshapeOp(index, reduced_shape(shape, [axis], False)))
    return [index]


def top_k_count(im: Importer, node: Node) -> int:
    """TopK's k: an attribute before opset 10, a one-element input from then on."""
    if im.opset < 10:
        k = node.attr("k", None)
        if k is None:
            raise NodeError("attribute k is required")
        return int(k)
    given = np.ravel(im.static(node, 1))
    if given.size != 1:
        raise NodeError(f"input 'K' must hold one value, got {given.size}")
    return int(given[0])


@register("TopK")
def _top_k(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    if not shape:
        raise NodeError("the input must have rank >= 1")
    axis = axis_of(int(node.attr("axis", -1)), len(shape))
    k = top_k_count(im, node)
    if not 1 <= k <= shape[axis]:
        raise NodeError(f"k={k} is out of range: axis {axis} has {shape[axis]} elements")
    largest = bool(node.attr("largest", 1))
    # sorted=0 leaves the order unspecified: the sorted order is one of the allowed ones.
    return top_k(im, x, axis, k, largest)
