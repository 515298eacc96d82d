"""Groups the ops of ``@main`` into layers.

A layer is what runs as one unit on the wafer: in pipelined mode one rectangle of PEs, in
weight-streaming mode one round of weight streaming. Walking the ops in program order, a new
layer opens at a matmul, a pooling window or the patch gathering of a convolution once the
current layer already holds a matmul or a pooling window; everything else (bias adds,
activations, normalizations, reshapes) joins the layer being built, and so does a pooling
window over the whole image (a global pool: one output position, a reduction like a mean).
Fused attention (and generation's cached attention) counts as a matmul. A token embedding (a
lookup of a weight's rows by ids the model is given) is a layer of its own: it opens one after
a heavy layer, and the matmul after it opens the next, so that reports name it rather than
fold its table into the first projection. Each layer is named after the source node of the op
that opened it.

Weights, constants and key-value caches are created inside every layer that uses them, so a
layer's body is isolated: it knows its own weights, and a weight shared by two layers (tied
embeddings, say) appears in both.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, BlockArgument, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from cgc.dialects import wse
from cgc.dialects.ir import main_function
from cgc.dialects.wse import location_name, tensor_shape

COMPUTE = (
    wse.MatmulOp,
    wse.MatmulTransposeAOp,
    wse.MaxPoolOp,
    wse.AvgPoolOp,
    wse.AttentionOp,
    wse.CachedAttentionOp,
)
"""Ops that make a layer heavy."""
OPENERS = (*COMPUTE, wse.Im2ColOp)
"""Ops that open a new layer once the current one is heavy."""
SOURCES = (wse.WeightOp, wse.ConstantOp, wse.KvCacheOp)
RELABELS = (wse.ReshapeOp, wse.CastOp)
"""Ops that change how ids are shaped or typed, not which rows they pick."""


def group_ops(ops: list[Operation]) -> list[list[Operation]]:
    """Splits the non-source ops of a block into layers, in program order."""
    groups: list[list[Operation]] = []
    current: list[Operation] = []
    heavy = looked_up = False  # the layer holds compute; it holds a token embedding
    for op in ops:
        if isinstance(op, (*SOURCES, func.ReturnOp)):
            continue
        whole = is_global_pool(op)
        embedding = is_token_embedding(op)
        computes = isinstance(op, OPENERS) and not whole
        if (computes and (heavy or looked_up)) or (embedding and heavy):
            groups.append(current)
            current, heavy, looked_up = [], False, False
        current.append(op)
        heavy |= isinstance(op, COMPUTE) and not whole
        looked_up |= embedding
    if current:
        groups.append(current)
    return groups


def _relabeled(value: SSAValue) -> SSAValue:
    """``value`` before the reshapes and casts that made it."""
    while isinstance(value.owner, RELABELS):
        value = value.owner.operands[0]
    return value


def is_token_embedding(op: Operation) -> bool:
    """Whether ``op`` looks up rows of a weight by ids that are a graph input (reshaped or
    cast at most): a token embedding, or another table indexed by the model's inputs (token
    types, positions given as input)."""
    return (
        isinstance(op, wse.GatherOp)
        and op.axis.value.data == 0
        and isinstance(_relabeled(op.data).owner, wse.WeightOp)
        and isinstance(_relabeled(op.indices), BlockArgument)
    )


def is_global_pool(op: Operation) -> bool:
    """Whether ``op`` is a pooling window over the whole unpadded image: a reduction over the
    spatial axes, which costs its layer no more than a mean would, so it opens none."""
    if not isinstance(op, wse.PoolOp) or any(op.pads.get_values()):
        return False
    shape = tensor_shape(op.input)
    spatial = shape[1:-1] if op.is_channels_last else shape[2:]
    return tuple(op.kernel.get_values()) == tuple(spatial)


def opener(group: list[Operation]) -> Operation:
    """The op that opened a layer (its first op if none did): a token embedding's first
    lookup, or its heavy op."""
    return next(
        (
            op
            for op in group
            if (isinstance(op, OPENERS) and not is_global_pool(op)) or is_token_embedding(op)
        ),
        group[0],
    )


def layer_name(group: list[Operation], taken: set[str]) -> str:
    """A unique name from the op that opened the layer."""
    anchor = opener(group)
    base = location_name(anchor) or location_name(group[0]) or anchor.name.split(".")[1]
    name, suffix = base, 2
    while name in taken:
        name, suffix = f"{base}.{suffix}", suffix + 1
    taken.add(name)
    return name


def build_layer(name: str, group: list[Operation]) -> tuple[wse.LayerOp, list[SSAValue]]:
    """A layer holding clones of ``group``; returns it and the values it replaces."""
    members = set(group)
    inputs: list[SSAValue] = []
    sources: list[Operation] = []
    for op in group:
        for value in op.operands:
            owner = value.owner
            if isinstance(owner, SOURCES):
                if owner not in sources:
                    sources.append(owner)
            elif owner not in members and value not in inputs:
                inputs.append(value)
    outputs: list[SSAValue] = [
        r for op in group for r in op.results if any(u.operation not in members for u in r.uses)
    ]
    block = Block(arg_types=[v.type for v in inputs])
    mapping: dict[SSAValue, SSAValue] = dict(zip(inputs, block.args, strict=True))
    for op in [*sources, *group]:
        block.add_op(op.clone(mapping))
    block.add_op(wse.YieldOp(*[mapping[v] for v in outputs]))
    layer = wse.LayerOp(name, inputs, [v.type for v in outputs], Region(block))
    layer.location = opener(group).location
    return layer, outputs


@dataclass(frozen=True)
class FormLayersPass(ModulePass):
    """Wraps the ops of ``@main`` into ``wse.layer`` regions."""

    name = "form-layers"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        block = main_function(op).body.block
        if any(isinstance(o, wse.LayerOp) for o in block.ops):
            return
        taken: set[str] = set()
        for group in group_ops(list(block.ops)):
            layer, replaced = build_layer(layer_name(group, taken), group)
            Rewriter.insert_op(layer, InsertPoint.before(group[0]))
            for old, new in zip(replaced, layer.results, strict=True):
                old.replace_all_uses_with(new)
            for old_op in reversed(group):
                Rewriter.erase_op(old_op)
        for source in [o for o in block.ops if isinstance(o, SOURCES)]:
            if not any(r.uses for r in source.results):
                Rewriter.erase_op(source)
            else:  # returned as it is: it still needs a layer to live on
                layer, replaced = build_layer(layer_name([source], taken), [source])
                end = block.last_op
                assert end is not None  # the return that returns ``source``
                Rewriter.insert_op(layer, InsertPoint.before(end))
                replaced[0].replace_all_uses_with(layer.results[0])
                Rewriter.erase_op(source)
