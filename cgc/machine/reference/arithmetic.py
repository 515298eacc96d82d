"""numpy semantics of the elementwise math and the reductions, and the extremes of a type.

``erf`` to about double precision (Cody's rational approximations; float32 results chunk by
chunk, faster), ``sigmoid`` without
overflow, integer ``divide`` and ``power`` truncating as C does, and the check that no
integer is divided by 0 (``check_divisor``, ``DivisionByZero``); the tables ``UNARY``,
``BINARY`` and ``REDUCE`` by mnemonic; ``lowest`` and ``highest``, what a max or min over
nothing gives; ``cast``, saturating to the narrow floats.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence

import numpy as np

from cgc.errors import DataError
from cgc.machine.hardware import dtypes
from cgc.machine.reference.indexing import at_position, first_bad

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


def _rational_into(
    z: np.ndarray,
    coefficients: tuple[tuple[float, ...], tuple[float, ...]],
    num: np.ndarray,
    den: np.ndarray,
) -> np.ndarray:
    """``_rational`` into the buffers ``num`` (the result) and ``den``, the same operations
    in the same order."""
    p, q = coefficients
    np.multiply(z, p[-1], out=num)
    np.copyto(den, z)
    for a, b in zip(p[:-2], q[:-1], strict=True):
        num += a
        num *= z
        den += b
        den *= z
    num += p[-2]
    den += q[-1]
    num /= den
    return num


def _exp_minus_square(a: np.ndarray) -> np.ndarray:
    """``exp(-a*a)`` with a split of ``a`` that keeps the rounding of ``a*a`` out of it."""
    head = np.trunc(a * 16) / 16
    return typing.cast(np.ndarray, np.exp(-head * head) * np.exp(-(a - head) * (a + head)))


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, to about double precision (a float32 result: correctly rounded
    but in rare double roundings)."""
    if np.result_type(x, np.float32) == np.float32:
        return _erf_single(np.asarray(x))
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


_CHUNK = 1 << 14
"""Elements ``_erf_single`` computes at a time: its float64 buffers stay in the cache."""


def _erf_single(x: np.ndarray) -> np.ndarray:
    """``erf`` of values with float32 results, by the same rational functions in float64,
    chunk by chunk into preallocated buffers. Beyond 4 the result rounds to 1 in float32, so
    the mid-range function of the clipped value gives it; a float32 value's square is exact
    in float64, so ``exp(-a*a)`` needs no split."""
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape, dtype=np.float32)
    size = min(_CHUNK, flat.size)
    z, a, square, near, mid, den = (np.empty(size) for _ in range(6))
    with np.errstate(all="ignore"):
        for start in range(0, flat.size, _CHUNK):
            piece = flat[start : start + _CHUNK]
            n = piece.size
            z_, a_, square_ = z[:n], a[:n], square[:n]
            near_, mid_, den_ = near[:n], mid[:n], den[:n]
            np.copyto(z_, piece, casting="unsafe")  # exact
            np.abs(z_, out=a_)
            np.minimum(a_, 4.0, out=a_)  # NaN stays NaN
            np.multiply(a_, a_, out=square_)
            _rational_into(square_, _ERF_NEAR, near_, den_)
            near_ *= a_
            _rational_into(a_, _ERFC_MID, mid_, den_)
            np.negative(square_, out=square_)
            np.exp(square_, out=square_)
            mid_ *= square_
            np.subtract(1.0, mid_, out=mid_)
            np.copyto(mid_, near_, where=a_ <= 0.46875)
            np.copysign(mid_, z_, out=out[start : start + n], casting="unsafe")
    return out.reshape(x.shape)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` without overflow."""
    e = np.exp(-np.abs(x))
    chosen: np.ndarray = np.where(x >= 0, 1 / (1 + e), e / (1 + e))
    return chosen.astype(x.dtype, copy=False)


def relu(x: np.ndarray) -> np.ndarray:
    """``max(x, 0)``."""
    return typing.cast(np.ndarray, np.maximum(x, np.zeros((), dtype=x.dtype)))


def divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a / b``; integers divide exactly, truncating toward zero as C does (ONNX Div,
    onnxruntime, torch's ``rounding_mode="trunc"``).

    The floor quotient moves up by one where the division is inexact and the signs differ;
    no ``abs``, which overflows at the type's minimum (int8 -128 / 3 is -42, not 43). What C
    leaves undefined stays defined: the minimum over -1 wraps to the minimum (onnxruntime's
    int8 result; its int32 and int64 ones crash) and a division by zero gives 0, as numpy's
    integer remainders do: the padding of tiles holds zeros, so the kernels divide by them,
    and a zero divisor in the data is refused before (``check_divisor``)."""
    if not (dtypes.is_integer(a.dtype) and dtypes.is_integer(b.dtype)):
        return typing.cast(np.ndarray, np.divide(a, b))
    floor, remainder = np.divmod(a, b)
    return typing.cast(np.ndarray, floor + ((remainder != 0) & ((a < 0) != (b < 0))))


class DivisionByZero(DataError):
    """An integer divided by 0, which C leaves undefined and onnxruntime ("Integer division
    by zero") and torch (``ZeroDivisionError``) refuse. The message names the first position
    of the result that divides by 0 but not the node (``located`` adds it)."""


INTEGER_DIVISIONS = {"div": "division", "mod": "modulo", "fmod": "modulo"}
"""The binary primitives that divide, by mnemonic, and what their error calls them."""


def check_divisor(name: str, divisor: np.ndarray, shape: Sequence[int]) -> None:
    """Raises ``DivisionByZero`` naming the first element (in row-major order) of a result of
    ``shape`` that the integer primitive ``name`` (``div``, ``mod`` or ``fmod``) computes
    with a divisor of 0; anything else passes (a float divided by 0 is IEEE's infinity or
    NaN). ``divisor`` broadcasts to ``shape``; a result with no elements divides nothing.
    One pass over the divisor when no element of it is 0."""
    if name not in INTEGER_DIVISIONS or not dtypes.is_integer(divisor.dtype):
        return
    zero = divisor == 0
    if not zero.any():
        return
    where = first_bad(np.broadcast_to(zero, tuple(shape)))
    if where is None:
        return
    raise DivisionByZero(f"integer {INTEGER_DIVISIONS[name]} by zero{at_position(where)}")


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


def scaled_columns(matrix: np.ndarray, scales: Sequence[np.ndarray]) -> np.ndarray:
    """``matrix`` with its columns multiplied by the product of ``scales`` (vectors of its
    columns), the scales multiplied together first: a fused matmul's weights."""
    if not scales:
        return matrix
    factor = scales[0]
    for scale in scales[1:]:
        factor = factor * scale
    scaled: np.ndarray = matrix * factor
    return scaled


def epilogue(
    steps: Sequence[Sequence[typing.Any]], values: Sequence[np.ndarray], dtype: np.dtype
) -> np.ndarray:
    """A fused matmul's epilogue on its product and extras (``values``): each step an
    elementwise op (``UNARY`` or ``BINARY``) and the indices of its operands among the
    values and the steps before it, its result in ``dtype`` as the op alone would give it;
    the last step's result (the product itself if there is none)."""
    known = list(values)
    for name, refs in steps:
        args = [known[r] for r in refs]
        table = UNARY if name in UNARY else BINARY
        known.append(np.asarray(table[name](*args)).astype(dtype, copy=False))
    return known[-1] if steps else known[0]


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


def cast(x: np.ndarray, dtype: np.dtype, saturate: bool) -> np.ndarray:
    """``astype``; to the 8- and 4-bit floats with ``saturate``, out-of-range values (and
    infinities) become the type's extreme finite values instead of infinity or NaN."""
    if saturate and dtypes.is_extended(dtype) and dtypes.is_float(dtype) and dtype.itemsize == 1:
        lo, hi = dtypes.finite_range(dtype)
        x = np.clip(x.astype(np.float64), lo, hi)
    return x.astype(dtype)
