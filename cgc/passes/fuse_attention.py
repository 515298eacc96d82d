"""Fuses multi-head attention written as matmuls and a softmax into ``wse.attention``.

Exporters write attention as its arithmetic, each in its own way. On heads ``[B, H, S, D]``:

    scores = matmul(q, kT)                                     [B, H, Sq, Sk]
    scores = scores / c  or  scores * c                        (any number, before the mask,
    scores = scores + M  or  select(M, scores, -big)            or after it by at least one)
    p = softmax(scores, axis=-1)
    p = select(isnan(p), 0, p)                                 (a guard, any number)
    out = matmul(p, v)                                         [B, H, Sq, D]

``q``, ``kT`` and ``v`` are views of the projections: a reshape splitting the hidden axis into
heads and transposes (rank 4, or rank 3 on merged leading axes, as the dynamo exporter
transposes the key), reshapes merging or splitting the leading axes (``[B * H, S, D]``, as
PyTorch's batched matmuls have them), scalar factors (the SDPA lowerings scale ``q`` and ``kT``
by ``sqrt(c)`` each), and grouped-query attention's repeat of the key and value heads
(``[B, Hkv, 1, S, D]`` broadcast to ``[B, Hkv, G, S, D]`` and merged). Where a view of heads is
not a reshape of token-major ``[B, S, H * D]`` (rotary embeddings applied after the split),
the fused op reads it through a transpose back to token-major order. The pattern becomes
``wse.attention`` on the ``[B * S, H * D]`` views, whose kernel keeps the heads spread over the
mesh's columns and streams keys and values over the sequence (``cgc.machine.plans.attention``),
where the matmuls hold every head whole on each PE and move the heads' transposes over the
fabric; the ops the pattern leaves unused are erased.

A mask must be known at compile time: an inline constant, or a weight the compile holds fixed
that the driver found causal, open, or a sliding window by its values (``mask_kind``). A mask
blocks a score with a value of at most ``MASKED`` (a half-precision one: its lowest value;
``False`` for ``select``, or ``True`` where the scores are the select's false branch), so that
its ``exp`` is zero as the fused kernel's ``-inf`` is. A mask over the keys alone (``[B, 1, 1,
Sk]``, a padding mask) counts where it keeps every key. Since such masks keep at least one key
of every query, the guards that zero a fully masked row change nothing and are dropped.

``AttentionCensus`` counts the attention blocks of a module, fused or not, and says why the
first unfused one is not: what a compile reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from math import prod

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, i1
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from cgc.dialects import wse
from cgc.dialects.ir import dense_to_numpy
from cgc.machine.reference.attention import CAUSAL, OPEN, Mask, blocking, mask_kind


def _mask_candidates(module: ModuleOp) -> dict[str, tuple[wse.WeightOp, bool]]:
    """The weights an add or a select reads beside scores (two axes or more): each with
    whether it is a select's condition that is true where a score is blocked (the scores
    its false branch, the fill its true one)."""
    found = {}
    for op in module.walk():
        if not isinstance(op, wse.AddOp | wse.SelectOp):
            continue
        condition = op.cond if isinstance(op, wse.SelectOp) else None
        inverted = isinstance(op, wse.SelectOp) and _scalar(op.true_value) is not None
        for operand in op.operands:
            owner = operand.owner
            weight = isinstance(owner, wse.WeightOp) and owner.perm is None
            if weight and len(wse.tensor_shape(operand)) >= 2:
                assert isinstance(owner, wse.WeightOp)
                found[owner.weight_name.data] = (owner, inverted and operand is condition)
    return found


def fixed_masks(
    module: ModuleOp, weights: Mapping[str, np.ndarray], trained: Callable[[wse.WeightOp], bool]
) -> FuseAttentionPass:
    """The pass told which of ``module``'s weights are masks: those it reads beside scores
    whose values (in ``weights``) are causal, open or a sliding window, unless ``trained`` (a
    training changes them)."""
    causal: list[str] = []
    open_: list[str] = []
    windowed: list[str] = []
    windows: list[int] = []
    blocking: list[str] = []
    for name, (op, inverted) in sorted(_mask_candidates(module).items()):
        if name not in weights or trained(op):
            continue
        values = weights[name]
        kind = mask_kind(~values if inverted and values.dtype == np.bool_ else values)
        if kind is None:
            continue
        if inverted and values.dtype == np.bool_:
            blocking.append(name)
        if kind.window:
            windowed.append(name)
            windows.append(kind.window)
        else:
            (causal if kind.causal else open_).append(name)
    return FuseAttentionPass(
        tuple(causal), tuple(open_), tuple(windowed), tuple(windows), tuple(blocking)
    )


def _scalar(value: SSAValue) -> float | None:
    """The value of a one-element inline constant."""
    owner = value.owner
    if isinstance(owner, wse.ConstantOp):
        array = dense_to_numpy(owner.value)
        if array.size == 1 and array.dtype.kind == "f":
            return float(array.reshape(()))
    return None


def _scaled(op: Operation) -> tuple[float, SSAValue] | None:
    """``(c, x)`` if ``op`` multiplies ``x`` by a positive scalar ``c`` (or divides it by
    ``1 / c``)."""
    if isinstance(op, wse.DivOp):
        c = _scalar(op.rhs)
        return (1 / c, op.lhs) if c is not None and c > 0 else None
    if isinstance(op, wse.MulOp):
        for constant, other in ((op.rhs, op.lhs), (op.lhs, op.rhs)):
            c = _scalar(constant)
            if c is not None and c > 0:
                return c, other
    return None


def _same_type_cast(op: object) -> bool:
    return isinstance(op, wse.CastOp) and op.input.type == op.result.type


def _merged_leading(op: object) -> bool:
    """Whether ``op`` is a reshape that only merges or splits the axes before the last two."""
    if not isinstance(op, wse.ReshapeOp):
        return False
    before, after = wse.tensor_shape(op.input), wse.tensor_shape(op.result)
    return before[-2:] == after[-2:] and len(before) >= 2 and len(after) >= 2


def _through_leading(value: SSAValue) -> SSAValue:
    """``value`` before the reshapes that merge or split its leading axes and same-type
    casts."""
    while _merged_leading(owner := value.owner) or _same_type_cast(owner):
        assert isinstance(owner, wse.ReshapeOp | wse.CastOp)
        value = owner.input
    return value


class Refused(Exception):
    """Why a block is not fused."""


Labels = tuple[str, ...]
"""What each axis of a tensor of heads holds: ``B``, ``H``, ``S``, ``D``, or ``BH`` (batch and
heads merged, batch outer)."""

TOKEN_MAJOR: Labels = ("B", "S", "H", "D")


@dataclass(frozen=True)
class Heads:
    """Query, key or value heads as the fused op reads them: ``source``, whose axes hold
    ``labels`` (or token-major ``[B, S, H * D]`` if ``flat``), scaled by ``scale`` before the
    scores, each head repeated ``group`` times to meet the query's."""

    source: SSAValue
    labels: Labels
    flat: bool
    scale: float
    group: int
    sizes: Mapping[str, int]

    def view(self, rewriter: PatternRewriter, at: Operation) -> SSAValue:
        """Inserts before ``at`` the ``[B * S, H * D]`` view of the heads."""
        sizes = self.sizes
        value = self.source
        if not self.flat:
            perm = [self.labels.index(axis) for axis in TOKEN_MAJOR]
            if perm != sorted(perm):
                transpose = wse.TransposeOp(value, perm)
                rewriter.insert(transpose, InsertPoint.before(at))
                value = transpose.result
        flat = wse.ReshapeOp(value, (sizes["B"] * sizes["S"], sizes["H"] * sizes["D"]))
        rewriter.insert(flat, InsertPoint.before(at))
        return flat.result


def _heads(value: SSAValue, labels: Labels, what: str) -> Heads:
    """The heads ``value`` views (its axes holding ``labels``), walking back through views,
    scalar factors and a grouped-query repeat (see the module docstring)."""
    scale, group = 1.0, 1
    while True:
        owner = value.owner
        if isinstance(owner, wse.TransposeOp):
            before: list[str] = [""] * len(labels)
            for axis, source in enumerate(owner.perm.get_values()):
                before[source] = labels[axis]
            labels, value = tuple(before), owner.input
        elif _same_type_cast(owner):
            assert isinstance(owner, wse.CastOp)
            value = owner.input
        elif (factor := _scaled(owner)) is not None:  # type: ignore[arg-type]
            scale, value = scale * factor[0], factor[1]
        elif isinstance(owner, wse.ReshapeOp) and _splits_hidden(owner, labels):
            sizes = dict(zip(TOKEN_MAJOR, wse.tensor_shape(owner.result), strict=True))
            return Heads(owner.input, TOKEN_MAJOR, True, scale, group, sizes)
        elif isinstance(owner, wse.ReshapeOp) and (step := _reshaped(owner, labels)) is not None:
            labels, value, repeat = step
            group *= repeat
        else:
            return _unsplit(value, labels, scale, group, what)


def _unsplit(value: SSAValue, labels: Labels, scale: float, group: int, what: str) -> Heads:
    """Heads that are no view of a token-major tensor: read through a transpose."""
    shape = wse.tensor_shape(value)
    if len(labels) != len(shape) or sorted(labels) != sorted(TOKEN_MAJOR):
        owner = value.owner
        made = owner.name if isinstance(owner, Operation) else "an input"
        raise Refused(f"the {what} is not a view of heads (it comes from {made} {list(shape)})")
    return Heads(value, labels, False, scale, group, dict(zip(labels, shape, strict=True)))


def _splits_hidden(op: wse.ReshapeOp, labels: Labels) -> bool:
    """Whether ``op`` splits token-major ``[B, S, H * D]`` into ``[B, S, H, D]``."""
    before, after = wse.tensor_shape(op.input), wse.tensor_shape(op.result)
    return labels == TOKEN_MAJOR and len(after) == 4 and before == (*after[:2], prod(after[2:]))


def _reshaped(op: wse.ReshapeOp, labels: Labels) -> tuple[Labels, SSAValue, int] | None:
    """The labels of ``op``'s input given its result's, the input, and the heads' repeat, if
    ``op`` merges or splits the leading batch and heads axes, or merges a grouped-query
    repeat."""
    before, after = wse.tensor_shape(op.input), wse.tensor_shape(op.result)
    if before[-2:] != after[-2:]:
        return None
    lead = ("B", "H")
    if (len(after), len(before)) == (3, 4) and labels[0] == "BH" and prod(before[:2]) == after[0]:
        return (*lead, *labels[1:]), op.input, 1
    if (len(after), len(before)) == (4, 3) and labels[:2] == lead and before[0] == prod(after[:2]):
        return ("BH", *labels[2:]), op.input, 1
    if len(after) == 4 and len(before) == 5 and labels[:2] == ("B", "H"):
        repeated = _repeated(op.input)
        if repeated is not None and before[1] * before[2] == after[1]:
            return labels, repeated, before[2]
    return None


def _repeated(value: SSAValue) -> SSAValue | None:
    """``x`` if ``value`` ``[B, Hkv, G, S, D]`` repeats each head of ``x`` ``[B, Hkv, S, D]``
    ``G`` times (``x`` reshaped to ``[B, Hkv, 1, S, D]`` and broadcast)."""
    broadcast = value.owner
    if not isinstance(broadcast, wse.BroadcastToOp):
        return None
    unsqueezed = broadcast.input.owner
    shape = wse.tensor_shape(value)
    if not isinstance(unsqueezed, wse.ReshapeOp):
        return None
    source = unsqueezed.input
    if wse.tensor_shape(unsqueezed.result) != (*shape[:2], 1, *shape[3:]):
        return None
    if wse.tensor_shape(source) != (*shape[:2], *shape[3:]):
        return None
    return source


@dataclass(frozen=True)
class ScoreTerm:
    """A term the scores get at run time: ``value`` added, or where ``value`` (a condition)
    blocks (is false; ``inverted``: true), ``fill``."""

    value: SSAValue
    scores: tuple[int, ...]
    """The shape of the scores it is applied to (four axes, or batch and heads merged)."""
    fill: SSAValue | None = None
    inverted: bool = False

    def emit(self, rewriter: PatternRewriter, at: Operation) -> SSAValue:
        """Inserts before ``at`` the term as an additive bias."""
        if self.fill is None:
            return self.value
        dtype = wse.numpy_dtype(wse.element_type(self.fill))
        zero = wse.ConstantOp(wse.dense_attr(np.zeros((), dtype)))
        kept, blocked = (self.fill, zero.result) if self.inverted else (zero.result, self.fill)
        bias = wse.SelectOp(self.value, kept, blocked)
        for op in (zero, bias):
            rewriter.insert(op, InsertPoint.before(at))
        return bias.result


@dataclass(frozen=True)
class Bias:
    """What the ops between the scores' matmul and the softmax do to the scores."""

    scores: wse.MatmulOp
    scale: float
    mask: Mask
    terms: tuple[ScoreTerm, ...] = ()


@dataclass(frozen=True)
class AttentionBlock:
    """An attention block matched: its heads, what its scores go through, and the product of
    the probabilities and the values it replaces."""

    query: Heads
    key: Heads
    value: Heads
    bias: Bias
    product: wse.MatmulOp
    bias_shape: tuple[int, ...] | None = None
    """The run-time terms' sum as the fused op reads it: ``[B or 1, H or 1, Sq or 1, Sk]``."""


class FuseAttention(RewritePattern):
    """Rewrites the product of an attention's probabilities and values (see the module
    docstring)."""

    def __init__(self, kinds: Mapping[str, Mask], blocking: Iterable[str]):
        self.kinds = kinds
        self.blocking = frozenset(blocking)

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: wse.MatmulOp, rewriter: PatternRewriter, /) -> None:
        if self.softmax_of(op) is None:
            return
        try:
            block = self.block(op)
        except Refused:
            return
        _fuse(block, rewriter)

    @staticmethod
    def softmax_of(product: wse.MatmulOp) -> wse.SoftmaxOp | None:
        """The softmax whose probabilities ``product`` multiplies, through guards."""
        value = _through_leading(product.lhs)
        while isinstance(select := value.owner, wse.SelectOp):
            kept = _guarded(select)
            if kept is None:
                return None
            value = _through_leading(kept)
        owner = value.owner
        return owner if isinstance(owner, wse.SoftmaxOp) else None

    def block(self, product: wse.MatmulOp) -> AttentionBlock:
        """The block whose output ``product`` is; ``Refused`` says why it is none."""
        softmax = self.softmax_of(product)
        assert softmax is not None
        rank = len(wse.tensor_shape(softmax.input))
        if softmax.axis.value.data not in (-1, rank - 1):
            raise Refused("the softmax is not over the keys (the last axis)")
        bias = self._bias(softmax.input)
        merged = len(wse.tensor_shape(bias.scores.result)) == 3
        lead: Labels = ("BH",) if merged else ("B", "H")
        query = _heads(bias.scores.lhs, (*lead, "S", "D"), "query")
        key = _heads(bias.scores.rhs, (*lead, "D", "S"), "key")
        value = _heads(product.rhs, (*lead, "S", "D"), "value")
        block = AttentionBlock(query, key, value, bias, product)
        _check_sizes(block)
        if bias.terms:
            block = replace(block, bias_shape=_bias_shape(block))
        return block

    def _bias(self, value: SSAValue) -> Bias:
        """The scale, the mask and the run-time terms that the ops before the softmax apply
        to the scores. A factor below one after a mask would shrink the mask's blocking
        values, so a mask counts only where what follows it scales by at least one, and a
        term only where nothing scales it."""
        scale, mask, terms = 1.0, OPEN, list[ScoreTerm]()
        while True:
            value = _through_leading(value)
            owner = value.owner
            if isinstance(owner, wse.MatmulOp):
                return Bias(owner, scale, mask, tuple(terms))
            if (factor := _scaled(owner)) is not None:  # type: ignore[arg-type]
                scale, value = scale * factor[0], factor[1]
                continue
            if isinstance(owner, wse.SelectOp) and (kept := _guarded(owner)) is not None:
                value = kept  # a row all blocked gets zeros from the fused kernel too
                continue
            if scale < 1:
                raise Refused(f"the scores are scaled by {scale:.3g} after the mask")
            if isinstance(owner, wse.AddOp):
                added, value, term = self._masked(owner)
            elif isinstance(owner, wse.SelectOp):
                added, value, term = self._selected(owner)
            else:
                what = owner.name if isinstance(owner, Operation) else "an input"
                raise Refused(f"the scores pass through {what} before the softmax")
            if term is not None:
                if scale != 1:
                    raise Refused(f"a bias computed at run time is scaled by {scale:.3g}")
                terms.append(term)
            mask = mask.meet(added)

    def _masked(self, op: wse.AddOp) -> tuple[Mask, SSAValue, ScoreTerm | None]:
        for mask, other in ((op.rhs, op.lhs), (op.lhs, op.rhs)):
            kind = self.kind(mask, False)
            if kind is not None:
                return kind, other, None
        for bias, other in ((op.rhs, op.lhs), (op.lhs, op.rhs)):
            if _leads_to_scores(other) and not _leads_to_scores(bias):
                return OPEN, other, ScoreTerm(bias, wse.tensor_shape(op.result))
        raise Refused(_unknown_mask(op.rhs, op.lhs))

    def _selected(self, op: wse.SelectOp) -> tuple[Mask, SSAValue, ScoreTerm | None]:
        dtype = np.dtype(wse.numpy_dtype(wse.element_type(op.result)))
        for fill, scores, inverted in ((op.false_value, op.true_value, False),
                                       (op.true_value, op.false_value, True)):  # fmt: skip
            blocked = _scalar(fill)
            if blocked is not None and blocked <= blocking(dtype):
                kind = self.kind(op.cond, inverted)
                if kind is not None:
                    return kind, scores, None
                if wse.element_type(op.cond) != i1:
                    raise Refused(_unknown_mask(op.cond))
                return OPEN, scores, ScoreTerm(op.cond, wse.tensor_shape(op.result), fill, inverted)
        raise Refused("a select before the softmax fills with no value that blocks a score")

    def kind(self, mask: SSAValue, inverted: bool) -> Mask | None:
        """What ``mask`` keeps, if it is a known mask (``inverted``: a condition true where a
        score is blocked)."""
        owner = mask.owner
        if isinstance(owner, wse.ConstantOp):
            values = dense_to_numpy(owner.value)
            if inverted:
                if values.dtype != np.bool_:
                    return None
                values = ~values
            return mask_kind(values)
        if isinstance(owner, wse.WeightOp) and owner.perm is None:
            name = owner.weight_name.data
            if inverted == (name in self.blocking):
                return self.kinds.get(name)
        return None


def _leads_to_scores(value: SSAValue, depth: int = 8) -> bool:
    """Whether ``value`` is the scores' matmul through the ops that scale and mask it."""
    value = _through_leading(value)
    owner = value.owner
    if isinstance(owner, wse.MatmulOp) or depth == 0:
        return isinstance(owner, wse.MatmulOp)
    if (factor := _scaled(owner)) is not None:  # type: ignore[arg-type]
        return _leads_to_scores(factor[1], depth - 1)
    if isinstance(owner, wse.AddOp | wse.SelectOp):
        return any(_leads_to_scores(v, depth - 1) for v in owner.operands)
    return False


def _unknown_mask(*operands: SSAValue) -> str:
    """Why a mask is not known, naming where it comes from."""
    for value in operands:
        owner = value.owner
        if isinstance(owner, wse.WeightOp):
            name = owner.weight_name.data
            return f"its mask (weight '{name}') is neither causal, open nor a sliding window"
    return (
        "its mask or bias is computed at run time (from an input, or from weights such as a "
        "relative position bias)"
    )


def _guarded(select: wse.SelectOp) -> SSAValue | None:
    """The value a guard ``select(c, 0, x)`` passes where ``c`` can only hold on a row whose
    keys are all blocked: ``isnan(x)`` (a softmax of such a row), or its bias's maximum being
    ``-inf``."""
    if _scalar(select.true_value) != 0:
        return None
    value, condition = select.false_value, select.cond.owner
    if isinstance(condition, wse.IsNanOp) and condition.input is value:
        return value
    if isinstance(condition, wse.EqualOp) and isinstance(condition.lhs.owner, wse.ReduceMaxOp):
        return value
    return None


def _check_sizes(block: AttentionBlock) -> None:
    """Refuses heads that disagree."""
    q, k, v = block.query.sizes, block.key.sizes, block.value.sizes
    if k != v or block.key.group != block.value.group:
        raise Refused(f"the key {_shape(k)} and the value {_shape(v)} heads differ")
    if q["B"] != k["B"] or q["D"] != k["D"]:
        raise Refused(f"the query {_shape(q)} and the key {_shape(k)} heads differ")
    if q["H"] != k["H"] * block.key.group or q["H"] % k["H"]:
        raise Refused(f"{q['H']} query heads do not group over {k['H']} key heads")
    if block.bias.mask.causal and q["S"] != k["S"]:
        raise Refused(f"a causal mask over {q['S']} queries and {k['S']} keys")
    if block.query.scale * block.key.scale * block.bias.scale <= 0:
        raise Refused("the scores' scale is not positive")
    out = wse.tensor_shape(block.product.result)
    if prod(out) != q["B"] * q["H"] * q["S"] * q["D"] or out[-2:] != (q["S"], q["D"]):
        raise Refused(f"the output {list(out)} is not the query's heads")


def _bias_shape(block: AttentionBlock) -> tuple[int, ...]:
    """The four axes the sum of the run-time terms of ``block`` is read in."""
    q, keys = block.query.sizes, block.key.sizes["S"]
    full = (q["B"], q["H"], q["S"], keys)
    shapes = [_four_axes(term, full) for term in block.bias.terms]
    return tuple(int(n) for n in np.broadcast_shapes(*shapes))


def _four_axes(term: ScoreTerm, full: tuple[int, ...]) -> tuple[int, ...]:
    """The axes ``[B or 1, H or 1, Sq or 1, Sk]`` of a term's values, which broadcast over
    scores of ``term.scores``."""
    shape, scores = wse.tensor_shape(term.value), term.scores
    refused = Refused(f"a bias of shape {list(shape)} does not fit the scores {list(scores)}")
    if len(shape) > len(scores) or not shape or shape[-1] != full[3]:
        raise refused
    shape = (1,) * (len(scores) - len(shape)) + tuple(shape)
    if len(scores) == 3:  # heads merged with the batch
        if shape[0] not in (1, full[0] * full[1]):
            raise refused
        shape = ((1, 1) if shape[0] == 1 else full[:2]) + shape[1:]
    if len(shape) != 4 or not all(n in (1, m) for n, m in zip(shape, full, strict=True)):
        raise refused
    return shape


def _shape(sizes: Mapping[str, int]) -> str:
    return "[" + ", ".join(f"{axis}={sizes[axis]}" for axis in ("B", "H", "S", "D")) + "]"


def _fuse(block: AttentionBlock, rewriter: PatternRewriter) -> None:
    """Replaces ``block``'s output by ``wse.attention`` on token-major views."""
    product, q, k = block.product, block.query.sizes, block.key.sizes
    location = block.bias.scores.location
    at = product
    query, key, value = (h.view(rewriter, at) for h in (block.query, block.key, block.value))
    scale = block.bias.scale * block.query.scale * block.key.scale
    mask = block.bias.mask
    bias = _emit_bias(block, rewriter, at)
    fused = wse.AttentionOp(query, key, value, q["S"], q["H"], k["H"], mask.causal, scale,
                            mask.window, k["S"], bias)  # fmt: skip
    rewriter.insert(fused, InsertPoint.before(at))
    for view in (query, key, value):
        view.owner.location = location  # type: ignore[union-attr]
    fused.location = location
    merged = _merged_output(product)
    if merged is not None:
        out = wse.ReshapeOp(fused.result, wse.tensor_shape(merged.result))
        out.location = merged.location
        rewriter.replace(merged, [out])
        return
    heads = wse.ReshapeOp(fused.result, (q["B"], q["S"], q["H"], q["D"]))
    back = wse.TransposeOp(heads.result, [0, 2, 1, 3])
    shaped = wse.ReshapeOp(back.result, wse.tensor_shape(product.result))
    for new in (heads, back, shaped):
        new.location = product.location
    rewriter.replace(product, [heads, back, shaped])


def _emit_bias(block: AttentionBlock, rewriter: PatternRewriter, at: Operation) -> SSAValue | None:
    """Inserts before ``at`` the sum of ``block``'s run-time terms in its four axes."""
    if block.bias_shape is None:
        return None
    q, keys = block.query.sizes, block.key.sizes["S"]
    full = (q["B"], q["H"], q["S"], keys)
    total: SSAValue | None = None
    for term in block.bias.terms:
        shaped = wse.ReshapeOp(term.emit(rewriter, at), _four_axes(term, full))
        rewriter.insert(shaped, InsertPoint.before(at))
        value = shaped.result
        if total is not None:
            added = wse.AddOp(total, value)
            rewriter.insert(added, InsertPoint.before(at))
            value = added.result
        total = value
    return total


def _merged_output(product: wse.MatmulOp) -> wse.ReshapeOp | None:
    """The reshape that merges ``product``'s heads back to ``[.., H * D]`` through leading
    reshapes and transposes composing to ``(0, 2, 1, 3)``, if that is all that reads it."""
    value: SSAValue = product.result
    perm: tuple[int, ...] = (0, 1, 2, 3)
    while value.has_one_use():
        user = value.get_user_of_unique_use()
        assert user is not None
        if _merged_leading(user) and len(wse.tensor_shape(user.results[0])) in (3, 4):
            value = user.results[0]
        elif isinstance(user, wse.TransposeOp) and len(wse.tensor_shape(value)) == 4:
            step = user.perm.get_values()
            perm = tuple(perm[axis] for axis in step)
            value = user.result
        elif isinstance(user, wse.ReshapeOp) and perm == (0, 2, 1, 3):
            before, after = wse.tensor_shape(value), wse.tensor_shape(user.result)
            if after[-1] == before[2] * before[3] and prod(after[:-1]) == before[0] * before[1]:
                return user
            return None
        else:
            return None
    return None


class UngroupedKeys(RewritePattern):
    """Rewrites a ``wse.attention`` whose keys and values are grouped-query repeats of fewer
    heads (a frontend that lowered PyTorch's attention after transformers' ``repeat_kv``) to
    read the heads before the repeat, as ``kv_heads``."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: wse.AttentionOp, rewriter: PatternRewriter, /) -> None:
        key, value = _repeated_heads(op.key), _repeated_heads(op.value)
        if key is None or value is None or key.group != value.group:
            return
        if key.sizes != value.sizes or key.group * key.sizes["H"] != op.kv_heads.value.data:
            return
        keys, values = (h.view(rewriter, op) for h in (key, value))
        window = 0 if op.window is None else op.window.value.data
        fused = wse.AttentionOp(
            op.query, keys, values, op.sequence.value.data, op.heads.value.data,
            key.sizes["H"], bool(op.causal.value.data), op.scale.value.data, window,
            op.keys_per_sample, op.bias,
        )  # fmt: skip
        fused.location = op.location
        rewriter.replace(op, [fused])


def _repeated_heads(value: SSAValue) -> Heads | None:
    """The heads a token-major key or value ``[B * S, H * D]`` repeats, if it is a view of a
    grouped-query repeat."""
    view = value.owner
    if not isinstance(view, wse.ReshapeOp) or len(wse.tensor_shape(view.input)) != 4:
        return None
    try:
        heads = _heads(view.input, TOKEN_MAJOR, "key")
    except Refused:
        return None
    return heads if heads.group > 1 and heads.scale == 1 else None


@dataclass(frozen=True)
class AttentionCensus:
    """The attention blocks of a module: how many there are, how many run fused, and the
    first that does not (its location's name and why)."""

    found: int
    fused: int
    first_unfused: tuple[str, str] | None

    def to_json(self) -> dict:
        first = self.first_unfused
        return {
            "found": self.found,
            "fused": self.fused,
            "first_unfused": None if first is None else {"name": first[0], "reason": first[1]},
        }


@dataclass(frozen=True)
class FuseAttentionPass(ModulePass):
    """Rewrites attention written as matmuls and a softmax into ``wse.attention``."""

    name = "fuse-attention"

    causal_masks: tuple[str, ...] = ()
    """Weights held fixed whose values are a causal mask."""
    open_masks: tuple[str, ...] = ()
    """Weights held fixed whose values mask nothing."""
    windowed_masks: tuple[str, ...] = ()
    """Weights held fixed whose values are a causal sliding window..."""
    windows: tuple[int, ...] = ()
    """... of these many keys each."""
    blocking_masks: tuple[str, ...] = ()
    """The boolean masks above that are true where a score is blocked."""

    def pattern(self) -> FuseAttention:
        kinds = {
            **dict.fromkeys(self.open_masks, OPEN),
            **dict.fromkeys(self.causal_masks, CAUSAL),
            **{n: Mask(True, w) for n, w in zip(self.windowed_masks, self.windows, strict=True)},
        }
        return FuseAttention(kinds, self.blocking_masks)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        patterns = GreedyRewritePatternApplier([self.pattern(), UngroupedKeys()])
        PatternRewriteWalker(patterns).rewrite_module(op)

    def census(self, module: ModuleOp) -> AttentionCensus:
        """The attention blocks of ``module`` after this pass: each fused op, and each
        product of a softmax and values it left (with the reason of the first)."""
        pattern = self.pattern()
        fused, first, unfused = 0, None, 0
        for op in module.walk():
            if isinstance(op, wse.AttentionOp):
                fused += 1
            elif isinstance(op, wse.MatmulOp) and (softmax := pattern.softmax_of(op)) is not None:
                unfused += 1
                if first is None:
                    first = (_name(softmax), _reason(pattern, op))
        return AttentionCensus(fused + unfused, fused, first)


def _name(op: Operation) -> str:
    location = op.location
    desc = getattr(location, "desc", None)
    return desc.data if desc is not None else wse.mnemonic(op)


def _reason(pattern: FuseAttention, product: wse.MatmulOp) -> str:
    try:
        pattern.block(product)
    except Refused as refused:
        return str(refused)
    return "it matches, but the pass was not run on it"
