"""Lowers the composite ops of the WSE dialect to primitives.

* softmax: ``e = exp(x - max(x)); e / sum(e)``; log-softmax: ``s - log(sum(exp(s)))`` with
  ``s = x - max(x)``;
* layer norm: mean, centered variance, ``(x - mean) / sqrt(var + eps) * scale + bias``;
* batch norm (inference): ``(x - mean) * scale / sqrt(var + eps) + bias`` per channel;
* softmax cross-entropy: log-softmax, a one-hot pick of the label's entry, class weights and
  ``ignore_index`` as a per-sample weight, then the reduction;
* convolution: ``im2col`` then a (grouped) matmul with the filter seen as
  ``[group, C/group * prod(kernel), K/group]``, whose result is channels-last
  ``(N, *spatial, K)``, then one transpose to ``(N, K, *spatial)``.

Each composite has its own rewrite pattern (``DecomposeSoftmax``, ``DecomposeLogSoftmax``,
``DecomposeLayerNorm``, ``DecomposeBatchNorm``, ``DecomposeCrossEntropy``, ``DecomposeConv``),
which builds its primitives with the function of the same name below (``softmax``, ...) and
replaces the op by the result (``_replace``); ``DecomposePass`` applies them all in one walk.
Every new op keeps the location of the op it replaces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from cgc.dialects import wse
from cgc.dialects.ir import LocatedInserter


def _shifted(emit: LocatedInserter, x: SSAValue, axis: int) -> SSAValue:
    """``x - max(x)``; the max only keeps exp in range, and carries no gradient."""
    peak = emit(wse.StopGradientOp(emit(wse.ReduceMaxOp(x, [axis], True))))
    return emit(wse.SubOp(x, peak))


def softmax(emit: LocatedInserter, x: SSAValue, axis: int) -> SSAValue:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``."""
    e = emit(wse.ExpOp(_shifted(emit, x, axis)))
    return emit(wse.DivOp(e, emit(wse.ReduceSumOp(e, [axis], True))))


def log_softmax(emit: LocatedInserter, x: SSAValue, axis: int) -> SSAValue:
    """``(x - max) - log(sum(exp(x - max)))`` along ``axis``."""
    s = _shifted(emit, x, axis)
    total = emit(wse.ReduceSumOp(emit(wse.ExpOp(s)), [axis], True))
    return emit(wse.SubOp(s, emit(wse.LogOp(total))))


def layer_norm(emit: LocatedInserter, op: wse.LayerNormOp) -> SSAValue:
    """Normalization over the trailing axes from ``op.axis``."""
    x = op.input
    axes = list(range(op.axis.value.data, len(wse.tensor_shape(x))))
    centered = emit(wse.SubOp(x, emit(wse.ReduceMeanOp(x, axes, True))))
    var = emit(wse.ReduceMeanOp(emit(wse.MulOp(centered, centered)), axes, True))
    eps = emit.constant(op.epsilon.value.data, wse.element_type(x))
    normed = emit(wse.DivOp(centered, emit(wse.SqrtOp(emit(wse.AddOp(var, eps))))))
    y = emit(wse.MulOp(normed, op.scale))
    return y if op.bias is None else emit(wse.AddOp(y, op.bias))


def batch_norm(emit: LocatedInserter, op: wse.BatchNormOp) -> SSAValue:
    """Inference batch normalization with the statistics broadcast along axis 1."""
    x = op.input
    shape = wse.tensor_shape(x)
    per_channel = (shape[1],) + (1,) * (len(shape) - 2)

    def channel(v: SSAValue) -> SSAValue:
        return emit(wse.ReshapeOp(v, per_channel)) if len(shape) > 2 else v

    # the per-channel gain on the [C] vectors (spread over the mesh's columns), before it is
    # shaped to broadcast: on [C, 1, 1] every value would sit on one PE
    eps = emit.constant(op.epsilon.value.data, wse.element_type(op.var))
    std = emit(wse.SqrtOp(emit(wse.AddOp(op.var, eps))))
    gain = emit(wse.DivOp(op.scale, std))
    centered = emit(wse.SubOp(x, channel(op.mean)))
    return emit(wse.AddOp(emit(wse.MulOp(centered, channel(gain))), channel(op.bias)))


def cross_entropy(emit: LocatedInserter, op: wse.SoftmaxCrossEntropyOp) -> SSAValue:
    """ONNX SoftmaxCrossEntropyLoss from primitives."""
    scores, labels = op.scores, op.labels
    shape = wse.tensor_shape(scores)
    rank, classes, elt = len(shape), shape[1], wse.element_type(scores)
    logp = log_softmax(emit, scores, 1)
    ignore_index = None if op.ignore_index is None else op.ignore_index.value.data
    hot = emit(wse.OneHotOp(labels, classes, elt, labels=True, ignore_index=ignore_index))
    if rank > 2:
        hot = emit(wse.TransposeOp(hot, [0, rank - 1, *range(1, rank - 1)]))
    nll = emit(wse.NegOp(emit(wse.ReduceSumOp(emit(wse.MulOp(logp, hot)), [1], False))))
    weight = None
    if op.weights is not None:
        w = op.weights
        if rank > 2:
            w = emit(wse.ReshapeOp(w, (classes,) + (1,) * (rank - 2)))
        weight = emit(wse.ReduceSumOp(emit(wse.MulOp(hot, w)), [1], False))
    if op.ignore_index is not None:
        ignored = emit(
            wse.EqualOp(labels, emit.constant(op.ignore_index.value.data, wse.element_type(labels)))
        )
        keep = emit(wse.SelectOp(ignored, emit.constant(0, elt), emit.constant(1, elt)))
        weight = keep if weight is None else emit(wse.MulOp(weight, keep))
    loss = nll if weight is None else emit(wse.MulOp(nll, weight))
    reduction = op.reduction.data
    if reduction == "none":
        return loss
    axes = list(range(rank - 1))
    if reduction == "mean" and weight is None:
        return emit(wse.ReduceMeanOp(loss, axes, False))
    total = emit(wse.ReduceSumOp(loss, axes, False))
    if reduction == "sum":
        return total
    assert weight is not None
    return emit(wse.DivOp(total, emit(wse.ReduceSumOp(weight, axes, False))))


def convolution(emit: LocatedInserter, op: wse.ConvOp) -> SSAValue:
    """A grouped convolution as ``im2col`` and one batched matmul."""
    x, filt = op.input, op.filter
    n = wse.tensor_shape(x)[0]
    fshape = wse.tensor_shape(filt)
    group = op.group.value.data
    k, per_group = fshape[0], fshape[0] // group
    spatial = wse.tensor_shape(op.result)[2:]
    cols = emit(
        wse.Im2ColOp(
            x,
            fshape[2:],
            op.strides.get_values(),
            op.pads.get_values(),
            op.dilations.get_values(),
            group,
        )
    )
    mat = emit(wse.ReshapeOp(filt, (group, per_group, prod(fshape[1:]))))
    mat = emit(wse.TransposeOp(mat, [0, 2, 1]))
    y = emit(wse.MatmulOp(cols, mat))
    s = len(spatial)
    if group > 1:  # [group, N * P, K/group] to [N * P, group, K/group]: channel g * K/g + j
        y = emit(wse.TransposeOp(emit(wse.ReshapeOp(y, (group, n, *spatial, per_group))),
                                 [*range(1, s + 2), 0, s + 2]))  # fmt: skip
    y = emit(wse.ReshapeOp(y, (n, *spatial, k)))
    return emit(wse.TransposeOp(y, [0, s + 1, *range(1, s + 1)]))


def _replace(
    op: Operation, rewriter: PatternRewriter, build: Callable[[LocatedInserter], SSAValue]
) -> None:
    """Replaces ``op`` by the value ``build`` emits before it (each new op at ``op``'s
    location): the boilerplate shared by the patterns below."""
    value = build(LocatedInserter(rewriter.insert, op))
    rewriter.replace_all_uses_with(op.results[0], value)
    rewriter.erase(op)


class DecomposeSoftmax(RewritePattern):
    """Lowers ``wse.softmax`` to ``exp(x - max) / sum(exp(x - max))`` (``softmax``)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: wse.SoftmaxOp, rewriter: PatternRewriter, /) -> None:
        _replace(op, rewriter, lambda emit: softmax(emit, op.input, op.axis.value.data))


class DecomposeLogSoftmax(RewritePattern):
    """Lowers ``wse.log_softmax`` to ``(x - max) - log(sum(exp(x - max)))``
    (``log_softmax``)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: wse.LogSoftmaxOp, rewriter: PatternRewriter, /) -> None:
        _replace(op, rewriter, lambda emit: log_softmax(emit, op.input, op.axis.value.data))


class DecomposeLayerNorm(RewritePattern):
    """Lowers ``wse.layer_norm`` to its mean, variance and affine map (``layer_norm``)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: wse.LayerNormOp, rewriter: PatternRewriter, /) -> None:
        _replace(op, rewriter, lambda emit: layer_norm(emit, op))


class DecomposeBatchNorm(RewritePattern):
    """Lowers the inference ``wse.batch_norm`` to per-channel arithmetic (``batch_norm``)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: wse.BatchNormOp, rewriter: PatternRewriter, /) -> None:
        _replace(op, rewriter, lambda emit: batch_norm(emit, op))


class DecomposeCrossEntropy(RewritePattern):
    """Lowers ``wse.softmax_cross_entropy`` to a log-softmax, a one-hot pick, the weights and
    the reduction (``cross_entropy``)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(
        self, op: wse.SoftmaxCrossEntropyOp, rewriter: PatternRewriter, /
    ) -> None:
        _replace(op, rewriter, lambda emit: cross_entropy(emit, op))


class DecomposeConv(RewritePattern):
    """Lowers ``wse.conv`` to ``im2col``, a grouped matmul and transposes (``convolution``)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: wse.ConvOp, rewriter: PatternRewriter, /) -> None:
        _replace(op, rewriter, lambda emit: convolution(emit, op))


@dataclass(frozen=True)
class DecomposePass(ModulePass):
    """Lowers softmax, log-softmax, the normalizations, the cross-entropy loss and
    convolution to primitive ops."""

    name = "decompose"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        patterns = GreedyRewritePatternApplier(
            [
                DecomposeSoftmax(),
                DecomposeLogSoftmax(),
                DecomposeLayerNorm(),
                DecomposeBatchNorm(),
                DecomposeCrossEntropy(),
                DecomposeConv(),
            ]
        )
        PatternRewriteWalker(patterns, apply_recursively=False).rewrite_module(op)
