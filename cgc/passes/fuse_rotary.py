"""Fuses rotary position embeddings written as their arithmetic into ``wse.rotary``.

transformers' ``apply_rotary_pos_emb``, as both exporters write it, on heads ``x`` ``[B, H, S,
D]`` (or ``[B, S, H, D]``) and tables ``cos``, ``sin`` that broadcast over the batch and the
heads (``[1, 1, S, D]``):

    y = x * cos + concat(-x[..., D/2:], x[..., :D/2]) * sin

``wse.rotary`` computes the same on the token-major view of ``x`` (``[B * S, H * D]``), the
layout the weight-streaming design keeps activations in, as an elementwise product plus the
rotated half arriving from ``D / 2`` columns away, where the arithmetic slices and joins the
heads' last axis. Its gradient is the inverse rotation, which is the transpose of the rotation
only when each table repeats its first half in its second (``cat(freqs, freqs)``, as
transformers builds them): a table must be an inline constant of that form, or a weight the
driver found so by its values (``fixed_tables``) and holds fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
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
from cgc.dialects.ir import dense_to_numpy


def repeats_halves(table: np.ndarray) -> bool:
    """Whether ``table`` (``[..., D]``) repeats its first half in its second."""
    depth = table.shape[-1] if table.ndim else 0
    if not depth or depth % 2:
        return False
    half = depth // 2
    return bool(np.array_equal(table[..., :half], table[..., half:]))


def _table_candidates(module: ModuleOp) -> dict[str, wse.WeightOp]:
    """The weights a product reads (reshaped at most) whose axes but the last two are one."""
    found = {}
    for op in module.walk():
        if isinstance(op, wse.MulOp):
            for operand in op.operands:
                weight = _stored_table(operand)
                if weight is not None and _table_shape(wse.tensor_shape(operand)):
                    found[weight.weight_name.data] = weight
    return found


def _stored_table(value: SSAValue) -> wse.WeightOp | None:
    """The weight ``value`` is, or reshapes keeping its last axis."""
    owner = value.owner
    if isinstance(owner, wse.ReshapeOp):
        if wse.tensor_shape(owner.input)[-1:] != wse.tensor_shape(value)[-1:]:
            return None
        owner = owner.input.owner
    return owner if isinstance(owner, wse.WeightOp) and owner.perm is None else None


def _table_shape(shape: tuple[int, ...]) -> bool:
    return len(shape) >= 2 and all(n == 1 for n in shape[:-2]) and shape[-1] % 2 == 0


def fixed_tables(
    module: ModuleOp, weights: Mapping[str, np.ndarray], trained: Callable[[wse.WeightOp], bool]
) -> FuseRotaryPass:
    """The pass told which of ``module``'s weights are rotary tables: those a product reads
    that repeat their halves (by their values in ``weights``), unless ``trained``."""
    tables = [
        name
        for name, op in sorted(_table_candidates(module).items())
        if name in weights and not trained(op) and repeats_halves(weights[name])
    ]
    return FuseRotaryPass(tuple(tables))


@dataclass(frozen=True)
class Rotation:
    """A rotary embedding matched: the heads ``[B, H, S, D]`` and the tables."""

    heads: SSAValue
    cos: SSAValue
    sin: SSAValue


class FuseRotary(RewritePattern):
    """Rewrites ``x * cos + rotate_half(x) * sin`` (see the module docstring)."""

    def __init__(self, tables: frozenset[str]):
        self.tables = tables

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: wse.AddOp, rewriter: PatternRewriter, /) -> None:
        for plain, turned in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
            found = self._rotation(plain, turned)
            if found is not None:
                _fuse(op, found, rewriter)
                return

    def _rotation(self, plain: SSAValue, turned: SSAValue) -> Rotation | None:
        first, second = _product(plain), _product(turned)
        if first is None or second is None:
            return None
        for x, cos in (first, first[::-1]):
            for rotated, sin in (second, second[::-1]):
                if _rotates_half(rotated, x) and self._tables(x, cos, sin):
                    return Rotation(x, cos, sin)
        return None

    def _tables(self, x: SSAValue, cos: SSAValue, sin: SSAValue) -> bool:
        """Whether ``cos`` and ``sin`` are known tables over ``x``'s tokens and last axis."""
        shape = wse.tensor_shape(x)
        if len(shape) != 4 or shape[1] == 1:
            return False
        tokens = shape[2]
        for table in (cos, sin):
            dims = wse.tensor_shape(table)
            if dims[-2:] != (tokens, shape[-1]) or not _table_shape(dims) or not self._known(table):
                return False
        return True

    def _known(self, table: SSAValue) -> bool:
        owner = table.owner
        if isinstance(owner, wse.ConstantOp):
            return repeats_halves(dense_to_numpy(owner.value))
        weight = _stored_table(table)
        return weight is not None and weight.weight_name.data in self.tables


def _product(value: SSAValue) -> tuple[SSAValue, SSAValue] | None:
    owner = value.owner
    return (owner.lhs, owner.rhs) if isinstance(owner, wse.MulOp) else None


def _rotates_half(value: SSAValue, x: SSAValue) -> bool:
    """Whether ``value`` is ``concat(-x[..., D/2:], x[..., :D/2])`` on the last axis."""
    joined = value.owner
    rank = len(wse.tensor_shape(x))
    if not isinstance(joined, wse.ConcatOp) or joined.axis.value.data not in (-1, rank - 1):
        return False
    if len(joined.inputs) != 2:
        return False
    negated, low = joined.inputs
    if not isinstance(negated.owner, wse.NegOp):
        return False
    depth = wse.tensor_shape(x)[-1]
    return _half(negated.owner.input, x, depth // 2, depth) and _half(low, x, 0, depth // 2)


def _half(value: SSAValue, x: SSAValue, start: int, stop: int) -> bool:
    """Whether ``value`` is ``x[..., start:stop]``."""
    op = value.owner
    if not isinstance(op, wse.SliceOp) or op.input is not x:
        return False
    shape = wse.tensor_shape(x)
    starts, limits = list(op.starts.get_values()), list(op.limits.get_values())
    strides = list(op.strides.get_values())
    return (
        strides == [1] * len(shape)
        and starts == [0] * (len(shape) - 1) + [start]
        and limits == [*shape[:-1], stop]
    )


def _fuse(op: wse.AddOp, rotation: Rotation, rewriter: PatternRewriter) -> None:
    """Replaces ``op`` by ``wse.rotary`` on the token-major view of the heads."""
    batch, heads, tokens, depth = wse.tensor_shape(rotation.heads)
    front = wse.TransposeOp(rotation.heads, [0, 2, 1, 3])
    flat = wse.ReshapeOp(front.result, (batch * tokens, heads * depth))
    cos = wse.ReshapeOp(rotation.cos, (tokens, depth))
    sin = wse.ReshapeOp(rotation.sin, (tokens, depth))
    rotary = wse.RotaryOp(flat.result, cos.result, sin.result, heads)
    split = wse.ReshapeOp(rotary.result, (batch, tokens, heads, depth))
    back = wse.TransposeOp(split.result, [0, 2, 1, 3])
    new: list[Operation] = [front, flat, cos, sin, rotary, split, back]
    for made in new:
        made.location = op.location
    rewriter.replace(op, new, [back.result])


@dataclass(frozen=True)
class FuseRotaryPass(ModulePass):
    """Rewrites rotary position embeddings written as their arithmetic into ``wse.rotary``."""

    name = "fuse-rotary"

    tables: tuple[str, ...] = ()
    """Weights held fixed whose values are rotary tables (each repeating its halves)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pattern = FuseRotary(frozenset(self.tables))
        PatternRewriteWalker(GreedyRewritePatternApplier([pattern])).rewrite_module(op)
