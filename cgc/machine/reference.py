"""numpy semantics of every primitive op, on whole (logical) arrays.

The mesh kernels use the elementwise tables on tiles; the data-movement kernels run these
functions on logical arrays, and run the same functions on arrays of element indices to learn
where every element comes from (``-1`` marks a value made locally, such as padding); the
compiler uses them to fold constants. Attributes arrive as plain Python values.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping, Sequence
from math import prod
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from cgc.machine import dtypes

Attrs = Mapping[str, Any]
"""An op's attributes: plain JSON values."""
Spec = tuple[Sequence[int], str]
"""A result's shape and numpy dtype name."""
Special = Callable[[Attrs, Sequence[np.ndarray], Sequence[Spec]], list[np.ndarray]]

# W. J. Cody, "Rational Chebyshev approximations for the error function", Math. Comp. 23
# (1969): erf on |x| <= 0.46875, erfc on (0.46875, 4] and beyond 4, each a rational function
# accurate to about double precision.
_ERF_NEAR = (
    (
        3.1611237438705656,
        113.864154151050156,
        377.485237685302021,
        3209.37758913846947,
        0.185777706184603153,
    ),
    (23.6012909523441209, 244.024637934444173, 1282.61652607737228, 2844.23683343917062),
)
_ERFC_MID = (
    (
        0.564188496988670089,
        8.88314979438837594,
        66.1191906371416295,
        298.635138197400131,
        881.95222124176909,
        1712.04761263407058,
        2051.07837782607147,
        1230.33935479799725,
        2.15311535474403846e-8,
    ),
    (
        15.7449261107098347,
        117.693950891312499,
        537.181101862009858,
        1621.38957456669019,
        3290.79923573345963,
        4362.61909014324716,
        3439.36767414372164,
        1230.33935480374942,
    ),
)
_ERFC_FAR = ((0.305326634961232344, 0.360344899949804439, 0.125781726111229246,
              0.0160837851487422766, 6.58749161529837803e-4, 0.0163153871373020978),
             (2.56852019228982242, 1.87295284992346047, 0.527905102951428412,
              0.0605183413124413191, 0.00233520497626869185))  # fmt: skip
_INV_SQRT_PI = 0.56418958354775628695


def _rational(
    z: np.ndarray, coefficients: tuple[tuple[float, ...], tuple[float, ...]]
) -> np.ndarray:
    """Cody's nested form: numerator and denominator of degree len(q) in ``z``, with the
    numerator's leading coefficient stored last."""
    p, q = coefficients
    num, den = p[-1] * z, z
    for a, b in zip(p[:-2], q[:-1], strict=True):
        num, den = (num + a) * z, (den + b) * z
    return typing.cast(np.ndarray, (num + p[-2]) / (den + q[-1]))


def _exp_minus_square(a: np.ndarray) -> np.ndarray:
    """``exp(-a*a)`` with a split of ``a`` that keeps the rounding of ``a*a`` out of it."""
    head = np.trunc(a * 16) / 16
    return typing.cast(np.ndarray, np.exp(-head * head) * np.exp(-(a - head) * (a + head)))


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, to about double precision."""
    z = np.asarray(x, dtype=np.float64)
    a = np.abs(z)
    out = np.empty_like(z)
    near, mid = a <= 0.46875, (a > 0.46875) & (a <= 4.0)
    far = ~(near | mid)
    out[near] = z[near] * _rational(z[near] ** 2, _ERF_NEAR)
    am = a[mid]
    out[mid] = 1.0 - _exp_minus_square(am) * _rational(am, _ERFC_MID)
    af = a[far]
    with np.errstate(all="ignore"):
        tail = (_INV_SQRT_PI - _rational(1.0 / af**2, _ERFC_FAR) / af**2) / af
        out[far] = np.where(af < 26.6, 1.0 - _exp_minus_square(af) * tail, 1.0)
    out[~near] *= np.sign(z[~near])
    return out.astype(np.result_type(x, np.float32), copy=False)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` without overflow."""
    e = np.exp(-np.abs(x))
    chosen: np.ndarray = np.where(x >= 0, 1 / (1 + e), e / (1 + e))
    return chosen.astype(x.dtype, copy=False)


def relu(x: np.ndarray) -> np.ndarray:
    """``max(x, 0)``."""
    return typing.cast(np.ndarray, np.maximum(x, np.zeros((), dtype=x.dtype)))


def divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a / b``; integers divide exactly, truncating toward zero as C does."""
    if not (dtypes.is_integer(a.dtype) and dtypes.is_integer(b.dtype)):
        return typing.cast(np.ndarray, np.divide(a, b))
    quotient: np.ndarray = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -quotient, quotient)


def power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a ** b``; an integer to a negative integer power truncates toward zero as C does
    (only 1 and -1 have nonzero results)."""
    if not (dtypes.is_integer(a.dtype) and dtypes.is_integer(b.dtype)):
        return typing.cast(np.ndarray, np.power(a, b))
    negative = b < 0
    exact = np.power(a, np.where(negative, 0, b))
    fraction = np.where(np.abs(a) == 1, np.where(b % 2 == 0, 1, a), 0).astype(exact.dtype)
    return np.where(negative, fraction, exact)


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
    "sign": np.sign,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.rint,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "not": np.logical_not,
    "bitwise_not": np.invert,
    "is_nan": np.isnan,
    "is_inf": np.isinf,
}

BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": divide,
    "pow": power,
    "max": np.maximum,
    "min": np.minimum,
    "greater": np.greater,
    "equal": np.equal,
    "greater_equal": np.greater_equal,
    "mod": np.mod,
    "fmod": np.fmod,
    "and": np.logical_and,
    "or": np.logical_or,
    "xor": np.logical_xor,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "shift_left": np.left_shift,
    "shift_right": np.right_shift,
}

REDUCE: dict[str, Callable[..., np.ndarray]] = {
    "reduce_sum": np.sum,
    "reduce_mean": np.mean,
    "reduce_max": np.max,
    "reduce_min": np.min,
    "reduce_prod": np.prod,
}

REDUCE_IDENTITY: dict[str, float] = {
    "reduce_sum": 0.0,
    "reduce_mean": 0.0,
    "reduce_max": -np.inf,
    "reduce_min": np.inf,
    "reduce_prod": 1.0,
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


def pad(
    x: np.ndarray,
    low: Sequence[int],
    high: Sequence[int],
    value: float,
    mode: str = "constant",
) -> np.ndarray:
    """Padding before (``low``) and after (``high``) every axis, in numpy.pad's ``mode``."""
    widths = list(zip(low, high, strict=True))
    if mode == "constant":
        return np.pad(x, widths, constant_values=value)
    return np.pad(x, widths, mode=typing.cast(Any, mode))


def one_hot(indices: np.ndarray, depth: int, dtype: np.dtype) -> np.ndarray:
    """Rows of ``depth`` with a one at each index; out-of-range indices give zero rows."""
    hits: np.ndarray = indices[..., None] == np.arange(depth)
    return hits.astype(dtype)


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
    index: tuple[Any, ...] = (Ellipsis, *steps, *taps)
    return view[index] if spatial else view


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


def im2col_sources(image: Sequence[int], attrs: Attrs) -> np.ndarray:
    """For each element of ``im2col``'s result on an image of shape ``image`` (in the op's own
    axis order), the flat index of the image element it reads, or -1 for padding."""
    ids = np.arange(prod(image)).reshape(image)
    return movement("im2col", {**attrs, "fill": -1}, [ids], ())


def col2im(patches: np.ndarray, image: Sequence[int], attrs: Attrs) -> np.ndarray:
    """The adjoint of ``im2col``: every patch element added to the image element it was read
    from (in float64, then rounded once to the patches' type)."""
    sources = im2col_sources(image, attrs).ravel()
    size = prod(image)
    inside = sources >= 0
    weights = patches.ravel()[inside].astype(np.float64)
    summed = np.bincount(sources[inside], weights=weights, minlength=size)
    return summed.astype(patches.dtype).reshape(image)


def channels_first(x: np.ndarray, channels_last: bool) -> np.ndarray:
    """A view of ``x`` as (N, C, *spatial) when it is (N, *spatial, C)."""
    return np.moveaxis(x, -1, 1) if channels_last else x


def channels_back(y: np.ndarray, channels_last: bool) -> np.ndarray:
    """The inverse of ``channels_first`` on a result (N, C, *rest)."""
    return np.moveaxis(y, 1, -1) if channels_last else y


def pool_windows(x: np.ndarray, attrs: Attrs, fill: float) -> np.ndarray:
    """Every window of a pooling op, ``[*result, *kernel]`` in the op's own axis order."""
    last = attrs.get("channels_last", False)
    taps = windows(channels_first(x, last), *_pool_args(attrs), fill)
    return np.moveaxis(taps, 1, 1 + len(attrs["kernel"])) if last else taps


def lowest(dt: np.dtype) -> float | int | bool:
    """The value no element of type ``dt`` is below: what max-pooling pads with and what a
    max over nothing gives (minus infinity where the type has it)."""
    if dt == np.bool_:
        return False
    if dtypes.is_integer(dt):
        return int(np.iinfo(dt).min)
    if np.isinf(np.array(-np.inf, dtype=dt)):
        return -np.inf
    return dtypes.finite_range(dt)[0]


def highest(dt: np.dtype) -> float | int | bool:
    """The value no element of type ``dt`` is above: what a min over nothing gives."""
    if dt == np.bool_:
        return True
    if dtypes.is_integer(dt):
        return int(np.iinfo(dt).max)
    if np.isinf(np.array(np.inf, dtype=dt)):
        return np.inf
    return dtypes.finite_range(dt)[1]


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
        peak = windows(x, kernel, strides, pads, dilations, lowest(x.dtype)).max(axis=axes)
        return typing.cast(np.ndarray, peak)
    total: np.ndarray = windows(x, kernel, strides, pads, dilations, 0.0).sum(axis=axes)
    if count_include_pad:
        count = np.asarray(prod(kernel), dtype=x.dtype)
    else:
        ones = np.ones((1, 1, *x.shape[2:]), dtype=x.dtype)
        count = np.asarray(windows(ones, kernel, strides, pads, dilations, 0.0).sum(axis=axes))
    mean: np.ndarray = total / count
    return mean.astype(x.dtype, copy=False)


def weight_view(stored: np.ndarray, shape: Sequence[int], perm: Sequence[int] | None) -> np.ndarray:
    """The view of a stored weight that a ``wse.weight`` of ``shape`` and ``perm`` denotes:
    the elements reshaped to ``shape`` permuted back by ``perm``, then permuted by ``perm``."""
    if perm is None:
        return stored.reshape(shape)
    inverse = np.argsort(perm)
    return np.transpose(stored.reshape([shape[i] for i in inverse]), perm)


def weight_unview(
    grad: np.ndarray, stored_shape: Sequence[int], perm: Sequence[int] | None
) -> np.ndarray:
    """Maps the gradient of a view back onto the stored weight's shape."""
    if perm is not None:
        grad = np.transpose(grad, np.argsort(perm))
    return np.ascontiguousarray(grad).reshape(stored_shape)


def movement(
    name: str, attrs: Attrs, inputs: Sequence[np.ndarray], shape: Sequence[int]
) -> np.ndarray:
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
        return pad(
            x, attrs["low"], attrs["high"], attrs.get("value", 0.0), attrs.get("mode", "constant")
        )
    if name == "reverse":
        return np.flip(x, attrs["axes"])
    if name == "tile":
        return np.tile(x, attrs["repeats"])
    if name == "im2col":
        return im2col(
            channels_first(x, attrs.get("channels_last", False)),
            attrs["kernel"],
            attrs["strides"],
            attrs["pads"],
            attrs["dilations"],
            attrs["group"],
            attrs.get("fill", 0.0),
        )
    raise KeyError(name)


MOVEMENT = (
    "reshape", "transpose", "broadcast_to", "concat", "slice", "pad", "im2col", "reverse", "tile",
)  # fmt: skip


def _wrapped(indices: np.ndarray, size: int | np.ndarray) -> np.ndarray:
    """Negative indices counted from the end."""
    return np.where(indices < 0, indices + size, indices)


def gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    """ONNX GatherND."""
    depth = indices.shape[-1]
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
    values the lower index comes first."""
    if dtypes.is_integer(x.dtype) or x.dtype == np.bool_:
        # in their own type: float64 cannot tell 64-bit integers beyond 2**53 apart, and the
        # bitwise complement reverses the order of signed and unsigned types alike
        key = np.asarray(x, dtype=dtypes.storage(x.dtype) if x.dtype == np.bool_ else x.dtype)
        key = ~key if largest else key
    else:
        key = x.astype(np.float64)
        key = -key if largest else key
    order = np.argsort(key, axis=axis, kind="stable")
    indices = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, indices, axis=axis), indices.astype(np.int64)


def argmax_pool(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    storage_order: int,
) -> np.ndarray:
    """The flat input index of each pooling window's (first) maximum."""
    spatial = len(kernel)
    ids = np.arange(x.size).reshape(x.shape)
    if storage_order:  # spatial axes column-major within each (n, c) plane
        plane = np.arange(int(np.prod(x.shape[2:]))).reshape(x.shape[2:][::-1]).T
        ids = (np.arange(x.shape[0] * x.shape[1]) * plane.size).reshape(
            x.shape[:2] + (1,) * spatial
        )
        ids = ids + plane
    values = windows(x, kernel, strides, pads, dilations, lowest(x.dtype))
    lead = values.shape[: x.ndim]
    values = values.reshape(*lead, -1)
    taps = windows(ids, kernel, strides, pads, dilations, -1).reshape(*lead, -1)
    # the first maximum among real elements: padding loses a tie with an element at the minimum
    peak = values.max(axis=-1, keepdims=True)
    is_best = ((values == peak) | (np.isnan(values) & np.isnan(peak))) & (taps >= 0)
    best = np.argmax(is_best, axis=-1)[..., None]
    return np.take_along_axis(taps, best, axis=-1)[..., 0]


def cast(x: np.ndarray, dtype: np.dtype, saturate: bool) -> np.ndarray:
    """``astype``; to the 8- and 4-bit floats with ``saturate``, out-of-range values (and
    infinities) become the type's extreme finite values instead of infinity or NaN."""
    if saturate and dtypes.is_extended(dtype) and dtypes.is_float(dtype) and dtype.itemsize == 1:
        lo, hi = dtypes.finite_range(dtype)
        x = np.clip(x.astype(np.float64), lo, hi)
    return x.astype(dtype)


def _pool_args(attrs: Attrs) -> tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int]]:
    return attrs["kernel"], attrs["strides"], attrs["pads"], attrs["dilations"]


def _pooling(kind: str) -> Special:
    """The semantics of pooling op ``kind`` in its own axis order."""

    def pooled(a: Attrs, xs: Sequence[np.ndarray], r: Sequence[Spec]) -> list[np.ndarray]:
        last = a.get("channels_last", False)
        first = channels_first(xs[0], last)
        return [
            channels_back(
                pool(kind, first, *_pool_args(a), a.get("count_include_pad", False)), last
            )
        ]

    return pooled


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
    **{kind: _pooling(kind) for kind in ("max_pool", "avg_pool")},
    "col2im": lambda a, xs, r: [col2im(xs[0], r[0][0], a)],
    "argmax_pool": lambda a, xs, r: [argmax_pool(xs[0], *_pool_args(a), a.get("storage_order", 0))],
    "one_hot": lambda a, xs, r: [one_hot(xs[0], r[0][0][-1], dtypes.dtype(r[0][1]))],
    "gather": lambda a, xs, r: [
        np.take(xs[0], _wrapped(xs[1], xs[0].shape[a["axis"]]), axis=a["axis"])
    ],
    "gather_elements": lambda a, xs, r: [gather_elements(xs[0], xs[1], a["axis"])],
    "gather_nd": lambda a, xs, r: [gather_nd(xs[0], xs[1], a.get("batch_dims", 0))],
    "scatter_elements": lambda a, xs, r: [
        scatter_elements(xs[0], xs[1], xs[2], a["axis"], a["reduction"])
    ],
    "scatter_nd": lambda a, xs, r: [scatter_nd(xs[0], xs[1], xs[2], a["reduction"])],
    **{kind: _scanning(kind) for kind in ("cumsum", "cumprod")},
    "topk": lambda a, xs, r: list(topk(xs[0], a["axis"], r[0][0][a["axis"]], a["largest"])),
}
"""Primitives with their own semantics (results: their shapes and dtype names)."""


def _compute(
    name: str, attrs: Attrs, inputs: Sequence[np.ndarray], results: Sequence[Spec]
) -> list[np.ndarray]:
    if name in UNARY:
        return [UNARY[name](inputs[0])]
    if name in BINARY:
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
