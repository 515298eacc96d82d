"""ONNX ops that index by position: the gathers, the scatters, TensorScatter and
ReverseSequence; also Trilu, OneHot, CumSum and CumProd.

Indices (int32 or int64) may be run-time tensors, and so may the other operands that only
decide values (Trilu's ``k``, OneHot's ``values``, ReverseSequence's lengths, TensorScatter's
write indices); OneHot's ``depth``, which decides the result's shape, and the axis of CumSum and
CumProd (but for a rank-1 input) must be known at compile time. The scatter reductions allowed
grow with the opset (none; add and mul from 16; max and min from 18). TensorScatter writes at
positions computed elementwise from the write indices (a ``wse.scatter_elements``),
ReverseSequence reads at mirrored positions (a ``wse.gather_elements``).
"""

from __future__ import annotations

from math import prod

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    along,
    as_scalar,
    axis_of,
    cast,
    dtype_of,
    shape_of,
    slice_axes,
)
from cgc.frontends.onnx.attributes import static_scalar
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node, bad_attr
from cgc.machine.hardware import dtypes

BOOL = wse.element_of_numpy("bool")


# ---------------------------------------------------------------------------------------------
# Gathers and scatters
# ---------------------------------------------------------------------------------------------


def index_value(im: Importer, node: Node, index: int) -> SSAValue:
    """An indices input, which must be int32 or int64."""
    value = im.value(node, index)
    if not dtypes.is_integer(dtype_of(value)):
        raise NodeError(f"input '{node.proto.input[index]}' must be integers")
    return value


@register("Gather")
def _gather(im: Importer, node: Node) -> list:
    data, indices = im.value(node, 0), index_value(im, node, 1)
    axis = axis_of(int(node.attr("axis", 0)), len(shape_of(data)))
    return [im.emit(wse.GatherOp(data, indices, axis))]


@register("GatherElements")
def _gather_elements(im: Importer, node: Node) -> list:
    data, indices = im.value(node, 0), index_value(im, node, 1)
    rank = len(shape_of(data))
    if len(shape_of(indices)) != rank:
        raise NodeError(f"indices {shape_of(indices)} must have the data's rank {rank}")
    axis = axis_of(int(node.attr("axis", 0)), rank)
    return [im.emit(wse.GatherElementsOp(data, indices, axis))]


@register("GatherND")
def _gather_nd(im: Importer, node: Node) -> list:
    data, indices = im.value(node, 0), index_value(im, node, 1)
    batch_dims = int(node.attr("batch_dims", 0))
    if batch_dims < 0:
        raise bad_attr("batch_dims", batch_dims)
    return [im.emit(wse.GatherNDOp(data, indices, batch_dims))]


def scatter_reduction(im: Importer, node: Node) -> str:
    """The reduction of ScatterElements/ScatterND allowed at the model's opset."""
    reduction = node.attr("reduction", "none")
    allowed: tuple[str, ...] = ("none",) if im.opset < 16 else ("none", "add", "mul")
    allowed = allowed if im.opset < 18 else ("none", "add", "mul", "max", "min")
    if reduction not in allowed:
        raise bad_attr("reduction", reduction, f" at opset {im.opset}")
    return reduction


def scatter_operands(im: Importer, node: Node) -> tuple[SSAValue, SSAValue, SSAValue]:
    """data, indices and updates of a scatter; updates must have the data's type."""
    data, indices, updates = im.value(node, 0), index_value(im, node, 1), im.value(node, 2)
    if wse.element_type(updates) != wse.element_type(data):
        raise NodeError("updates must have the data's type")
    return data, indices, updates


@register("Scatter", "ScatterElements")
def _scatter_elements(im: Importer, node: Node) -> list:
    data, indices, updates = scatter_operands(im, node)
    rank = len(shape_of(data))
    if shape_of(indices) != shape_of(updates) or len(shape_of(indices)) != rank:
        raise NodeError(
            f"indices {shape_of(indices)} and updates {shape_of(updates)} need one shape of "
            f"the data's rank {rank}"
        )
    axis = axis_of(int(node.attr("axis", 0)), rank)
    reduction = scatter_reduction(im, node) if node.op_type == "ScatterElements" else "none"
    return [im.emit(wse.ScatterElementsOp(data, indices, updates, axis, reduction))]


@register("ScatterND")
def _scatter_nd(im: Importer, node: Node) -> list:
    data, indices, updates = scatter_operands(im, node)
    ds, xs, us = shape_of(data), shape_of(indices), shape_of(updates)
    if not xs or xs[-1] > len(ds) or us != (*xs[:-1], *ds[xs[-1] :]):
        raise NodeError(f"indices {xs} and updates {us} do not address data {ds}")
    return [im.emit(wse.ScatterNDOp(data, indices, updates, scatter_reduction(im, node)))]


@register("TensorScatter")
def _tensor_scatter(im: Importer, node: Node) -> list:
    cache, update = im.value(node, 0), im.value(node, 1)
    cs, us = shape_of(cache), shape_of(update)
    axis = axis_of(int(node.attr("axis", -2)), len(cs))
    mode = node.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise bad_attr("mode", mode, " (expected linear or circular)")
    if axis == 0:
        raise bad_attr("axis", node.attr("axis", -2), " (axis 0 is the batch)")
    fits = all(c == u for i, (c, u) in enumerate(zip(cs, us, strict=True)) if i != axis)
    if len(cs) != len(us) or not fits or us[axis] > cs[axis]:
        raise NodeError(f"update {us} does not fit cache {cs} along axis {axis}")
    if wse.element_type(update) != wse.element_type(cache):
        raise NodeError("update must have the cache's type")
    if not node.has_input(2):  # every sample writes from position 0
        rest = slice_axes(im, cache, {axis: (us[axis], cs[axis])}, None)
        return [update if us == cs else im.emit(wse.ConcatOp([update, rest], axis))]
    starts = cast(im, im.value(node, 2), "int64")
    if shape_of(starts) != (cs[0],):
        raise NodeError(f"write_indices {shape_of(starts)} must have shape ({cs[0]},)")
    starts = im.emit(wse.ReshapeOp(starts, along(0, len(cs), np.zeros(cs[0])).shape))
    offsets = im.const(along(axis, len(cs), np.arange(us[axis], dtype=np.int64)))
    positions = im.emit(wse.AddOp(starts, offsets))
    if mode == "circular":
        positions = im.emit(wse.ModOp(positions, im.const(np.array(cs[axis], np.int64))))
    positions = im.emit(wse.BroadcastToOp(positions, us))
    return [im.emit(wse.ScatterElementsOp(cache, positions, update, axis, "none"))]


@register("ReverseSequence")
def _reverse_sequence(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    rank = len(shape)
    if rank < 2:
        raise NodeError(f"the input needs rank >= 2, got {rank}")
    batch_axis = axis_of(int(node.attr("batch_axis", 1)), rank, "batch_axis")
    time_axis = axis_of(int(node.attr("time_axis", 0)), rank, "time_axis")
    if batch_axis == time_axis or max(batch_axis, time_axis) > 1:
        raise NodeError(f"batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1")
    lengths = cast(im, im.value(node, 1), "int64")
    if shape_of(lengths) != (shape[batch_axis],):
        raise NodeError(f"sequence_lens {shape_of(lengths)} must have shape ({shape[batch_axis]},)")
    per_sample = along(batch_axis, rank, np.zeros(shape[batch_axis])).shape
    lengths = im.emit(wse.ReshapeOp(lengths, per_sample))
    steps = im.const(along(time_axis, rank, np.arange(shape[time_axis], dtype=np.int64)))
    inside = im.emit(wse.GreaterOp(lengths, steps))
    last = im.emit(wse.SubOp(lengths, im.const(np.array(1, np.int64))))
    mirrored = im.emit(wse.SubOp(last, steps))  # length - 1 - t
    source = im.emit(wse.BroadcastToOp(im.emit(wse.SelectOp(inside, mirrored, steps)), shape))
    return [im.emit(wse.GatherElementsOp(x, source, time_axis))]


# ---------------------------------------------------------------------------------------------
# Masks, one-hot, running sums
# ---------------------------------------------------------------------------------------------


@register("Trilu")
def _trilu(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    if len(shape) < 2:
        raise NodeError(f"the input needs rank >= 2, got shape {shape}")
    rows, cols = shape[-2:]
    k = im.const(np.array(0, np.int64))
    if node.has_input(1):
        k = as_scalar(im, cast(im, im.value(node, 1), "int64"), "k")
    # keep col - row >= k (upper) or col - row <= k (lower), i.e. compare col with row + k
    row = im.const(np.arange(rows, dtype=np.int64).reshape(rows, 1))
    col = im.const(np.arange(cols, dtype=np.int64).reshape(1, cols))
    shifted = im.emit(wse.AddOp(row, k))
    upper = bool(node.attr("upper", 1))
    keep = wse.GreaterEqualOp(col, shifted) if upper else wse.GreaterEqualOp(shifted, col)
    return [im.emit(wse.SelectOp(im.emit(keep), x, im.scalar(0, x)))]


def one_hot_values(im: Importer, node: Node) -> tuple[SSAValue, SSAValue]:
    """OneHot's off and on values as rank-0 tensors."""
    values = im.value(node, 2)
    if prod(shape_of(values)) != 2:
        raise NodeError(f"input 'values' must hold [off, on], got shape {shape_of(values)}")
    flat = im.emit(wse.ReshapeOp(values, (2,)))
    off, on = (im.emit(wse.SliceOp(flat, [i], [i + 1], [1])) for i in (0, 1))
    return im.emit(wse.ReshapeOp(off, ())), im.emit(wse.ReshapeOp(on, ()))


@register("OneHot")
def _one_hot(im: Importer, node: Node) -> list:
    indices = im.value(node, 0)
    depth_value = static_scalar(im, node, 1)
    depth = int(depth_value)
    if depth < 1:
        raise NodeError(f"input 'depth' must be positive, got {depth_value}")
    rank = len(shape_of(indices)) + 1
    axis = axis_of(int(node.attr("axis", -1)), rank)
    indices = cast(im, indices, "int64")
    if im.opset >= 11:  # indices in [-depth, 0) count from the end
        negative = im.emit(wse.GreaterOp(im.scalar(0, indices), indices))
        wrapped = im.emit(wse.AddOp(indices, im.scalar(depth, indices)))
        indices = im.emit(wse.SelectOp(negative, wrapped, indices))
    hot = im.emit(wse.OneHotOp(indices, depth, BOOL))
    if axis != rank - 1:
        perm = [*range(axis), rank - 1, *range(axis, rank - 1)]
        hot = im.emit(wse.TransposeOp(hot, perm))
    off, on = one_hot_values(im, node)
    return [im.emit(wse.SelectOp(hot, on, off))]


def cumulative_axis(im: Importer, node: Node, rank: int) -> int:
    """The axis input of CumSum and CumProd; a rank-1 input has only one axis, so it need
    not be known (and a run-time axis out of range goes unnoticed, as there is no other)."""
    if rank == 1 and im.known_value(node, 1) is None:
        return 0
    return axis_of(int(static_scalar(im, node, 1)), rank)


SCANS = {"CumSum": wse.CumSumOp, "CumProd": wse.CumProdOp}


@register(*SCANS)
def _scan(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    axis = cumulative_axis(im, node, len(shape_of(x)))
    exclusive = bool(node.attr("exclusive", 0))
    reverse = bool(node.attr("reverse", 0))
    return [im.emit(SCANS[node.op_type](x, axis, exclusive, reverse))]
