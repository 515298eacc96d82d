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
mean over the global batch. Gradients stop at integer and boolean values. The
vector-Jacobian product of each op is part of the dialect's semantics: ``cgc.dialects.gradients``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, BlockArgument, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from cgc.dialects import ws, wse
from cgc.dialects.gradients import is_float, rule_for
from cgc.dialects.ir import LocatedInserter, main_function
from cgc.errors import CgcError
from cgc.machine.program.bytecode import GRADIENT_SUFFIX


def trains(
    op: Operation,
    patterns: Sequence[re.Pattern[str]],
    frozen: Sequence[re.Pattern[str]] = (),
) -> bool:
    """Whether ``op`` is a weight that a training of the weights matching ``patterns`` (all
    when empty) and none of ``frozen`` trains: a float weight not frozen."""
    if not isinstance(op, wse.WeightOp) or op.frozen is not None or not is_float(op.result):
        return False
    name = op.weight_name.data
    if any(p.fullmatch(name) for p in frozen):
        return False
    return not patterns or any(p.fullmatch(name) for p in patterns)


class Differentiator:
    """Appends the backward layers of one function."""

    def __init__(
        self, fn: func.FuncOp, patterns: Sequence[str], seed: float, frozen: Sequence[str] = ()
    ):
        self.fn = fn
        self.patterns = [re.compile(p) for p in patterns]
        self.frozen = [re.compile(p) for p in frozen]
        self.seed = seed
        self.block = fn.body.block
        self.needs: set[SSAValue] = set()
        self.inner: dict[wse.LayerOp, set[SSAValue]] = {}
        self.partials: dict[SSAValue, list[SSAValue]] = {}
        self.trained: set[str] = set()

    def trainable(self, op: Operation) -> bool:
        """Whether ``op`` is a weight the pass differentiates with respect to."""
        return trains(op, self.patterns, self.frozen)

    @property
    def ret(self) -> func.ReturnOp:
        """The function's return."""
        ret = self.block.last_op
        assert isinstance(ret, func.ReturnOp)
        return ret

    def run(self) -> set[str]:
        """Differentiates; returns the names of the weights that receive gradients."""
        ret = self.ret
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
        inner: set[SSAValue] = {
            a for a, v in zip(body.args, layer.inputs, strict=True) if v in self.needs
        }
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
            emit = LocatedInserter(
                builder.insert, producer if isinstance(producer, Operation) else layer
            )
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
            self._vjp(op, cot, inner, LocatedInserter(builder.insert, op))
        outputs = [(v, cot[a]) for a, v in zip(body.args, layer.inputs, strict=True) if a in cot]
        builder.insert(wse.YieldOp(*[g for _, g in outputs]))
        saved = self._capture(layer, grad_block, arg_for)
        grad_layer = wse.LayerOp(
            layer.layer_name.data + GRADIENT_SUFFIX,
            args,
            [g.type for _, g in outputs],
            Region(grad_block),
        )
        grad_layer.location = layer.location
        Rewriter.insert_op(grad_layer, InsertPoint.before(self.ret))
        if saved:
            self._save(layer, saved)
        for (value, _), result in zip(outputs, grad_layer.results, strict=True):
            self.partials.setdefault(value, []).append(result)

    def _vjp(self, op: Operation, cot: dict, inner: set[SSAValue], emit: LocatedInserter) -> None:
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
        for operand, grad in zip(op.operands, rule_for(op)(op, emit, g), strict=True):
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
        ops = list(grad_block.ops)
        for op in ops:
            for value in op.operands:
                if value in replacements or not _defined_in(value, body):
                    continue
                owner = value.owner
                if isinstance(owner, wse.WeightOp | wse.ConstantOp):
                    clone = owner.clone()
                    Rewriter.insert_op(clone, InsertPoint.before(ops[0]))
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
    return value.owner.parent_block() is block


def _inside(op: Operation, ancestor: Operation) -> bool:
    parent = op.parent_op()
    while parent is not None:
        if parent is ancestor:
            return True
        parent = parent.parent_op()
    return False


def _accumulate(cot: dict[SSAValue, SSAValue], value: SSAValue, g: SSAValue, emit: LocatedInserter):
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
    frozen: tuple[str, ...] = ()
    """Regular expressions of weights never trained, whatever ``trainable`` says."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        Differentiator(main_function(op), self.trainable, self.loss_scale, self.frozen).run()
