"""Gives a decoder's self-attention a key-value cache: each causal ``wse.attention`` becomes
``wse.cached_attention`` on two ``wse.kv_cache`` of ``capacity`` tokens a sequence.

A decoder imported from a graph (ONNX, ``torch.export``) computes attention over the tokens
it is given; generating, it is given a chunk of a prompt or one new token a sequence, and
must attend to every token before them as well. The tokens' positions are the function's
argument marked ``wse.every_layer`` (``[B, s]``): each attention writes its new keys and
values into its caches at those rows and attends to its sequence's rows up to each query's
own position, as ``wse.cached_attention`` states. A causal mask over the ``s`` tokens given
says nothing more than the positions do, so it goes (a single token's attention has none to
say); a sliding window stays. A mask the graph computes from the positions alone (as
transformers' mask builders do, finding packed sequences where positions restart) is a
bias operand until now: the pass evaluates it at positions ``0 .. s - 1``, where a
generation's contiguous positions make the same mask, and takes it if it is causal (or a
causal window), dropping what computed it. A window longer than ``s`` leaves no trace in
that mask: ``windows`` gives each attention's, as a longer program of the model shows them
(``attention_masks``).

The caches are named after the attention op's location (its source node) and its rank among
the attentions, so that the programs of one generation (the prompt's and the decode step's,
imported at different lengths) name the same cache alike. An attention that is not causal
self-attention (an encoder's, a cross-attention, one whose bias is not a causal mask of the
positions: a padding mask, a position bias) has no cache to read: the pass refuses it,
naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from cgc.dialects import wse
from cgc.dialects.interpreter import Interpreter
from cgc.dialects.ir import main_function
from cgc.dialects.lowering import EVERY_LAYER
from cgc.errors import CgcError
from cgc.machine.reference.attention import Mask, mask_kind


def positions_argument(fn: func.FuncOp) -> SSAValue:
    """The argument of ``fn`` marked ``EVERY_LAYER``: the tokens' positions ``[B, s]``."""
    args = fn.body.block.args
    marks = [set(attrs.data) for attrs in fn.arg_attrs.data] if fn.arg_attrs else []
    # a function without argument attributes marks none
    marked = [arg for arg, names in zip(args, marks, strict=False) if EVERY_LAYER in names]
    if len(marked) != 1:
        raise CgcError(
            f"cache-keys-values: @{fn.sym_name.data} needs one argument marked {EVERY_LAYER} "
            f"(the tokens' positions), found {len(marked)}"
        )
    shape = wse.tensor_shape(marked[0])
    if len(shape) != 2:
        raise CgcError(f"cache-keys-values: the positions are [sequences, tokens], got {shape}")
    return marked[0]


def _mask(attention: wse.AttentionOp, positions: SSAValue) -> Mask:
    """What ``attention`` keeps, its bias (if any) evaluated at positions ``0 .. s - 1``; a
    CgcError if that is not causal self-attention."""
    name = wse.location_name(attention)
    window = 0 if attention.window is None else attention.window.value.data
    own = Mask(bool(attention.causal.value.data), window)
    single = attention.sequence.value.data == attention.keys_per_sample == 1
    if attention.bias is not None:
        bias = _positions_bias(attention.bias, positions)
        kind = None if bias is None else mask_kind(bias)
        if kind is None:
            raise CgcError(
                f"{name}: attention has no key-value cache to read: it adds a bias that is "
                "not a causal mask of the positions (a padding mask or a position bias)"
            )
        own = own.meet(kind)
    if not own.causal and not single:  # one query and one key: nothing to mask
        raise CgcError(
            f"{name}: attention has no key-value cache to read: it is not causal (an "
            "encoder's or a cross-attention)"
        )
    return own


def _positions_bias(bias: SSAValue, positions: SSAValue) -> np.ndarray | None:
    """The value of ``bias`` at positions ``0 .. s - 1`` of every sequence, if it is
    computed from the positions and constants alone."""
    cone = _cone(bias, positions)
    if cone is None:
        return None
    sequences, tokens = wse.tensor_shape(positions)
    dtype = wse.numpy_dtype(wse.element_type(positions))
    values = {positions: np.broadcast_to(np.arange(tokens, dtype=dtype), (sequences, tokens))}
    interpreter = Interpreter({})
    for op in cone:
        results = interpreter.evaluate(op, [values[operand] for operand in op.operands])
        values.update(zip(op.results, results, strict=True))
    return values[bias]


def _cone(value: SSAValue, positions: SSAValue) -> list[Operation] | None:
    """The ops ``value`` is computed by, in program order, if its only argument is
    ``positions`` and it reads no weight."""
    found: set[Operation] = set()
    pending = [value]
    while pending:
        current = pending.pop()
        if current is positions:
            continue
        owner = current.owner
        if not isinstance(owner, Operation) or isinstance(owner, wse.WeightOp):
            return None
        if owner not in found:
            found.add(owner)
            pending.extend(owner.operands)
    block = value.owner.parent_block() if isinstance(value.owner, Operation) else None
    assert block is not None
    return [op for op in block.ops if op in found]


def _erase_unused(ops: list[Operation]) -> None:
    """Erases those of ``ops`` (in program order) that nothing uses any more."""
    for op in reversed(ops):
        if all(not result.uses for result in op.results):
            Rewriter.erase_op(op)


def attention_masks(module: ModuleOp) -> list[Mask]:
    """What each causal self-attention of ``module``'s function keeps, in order (see
    ``_mask``): a program of as many tokens as a generation's longest context shows every
    sliding window that binds in it."""
    fn = main_function(module)
    positions = positions_argument(fn)
    return [_mask(o, positions) for o in fn.walk() if isinstance(o, wse.AttentionOp)]


@dataclass(frozen=True)
class CacheKeysValuesPass(ModulePass):
    """Rewrites causal self-attention into cached attention on caches of ``capacity``
    tokens a sequence, at the positions of the argument marked ``wse.every_layer``."""

    name = "cache-keys-values"

    capacity: int = 1
    """Token rows each cache holds a sequence."""
    windows: tuple[int, ...] = ()
    """Each attention's sliding window, by rank (0: none), as a longer program of the same
    model shows them (``attention_masks``): a window longer than the tokens given leaves no
    trace in their mask, and a program of one token shows nothing of its mask at all (a bias
    of one score is anything at all there; the longer program is where it is checked). A
    window the attention's own mask states and a given one: the narrower. Empty: each
    attention's own mask says."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.capacity < 1:
            raise CgcError(f"cache-keys-values: capacity must be positive, got {self.capacity}")
        for fn in op.walk():
            if isinstance(fn, func.FuncOp) and not fn.is_declaration:
                self._cache(fn)

    def _cache(self, fn: func.FuncOp) -> None:
        attentions = [o for o in fn.walk() if isinstance(o, wse.AttentionOp)]
        if self.windows and len(self.windows) != len(attentions):
            raise CgcError(
                f"cache-keys-values: {len(self.windows)} windows given (one an attention of a "
                f"longer program of the model), but @{fn.sym_name.data} has "
                f"{len(attentions)} attentions"
            )
        if not attentions:
            return
        positions = positions_argument(fn)
        for rank, attention in enumerate(attentions):
            self._rewrite(attention, rank, positions)

    def _rewrite(self, attention: wse.AttentionOp, rank: int, positions: SSAValue) -> None:
        name = wse.location_name(attention)
        mask = _mask(attention, positions)
        tokens = wse.tensor_shape(positions)
        if tokens[1:] != (attention.sequence.value.data,):
            raise CgcError(
                f"{name}: attention over {attention.sequence.value.data} tokens a sequence, "
                f"but the positions are {list(tokens)}"
            )
        sequences, width = tokens[0], wse.tensor_shape(attention.key)[1]
        rows = TensorType(wse.element_type(attention.key), (sequences * self.capacity, width))
        caches = tuple(
            wse.KvCacheOp(f"{name}#{rank}.{kind}_cache", self.capacity, rows)
            for kind in ("key", "value")
        )
        if self.windows:
            mask = mask.meet(Mask(True, self.windows[rank]))
        window = mask.window
        cached = wse.CachedAttentionOp(
            attention.query,
            attention.key,
            attention.value,
            (caches[0].result, caches[1].result),
            positions,
            attention.heads.value.data,
            attention.kv_heads.value.data,
            attention.scale.value.data,
            window if window < self.capacity else 0,
        )
        for new in (*caches, cached):
            new.location = attention.location
        bias = attention.bias
        masking = [] if bias is None else _cone(bias, positions) or []
        Rewriter.insert_op(caches, InsertPoint.before(attention))
        Rewriter.replace_op(attention, cached)
        _erase_unused(masking)
