"""Unit tests of the mesh kernels of the newer primitives against independent references.

The references are torch (gather, scatter_reduce, cumsum, a stable sort, max_pool2d with
indices, remainder/fmod, the bitwise ops, flip, tile, the padding modes) or, where torch has
no equivalent, loops written out here from the ONNX definitions (GatherND with batch dims,
ScatterND, MaxPool indices in column-major storage, rounding halves to even, the saturating
float8 casts and the bfloat16 rounding on raw bits). As in test_kernels, every operand starts
on another rectangle than the kernel's and is scattered into the layout the plan asks for with
its padding poisoned, and result dtypes are checked exactly.
"""

from __future__ import annotations

import math
from math import prod

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_kernels import BROADCASTS, OTHER, RECT, SHAPES, SRC3, T, close, execute, poisoned

from cgc.machine import plans
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import TRANSCENDENTAL_CYCLES
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import NO_TRAFFIC, edge_traffic
from cgc.machine.plans import RESIDENT, STREAM, WAFER, Operand
from cgc.runtime import kernels

RECTS = [RECT, (2, 1, 3, 6)]
"""The kernel's rectangle: 4 x 4 at the origin, and a tall one away from it."""


def tt(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


def same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal dtype, shape and elements (NaN where the reference has NaN)."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


def execute_all(name, args, attrs, results, rect=RECT, layouts=None):
    """``execute`` for kernels of several results: the logical results and the plan."""
    layouts = layouts or {}
    operands = [
        Operand(
            tuple(a.shape),
            a.dtype.name,
            WAFER,
            layouts.get(k) or Layout.on(a.shape, a.dtype.name, OTHER),
        )
        for k, a in enumerate(args)
    ]
    plan = plans.plan(name, T, rect, operands, attrs, results)
    values = [poisoned(a, want) for a, want in zip(args, plan.inputs, strict=True)]
    with np.errstate(all="ignore"):
        outs = kernels.run(name, plan, values, attrs)
    assert [o.layout for o in outs] == list(plan.outputs)
    got = []
    for out, (shape, dtype) in zip(outs, results, strict=True):
        assert out.tiles.shape == out.layout.tile_shape()
        assert out.tiles.dtype == dtypes.dtype(dtype)
        got.append(out.gather())
        assert got[-1].shape == tuple(shape)
    return got, plan


# --------------------------------------------------------------------------- unary


def round_half_even(x: np.ndarray) -> np.ndarray:
    """Python's round() of every element: halves go to the even neighbour."""
    flat = [float(round(v)) if math.isfinite(v) else v for v in x.astype(np.float64).ravel()]
    return np.array(flat, dtype=x.dtype).reshape(x.shape)


def _torch64(fn):
    return lambda x: fn(tt(x.astype(np.float64))).numpy().astype(x.dtype)


MATH = {
    "sign": (_torch64(torch.sign), (-3, 3)),
    "floor": (_torch64(torch.floor), (-3, 3)),
    "ceil": (_torch64(torch.ceil), (-3, 3)),
    "round": (round_half_even, (-3, 3)),
    "sin": (_torch64(torch.sin), (-4, 4)),
    "cos": (_torch64(torch.cos), (-4, 4)),
    "tan": (_torch64(torch.tan), (-1.4, 1.4)),
    "asin": (_torch64(torch.asin), (-0.99, 0.99)),
    "acos": (_torch64(torch.acos), (-0.99, 0.99)),
    "atan": (_torch64(torch.atan), (-5, 5)),
    "sinh": (_torch64(torch.sinh), (-3, 3)),
    "cosh": (_torch64(torch.cosh), (-3, 3)),
    "asinh": (_torch64(torch.asinh), (-5, 5)),
    "acosh": (_torch64(torch.acosh), (1, 6)),
    "atanh": (_torch64(torch.atanh), (-0.99, 0.99)),
}
ROUNDING = ("sign", "floor", "ceil", "round")


def math_input(name, shape, dtype="float32", seed=21):
    rng = np.random.default_rng(seed)
    if name in ROUNDING:  # quarters: halves (ties), integers and zeros all occur
        return (rng.integers(-14, 15, shape) / 4).astype(dtype)
    lo, hi = MATH[name][1]
    return rng.uniform(lo, hi, shape).astype(dtype)


@pytest.mark.parametrize("name", sorted(MATH))
@pytest.mark.parametrize("shape", SHAPES[1:])
@pytest.mark.parametrize("rect", RECTS)
def test_math_unary(name, shape, rect):
    x = math_input(name, shape)
    got, _ = execute(name, [x], {}, shape, "float32", rect=rect)
    want = MATH[name][0](x)
    assert got.dtype == want.dtype == np.float32
    if name in ROUNDING:
        np.testing.assert_array_equal(got, want)
    else:
        close(got, want)


def test_round_is_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 0.49999997, -7.5], dtype=np.float32)
    got, _ = execute("round", [x], {}, x.shape, "float32")
    same(got, np.array([0, 2, 2, -0, -2, -2, 4, 0, -8], dtype=np.float32))
    same(got, round_half_even(x))


@pytest.mark.parametrize("name", ROUNDING)
def test_rounding_float16_and_scalar(name):
    x = math_input(name, (6, 11), "float16")
    got, _ = execute(name, [x], {}, x.shape, "float16")
    same(got, MATH[name][0](x))
    s = np.array(-2.5, dtype=np.float32)
    got, _ = execute(name, [s], {}, (), "float32")
    same(got, MATH[name][0](s))


SPECIALS = np.array(
    [np.nan, np.inf, -np.inf, -0.0, 0.0, 0.5, -0.5, 2.5, -3.5, 1e30, -1e-30, 7.25],
    dtype=np.float32,
).reshape(3, 4)


@pytest.mark.parametrize("name", ["sign", "floor", "ceil", "round", "is_nan", "is_inf"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_special_values(name, dtype):
    with np.errstate(over="ignore"):  # 1e30 is infinite in float16
        x = SPECIALS.astype(dtype)
    t = tt(x)
    want = {
        # the op keeps NaN where torch.sign gives 0
        "sign": lambda: np.where(np.isnan(x), x, torch.sign(t).numpy()),
        "floor": lambda: torch.floor(t).numpy(),
        "ceil": lambda: torch.ceil(t).numpy(),
        "round": lambda: round_half_even(x),
        "is_nan": lambda: torch.isnan(t).numpy(),
        "is_inf": lambda: torch.isinf(t).numpy(),
    }[name]()
    out_dtype = "bool" if name.startswith("is_") else dtype
    got, _ = execute(name, [x], {}, x.shape, out_dtype, rect=(1, 1, 2, 2))
    same(got, want)
    if name.startswith("is_"):
        assert want.any() and not want.all()


@pytest.mark.parametrize("shape", SHAPES)
def test_not(shape):
    x = np.random.default_rng(22).random(shape) < 0.5
    got, _ = execute("not", [x], {}, shape, "bool", rect=(2, 1, 3, 6))
    same(got, torch.logical_not(tt(x)).numpy())


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "int64"])
@pytest.mark.parametrize("shape", [(7,), (5, 9), (2, 3, 5, 9)])
def test_bitwise_not(dtype, shape):
    info = np.iinfo(dtype)
    x = np.random.default_rng(23).integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    got, _ = execute("bitwise_not", [x], {}, shape, dtype)
    same(got, torch.bitwise_not(tt(x)).numpy())


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
def test_bitwise_not_wide_unsigned(dtype):
    info = np.iinfo(dtype)
    x = np.random.default_rng(24).integers(0, info.max, (5, 9), dtype=dtype, endpoint=True)
    got, _ = execute("bitwise_not", [x], {}, x.shape, dtype)
    want = np.array([info.max - int(v) for v in x.ravel()], dtype=dtype).reshape(x.shape)
    same(got, want)


@pytest.mark.parametrize(
    ("name", "per_element"),
    [("sin", TRANSCENDENTAL_CYCLES), ("atanh", TRANSCENDENTAL_CYCLES), ("floor", 1),
     ("is_nan", 1), ("mod", TRANSCENDENTAL_CYCLES), ("bitwise_xor", 1)],
)  # fmt: skip
def test_new_elementwise_vector_cycles(name, per_element):
    shape = (16, 16)
    lay = Layout.on(shape, "float32", RECT)
    ops = [Operand(shape, "float32", WAFER, lay)] * (2 if name in ("mod", "bitwise_xor") else 1)
    out = "bool" if name == "is_nan" else "float32"
    plan = plans.plan(name, T, RECT, ops, {}, [(shape, out)])
    assert plan.cost.traffic == NO_TRAFFIC
    assert plan.cost.cycles == pytest.approx(16 * per_element)


# --------------------------------------------------------------------------- binary

LOGIC = {
    "mod": torch.remainder,
    "fmod": torch.fmod,
    "and": torch.logical_and,
    "or": torch.logical_or,
    "xor": torch.logical_xor,
    "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor,
    "shift_left": torch.bitwise_left_shift,
    "shift_right": torch.bitwise_right_shift,
    "greater_equal": torch.ge,
}
LOGIC_DTYPES = [
    ("mod", "int32"), ("mod", "int64"), ("mod", "float32"), ("fmod", "float32"),
    ("fmod", "int32"), ("and", "bool"), ("or", "bool"), ("xor", "bool"),
    ("bitwise_and", "int8"), ("bitwise_and", "int64"), ("bitwise_or", "uint8"),
    ("bitwise_or", "int32"), ("bitwise_xor", "int16"), ("bitwise_xor", "uint8"),
    ("shift_left", "uint8"), ("shift_left", "int32"), ("shift_right", "uint8"),
    ("shift_right", "int64"), ("greater_equal", "float32"), ("greater_equal", "int32"),
]  # fmt: skip


def logic_args(name, sa, sb, dtype, seed=25):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(sa) < 0.5, rng.random(sb) < 0.5
    if name in ("mod", "fmod"):  # divisors never zero; floats exact in binary
        a = rng.integers(-40, 41, sa)
        b = rng.integers(1, 8, sb) * rng.choice([-1, 1], sb)
        if dtype == "float32":
            return (a / 4).astype(dtype), (b / 2).astype(dtype)
        return a.astype(dtype), b.astype(dtype)
    if name.startswith("shift"):
        info = np.iinfo(dtype)
        lo = info.min if name == "shift_right" else max(info.min, -1000)
        hi = info.max if name == "shift_right" else min(info.max, 1000)
        a = rng.integers(lo, hi, sa, dtype=dtype, endpoint=True)
        return a, rng.integers(0, info.bits, sb).astype(dtype)
    if name == "greater_equal":  # small values so that ties happen, and NaN
        a, b = rng.integers(-2, 3, sa).astype(dtype), rng.integers(-2, 3, sb).astype(dtype)
        if dtype == "float32" and a.ndim:
            a.flat[::5] = np.nan
        return a, b
    info = np.iinfo(dtype)
    return (
        rng.integers(info.min, info.max, sa, dtype=dtype, endpoint=True),
        rng.integers(info.min, info.max, sb, dtype=dtype, endpoint=True),
    )


@pytest.mark.parametrize(("name", "dtype"), LOGIC_DTYPES)
@pytest.mark.parametrize(("sa", "sb"), BROADCASTS[1:6])
def test_logic_binary(name, dtype, sa, sb):
    a, b = logic_args(name, sa, sb, dtype)
    want = LOGIC[name](tt(a), tt(b)).numpy()
    out_dtype = want.dtype.name
    assert out_dtype == ("bool" if name in ("and", "or", "xor", "greater_equal") else dtype)
    got, _ = execute(name, [a, b], {}, want.shape, out_dtype)
    same(got, want)


@pytest.mark.parametrize(
    ("name", "table"),
    [("and", [0, 0, 0, 1]), ("or", [0, 1, 1, 1]), ("xor", [0, 1, 1, 0])],
)
def test_logic_truth_tables(name, table):
    a = np.array([[False, False, True, True]] * 5)
    b = np.array([False, True, False, True])
    got, _ = execute(name, [a, b], {}, a.shape, "bool", rect=(0, 0, 2, 3))
    same(got, np.array([table] * 5, dtype=bool))


@pytest.mark.parametrize("rect", [(0, 0, 1, 1), (2, 1, 3, 6), (0, 0, 8, 8)])
def test_mod_signs(rect):
    """mod takes the divisor's sign (Python %), fmod the dividend's (C)."""
    a = np.array([[7, -7, 7, -7, 0, 6]], dtype=np.int32).repeat(3, 0)
    b = np.array([[3, 3, -3, -3, 5, -3]], dtype=np.int32).repeat(3, 0)
    got, _ = execute("mod", [a, b], {}, a.shape, "int32", rect=rect)
    same(got, np.tile(np.array([1, 2, -2, -1, 0, 0], dtype=np.int32), (3, 1)))
    got, _ = execute("fmod", [a, b], {}, a.shape, "int32", rect=rect)
    same(got, np.tile(np.array([1, -1, 1, -1, 0, 0], dtype=np.int32), (3, 1)))
    x = np.array([5.5, -5.5, 5.5, -5.5], dtype=np.float32)
    y = np.array([2.0, 2.0, -2.0, -2.0], dtype=np.float32)
    got, _ = execute("mod", [x, y], {}, x.shape, "float32", rect=rect)
    same(got, np.array([1.5, 0.5, -0.5, -1.5], dtype=np.float32))
    got, _ = execute("fmod", [x, y], {}, x.shape, "float32", rect=rect)
    same(got, np.array([1.5, -1.5, 1.5, -1.5], dtype=np.float32))


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
@pytest.mark.parametrize("name", ["shift_left", "shift_right"])
def test_shift_wide_unsigned(name, dtype):
    """ONNX BitShift on the unsigned types torch lacks ops for, against Python integers."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(26)
    a = rng.integers(0, info.max, (4, 9), dtype=dtype, endpoint=True)
    b = rng.integers(0, info.bits, (9,)).astype(dtype)
    mask = (1 << info.bits) - 1
    pairs = zip(*(m.ravel().tolist() for m in np.broadcast_arrays(a, b)), strict=True)
    shift = (lambda x, s: (x << s) & mask) if name == "shift_left" else (lambda x, s: x >> s)
    flat = [shift(x, s) for x, s in pairs]
    got, _ = execute(name, [a, b], {}, a.shape, dtype)
    same(got, np.array(flat, dtype=dtype).reshape(a.shape))


# --------------------------------------------------------------------------- casts

FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")


def float8_grid(name: str) -> np.ndarray:
    """The non-negative finite values of a float8 type in the order of their encodings (the
    codes 0x00 up to the first that is not finite), decoded from the bit patterns."""
    codes = np.arange(128, dtype=np.uint8).view(dtypes.dtype(name)).astype(np.float64)
    finite = np.isfinite(codes)
    return codes if finite.all() else codes[: int(np.argmin(finite))]


def float8_cast(x: np.ndarray, name: str, saturate: bool) -> np.ndarray:
    """ONNX Cast to a float8 type, one element at a time, as the tables of the spec say:
    round to nearest with ties to the even encoding; with ``saturate`` a result beyond the
    largest finite value (infinities too) is that value of the same sign; without, it is
    infinity for E5M2 and NaN for the others. The FNUZ types have no negative zero."""
    grid = float8_grid(name)
    top = grid[-1]
    ext = np.append(grid, 2 * top - grid[-2])  # the encoding after the largest, if finite
    out = []
    for v in x.astype(np.float64).ravel().tolist():
        if math.isnan(v):
            out.append(math.nan)
            continue
        sign, a = math.copysign(1.0, v), abs(v)
        if a > ext[-1]:  # infinities too
            code = len(grid)
        else:
            distance = np.abs(ext - a)
            nearest = np.flatnonzero(distance == distance.min())
            code = int(nearest[0] if len(nearest) == 1 else nearest[nearest % 2 == 0][0])
        if code < len(grid):
            magnitude = ext[code]
        elif saturate:
            magnitude = top
        elif name == "float8_e5m2":
            magnitude = math.inf
        else:
            out.append(math.nan)
            continue
        if magnitude == 0 and name.endswith("fnuz"):
            sign = 1.0
        out.append(sign * magnitude)
    return np.array(out).reshape(x.shape)


def bfloat16_cast(x: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 on the raw bits: round to nearest even at bit 16, NaN kept quiet."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = np.where(np.isnan(x), (bits >> 16) | 0x40, rounded).astype(np.uint16)
    return rounded.view(ml_dtypes.bfloat16)


def same_floats(got: np.ndarray, want: np.ndarray) -> None:
    """Equal values, NaN in the same places, and the same sign of zero."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    keep = ~np.isnan(w)
    np.testing.assert_array_equal(g[keep], w[keep])
    np.testing.assert_array_equal(np.signbit(g[keep]), np.signbit(w[keep]))


def float8_inputs(name: str, source: str) -> np.ndarray:
    grid = float8_grid(name)
    top = grid[-1]
    ties = (grid[1:] + grid[:-1]) / 2
    special = [0.0, -0.0, np.nan, np.inf, -np.inf, top, -top, top * 1.02, -top * 1.02,
               top * 1.2, top * 4, -top * 4, 1e30, -1e30, grid[1] / 2, grid[1] * 0.3,
               -grid[1] * 0.3, -grid[1] * 0.7]  # fmt: skip
    if source == "float64":
        special += [1e300, -1e300]
    rng = np.random.default_rng(27)
    values = [*special, *ties[::5], *-ties[2::9], *rng.uniform(-top, top, 30)]
    values += [0.0] * (-len(values) % 6)
    return np.array(values, dtype=source).reshape(6, -1)


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("target", FLOAT8)
@pytest.mark.parametrize("source", ["float32", "float64"])
def test_cast_to_float8(target, saturate, source):
    x = float8_inputs(target, source)
    got, plan = execute("cast", [x], {"saturate": saturate}, x.shape, target, rect=(1, 0, 3, 2))
    assert got.dtype == dtypes.dtype(target)
    same_floats(got, float8_cast(x, target, saturate))
    assert plan.cost.flops == 0
    magnitudes = np.abs(got.astype(np.float64))
    top = float(ml_dtypes.finfo(dtypes.dtype(target)).max)
    if saturate:  # the infinities and the values beyond the range became the extremes
        assert np.nanmax(magnitudes) == top and (magnitudes == top).sum() >= 8
    elif target == "float8_e5m2":
        assert np.isinf(magnitudes).sum() >= 6
    else:
        assert np.isnan(magnitudes).sum() >= 7


@pytest.mark.parametrize("saturate", [True, False])
def test_cast_to_bfloat16_rounds_and_overflows_whatever_saturate(saturate):
    """``saturate`` concerns the 8-bit floats only: bfloat16 rounds to nearest even and
    overflows to infinity."""
    f32 = np.finfo(np.float32)
    bf16_max = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    special = [0.0, -0.0, np.nan, np.inf, -np.inf, f32.max, -f32.max, bf16_max, 3.3961e38,
               3.39e38, -3.3962e38, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1e-40, -1e-45,
               f32.tiny]  # fmt: skip
    rng = np.random.default_rng(28)
    values = np.concatenate([special, rng.standard_normal(37) * 10.0 ** rng.integers(-30, 30, 37)])
    x = values.astype(np.float32).reshape(6, 9)
    got, _ = execute("cast", [x], {"saturate": saturate}, x.shape, "bfloat16")
    assert got.dtype == dtypes.dtype("bfloat16")
    want = bfloat16_cast(x)
    same_floats(got, want)
    assert np.isinf(want.astype(np.float64)).sum() >= 5


def test_cast_without_the_saturate_attribute_saturates():
    x = np.array([[1e6, -1e6, 1.5]], dtype=np.float32)
    got, _ = execute("cast", [x], {}, x.shape, "float8_e4m3fn")
    same_floats(got, float8_cast(x, "float8_e4m3fn", True))


# --------------------------------------------------------------------------- reduce_prod

AXES3 = [(0,), (1,), (2,), (0, 1), (1, 2), (0, 2), (0, 1, 2)]


def torch_prod(x: np.ndarray, axes, keepdims: bool) -> torch.Tensor:
    t = tt(x)
    for axis in sorted(axes, reverse=True):
        t = torch.prod(t, axis, keepdim=keepdims)
    return t


@pytest.mark.parametrize("axes", AXES3)
@pytest.mark.parametrize("keepdims", [True, False])
def test_reduce_prod(axes, keepdims):
    assert SRC3.rows % SRC3.rt and SRC3.cols % SRC3.ct  # padding, poisoned with NaN
    rng = np.random.default_rng(29)
    x = (rng.uniform(0.7, 1.4, (3, 7, 5)) * rng.choice([-1, 1], (3, 7, 5))).astype(np.float32)
    want = torch_prod(x.astype(np.float64), axes, keepdims).numpy().astype(np.float32)
    attrs = {"axes": list(axes), "keepdims": keepdims}
    got, _ = execute("reduce_prod", [x], attrs, want.shape, "float32", layouts={0: SRC3})
    assert got.dtype == np.float32
    close(got, want)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize(("shape", "axes"), [((3, 7, 5), (1, 2)), ((6, 11), (0,)), ((9,), (0,))])
def test_reduce_prod_integers(dtype, shape, axes):
    rng = np.random.default_rng(30)
    x = rng.choice(np.array([-1, 1, 1, 1, 2, 3]), shape).astype(dtype)
    want = torch_prod(x.astype(np.int64), axes, False).numpy()
    assert np.abs(want).max() < 2**31
    lay = Layout.on(shape, dtype, (1, 1, 3, 2))
    attrs = {"axes": list(axes), "keepdims": False}
    got, _ = execute("reduce_prod", [x], attrs, want.shape, dtype, layouts={0: lay})
    same(got, want.astype(dtype))


# --------------------------------------------------------------------------- gathers


def wrap(indices: np.ndarray, size) -> np.ndarray:
    return np.where(indices < 0, indices + size, indices)


GATHERS = [
    ((5, 4), (2, 3), 0),
    ((5, 4), (7,), 1),
    ((3, 7, 5), (4, 2), 1),
    ((2, 3, 9, 5), (6,), 2),
    ((6, 9), (), 0),
    ((16, 12), (10,), 0),
]


@pytest.mark.parametrize(("data_shape", "index_shape", "axis"), GATHERS)
@pytest.mark.parametrize("rect", [*RECTS, (0, 0, 1, 1)])
def test_gather(data_shape, index_shape, axis, rect):
    rng = np.random.default_rng(31)
    data = rng.standard_normal(data_shape).astype(np.float32)
    n = data_shape[axis]
    idx = rng.integers(-n, n, index_shape).astype(np.int64)
    out_shape = (*data_shape[:axis], *index_shape, *data_shape[axis + 1 :])
    picked = torch.index_select(tt(data), axis, tt(wrap(idx, n).reshape(-1)))
    want = picked.reshape(out_shape).numpy()
    got, plan = execute("gather", [data, idx], {"axis": axis}, out_shape, "float32", rect=rect)
    same(got, want)
    assert [lay.shape for lay in plan.inputs] == [data_shape, index_shape]


@pytest.mark.parametrize("dtype", ["int64", "bool", "float16"])
def test_gather_other_dtypes_and_int32_indices(dtype):
    rng = np.random.default_rng(32)
    data = (rng.standard_normal((6, 5, 7)) * 10).astype(dtype)
    idx = np.array([[4, -1, 0], [2, 2, -5]], dtype=np.int32)
    want = torch.index_select(tt(data), 1, tt(wrap(idx, 5).astype(np.int64).ravel()))
    want = want.reshape(6, 2, 3, 7).numpy()
    got, _ = execute("gather", [data, idx], {"axis": 1}, want.shape, dtype)
    same(got, want)


GATHER_ELEMENTS = [
    ((5, 4), (3, 4), 0),
    ((5, 4), (5, 9), 1),
    ((3, 7, 5), (3, 2, 5), 1),
    ((3, 7, 5), (3, 7, 8), 2),
    ((2, 3, 9, 5), (2, 3, 9, 5), 0),
]


@pytest.mark.parametrize(("data_shape", "index_shape", "axis"), GATHER_ELEMENTS)
@pytest.mark.parametrize("rect", RECTS)
def test_gather_elements(data_shape, index_shape, axis, rect):
    rng = np.random.default_rng(33)
    data = rng.standard_normal(data_shape).astype(np.float32)
    n = data_shape[axis]
    idx = rng.integers(-n, n, index_shape).astype(np.int64)
    want = torch.gather(tt(data), axis, tt(wrap(idx, n))).numpy()
    if index_shape == data_shape:
        np.testing.assert_array_equal(
            want, torch.take_along_dim(tt(data), tt(wrap(idx, n)), axis).numpy()
        )
    got, _ = execute("gather_elements", [data, idx], {"axis": axis}, index_shape, "float32",
                     rect=rect)  # fmt: skip
    same(got, want)


def test_gather_elements_with_indices_smaller_than_the_data():
    rng = np.random.default_rng(34)
    data = rng.standard_normal((5, 4)).astype(np.float32)
    idx = np.array([[3, 0], [1, 1], [-1, 2]], dtype=np.int64)
    want = torch.gather(tt(data), 1, tt(wrap(idx, 4))).numpy()
    got, _ = execute("gather_elements", [data, idx], {"axis": 1}, idx.shape, "float32")
    same(got, want)


def gather_nd_loop(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    """ONNX GatherND, one index tuple at a time."""
    depth = indices.shape[-1]
    out = np.empty((*indices.shape[:-1], *data.shape[batch_dims + depth :]), data.dtype)
    for pos in np.ndindex(*indices.shape[:-1]):
        where = [int(i) for i in indices[pos]]
        where = [i + data.shape[batch_dims + k] if i < 0 else i for k, i in enumerate(where)]
        out[pos] = data[(*pos[:batch_dims], *where)]
    return out


GATHER_ND = [
    ((5, 4, 3), (6, 1), 0),
    ((5, 4, 3), (2, 3, 2), 0),
    ((5, 4, 3), (7, 3), 0),
    ((2, 5, 4), (2, 6, 1), 1),
    ((2, 3, 5, 4), (2, 3, 4, 2), 2),
    ((2, 3, 5, 4), (2, 1), 1),
    ((4, 9), (3, 4, 2), 0),
]


@pytest.mark.parametrize(("data_shape", "index_shape", "batch_dims"), GATHER_ND)
@pytest.mark.parametrize("rect", RECTS)
def test_gather_nd(data_shape, index_shape, batch_dims, rect):
    rng = np.random.default_rng(35)
    data = rng.standard_normal(data_shape).astype(np.float32)
    depth = index_shape[-1]
    bounds = np.array(data_shape[batch_dims : batch_dims + depth])
    idx = (rng.integers(0, 2**20, index_shape) % (2 * bounds) - bounds).astype(np.int64)
    idx.reshape(-1, depth)[0, 0] = -1  # the last along that axis
    want = gather_nd_loop(data, idx, batch_dims)
    got, _ = execute("gather_nd", [data, idx], {"batch_dims": batch_dims}, want.shape, "float32",
                     rect=rect)  # fmt: skip
    same(got, want)


# --------------------------------------------------------------------------- scatters

TORCH_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}
REDUCTIONS = ("none", "add", "mul", "max", "min")


def distinct_along(rng, shape, axis, size) -> np.ndarray:
    """Indices of ``shape`` that never repeat along ``axis`` (shape[axis] <= size)."""
    keys = rng.random((*shape[:axis], size, *shape[axis + 1 :]))
    order = np.argsort(keys, axis=axis)
    return np.take(order, np.arange(shape[axis]), axis=axis).astype(np.int64)


SCATTER_ELEMENTS = [
    ((5, 4), (3, 4), 0),
    ((3, 7, 5), (3, 4, 5), 1),
    ((4, 6), (2, 3), 1),
    ((2, 3, 9, 5), (2, 3, 9, 2), 3),
]


@pytest.mark.parametrize(("data_shape", "index_shape", "axis"), SCATTER_ELEMENTS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_scatter_elements(data_shape, index_shape, axis, reduction, dtype):
    rng = np.random.default_rng(36)
    n = data_shape[axis]
    data = rng.integers(-4, 5, data_shape).astype(dtype)
    updates = rng.integers(-4, 5, index_shape).astype(dtype)
    if reduction == "none":  # ONNX leaves repeated indices undefined without a reduction
        idx = distinct_along(rng, index_shape, axis, n)
        idx = np.where(rng.random(index_shape) < 0.5, idx - n, idx)
        want = torch.scatter(tt(data), axis, tt(wrap(idx, n)), tt(updates))
    else:
        idx = rng.integers(-n, n, index_shape).astype(np.int64)
        want = torch.scatter_reduce(
            tt(data), axis, tt(wrap(idx, n)), tt(updates), TORCH_REDUCE[reduction],
            include_self=True,
        )  # fmt: skip
    attrs = {"axis": axis, "reduction": reduction}
    got, _ = execute("scatter_elements", [data, idx, updates], attrs, data_shape, dtype,
                     rect=(2, 1, 3, 6))  # fmt: skip
    same(got, want.numpy())
    if reduction != "none":
        assert len(np.unique(wrap(idx, n), axis=axis)) < idx.size  # repeats happen


def scatter_nd_loop(data, indices, updates, reduction) -> np.ndarray:
    """ONNX ScatterND, one index tuple at a time, in order."""
    out = data.copy()
    combine = {
        "none": lambda old, new: new,
        "add": lambda old, new: old + new,
        "mul": lambda old, new: old * new,
        "max": np.maximum,
        "min": np.minimum,
    }[reduction]
    for pos in np.ndindex(*indices.shape[:-1]):
        where = tuple(int(i) + data.shape[k] * (i < 0) for k, i in enumerate(indices[pos]))
        out[where] = combine(out[where], updates[pos])
    return out


SCATTER_ND = [
    ((5, 4, 3), (3, 1)),
    ((5, 4, 3), (2, 2, 2)),
    ((5, 4, 3), (4, 3)),
    ((6, 7), (5, 2)),
    ((9,), (4, 1)),
]


@pytest.mark.parametrize(("data_shape", "index_shape"), SCATTER_ND)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_nd(data_shape, index_shape, reduction):
    rng = np.random.default_rng(37)
    depth = index_shape[-1]
    lead = data_shape[:depth]
    count = prod(index_shape[:-1])
    if reduction == "none":  # distinct index tuples
        flat = rng.choice(prod(lead), count, replace=False)
    else:  # few distinct tuples, so that they repeat
        flat = rng.choice(min(prod(lead), 3), count)
    idx = np.stack(np.unravel_index(flat, lead), axis=-1).reshape(index_shape).astype(np.int64)
    idx = np.where(rng.random(idx.shape) < 0.3, idx - np.array(lead), idx)
    data = rng.integers(-4, 5, data_shape).astype(np.float32)
    updates = rng.integers(-4, 5, (*index_shape[:-1], *data_shape[depth:])).astype(np.float32)
    want = scatter_nd_loop(data, idx, updates, reduction)
    got, _ = execute("scatter_nd", [data, idx, updates], {"reduction": reduction}, data_shape,
                     "float32")  # fmt: skip
    same(got, want)


# --------------------------------------------------------------------------- cumsum


def torch_cumsum(
    x: np.ndarray, axis: int, exclusive: bool, reverse: bool, product: bool = False
) -> np.ndarray:
    t = tt(x)
    if reverse:
        t = t.flip(axis)
    total = (torch.cumprod if product else torch.cumsum)(t, axis, dtype=t.dtype)
    if exclusive:
        first = (torch.ones_like if product else torch.zeros_like)(total.narrow(axis, 0, 1))
        total = torch.cat([first, total.narrow(axis, 0, total.shape[axis] - 1)], axis)
    if reverse:
        total = total.flip(axis)
    return total.numpy()


SCANS = [((9,), 0), ((5, 11), 0), ((5, 11), 1), ((3, 7, 5), 0), ((3, 7, 5), 1), ((3, 7, 5), 2),
         ((2, 3, 4, 9), 1), ((2, 3, 10, 9), 2), ((2, 3, 4, 9), 3)]  # fmt: skip
FLAGS = [(False, False), (True, False), (False, True), (True, True)]


@pytest.mark.parametrize(("shape", "axis"), SCANS)
@pytest.mark.parametrize(("exclusive", "reverse"), FLAGS)
@pytest.mark.parametrize("rect", RECTS)
def test_cumsum(shape, axis, exclusive, reverse, rect):
    x = np.random.default_rng(38).standard_normal(shape).astype(np.float32)
    want = torch_cumsum(x.astype(np.float64), axis, exclusive, reverse).astype(np.float32)
    attrs = {"axis": axis, "exclusive": exclusive, "reverse": reverse}
    got, plan = execute("cumsum", [x], attrs, shape, "float32", rect=rect)
    assert got.dtype == np.float32
    close(got, want)
    assert plan.inputs[0] == plan.outputs[0]


@pytest.mark.parametrize(("shape", "axis"), SCANS)
@pytest.mark.parametrize(("exclusive", "reverse"), FLAGS)
def test_cumprod(shape, axis, exclusive, reverse):
    x = np.random.default_rng(40).uniform(0.5, 1.5, shape).astype(np.float32)
    want = torch_cumsum(x.astype(np.float64), axis, exclusive, reverse, product=True)
    attrs = {"axis": axis, "exclusive": exclusive, "reverse": reverse}
    got, plan = execute("cumprod", [x], attrs, shape, "float32", rect=(1, 1, 3, 4))
    close(got, want.astype(np.float32))
    assert plan.cost.cycles > 0


@pytest.mark.parametrize(("shape", "axis"), SCANS)
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_cumsum_integers(shape, axis, dtype):
    x = np.random.default_rng(39).integers(-1000, 1000, shape).astype(dtype)
    exclusive, reverse = FLAGS[(len(shape) + axis) % 4]
    want = torch_cumsum(x, axis, exclusive, reverse)
    attrs = {"axis": axis, "exclusive": exclusive, "reverse": reverse}
    got, _ = execute("cumsum", [x], attrs, shape, dtype, rect=(0, 0, 3, 3))
    same(got, want)


# --------------------------------------------------------------------------- topk

TOPKS = [((7,), 0, 3), ((5, 11), 1, 4), ((5, 11), 0, 5), ((3, 7, 5), 2, 1), ((3, 7, 5), 1, 7),
         ((3, 7, 5), 0, 2), ((2, 3, 4, 9), 3, 6)]  # fmt: skip


@pytest.mark.parametrize(("shape", "axis", "k"), TOPKS)
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
def test_topk_with_ties(shape, axis, k, largest, dtype):
    """Ties everywhere: among equal values the lower index comes first (ONNX), which is what
    a stable sort gives (torch.topk does not promise an order among equal values)."""
    x = np.random.default_rng(40).integers(-3, 4, shape).astype(dtype)
    order = torch.sort(tt(x), dim=axis, descending=largest, stable=True)
    values = order.values.narrow(axis, 0, k).numpy()
    indices = order.indices.narrow(axis, 0, k).numpy()
    top = torch.topk(tt(x), k, axis, largest=largest, sorted=True)
    np.testing.assert_array_equal(values, top.values.numpy())
    out_shape = values.shape
    results = [(out_shape, dtype), (out_shape, "int64")]
    (got_values, got_indices), plan = execute_all(
        "topk", [x], {"axis": axis, "largest": largest}, results, rect=RECTS[axis % 2]
    )
    same(got_values, values)
    same(got_indices, indices)
    assert [lay.dtype for lay in plan.outputs] == [dtype, "int64"]


def test_topk_distinct_float_values():
    x = np.random.default_rng(41).standard_normal((6, 13)).astype(np.float32)
    top = torch.topk(tt(x), 5, 1, largest=True, sorted=True)
    results = [((6, 5), "float32"), ((6, 5), "int64")]
    (values, indices), _ = execute_all("topk", [x], {"axis": 1, "largest": True}, results)
    same(values, top.values.numpy())
    same(indices, top.indices.numpy())


# --------------------------------------------------------------------------- argmax_pool


def argmax_pool_loop(x, kernel, strides, pads, dilations, storage_order):
    """ONNX MaxPool's Indices, one window at a time: the first maximum in row-major order of
    the taps; the flat index of (n, c, *position) with the spatial axes row-major, or
    column-major for storage_order 1; padding never wins."""
    n, c, *spatial = x.shape
    d = len(kernel)
    out_spatial = [
        (spatial[i] + pads[i] + pads[d + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
        for i in range(d)
    ]
    out = np.empty((n, c, *out_spatial), np.int64)
    plane = prod(spatial)
    for where in np.ndindex(n, c, *out_spatial):
        best, at = None, None
        for tap in np.ndindex(*kernel):
            pos = [where[2 + i] * strides[i] - pads[i] + tap[i] * dilations[i] for i in range(d)]
            if any(not 0 <= p < spatial[i] for i, p in enumerate(pos)):
                continue
            value = x[(where[0], where[1], *pos)]
            if best is None or value > best:
                best, at = value, pos
        if storage_order:
            flat = np.ravel_multi_index(at[::-1], spatial[::-1])
        else:
            flat = np.ravel_multi_index(at, spatial)
        out[where] = (where[0] * c + where[1]) * plane + flat
    return out


def pool_attrs(kernel, strides, pads, dilations, storage_order=0):
    return {
        "kernel": list(kernel),
        "strides": list(strides),
        "pads": list(pads),
        "dilations": list(dilations),
        "storage_order": storage_order,
    }


TORCH_POOLS = [
    ((2, 2), (2, 2), (0, 0), (1, 1)),
    ((3, 3), (2, 2), (1, 1), (1, 1)),
    ((3, 2), (1, 2), (1, 0), (2, 1)),
    ((2, 3), (2, 1), (0, 1), (1, 1)),
]


@pytest.mark.parametrize(("kernel", "strides", "pad", "dilations"), TORCH_POOLS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("rect", RECTS)
def test_argmax_pool_against_torch(kernel, strides, pad, dilations, dtype, rect):
    shape = (2, 3, 7, 8)
    rng = np.random.default_rng(42)
    x = (rng.permutation(prod(shape)).reshape(shape) - 100).astype(dtype)  # distinct values
    _, where = F.max_pool2d(tt(x).float(), kernel, strides, pad, dilations, return_indices=True)
    plane = np.arange(shape[0] * shape[1]).reshape(2, 3, 1, 1) * (shape[2] * shape[3])
    want = where.numpy() + plane  # torch counts within each (n, c) plane
    pads = (*pad, *pad)
    got, _ = execute("argmax_pool", [x], pool_attrs(kernel, strides, pads, dilations),
                     want.shape, "int64", rect=rect)  # fmt: skip
    same(got, want)
    np.testing.assert_array_equal(got, argmax_pool_loop(x, kernel, strides, pads, dilations, 0))


LOOP_POOLS = [
    ((2, 2), (2, 2), (0, 0, 0, 0), (1, 1)),
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((2, 3), (2, 1), (0, 1, 1, 0), (1, 1)),  # asymmetric padding
    ((3, 2), (1, 2), (2, 0, 1, 1), (2, 1)),
]


@pytest.mark.parametrize(("kernel", "strides", "pads", "dilations"), LOOP_POOLS)
@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("ties", [False, True])
def test_argmax_pool_storage_order_padding_and_ties(kernel, strides, pads, dilations,
                                                    storage_order, ties):  # fmt: skip
    shape = (2, 3, 6, 7)
    rng = np.random.default_rng(43)
    if ties:  # few values: equal maxima in most windows, and the first must win
        x = rng.integers(-1, 2, shape).astype(np.float32)
    else:
        x = rng.standard_normal(shape).astype(np.float32) - 5  # below the padding's zero
    want = argmax_pool_loop(x, kernel, strides, pads, dilations, storage_order)
    attrs = pool_attrs(kernel, strides, pads, dilations, storage_order)
    got, plan = execute("argmax_pool", [x], attrs, want.shape, "int64")
    same(got, want)
    assert plan.cost.traffic.wavelet_hops > 0


@pytest.mark.parametrize("storage_order", [0, 1])
def test_argmax_pool_1d_and_3d(storage_order):
    rng = np.random.default_rng(44)
    x = rng.standard_normal((2, 4, 11)).astype(np.float32)
    _, where = F.max_pool1d(tt(x), 3, 2, padding=1, return_indices=True)
    want = where.numpy() + np.arange(8).reshape(2, 4, 1) * 11
    attrs = pool_attrs((3,), (2,), (1, 1), (1,), storage_order)
    got, _ = execute("argmax_pool", [x], attrs, want.shape, "int64")
    same(got, want)  # one spatial axis: both storage orders agree
    y = rng.standard_normal((1, 2, 4, 5, 3)).astype(np.float32)
    for pads in ((0,) * 6, (0, 1, 0, 0, 0, 1)):
        args = ((2, 2, 2), (2, 2, 1), pads, (1, 1, 1))
        want = argmax_pool_loop(y, *args, storage_order)
        got, _ = execute("argmax_pool", [y], pool_attrs(*args, storage_order), want.shape, "int64")
        same(got, want)
    if storage_order == 0:  # the unpadded case against torch, which counts per (n, c) plane
        _, where = F.max_pool3d(tt(y), (2, 2, 2), (2, 2, 1), return_indices=True)
        want = argmax_pool_loop(y, (2, 2, 2), (2, 2, 1), (0,) * 6, (1, 1, 1), 0)
        same(where.numpy() + np.array([0, 60]).reshape(1, 2, 1, 1, 1), want)


def test_argmax_pool_of_integers():
    x = np.random.default_rng(45).integers(-100, 100, (1, 2, 5, 5)).astype(np.int8)
    attrs = pool_attrs((2, 2), (2, 2), (1, 1, 0, 0), (1, 1))
    want = argmax_pool_loop(x, (2, 2), (2, 2), (1, 1, 0, 0), (1, 1), 0)
    got, _ = execute("argmax_pool", [x], attrs, want.shape, "int64")
    same(got, want)


# --------------------------------------------------------------------------- movement


@pytest.mark.parametrize(
    ("shape", "axes"),
    [((3, 7, 5), [0]), ((3, 7, 5), [1, 2]), ((3, 7, 5), [0, 1, 2]), ((9,), [0]), ((5, 11), [1]),
     ((2, 3, 4, 9), [0, 2])],
)  # fmt: skip
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_reverse(shape, axes, dtype):
    x = (np.random.default_rng(46).standard_normal(shape) * 10).astype(dtype)
    got, plan = execute("reverse", [x], {"axes": axes}, shape, dtype, rect=(2, 1, 3, 6))
    same(got, torch.flip(tt(x), axes).numpy())
    assert plan.cost.traffic.wavelet_hops > 0


@pytest.mark.parametrize(
    ("shape", "repeats"),
    [((3, 5), (2, 3)), ((2, 3, 4), (1, 2, 1)), ((7,), (3,)), ((1, 1), (4, 5)),
     ((2, 1, 3), (3, 1, 2)), ((4, 6), (1, 1))],
)  # fmt: skip
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_tile(shape, repeats, dtype):
    x = (np.random.default_rng(47).standard_normal(shape) * 10).astype(dtype)
    want = torch.tile(tt(x), repeats).numpy()
    got, _ = execute("tile", [x], {"repeats": list(repeats)}, want.shape, dtype)
    same(got, want)


TORCH_PAD_MODE = {"reflect": "reflect", "edge": "replicate", "wrap": "circular"}


def torch_pad(x: np.ndarray, low, high, mode: str) -> np.ndarray:
    """F.pad in ``mode`` on every axis: the array as one channel of one sample."""
    flat = [p for lo, hi in zip(reversed(low), reversed(high), strict=True) for p in (lo, hi)]
    t = tt(x).reshape(1, 1, *x.shape)
    return (
        F.pad(t, flat, mode=TORCH_PAD_MODE[mode])
        .reshape([d + lo + hi for d, lo, hi in zip(x.shape, low, high, strict=True)])
        .numpy()
    )


PADS = [
    ((9,), (3,), (2,)),
    ((5, 6), (1, 2), (3, 0)),
    ((5, 6), (4, 5), (4, 5)),
    ((3, 7, 5), (0, 2, 1), (2, 1, 3)),
]


@pytest.mark.parametrize(("shape", "low", "high"), PADS)
@pytest.mark.parametrize("mode", sorted(TORCH_PAD_MODE))
@pytest.mark.parametrize("rect", RECTS)
def test_pad_modes(shape, low, high, mode, rect):
    x = np.random.default_rng(48).standard_normal(shape).astype(np.float32)
    want = torch_pad(x, low, high, mode)
    attrs = {"low": list(low), "high": list(high), "value": 7.0, "mode": mode}
    got, plan = execute("pad", [x], attrs, want.shape, "float32", rect=rect)
    same(got, want)
    assert 7.0 not in got  # the constant is for mode "constant" only
    assert plan.cost.traffic.wavelet_hops > 0


def test_pad_modes_of_integers():
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    for mode in TORCH_PAD_MODE:
        want = torch_pad(x.astype(np.float64), (2, 1), (1, 3), mode).astype(np.int64)
        attrs = {"low": [2, 1], "high": [1, 3], "value": 0.0, "mode": mode}
        got, _ = execute("pad", [x], attrs, want.shape, "int64")
        same(got, want)


# --------------------------------------------------------------------------- cost sanity


def _indexed_case(name: str):
    """Shapes and attributes of each indexed kernel: ``(operand shapes and dtypes, attrs,
    result shape)``."""
    f, i = "float32", "int64"
    return {
        "gather": ([((16, 12), f), ((10,), i)], {"axis": 0}, (10, 12)),
        "gather_elements": ([((16, 12), f), ((16, 12), i)], {"axis": 1}, (16, 12)),
        "gather_nd": ([((16, 12), f), ((20, 2), i)], {"batch_dims": 0}, (20,)),
        "scatter_elements": (
            [((16, 12), f), ((8, 12), i), ((8, 12), f)], {"axis": 0, "reduction": "add"},
            (16, 12),
        ),
        "scatter_nd": ([((16, 12), f), ((6, 1), i), ((6, 12), f)], {"reduction": "none"},
                       (16, 12)),
    }[name]  # fmt: skip


INDEXED = ("gather", "gather_elements", "gather_nd", "scatter_elements", "scatter_nd")


@pytest.mark.parametrize("name", INDEXED)
def test_indexed_traffic_spans_pes_or_not(name):
    operands, attrs, out_shape = _indexed_case(name)
    # several PEs: the operands where the kernel runs, or on another rectangle
    for where in (RECT, OTHER):
        ops = [Operand(s, d, WAFER, Layout.on(s, d, where)) for s, d in operands]
        plan = plans.plan(name, T, RECT, ops, attrs, [(out_shape, "float32")])
        assert plan.outputs[0].pes > 1
        assert plan.cost.traffic.wavelet_hops > 0, where
        assert plan.cost.cycles > 0
    # one PE for everything: no traffic at all
    one = (3, 2, 1, 1)
    ops = [Operand(s, d, WAFER, Layout.on(s, d, one)) for s, d in operands]
    plan = plans.plan(name, T, one, ops, attrs, [(out_shape, "float32")])
    assert plan.outputs[0].pes == 1
    assert plan.cost.traffic == NO_TRAFFIC
    assert plan.cost.cycles > 0  # the local work remains


@pytest.mark.parametrize("name", INDEXED)
def test_indexed_cost_does_not_depend_on_where_the_rectangle_is(name):
    operands, attrs, out_shape = _indexed_case(name)
    costs = []
    for rect in (RECT, (4, 4, 4, 4)):
        ops = [Operand(s, d, WAFER, Layout.on(s, d, rect)) for s, d in operands]
        costs.append(plans.plan(name, T, rect, ops, attrs, [(out_shape, "float32")]).cost)
    assert costs[0].traffic == costs[1].traffic
    assert costs[0].cycles == costs[1].cycles


@pytest.mark.parametrize(
    ("shape", "rect"),
    [((3, 16, 12), RECT), ((3, 16, 12), (0, 0, 8, 2)), ((20,), RECT),
     ((2, 5, 9, 30), (1, 2, 5, 7))],
)  # fmt: skip
def test_scan_chain_runs_along_the_scanned_axis_only(shape, rect):
    rank = len(shape)
    out = Layout.on(shape, "float32", rect)
    for axis in range(rank):
        op = Operand(shape, "float32", WAFER, out)
        attrs = {"axis": axis, "exclusive": False, "reverse": False}
        plan = plans.plan("cumsum", T, rect, [op], attrs, [(shape, "float32")])
        assert plan.inputs == plan.outputs == (out,)
        extent = out.h if axis == rank - 2 else out.w if axis == rank - 1 else 1
        traffic = plan.cost.traffic
        if extent == 1:  # a batch axis, or one held whole by every PE
            assert traffic == NO_TRAFFIC, axis
        else:
            assert traffic.max_hops == extent - 1, axis
            assert traffic.wavelet_hops > 0
    if shape == (3, 16, 12) and rect == RECT:
        assert (out.h, out.w) == (4, 4)


def test_scan_counts_the_ingress_of_a_streamed_operand():
    shape = (16, 12)
    out = Layout.on(shape, "float32", RECT)
    attrs = {"axis": 0, "exclusive": False, "reverse": False}
    resident = plans.plan(
        "cumsum", T, RECT, [Operand(shape, "float32", RESIDENT)], attrs, [(shape, "float32")]
    )
    streamed = plans.plan(
        "cumsum", T, RECT, [Operand(shape, "float32", STREAM)], attrs, [(shape, "float32")]
    )
    ingress = edge_traffic(out, inbound=True)
    assert streamed.cost.traffic == resident.cost.traffic + ingress


def test_scan_from_another_layout_counts_the_move():
    shape = (16, 12)
    here = Operand(shape, "float32", WAFER, Layout.on(shape, "float32", RECT))
    there = Operand(shape, "float32", WAFER, Layout.on(shape, "float32", OTHER))
    attrs = {"axis": 0, "exclusive": True, "reverse": False}
    near = plans.plan("cumsum", T, RECT, [here], attrs, [(shape, "float32")]).cost
    far = plans.plan("cumsum", T, RECT, [there], attrs, [(shape, "float32")]).cost
    assert far.traffic.wavelet_hops > near.traffic.wavelet_hops > 0
    assert far.cycles > near.cycles


@pytest.mark.parametrize(
    ("shape", "axis", "k"), [((16, 12), 1, 5), ((16, 12), 0, 16), ((3, 9), 0, 2), ((4, 5, 6), 0, 1)]
)
@pytest.mark.parametrize("dtype", ["float32", "int32", "float16"])
def test_topk_plan_has_two_outputs(shape, axis, k, dtype):
    out_shape = tuple(k if i == axis else d for i, d in enumerate(shape))
    src = Layout.on(shape, dtype, OTHER)
    results = [(out_shape, dtype), (out_shape, "int64")]
    plan = plans.plan("topk", T, RECT, [Operand(shape, dtype, WAFER, src)],
                        {"axis": axis, "largest": True}, results)  # fmt: skip
    assert plan.inputs == (src,)
    values, indices = plan.outputs
    assert (values.shape, values.dtype) == (out_shape, dtype)
    assert (indices.shape, indices.dtype) == (out_shape, "int64")
    assert values.rect == indices.rect
    assert plan.cost.cycles > 0


COVERED = {
    *MATH, "not", "bitwise_not", "is_nan", "is_inf", *LOGIC, "reduce_prod", "argmax_pool",
    *INDEXED, "cumsum", "topk", "reverse", "tile", "bitcast", "cumprod",
}  # fmt: skip
"""The kernels this file tests (test_kernels.test_every_kernel_is_covered adds them)."""


# --------------------------------------------------------------------------- gaps: narrow casts,
# streamed operands, 64-bit top-k, empty results


def wrap4(values: np.ndarray, signed: bool) -> np.ndarray:
    """Truncated toward zero, then reduced to 4 bits (numpy astype semantics, as ONNX's
    reference Cast to INT4/UINT4)."""
    v = np.trunc(values.astype(np.float64)).astype(np.int64) & 15
    return v - 16 * (v >= 8) if signed else v


@pytest.mark.parametrize("target", ["int4", "uint4"])
@pytest.mark.parametrize("saturate", [True, False])
def test_cast_to_4_bit_integers_wraps(target, saturate):
    rng = np.random.default_rng(90)
    x = rng.uniform(-20, 20, (5, 9)).astype(np.float32)
    x.reshape(-1)[:6] = [7.0, 8.0, -8.0, -9.5, 15.9, 0.5]
    got, _ = execute("cast", [x], {"saturate": saturate}, x.shape, target, (2, 1, 3, 6))
    assert got.dtype == dtypes.dtype(target)
    same(got.astype(np.int64), wrap4(x, target == "int4"))
    ints = rng.integers(-40, 40, (4, 7)).astype(np.int32)
    got, _ = execute("cast", [ints], {"saturate": saturate}, ints.shape, target)
    same(got.astype(np.int64), wrap4(ints, target == "int4"))


@pytest.mark.parametrize("source", ["int4", "uint4"])
def test_cast_from_4_bit_integers(source):
    lo, hi = (-8, 8) if source == "int4" else (0, 16)
    x = np.random.default_rng(91).integers(lo, hi, (7, 9)).astype(dtypes.dtype(source))
    got, _ = execute("cast", [x], {"saturate": True}, x.shape, "float32", (2, 1, 3, 6))
    same(got, x.astype(np.int64).astype(np.float32))


@pytest.mark.parametrize("saturate", [True, False])
def test_cast_to_float4_clamps_to_six(saturate):
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # every float4_e2m1fn value: exact
    beyond = [7.0, 100.0, 1e30] + ([np.inf] if saturate else [])
    x = np.array([grid + [-v for v in grid[1:]] + beyond + [-v for v in beyond]], np.float32)
    got, _ = execute("cast", [x], {"saturate": saturate}, x.shape, "float4_e2m1fn", (2, 1, 3, 6))
    same(got.astype(np.float32), np.clip(x, -6, 6))


STREAMED = {
    "gather": ([(13, 16), (6,)], {"axis": 0}, [((6, 16), "float32")]),
    "reduce_prod": ([(13, 16)], {"axes": [0], "keepdims": False}, [((16,), "float32")]),
    "reverse": ([(13, 16)], {"axes": [0]}, [((13, 16), "float32")]),
    "topk": ([(13, 16)], {"axis": 1, "largest": True}, [((13, 3), "float32"), ((13, 3), "int64")]),
    "tile": ([(13, 16)], {"repeats": [1, 2]}, [((13, 32), "float32")]),
    "cumsum": ([(13, 16)], {"axis": 1, "exclusive": False, "reverse": False},
               [((13, 16), "float32")]),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(STREAMED))
def test_a_streamed_weight_pays_for_its_way_in(name):
    shapes, attrs, results = STREAMED[name]
    extra = [Operand(s, "int64", WAFER, Layout.on(s, "int64", RECT)) for s in shapes[1:]]

    def cost(source):
        first = Operand(shapes[0], "float32", source)
        return plans.plan(name, T, RECT, [first, *extra], attrs, results).cost

    resident, streamed = cost(RESIDENT), cost(STREAM)
    assert streamed.traffic.wavelet_hops > resident.traffic.wavelet_hops
    assert streamed.cycles > resident.cycles


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_orders_64_bit_integers_beyond_float64_precision(dtype, largest):
    base = 2**62 if dtype == "int64" else 2**63  # float64 spacing there: 1024 and 2048
    x = np.array([[base + d for d in (2, 5, 0, 4, 1, 3)]], dtype=dtype)
    order = sorted(range(6), key=lambda i: -int(x[0, i]) if largest else int(x[0, i]))[:3]
    results = [((1, 3), dtype), ((1, 3), "int64")]
    (got_v, got_i), _ = execute_all("topk", [x], {"axis": 1, "largest": largest}, results)
    same(got_i, np.array([order], dtype=np.int64))
    same(got_v, x[:, order])


@pytest.mark.parametrize(
    ("name", "shape", "attrs", "out_shape"),
    [("tile", (3, 4), {"repeats": [0, 1]}, (0, 4)), ("reverse", (0, 4), {"axes": [0]}, (0, 4))],
)
def test_movement_to_an_empty_result(name, shape, attrs, out_shape):
    got, _ = execute(name, [np.zeros(shape, np.float32)], attrs, out_shape, "float32")
    assert got.shape == out_shape


@pytest.mark.parametrize(
    ("source", "target"),
    [("float32", "int32"), ("int32", "float32"), ("float64", "uint64"), ("float16", "bfloat16"),
     ("int8", "float8_e4m3fn"), ("bool", "uint8")],
)  # fmt: skip
def test_bitcast_reinterprets_the_bits(source, target):
    rng = np.random.default_rng(4)
    bits = rng.integers(0, 256, (3, 5, 8 * np.dtype(np.int64).itemsize), dtype=np.uint8)
    width = dtypes.dtype(source).itemsize
    x = bits[..., :width].copy().view(dtypes.dtype(source))[..., 0]
    if source == "bool":
        x = x.view(np.uint8) % 2 == 1
    got, plan = execute("bitcast", [x], {}, x.shape, target, rect=(1, 0, 3, 2))
    assert got.tobytes() == x.tobytes()
    assert plan.cost.flops == 0


def test_integer_pow_with_negative_exponents_truncates():
    base = np.array([[2, -1, 1, -1, 3, 5]], dtype=np.int32)
    exponent = np.array([[-1, -1, -2, -2, 2, 0]], dtype=np.int32)
    got, _ = execute("pow", [base, exponent], {}, base.shape, "int32")
    same(got, np.array([[0, -1, 1, 1, 9, 1]], dtype=np.int32))
