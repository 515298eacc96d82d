"""Helpers for reading and building cgc's IR: the entry function, constants as arrays, the
target, and an op builder that keeps source locations.

The compiler records the whole target (``cgc.machine.hardware.target.Target``) in the module's
``wse.target`` attribute once (``set_module_target``); every pass reads it from there
(``module_target``). The live values of the sparse weights, if any, are in its
``wse.sparse_weights`` attribute (``set_module_sparse_weights``), for the placement's SRAM.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DenseIntOrFPElementsAttr,
    DictionaryAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue

from cgc.dialects import wse
from cgc.errors import CgcError
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import Target, checked


def main_function(module: ModuleOp) -> func.FuncOp:
    """The module's entry function, ``@main``."""
    for op in module.ops:
        if isinstance(op, func.FuncOp) and op.sym_name.data == "main":
            return op
    raise ValueError("module has no func.func @main")


def dense_to_numpy(attr: DenseIntOrFPElementsAttr) -> np.ndarray:
    """The array of a dense elements attribute."""
    dtype = dtypes.dtype(wse.numpy_dtype(wse.element_type(attr.type)))
    shape = wse.tensor_shape(attr.type)
    if dtype == np.bool_:
        return np.array(attr.get_values(), dtype=np.int64).astype(bool).reshape(shape)
    return np.frombuffer(attr.data.data, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)


TARGET_ATTR = "wse.target"
"""The module attribute holding the target a module is compiled for (a ``#wse.target``)."""


def module_target(module: ModuleOp) -> Target:
    """The target recorded in the module."""
    attr = module.attributes.get(TARGET_ATTR)
    if isinstance(attr, StringAttr):
        raise CgcError(
            f"the module's '{TARGET_ATTR}' names a target ({attr.data!r}); it must carry the "
            f'whole target: write #wse.target<"{attr.data}">'
        )
    if not isinstance(attr, wse.TargetAttr):
        raise CgcError(
            f"the module has no '{TARGET_ATTR}' attribute: give one "
            '(#wse.target<"NAME">) or run cgc opt --target NAME'
        )
    return attr.data


def set_module_target(module: ModuleOp, target: Target) -> None:
    """Records ``target`` in the module, for every pass to read."""
    module.attributes[TARGET_ATTR] = wse.TargetAttr(checked(target))


SPARSE_ATTR = "wse.sparse_weights"
"""The module attribute holding the live values of each sparse weight, by name."""


def set_module_sparse_weights(module: ModuleOp, live: Mapping[str, int]) -> None:
    """Records the live values of each sparse weight in the module."""
    entries = {name: IntegerAttr(count, i64) for name, count in sorted(live.items())}
    module.attributes[SPARSE_ATTR] = DictionaryAttr(entries)


def module_sparse_weights(module: ModuleOp) -> dict[str, int]:
    """The live values of each sparse weight the module records (none: all dense)."""
    attr = module.attributes.get(SPARSE_ATTR)
    if attr is None:
        return {}
    entries = attr.data if isinstance(attr, DictionaryAttr) else {}
    counts = {k: v.value.data for k, v in entries.items() if isinstance(v, IntegerAttr)}
    if not isinstance(attr, DictionaryAttr) or len(counts) != len(entries):
        raise CgcError(f"the module's '{SPARSE_ATTR}' must map weight names to live counts")
    return counts


class LocatedInserter:
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
