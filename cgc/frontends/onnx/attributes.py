"""The readers of an ONNX node's attributes and compile-time inputs that several op families
share.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cgc.frontends.builders import NodeError, int_list
from cgc.frontends.onnx.importer import Importer
from cgc.frontends.onnx.nodes import Node, bad_attr


def string_attr(node: Node, name: str, default: str, choices: Sequence[str]) -> str:
    """A string attribute that must be one of ``choices``."""
    value = node.attr(name, default)
    if value not in choices:
        raise bad_attr(name, value, f" (expected one of {', '.join(choices)})")
    return value


def static_ints(im: Importer, node: Node, index: int) -> list[int]:
    """A compile-time integer input as a list of Python ints."""
    return int_list(im.static(node, index))


def static_scalar(im: Importer, node: Node, index: int) -> np.generic:
    """A compile-time input of exactly one element."""
    array = np.asarray(im.static(node, index))
    if array.size != 1:
        raise NodeError(
            f"input '{node.proto.input[index]}' must hold one value, got shape {array.shape}"
        )
    return array.ravel()[0]
