"""Vector-Jacobian products of the elementwise ops, the reductions and matmul.

Binary ops broadcast (numpy rules), so each operand's gradient is summed back to its shape.
Where the derivative is not defined the rules follow torch: ``max``/``min`` give the gradient
to the operand that won, ties to the left one; ``reduce_max``/``reduce_min`` share it evenly
among the elements that attain the extremum (``torch.amax``); ``relu`` and ``abs`` take 0 at
0; sign and the rounding functions are flat (gradient 0). ``reduce_prod`` uses the running
products from both ends, exact where elements are zero. ``wse.stop_gradient`` passes none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod

import numpy as np
from xdsl.ir import Operation, SSAValue

from cgc.dialects import wse
from cgc.dialects.gradients.base import Grads, Rule, unbroadcast
from cgc.dialects.ir import LocatedInserter


def _same_shape(op: Operation, emit: LocatedInserter, grads: Sequence[SSAValue]) -> Grads:
    """Unbroadcasts one gradient per operand."""
    return [
        unbroadcast(emit, g, wse.tensor_shape(v)) for g, v in zip(grads, op.operands, strict=True)
    ]


def _binary(op: Operation, emit: LocatedInserter, g: SSAValue) -> Grads:
    a, b = op.operands
    y = op.results[0]
    if isinstance(op, wse.AddOp):
        return _same_shape(op, emit, [g, g])
    if isinstance(op, wse.SubOp):
        return _same_shape(op, emit, [g, emit(wse.NegOp(g))])
    if isinstance(op, wse.MulOp):
        return _same_shape(op, emit, [emit(wse.MulOp(g, b)), emit(wse.MulOp(g, a))])
    if isinstance(op, wse.DivOp):
        ga = emit(wse.DivOp(g, b))
        return _same_shape(op, emit, [ga, emit(wse.NegOp(emit(wse.MulOp(ga, y))))])
    if isinstance(op, wse.PowOp):
        one = emit.constant(1, wse.element_type(b))
        ga = emit(wse.MulOp(g, emit(wse.MulOp(b, emit(wse.PowOp(a, emit(wse.SubOp(b, one))))))))
        gb = emit(wse.MulOp(g, emit(wse.MulOp(y, emit(wse.LogOp(a))))))
        return _same_shape(op, emit, [ga, gb])
    # max / min: the gradient goes to the operand that won; ties go to the left one.
    loses = emit(wse.GreaterOp(b, a) if isinstance(op, wse.MaxOp) else wse.GreaterOp(a, b))
    zero = emit.constant(0, wse.element_type(g))
    return _same_shape(
        op, emit, [emit(wse.SelectOp(loses, zero, g)), emit(wse.SelectOp(loses, g, zero))]
    )


def _unary(op: Operation, emit: LocatedInserter, g: SSAValue) -> Grads:
    x, y = op.operands[0], op.results[0]
    elt = wse.element_type(x)

    def const(value: float) -> SSAValue:
        return emit.constant(value, elt)

    def where_positive(positive: SSAValue, other: Callable[[SSAValue], SSAValue]) -> SSAValue:
        zero = const(0)
        return emit(wse.SelectOp(emit(wse.GreaterOp(x, zero)), positive, other(zero)))

    def negative_part(zero: SSAValue) -> SSAValue:
        return emit(wse.SelectOp(emit(wse.GreaterOp(zero, x)), emit(wse.NegOp(g)), zero))

    def erf() -> SSAValue:
        bell = emit(wse.ExpOp(emit(wse.NegOp(emit(wse.MulOp(x, x))))))
        return emit(wse.MulOp(g, emit(wse.MulOp(const(2 / np.sqrt(np.pi)), bell))))

    rules: dict[type[Operation], Callable[[], SSAValue]] = {
        wse.NegOp: lambda: emit(wse.NegOp(g)),
        wse.ExpOp: lambda: emit(wse.MulOp(g, y)),
        wse.LogOp: lambda: emit(wse.DivOp(g, x)),
        wse.SqrtOp: lambda: emit(wse.DivOp(emit(wse.MulOp(g, const(0.5))), y)),
        wse.ReciprocalOp: lambda: emit(wse.NegOp(emit(wse.MulOp(g, emit(wse.MulOp(y, y)))))),
        wse.ReluOp: lambda: where_positive(g, lambda zero: zero),
        wse.AbsOp: lambda: where_positive(g, negative_part),
        wse.SigmoidOp: lambda: emit(wse.MulOp(g, emit(wse.MulOp(y, emit(wse.SubOp(const(1), y)))))),
        wse.TanhOp: lambda: emit(wse.MulOp(g, emit(wse.SubOp(const(1), emit(wse.MulOp(y, y)))))),
        wse.ErfOp: erf,
    }
    return [rules[type(op)]()]


def _math(op: Operation, emit: LocatedInserter, g: SSAValue) -> Grads:
    """The trigonometric and hyperbolic functions and their inverses; the rounding functions
    and sign are flat almost everywhere (gradient 0, as in torch)."""
    x, y = op.operands[0], op.results[0]
    elt = wse.element_type(x)

    def const(value: float) -> SSAValue:
        return emit.constant(value, elt)

    def square(v: SSAValue) -> SSAValue:
        return emit(wse.MulOp(v, v))

    def over(denominator: SSAValue) -> SSAValue:
        return emit(wse.DivOp(g, denominator))

    def root(v: SSAValue) -> SSAValue:
        return emit(wse.SqrtOp(v))

    rules: dict[type[Operation], Callable[[], SSAValue]] = {
        wse.SinOp: lambda: emit(wse.MulOp(g, emit(wse.CosOp(x)))),
        wse.CosOp: lambda: emit(wse.NegOp(emit(wse.MulOp(g, emit(wse.SinOp(x)))))),
        wse.TanOp: lambda: emit(wse.MulOp(g, emit(wse.AddOp(const(1), square(y))))),
        wse.AsinOp: lambda: over(root(emit(wse.SubOp(const(1), square(x))))),
        wse.AcosOp: lambda: emit(wse.NegOp(over(root(emit(wse.SubOp(const(1), square(x))))))),
        wse.AtanOp: lambda: over(emit(wse.AddOp(const(1), square(x)))),
        wse.SinhOp: lambda: emit(wse.MulOp(g, emit(wse.CoshOp(x)))),
        wse.CoshOp: lambda: emit(wse.MulOp(g, emit(wse.SinhOp(x)))),
        wse.AsinhOp: lambda: over(root(emit(wse.AddOp(square(x), const(1))))),
        wse.AcoshOp: lambda: over(root(emit(wse.SubOp(square(x), const(1))))),
        wse.AtanhOp: lambda: over(emit(wse.SubOp(const(1), square(x)))),
    }
    if type(op) in rules:
        return [rules[type(op)]()]
    return [emit(wse.BroadcastToOp(const(0), wse.tensor_shape(x)))]  # sign, floor, ceil, round


def _stop(op: Operation, emit: LocatedInserter, g: SSAValue) -> Grads:
    return [None]


def _select(op: wse.SelectOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    zero = emit.constant(0, wse.element_type(g))
    on_true = emit(wse.SelectOp(op.cond, g, zero))
    on_false = emit(wse.SelectOp(op.cond, zero, g))
    return [
        None,
        unbroadcast(emit, on_true, wse.tensor_shape(op.true_value)),
        unbroadcast(emit, on_false, wse.tensor_shape(op.false_value)),
    ]


def _kept(emit: LocatedInserter, op: wse.ReduceOp, g: SSAValue) -> SSAValue:
    """A reduction's gradient broadcast back to the input's shape."""
    shape = wse.tensor_shape(op.input)
    kept = tuple(1 if i in op.axis_list else d for i, d in enumerate(shape))
    return emit(wse.BroadcastToOp(emit(wse.ReshapeOp(g, kept)), shape))


_DIFFERENTIABLE_REDUCTIONS = (wse.ReduceSumOp, wse.ReduceMeanOp, wse.ReduceMaxOp, wse.ReduceMinOp)


def _reduce(op: wse.ReduceOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    spread = _kept(emit, op, g)
    shape, elt = wse.tensor_shape(op.input), wse.element_type(op.input)
    if isinstance(op, wse.ReduceSumOp):
        return [spread]
    if isinstance(op, wse.ReduceMeanOp):
        count = prod(shape[a] for a in op.axis_list)
        return [emit(wse.MulOp(spread, emit.constant(1 / count, elt)))]
    # max / min: shared evenly among the elements that attain it (torch.amax's rule)
    reached = _kept(emit, op, op.result)
    hit = emit(
        wse.SelectOp(
            emit(wse.EqualOp(op.input, reached)), emit.constant(1, elt), emit.constant(0, elt)
        )
    )
    ties = emit(wse.ReduceSumOp(hit, list(op.axis_list), True))
    return [emit(wse.MulOp(spread, emit(wse.DivOp(hit, ties))))]


def _reduce_prod(op: wse.ReduceProdOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    """The product of the other elements, as the exclusive running products from both ends
    (exact where elements are zero, unlike ``y / x``)."""
    x, axes = op.input, sorted(op.axis_list)
    shape = wse.tensor_shape(x)
    rest = [i for i in range(len(shape)) if i not in axes]
    moved = emit(wse.TransposeOp(x, rest + axes))
    kept, count = [shape[i] for i in rest], prod(shape[i] for i in axes)
    flat = emit(wse.ReshapeOp(moved, (*kept, count)))
    last = len(kept)
    before = emit(wse.CumProdOp(flat, last, True, False))
    after = emit(wse.CumProdOp(flat, last, True, True))
    others = emit(wse.MulOp(before, after))
    others = emit(wse.ReshapeOp(others, [*kept, *(shape[i] for i in axes)]))
    others = emit(wse.TransposeOp(others, [int(i) for i in np.argsort(rest + axes)]))
    return [emit(wse.MulOp(others, _kept(emit, op, g)))]


def _swap_last(emit: LocatedInserter, v: SSAValue) -> SSAValue:
    rank = len(wse.tensor_shape(v))
    return emit(wse.TransposeOp(v, [*range(rank - 2), rank - 1, rank - 2]))


def _matmul(op: wse.MatmulOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    a, b = op.lhs, op.rhs
    ga = emit(wse.MatmulOp(g, _swap_last(emit, b)))
    gb = emit(wse.MatmulTransposeAOp(a, g))
    return _same_shape(op, emit, [ga, gb])


RULES: dict[type[Operation], Rule] = {
    **{cls: _binary for cls in (wse.AddOp, wse.SubOp, wse.MulOp, wse.DivOp, wse.PowOp,
                                 wse.MaxOp, wse.MinOp)},
    **{cls: _unary for cls in wse.UNARY_OPS},
    **{cls: _math for cls in wse.MATH_OPS if cls not in (wse.NotOp, wse.BitwiseNotOp)},
    wse.StopGradientOp: _stop,
    wse.SelectOp: _select,
    **{cls: _reduce for cls in _DIFFERENTIABLE_REDUCTIONS},
    wse.ReduceProdOp: _reduce_prod,
    wse.MatmulOp: _matmul,
}  # fmt: skip
"""The rules of this family, by op."""
