"""Keeps convolutional activations channels-last between the ops that can work on them so.

A tensor is laid out on the wafer by its two trailing axes; the leading ones stay whole on
every PE. An (N, C, H, W) activation late in a CNN (many channels, a small image) therefore
sits on only H x W PEs, each holding every channel. A convolution's matmul produces its
result channels-last, (N, H, W, C), spread over the mesh; the transpose back to (N, C, H, W)
is what piles it up.

This pass carries the channels-last form forward instead: starting from every transpose that
moves the channels from last to second (``perm = [0, r-1, 1, ..., r-2]``), each following op
that can work on channels-last data gets a channels-last twin: elementwise ops (their other
operands are permuted to match: weights and constants at no cost), reductions that keep
their axes, concatenations, max and average pooling (``channels_last``), and convolutions'
``im2col`` (which then reads channels-last input directly). Where an (N, C, H, W) value is
still needed, by an op that cannot take the channels-last form, one transpose of its twin
provides it. The results are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from cgc.dialects import wse

ELEMENTWISE = (
    wse.UnaryOp,
    wse.PredicateOp,
    wse.BinaryOp,
    wse.SelectOp,
    wse.CastOp,
    wse.BitcastOp,
)
"""Ops that compute each element from the elements at the same position (broadcasting)."""


def channels_to_front(rank: int) -> list[int]:
    """The permutation from (N, *spatial, C) to (N, C, *spatial)."""
    return [0, rank - 1, *range(1, rank - 1)]


def inverse(perm: Sequence[int]) -> list[int]:
    """The permutation that undoes ``perm``."""
    result = [0] * len(perm)
    for i, p in enumerate(perm):
        result[p] = i
    return result


def moves_only_unit_axes(shape: Sequence[int], perm: Sequence[int]) -> bool:
    """Whether transposing ``shape`` by ``perm`` keeps the order of the axes longer than one,
    which makes the transpose a reshape."""
    kept = [p for p in perm if shape[p] != 1]
    return kept == sorted(kept)


class ChannelsLast:
    """The rewrite of one block.

    First the choice: in program order, the ops that could work channels-last (their
    operands have twins, or cost nothing to permute); then, backwards, the ones whose result
    no chosen op consumes are dropped again, since their twin would only move the transpose
    below them (unless going back is a mere reshape, as after a global pooling). Then the
    rewrite: the chosen ops get their twins in program order, and the uses that remain on
    (N, C, *spatial) values are served by one transpose each.
    """

    def __init__(self, block: Block):
        self.block = block
        self.twin: dict[SSAValue, SSAValue] = {}
        """Each (N, C, *spatial) value that has a channels-last twin, and the twin."""
        self.replaced: set[Operation] = set()

    def run(self) -> None:
        """Chooses the ops, builds their twins in program order, then rewires the uses."""
        chosen = self.choose()
        for op in list(self.block.ops):
            if isinstance(op, wse.TransposeOp) and self._moves_channels_to_front(op):
                self.twin[op.result] = op.input
            elif op in chosen:
                self.rewrite(op)
        self.rewire()

    # -- the choice -------------------------------------------------------------------------

    def choose(self) -> set[Operation]:
        """The ops that get a channels-last twin (or, for ``im2col``, read the twin)."""
        channels_last: set[SSAValue] = set()
        chosen: list[Operation] = []
        for op in self.block.ops:
            if isinstance(op, wse.TransposeOp) and self._moves_channels_to_front(op):
                channels_last.add(op.result)
            elif self._can_follow(op, channels_last):
                chosen.append(op)
                channels_last.update(op.results)
        kept: set[Operation] = set()
        for op in reversed(chosen):
            if (
                isinstance(op, wse.Im2ColOp)
                or self._free_to_return(op.results[0])
                or any(use.operation in kept for use in op.results[0].uses)
            ):
                kept.add(op)
        return kept

    @staticmethod
    def _free_to_return(value: SSAValue) -> bool:
        """Whether the twin of ``value`` goes back to (N, C, *spatial) by a mere reshape."""
        shape = wse.tensor_shape(value)
        twin = [shape[i] for i in inverse(channels_to_front(len(shape)))]
        return moves_only_unit_axes(twin, channels_to_front(len(shape)))

    def _can_follow(self, op: Operation, channels_last: set[SSAValue]) -> bool:
        """Whether ``op`` can take the channels-last form of its operands."""
        if not any(v in channels_last for v in op.operands):
            return False
        if isinstance(op, ELEMENTWISE):
            rank = len(wse.tensor_shape(op.results[0]))
            return all(
                len(wse.tensor_shape(v)) == rank if v in channels_last else self._cheap(v, rank)
                for v in op.operands
            )
        if isinstance(op, wse.ReduceOp):
            return bool(op.keepdims.value.data)
        if isinstance(op, wse.ConcatOp):
            return all(v in channels_last for v in op.inputs)
        if isinstance(op, wse.MaxPoolOp | wse.AvgPoolOp | wse.Im2ColOp):
            return not op.is_channels_last
        return False

    @staticmethod
    def _cheap(value: SSAValue, rank: int) -> bool:
        """Whether permuting ``value`` for an op of result rank ``rank`` costs nothing: a
        weight or constant (a view), or only unit axes moving (a reshape)."""
        shape = wse.tensor_shape(value)
        if len(shape) > rank:
            return False
        if isinstance(value.owner, wse.WeightOp | wse.ConstantOp):
            return True
        full = (1,) * (rank - len(shape)) + shape
        return moves_only_unit_axes(full, inverse(channels_to_front(rank)))

    # -- the twins --------------------------------------------------------------------------

    def rewrite(self, op: Operation) -> None:
        """Builds the channels-last twin of the chosen op ``op`` after it (an im2col is
        replaced by one that reads the twin of its input)."""
        if isinstance(op, ELEMENTWISE):
            self._elementwise(op)
        elif isinstance(op, wse.ReduceOp):
            self._reduce(op)
        elif isinstance(op, wse.ConcatOp):
            self._concat(op)
        elif isinstance(op, wse.MaxPoolOp | wse.AvgPoolOp):
            self._pool(op)
        else:
            assert isinstance(op, wse.Im2ColOp)
            self._im2col(op)

    @staticmethod
    def _moves_channels_to_front(op: wse.TransposeOp) -> bool:
        rank = len(wse.tensor_shape(op.result))
        return rank >= 3 and list(op.perm.get_values()) == channels_to_front(rank)

    def _insert(self, op: Operation, before: Operation) -> SSAValue:
        op.location = before.location
        Rewriter.insert_op(op, InsertPoint.before(before))
        return op.results[0]

    def _permute(self, value: SSAValue, perm: Sequence[int], before: Operation) -> SSAValue:
        """``value`` transposed by ``perm``: a reshape when only unit axes move."""
        shape = wse.tensor_shape(value)
        if moves_only_unit_axes(shape, perm):
            return self._insert(wse.ReshapeOp(value, [shape[p] for p in perm]), before)
        return self._insert(wse.TransposeOp(value, perm), before)

    def _permuted_type(self, value: SSAValue) -> TensorType:
        shape = wse.tensor_shape(value)
        back = inverse(channels_to_front(len(shape)))
        return TensorType(wse.element_type(value), [shape[i] for i in back])

    def _matching(self, value: SSAValue, rank: int, at: Operation) -> SSAValue:
        """``value`` in channels-last order for an op of result rank ``rank``: its twin, or
        the (free) permutation of a value ``_cheap`` accepted."""
        if value in self.twin:
            return self.twin[value]
        shape = wse.tensor_shape(value)
        full = (1,) * (rank - len(shape)) + shape
        last = [full[p] for p in inverse(channels_to_front(rank))]
        if moves_only_unit_axes(full, inverse(channels_to_front(rank))):
            # one reshape, and a per-channel vector without its unit leading axes: it then
            # broadcasts like a bias along the rows of a layout that folds the leading axes
            kept = next((i for i, d in enumerate(last) if d != 1), len(last) - 1)
            trimmed = last[kept:]
            return (
                value if trimmed == list(shape) else self._insert(wse.ReshapeOp(value, trimmed), at)
            )
        if full != shape:
            value = self._insert(wse.ReshapeOp(value, full), at)
        return self._permute(value, inverse(channels_to_front(rank)), at)

    def _elementwise(self, op: Operation) -> None:
        rank = len(wse.tensor_shape(op.results[0]))
        operands = [self._matching(value, rank, op) for value in op.operands]
        twin = type(op).create(
            operands=operands,
            result_types=[self._permuted_type(op.results[0])],
            properties=dict(op.properties),
            attributes=dict(op.attributes),
        )
        self.twin[op.results[0]] = self._insert(twin, op)

    def _reduce(self, op: wse.ReduceOp) -> None:
        perm = channels_to_front(len(wse.tensor_shape(op.input)))
        axes = sorted(perm[a] for a in op.axes.get_values())
        twin = type(op)(self.twin[op.input], axes, True)
        self.twin[op.result] = self._insert(twin, op)

    def _concat(self, op: wse.ConcatOp) -> None:
        perm = channels_to_front(len(wse.tensor_shape(op.result)))
        twin = wse.ConcatOp([self.twin[v] for v in op.inputs], perm[op.axis.value.data])
        self.twin[op.result] = self._insert(twin, op)

    def _pool(self, op: wse.MaxPoolOp | wse.AvgPoolOp) -> None:
        windows = (
            op.kernel.get_values(),
            op.strides.get_values(),
            op.pads.get_values(),
            op.dilations.get_values(),
        )
        x = self.twin[op.input]
        if isinstance(op, wse.MaxPoolOp):
            twin: Operation = wse.MaxPoolOp(x, *windows, channels_last=True)
        else:
            include_pad = bool(op.count_include_pad.value.data)
            twin = wse.AvgPoolOp(x, *windows, include_pad, channels_last=True)
        self.twin[op.result] = self._insert(twin, op)

    def _im2col(self, op: wse.Im2ColOp) -> None:
        patches = wse.Im2ColOp(
            self.twin[op.input],
            op.kernel.get_values(),
            op.strides.get_values(),
            op.pads.get_values(),
            op.dilations.get_values(),
            op.group.value.data,
            channels_last=True,
        )
        op.result.replace_all_uses_with(self._insert(patches, op))
        self.replaced.add(op)

    # -- rewiring ---------------------------------------------------------------------------

    def rewire(self) -> None:
        """Serves the uses that did not move to a twin from one transpose of the twin, then
        drops the ops the twins superseded."""
        position = {op: i for i, op in enumerate(self.block.ops)}
        superseded = {value.owner for value in self.twin} | self.replaced
        for value, twin in self.twin.items():
            if isinstance(value.owner, wse.TransposeOp):
                continue  # the transpose itself serves its remaining uses
            remaining = [use for use in value.uses if use.operation not in superseded]
            if not remaining:
                continue
            first_use = min(remaining, key=lambda use: position[use.operation]).operation
            back = self._permute(twin, channels_to_front(len(wse.tensor_shape(value))), first_use)
            for use in remaining:
                use.operation.operands[use.index] = back
        for op in reversed(list(self.block.ops)):
            if op in superseded and not any(r.uses for r in op.results):
                op.detach()
                op.erase()


@dataclass(frozen=True)
class ChannelsLastPass(ModulePass):
    """Carries convolutions' channels-last results forward through the ops that allow it."""

    name = "channels-last"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for function in op.body.block.ops:
            if isinstance(function, func.FuncOp) and function.body.blocks:
                ChannelsLast(function.body.block).run()
