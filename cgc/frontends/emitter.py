"""What every frontend builds WSE IR with: an ``Emitter`` inserts ops at the end of
``@main``'s body with the current location, folds the primitives whose operands are known at
compile time, and turns arrays into constants (inline when small, else frozen weights in the
side store).

The ONNX importer and the PyTorch lowering are both emitters, so the helpers of
``cgc.frontends.builders`` and the formulas of ``cgc.frontends.formulas`` serve both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
from xdsl.builder import Builder
from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType, ModuleOp, NameLoc, NoneAttr, StringAttr, TensorType
from xdsl.ir import Block, Operation, SSAValue
from xdsl.rewriter import InsertPoint
from xdsl.traits import Pure

from cgc.dialects import wse
from cgc.frontends.imported import TensorSpec
from cgc.machine import reference
from cgc.machine.hardware import dtypes
from cgc.machine.program.bytecode import PRIMITIVES

DROPOUT_ADVICE = (
    "random dropout cannot be reproduced; turn it off: model.eval() before export, or "
    "dropout 0 (attn_pdrop=0, hidden_dropout_prob=0, ...)"
)
"""How to turn dropout off, for the error of a model that trains with it."""

INLINE_LIMIT = 64
"""Constants of at most this many elements are written inline as ``wse.constant``."""


def loc(name: str) -> NameLoc:
    """The location ``loc("name")``."""
    return NameLoc(StringAttr(name), NoneAttr())


def inlinable(array: np.ndarray) -> bool:
    """Whether a constant can be written in the IR text and read back exactly."""
    if array.size > INLINE_LIMIT or dtypes.is_extended(array.dtype):
        return False
    # xDSL prints non-finite floats as hex bit patterns that it cannot read back correctly.
    return array.dtype.kind != "f" or bool(np.isfinite(array).all())


def constant_op(array: np.ndarray, weights: dict[str, np.ndarray], name: str) -> Operation:
    """``array`` as an op: an inline constant when ``inlinable``, else a frozen weight of
    ``name`` stored in ``weights``."""
    if inlinable(array):
        return wse.ConstantOp(wse.dense_attr(array))
    weights[name] = array
    element = wse.element_of_numpy(array.dtype)
    return wse.WeightOp(name, TensorType(element, array.shape), frozen=True)


class Emitter:
    """The builder of one ``@main``: where ops go, what is known at compile time, and the side
    store of weights."""

    def __init__(self) -> None:
        self.builder: Builder | None = None
        self.loc = loc("main")
        """The location of the ops emitted now: the node being converted."""
        self.weights: dict[str, np.ndarray] = {}
        self.known: dict[SSAValue, np.ndarray] = {}
        """Values known at compile time: constants, folded results, integer initializers."""
        self.folded = 0

    def open_main(self, inputs: Sequence[TensorSpec]) -> tuple[ModuleOp, func.FuncOp]:
        """A module holding an empty ``func.func @main`` of ``inputs`` (an argument each, at
        its name); ops go to its end from now on."""
        in_types = [s.tensor_type for s in inputs]
        module = ModuleOp([])
        fn = func.FuncOp("main", (in_types, []))
        module.body.block.add_op(fn)
        for spec, arg in zip(inputs, fn.body.block.args, strict=True):
            arg.location = loc(spec.name)
        self.builder = Builder(InsertPoint.at_end(fn.body.block))
        return module, fn

    def close_main(self, fn: func.FuncOp, results: Sequence[SSAValue]) -> None:
        """Ends ``@main`` returning ``results``, drops what nothing uses, and checks the
        function (every op was verified as it was inserted)."""
        assert self.builder is not None
        ret = func.ReturnOp(*results)
        self.builder.insert(ret)
        erase_unused(fn.body.block)
        inputs = [arg.type for arg in fn.body.block.args]
        fn.function_type = FunctionType.from_lists(inputs, [r.type for r in results])
        fn.verify(verify_nested_ops=False)
        ret.verify()

    def const(self, array: np.ndarray, name: str | None = None, at: NameLoc | None = None):
        """A value known at compile time: inline when small, else a frozen weight."""
        array = np.asarray(array)
        if not inlinable(array) and (name is None or name in self.weights):
            self.folded += 1
            name = f"{self.loc.desc.data}:{self.folded}"
        value = self._insert(constant_op(array, self.weights, name or ""), at)[0]
        self.known[value] = array
        return value

    def _insert(self, op: Operation, at: NameLoc | None = None) -> list[SSAValue]:
        assert self.builder is not None
        op.location = at or self.loc
        op.verify()
        self.builder.insert(op)
        return list(op.results)

    def emit_all(self, op: Operation) -> list[SSAValue]:
        """Adds ``op`` to ``@main`` with the current node's location and returns its results;
        a primitive whose operands are all known at compile time is evaluated instead, so
        shape arithmetic leaves only constants behind. An integer divisor known to hold 0
        is refused now (``reference.DivisionByZero``), as every run would refuse it."""
        known = [self.known.get(v) for v in op.operands]
        arrays = [a for a in known if a is not None]
        can_fold = foldable(op)
        if can_fold and len(known) == 2 and known[1] is not None:
            reference.check_divisor(wse.mnemonic(op), known[1], wse.tensor_shape(op.results[0]))
        if op.operands and len(arrays) == len(known) and can_fold:
            op.verify()
            values = evaluate(op, arrays)
            op.erase()  # never inserted, but its operands count it as a use until then
            return [self.const(v) for v in values]
        return self._insert(op)

    def emit(self, op: Operation) -> SSAValue:
        """``emit_all`` for an op of one result."""
        return self.emit_all(op)[0]

    def constant(self, array: np.ndarray) -> SSAValue:
        """A compile-time constant."""
        return self.const(array)

    def scalar(self, value: float, like: SSAValue) -> SSAValue:
        """A rank-0 constant of ``like``'s element type."""
        dtype = wse.numpy_dtype(wse.element_type(like))
        return self.constant(np.array(value, dtype=dtype))


def erase_unused(block: Block) -> None:
    """Drops the pure ops whose results nothing uses (constants that folding left behind)."""
    for op in reversed(list(block.ops)):
        if op.has_trait(Pure) and not any(r.uses for r in op.results):
            op.detach()
            op.erase()


def foldable(op: Operation) -> bool:
    """Whether a compile may evaluate ``op`` when its operands are known."""
    return op.name.startswith("wse.") and wse.mnemonic(op) in PRIMITIVES


def evaluate(op: Operation, operands: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The results of a ``foldable`` op on the arrays of its operands."""
    results = [(wse.tensor_shape(r), wse.numpy_dtype(wse.element_type(r))) for r in op.results]
    return reference.evaluate_all(wse.mnemonic(op), wse.properties_as_python(op), operands, results)


Converter = TypeVar("Converter", bound=Callable)


def registrar(
    registry: dict[str, Converter], what: str
) -> Callable[..., Callable[[Converter], Converter]]:
    """The decorator that adds a converter to ``registry`` under each name it is given (a
    name given twice is a programming error naming ``what`` the converters are)."""

    def register(*names: str) -> Callable[[Converter], Converter]:
        def add(function: Converter) -> Converter:
            for name in names:
                if name in registry:
                    raise ValueError(f"two {what} for {name}")
                registry[name] = function
            return function

        return add

    return register
