"""Fuses the elementwise work after a matmul into the matmul: ``wse.fused_matmul``.

An inference compiler never spends a pass over a tensor on what the matmul that produced it
can do as it finishes each tile. In every layer, the elementwise ops (``wse.EPILOGUE_OPS``)
after a matmul of one weight matrix (a linear layer's, a convolution's filter) become the
epilogue of a ``wse.fused_matmul`` when their operands are the product, the results of the
ops taken before them, and extras that broadcast along the product's rows (a vector of its
columns or a scalar: a bias, a scale) or hold its matrix (a residual). Reshapes that keep the
matrix (its elements, its columns last: a convolution's rows back into an image, a linear
layer's tokens back into sequences) join too, for free: the epilogue works on the product in
the shape of its result, and an extra in another view of the matrix is reshaped to it. The
ops taken are the longest run, in program order, of which no other op reads any value but
the last one's, which the fused op gives; an op no one reads is left to dead-code elimination.

The epilogue's affine head (additions, subtractions, multiplications and divisions by vectors
of the columns: an inference batch norm, a bias) folds into the matmul:

* a multiplication or division by a product of weights and constants (finite; a divisor
  nonzero) scales the weight matrix's columns instead, where that matrix is a stored weight
  or constant: each weight of the columns' shape becomes a scale of the fused op, the
  constants one new constant (their product), and the kernel multiplies them into the
  weights where it keeps them (the weights stay as they are stored: the fold is a view);
* what the head adds becomes one shift vector of the columns, computed before the fused op
  from the head's vectors, which the epilogue adds first: the matmul's accumulator starts at
  it.

So ``relu((x @ w - mean) * (gamma / std) + beta)`` becomes ``x @ (w * gamma * (1/std))`` with
the epilogue ``relu(acc + shift)``, ``shift = beta - mean * (gamma / std)``.

The constants and ops the folds leave unread are erased. Inference only (the pipelined,
whole-wafer and weight-streaming stages): autodiff knows no fused op.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import AnyFloat, ModuleOp
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.transforms.dead_code_elimination import region_dce

from cgc.dialects import wse
from cgc.dialects.ir import dense_to_numpy, main_function

AFFINE = ("add", "sub", "mul", "div")
"""The ops an epilogue's head may fold."""

Factor = tuple[SSAValue, int]
"""A weight or constant and its power (1, or -1 for a divisor) in a product."""


@dataclass(frozen=True)
class FuseEpiloguesPass(ModulePass):
    """Turns each matmul of a weight matrix and the elementwise ops after it into a
    ``wse.fused_matmul``."""

    name = "fuse-epilogues"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for layer in main_function(op).body.block.ops:
            if isinstance(layer, wse.LayerOp):
                for matmul in [o for o in layer.body.block.ops if isinstance(o, wse.MatmulOp)]:
                    fuse(matmul)
                # a constant whose values a folded scale took is read no more
                region_dce(layer.body)


def fuse(matmul: wse.MatmulOp) -> wse.FusedMatmulOp | None:
    """Fuses the ops after ``matmul`` into it, if some qualify; the fused op."""
    weights = wse.tensor_shape(matmul.rhs)
    if prod(weights[:-2]) != 1 or not isinstance(wse.element_type(matmul.rhs), AnyFloat):
        return None
    start, columns = matmul.result, weights[-1]
    taken = _taken(start, columns)
    if not taken:
        return None
    anchor, final = taken[-1], taken[-1].results[0]
    # scales are folded into weights the kernel keeps, not into a matrix computed each run
    stored = isinstance(matmul.rhs.owner, wse.WeightOp | wse.ConstantOp)
    head = _affine_head(start, taken, columns, stored)
    shift = _shift(start, head, anchor, columns)
    scales = _scales(start, head, anchor, columns)
    rest = taken[len(head) :]
    folded = head[-1].results[0] if head else start
    outside = _extras(rest, folded)
    extras = [*([] if shift is None else [shift]), *outside]
    viewed = [_viewed(v, final, anchor, columns) for v in extras]
    block = Block(arg_types=[final.type, *(v.type for v in viewed)])
    mapping: dict[SSAValue, SSAValue] = dict(zip(extras, block.args[1:], strict=True))
    mapping[folded] = block.args[0]
    if shift is not None:
        block.add_op(add := wse.AddOp(block.args[0], block.args[1]))
        add.location = next(op for op in head if not isinstance(op, wse.ReshapeOp)).location
        mapping[folded] = add.result
    for op in rest:
        _rebuild(op, mapping, block)
    block.add_op(wse.YieldOp(mapping[final]))
    fused = wse.FusedMatmulOp(matmul.lhs, matmul.rhs, scales, viewed, Region(block), final.type)
    fused.location = matmul.location
    Rewriter.insert_op(fused, InsertPoint.before(anchor))
    final.replace_all_uses_with(fused.result)
    for op in [*reversed(taken), matmul]:
        Rewriter.erase_op(op)
    return fused


def _rebuild(op: Operation, mapping: dict[SSAValue, SSAValue], block: Block) -> None:
    """``op`` in the epilogue, on the product's view: a reshape is that view already; an
    elementwise op is made again on its mapped operands, its type the view's."""
    if isinstance(op, wse.ReshapeOp):
        mapping[op.result] = mapping[op.input]
        return
    made = type(op)(*(mapping[v] for v in op.operands))
    made.location = op.location
    block.add_op(made)
    mapping[op.results[0]] = made.results[0]


def _viewed(value: SSAValue, final: SSAValue, anchor: Operation, columns: int) -> SSAValue:
    """An extra as the epilogue reads it: a view of the product in the result's shape, a
    vector of the columns in their shape, a scalar of a rank above the result's as a
    scalar; reshaped before ``anchor`` where it is not."""
    shape, want = wse.tensor_shape(value), wse.tensor_shape(final)
    if not _of_columns(shape, columns):
        target = want
    elif prod(shape) == columns:
        target = (columns,)
    else:
        target = shape if len(shape) <= len(want) else ()
    if shape == target:
        return value
    return _emit(wse.ReshapeOp(value, target), anchor, anchor)


def _taken(start: SSAValue, columns: int) -> list[Operation]:
    """The longest run of qualifying ops after ``start`` whose values only its last op's
    result leaves."""
    candidates: list[Operation] = []
    inside = {start}
    op = start.owner.next_op if isinstance(start.owner, Operation) else None
    while op is not None:
        used = all(r.uses for r in op.results)  # a dead op is left to DCE, not computed
        if used and any(v in inside for v in op.operands) and _joins(op, inside, start, columns):
            candidates.append(op)
            inside.add(op.results[0])
        op = op.next_op
    for count in range(len(candidates), 0, -1):
        members = set(candidates[:count])
        values = [start, *(o.results[0] for o in candidates[:count])]
        leaving = [v for v in values if any(u.operation not in members for u in v.uses)]
        if leaving == [values[-1]]:
            return candidates[:count]
    return []


def _joins(op: Operation, inside: set[SSAValue], start: SSAValue, columns: int) -> bool:
    """Whether ``op`` can join the epilogue: a reshape of a value inside it, or an epilogue
    op of values inside it and extras, giving a view of the product (the same matrix)."""
    if len(op.results) != 1 or not _views(op.results[0], start):
        return False
    if isinstance(op, wse.ReshapeOp):
        return op.input in inside
    if not op.name.startswith("wse.") or wse.mnemonic(op) not in wse.EPILOGUE_OPS:
        return False
    if op.properties:
        return False
    return all(v in inside or _extra(v, start, columns) for v in op.operands)


def _views(value: SSAValue, product: SSAValue) -> bool:
    """Whether ``value`` has the product's matrix: its elements, its columns last, its
    element type."""
    shape, of = wse.tensor_shape(value), wse.tensor_shape(product)
    same = wse.element_type(value) == wse.element_type(product)
    return same and prod(shape) == prod(of) and shape[-1:] == of[-1:]


def _extra(value: SSAValue, start: SSAValue, columns: int) -> bool:
    """Whether ``value`` can be an extra of the epilogue of ``start``: of its element type,
    a view of its matrix or broadcast along its rows."""
    if wse.element_type(value) != wse.element_type(start):
        return False
    return _views(value, start) or _of_columns(wse.tensor_shape(value), columns)


def _of_columns(shape: Sequence[int], columns: int) -> bool:
    """Whether ``shape`` is a vector of ``columns`` columns or a scalar (in any rank)."""
    return prod(shape[:-1]) == 1 and (not shape or shape[-1] in (1, columns))


def _affine_head(
    start: SSAValue, taken: list[Operation], columns: int, stored: bool
) -> list[Operation]:
    """The first ops of ``taken`` that fold (reshapes between them included): each adds,
    subtracts, multiplies or divides the value before it by a vector of the columns (or a
    scalar), by a product of weights and constants where it multiplies or divides; no later
    op reads a value of the head but its last (the shift replaces them all)."""
    head: list[Operation] = []
    value = start
    for op in taken:
        if isinstance(op, wse.ReshapeOp):
            head.append(op)
            value = op.result
            continue
        name, other = wse.mnemonic(op), _other(op, value)
        if name not in AFFINE or other is None or not _of_columns(wse.tensor_shape(other), columns):
            break
        if other is start or other.owner in taken:  # a one-row product read again
            break
        if name in ("sub", "div") and op.operands[0] is not value:
            break
        if name in ("mul", "div") and (
            not stored or _factors(other, name == "div", columns) is None
        ):
            break
        head.append(op)
        value = op.results[0]
    while head and isinstance(head[-1], wse.ReshapeOp):  # a trailing view is the epilogue's
        head.pop()
    rest = taken[len(head) :]
    while head and any(
        v in (start, *(h.results[0] for h in head[:-1])) for op in rest for v in op.operands
    ):
        rest.insert(0, head.pop())
    return head


def _other(op: Operation, value: SSAValue) -> SSAValue | None:
    """The operand of a binary ``op`` besides ``value``, if it has one other operand."""
    others = [v for v in op.operands if v is not value]
    return others[0] if len(op.operands) == 2 and len(others) == 1 else None


def _factors(value: SSAValue, invert: bool, columns: int) -> list[Factor] | None:
    """``value`` as a product of weights of the columns' shape and constants, each with its
    power; None if it is not one (or divides by a weight, which no scale of the columns can
    be)."""
    owner, sign = value.owner, -1 if invert else 1
    if isinstance(owner, wse.WeightOp):
        ok = sign == 1 and wse.tensor_shape(value) == (columns,)
        return [(value, sign)] if ok else None
    if isinstance(owner, wse.ConstantOp):
        array = dense_to_numpy(owner.value)
        finite = bool(np.isfinite(array).all() and (sign == 1 or array.all()))
        return [(value, sign)] if finite else None
    if isinstance(owner, wse.MulOp | wse.DivOp):
        left = _factors(owner.lhs, invert, columns)
        right = _factors(owner.rhs, invert != isinstance(owner, wse.DivOp), columns)
        return None if left is None or right is None else left + right
    return None


def _scales(
    start: SSAValue, head: list[Operation], anchor: Operation, columns: int
) -> list[SSAValue]:
    """The scales of the weight matrix's columns the head folds: its weights, then one
    constant of the product of its constants (inserted before ``anchor``)."""
    weights: list[SSAValue] = []
    constant: np.ndarray | None = None
    scaling: list[Operation] = []
    value = start
    for op in head:
        name, other = wse.mnemonic(op), _other(op, value)
        value = op.results[0]
        if name not in ("mul", "div"):  # an addend, or a reshape
            continue
        scaling.append(op)
        assert other is not None
        factors = _factors(other, name == "div", columns)
        assert factors is not None  # the head holds only foldable factors
        for factor, power in factors:
            if isinstance(factor.owner, wse.WeightOp):
                weights.append(factor)
                continue
            assert isinstance(factor.owner, wse.ConstantOp)
            array = dense_to_numpy(factor.owner.value).reshape(-1)
            array = array if power == 1 else np.reciprocal(array)
            constant = array if constant is None else constant * array
    if constant is None:
        return weights
    element = wse.element_type(anchor.results[0])
    values = np.broadcast_to(constant, (columns,)).astype(wse.numpy_dtype(element))
    folded = wse.ConstantOp(wse.dense_attr(np.ascontiguousarray(values)))
    _insert(folded, anchor, scaling[0])
    return [*weights, folded.result]


def _shift(
    start: SSAValue, head: list[Operation], anchor: Operation, columns: int
) -> SSAValue | None:
    """The vector the head adds to the scaled product (None if it adds nothing), computed
    by ops inserted before ``anchor``: each addend, subtrahend, multiplier and divisor of the
    head applied in turn to what the ops before it added."""
    shift: SSAValue | None = None
    value = start
    for op in head:
        name, other = wse.mnemonic(op), _other(op, value)
        value = op.results[0]
        if isinstance(op, wse.ReshapeOp):
            continue
        assert other is not None
        vector = _as_columns(other, anchor, op, columns)
        if name == "add":
            shift = vector if shift is None else _emit(wse.AddOp(shift, vector), anchor, op)
        elif name == "sub":
            negated = wse.NegOp(vector) if shift is None else wse.SubOp(shift, vector)
            shift = _emit(negated, anchor, op)
        elif shift is not None:
            combined = wse.MulOp(shift, vector) if name == "mul" else wse.DivOp(shift, vector)
            shift = _emit(combined, anchor, op)
    return shift


def _as_columns(value: SSAValue, anchor: Operation, op: Operation, columns: int) -> SSAValue:
    """``value`` (a vector of the columns or a scalar) as a vector of the columns' shape, or
    the scalar as it is."""
    shape = wse.tensor_shape(value)
    if prod(shape) != columns or shape == (columns,):
        return value
    return _emit(wse.ReshapeOp(value, (columns,)), anchor, op)


def _emit(op: Operation, anchor: Operation, source: Operation) -> SSAValue:
    """Inserts ``op`` before ``anchor``, located at ``source``; its result."""
    _insert(op, anchor, source)
    return op.results[0]


def _insert(op: Operation, anchor: Operation, source: Operation) -> None:
    op.location = source.location
    Rewriter.insert_op(op, InsertPoint.before(anchor))


def _extras(ops: list[Operation], product: SSAValue) -> list[SSAValue]:
    """The values ``ops`` read from outside them but ``product``, in the order first read."""
    made = {product, *(op.results[0] for op in ops)}
    extras: list[SSAValue] = []
    for op in ops:
        for value in op.operands:
            if value not in made and value not in extras:
                extras.append(value)
    return extras
