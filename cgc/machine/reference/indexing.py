"""numpy semantics of the ops whose indices are data, of scans and of top-k.

Gathers and scatters follow ONNX (Gather, GatherElements, GatherND, ScatterElements,
ScatterND): negative indices count from the end, an index outside ``[-size, size)`` of its
axis is an error (``IndexOutOfRange``), and a scatter may reduce what lands on an element
(add, mul, max, min). Class labels (the targets of the losses) must lie in
``[0, classes)`` unless they equal the ignored index (``check_labels``). Running sums and
products, and top-k, run along one axis.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cgc.errors import DataError
from cgc.machine.hardware import dtypes


class IndexOutOfRange(DataError):
    """An index that comes with the data lies outside the axis it addresses. The message
    names the index, its position and the valid range but not the node (``located`` adds
    it)."""


def first_bad(bad: np.ndarray) -> tuple[int, ...] | None:
    """The position of the first true element in row-major order, or None: one pass over
    the mask in the common (all good) case, one argmax otherwise."""
    if not bad.any():
        return None
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))


def at_position(position: tuple[int, ...]) -> str:
    """`` at [i, j]`` naming a position in an error message; nothing for a scalar's."""
    return f" at {list(position)}" if position else ""


def _report(what: str, value: int, position: tuple[int, ...], span: str) -> IndexOutOfRange:
    return IndexOutOfRange(f"{what} {value}{at_position(position)} is outside {span}")


def check_indices(
    indices: np.ndarray, sizes: int | Sequence[int], axes: int | Sequence[int]
) -> None:
    """Raises ``IndexOutOfRange`` for the first index outside ``[-size, size)``. ``sizes`` and
    ``axes`` are one axis's (every index addresses it) or, for the tuples of GatherND and
    ScatterND, one per position along the indices' last axis."""
    size = np.asarray(sizes)
    where = first_bad((indices < -size) | (indices >= size))
    if where is None:
        return
    n = int(np.broadcast_to(size, indices.shape)[where])
    axis = axes if isinstance(axes, int) else axes[where[-1]]
    raise _report("index", int(indices[where]), where, f"[{-n}, {n}) of axis {axis}")


def check_labels(labels: np.ndarray, classes: int, ignore_index: int | None) -> None:
    """Raises ``IndexOutOfRange`` for the first class label outside ``[0, classes)`` that is
    not ``ignore_index`` (ONNX's losses: such a label is an error, not a sample that picks
    nothing)."""
    bad = (labels < 0) | (labels >= classes)
    if ignore_index is not None:
        bad &= labels != ignore_index
    where = first_bad(bad)
    if where is None:
        return
    ignored = "" if ignore_index is None else f" and is not ignore_index {ignore_index}"
    raise _report("label", int(labels[where]), where, f"the classes [0, {classes}){ignored}")


def _wrapped(indices: np.ndarray, size: int | np.ndarray) -> np.ndarray:
    """Negative indices counted from the end."""
    return np.where(indices < 0, indices + size, indices)


def gather(data: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    """ONNX Gather."""
    check_indices(indices, data.shape[axis], axis)
    return np.take(data, _wrapped(indices, data.shape[axis]), axis=axis)


def gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    """ONNX GatherND."""
    depth = indices.shape[-1]
    tuple_axes = range(batch_dims, batch_dims + depth)
    check_indices(indices, [data.shape[a] for a in tuple_axes], tuple_axes)
    batch = data.shape[:batch_dims]
    flat = data.reshape(int(np.prod(batch)), *data.shape[batch_dims:])
    idx = indices.reshape(flat.shape[0], -1, depth)
    idx = _wrapped(idx, np.array(data.shape[batch_dims : batch_dims + depth]))
    rows = np.arange(flat.shape[0])[:, None]
    picked: np.ndarray = flat[(rows, *np.moveaxis(idx, -1, 0))]
    return picked.reshape(*indices.shape[:-1], *data.shape[batch_dims + depth :])


_SCATTER = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter(
    data: np.ndarray, where: tuple[np.ndarray, ...], updates: np.ndarray, reduction: str
) -> np.ndarray:
    out = data.copy()
    if reduction == "none":
        out[where] = updates
    else:
        _SCATTER[reduction].at(out, where, updates)
    return out


def _element_positions(indices: np.ndarray, axis: int, size: int) -> tuple[np.ndarray, ...]:
    """The positions ONNX's GatherElements and ScatterElements address: each index's own
    position, with its value (wrapped) on ``axis``."""
    check_indices(indices, size, axis)
    where: list[np.ndarray] = list(np.indices(indices.shape, sparse=True))
    where[axis] = _wrapped(indices, size)
    return tuple(where)


def gather_elements(data: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    """ONNX GatherElements (indices may be smaller than the data on every axis)."""
    picked: np.ndarray = data[_element_positions(indices, axis, data.shape[axis])]
    return picked


def scatter_elements(
    data: np.ndarray, indices: np.ndarray, updates: np.ndarray, axis: int, reduction: str
) -> np.ndarray:
    """ONNX ScatterElements."""
    return _scatter(data, _element_positions(indices, axis, data.shape[axis]), updates, reduction)


def scatter_nd(
    data: np.ndarray, indices: np.ndarray, updates: np.ndarray, reduction: str
) -> np.ndarray:
    """ONNX ScatterND."""
    depth = indices.shape[-1]
    check_indices(indices, data.shape[:depth], range(depth))
    idx = _wrapped(indices, np.array(data.shape[:depth]))
    return _scatter(data, tuple(np.moveaxis(idx, -1, 0)), updates, reduction)


def scan(kind: str, x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """Running sums (``kind`` ``cumsum``) or products (``cumprod``) along ``axis``."""
    if reverse:
        x = np.flip(x, axis)
    running = np.cumsum if kind == "cumsum" else np.cumprod
    total = running(x, axis=axis, dtype=x.dtype)
    if exclusive and x.shape[axis]:
        identity = np.full_like(np.take(total, [0], axis=axis), 0 if kind == "cumsum" else 1)
        total = np.concatenate([identity, np.delete(total, -1, axis=axis)], axis=axis)
    return np.flip(total, axis) if reverse else total


def topk(x: np.ndarray, axis: int, k: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest or smallest values along ``axis`` and their indices; among equal
    values the lower index comes first, and NaN is above every number (+inf included): the
    first of the largest, the last of the smallest, as in onnxruntime's TopK, torch.topk and
    torch.sort (numpy's sort puts NaN last too).

    The largest come from a stable ascending sort of the reversed axis, read backwards: a
    negated key would keep NaN last, and equal values would come highest index first."""
    # integers in their own type: float64 cannot tell 64-bit integers beyond 2**53 apart
    key = x.astype(np.float64) if dtypes.is_float(x.dtype) else x
    if largest:
        key = np.flip(key, axis)
    order = np.argsort(key, axis=axis, kind="stable")
    if largest:
        order = x.shape[axis] - 1 - np.flip(order, axis)
    indices = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, indices, axis=axis), indices.astype(np.int64)
