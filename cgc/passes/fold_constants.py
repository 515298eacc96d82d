"""Folds what can be decided at compile time.

* A primitive whose operands are all inline constants becomes a constant (when the result is
  small enough to stay inline), evaluated with the runtime's reference semantics; one that
  fails on its values (an integer divided by 0, an index out of range) stays, for the run
  to refuse naming its node.
* A reshape or transpose of a weight becomes a view of that weight (``perm`` on
  ``wse.weight``): the weight is laid out, or streamed by MemoryX, in the order the kernel
  consumes it, instead of being moved on the wafer at every run.
* Identity reshapes, transposes, broadcasts and casts disappear, a reshape of a reshape is
  one reshape, and a transpose of a transpose one transpose (the views of heads a frontend
  takes back and forth around fused attention cancel).
* A slice of the last axis moves above a reshape that keeps the last axis: exporters split a
  fused projection's ``[B*S, 3H]`` product as ``[B, S, 3H]`` and merge each part back to
  ``[B*S, H]``, which then cancels, so the parts are never laid out as sequences.
* An op made cheaper by a constant operand becomes the cheaper op, with the same bits:
  ``x ** 2`` a product ``x * x``, ``1 / x`` a reciprocal (exporters write RMS norms this way;
  a power costs a PE an exponential and a logarithm).
* Pure ops whose results are unused are erased.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.traits import Pure

from cgc.dialects import wse
from cgc.dialects.gradients import is_float
from cgc.dialects.ir import dense_to_numpy
from cgc.errors import DataError
from cgc.machine import reference
from cgc.machine.hardware import dtypes
from cgc.machine.program.bytecode import PRIMITIVES

INLINE_LIMIT = 64
"""Constants of at most this many elements are written in the IR; larger ones are weights."""


class FoldConstantOp(RewritePattern):
    """Evaluates a primitive whose operands are all inline constants."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter, /) -> None:
        if (
            not op.name.startswith("wse.")
            or wse.mnemonic(op) not in PRIMITIVES
            or not op.has_trait(Pure)
            or not op.operands
        ):
            return
        owners = [operand.owner for operand in op.operands]
        if not all(isinstance(owner, wse.ConstantOp) for owner in owners):
            return
        results = [(wse.tensor_shape(r), wse.numpy_dtype(wse.element_type(r))) for r in op.results]
        if sum(int(np.prod(shape)) for shape, _ in results) > INLINE_LIMIT:
            return
        args = [dense_to_numpy(owner.value) for owner in owners]  # type: ignore[union-attr]
        try:
            values = reference.evaluate_all(
                wse.mnemonic(op), wse.properties_as_python(op), args, results
            )
        except DataError:  # left to the run, which names the node (xDSL would bury it in IR)
            return
        if any(dtypes.is_float(v.dtype) and not np.isfinite(v.astype(np.float64)).all()
               for v in values):  # fmt: skip
            return  # xDSL prints non-finite floats as bit patterns it cannot parse back
        folded = [wse.ConstantOp(wse.dense_attr(v)) for v in values]
        for constant in folded:
            constant.location = op.location
        rewriter.replace(op, folded, [c.result for c in folded])


class FoldWeightView(RewritePattern):
    """``reshape(weight)`` and ``transpose(weight)`` become views of the weight."""

    @op_type_rewrite_pattern
    def match_and_rewrite(
        self, op: wse.ReshapeOp | wse.TransposeOp, rewriter: PatternRewriter
    ) -> None:
        source = op.input.owner
        if not isinstance(source, wse.WeightOp):
            return
        perm = None if source.perm is None else list(source.perm.get_values())
        if isinstance(op, wse.ReshapeOp):
            if perm is not None:
                return
        else:
            outer = list(op.perm.get_values())
            perm = [(perm or list(range(len(outer))))[i] for i in outer]
        assert isinstance(op.result.type, TensorType)
        view = wse.WeightOp(
            source.weight_name.data, op.result.type, source.frozen is not None, perm
        )
        view.location = source.location
        rewriter.replace(op, [view], [view.result])


class RemoveIdentity(RewritePattern):
    """Drops reshapes, broadcasts and casts to the operand's own type, and transposes by the
    identity permutation."""

    @op_type_rewrite_pattern
    def match_and_rewrite(
        self,
        op: wse.ReshapeOp | wse.BroadcastToOp | wse.CastOp | wse.TransposeOp,
        rewriter: PatternRewriter,
    ) -> None:
        if op.input.type != op.result.type:
            return
        if isinstance(op, wse.TransposeOp) and list(op.perm.get_values()) != sorted(
            op.perm.get_values()
        ):
            return
        rewriter.replace(op, [], [op.input])


class ComposeTransposes(RewritePattern):
    """``transpose(transpose(x, p), q)`` -> ``transpose(x, p[q])``: one permutation, which
    ``RemoveIdentity`` drops when the two undo each other."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: wse.TransposeOp, rewriter: PatternRewriter) -> None:
        inner = op.input.owner
        if not isinstance(inner, wse.TransposeOp):
            return
        first = inner.perm.get_values()
        composed = wse.TransposeOp(inner.input, [first[axis] for axis in op.perm.get_values()])
        composed.location = op.location
        rewriter.replace(op, [composed], [composed.result])


class CollapseReshapes(RewritePattern):
    """``reshape(reshape(x))`` -> ``reshape(x)``: a tensor shaped twice is shaped once, so the
    shape between (``[N, C, 1, 1]`` on the way from pooling to a classifier, which holds every
    value on one PE) is never laid out."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: wse.ReshapeOp, rewriter: PatternRewriter) -> None:
        inner = op.input.owner
        if not isinstance(inner, wse.ReshapeOp):
            return
        once = wse.ReshapeOp(inner.input, wse.tensor_shape(op.result))
        once.location = op.location
        rewriter.replace(op, [once], [once.result])


class SliceBeforeReshape(RewritePattern):
    """``slice(reshape(x))`` -> ``reshape(slice(x))`` when the reshape leaves the last axis as
    it is and the slice takes only part of the last axis."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: wse.SliceOp, rewriter: PatternRewriter) -> None:
        reshape = op.input.owner
        if not isinstance(reshape, wse.ReshapeOp):
            return
        source, shaped = wse.tensor_shape(reshape.input), wse.tensor_shape(reshape.result)
        if not source or not shaped or source[-1] != shaped[-1]:
            return
        starts, limits, strides = (list(a.get_values()) for a in (op.starts, op.limits, op.strides))
        whole = [(0, size, 1) for size in shaped[:-1]]
        if list(zip(starts[:-1], limits[:-1], strides[:-1], strict=True)) != whole:
            return
        keep = [0] * (len(source) - 1)
        part = wse.SliceOp(
            reshape.input,
            [*keep, starts[-1]],
            [*source[:-1], limits[-1]],
            [*(1 for _ in keep), strides[-1]],
        )
        part.location = op.location
        shaped_part = wse.ReshapeOp(part.result, wse.tensor_shape(op.result))
        shaped_part.location = reshape.location
        rewriter.replace(op, [part, shaped_part], [shaped_part.result])


def _splat(value: SSAValue) -> float | None:
    """The one number an inline constant holds throughout, else None."""
    owner = value.owner
    if not isinstance(owner, wse.ConstantOp):
        return None
    array = dense_to_numpy(owner.value)
    first = array.flat[0] if array.size else None
    return float(first) if first is not None and (array == first).all() else None


class ReduceStrength(RewritePattern):
    """``pow(x, 2)`` -> ``x * x``, ``pow(x, 3)`` -> ``x * x * x`` and ``div(1, x)`` ->
    ``reciprocal(x)`` when the constant does not broadcast ``x`` to a larger shape."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: wse.PowOp | wse.DivOp, rewriter: PatternRewriter) -> None:
        x, constant = (op.lhs, op.rhs) if isinstance(op, wse.PowOp) else (op.rhs, op.lhs)
        if x.type != op.result.type or not is_float(x):
            return
        power = _splat(constant)
        cheaper: list[Operation]
        if isinstance(op, wse.PowOp) and power in (2.0, 3.0):
            square = wse.MulOp(x, x)
            cheaper = [square] if power == 2.0 else [square, wse.MulOp(square.result, x)]
        elif isinstance(op, wse.DivOp) and power == 1.0:
            cheaper = [wse.ReciprocalOp(x)]
        else:
            return
        for new in cheaper:
            new.location = op.location
        rewriter.replace(op, cheaper, [cheaper[-1].results[0]])


@dataclass(frozen=True)
class FoldConstantsPass(ModulePass):
    """Folds constants and weight views, removes identities and dead pure ops, moves
    last-axis slices above reshapes, and reduces the strength of ops with a constant
    operand."""

    name = "fold-constants"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [
                    FoldConstantOp(),
                    FoldWeightView(),
                    RemoveIdentity(),
                    ComposeTransposes(),
                    CollapseReshapes(),
                    SliceBeforeReshape(),
                    ReduceStrength(),
                ],
                dce_enabled=True,
            )
        ).rewrite_module(op)
