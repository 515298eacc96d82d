"""Lowerings of the core ATen reductions, softmaxes, normalizations and pooling windows."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    affine,
    axis_of,
    broadcast,
    cast,
    dtype_of,
    reshape,
    shape_of,
    unique_axes,
)
from cgc.frontends.formulas import Standardized, arg_extreme, per_channel, standardize
from cgc.frontends.torch.lowering import Lowering, OpLowering, register

REDUCTIONS = {
    "aten.sum.dim_IntList": wse.ReduceSumOp,
    "aten.sum.default": wse.ReduceSumOp,
    "aten.mean.dim": wse.ReduceMeanOp,
    "aten.mean.default": wse.ReduceMeanOp,
    "aten.prod.dim_int": wse.ReduceProdOp,
    "aten.prod.default": wse.ReduceProdOp,
    "aten.amax.default": wse.ReduceMaxOp,
    "aten.amin.default": wse.ReduceMinOp,
}
"""Reductions over some axes (all when none are given) that are one WSE op."""


def _reduction(op: type) -> OpLowering:
    def lower(
        lw: Lowering,
        x: SSAValue,
        dims: Sequence[int] | int | None = None,
        keepdim: bool = False,
        **_: object,
    ) -> SSAValue:
        rank = len(shape_of(x))
        x = lw.tensor(x)
        if not rank:
            return x
        if dims is None or (isinstance(dims, Sequence) and not dims):
            axes = list(range(rank))
        else:
            axes = sorted(unique_axes([dims] if isinstance(dims, int) else dims, rank, "dim"))
        return lw.emit(op(x, axes, bool(keepdim)))

    return lower


for _name, _op in REDUCTIONS.items():
    register(_name)(_reduction(_op))


@register("aten.var.correction", "aten.var.dim")
def _var(
    lw: Lowering,
    x: SSAValue,
    dims: Sequence[int] | None = None,
    correction: float | None = None,
    keepdim: bool = False,
    **kwargs: object,
) -> SSAValue:
    """The mean of squared deviations, divided by ``n - correction`` (default 1)."""
    rank = len(shape_of(x))
    axes = list(range(rank)) if not dims else sorted(unique_axes(dims, rank, "dim"))
    count = prod(shape_of(x)[a] for a in axes)
    correction = 1 if correction is None else correction
    x = lw.tensor(x)
    mean = lw.emit(wse.ReduceMeanOp(x, axes, True))
    deviation = lw.emit(wse.SubOp(x, mean))
    total = lw.emit(wse.ReduceSumOp(lw.emit(wse.MulOp(deviation, deviation)), axes, keepdim))
    return lw.emit(wse.DivOp(total, lw.tensor(max(count - correction, 0))))


@register("aten._softmax.default", "aten._log_softmax.default")
def _softmax(lw: Lowering, x: SSAValue, dim: int, half_to_float: bool = False) -> SSAValue:
    assert lw.node is not None
    op = wse.LogSoftmaxOp if "log" in str(lw.node.target) else wse.SoftmaxOp
    return lw.emit(op(lw.tensor(x), axis_of(dim, len(shape_of(x)), "dim")))


@register("aten.native_layer_norm.default")
def _layer_norm(
    lw: Lowering,
    x: SSAValue,
    normalized_shape: Sequence[int],
    weight: SSAValue | None,
    bias: SSAValue | None,
    eps: float,
) -> tuple:
    """The normalized output only: its mean and reciprocal deviation (outputs 1 and 2, which
    only autograd reads) are not lowered."""
    shape = shape_of(x)
    axis = len(shape) - len(normalized_shape)
    dtype = lw.result_dtype()
    scale = lw.tensor(weight) if weight is not None else broadcast(lw, lw.tensor(1), shape[axis:])
    offset = None if bias is None else lw.tensor(bias)
    y = lw.emit(wse.LayerNormOp(lw.tensor(x, dtype), scale, offset, axis, float(eps)))
    return y, None, None


@register("aten._native_batch_norm_legit_no_training.default")
def _batch_norm(
    lw: Lowering,
    x: SSAValue,
    weight: SSAValue | None,
    bias: SSAValue | None,
    mean: SSAValue,
    var: SSAValue,
    momentum: float,
    eps: float,
) -> tuple:
    """Batch normalization with the running statistics (a module in ``eval()`` mode)."""
    channels = shape_of(x)[1:2]
    scale = lw.tensor(weight) if weight is not None else broadcast(lw, lw.tensor(1), channels)
    offset = lw.tensor(bias) if bias is not None else broadcast(lw, lw.tensor(0), channels)
    y = lw.emit(
        wse.BatchNormOp(lw.tensor(x), scale, offset, lw.tensor(mean), lw.tensor(var), float(eps))
    )
    return y, None, None


LOW_PRECISION = ("float16", "bfloat16")
"""Types whose batch statistics torch computes in float32."""


def _normalized_by_batch(
    lw: Lowering, x: SSAValue, weight: SSAValue | None, bias: SSAValue | None, eps: float
) -> tuple[SSAValue, Standardized]:
    """``x`` normalized with its own mean and population variance over every axis but the
    channels (1), scaled and shifted per channel; and the statistics."""
    shape = shape_of(x)
    rank = len(shape)
    if rank < 2:
        raise NodeError("expected an input of at least 2 axes (batch, channels, ...)")
    dtype = lw.result_dtype()
    stats = standardize(
        lw, lw.tensor(x, "float32" if dtype in LOW_PRECISION else dtype),
        [a for a in range(rank) if a != 1], float(eps),
    )  # fmt: skip
    normed = cast(lw, stats.normed, dtype)
    scale, shift = (
        None if p is None else per_channel(lw, lw.tensor(p), rank, normed) for p in (weight, bias)
    )
    return affine(lw, normed, scale, shift), stats


@register("aten._native_batch_norm_legit.no_stats")
def _batch_norm_without_statistics(
    lw: Lowering,
    x: SSAValue,
    weight: SSAValue | None,
    bias: SSAValue | None,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple:
    """Batch normalization that keeps no running statistics (``track_running_stats=False``,
    and instance normalization, which torch writes as it): always the batch's own."""
    return _normalized_by_batch(lw, x, weight, bias, eps)[0], None, None


@register("aten._native_batch_norm_legit_functional.default")
def _batch_norm_training(
    lw: Lowering,
    x: SSAValue,
    weight: SSAValue | None,
    bias: SSAValue | None,
    running_mean: SSAValue,
    running_var: SSAValue,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple:
    """Batch normalization of a module in ``train()`` mode: the batch's own statistics, and
    the running ones moved towards them by ``momentum`` (the variance unbiased, as torch's)."""
    if not training:
        y = _batch_norm(lw, x, weight, bias, running_mean, running_var, momentum, eps)[0]
        return y, None, None, running_mean, running_var
    y, stats = _normalized_by_batch(lw, x, weight, bias, eps)
    shape = shape_of(x)
    count = prod(shape) // shape[1]
    unbiased = lw.emit(wse.MulOp(stats.var, lw.scalar(count / max(count - 1, 1), stats.var)))
    new = [
        lw.moving_average(running, cast(lw, reshape(lw, value, shape[1:2]), dtype_of(running)),
                          float(momentum))
        for running, value in ((running_mean, stats.mean), (running_var, unbiased))
    ]  # fmt: skip
    return y, None, None, *new


def _window(
    x: SSAValue,
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    ceil_mode: bool,
) -> tuple[list[int], list[int], list[int]]:
    """The kernel, strides and ONNX-ordered pads of a pooling window."""
    spatial = len(kernel)
    stride = list(stride) or list(kernel)
    padding = list(padding) * (spatial if len(padding) == 1 else 1)
    if ceil_mode:
        raise NodeError("ceil_mode=True is not supported yet")
    if len(shape_of(x)) != spatial + 2:
        raise NodeError(f"expected a batched input of {spatial} spatial axes")
    return list(kernel), stride, padding * 2


@register("aten.max_pool2d_with_indices.default")
def _max_pool(
    lw: Lowering,
    x: SSAValue,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
) -> tuple:
    """The pooled values; their indices (output 1, for autograd) are not lowered."""
    kernel, strides, pads = _window(x, kernel_size, stride, padding, ceil_mode)
    dilations = list(dilation) * (len(kernel) if len(dilation) == 1 else 1)
    return lw.emit(wse.MaxPoolOp(x, kernel, strides, pads, dilations)), None


@register("aten.avg_pool2d.default")
def _avg_pool(
    lw: Lowering,
    x: SSAValue,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> SSAValue:
    if divisor_override is not None:
        raise NodeError("divisor_override is not supported")
    kernel, strides, pads = _window(x, kernel_size, stride, padding, ceil_mode)
    dilations = [1] * len(kernel)
    return lw.emit(wse.AvgPoolOp(x, kernel, strides, pads, dilations, count_include_pad))


def _arg_axis(lw: Lowering, x: SSAValue, dim: int | None) -> tuple[SSAValue, int]:
    """The input and axis of an arg-reduction: all of a flattened ``x`` without ``dim``."""
    shape = shape_of(x)
    if dim is None or not shape:
        return reshape(lw, x, [max(prod(shape), 1)]), 0
    return x, axis_of(dim, len(shape), "dim")


@register("aten.argmax.default", "aten.argmin.default")
def _argmax(lw: Lowering, x: SSAValue, dim: int | None = None, keepdim: bool = False) -> SSAValue:
    """The index of the first largest (smallest) value along ``dim`` or of all of ``x``."""
    assert lw.node is not None
    largest = "argmax" in str(lw.node.target)
    shape = shape_of(x)
    value, axis = _arg_axis(lw, x, dim)
    index = arg_extreme(lw, value, axis, largest, False)
    if dim is None or not shape:
        return reshape(lw, index, [1] * len(shape) if keepdim else [])
    return index if keepdim else reshape(lw, index, _without(shape, axis))


def _without(shape: Sequence[int], axis: int) -> list[int]:
    return [d for i, d in enumerate(shape) if i != axis]


@register("aten.max.dim", "aten.min.dim")
def _max_dim(lw: Lowering, x: SSAValue, dim: int, keepdim: bool = False) -> tuple:
    """The largest (smallest) values along ``dim`` and the index of the first of each."""
    assert lw.node is not None
    largest = "max" in str(lw.node.target)
    shape = shape_of(x)
    value, axis = _arg_axis(lw, x, dim)
    op = wse.ReduceMaxOp if largest else wse.ReduceMinOp
    values = lw.emit(op(value, [axis], True))
    index = arg_extreme(lw, value, axis, largest, False)
    kept = [1 if i == axis else d for i, d in enumerate(shape)]
    target = kept if keepdim else _without(shape, axis) if shape else []
    return reshape(lw, values, target), reshape(lw, index, target)


@register("aten.max.default", "aten.min.default")
def _max_all(lw: Lowering, x: SSAValue) -> SSAValue:
    assert lw.node is not None
    op = wse.ReduceMaxOp if "max" in str(lw.node.target) else wse.ReduceMinOp
    shape = shape_of(x)
    return lw.emit(op(x, list(range(len(shape))), False)) if shape else x


@register("aten.any.default", "aten.any.dim", "aten.any.dims")
@register("aten.all.default", "aten.all.dim", "aten.all.dims")
def _any(
    lw: Lowering, x: SSAValue, dims: Sequence[int] | int | None = None, keepdim: bool = False
) -> SSAValue:
    """Whether any (all) elements are non-zero: the maximum (minimum) of ``x != 0``."""
    assert lw.node is not None
    every = "all" in str(lw.node.target)
    shape = shape_of(x)
    zero = lw.tensor(0, wse.numpy_dtype(wse.element_type(x)))
    nonzero = lw.tensor(lw.emit(wse.NotOp(lw.emit(wse.EqualOp(x, zero)))), "float32")
    if not shape:
        return lw.tensor(nonzero, "bool")
    if dims is None or (isinstance(dims, Sequence) and not dims):
        axes = list(range(len(shape)))
    else:
        axes = sorted(unique_axes([dims] if isinstance(dims, int) else dims, len(shape), "dim"))
    op = wse.ReduceMinOp if every else wse.ReduceMaxOp
    return lw.tensor(lw.emit(op(nonzero, axes, bool(keepdim))), "bool")
