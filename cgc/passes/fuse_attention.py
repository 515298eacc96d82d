"""Fuses multi-head attention written as matmuls and a softmax into ``wse.attention``.

Exporters write attention as its arithmetic. On token-major ``q``, ``k``, ``v`` of shape
``[B, S, H * D]``:

    q4 = transpose(reshape(q, [B, S, H, D]), [0, 2, 1, 3])     likewise v4; k4 ends [0, 2, 3, 1]
    scores = matmul(q4, k4)                                    [B, H, S, S]
    scores = scores / c  or  scores * c                        (any number, before the mask,
    scores = scores + M  or  select(M, scores, -big)            or after it by at least one)
    out = matmul(softmax(scores, axis=-1), v4)                 [B, H, S, D]
    y = reshape(transpose(out, [0, 2, 1, 3]), [B, S, H * D])

Any of the four-axis tensors may have ``B`` and ``H`` merged (``[B * H, S, S]``), as
PyTorch's batched matmuls do, and consecutive transposes count as one. The pattern becomes
``wse.attention`` on the ``[B * S, H * D]`` views of ``q``, ``k`` and ``v``, whose kernel keeps
the heads spread over the mesh's columns and streams keys and values over the sequence
(``cgc.machine.plan_attention``), where the matmuls hold every head whole on each PE and
move the heads' transposes over the fabric.

A mask must be known at compile time: an inline constant, or a weight the compile holds fixed
that the driver found causal (``causal_masks``) or allowing everything (``open_masks``) by
its values (``mask_kind``). A causal mask blocks exactly the later keys with a value of at
most ``MASKED`` (a half-precision one: its lowest value; ``False`` for ``select``), so that its
``exp`` is zero as the fused kernel's ``-inf`` is. The ops the pattern leaves unused are erased.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from math import prod

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue
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

MASKED = -1e9
"""The largest value an additive mask (or a select's fill) may block a score with."""

CAUSAL, OPEN = "causal", "open"
MASK_ROWS = 256
"""Rows of a mask ``mask_kind`` reads at a time."""


def mask_kind(mask: np.ndarray) -> str | None:
    """Whether ``mask`` (``[..., S, S]``, every leading slice alike) is causal, open, or
    neither (``None``): a boolean one keeps the entries it is true at, an additive one
    blocks those at most ``MASKED``. It reads ``MASK_ROWS`` rows of every slice at a time, so
    that a large mask costs little memory beyond its own."""
    if mask.ndim < 2 or mask.shape[-1] != mask.shape[-2] or not mask.size:
        return None
    size = mask.shape[-1]
    slices = mask.reshape(-1, size, size)
    is_open = is_causal = True
    for start in range(0, size, MASK_ROWS):
        rows = slices[:, start : start + MASK_ROWS]
        if not (rows == rows[:1]).all():
            return None
        allowed = rows[0] if mask.dtype == np.bool_ else _additive_allowed(rows[0])
        if allowed is None:
            return None
        earlier = np.arange(start, start + len(allowed))[:, None] >= np.arange(size)
        is_open = is_open and bool(allowed.all())
        is_causal = is_causal and np.array_equal(allowed, earlier)
        if not (is_open or is_causal):
            return None
    return OPEN if is_open else CAUSAL


def _additive_allowed(rows: np.ndarray) -> np.ndarray | None:
    """Where an additive mask's ``rows`` let a score through (add zero), if they block the
    rest."""
    if rows.dtype.kind != "f":
        return None
    allowed = rows == 0
    blocked = rows[~allowed]
    return allowed if (blocked.astype(np.float64) <= _blocking(rows.dtype)).all() else None


def _blocking(dtype: np.dtype) -> float:
    """The largest score bias that blocks a score of ``dtype``: ``MASKED``, or the lowest
    value of a type that cannot hold it (half precision)."""
    return max(MASKED, float(np.finfo(dtype).min))


def _mask_candidates(module: ModuleOp) -> dict[str, wse.WeightOp]:
    """The weights an add or a select reads whose last two axes are square."""
    found = {}
    for op in module.walk():
        if not isinstance(op, wse.AddOp | wse.SelectOp):
            continue
        for operand in op.operands:
            owner = operand.owner
            shape = wse.tensor_shape(operand)
            square = len(shape) >= 2 and shape[-1] == shape[-2]
            if isinstance(owner, wse.WeightOp) and owner.perm is None and square:
                found[owner.weight_name.data] = owner
    return found


def fixed_masks(
    module: ModuleOp, weights: Mapping[str, np.ndarray], trained: Callable[[wse.WeightOp], bool]
) -> FuseAttentionPass:
    """The pass told which of ``module``'s weights are masks: those it reads beside square
    axes whose values (in ``weights``) are causal or open, unless ``trained`` (a training
    changes them)."""
    kinds: dict[str, list[str]] = {CAUSAL: [], OPEN: []}
    for name, op in sorted(_mask_candidates(module).items()):
        if name in weights and not trained(op):
            kind = mask_kind(weights[name])
            if kind is not None:
                kinds[kind].append(name)
    return FuseAttentionPass(tuple(kinds[CAUSAL]), tuple(kinds[OPEN]))


@dataclass(frozen=True)
class Heads:
    """A token-major tensor ``[B, S, H * D]`` seen as four axes ``[B, S, H, D]``, permuted."""

    source: SSAValue
    batch: int
    sequence: int
    heads: int
    depth: int
    perm: tuple[int, ...]
    """The axes of ``[B, S, H, D]`` in the order the viewing tensor has them."""


def _merged_leading(op: object) -> bool:
    """Whether ``op`` is a reshape that only merges or splits the axes before the last two."""
    if not isinstance(op, wse.ReshapeOp):
        return False
    before, after = wse.tensor_shape(op.input), wse.tensor_shape(op.result)
    return before[-2:] == after[-2:] and len(before) >= 2 and len(after) >= 2


def _through_leading(value: SSAValue) -> SSAValue:
    """``value`` before the reshapes that merge or split its leading axes."""
    while _merged_leading(owner := value.owner):
        assert isinstance(owner, wse.ReshapeOp)
        value = owner.input
    return value


def _heads(value: SSAValue) -> Heads | None:
    """The token-major tensor that ``value`` views as heads, through leading reshapes and
    transposes back to the reshape that splits the hidden axis."""
    value, perm = _through_transposes(_through_leading(value))
    split = value.owner
    if not isinstance(split, wse.ReshapeOp):
        return None
    source = split.input
    before, after = wse.tensor_shape(source), wse.tensor_shape(split.result)
    if len(before) != 3 or len(after) != 4 or before[:2] != after[:2]:
        return None
    batch, sequence, heads, depth = after
    if before[2] != heads * depth:
        return None
    return Heads(source, batch, sequence, heads, depth, perm)


def _through_transposes(value: SSAValue) -> tuple[SSAValue, tuple[int, ...]]:
    """``value`` before its rank-4 transposes, and where each of its axes comes from there."""
    perm: tuple[int, ...] = (0, 1, 2, 3)
    if len(wse.tensor_shape(value)) != 4:
        return value, ()
    while isinstance(value.owner, wse.TransposeOp):
        step = value.owner.perm.get_values()
        perm = tuple(step[axis] for axis in perm)
        value = value.owner.input
    return value, perm


def _scalar(value: SSAValue) -> float | None:
    """The value of a one-element inline constant."""
    owner = value.owner
    if isinstance(owner, wse.ConstantOp):
        array = dense_to_numpy(owner.value)
        if array.size == 1 and array.dtype.kind == "f":
            return float(array.reshape(()))
    return None


@dataclass(frozen=True)
class Bias:
    """What the ops between the scores' matmul and the softmax do to the scores."""

    scores: SSAValue
    scale: float
    causal: bool


class FuseAttention(RewritePattern):
    """Rewrites the last reshape of an attention pattern (see the module docstring)."""

    def __init__(self, causal_masks: Iterable[str], open_masks: Iterable[str]):
        self.kinds = {**dict.fromkeys(open_masks, OPEN), **dict.fromkeys(causal_masks, CAUSAL)}

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: wse.ReshapeOp, rewriter: PatternRewriter, /) -> None:
        found = self._attention_output(op)
        if found is None:
            return
        product, heads = found[0].owner, found[1]
        assert isinstance(product, wse.MatmulOp)
        value = _heads(product.rhs)
        softmax = _through_leading(product.lhs).owner
        if value is None or value.perm != (0, 2, 1, 3) or not isinstance(softmax, wse.SoftmaxOp):
            return
        if softmax.axis.value.data not in (-1, len(wse.tensor_shape(softmax.input)) - 1):
            return
        bias = self._bias(softmax.input)
        if bias is None or not isinstance(bias.scores.owner, wse.MatmulOp):
            return
        query, key = _heads(bias.scores.owner.lhs), _heads(bias.scores.owner.rhs)
        if query is None or key is None or query.perm != (0, 2, 1, 3) or key.perm != (0, 2, 3, 1):
            return
        shapes = {(h.batch, h.heads, h.sequence, h.depth) for h in (query, key, value)}
        if shapes != {heads}:
            return
        self._fuse(op, rewriter, (query, key, value), bias)

    @staticmethod
    def _attention_output(op: wse.ReshapeOp) -> tuple[SSAValue, tuple[int, ...]] | None:
        """The ``probs @ v`` whose heads ``op`` merges back to ``[B, S, H * D]``, if it does,
        and its shape as ``[B, H, S, D]``."""
        merged = wse.tensor_shape(op.result)
        value, perm = _through_transposes(op.input)
        if perm != (0, 2, 1, 3):
            return None
        heads = wse.tensor_shape(value)
        value = _through_leading(value)
        if not isinstance(value.owner, wse.MatmulOp):
            return None
        batch, head_count, sequence, depth = heads
        if merged[-1] != head_count * depth or prod(merged[:-1]) != batch * sequence:
            return None
        return value, heads

    def _bias(self, value: SSAValue) -> Bias | None:
        """The scale and the mask that the ops before the softmax apply to the scores. A
        factor below one after a mask would shrink the mask's blocking values, so a mask
        counts only where what follows it scales by at least one."""
        scale, causal = 1.0, False
        while True:
            value = _through_leading(value)
            owner = value.owner
            if isinstance(owner, wse.MatmulOp):
                return Bias(value, scale, causal)
            if isinstance(owner, wse.DivOp) and (c := _scalar(owner.rhs) or 0.0) > 0:
                scale, value = scale / c, owner.lhs
            elif isinstance(owner, wse.MulOp) and (factor := self._factor(owner)) is not None:
                scale, value = scale * factor[0], factor[1]
            elif scale < 1:
                return None
            elif isinstance(owner, wse.AddOp) and (added := self._masked(owner)) is not None:
                causal, value = causal or added[0] == CAUSAL, added[1]
            elif isinstance(owner, wse.SelectOp) and (kind := self._selected(owner)) is not None:
                causal, value = causal or kind == CAUSAL, owner.operands[1]
            else:
                return None

    @staticmethod
    def _factor(op: wse.MulOp) -> tuple[float, SSAValue] | None:
        for constant, other in ((op.rhs, op.lhs), (op.lhs, op.rhs)):
            c = _scalar(constant)
            if c is not None and c > 0:
                return c, other
        return None

    def _masked(self, op: wse.AddOp) -> tuple[str, SSAValue] | None:
        for mask, other in ((op.rhs, op.lhs), (op.lhs, op.rhs)):
            kind = self._kind(mask)
            if kind is not None:
                return kind, other
        return None

    def _selected(self, op: wse.SelectOp) -> str | None:
        condition, _, fill = op.operands
        blocked = _scalar(fill)
        dtype = np.dtype(wse.numpy_dtype(wse.element_type(op.result)))
        if blocked is None or blocked > _blocking(dtype):
            return None
        return self._kind(condition)

    def _kind(self, mask: SSAValue) -> str | None:
        """Whether ``mask`` is a known causal or open mask (``None``: not one)."""
        owner = mask.owner
        if isinstance(owner, wse.ConstantOp):
            return mask_kind(dense_to_numpy(owner.value))
        if isinstance(owner, wse.WeightOp) and owner.perm is None:
            return self.kinds.get(owner.weight_name.data)
        return None

    @staticmethod
    def _fuse(
        op: wse.ReshapeOp, rewriter: PatternRewriter, qkv: tuple[Heads, ...], bias: Bias
    ) -> None:
        query = qkv[0]
        tokens, width = query.batch * query.sequence, query.heads * query.depth
        location = bias.scores.owner.location  # type: ignore[union-attr]
        flat = [wse.ReshapeOp(h.source, (tokens, width)) for h in qkv]
        fused = wse.AttentionOp(
            flat[0].result,
            flat[1].result,
            flat[2].result,
            query.sequence,
            query.heads,
            query.heads,
            bias.causal,
            bias.scale,
        )
        merged = wse.ReshapeOp(fused.result, wse.tensor_shape(op.result))
        for new in (*flat, fused):
            new.location = location
        merged.location = op.location
        rewriter.replace(op, [*flat, fused, merged])


@dataclass(frozen=True)
class FuseAttentionPass(ModulePass):
    """Rewrites attention written as matmuls and a softmax into ``wse.attention``."""

    name = "fuse-attention"

    causal_masks: tuple[str, ...] = ()
    """Weights held fixed whose values are a causal mask."""
    open_masks: tuple[str, ...] = ()
    """Weights held fixed whose values mask nothing."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pattern = FuseAttention(self.causal_masks, self.open_masks)
        PatternRewriteWalker(GreedyRewritePatternApplier([pattern])).rewrite_module(op)
