"""numpy semantics of every primitive op, on whole (logical) arrays.

The mesh kernels use the elementwise tables on tiles; the data-movement kernels run these
functions on logical arrays, and run the same functions on arrays of element indices to learn
where every element comes from (``-1`` marks a value made locally, such as padding); the
compiler uses them to fold constants. Attributes arrive as plain Python values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_SQRT_PI = np.sqrt(np.pi)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function to float64 accuracy: a Maclaurin series below |x| = 2.5 and
    Lentz's continued fraction for erfc above (fixed term counts, vectorized)."""
    z = np.asarray(x, dtype=np.float64)
    a = np.abs(z)
    small = np.minimum(a, 2.5)
    term = small.copy()
    total = small.copy()
    sq = small * small
    for n in range(1, 60):
        term = term * -sq / n
        total = total + term / (2 * n + 1)
    series = 2.0 / _SQRT_PI * total
    big = np.maximum(a, 2.5)
    frac = np.zeros_like(big)
    for k in range(80, 0, -1):
        frac = (k / 2.0) / (big + frac)
    tail = 1.0 - np.exp(-big * big) / _SQRT_PI / (big + frac)
    out = np.where(a < 2.5, series, tail) * np.sign(z)
    return out.astype(np.result_type(x, np.float32), copy=False)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` without overflow."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def relu(x: np.ndarray) -> np.ndarray:
    """``max(x, 0)``."""
    return np.maximum(x, np.zeros((), dtype=x.dtype))


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": np.negative,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "reciprocal": np.reciprocal,
    "abs": np.abs,
    "relu": relu,
    "sigmoid": sigmoid,
    "tanh": np.tanh,
    "erf": erf,
}

BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "pow": np.power,
    "max": np.maximum,
    "min": np.minimum,
    "greater": np.greater,
    "equal": np.equal,
}

REDUCE: dict[str, Callable[..., np.ndarray]] = {
    "reduce_sum": np.sum,
    "reduce_mean": np.mean,
    "reduce_max": np.max,
    "reduce_min": np.min,
}

REDUCE_IDENTITY: dict[str, float] = {
    "reduce_sum": 0.0,
    "reduce_mean": 0.0,
    "reduce_max": -np.inf,
    "reduce_min": np.inf,
}


def reduce(kind: str, x: np.ndarray, axes: Sequence[int], keepdims: bool) -> np.ndarray:
    """A reduction over ``axes``."""
    return np.asarray(REDUCE[kind](x, axis=tuple(axes), keepdims=keepdims), dtype=x.dtype)


def slice_array(
    x: np.ndarray, starts: Sequence[int], limits: Sequence[int], strides: Sequence[int]
) -> np.ndarray:
    """``x[starts:limits:strides]`` on every axis."""
    index = tuple(slice(a, b, s) for a, b, s in zip(starts, limits, strides, strict=True))
    return x[index]


def pad(x: np.ndarray, low: Sequence[int], high: Sequence[int], value: float) -> np.ndarray:
    """Constant padding before (``low``) and after (``high``) every axis."""
    return np.pad(x, list(zip(low, high, strict=True)), constant_values=value)


def one_hot(indices: np.ndarray, depth: int, dtype: np.dtype) -> np.ndarray:
    """Rows of ``depth`` with a one at each index; out-of-range indices give zero rows."""
    return (indices[..., None] == np.arange(depth)).astype(dtype)


def windows(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    fill: float,
) -> np.ndarray:
    """Every sliding window over the trailing ``len(kernel)`` axes of ``x``.

    Returns ``[*lead, *out_spatial, *kernel]``; positions in the padding hold ``fill``.
    """
    spatial = len(kernel)
    lead = x.ndim - spatial
    pad_width = [(0, 0)] * lead + [(pads[i], pads[spatial + i]) for i in range(spatial)]
    padded = np.pad(x, pad_width, constant_values=fill)
    spans = [dilations[i] * (kernel[i] - 1) + 1 for i in range(spatial)]
    view = sliding_window_view(padded, spans, axis=tuple(range(lead, x.ndim)))
    steps = tuple(slice(None, None, strides[i]) for i in range(spatial))
    taps = tuple(slice(None, None, dilations[i]) for i in range(spatial))
    return view[(Ellipsis, *steps, *taps)] if spatial else view


def im2col(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    group: int,
    fill: float = 0.0,
) -> np.ndarray:
    """The patches of a grouped convolution as matrices ``[group, N * prod(out), C/group *
    prod(kernel)]``: row ``(n, *o)`` holds the window under output position ``o`` of sample n."""
    n, c = x.shape[:2]
    w = windows(x, kernel, strides, pads, dilations, fill)  # [N, C, *out, *kernel]
    spatial = len(kernel)
    out = w.shape[2 : 2 + spatial]
    w = w.reshape(n, group, c // group, *out, prod(kernel))
    w = np.moveaxis(w, (1, 2), (0, 2 + spatial))  # [g, N, *out, C/g, K]
    return np.ascontiguousarray(w).reshape(group, n * prod(out), (c // group) * prod(kernel))


def pool(
    kind: str,
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    count_include_pad: bool = False,
) -> np.ndarray:
    """Max or average pooling (``kind`` is ``max_pool`` or ``avg_pool``)."""
    spatial = len(kernel)
    axes = tuple(range(-spatial, 0))
    if kind == "max_pool":
        return windows(x, kernel, strides, pads, dilations, -np.inf).max(axis=axes)
    total = windows(x, kernel, strides, pads, dilations, 0.0).sum(axis=axes)
    if count_include_pad:
        count = np.asarray(prod(kernel), dtype=x.dtype)
    else:
        ones = np.ones((1, 1, *x.shape[2:]), dtype=x.dtype)
        count = windows(ones, kernel, strides, pads, dilations, 0.0).sum(axis=axes)
    return (total / count).astype(x.dtype, copy=False)


def weight_view(stored: np.ndarray, shape: Sequence[int], perm: Sequence[int] | None):
    """The view of a stored weight that a ``wse.weight`` of ``shape`` and ``perm`` denotes:
    the elements reshaped to ``shape`` permuted back by ``perm``, then permuted by ``perm``."""
    if perm is None:
        return stored.reshape(shape)
    inverse = np.argsort(perm)
    return np.transpose(stored.reshape([shape[i] for i in inverse]), perm)


def weight_unview(grad: np.ndarray, stored_shape: Sequence[int], perm: Sequence[int] | None):
    """Maps the gradient of a view back onto the stored weight's shape."""
    if perm is not None:
        grad = np.transpose(grad, np.argsort(perm))
    return np.ascontiguousarray(grad).reshape(stored_shape)


def movement(name: str, attrs: dict, inputs: Sequence[np.ndarray], shape: Sequence[int]):
    """Applies a data-movement op; works on data and on index arrays alike."""
    x = inputs[0]
    if name == "reshape":
        return x.reshape(shape)
    if name == "transpose":
        return np.transpose(x, attrs["perm"])
    if name == "broadcast_to":
        return np.broadcast_to(x, shape)
    if name == "concat":
        return np.concatenate(inputs, axis=attrs["axis"])
    if name == "slice":
        return slice_array(x, attrs["starts"], attrs["limits"], attrs["strides"])
    if name == "pad":
        return pad(x, attrs["low"], attrs["high"], attrs.get("value", 0.0))
    if name == "im2col":
        return im2col(
            x,
            attrs["kernel"],
            attrs["strides"],
            attrs["pads"],
            attrs["dilations"],
            attrs["group"],
            attrs.get("fill", 0.0),
        )
    raise KeyError(name)


MOVEMENT = ("reshape", "transpose", "broadcast_to", "concat", "slice", "pad", "im2col")


def evaluate(name: str, attrs: dict, inputs: Sequence[np.ndarray], shape, dtype) -> np.ndarray:
    """Evaluates primitive ``name`` on logical arrays; the result has ``shape`` and ``dtype``."""
    with np.errstate(all="ignore"):
        if name in UNARY:
            out = UNARY[name](inputs[0])
        elif name in BINARY:
            out = BINARY[name](inputs[0], inputs[1])
        elif name == "select":
            out = np.where(*inputs)
        elif name == "cast":
            out = inputs[0]
        elif name in REDUCE:
            out = reduce(name, inputs[0], attrs["axes"], attrs["keepdims"])
        elif name == "matmul":
            out = np.matmul(inputs[0], inputs[1])
        elif name in ("max_pool", "avg_pool"):
            out = pool(
                name,
                inputs[0],
                attrs["kernel"],
                attrs["strides"],
                attrs["pads"],
                attrs["dilations"],
                attrs.get("count_include_pad", False),
            )
        elif name == "one_hot":
            out = one_hot(inputs[0], shape[-1], np.dtype(dtype))
        elif name in MOVEMENT:
            out = movement(name, attrs, inputs, shape)
        else:
            raise KeyError(f"no reference semantics for {name!r}")
    result = np.asarray(out).astype(dtype, copy=False)
    if tuple(result.shape) != tuple(shape):
        raise ValueError(f"{name} produced shape {result.shape}, expected {tuple(shape)}")
    return result
