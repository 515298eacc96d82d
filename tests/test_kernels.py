"""Unit tests of cgc.runtime.kernels: every mesh kernel against numpy / torch, and cost sanity.

Operands are scattered into the layouts the plan asks for, with the padding of float tiles
poisoned with NaN, so a kernel that lets padding leak into a result fails.
"""

from __future__ import annotations

import itertools
import math
from math import prod

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cgc.machine import plans
from cgc.machine.hardware.target import TRANSCENDENTAL_CYCLES, Target
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic
from cgc.machine.plans import RESIDENT, STREAM, WAFER, Operand, PlanRequest
from cgc.machine.plans.matmul import Matmul
from cgc.runtime import kernels
from cgc.runtime.tiles import DistTensor

T = Target("t", 8, 8, 48 * 1024, 850e6)
RECT = (0, 0, 4, 4)
OTHER = (1, 2, 3, 5)
"""Where wafer operands live by default: not where the kernels put their results."""
RTOL, ATOL = 1e-4, 1e-5


def poisoned(array: np.ndarray, layout: Layout) -> DistTensor:
    dist = DistTensor.scatter(array, layout)
    pad = ~np.broadcast_to(layout.valid_mask(), layout.tile_shape())
    if pad.any():
        tiles = dist.tiles.copy()
        if tiles.dtype.kind == "f":
            tiles[pad] = np.nan
        elif tiles.dtype.kind in "iu":
            tiles[pad] = 77
        dist = DistTensor(layout, tiles)
    return dist


def execute(name, args, attrs, out_shape, out_dtype, rect=RECT, sources=None, layouts=None):
    """Plans and runs kernel ``name``; returns the logical result and the plan."""
    sources, layouts = sources or {}, layouts or {}
    operands = []
    for k, a in enumerate(args):
        source = sources.get(k, WAFER)
        layout = None
        if source == WAFER:
            layout = layouts.get(k) or Layout.on(a.shape, a.dtype.name, OTHER)
        operands.append(Operand(tuple(a.shape), a.dtype.name, source, layout))
    plan = plans.plan(name, T, rect, operands, attrs, [(tuple(out_shape), out_dtype)])
    assert len(plan.inputs) == len(args)
    for k, want in enumerate(plan.inputs):
        if want is not None:
            assert want.shape == tuple(args[k].shape)
    values = [
        a if want is None else poisoned(a, want) for a, want in zip(args, plan.inputs, strict=True)
    ]
    with np.errstate(all="ignore"):  # as the VM runs kernels: padding may hold NaN
        outs = kernels.run(name, plan, values, attrs)
    assert [o.layout for o in outs] == list(plan.outputs)
    assert outs[0].tiles.shape == plan.outputs[0].tile_shape()
    assert outs[0].tiles.dtype == np.dtype(out_dtype)
    result = outs[0].gather()
    assert result.shape == tuple(out_shape)
    return result, plan


def close(got, want, rtol=RTOL, atol=ATOL):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# --------------------------------------------------------------------------- elementwise


def _erf(x):
    return np.vectorize(math.erf)(x.astype(np.float64))


UNARY = {
    "neg": lambda x: -x,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "reciprocal": lambda x: 1.0 / x,
    "abs": np.abs,
    "relu": lambda x: np.where(x > 0, x, 0.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "erf": _erf,
}
POSITIVE = {"log", "sqrt", "reciprocal"}
SHAPES = [(), (7,), (5, 9), (3, 7, 5), (2, 3, 5, 9)]


def test_every_kernel_is_covered():
    from test_kernels_extended import COVERED

    covered = COVERED | {
        *UNARY, *BINARY, "select", "cast", "reduce_sum", "reduce_mean", "reduce_max",
        "reduce_min", "matmul", "reshape", "transpose", "broadcast_to", "concat", "slice", "pad",
        "im2col", "col2im", "one_hot", "max_pool", "avg_pool",
        "attention", "attention_grad", "rotary", "cached_attention",  # tests/test_attention.py
        "matmul_transpose_a",
        "fused_matmul",  # tests/test_fuse_epilogues.py
    }  # fmt: skip
    assert set(plans.KERNELS) == covered


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rect", [RECT, (2, 1, 3, 6)])
def test_unary(name, shape, rect):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape) * 2
    if name in POSITIVE:
        x = np.abs(x) + 0.1
    x = x.astype(np.float32)
    got, _ = execute(name, [x], {}, shape, "float32", rect=rect)
    close(got, np.asarray(UNARY[name](x.astype(np.float64))).astype(np.float32))


@pytest.mark.parametrize("name", ["exp", "tanh", "neg", "relu"])
def test_unary_float16(name):
    x = np.random.default_rng(2).standard_normal((6, 11)).astype(np.float16)
    got, _ = execute(name, [x], {}, x.shape, "float16")
    want = np.asarray(UNARY[name](x.astype(np.float64))).astype(np.float16)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)


BINARY = {
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
BROADCASTS = [
    ((3, 7, 5), (3, 7, 5)),
    ((3, 7, 5), (5,)),
    ((3, 7, 5), (7, 1)),
    ((3, 1, 5), (1, 7, 1)),
    ((5,), (3, 7, 5)),
    ((), (4, 6)),
    ((2, 1, 6, 9), (3, 1, 9)),
    ((9, 1), (1, 10)),
]


def binary_args(name, sa, sb, dtype, seed=3):
    rng = np.random.default_rng(seed)
    if name in ("greater", "equal"):  # small integers so that ties happen
        a, b = rng.integers(-2, 3, sa), rng.integers(-2, 3, sb)
    elif name == "pow":
        a, b = rng.uniform(0.5, 2.0, sa), rng.uniform(-2, 2, sb)
    elif name == "div":
        a = rng.standard_normal(sa) * 3
        b = (rng.uniform(0.5, 3.0, sb) * rng.choice([-1, 1], sb)).astype(np.float64)
    else:
        a, b = rng.standard_normal(sa) * 3, rng.standard_normal(sb) * 3
    if np.dtype(dtype).kind in "iu":
        a, b = np.round(a), np.round(b)
    return np.asarray(a).astype(dtype), np.asarray(b).astype(dtype)


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize(("sa", "sb"), BROADCASTS)
def test_binary_broadcasting(name, sa, sb):
    a, b = binary_args(name, sa, sb, "float32")
    want = BINARY[name](a.astype(np.float64), b.astype(np.float64))
    out_dtype = "bool" if name in ("greater", "equal") else "float32"
    got, _ = execute(name, [a, b], {}, want.shape, out_dtype)
    if out_dtype == "bool":
        np.testing.assert_array_equal(got, want)
        assert want.any() and not want.all()
    else:
        close(got, want.astype(np.float32))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "max", "min", "greater", "equal"])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_binary_integers(name, dtype):
    a, b = binary_args(name, (4, 9), (9,), dtype)
    want = BINARY[name](a, b)
    got, _ = execute(name, [a, b], {}, want.shape, want.dtype.name)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["add", "mul", "max"])
def test_binary_float16(name):
    a, b = binary_args(name, (5, 9), (5, 1), "float16")
    want = BINARY[name](a, b)
    got, _ = execute(name, [a, b], {}, want.shape, "float16")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("source", [RESIDENT, WAFER, STREAM])
def test_binary_with_resident_bias(source):
    a, b = binary_args("add", (6, 10), (10,), "float32")
    layouts = {1: Layout.on((10,), "float32", RECT)} if source == WAFER else {}
    got, plan = execute("add", [a, b], {}, (6, 10), "float32", sources={1: source}, layouts=layouts)
    close(got, a + b)
    assert plan.inputs[1].h == 1


def test_select():
    rng = np.random.default_rng(4)
    cond = rng.random((3, 1, 5)) < 0.5
    a = rng.standard_normal((3, 7, 5)).astype(np.float32)
    b = rng.standard_normal((5,)).astype(np.float32)
    got, _ = execute("select", [cond, a, b], {}, (3, 7, 5), "float32")
    np.testing.assert_array_equal(got, np.where(cond, a, b))


@pytest.mark.parametrize(
    ("src", "dst"),
    [("float32", "int32"), ("float32", "float16"), ("int64", "float32"), ("bool", "float32")],
)
def test_cast(src, dst):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 7)) * 5).astype(src) if src != "bool" else rng.random((4, 7)) > 0.5
    got, plan = execute("cast", [x], {}, x.shape, dst)
    np.testing.assert_array_equal(got, x.astype(dst))
    assert plan.cost.flops == 0


def test_aligned_elementwise_moves_nothing_and_broadcast_operands_are_multicast():
    shape = (16, 12)
    out = Layout.on(shape, "float32", RECT)
    assert out.h == 4
    aligned = Operand(shape, "float32", WAFER, out)
    alone = plans.plan("add", T, RECT, [aligned, aligned], {}, [(shape, "float32")])
    assert alone.cost.traffic == NO_TRAFFIC
    assert alone.cost.scratch_bytes == 0
    assert alone.inputs == (out, out)

    bias = Operand((12,), "float32", RESIDENT)
    plan = plans.plan("add", T, RECT, [aligned, bias], {}, [(shape, "float32")])
    assert plan.cost.traffic.max_hops == out.h - 1
    assert plan.cost.traffic.wavelet_hops > 0
    assert plan.cost.cycles > alone.cost.cycles

    # a scalar computed on the wafer is multicast over the whole grid; a constant scalar is
    # an immediate of every PE's code, and moves nothing
    computed = Operand((), "float32", WAFER, Layout.on((), "float32", RECT))
    plan = plans.plan("add", T, RECT, [aligned, computed], {}, [(shape, "float32")])
    assert plan.cost.traffic.max_hops == (out.h - 1) + (out.w - 1)
    constant = Operand((), "float32", RESIDENT)
    plan = plans.plan("add", T, RECT, [aligned, constant], {}, [(shape, "float32")])
    assert plan.cost.traffic == NO_TRAFFIC
    assert plan.cost.cycles == alone.cost.cycles


@pytest.mark.parametrize(
    ("name", "dtype", "per_element"),
    [("add", "float32", 1), ("exp", "float32", TRANSCENDENTAL_CYCLES), ("add", "float16", 1 / 4)],
)
def test_elementwise_vector_cycles(name, dtype, per_element):
    shape = (16, 16)
    lay = Layout.on(shape, dtype, RECT)
    ops = [Operand(shape, dtype, WAFER, lay)] * (2 if name == "add" else 1)
    plan = plans.plan(name, T, RECT, ops, {}, [(shape, dtype)])
    assert plan.cost.cycles == pytest.approx(16 * per_element)  # 4 x 4 elements per PE
    assert plan.cost.flops == 256


def test_elementwise_from_another_layout_counts_the_move():
    shape = (16, 12)
    there = Operand(shape, "float32", WAFER, Layout.on(shape, "float32", OTHER))
    plan = plans.plan("relu", T, RECT, [there], {}, [(shape, "float32")])
    assert plan.cost.traffic.wavelet_hops > 0
    assert plan.cost.scratch_bytes > 0


# --------------------------------------------------------------------------- reductions

REDUCE = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max, "reduce_min": np.min}
AXES3 = [c for r in (1, 2, 3) for c in itertools.combinations(range(3), r)]
SRC3 = Layout.on((3, 7, 5), "float32", (1, 1, 3, 2))  # 2 x 3 grid, padded rows and columns


@pytest.mark.parametrize("name", sorted(REDUCE))
@pytest.mark.parametrize("axes", AXES3)
@pytest.mark.parametrize("keepdims", [True, False])
def test_reduce_rank3_every_axis_combination(name, axes, keepdims):
    assert SRC3.rows % SRC3.rt and SRC3.cols % SRC3.ct  # there is padding
    x = (np.random.default_rng(6).standard_normal((3, 7, 5)) - 4).astype(np.float32)
    want = REDUCE[name](x.astype(np.float64), axis=axes, keepdims=keepdims).astype(np.float32)
    attrs = {"axes": list(axes), "keepdims": keepdims}
    got, _ = execute(name, [x], attrs, want.shape, "float32", layouts={0: SRC3})
    close(got, want)


@pytest.mark.parametrize(
    ("shape", "axes"),
    [((9,), (0,)), ((6, 11), (0,)), ((6, 11), (1,)), ((6, 11), (0, 1)), ((2, 3, 9, 5), (1, 3))],
)
@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reduce_other_ranks(shape, axes, name):
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32) + 3
    want = REDUCE[name](x.astype(np.float64), axis=axes, keepdims=False).astype(np.float32)
    got, _ = execute(name, [x], {"axes": list(axes), "keepdims": False}, want.shape, "float32")
    close(got, want)


def test_reduce_sum_int32():
    x = np.random.default_rng(8).integers(-50, 50, (3, 7, 5)).astype(np.int32)
    got, _ = execute(
        "reduce_sum", [x], {"axes": [1, 2], "keepdims": False}, (3,), "int32", layouts={0: SRC3}
    )
    np.testing.assert_array_equal(got, x.sum(axis=(1, 2)))


@pytest.mark.parametrize("name", ["reduce_max", "reduce_min"])
def test_reduce_max_min_int32_with_padding(name):
    x = np.random.default_rng(8).integers(-50, 50, (3, 7, 5)).astype(np.int32)
    lay = Layout.on(x.shape, "int32", (1, 1, 3, 2))
    got, _ = execute(
        name, [x], {"axes": [1, 2], "keepdims": False}, (3,), "int32", layouts={0: lay}
    )
    np.testing.assert_array_equal(got, REDUCE[name](x, axis=(1, 2)))


def test_reduce_chain_traffic_only_when_reducing_split_axes():
    x = Operand((3, 7, 5), "float32", WAFER, SRC3)
    batch_only = plans.plan(
        "reduce_sum", T, SRC3.rect, [x], {"axes": [0], "keepdims": True}, [((1, 7, 5), "float32")]
    )
    assert batch_only.cost.traffic == NO_TRAFFIC
    over_cols = plans.plan(
        "reduce_sum", T, SRC3.rect, [x], {"axes": [2], "keepdims": True}, [((3, 7, 1), "float32")]
    )
    # each PE's partial sums (3 matrices x 4 of the 7 rows, 12 words) meet at the middle of
    # the 3 columns, one hop from either end, and the result stays on that column
    assert SRC3.w == 3 and SRC3.h == 2
    assert over_cols.cost.traffic == Traffic(12 * 2 * 2, 12, 12, 2 * 12, 1)
    (out,) = over_cols.outputs
    assert (out.col0, out.w) == (SRC3.col0 + 1, 1)


def test_a_reduction_result_is_multicast_from_the_middle_where_it_lies():
    # x - mean(x) over 7 columns: the mean stays on the middle column and the subtraction
    # multicasts it from there, 3 hops each way, without first moving it to the corner
    rect = (0, 0, 7, 2)
    x = Operand((4, 14), "float32", WAFER, Layout.on((4, 14), "float32", rect))
    mean = plans.plan(
        "reduce_mean", T, rect, [x], {"axes": [1], "keepdims": True}, [((4, 1), "float32")]
    )
    (at,) = mean.outputs
    assert (at.col0, at.w, at.h) == (3, 1, 2)
    centred = Operand((4, 1), "float32", WAFER, at)
    sub = plans.plan("sub", T, rect, [x, centred], {}, [((4, 14), "float32")])
    # 2 rows of the mean a PE, along the 6 links of each of the 2 PE rows
    assert sub.cost.traffic == Traffic(2 * 6 * 2, 2, 2, 2, 3)
    assert sub.cost.arrival_cycles == 0


# --------------------------------------------------------------------------- matmul


def matmul_ref(a, b):
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)


MATMULS = [
    ((5, 7), (7, 3)),
    ((3, 20), (20, 17)),
    ((2, 1, 5, 7), (3, 7, 4)),
    ((6, 5), (2, 5, 3)),
    ((4, 9, 6), (6, 10)),
    ((1, 1), (1, 1)),
    ((13, 1), (1, 9)),
]


@pytest.mark.parametrize(("sa", "sb"), MATMULS)
@pytest.mark.parametrize("b_source", [WAFER, RESIDENT])
@pytest.mark.parametrize("rect", [RECT, (2, 1, 5, 3), (0, 0, 1, 1), (0, 0, 8, 8)])
def test_summa(sa, sb, b_source, rect):
    rng = np.random.default_rng(9)
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    want = matmul_ref(a, b)
    got, plan = execute("matmul", [a, b], {}, want.shape, "float32", rect, {1: b_source})
    close(got, want)
    assert plan.detail["algorithm"] in ("summa", "summa-split-k", "meshgemm", "stream-resident")
    assert plan.cost.flops == 2 * prod(want.shape) * sa[-1]


def test_summa_against_a_hand_count():
    """A [8, 64] @ B [64, 8] on 8 x 8 PEs: 8 steps of one 1 x 8 block of A and one 8 x 1 of B
    per PE (8 FMACs, but 16 wavelets through the ramp), taken 6 at a time (24 colors, four a
    root), so the broadcast's 7 hops of flight are paid twice. The matmul plan takes the
    streaming kernel on the resident B instead: it pays the flight once."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((8, 64)).astype(np.float32)
    b = rng.standard_normal((64, 8)).astype(np.float32)
    rect = (0, 0, 8, 8)
    arrived = {0: Layout.on(a.shape, "float32", rect)}
    got, plan = execute("matmul", [a, b], {}, (8, 8), "float32", rect, {1: RESIDENT}, arrived)
    close(got, matmul_ref(a, b))
    assert plan.detail == {
        "algorithm": "stream-resident",
        "steps": 8,
        "binds": "the weights through the ramp",
    }
    operands = (
        Operand(a.shape, "float32", WAFER, arrived[0]),
        Operand(b.shape, "float32", RESIDENT),
    )
    q = PlanRequest(T, rect, operands, {}, (((8, 8), "float32"),))
    summa = Matmul._plan_summa(q, *operands, Layout.on((8, 8), "float32", rect), 2.0 * 8 * 64 * 8)
    assert summa.detail == {
        "algorithm": "summa",
        "steps": 8,
        "binds": "the blocks through the ramp",
    }
    assert summa.cost.cycles == 8 * max(8, 8 + 8) + 2 * 7 > plan.cost.cycles
    assert summa.cost.scratch_bytes == 2 * 6 * (8 + 8) * 4


def test_split_k_against_a_hand_count():
    """A [2, 64] @ B [64, 4] on 2 columns x 16 rows: the result's 2 rows leave 8 groups of
    2 rows; B's 64 rows spread 4 a PE row over all 16, so each group runs 2 SUMMA steps."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 64)).astype(np.float32)
    b = rng.standard_normal((64, 4)).astype(np.float32)
    rect = (0, 0, 2, 16)
    arrived = {0: Layout.on(a.shape, "float32", rect)}
    got, plan = execute("matmul", [a, b], {}, (2, 4), "float32", rect, {1: RESIDENT}, arrived)
    close(got, matmul_ref(a, b))
    assert plan.detail == {"algorithm": "summa-split-k", "steps": 2, "groups": 8}
    a_at, b_at = plan.inputs
    assert (a_at.h, a_at.w, a_at.ct) == (2, 2, 32)  # A stays where it arrives
    assert (b_at.h, b_at.w, b_at.rt) == (16, 2, 4)
    # per step a PE multiplies 1 x 4 by 4 x 2 (8 FMACs) while A's 1 x 4 block and B's 4 x 2
    # block come in through its ramp (12 wavelets) from roots 1 hop away; each column's A (2
    # rows x 32 values) descends past 7 groups of 2 rows, overlapping the groups' 2 steps; the
    # 1 x 2 partials climb back, 2 PE rows a boundary, and 7 additions of 2 values
    descent, group, hops = 2 * 32, 2 * (max(8, 4 + 8) + 1), 7 * 2
    assert plan.cost.cycles == max(descent, group) + hops + max(2 * 2, 7 * 2) + hops
    assert plan.cost.compute_cycles == 2 * 8
    assert plan.cost.fmacs == 2 * 8 * 16 * 2
    summa = plans.plan(
        "matmul",
        T,
        rect,
        [Operand(a.shape, "float32", WAFER, a_at), Operand(b.shape, "float32", RESIDENT)],
        {},
        [((2, 4), "float32")],
    )
    assert summa.cost.cycles < 2 * 64 + 2  # cheaper than SUMMA's 2 steps of 1 x 32 x 2


def test_summa_float16():
    rng = np.random.default_rng(10)
    a = rng.standard_normal((6, 12)).astype(np.float16)
    b = rng.standard_normal((12, 5)).astype(np.float16)
    got, _ = execute("matmul", [a, b], {}, (6, 5), "float16")
    np.testing.assert_allclose(
        got.astype(np.float64), a.astype(np.float64) @ b, rtol=2e-2, atol=2e-2
    )


@pytest.mark.parametrize(
    ("sa", "sb"),
    [
        ((4, 9, 6), (6, 10)),
        ((9, 20), (20, 13)),
        ((2, 5, 6), (2, 6, 7)),
        ((3, 1), (1, 4)),
        ((5, 7), (7, 9)),  # K = 7 over 4 columns: padded blocks of A
    ],
)
@pytest.mark.parametrize("rect", [RECT, (1, 1, 5, 7), (0, 0, 1, 1)])
def test_streaming_matmul(sa, sb, rect):
    rng = np.random.default_rng(11)
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    want = matmul_ref(a, b)
    got, plan = execute("matmul", [a, b], {}, want.shape, "float32", rect, {1: STREAM})
    close(got, want)
    assert plan.detail["algorithm"] == "stream"
    assert plan.inputs[1] is None
    assert plan.cost.traffic.wavelet_hops > 0  # the weights come in through the edge


@pytest.mark.parametrize(
    ("sa", "sb"),
    [((7, 5), (7, 3)), ((20, 3), (20, 17)), ((2, 9, 4), (2, 9, 6)), ((3, 8, 5), (8, 2)),
     ((1, 1), (1, 1)), ((13, 4), (13, 1))],
)  # fmt: skip
@pytest.mark.parametrize("rect", [RECT, (2, 1, 5, 3), (0, 0, 1, 1)])
def test_matmul_transpose_a(sa, sb, rect):
    """The weight gradient's product: ``a^T @ b`` reduced over the rows both share."""
    rng = np.random.default_rng(12)
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    want = matmul_ref(np.swapaxes(a, -1, -2), b)
    got, plan = execute("matmul_transpose_a", [a, b], {}, want.shape, "float32", rect)
    close(got, want)
    assert plan.detail == {"algorithm": "row-reduce", "steps": sa[-1]}
    assert plan.cost.flops == 2 * prod(want.shape) * sa[-2]
    a_at, b_at = plan.inputs
    assert (a_at.row0, a_at.h, a_at.rt) == (b_at.row0, b_at.h, b_at.rt)  # rows aligned


def test_a_weight_gradient_needs_no_transpose_and_beats_summa():
    """On the wafer, ``x^T @ dy`` of a layer of 24576 tokens takes fewer cycles reduced
    along the rows than a transpose of ``x`` and SUMMA."""
    wse2 = Target("wse2-like", 994, 750, 48 * 1024, 850e6)
    x = Operand((24576, 3072), "float16", WAFER, Layout.on((24576, 3072), "float16", wse2.whole))
    dy = Operand((24576, 768), "float16", WAFER, Layout.on((24576, 768), "float16", wse2.whole))
    reduced = plans.plan("matmul_transpose_a", wse2, wse2.whole, [x, dy], {},
                         [((3072, 768), "float16")]).cost  # fmt: skip
    xt = Layout.on((3072, 24576), "float16", wse2.whole)
    moved = plans.plan("transpose", wse2, wse2.whole, [x], {"perm": [1, 0]},
                       [((3072, 24576), "float16")]).cost  # fmt: skip
    summa = plans.plan("matmul", wse2, wse2.whole, [Operand(xt.shape, "float16", WAFER, xt), dy],
                       {}, [((3072, 768), "float16")]).cost  # fmt: skip
    assert reduced.flops == summa.flops
    assert reduced.cycles < summa.cycles + moved.cycles
    peak = wse2.pes * wse2.peak_flops_per_pe_per_cycle("float16")
    assert reduced.cycles >= reduced.flops / peak


@pytest.mark.parametrize("source", [RESIDENT, STREAM])
def test_matmul_cycles_grow_with_k(source):
    cycles = []
    for k in (4, 16, 64, 256):
        a = Operand((8, k), "float32", WAFER, Layout.on((8, k), "float32", RECT))
        b = Operand((k, 8), "float32", source)
        plan = plans.plan("matmul", T, RECT, [a, b], {}, [((8, 8), "float32")])
        cycles.append(plan.cost.cycles)
        assert plan.cost.flops == 2 * 8 * 8 * k
    assert cycles == sorted(cycles) and len(set(cycles)) == len(cycles), cycles


def test_plans_are_cached():
    a = Operand((8, 16), "float32", WAFER, Layout.on((8, 16), "float32", OTHER))
    b = Operand((16, 4), "float32", RESIDENT)
    first = plans.plan("matmul", T, RECT, [a, b], {}, [((8, 4), "float32")])
    again = plans.plan("matmul", T, list(RECT), (a, b), {}, [([8, 4], "float32")])
    assert again is first
    other = plans.plan("matmul", T, (0, 0, 2, 2), [a, b], {}, [((8, 4), "float32")])
    assert other is not first
    attrs = {"axes": [1], "keepdims": False}
    r1 = plans.plan("reduce_sum", T, RECT, [a], attrs, [((8,), "float32")])
    r2 = plans.plan("reduce_sum", T, RECT, [a], dict(attrs), [((8,), "float32")])
    assert r1 is r2


# --------------------------------------------------------------------------- data movement


def movement_case(name, shapes, attrs, want_fn, dtype="float32"):
    rng = np.random.default_rng(12)
    args = [(rng.standard_normal(s) * 10).astype(dtype) for s in shapes]
    want = want_fn(*args)
    got, plan = execute(name, args, attrs, want.shape, dtype)
    np.testing.assert_array_equal(got, want)
    return plan


@pytest.mark.parametrize(
    ("shape", "new"), [((3, 7, 5), (7, 15)), ((2, 3, 4), (24,)), ((6,), (2, 3, 1)), ((), (1, 1))]
)
def test_reshape(shape, new):
    movement_case("reshape", [shape], {}, lambda x: x.reshape(new))


@pytest.mark.parametrize(
    ("shape", "perm"), [((3, 7, 5), (2, 0, 1)), ((2, 3, 4, 5), (0, 2, 1, 3)), ((5, 9), (1, 0))]
)
@pytest.mark.parametrize("source", [WAFER, RESIDENT])
def test_transpose(shape, perm, source):
    x = np.arange(prod(shape), dtype=np.float32).reshape(shape)
    want = np.transpose(x, perm)
    got, _ = execute(
        "transpose", [x], {"perm": list(perm)}, want.shape, "float32", sources={0: source}
    )
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("shape", "new"), [((7, 1), (3, 7, 5)), ((5,), (4, 5)), ((), (2, 3))])
def test_broadcast_to(shape, new):
    movement_case("broadcast_to", [shape], {}, lambda x: np.broadcast_to(x, new).copy())


@pytest.mark.parametrize(
    ("shapes", "axis"), [([(3, 4), (3, 2), (3, 5)], 1), ([(2, 3, 4), (1, 3, 4)], 0), ([(2, 5)], 0)]
)
def test_concat(shapes, axis):
    plan = movement_case(
        "concat", shapes, {"axis": axis}, lambda *xs: np.concatenate(xs, axis=axis)
    )
    assert len(plan.inputs) == len(shapes)


@pytest.mark.parametrize(
    ("shape", "starts", "limits", "strides"),
    [((9, 10), (1, 2), (8, 9), (2, 3)), ((3, 7, 5), (0, 1, 4), (3, 7, 5), (1, 1, 1))],
)
def test_slice(shape, starts, limits, strides):
    attrs = {"starts": list(starts), "limits": list(limits), "strides": list(strides)}
    index = tuple(slice(a, b, s) for a, b, s in zip(starts, limits, strides, strict=True))
    movement_case("slice", [shape], attrs, lambda x: x[index])


@pytest.mark.parametrize(
    ("shape", "low", "high", "value"),
    [((3, 5), (1, 0), (2, 3), 1.5), ((2, 3, 4), (0, 1, 2), (1, 0, 0), 0.0)],
)
def test_pad(shape, low, high, value):
    attrs = {"low": list(low), "high": list(high), "value": value}
    movement_case(
        "pad",
        [shape],
        attrs,
        lambda x: np.pad(x, list(zip(low, high, strict=True)), constant_values=value),
    )


def test_one_hot_out_of_range_gives_zero_rows():
    idx = np.array([[0, 5, 6, 2, 9], [-1, 3, 1, 100, 4]], dtype=np.int64)
    got, _ = execute("one_hot", [idx], {}, (2, 5, 6), "float32")
    want = np.zeros((2, 5, 6), np.float32)
    for i, j in itertools.product(range(2), range(5)):
        if 0 <= idx[i, j] < 6:
            want[i, j, idx[i, j]] = 1
    np.testing.assert_array_equal(got, want)
    assert got[0, 2].sum() == 0 and got[1, 0].sum() == 0  # depth, and a negative index


def torch_im2col(x: torch.Tensor, kernel, strides, pads, dilations, group) -> torch.Tensor:
    """[group, N * L, C/group * K] from torch's unfold on an explicitly padded input
    (differentiable)."""
    top, left, bottom, right = pads
    padded = F.pad(x, (left, right, top, bottom))
    per = x.shape[1] // group
    cols = [
        F.unfold(padded[:, g * per : (g + 1) * per], kernel, dilations, 0, strides)  # [N, per*K, L]
        .transpose(1, 2).reshape(-1, per * int(np.prod(kernel)))
        for g in range(group)
    ]  # fmt: skip
    return torch.stack(cols)


def pool_attrs(kernel, strides, pads, dilations, **extra):
    """The attributes of a window kernel (pooling, im2col, col2im)."""
    return {
        "kernel": list(kernel),
        "strides": list(strides),
        "pads": list(pads),
        "dilations": list(dilations),
        **extra,
    }


WINDOWS = [
    ((2, 3, 6, 6), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 4, 7, 6), (3, 2), (2, 1), (1, 0, 2, 1), (1, 2), 2),
    ((1, 4, 5, 5), (2, 2), (1, 2), (0, 0, 0, 0), (2, 1), 4),
]
"""Images and grouped, strided, padded, dilated windows over them."""


@pytest.mark.parametrize(("shape", "kernel", "strides", "pads", "dilations", "group"), WINDOWS)
def test_im2col(shape, kernel, strides, pads, dilations, group):
    x = np.random.default_rng(13).standard_normal(shape).astype(np.float32)
    want = torch_im2col(torch.from_numpy(x), kernel, strides, pads, dilations, group).numpy()
    attrs = pool_attrs(kernel, strides, pads, dilations, group=group)
    got, plan = execute("im2col", [x], attrs, want.shape, "float32")
    np.testing.assert_array_equal(got, want)
    assert plan.cost.traffic.wavelet_hops > 0
    channels_last = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    attrs["channels_last"] = True
    got, _ = execute("im2col", [channels_last], attrs, want.shape, "float32")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("shape", "kernel", "strides", "pads", "dilations", "group"), WINDOWS)
def test_col2im_is_the_adjoint_of_im2col(shape, kernel, strides, pads, dilations, group):
    """col2im(g) is the gradient of sum(im2col(x) * g) with respect to x, from torch."""
    rng = np.random.default_rng(14)
    x = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    patches = torch_im2col(x, kernel, strides, pads, dilations, group)
    g = rng.standard_normal(tuple(patches.shape)).astype(np.float32)
    (patches * torch.from_numpy(g.astype(np.float64))).sum().backward()
    want = x.grad.numpy()
    attrs = pool_attrs(kernel, strides, pads, dilations, group=group)
    got, plan = execute("col2im", [g], attrs, shape, "float32")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert plan.cost.traffic.wavelet_hops > 0 and plan.cost.flops == g.size
    attrs["channels_last"] = True
    last = (shape[0], *shape[2:], shape[1])
    got, _ = execute("col2im", [g], attrs, last, "float32")
    np.testing.assert_allclose(got, np.moveaxis(want, 1, -1), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- pooling


@pytest.mark.parametrize(
    ("kernel", "strides", "pads", "dilations"),
    [
        ((2, 2), (2, 2), (0, 0, 0, 0), (1, 1)),
        ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
        ((3, 2), (1, 2), (1, 0, 1, 0), (2, 1)),
        ((2, 3), (2, 1), (0, 1, 1, 0), (1, 1)),  # asymmetric padding
    ],
)
def test_max_pool(kernel, strides, pads, dilations):
    x = (np.random.default_rng(14).standard_normal((2, 3, 7, 8)) - 3).astype(np.float32)
    top, left, bottom, right = pads
    padded = F.pad(torch.from_numpy(x), (left, right, top, bottom), value=-math.inf)
    want = F.max_pool2d(padded, kernel, strides, dilation=dilations).numpy()
    attrs = pool_attrs(kernel, strides, pads, dilations)
    got, _ = execute("max_pool", [x], attrs, want.shape, "float32")
    np.testing.assert_array_equal(got, want)
    last = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    want_last = np.moveaxis(want, 1, -1)
    attrs["channels_last"] = True
    got, _ = execute("max_pool", [last], attrs, want_last.shape, "float32", rect=(1, 0, 5, 3))
    np.testing.assert_array_equal(got, want_last)


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize(
    ("kernel", "strides", "pad"), [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 1), (1, 1))]
)
def test_avg_pool(kernel, strides, pad, count_include_pad):
    x = np.random.default_rng(15).standard_normal((2, 3, 7, 8)).astype(np.float32)
    want = F.avg_pool2d(
        torch.from_numpy(x), kernel, strides, pad, count_include_pad=count_include_pad
    ).numpy()
    pads = (pad[0], pad[1], pad[0], pad[1])
    attrs = pool_attrs(kernel, strides, pads, (1, 1), count_include_pad=count_include_pad)
    got, _ = execute("avg_pool", [x], attrs, want.shape, "float32")
    close(got, want)
    last = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    attrs["channels_last"] = True
    got, _ = execute("avg_pool", [last], attrs, np.moveaxis(want, 1, -1).shape, "float32")
    close(got, np.moveaxis(want, 1, -1))


def test_max_pool_1d():
    x = np.random.default_rng(16).standard_normal((2, 4, 11)).astype(np.float32)
    want = F.max_pool1d(torch.from_numpy(x), 3, 2, padding=1).numpy()
    got, _ = execute("max_pool", [x], pool_attrs((3,), (2,), (1, 1), (1,)), want.shape, "float32")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("sa", "sb"), [((5, 6), (2, 6, 7)), ((3, 5, 6), (1, 6, 7)), ((1, 12, 9), (1, 9, 4))]
)
@pytest.mark.parametrize("b_source", [WAFER, RESIDENT, STREAM])
def test_matmul_batched_weights(sa, sb, b_source):
    rng = np.random.default_rng(17)
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    want = matmul_ref(a, b)
    got, _ = execute("matmul", [a, b], {}, want.shape, "float32", (1, 0, 6, 5), {1: b_source})
    close(got, want)


@pytest.mark.parametrize("dtype", ["int64", "bool", "float16"])
def test_movement_keeps_other_dtypes(dtype):
    rng = np.random.default_rng(18)
    x = (rng.standard_normal((3, 5, 4)) * 10).astype(dtype)
    want = np.transpose(x, (1, 2, 0))
    got, _ = execute("transpose", [x], {"perm": [1, 2, 0]}, want.shape, dtype)
    np.testing.assert_array_equal(got, want)
    got, _ = execute("concat", [x, x[:1]], {"axis": 0}, (4, 5, 4), dtype)
    np.testing.assert_array_equal(got, np.concatenate([x, x[:1]]))
