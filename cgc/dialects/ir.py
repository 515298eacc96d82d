"""Helpers for reading cgc's IR: the entry function, constants as arrays, the target.

The compiler records the whole target (``cgc.machine.target.Target``) in the module's
``wse.target`` attribute once; every pass reads it from there.
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, ModuleOp, StringAttr

from cgc.dialects import wse
from cgc.errors import CgcError
from cgc.machine import dtypes
from cgc.machine.target import Target, get_target


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
"""Module attribute naming the target a module is compiled for."""


def module_target(module: ModuleOp, override: str = "") -> Target:
    """The target named by ``override``, else by the module's ``wse.target`` attribute."""
    if override:
        return get_target(override)
    attr = module.attributes.get(TARGET_ATTR)
    if not isinstance(attr, StringAttr):
        raise CgcError(
            f"the module has no '{TARGET_ATTR}' attribute; pass the pass option target=NAME"
        )
    return get_target(attr.data)
