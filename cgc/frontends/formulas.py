"""Formulas both frontends build from WSE primitives, each the same for an ONNX node and an
ATen op: attention's scores and weighted values (grouped query heads sharing their key/value
heads), standardization and per-channel parameters, running averages, GELU, top-k and
arg-max/min, and the class mask of a loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import cast, dtype_of, reshape, shape_of, transpose
from cgc.frontends.emitter import Emitter
from cgc.machine.hardware import dtypes

# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


def grouped(im: Emitter, x: SSAValue, kv_heads: int, per_head: int) -> SSAValue:
    """``(B, H_q, ...)`` as ``(B, H_kv, H_q / H_kv, ...)`` so that query head ``h`` meets key
    head ``h // (H_q / H_kv)``."""
    batch, _, *rest = shape_of(x)
    return reshape(im, x, [batch, kv_heads, per_head, *rest])


def attention_scores(im: Emitter, q: SSAValue, k: SSAValue, scale: float) -> SSAValue:
    """``(Q * sqrt(scale)) @ (K * sqrt(scale))^T`` per head, ``(B, H_q, S_q, S_kv)``; grouped
    query heads share their key head through broadcasting."""
    batch, q_heads, queries, _ = shape_of(q)
    kv_heads, keys = shape_of(k)[1], shape_of(k)[2]
    root = im.const(np.array(np.sqrt(scale), dtype=dtype_of(q)))
    q = im.emit(wse.MulOp(q, root))
    k_t = transpose(im, im.emit(wse.MulOp(k, root)), [0, 1, 3, 2])
    groups = q_heads // kv_heads
    if groups == 1:
        return im.emit(wse.MatmulOp(q, k_t))
    k_t = reshape(im, k_t, [batch, kv_heads, 1, *shape_of(k_t)[2:]])
    raw = im.emit(wse.MatmulOp(grouped(im, q, kv_heads, groups), k_t))
    return reshape(im, raw, [batch, q_heads, queries, keys])


def attend(im: Emitter, weights: SSAValue, v: SSAValue, groups: int) -> SSAValue:
    """``weights @ V`` per head, the key/value heads shared by their query-head groups."""
    batch, q_heads, queries, _ = shape_of(weights)
    kv_heads = shape_of(v)[1]
    if groups == 1:
        return im.emit(wse.MatmulOp(weights, v))
    v = reshape(im, v, [batch, kv_heads, 1, *shape_of(v)[2:]])
    y = im.emit(wse.MatmulOp(grouped(im, weights, kv_heads, groups), v))
    return reshape(im, y, [batch, q_heads, queries, shape_of(v)[-1]])


# ---------------------------------------------------------------------------------------------
# Normalization
# ---------------------------------------------------------------------------------------------


def square(im: Emitter, x: SSAValue) -> SSAValue:
    """``x * x``."""
    return im.emit(wse.MulOp(x, x))


class Standardized(NamedTuple):
    """``x`` standardized over some axes, with its statistics (keeping the reduced axes)."""

    normed: SSAValue
    """``(x - mean) / sqrt(var + epsilon)``."""
    mean: SSAValue
    var: SSAValue
    """The population variance."""
    inv_std: SSAValue
    """``1 / sqrt(var + epsilon)``."""


def standardize(im: Emitter, x: SSAValue, axes: Sequence[int], epsilon: float) -> Standardized:
    """Standardizes ``x`` over ``axes``."""
    mean = im.emit(wse.ReduceMeanOp(x, list(axes), True))
    centered = im.emit(wse.SubOp(x, mean))
    var = im.emit(wse.ReduceMeanOp(square(im, centered), list(axes), True))
    std = im.emit(wse.SqrtOp(im.emit(wse.AddOp(var, im.scalar(epsilon, var)))))
    inv_std = im.emit(wse.ReciprocalOp(std))
    return Standardized(im.emit(wse.MulOp(centered, inv_std)), mean, var, inv_std)


def per_channel(im: Emitter, value: SSAValue, rank: int, like: SSAValue) -> SSAValue:
    """A parameter of shape (C,) (or (C, D1, ...)) shaped to broadcast against an input of
    ``rank`` along axis 1, converted to ``like``'s element type."""
    shape = shape_of(value)
    value = reshape(im, value, (*shape, *([1] * (rank - 1 - len(shape)))))
    return cast(im, value, dtype_of(like))


def running_average(im: Emitter, old: SSAValue, new: SSAValue, momentum: float) -> SSAValue:
    """``old * momentum + new * (1 - momentum)``."""
    kept = im.emit(wse.MulOp(old, im.scalar(momentum, old)))
    return im.emit(wse.AddOp(kept, im.emit(wse.MulOp(new, im.scalar(1 - momentum, new)))))


# ---------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------


GELU_TANH_CUBIC = 0.044715


GELU_APPROXIMATIONS = ("none", "tanh")


def gelu(im: Emitter, x: SSAValue, approximate: str) -> SSAValue:
    """``0.5 * x * (1 + erf(x / sqrt(2)))``, or with ``approximate="tanh"``
    ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))``."""
    if approximate == "none":
        inner = im.emit(wse.MulOp(x, im.scalar(1 / math.sqrt(2), x)))
        curve = im.emit(wse.ErfOp(inner))
    else:
        cube = im.emit(wse.MulOp(im.emit(wse.MulOp(x, x)), x))
        inner = im.emit(wse.AddOp(x, im.emit(wse.MulOp(cube, im.scalar(GELU_TANH_CUBIC, x)))))
        inner = im.emit(wse.MulOp(inner, im.scalar(math.sqrt(2 / math.pi), x)))
        curve = im.emit(wse.TanhOp(inner))
    half = im.emit(wse.MulOp(x, im.scalar(0.5, x)))
    return im.emit(wse.MulOp(half, im.emit(wse.AddOp(curve, im.scalar(1, x)))))


# ---------------------------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------------------------


def top_k(im: Emitter, x: SSAValue, axis: int, k: int, largest: bool) -> list[SSAValue]:
    """The ``k`` largest (or smallest) values along ``axis`` and their int64 indices; among
    equal values the lower index comes first."""
    return im.emit_all(wse.TopKOp(x, axis, k, largest))


def arg_extreme(im: Emitter, x: SSAValue, axis: int, largest: bool, last: bool) -> SSAValue:
    """The int64 index of the largest (or smallest) value along ``axis``, keeping the axis;
    the first one among equals, or the last one with ``last``.

    A NaN is the extreme both ways, as in numpy and torch (argmax and argmin of ``[1, nan]``
    are 1): top-k ranks NaN above every number, so the smallest float is the largest of
    ``-x``. onnxruntime's ArgMax and ArgMin skip NaN unless it comes first, and which index
    they then give depends on the type and length (its vectorized paths: ArgMin of float32
    ``[2, nan, 2, -1, 1]`` is 4); the ONNX frontend follows numpy, not that."""
    if not largest and dtypes.is_float(dtype_of(x)):
        x, largest = im.emit(wse.NegOp(x)), True
    if not last:
        return top_k(im, x, axis, 1, largest)[1]
    flipped = im.emit(wse.ReverseOp(x, [axis]))
    index = top_k(im, flipped, axis, 1, largest)[1]
    top = im.const(np.array(shape_of(x)[axis] - 1, dtype=np.int64))
    return im.emit(wse.SubOp(top, index))


def class_mask(im: Emitter, labels: SSAValue, classes: int, ignore_index: int | None):
    """(N, C, d1, ...) booleans: true at each sample's label, nowhere for an ignored one. A
    label outside the classes that is not ``ignore_index`` is an error when it runs, as
    onnxruntime's losses make it (the one-hot of a loss's labels checks them)."""
    label_shape = shape_of(labels)
    rank = len(label_shape) + 1
    boolean = wse.element_of_numpy(np.dtype(bool))
    hot = im.emit(wse.OneHotOp(labels, classes, boolean, labels=True, ignore_index=ignore_index))
    mask = hot if rank == 2 else im.emit(wse.TransposeOp(hot, [0, rank - 1, *range(1, rank - 1)]))
    if ignore_index is None or not 0 <= ignore_index < classes:
        return mask  # an ignored label out of the classes is a row of zeros already
    spread = im.emit(wse.ReshapeOp(labels, (label_shape[0], 1, *label_shape[1:])))
    ignored = im.emit(wse.EqualOp(spread, im.const(np.array(ignore_index, dtype_of(labels)))))
    return im.emit(wse.AndOp(mask, im.emit(wse.NotOp(ignored))))
