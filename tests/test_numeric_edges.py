"""Numbers at the edges, through the public path (``cgc.compile`` + ``cgc.run``, and ``cgc run``):
integer inputs narrowed to the model's type, integer division and remainders at the types'
extremes and by zero (an error, at compile time for a known divisor), torch's float
quotients and remainders, clamp bounds beyond their type, and NaN, infinities and ties in
ArgMax, ArgMin and TopK; against onnxruntime for ONNX models and torch eager for the PyTorch
frontend, exactly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from conftest import run_imported, run_onnxruntime
from ir_builders import apply, build, loc
from onnx import TensorProto, helper, numpy_helper
from test_cli import invoke, one_line_error
from test_onnx_elementwise import make_model
from xdsl.ir import SSAValue

import cgc
from cgc.dialects import wse
from cgc.dialects.interpreter import Interpreter
from cgc.dialects.ir import main_function
from cgc.errors import CgcError
from cgc.frontends.onnx import import_model
from cgc.machine import plans, reference
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import get_target
from cgc.machine.movement.layout import Layout
from cgc.machine.plans import WAFER, Operand
from cgc.passes.fold_constants import FoldConstantsPass
from cgc.runtime import kernels
from cgc.runtime.cluster import cast_input
from cgc.runtime.tiles import DistTensor

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
def test_the_minimum_over_minus_one_wraps(dtype):
    """C leaves it undefined; it wraps to the minimum (onnxruntime's int8 answer; its int32
    and int64 ones crash), and the remainders are 0."""
    low = dtypes.integer_range(dtype)[0]
    a, b = np.array([low, low], dtype), np.array([-1, -1], dtype)
    quotient, remainder, fmod = (
        run(make_model(op, {"a": a, "b": b}, **attrs), {"a": a, "b": b})[0]
        for op, attrs in (("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1}))
    )
    zeros = np.zeros_like(a)
    assert_exact([quotient, remainder, fmod], [np.array([low, low], dtype), zeros, zeros])
    if dtype == "int8":  # the one of them onnxruntime computes
        first = {"a": a[:1], "b": b[:1]}
        assert_exact([quotient[:1]], run_onnxruntime(make_model("Div", first), first))


DIVISIONS = [
    ("Div", {}, "division"),
    ("Mod", {"fmod": 0}, "modulo"),
    ("Mod", {"fmod": 1}, "modulo"),
]
"""The ONNX ops that divide integers, their attributes, and what a division by 0 is called."""


@pytest.mark.parametrize("dtype", INTEGERS)
@pytest.mark.parametrize(("op", "attrs", "what"), DIVISIONS)
def test_an_integer_division_by_zero_ends_the_run_naming_node_and_position(dtype, op, attrs, what):
    """onnxruntime refuses it ("Integer division by zero"); so does cgc, with the node, the
    op and the first position (row-major) of the result divided by 0, as for an index out
    of range (``DataError``), instead of computing 0."""
    a = np.array([[7, 1, 2], [3, 5, 6]], dtype)
    b = np.array([[1, 2, 3], [4, 0, 0]], dtype)
    model = make_model(op, {"a": a, "b": b}, **attrs)
    with pytest.raises(Exception, match=rf"Integer {what} by zero"):
        run_onnxruntime(model, {"a": a, "b": b})
    artifact = cgc.compile(model, **OPTIONS)
    with pytest.raises(CgcError) as info:
        cgc.run(artifact, {"a": a, "b": b})
    mnemonic = "div" if op == "Div" else ("fmod" if attrs["fmod"] else "mod")
    assert str(info.value) == f"node 'n' ({mnemonic}): integer {what} by zero at [1, 1]"
    b[1] = [4, 1, 7]  # no zero left: it runs, as onnxruntime does
    assert_exact(run(model, {"a": a, "b": b}), run_onnxruntime(model, {"a": a, "b": b}))


def test_the_position_is_the_results_where_the_divisor_broadcasts():
    """A zero in a broadcast divisor divides a whole column: the first position is in the
    result's row-major order. A result with no elements divides nothing, as in torch
    (onnxruntime looks for a zero in the divisor before it looks at the result's size)."""
    a, b = np.arange(6, dtype=np.int32).reshape(2, 3), np.array([3, 2, 0], np.int32)
    model = make_model("Div", {"a": a, "b": b})
    with pytest.raises(CgcError, match=r"^node 'n' \(div\): integer division by zero at \[0, 2\]$"):
        run(model, {"a": a, "b": b})
    empty = np.zeros((0, 3), np.int32)
    (quotient,) = run(make_model("Div", {"a": empty, "b": b}), {"a": empty, "b": b})
    want = torch.from_numpy(empty) // torch.from_numpy(b)
    assert_exact([quotient], [want.numpy()])


def test_the_interpreter_refuses_a_zero_divisor_as_the_runtime_does():
    a, b = np.array([4, 5, 6], np.int64), np.array([1, 0, 2], np.int64)
    imported = import_model(make_model("Mod", {"a": a, "b": b}, fmod=1))
    with pytest.raises(CgcError, match=r"^node 'n' \(fmod\): integer modulo by zero at \[1\]$"):
        run_imported(imported, {"a": a, "b": b})


@pytest.mark.parametrize(("op", "attrs", "what"), DIVISIONS)
@pytest.mark.parametrize("dividend_known", [False, True])
def test_a_known_zero_divisor_is_refused_at_compile_time(op, attrs, what, dividend_known):
    """Every run would fail: compiling does, naming the node, whether the quotient folds
    (both operands known, by the same reference function the runtime runs) or not."""
    a, b = np.array([[7, 8, 9]], np.int32), np.array([3, 0, 2], np.int32)
    node = helper.make_node(op, ["a", "b"], ["y"], name="n", **attrs)
    known = [numpy_helper.from_array(b, "b")]
    inputs = [helper.make_tensor_value_info("a", TensorProto.INT32, [1, 3])]
    if dividend_known:
        known, inputs = [*known, numpy_helper.from_array(a, "a")], []
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 3])], known
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    message = rf"^<model>: node 'n' \({op}\): integer {what} by zero at \[0, 1\]$"
    with pytest.raises(CgcError, match=message):
        cgc.compile(model, **OPTIONS)


def test_the_fold_constants_pass_leaves_a_zero_divisor_to_the_run():
    """IR read from a file (``cgc opt``) reaches the pass without a frontend's check: the op
    stays, and running it names the node (an error raised in an xDSL pattern would carry the
    whole module's text)."""

    def body() -> list[SSAValue]:
        constants = [wse.ConstantOp(wse.dense_attr(np.array(v, np.int32))) for v in ([4], [0])]
        mod = wse.ModOp(*(c.result for c in constants))
        mod.location = loc("m")
        return [mod.result]

    module = apply(build([], body), FoldConstantsPass())
    with pytest.raises(CgcError, match=r"^node 'm' \(mod\): integer modulo by zero at \[0\]$"):
        Interpreter({}).run_function(main_function(module), [])


def test_float_division_by_zero_stays_ieee():
    """Infinities and NaN, as onnxruntime gives, not an error."""
    a = np.array([1, -1, 0, NAN, INF, -0.0], np.float32)
    b = np.array([0, 0, 0, 0, -0.0, 0], np.float32)
    for op, attrs, _ in DIVISIONS[::2]:  # Mod of floats takes fmod=1 before opset 28
        model = make_model(op, {"a": a, "b": b}, **attrs)
        assert_exact(run(model, {"a": a, "b": b}), run_onnxruntime(model, {"a": a, "b": b}))


def test_integer_division_kernels_check_the_data_not_the_padding_of_the_tiles():
    """On the mesh an elementwise kernel may divide tiles, whose padding holds zeros: the
    check reads the logical divisor."""
    a = (np.arange(15, dtype=np.int32) - 7).reshape(3, 5)
    b = np.array([3, -2, 1, 5, -4], np.int32)
    rect, on = (0, 0, 4, 4), (1, 2, 3, 5)
    requests = [Operand(x.shape, "int32", WAFER, Layout.on(x.shape, "int32", on)) for x in (a, b)]
    plan = plans.plan("div", get_target("mesh8x8"), rect, requests, {}, [((3, 5), "int32")])

    def tiles(divisor: np.ndarray) -> list[DistTensor]:
        """The operands as tiles alone, zero padded."""
        laid = zip((a, divisor), plan.inputs, strict=True)
        return [DistTensor(layout, DistTensor.scatter(x, layout).tiles) for x, layout in laid]

    operands = tiles(b)
    assert not (operands[1].has_array or operands[1].tiles.all())  # zeros in the padding alone
    with np.errstate(all="ignore"):  # as the VM runs kernels
        (got,) = kernels.run("div", plan, operands, {})
        np.testing.assert_array_equal(got.gather(), reference.divide(a, b))
        b[3] = 0
        with pytest.raises(
            reference.DivisionByZero, match=r"^integer division by zero at \[0, 3\]"
        ):
            kernels.run("div", plan, tiles(b), {})


def test_cli_run_names_the_division_by_zero(tmp_path):
    a, b = np.array([5, 6], np.int64), np.array([2, 3], np.int64)
    cgc.compile(make_model("Mod", {"a": a, "b": b}), **OPTIONS).save(tmp_path / "m.cgc")
    np.savez(tmp_path / "in.npz", a=a, b=np.array([2, 0], np.int64))
    result = invoke("run", tmp_path / "m.cgc", "--inputs", tmp_path / "in.npz")
    one_line_error(result, "node 'n' (mod): integer modulo by zero at [1]")


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


class Binary(torch.nn.Module):
    """A module of one torch expression of two tensors."""

    def __init__(self, expression: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__()
        self.expression = expression

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.expression(a, b)


TORCH_DIVISIONS: dict[str, Callable[[torch.Tensor, Any], torch.Tensor]] = {
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "floor_divide": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "fmod": torch.fmod,
}
"""torch's quotients and remainders, by name."""


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8"])
@pytest.mark.parametrize("name", sorted(TORCH_DIVISIONS))
def test_torch_integer_division_by_zero_ends_the_run_as_eager_raises(dtype, name):
    """torch raises ZeroDivisionError for every rounding mode, remainder and fmod of
    integers; cgc's run ends naming the node, its op and the first position divided by 0."""
    a, b = np.array([[7, 9, 3], [5, 6, 1]], dtype), np.array([[2, 3, 1], [1, 0, 1]], dtype)
    module = Binary(TORCH_DIVISIONS[name])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        module(torch.from_numpy(a), torch.from_numpy(b))
    message = r"^node '\w+' \((div|mod|fmod)\): integer (division|modulo) by zero at \[1, 1\]$"
    with pytest.raises(CgcError, match=message):
        run(module, {"a": a, "b": b})


@pytest.mark.parametrize("name", sorted(TORCH_DIVISIONS))
def test_torch_integer_division_by_a_zero_number_is_refused_at_compile_time(name):
    expression = TORCH_DIVISIONS[name]
    module = Binary(lambda a, b: expression(a, 0) + b)
    example = torch.ones(2, 3, dtype=torch.int32)
    message = r"^<torch>: node '\w+' \(aten\.\w+\.\w+\): integer (division|modulo) by zero at \["
    with pytest.raises(CgcError, match=message):
        cgc.compile(module, args=(example, example.clone()), **OPTIONS)


def float_edges(dtype: str) -> np.ndarray:
    """A float type's edge values: zeros of both signs, small numbers either side of
    integers and halves, the largest finite, the smallest normal and subnormal, the
    infinities and NaN."""
    info = np.finfo(dtype)
    values = [0.0, -0.0, 1, -1, 0.5, -0.5, 1.5, -2.5, 3, -3, 7, 0.1, -0.1, 5.3, -5.3, 1e-3,
              info.max, -info.max, info.tiny, -info.tiny, info.smallest_subnormal,
              -info.smallest_subnormal, INF, -INF, NAN]  # fmt: skip
    return np.array(values, dtype)


def eager(module: torch.nn.Module, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """torch eager's outputs through its element-by-element CPU loop, on strided views of the
    inputs, which its kernels do not vectorize: their vectorized ``fmod`` (inside remainder
    and floor division too) gives NaN where ``a / b`` overflows, ``fmod(7, 1.2e-38)`` or
    ``fmod(3.4e38, 0.5)``, where C's ``fmod``, torch's documentation and the loop that
    tensors of fewer than 16 elements take give the exact remainder."""
    strided = [torch.from_numpy(np.stack([x, x], -1))[..., 0] for x in feeds.values()]
    with torch.no_grad():
        out = module(*strided)
    return [t.contiguous().numpy() for t in (out if isinstance(out, tuple) else (out,))]


class FloatDivision(torch.nn.Module):
    """torch's rounded quotients and remainders of floats: by a tensor, and by Python
    numbers (which torch divides float16 by in float32)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        by_tensor = tuple(expression(a, b) for expression in TORCH_DIVISIONS.values())
        by_number = tuple(expression(a, 0.1) for expression in TORCH_DIVISIONS.values())
        return (*by_tensor, *by_number, a // -0.0, torch.fmod(a, 0.0), torch.trunc(a))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_torch_float_division_and_remainders_match_eager_at_the_edges(dtype):
    """Every pair of edge values, to the bit: ``trunc`` keeps -0.0 (``-0.0 / 1``, ``0.3 /
    -1``), floor division is Python's (``1 // 0.1`` is 9, ``-1 // inf`` is -1, ``inf // 2``
    NaN, ``x // 0`` IEEE's quotient), remainders are C's ``fmod`` (the dividend's sign) or
    moved to the divisor's sign (``-1 % inf`` is inf, ``0 % inf`` 0, ``x % 0`` NaN); float16
    rounds every step to float16, as torch does."""
    values = float_edges(dtype)
    a, b = (np.ascontiguousarray(x.ravel()) for x in np.meshgrid(values, values, indexing="ij"))
    feeds = {"a": a, "b": b}
    assert_exact(run(FloatDivision(), feeds), eager(FloatDivision(), feeds))


class ByOneNumber(torch.nn.Module):
    """Rounded divisions by one number: a tensor of one element, and Python numbers."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rounded = tuple(torch.div(a, b, rounding_mode=mode) for mode in ("trunc", "floor"))
        return (
            *rounded,
            torch.div(a, 3.3, rounding_mode="floor"),
            torch.div(a, 0.7, rounding_mode="trunc"),
        )


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_torch_divides_float16_by_one_number_in_float32(dtype):
    """torch's CPU kernels divide float16 by one number (a Python number, not rounded to
    float16, or a tensor of one element) in float32 and round once, where a tensor of
    float16 divides in float16: ``x // 3.3`` is not ``x // float16(3.3)``."""
    a = np.concatenate([float_edges(dtype), np.linspace(-700, 700, 141, dtype=dtype)])
    feeds = {"a": a, "b": np.array(0.3, dtype)}  # quotients of 1024 to 2048 round in float16
    assert_exact(run(ByOneNumber(), feeds), eager(ByOneNumber(), feeds))


class Clamp(torch.nn.Module):
    """``torch.clamp`` with Python numbers as bounds."""

    def __init__(self, low: float | None, high: float | None):
        super().__init__()
        self.low, self.high = low, high

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=self.low, max=self.high)


F32_LOWEST = float(np.finfo(np.float32).min)


@pytest.mark.parametrize(
    ("dtype", "low", "high"),
    [("float32", -3.4028235e38, None), ("float16", None, 70000.0), ("int32", -(2**40), 0)],
)
def test_a_clamp_bound_its_type_cannot_hold_is_refused_as_torch_refuses_it(dtype, low, high):
    """torch raises "value cannot be converted to type float without overflow" for any
    input: ``-3.4028235e+38`` (float32's lowest printed to 8 digits) is beyond float32."""
    x = torch.zeros(2, 3, dtype=getattr(torch, dtype))
    with pytest.raises(RuntimeError, match="without overflow"):
        Clamp(low, high)(x)
    with pytest.raises(CgcError, match=r"^<torch>: node 'clamp' .*cannot be converted to "):
        cgc.compile(Clamp(low, high), args=(x,), **OPTIONS)


@pytest.mark.parametrize(("low", "high"), [(F32_LOWEST, 3.0), (-INF, INF), (NAN, None)])
def test_clamp_bounds_float32_holds_run_as_eager(low, high):
    feeds = {"x": float_edges("float32")}
    assert_exact(run(Clamp(low, high), feeds), eager(Clamp(low, high), feeds))


def test_a_tensor_given_twice_as_example_stays_two_inputs():
    """torch.export makes one input of a tensor object passed twice (pytorch/pytorch#144683):
    ``a - b`` captured on ``(t, t)`` computes ``b - b``. cgc copies the second, so that a run
    may feed two different tensors."""
    example = torch.ones(2, 3)
    artifact = cgc.compile(Binary(torch.sub), args=(example, example), **OPTIONS)
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 0.5, np.float32)
    np.testing.assert_array_equal(cgc.run(artifact, {"a": a, "b": b})["output"], a - b)


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
