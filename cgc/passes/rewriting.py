"""Building replacement IR inside passes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from xdsl.ir import Attribute, Operation, SSAValue

from cgc.dialects import wse


class Emitter:
    """Creates ops through ``insert`` (a rewriter's or builder's insert), giving each the
    location of the op being rewritten, so that diagnostics still name the source node."""

    def __init__(self, insert: Callable[[Operation], Operation], anchor: Operation):
        self.insert = insert
        self.location = anchor.location

    def __call__(self, op: Operation) -> SSAValue:
        """Inserts ``op`` and returns its first result."""
        self.insert(op)
        op.location = self.location
        return op.results[0] if op.results else None  # type: ignore[return-value]

    def constant(self, value: float | int | bool | np.ndarray, element: Attribute) -> SSAValue:
        """An inline constant of ``element`` type (a scalar unless ``value`` is an array)."""
        array = np.asarray(value, dtype=wse.numpy_dtype(element))
        return self(wse.ConstantOp(wse.dense_attr(array)))
