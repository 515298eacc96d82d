"""numpy semantics of every primitive op, on whole (logical) arrays.

The mesh kernels use the elementwise tables on tiles; the data-movement kernels run these
functions on logical arrays, and run the same functions on arrays of element indices to learn
where every element comes from (``-1`` marks a value made locally, such as padding); the
compiler uses them to fold constants. Attributes arrive as plain Python values.

This package's front is the entry point: it evaluates a primitive by mnemonic (``evaluate``,
``evaluate_all``) and re-exports every public name of the modules it gathers:

* ``arithmetic``: the elementwise math (``erf``, ``sigmoid``, ``divide``, ``power``), the check
  of integer divisors (``DivisionByZero``), the tables ``UNARY``, ``BINARY`` and ``REDUCE``,
  the extremes of a type and ``cast``;
* ``data_movement``: data movement (``movement``, ``MOVEMENT``), sliding windows, im2col and
  col2im, pooling, one-hot and the views of stored weights;
* ``indexing``: gathers, scatters, scans and top-k, and the checks of data-dependent
  indices and class labels (``IndexOutOfRange``);
* ``attention``: fused attention, its gradient, and rotary position embeddings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cgc.machine.hardware import dtypes
from cgc.machine.reference.arithmetic import (
    BINARY,
    INTEGER_DIVISIONS,
    REDUCE,
    REDUCE_IDENTITY,
    UNARY,
    DivisionByZero,
    cast,
    check_divisor,
    divide,
    epilogue,
    erf,
    highest,
    lowest,
    power,
    reduce,
    relu,
    scaled_columns,
    sigmoid,
)
from cgc.machine.reference.attention import attention, attention_grad, cached_attention, rotary
from cgc.machine.reference.data_movement import (
    MOVEMENT,
    Attrs,
    argmax_pool,
    channels_back,
    channels_first,
    col2im,
    im2col,
    im2col_sources,
    movement,
    one_hot,
    pad,
    pool,
    pool_args,
    pool_windows,
    slice_array,
    weight_unview,
    weight_view,
    windows,
)
from cgc.machine.reference.indexing import (
    IndexOutOfRange,
    check_indices,
    check_labels,
    gather,
    gather_elements,
    gather_nd,
    scan,
    scatter_elements,
    scatter_nd,
    topk,
)

__all__ = [
    "BINARY",
    "INTEGER_DIVISIONS",
    "MOVEMENT",
    "REDUCE",
    "REDUCE_IDENTITY",
    "UNARY",
    "Attrs",
    "DivisionByZero",
    "IndexOutOfRange",
    "Spec",
    "Special",
    "argmax_pool",
    "cast",
    "channels_back",
    "channels_first",
    "check_divisor",
    "check_indices",
    "check_labels",
    "col2im",
    "divide",
    "epilogue",
    "erf",
    "evaluate",
    "evaluate_all",
    "gather",
    "gather_elements",
    "gather_nd",
    "highest",
    "im2col",
    "im2col_sources",
    "lowest",
    "movement",
    "one_hot",
    "pad",
    "pool",
    "pool_windows",
    "power",
    "reduce",
    "relu",
    "scaled_columns",
    "scan",
    "scatter_elements",
    "scatter_nd",
    "sigmoid",
    "slice_array",
    "topk",
    "weight_unview",
    "weight_view",
    "windows",
]

Spec = tuple[Sequence[int], str]
"""A result's shape and numpy dtype name."""
Special = Callable[[Attrs, Sequence[np.ndarray], Sequence[Spec]], list[np.ndarray]]


def _pooling(kind: str) -> Special:
    """The semantics of pooling op ``kind`` in its own axis order."""

    def pooled(a: Attrs, xs: Sequence[np.ndarray], r: Sequence[Spec]) -> list[np.ndarray]:
        last = a.get("channels_last", False)
        first = channels_first(xs[0], last)
        return [
            channels_back(pool(kind, first, *pool_args(a), a.get("count_include_pad", False)), last)
        ]

    return pooled


def _one_hot(a: Attrs, xs: Sequence[np.ndarray], r: Sequence[Spec]) -> list[np.ndarray]:
    """One-hot rows; indices out of range give zero rows (ONNX OneHot) unless they are a
    loss's class labels (``labels``), which must be in range or ``ignore_index``."""
    depth = r[0][0][-1]
    if a.get("labels", False):
        check_labels(xs[0], depth, a.get("ignore_index"))
    return [one_hot(xs[0], depth, dtypes.dtype(r[0][1]))]


def _scanning(kind: str) -> Special:
    """The semantics of scan op ``kind``."""

    def scanned(a: Attrs, xs: Sequence[np.ndarray], r: Sequence[Spec]) -> list[np.ndarray]:
        return [scan(kind, xs[0], a["axis"], a["exclusive"], a["reverse"])]

    return scanned


_SPECIAL: dict[str, Special] = {
    "select": lambda a, xs, r: [np.where(*xs)],
    "cast": lambda a, xs, r: [cast(xs[0], dtypes.dtype(r[0][1]), a.get("saturate", True))],
    "bitcast": lambda a, xs, r: [np.ascontiguousarray(xs[0]).view(dtypes.dtype(r[0][1]))],
    "matmul": lambda a, xs, r: [np.matmul(xs[0], xs[1])],
    "matmul_transpose_a": lambda a, xs, r: [np.matmul(np.swapaxes(xs[0], -1, -2), xs[1])],
    "fused_matmul": lambda a, xs, r: [_fused_matmul(a, xs, r[0])],
    **{kind: _pooling(kind) for kind in ("max_pool", "avg_pool")},
    "col2im": lambda a, xs, r: [col2im(xs[0], r[0][0], a)],
    "argmax_pool": lambda a, xs, r: [argmax_pool(xs[0], *pool_args(a), a.get("storage_order", 0))],
    "one_hot": _one_hot,
    "gather": lambda a, xs, r: [gather(xs[0], xs[1], a["axis"])],
    "gather_elements": lambda a, xs, r: [gather_elements(xs[0], xs[1], a["axis"])],
    "gather_nd": lambda a, xs, r: [gather_nd(xs[0], xs[1], a.get("batch_dims", 0))],
    "scatter_elements": lambda a, xs, r: [
        scatter_elements(xs[0], xs[1], xs[2], a["axis"], a["reduction"])
    ],
    "scatter_nd": lambda a, xs, r: [scatter_nd(xs[0], xs[1], xs[2], a["reduction"])],
    **{kind: _scanning(kind) for kind in ("cumsum", "cumprod")},
    "topk": lambda a, xs, r: list(topk(xs[0], a["axis"], r[0][0][a["axis"]], a["largest"])),
    "attention": lambda a, xs, r: [attention(xs[0], xs[1], xs[2], a, _bias(xs, 3))],
    "attention_grad": lambda a, xs, r: attention_grad(
        xs[0], xs[1], xs[2], xs[-2], xs[-1], a, _bias(xs, 5)
    ),
    "rotary": lambda a, xs, r: [rotary(xs[0], xs[1], xs[2], a)],
    "cached_attention": lambda a, xs, r: [
        cached_attention(xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], a)
    ],
}
"""Primitives with their own semantics (results: their shapes and dtype names)."""


def _fused_matmul(attrs: Attrs, inputs: Sequence[np.ndarray], result: Spec) -> np.ndarray:
    """``wse.fused_matmul``: the product with the scaled weights, viewed in the result's
    shape, then its epilogue on it and the extras."""
    scales = attrs["scales"]
    a, b, extras = inputs[0], inputs[1], inputs[2 + scales :]
    dtype = dtypes.dtype(result[1])
    weights = scaled_columns(b, inputs[2 : 2 + scales])
    product = np.matmul(a, weights).astype(dtype, copy=False).reshape(result[0])
    return epilogue(attrs["epilogue"], [product, *extras], dtype)


def _bias(inputs: Sequence[np.ndarray], at: int) -> np.ndarray | None:
    """An attention's bias: its input ``at`` if it has one more than its others."""
    return inputs[3] if len(inputs) > at else None


def _compute(
    name: str, attrs: Attrs, inputs: Sequence[np.ndarray], results: Sequence[Spec]
) -> list[np.ndarray]:
    if name in UNARY:
        return [UNARY[name](inputs[0])]
    if name in BINARY:
        check_divisor(name, inputs[1], results[0][0])
        return [BINARY[name](inputs[0], inputs[1])]
    if name in REDUCE:
        return [reduce(name, inputs[0], attrs["axes"], attrs["keepdims"])]
    if name in MOVEMENT:
        return [movement(name, attrs, inputs, results[0][0])]
    if name in _SPECIAL:
        return _SPECIAL[name](attrs, inputs, results)
    raise KeyError(f"no reference semantics for {name!r}")


def evaluate_all(
    name: str,
    attrs: Attrs,
    inputs: Sequence[np.ndarray],
    results: Sequence[tuple[Sequence[int], str]],
) -> list[np.ndarray]:
    """Evaluates primitive ``name`` on logical arrays; ``results`` gives each result's shape
    and dtype name."""
    with np.errstate(all="ignore"):
        outs = _compute(name, attrs, inputs, results)
        arrays = [
            np.asarray(out).astype(dtypes.dtype(dtype), copy=False)
            for out, (_, dtype) in zip(outs, results, strict=True)
        ]
    for array, (shape, _) in zip(arrays, results, strict=True):
        if tuple(array.shape) != tuple(shape):
            raise ValueError(f"{name} produced shape {array.shape}, expected {tuple(shape)}")
    return arrays


def evaluate(
    name: str, attrs: Attrs, inputs: Sequence[np.ndarray], shape: Sequence[int], dtype: str
) -> np.ndarray:
    """Evaluates a primitive of one result."""
    return evaluate_all(name, attrs, inputs, [(shape, dtype)])[0]
