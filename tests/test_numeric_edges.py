"""Numbers at the edges, through the public path (``cgc.compile`` + ``cgc.run``, and ``cgc run``):
integer inputs narrowed to the model's type, integer division and remainders at the types'
extremes, and NaN, infinities and ties in ArgMax, ArgMin and TopK; against onnxruntime for
ONNX models and torch eager for the PyTorch frontend, exactly."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from conftest import run_onnxruntime
from onnx import TensorProto, helper, numpy_helper
from test_cli import invoke, one_line_error
from test_onnx_elementwise import make_model

import cgc
from cgc.errors import CgcError
from cgc.machine import dtypes
from cgc.runtime.cluster import cast_input

OPTIONS: dict[str, Any] = {"target": "mesh8x8", "mode": "weight_streaming"}
NAN, INF = np.nan, np.inf


def run(
    model: onnx.ModelProto | torch.nn.Module,
    feeds: dict[str, np.ndarray],
    values: dict[str, np.ndarray] | None = None,
) -> list:
    """The outputs, in order, of ``model`` compiled by cgc (the inputs in ``values`` fixed to
    them, as TopK's k must be) and run on ``feeds``."""
    if isinstance(model, torch.nn.Module):
        args = tuple(torch.from_numpy(a) for a in feeds.values())
        artifact = cgc.compile(model, args=args, **OPTIONS)
    else:
        artifact = cgc.compile(model, values=values, **OPTIONS)
    outputs = cgc.run(artifact, {n: a for n, a in feeds.items() if n not in (values or {})})
    return [outputs[spec["name"]] for spec in artifact.manifest["outputs"]]


def assert_exact(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    """Equal types, shapes and values (NaN equal to NaN)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_array_equal(g, w)


# -- integer inputs narrowed to the model's type ------------------------------------------------


def gather(ids: str = "int32") -> onnx.ModelProto:
    """An embedding lookup: a [10, 4] table's rows at ``ids`` ([2, 3], of type ``ids``)."""
    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    node = helper.make_node("Gather", ["table", "ids"], ["y"], name="lookup")
    kind = helper.np_dtype_to_tensor_dtype(np.dtype(ids))
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("ids", kind, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
        [table],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("declared", "fed", "message"),
    [
        ("int32", [[3, 1, 2], [0, 2**32 + 3, 2**40]], r"4294967299 at \[1, 1\], .* of int32 "),
        ("int32", [[1, 2, 3], [-(2**31) - 1, 0, 0]], r"-2147483649 at \[1, 0\], .* of int32 "),
        ("int64", np.array([[1, 2, 3], [2**63, 0, 0]], np.uint64), r"9223372036854775808 at "),
    ],
)
def test_an_integer_input_out_of_its_type_is_named_not_wrapped(declared, fed, message):
    artifact = cgc.compile(gather(declared), **OPTIONS)
    ids = np.asarray(fed, dtype=getattr(fed, "dtype", np.int64))
    with pytest.raises(CgcError, match=rf"^input 'ids' holds {message}"):
        cgc.run(artifact, {"ids": ids})


@pytest.mark.parametrize(
    ("declared", "fed"),
    [("int32", "int64"), ("int32", "uint64"), ("int64", "uint64"), ("int32", "bool")],
)
def test_integer_inputs_that_fit_their_type_run_as_onnxruntime(declared, fed):
    model = gather(declared)
    ids = np.array([[9, 0, 1], [1, 0, 9]]).astype(fed)
    want = run_onnxruntime(model, {"ids": ids.astype(declared)})
    assert_exact(run(model, {"ids": ids}), want)


@pytest.mark.parametrize(
    ("declared", "fed", "bad"),
    [
        (np.int8, [-128, 127, 0, -129], r"-129 at \[3\], outside the range of int8 \[-128, 127\]"),
        (np.uint8, [0, 255, -1, 256], r"-1 at \[2\], outside the range of uint8 \[0, 255\]"),
        (np.uint32, [0, 2**32 - 1, 2**32, -1], r"4294967296 at \[2\]"),
        (np.int16, [0, 1, 2**15, 0], r"32768 at \[2\]"),
    ],
)
def test_every_narrowing_integer_cast_is_range_checked(declared, fed, bad):
    model = make_model("Identity", {"x": np.zeros(4, declared)})
    artifact = cgc.compile(model, **OPTIONS)
    with pytest.raises(CgcError, match=rf"^input 'x' holds {bad}"):
        cgc.run(artifact, {"x": np.array(fed, np.int64)})
    low, high = dtypes.integer_range(declared)
    edges = np.array([low, high, 0, 1], np.int64)  # the type's extremes pass
    assert_exact(run(model, {"x": edges}), [edges.astype(declared)])


def test_a_float_fed_for_an_integer_input_is_refused_and_floats_round():
    artifact = cgc.compile(gather(), **OPTIONS)
    with pytest.raises(CgcError, match=r"^input 'ids' has dtype float64; the model takes int32$"):
        cgc.run(artifact, {"ids": np.zeros((2, 3))})
    model = make_model("Identity", {"x": np.zeros(3, np.float32)})
    x = np.array([0.1, 1e-50, -3.5])  # float64 to float32: rounded, as numpy rounds
    assert_exact(run(model, {"x": x}), [x.astype(np.float32)])


def test_the_four_bit_integers_take_integers_in_range_only():
    """ml_dtypes casts floats "same_kind" to int4: the check does not ask numpy."""
    assert cast_input("x", np.array([-8, 7], np.int8), "int4").dtype == ml_dtypes.int4
    with pytest.raises(CgcError, match=r"^input 'x' has dtype float32; the model takes int4$"):
        cast_input("x", np.array([1.5], np.float32), "int4")
    with pytest.raises(CgcError, match=r"^input 'x' holds 9 at \[1\], .* of int4 \[-8, 7\]$"):
        cast_input("x", np.array([0, 9], np.int8), "int4")


def test_cli_run_names_the_value_that_does_not_fit(tmp_path):
    cgc.compile(gather(), **OPTIONS).save(tmp_path / "g.cgc")
    np.savez(tmp_path / "in.npz", ids=np.array([[0, 1, 2], [3, 4, 2**32 + 3]], np.int64))
    result = invoke("run", tmp_path / "g.cgc", "--inputs", tmp_path / "in.npz")
    one_line_error(result, "input 'ids' holds 4294967299 at [1, 2]", "int32")


# -- integer division and remainders ------------------------------------------------------------

INTEGERS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def edge_pairs(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of the type's edge values (its extremes and their neighbours, 0 and small
    values of either sign) as dividend and divisor, but those C leaves undefined: a
    division by zero, the minimum over -1."""
    low, high = dtypes.integer_range(dtype)
    edges = {low, low + 1, -7, -3, -2, -1, 0, 1, 2, 3, 7, high - 1, high}
    values = sorted(v for v in edges if low <= v <= high)
    pairs = [(a, b) for a in values for b in values if b != 0 and not (a == low < 0 and b == -1)]
    a, b = zip(*pairs, strict=True)
    return np.array(a, dtype), np.array(b, dtype)


@pytest.mark.parametrize("dtype", INTEGERS)
@pytest.mark.parametrize(("op", "attrs"), [("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1})])
def test_integer_div_and_mod_at_the_extremes_match_onnxruntime(dtype, op, attrs):
    """Div truncates toward zero (int8 -128 / 3 is -42), Mod takes the divisor's sign
    (``fmod=0``) or the dividend's (``fmod=1``), for every pair C defines."""
    a, b = edge_pairs(dtype)
    model = make_model(op, {"a": a, "b": b}, **attrs)
    assert_exact(run(model, {"a": a, "b": b}), run_onnxruntime(model, {"a": a, "b": b}))


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_what_c_leaves_undefined_stays_defined(dtype):
    """The minimum over -1 wraps to the minimum (onnxruntime's int8 answer; its int32 and
    int64 ones crash) and a division or remainder by zero is 0 (onnxruntime refuses it)."""
    low = dtypes.integer_range(dtype)[0]
    a, b = np.array([low, low, 5, -5], dtype), np.array([-1, -1, 0, 0], dtype)
    quotient, remainder, fmod = (
        run(make_model(op, {"a": a, "b": b}, **attrs), {"a": a, "b": b})[0]
        for op, attrs in (("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1}))
    )
    zeros = np.zeros_like(a)
    assert_exact([quotient, remainder, fmod], [np.array([low, low, 0, 0], dtype), zeros, zeros])
    if dtype == "int8":  # the one of them onnxruntime computes
        first = {"a": a[:1], "b": b[:1]}
        assert_exact([quotient[:1]], run_onnxruntime(make_model("Div", first), first))


class IntegerDivision(torch.nn.Module):
    """torch's integer quotients and remainders."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.div(a, b, rounding_mode="trunc"),
            torch.div(a, b, rounding_mode="floor"),
            a // b,
            a % b,
            torch.fmod(a, b),
        )


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8"])
def test_torch_integer_division_at_the_extremes_matches_eager(dtype):
    """Exact to the last bit of int64 (not through float64); int8 and int16 wrap the minimum
    over -1 as torch does (int32 and int64 crash torch, so are left out)."""
    a, b = edge_pairs(dtype)
    if dtype in ("int8", "int16"):
        low = dtypes.integer_range(dtype)[0]
        a, b = np.append(a, low).astype(dtype), np.append(b, -1).astype(dtype)
    with torch.no_grad():
        want = [t.numpy() for t in IntegerDivision()(torch.from_numpy(a), torch.from_numpy(b))]
    assert_exact(run(IntegerDivision(), {"a": a, "b": b}), want)


# -- NaN, infinities and ties in ArgMax, ArgMin and TopK -----------------------------------------

ROWS = np.array(
    [
        [NAN, INF, 1, 2, 0],
        [1, NAN, 3, NAN, -INF],
        [-INF, NAN, -INF, 0, NAN],
        [1, 2, 2, 1, 2],
        [-INF, -INF, -INF, -INF, -INF],
        [0, -0.0, 0, -1, -1],
        [NAN, NAN, 1, NAN, NAN],
        [INF, 1, INF, -INF, -INF],
    ]
)
"""NaN first, later and repeated, all infinities, ties (signed zeros among them)."""
NUMBERS = ROWS[~np.isnan(ROWS).any(axis=1)]
"""The rows without NaN."""


def numpy_arg(x: np.ndarray, largest: bool, axis: int, last: bool, keepdims: bool) -> np.ndarray:
    """numpy's argmax or argmin (NaN is the extreme both ways, the first one), or the last
    index of the extreme with ``last``."""
    arg = np.argmax if largest else np.argmin
    index = x.shape[axis] - 1 - arg(np.flip(x, axis), axis) if last else arg(x, axis)
    return np.expand_dims(index, axis) if keepdims else index


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axis", [0, 1])
def test_onnx_arg_extremes_with_nan_follow_numpy(op, last, keepdims, axis):
    """NaN wins ArgMax and ArgMin alike, as in numpy and torch. onnxruntime skips NaN unless
    it comes first, giving indices that depend on its vectorized path (ArgMin of float32
    [2, nan, 2, -1, 1] is 4): it is compared where it is consistent, below."""
    x = ROWS.astype(np.float32)
    model = make_model(op, {"x": x}, axis=axis, keepdims=keepdims, select_last_index=last)
    want = numpy_arg(x, op == "ArgMax", axis, bool(last), bool(keepdims))
    assert_exact(run(model, {"x": x}), [want])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_onnx_arg_extremes_match_onnxruntime_where_it_is_consistent(dtype, op, last):
    """Rows without NaN (infinities, ties, signed zeros), and the first index with NaN in
    the first place (ArgMax of [nan, inf, 1, 2] is 0; with ``select_last_index`` onnxruntime
    still gives 0 there, where the last NaN is the last of the largest)."""
    nan_first = [[NAN, INF, 1, 2, 0], [NAN, -INF, 1, NAN, 0]]
    x = (NUMBERS if last else np.concatenate([NUMBERS, nan_first])).astype(dtype)
    model = make_model(op, {"x": x}, axis=1, select_last_index=last)
    assert_exact(run(model, {"x": x}), run_onnxruntime(model, {"x": x}))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize(("axis", "k"), [(1, 1), (1, 3), (1, 5), (0, 8)])
def test_onnx_topk_ranks_nan_above_infinity_as_onnxruntime(dtype, largest, axis, k):
    x = ROWS.astype(dtype)
    k_value = {"k": np.array([k], np.int64)}
    feeds = {"x": x, **k_value}
    model = make_model("TopK", feeds, outputs=("values", "indices"), axis=axis, largest=largest)
    assert_exact(run(model, feeds, k_value), run_onnxruntime(model, feeds))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin", "TopK"])
def test_integer_extremes_rank_as_onnxruntime(dtype, op):
    low, high = dtypes.integer_range(dtype)
    x = np.array([[low, high, -1, 0, high, low], [0, -1, 1, low + 1, high - 1, 0]], dtype)
    k_value = {"k": np.array([4], np.int64)} if op == "TopK" else {}
    feeds = {"x": x, **k_value}
    for flag in (0, 1):  # TopK's largest, the others' select_last_index
        if op == "TopK":
            model = make_model(op, feeds, outputs=("values", "indices"), largest=flag)
        else:
            model = make_model(op, feeds, axis=1, select_last_index=flag)
        assert_exact(run(model, feeds, k_value), run_onnxruntime(model, feeds))


class Extremes(torch.nn.Module):
    """torch's arg-reductions, max/min along a dim, top-k and sort."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values, indices = x.max(1)
        low, low_indices = x.min(0, keepdim=True)
        return (
            x.argmax(1),
            x.argmin(1),
            x.argmax(0, keepdim=True),
            x.argmin(),
            values,
            indices,
            low,
            low_indices,
            *torch.topk(x, 3, 1),
            *torch.sort(x, dim=1, descending=True, stable=True),
            *torch.sort(x, dim=1, stable=True),
        )


def test_torch_arg_extremes_topk_and_sort_with_nan_match_eager():
    """NaN is the extreme both ways in argmax, argmin, max and min (the first one), and the
    largest in top-k and sort. Among equal values torch.topk's order is left open (it gives
    [3, 2, 4] for the top 3 of [1, 2, 2, nan, 2]): its indices are the stable sort's first."""
    x = ROWS.astype(np.float32)
    with torch.no_grad():
        want = [t.numpy() for t in Extremes()(torch.from_numpy(x))]
    topk_indices, descending_indices = 9, 11
    want[topk_indices] = want[descending_indices][:, :3]
    assert_exact(run(Extremes(), {"x": x}), want)
