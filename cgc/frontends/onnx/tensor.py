"""ONNX ops that build or rearrange tensors: constants, reshapes, transposes, concatenation."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
from onnx import numpy_helper

from cgc.dialects import wse
from cgc.frontends.onnx.importer import (
    Importer,
    Lazy,
    Node,
    NodeError,
    axis_of,
    bad_attr,
    register,
    shape_of,
)


@register("Constant")
def _constant(im: Importer, node: Node) -> list:
    attrs = node.attrs
    if "value" in attrs:
        array = numpy_helper.to_array(attrs["value"])
    elif "value_float" in attrs:
        array = np.array(attrs["value_float"], dtype=np.float32)
    elif "value_floats" in attrs:
        array = np.array(attrs["value_floats"], dtype=np.float32)
    elif "value_int" in attrs:
        array = np.array(attrs["value_int"], dtype=np.int64)
    elif "value_ints" in attrs:
        array = np.array(attrs["value_ints"], dtype=np.int64)
    else:
        key = next(iter(sorted(attrs)), None)
        if key is None:
            raise NodeError("the node has no value attribute")
        raise NodeError(f"attribute {key} is not supported")
    return [Lazy(array, node.proto.output[0], False, im.loc)]


@register("Flatten")
def _flatten(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    axis = int(node.attr("axis", 1))
    if not -len(shape) <= axis <= len(shape):
        raise NodeError(f"attribute axis={axis} is out of range for rank {len(shape)}")
    axis = axis + len(shape) if axis < 0 else axis
    return [im.emit(wse.ReshapeOp(x, (prod(shape[:axis]), prod(shape[axis:]))))]


def reshape_target(src: Sequence[int], spec: Sequence[int], allowzero: bool) -> tuple:
    """The shape ONNX Reshape's ``spec`` (with 0 and -1) means for an input of shape ``src``."""
    dims = []
    for i, d in enumerate(spec):
        if d == 0 and not allowzero:
            if i >= len(src):
                raise NodeError(f"shape {list(spec)} copies axis {i} of a rank-{len(src)} input")
            dims.append(src[i])
        elif d < -1:
            raise NodeError(f"shape {list(spec)} has the negative dimension {d}")
        else:
            dims.append(d)
    if dims.count(-1) > 1:
        raise NodeError(f"shape {list(spec)} has more than one -1")
    if -1 in dims:
        known = prod(d for d in dims if d != -1)
        if known == 0 or prod(src) % known:
            raise NodeError(f"cannot reshape {tuple(src)} into shape {list(spec)}")
        dims[dims.index(-1)] = prod(src) // known
    if prod(dims) != prod(src):
        raise NodeError(f"cannot reshape {tuple(src)} into shape {list(spec)}")
    return tuple(dims)


@register("Reshape")
def _reshape(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    spec = [int(d) for d in np.ravel(im.static(node, 1))]
    allowzero = bool(node.attr("allowzero", 0))
    return [im.emit(wse.ReshapeOp(x, reshape_target(shape_of(x), spec, allowzero)))]


@register("Transpose")
def _transpose(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    rank = len(shape_of(x))
    perm = node.attr("perm", None)
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(p % rank if rank else p for p in perm) != list(range(rank)):
        raise bad_attr("perm", perm, f" for rank {rank}")
    return [im.emit(wse.TransposeOp(x, [p % rank for p in perm]))]


@register("Concat")
def _concat(im: Importer, node: Node) -> list:
    values = [im.value(node, i) for i in range(len(node.proto.input)) if node.has_input(i)]
    if not values:
        raise NodeError("there are no inputs")
    axis = axis_of(int(node.attr("axis", 0)), len(shape_of(values[0])))
    return [im.emit(wse.ConcatOp(values, axis))]
