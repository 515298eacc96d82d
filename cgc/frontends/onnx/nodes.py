"""What an op importer reads and raises about an ONNX node besides the ``Importer``: the node
and its attributes (``Node``), the errors of an ONNX node beyond the frontends' ``NodeError``
(``NotConstantError``, ``bad_attr`` and ``check_size``), and what a tensor name stands for while
the graph is imported (an ``Entry``: an SSA value, or a ``Lazy`` constant not yet used).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper
from xdsl.dialects.builtin import NameLoc
from xdsl.ir import SSAValue

from cgc.frontends.builders import NodeError
from cgc.frontends.onnx.validation import oversize


class NotConstantError(NodeError):
    """An operand that must be known at compile time is computed at run time from the graph
    inputs ``inputs``."""

    def __init__(self, message: str, inputs: tuple[str, ...]):
        super().__init__(message)
        self.inputs = inputs


def bad_attr(name: str, value: Any, why: str = "") -> NodeError:
    if isinstance(value, list | tuple):
        value = "[" + ", ".join(str(v) for v in value) + "]"
    return NodeError(f"attribute {name}={value} is not supported{why}")


def check_size(what: str, shape: Sequence[int], dtype: np.dtype | str) -> None:
    """Fails if the tensor ``what`` of ``shape`` and ``dtype`` is too large for cgc to hold:
    checked before the tensor is allocated."""
    if why := oversize(shape, dtype):
        raise NodeError(f"{what} of {why}")


def attribute_value(attr: onnx.AttributeProto) -> Any:
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8", "replace") for v in value]
    return value


@dataclass
class Node:
    proto: onnx.NodeProto
    name: str
    attrs: dict[str, Any]

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    def attr(self, key: str, default: Any) -> Any:
        return self.attrs.get(key, default)

    def ints(self, key: str, count: int, default: int) -> list[int]:
        """An ints attribute of exactly ``count`` values, or ``count`` copies of ``default``."""
        value = self.attrs.get(key)
        if value is None:
            return [default] * count
        if len(value) != count:
            raise bad_attr(key, value, f" (expected {count} values)")
        return [int(v) for v in value]

    def has_input(self, index: int) -> bool:
        return index < len(self.proto.input) and bool(self.proto.input[index])


@dataclass
class Lazy:
    """An initializer or a Constant node's value; becomes an op the first time it is used."""

    array: np.ndarray
    name: str
    initializer: bool
    loc: NameLoc | None = None
    value: SSAValue | None = None
    declared: bool = False
    """An initializer read without its data (``no_weights``): ``array`` has its shape and
    type only (a broadcast zero, no memory), and its values are unknown."""


Entry = SSAValue | Lazy
