"""Reverse-mode automatic differentiation of the layers of ``@main``.

The first result of ``@main`` is the loss. For every forward layer, in reverse order, whose
results carry a gradient, the pass appends a backward layer ``<name>.grad`` that

* takes the gradients of the forward layer's results (summing the contributions of all their
  users) and the activations it needs: inputs of the forward layer, and values computed inside
  it, which the forward layer now also yields (they stay on the wafer, as in the real system);
* creates again the weights its vector-Jacobian products use (so in weight-streaming mode they
  stream a second time, in the order the backward kernels consume them);
* differentiates the forward body op by op in reverse, summing the gradients of values used
  several times (a parameter used twice gets both contributions);
* streams the gradient of every trainable weight out (``ws.stream_gradient``) and yields the
  gradients of the forward layer's inputs to the earlier backward layers.

The seed is ``loss_scale``: 1 on one system; with K systems whose losses are means over their
slice of the batch it is 1/K, so that SwarmX's sum of the K gradients is the gradient of the
mean over the global batch. Gradients stop at integer and boolean values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod

import numpy as np
from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import Float16Type, Float32Type, Float64Type, ModuleOp
from xdsl.ir import Block, BlockArgument, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from cgc.compiler.interpret import main_function
from cgc.dialects import ws, wse
from cgc.errors import CgcError
from cgc.passes.rewriting import Emitter

Grads = list[SSAValue | None]


def is_float(value: SSAValue) -> bool:
    """Whether gradients flow through ``value``."""
    return isinstance(wse.element_type(value), Float16Type | Float32Type | Float64Type)


def unbroadcast(emit: Emitter, g: SSAValue, shape: tuple[int, ...]) -> SSAValue:
    """Sums ``g`` over the axes along which a value of ``shape`` was broadcast."""
    gshape = wse.tensor_shape(g)
    if gshape == shape:
        return g
    lead = len(gshape) - len(shape)
    axes = [*range(lead)] + [
        i for i in range(lead, len(gshape)) if shape[i - lead] == 1 and gshape[i] != 1
    ]
    summed = emit(wse.ReduceSumOp(g, axes, True)) if axes else g
    return emit(wse.ReshapeOp(summed, shape))


def _same_shape(op: Operation, emit: Emitter, grads: Sequence[SSAValue]) -> Grads:
    """Unbroadcasts one gradient per operand."""
    return [
        unbroadcast(emit, g, wse.tensor_shape(v)) for g, v in zip(grads, op.operands, strict=True)
    ]


def _binary(op: Operation, emit: Emitter, g: SSAValue) -> Grads:
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


def _unary(op: Operation, emit: Emitter, g: SSAValue) -> Grads:
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


def _kept(emit: Emitter, op: wse.ReduceOp, g: SSAValue) -> SSAValue:
    """A reduction's gradient broadcast back to the input's shape."""
    shape = wse.tensor_shape(op.input)
    kept = tuple(1 if i in op.axis_list else d for i, d in enumerate(shape))
    return emit(wse.BroadcastToOp(emit(wse.ReshapeOp(g, kept)), shape))


_DIFFERENTIABLE_REDUCTIONS = (wse.ReduceSumOp, wse.ReduceMeanOp, wse.ReduceMaxOp, wse.ReduceMinOp)


def _reduce(op: wse.ReduceOp, emit: Emitter, g: SSAValue) -> Grads:
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


def _swap_last(emit: Emitter, v: SSAValue) -> SSAValue:
    rank = len(wse.tensor_shape(v))
    return emit(wse.TransposeOp(v, [*range(rank - 2), rank - 1, rank - 2]))


def _matmul(op: wse.MatmulOp, emit: Emitter, g: SSAValue) -> Grads:
    a, b = op.lhs, op.rhs
    ga = emit(wse.MatmulOp(g, _swap_last(emit, b)))
    gb = emit(wse.MatmulOp(_swap_last(emit, a), g))
    return _same_shape(op, emit, [ga, gb])


def _shape_op(op: Operation, emit: Emitter, g: SSAValue) -> Grads:
    x = op.operands[0]
    shape = wse.tensor_shape(x)
    if isinstance(op, wse.ReshapeOp):
        return [emit(wse.ReshapeOp(g, shape))]
    if isinstance(op, wse.TransposeOp):
        return [emit(wse.TransposeOp(g, [int(i) for i in np.argsort(op.perm.get_values())]))]
    if isinstance(op, wse.BroadcastToOp):
        return [unbroadcast(emit, g, shape)]
    if isinstance(op, wse.CastOp):
        return [emit(wse.CastOp(g, wse.element_type(x)))]
    if isinstance(op, wse.PadOp):
        low = op.low.get_values()
        return [
            emit(
                wse.SliceOp(
                    g, low, [lo + d for lo, d in zip(low, shape, strict=True)], [1] * len(shape)
                )
            )
        ]
    assert isinstance(op, wse.SliceOp)
    if any(s != 1 for s in op.strides.get_values()):
        raise _not_differentiable(op, "strided slices")
    starts, limits = op.starts.get_values(), op.limits.get_values()
    high = [d - hi for d, hi in zip(shape, limits, strict=True)]
    return [emit(wse.PadOp(g, starts, high))]


def _concat(op: wse.ConcatOp, emit: Emitter, g: SSAValue) -> Grads:
    axis, out = op.axis.value.data, wse.tensor_shape(op.result)
    grads, offset = [], 0
    for v in op.inputs:
        size = wse.tensor_shape(v)[axis]
        starts = [offset if i == axis else 0 for i in range(len(out))]
        limits = [offset + size if i == axis else d for i, d in enumerate(out)]
        grads.append(emit(wse.SliceOp(g, starts, limits, [1] * len(out))))
        offset += size
    return grads


def _select(op: wse.SelectOp, emit: Emitter, g: SSAValue) -> Grads:
    zero = emit.constant(0, wse.element_type(g))
    on_true = emit(wse.SelectOp(op.cond, g, zero))
    on_false = emit(wse.SelectOp(op.cond, zero, g))
    return [
        None,
        unbroadcast(emit, on_true, wse.tensor_shape(op.true_value)),
        unbroadcast(emit, on_false, wse.tensor_shape(op.false_value)),
    ]


def _not_differentiable(op: Operation, what: str) -> CgcError:
    where = wse.location_name(op)
    return CgcError(
        f"autodiff: {op.name}{f' (node {where})' if where else ''} has no gradient yet ({what})"
    )


RULES: dict[type[Operation], Callable[..., Grads]] = {
    **{cls: _binary for cls in (wse.AddOp, wse.SubOp, wse.MulOp, wse.DivOp, wse.PowOp,
                                 wse.MaxOp, wse.MinOp)},
    **{cls: _unary for cls in wse.UNARY_OPS},
    **{cls: _reduce for cls in _DIFFERENTIABLE_REDUCTIONS},
    wse.MatmulOp: _matmul,
    **{cls: _shape_op for cls in (wse.ReshapeOp, wse.TransposeOp, wse.BroadcastToOp,
                                   wse.CastOp, wse.PadOp, wse.SliceOp)},
    wse.ConcatOp: _concat,
    wse.SelectOp: _select,
}  # fmt: skip
"""Vector-Jacobian products: ``rule(op, emit, grad_of_result) -> grad per operand``."""


class Differentiator:
    """Appends the backward layers of one function."""

    def __init__(self, fn: func.FuncOp, patterns: Sequence[str], seed: float):
        self.fn = fn
        self.patterns = [re.compile(p) for p in patterns]
        self.seed = seed
        self.block = fn.body.block
        self.needs: set[SSAValue] = set()
        self.inner: dict[wse.LayerOp, set[SSAValue]] = {}
        self.partials: dict[SSAValue, list[SSAValue]] = {}
        self.trained: set[str] = set()

    def trainable(self, op: Operation) -> bool:
        """Whether ``op`` is a weight the pass differentiates with respect to."""
        if not isinstance(op, wse.WeightOp) or op.frozen is not None or not is_float(op.result):
            return False
        name = op.weight_name.data
        return not self.patterns or any(p.fullmatch(name) for p in self.patterns)

    def run(self) -> set[str]:
        """Differentiates; returns the names of the weights that receive gradients."""
        ret = self.block.last_op
        assert isinstance(ret, func.ReturnOp)
        if any(isinstance(op, ws.StreamGradientOp) for op in self.fn.walk()):
            raise CgcError("autodiff: @main already streams gradients; differentiate once")
        if not ret.arguments:
            raise CgcError("autodiff: @main returns nothing; its first result must be the loss")
        loss = ret.arguments[0]
        if wse.tensor_shape(loss) != () or not is_float(loss):
            raise CgcError(
                f"autodiff: the first output must be a scalar float loss, not "
                f"{wse.tensor_shape(loss)} {wse.element_type(loss)}"
            )
        layers = [op for op in self.block.ops if isinstance(op, wse.LayerOp)]
        for layer in layers:
            self._forward(layer)
        if loss not in self.needs:
            raise CgcError(
                "autodiff: no trainable parameter reaches the loss"
                + (f" (patterns {[p.pattern for p in self.patterns]})" if self.patterns else "")
            )
        for layer in reversed(layers):
            self._backward(layer, loss)
        return self.trained

    def _forward(self, layer: wse.LayerOp) -> None:
        """Marks the values inside ``layer`` that depend on a trainable weight."""
        body = layer.body.block
        inner = {a for a, v in zip(body.args, layer.inputs, strict=True) if v in self.needs}
        for op in body.ops:
            if isinstance(op, wse.YieldOp):
                for result, value in zip(layer.results, op.values, strict=True):
                    if value in inner:
                        self.needs.add(result)
            elif isinstance(op, wse.StopGradientOp):
                continue
            elif self.trainable(op) or any(v in inner for v in op.operands):
                # Ops without a rule still carry the dependence: if a gradient reaches one,
                # _vjp reports it instead of silently dropping it.
                inner.update(r for r in op.results if is_float(r))
        self.inner[layer] = inner

    def _backward(self, layer: wse.LayerOp, loss: SSAValue) -> None:
        seeded = [
            (i, r) for i, r in enumerate(layer.results)
            if r in self.needs and (r is loss or self.partials.get(r))
        ]  # fmt: skip
        if not seeded:
            return
        body = layer.body.block
        grad_block = Block()
        builder = Builder(InsertPoint.at_end(grad_block))
        args: list[SSAValue] = []

        def arg_for(value: SSAValue) -> SSAValue:
            args.append(value)
            return grad_block.insert_arg(value.type, len(grad_block.args))

        cot: dict[SSAValue, SSAValue] = {}
        yielded = body.last_op
        assert isinstance(yielded, wse.YieldOp)
        for index, result in seeded:
            producer = yielded.values[index].owner
            emit = Emitter(builder.insert, producer if isinstance(producer, Operation) else layer)
            if result is loss:
                g = emit.constant(self.seed, wse.element_type(loss))
            else:
                parts = [arg_for(p) for p in self.partials[result]]
                g = parts[0]
                for part in parts[1:]:
                    g = emit(wse.AddOp(g, part))
            _accumulate(cot, yielded.values[index], g, emit)
        inner = self.inner[layer]
        for op in reversed(list(body.ops)):
            self._vjp(op, cot, inner, Emitter(builder.insert, op))
        outputs = [(v, cot[a]) for a, v in zip(body.args, layer.inputs, strict=True) if a in cot]
        builder.insert(wse.YieldOp(*[g for _, g in outputs]))
        saved = self._capture(layer, grad_block, arg_for)
        grad_layer = wse.LayerOp(
            f"{layer.layer_name.data}.grad",
            args,
            [g.type for _, g in outputs],
            Region(grad_block),
        )
        grad_layer.location = layer.location
        Rewriter.insert_op(grad_layer, InsertPoint.before(self.block.last_op))
        if saved:
            self._save(layer, saved)
        for (value, _), result in zip(outputs, grad_layer.results, strict=True):
            self.partials.setdefault(value, []).append(result)

    def _vjp(self, op: Operation, cot: dict, inner: set[SSAValue], emit: Emitter) -> None:
        if isinstance(op, wse.YieldOp) or not op.results or op.results[0] not in cot:
            return
        g = cot[op.results[0]]
        if self.trainable(op):
            assert isinstance(op, wse.WeightOp)
            perm = None if op.perm is None else list(op.perm.get_values())
            emit(ws.StreamGradientOp(op.weight_name.data, g, perm))
            self.trained.add(op.weight_name.data)
            return
        if not any(v in inner for v in op.operands):
            return
        rule = RULES.get(type(op))
        if rule is None:
            raise _not_differentiable(op, "no vector-Jacobian product")
        for operand, grad in zip(op.operands, rule(op, emit, g), strict=True):
            if grad is not None and operand in inner:
                _accumulate(cot, operand, grad, emit)

    def _capture(self, layer: wse.LayerOp, grad_block: Block, arg_for) -> list[SSAValue]:
        """Rewires the backward body's uses of forward values: weights and constants are
        created again, forward inputs and computed values come in as arguments. Returns the
        computed values the forward layer must now also yield."""
        body = layer.body.block
        yielded = body.last_op
        assert isinstance(yielded, wse.YieldOp)
        results = dict(zip(yielded.values, layer.results, strict=True))
        saved: list[SSAValue] = []
        replacements: dict[SSAValue, SSAValue] = {}
        first = grad_block.first_op
        for op in list(grad_block.ops):
            for value in op.operands:
                if value in replacements or not _defined_in(value, body):
                    continue
                owner = value.owner
                if isinstance(owner, wse.WeightOp | wse.ConstantOp):
                    clone = owner.clone()
                    Rewriter.insert_op(clone, InsertPoint.before(first))
                    replacements[value] = clone.results[0]
                elif isinstance(value, BlockArgument):
                    replacements[value] = arg_for(layer.inputs[value.index])
                elif value in results:  # already a result of the forward layer
                    replacements[value] = arg_for(results[value])
                else:
                    saved.append(value)
                    replacements[value] = arg_for(value)
        for old, new in replacements.items():
            old.replace_uses_with_if(new, lambda use: use.operation.parent_block() is grad_block)
        return saved

    def _save(self, layer: wse.LayerOp, saved: list[SSAValue]) -> None:
        """Makes ``layer`` also yield ``saved``; the backward layer's arguments that stood for
        them take the new results."""
        body = layer.body.block
        yielded = body.last_op
        assert isinstance(yielded, wse.YieldOp)
        values = [*yielded.values, *saved]
        Rewriter.replace_op(yielded, wse.YieldOp(*values))
        grown = wse.LayerOp(
            layer.layer_name.data,
            list(layer.inputs),
            [v.type for v in values],
            layer.detach_region(layer.body),
            layer.rect,
        )
        grown.location = layer.location
        Rewriter.insert_op(grown, InsertPoint.before(layer))
        count = len(layer.results)
        for old, new in zip(layer.results, grown.results[:count], strict=True):
            old.replace_all_uses_with(new)
        for value, new in zip(saved, grown.results[count:], strict=True):
            value.replace_uses_with_if(new, lambda use: not _inside(use.operation, grown))
        self.inner[grown] = self.inner.pop(layer)
        Rewriter.erase_op(layer)


def _defined_in(value: SSAValue, block: Block) -> bool:
    if isinstance(value, BlockArgument):
        return value.block is block
    return value.owner.parent_block() is block  # type: ignore[union-attr]


def _inside(op: Operation, ancestor: Operation) -> bool:
    parent = op.parent_op()
    while parent is not None:
        if parent is ancestor:
            return True
        parent = parent.parent_op()
    return False


def _accumulate(cot: dict[SSAValue, SSAValue], value: SSAValue, g: SSAValue, emit: Emitter):
    cot[value] = emit(wse.AddOp(cot[value], g)) if value in cot else g


@dataclass(frozen=True)
class AutodiffPass(ModulePass):
    """Appends backward layers that stream the gradients of the trainable weights."""

    name = "autodiff"

    trainable: tuple[str, ...] = ()
    """Regular expressions matched in full against weight names; empty: every weight that
    is not frozen and holds floats."""
    loss_scale: float = 1.0
    """The seed of the backward pass."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        Differentiator(main_function(op), self.trainable, self.loss_scale).run()
