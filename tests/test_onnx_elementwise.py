"""The elementwise ONNX ops (elementwise.py, activations.py, casts.py in cgc/frontends/onnx/)
through the whole compiler and simulator, against onnxruntime where it runs the op and dtype,
else against numpy; their opset differences; and the errors they report."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
import pytest
from conftest import run_onnxruntime
from onnx import TensorProto, helper

import cgc.tools.backend
from cgc.dialects.interpreter import Interpreter
from cgc.dialects.ir import main_function
from cgc.errors import CgcError
from cgc.frontends.onnx import import_model
from cgc.machine.hardware import dtypes

ORT_OPSET = 21
"""The opset of the models compared with onnxruntime (which runs ONNX up to about 23)."""


def make_model(
    op: str,
    inputs: dict[str, np.ndarray],
    opset: int = ORT_OPSET,
    outputs: tuple[str, ...] = ("y",),
    input_names: list[str] | None = None,
    infer: bool = True,
    **attrs,
) -> onnx.ModelProto:
    """A model of one node whose graph inputs are ``inputs`` (declared with their shapes and
    dtypes); ``input_names`` lists the node's inputs when they differ (e.g. with gaps)."""
    node = helper.make_node(op, input_names or list(inputs), list(outputs), name="n", **attrs)
    graph_inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
        )
        for name, array in inputs.items()
    ]
    graph_outputs = []
    for name in outputs:
        out = onnx.ValueInfoProto()
        out.name = name
        graph_outputs.append(out)
    graph = helper.make_graph([node], "g", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    if infer:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    return model


def declare_outputs(model: onnx.ModelProto, outputs: list[np.ndarray]) -> onnx.ModelProto:
    """Gives the graph outputs the types of ``outputs`` (for ops shape inference cannot do)."""
    for vi, array in zip(model.graph.output, outputs, strict=True):
        vi.CopyFrom(
            helper.make_tensor_value_info(
                vi.name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
            )
        )
    return model


def run_cgc(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model compiled and simulated by cgc."""
    return list(cgc.tools.backend.run_model(model, list(inputs.values())))


def assert_same(got: list[np.ndarray], want: list[np.ndarray], rtol=1e-5, atol=1e-6) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if dtypes.is_float(g.dtype):
            np.testing.assert_allclose(
                g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol
            )
        else:
            np.testing.assert_array_equal(g, w)


def check_ort(op: str, inputs: dict[str, np.ndarray], rtol=1e-5, atol=1e-6, **attrs) -> None:
    """The op in cgc equals the op in onnxruntime."""
    model = make_model(op, inputs, **attrs)
    assert_same(run_cgc(model, inputs), run_onnxruntime(model, inputs), rtol, atol)


def check_numpy(op: str, inputs: dict[str, np.ndarray], want, rtol=1e-5, atol=1e-6, **attrs):
    """The op in cgc equals hand-computed outputs (one array or a list)."""
    wants = want if isinstance(want, list) else [want]
    outputs = attrs.pop("outputs", ("y",))
    model = make_model(op, inputs, outputs=outputs, infer=False, **attrs)
    model = declare_outputs(model, [np.asarray(w) for w in wants])
    assert_same(run_cgc(model, inputs), wants, rtol, atol)


def import_error(op: str, inputs: dict[str, np.ndarray], **attrs) -> str:
    """The one-line error cgc reports for the model."""
    model = make_model(op, inputs, infer=False, **attrs)
    with pytest.raises(CgcError) as info:
        import_model(model)
    return str(info.value)


def interpret(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The imported model run by the numpy interpreter (no fabric simulation)."""
    imported = import_model(model)
    args = [inputs[spec.name] for spec in imported.inputs]
    return Interpreter(imported.weights).run_function(main_function(imported.module), args)


RNG = np.random.default_rng(0)


def normal(*shape, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def uniform(low, high, *shape, dtype=np.float32) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(dtype)


def integers(low, high, *shape, dtype=np.int32) -> np.ndarray:
    return RNG.integers(low, high, shape).astype(dtype)


# ---------------------------------------------------------------------------------------------
# Unary math
# ---------------------------------------------------------------------------------------------

DOMAINS = {
    "Log": (0.1, 5),
    "Sqrt": (0.0, 5),
    "Asin": (-0.99, 0.99),
    "Acos": (-0.99, 0.99),
    "Atanh": (-0.9, 0.9),
    "Acosh": (1.01, 5),
    "Reciprocal": (0.5, 3),
}


@pytest.mark.parametrize(
    "op",
    ["Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Sin",
     "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Erf",
     "Relu", "Sigmoid", "Tanh"],
)  # fmt: skip
def test_unary_math(op):
    low, high = DOMAINS.get(op, (-3, 3))
    x = uniform(low, high, 3, 4)
    if op == "Round":
        x = np.array([[0.5, 1.5, 2.5, -0.5], [-1.5, 2.4, -2.6, 0.0], [3.5, 4.5, -3.5, 1.2]])
        x = x.astype(np.float32)
    check_ort(op, {"x": x}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.float16, np.float64])
def test_unary_on_other_types(dtype):
    x = (np.arange(-6, 6).reshape(3, 4) * 1.5).astype(dtype)
    for op, want in (("Abs", np.abs), ("Neg", np.negative), ("Sign", np.sign)):
        check_numpy(op, {"x": x}, want(x))
    check_numpy("Relu", {"x": x}, np.maximum(x, 0).astype(dtype))


def test_logic_unary_and_bitwise_not():
    check_ort("Not", {"x": RNG.random((2, 3)) < 0.5})
    check_ort("BitwiseNot", {"x": integers(-100, 100, 2, 3, dtype=np.int16)})
    check_ort("BitwiseNot", {"x": integers(0, 255, 2, 3, dtype=np.uint8)})


def test_is_nan_and_is_inf():
    x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0, -2.0], dtype=np.float32)
    check_ort("IsNaN", {"x": x})
    for positive, negative in ((1, 1), (1, 0), (0, 1)):
        check_ort("IsInf", {"x": x}, detect_positive=positive, detect_negative=negative)
    check_ort("IsInf", {"x": x.astype(np.float64)})
    # detecting neither gives a constant, which the simulator cannot output yet: interpret it
    model = make_model("IsInf", {"x": x}, detect_positive=0, detect_negative=0)
    np.testing.assert_array_equal(interpret(model, {"x": x})[0], np.zeros(6, bool))


# ---------------------------------------------------------------------------------------------
# Binary arithmetic, comparisons, logic
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.float16, np.int8, np.uint16, np.int32, np.int64]
)
def test_arithmetic_broadcasts(dtype):
    a = integers(-20, 20, 2, 3, 4).astype(dtype) if dtype != np.uint16 else integers(0, 40, 2, 3, 4)
    b = integers(1, 6, 3, 1).astype(dtype)
    a = a.astype(dtype)
    for op in ("Add", "Sub", "Mul", "Div"):
        check_ort(op, {"a": a, "b": b}, rtol=1e-3)


def test_integer_division_truncates_toward_zero():
    a = np.array([-7, 7, -7, 7, -1], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3], dtype=np.int32)
    check_numpy("Div", {"a": a, "b": b}, np.array([-3, 3, 3, -3, 0], dtype=np.int32))


@pytest.mark.parametrize(
    ("x_type", "y_type"),
    [
        (np.float32, np.float32),
        (np.float32, np.int64),
        (np.int64, np.float32),
        (np.int32, np.int32),
        (np.float64, np.int32),
    ],
)
def test_pow_mixed_types(x_type, y_type):
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=x_type)
    y = np.array([2, 3, 1], dtype=y_type)
    check_ort("Pow", {"a": x, "b": y}, rtol=1e-6)


def test_pow_with_an_unsigned_exponent():
    x, y = normal(2, 3), np.array([2, 3, 1], np.uint32)
    check_numpy("Pow", {"a": x, "b": y}, np.power(x, y).astype(np.float32))


def test_pow_in_float_keeps_fractional_exponents():
    x = uniform(0.5, 3, 2, 3)
    check_ort("Pow", {"a": x, "b": np.array(0.5, np.float32)})


@pytest.mark.parametrize("op", ["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8])
def test_comparisons(op, dtype):
    a = integers(0, 4, 3, 4).astype(dtype)
    b = integers(0, 4, 4).astype(dtype)
    check_ort(op, {"a": a, "b": b})


def test_comparisons_with_nan_are_false():
    a = np.array([np.nan, 1.0, np.nan], dtype=np.float32)
    b = np.array([1.0, np.nan, np.nan], dtype=np.float32)
    for op in ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"):
        check_ort(op, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    check_ort(op, {"a": RNG.random((2, 3, 4)) < 0.5, "b": RNG.random((3, 1)) < 0.5})


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int64])
def test_bitwise(op, dtype):
    a = integers(0, 200, 2, 3, dtype=dtype)
    b = integers(0, 200, 3, dtype=dtype)
    check_ort(op, {"a": a, "b": b})


def test_where_broadcasts_all_three():
    cond = RNG.random((3, 1)) < 0.5
    check_ort("Where", {"c": cond, "a": normal(1, 4), "b": normal(3, 4)})
    check_ort("Where", {"c": cond, "a": integers(0, 9, 4), "b": integers(0, 9, 1)})


def test_mod():
    a = np.array([-4, 7, 5, 4, -7, 8], dtype=np.int32)
    b = np.array([2, -3, 8, -2, 3, 5], dtype=np.int32)
    check_ort("Mod", {"a": a, "b": b})
    check_ort("Mod", {"a": a, "b": b}, fmod=1)
    x = np.array([-4.3, 7.2, 5.0, 4.3, -7.2, 8.0], dtype=np.float32)
    y = np.array([2.1, -3.4, 8.0, -2.1, 3.4, 5.0], dtype=np.float32)
    check_ort("Mod", {"a": x, "b": y}, fmod=1)
    check_numpy("Mod", {"a": x, "b": y}, np.mod(x, y), opset=28, fmod=0)
    check_numpy("Mod", {"a": a, "b": np.array([7], np.int32)}, np.mod(a, 7))


def test_mod_errors():
    x = np.ones(3, np.float32)
    message = import_error("Mod", {"a": x, "b": x}, opset=13)
    assert "node 'n' (Mod): attribute fmod=0 is not supported for floating-point inputs" in message
    assert "fmod=2 is not supported" in import_error("Mod", {"a": x, "b": x}, fmod=2)


def test_bit_shift():
    x = np.array([16, 4, 1, 255], dtype=np.uint8)
    y = np.array([1, 2, 3, 8], dtype=np.uint8)
    check_numpy("BitShift", {"a": x, "b": y}, np.array([32, 16, 8, 0], np.uint8), direction="LEFT")
    check_numpy("BitShift", {"a": x, "b": y}, np.array([8, 1, 0, 0], np.uint8), direction="RIGHT")
    x = np.array([-8, 4, -1, 64, -128], dtype=np.int8)
    y = np.array([8, 9, -1, 1, 1], dtype=np.int8)
    left, right = [0, 0, 0, -128, 0], [-1, 0, -1, 32, -64]
    check_numpy("BitShift", {"a": x, "b": y}, np.array(left, np.int8), opset=28, direction="LEFT")
    check_numpy("BitShift", {"a": x, "b": y}, np.array(right, np.int8), opset=28, direction="RIGHT")
    x32 = np.array([-8, 4, 1 << 30, -1], dtype=np.int32)
    y32 = np.array([32, 31, 1, 100], dtype=np.int32)
    want = np.array([-1, 0, 1 << 29, -1], np.int32)
    check_numpy("BitShift", {"a": x32, "b": y32}, want, opset=28, direction="RIGHT")


def test_bit_shift_needs_a_direction():
    x = np.ones(3, np.uint8)
    message = import_error("BitShift", {"a": x, "b": x}, direction="UP")
    assert "node 'n' (BitShift): attribute direction=UP is not supported" in message


# ---------------------------------------------------------------------------------------------
# Legacy broadcasting (opsets 1 to 6)
# ---------------------------------------------------------------------------------------------


def test_legacy_broadcast_along_an_axis():
    a, b = normal(2, 3, 4, 5), normal(3, 4)
    want = a + b.reshape(3, 4, 1)
    check_numpy("Add", {"a": a, "b": b}, want, opset=6, broadcast=1, axis=1)
    check_numpy("Mul", {"a": a, "b": b[:, :1].ravel()[:1]}, a * b[0, 0], opset=6, broadcast=1)
    c = normal(4, 5)
    check_numpy("Sub", {"a": a, "b": c}, a - c, opset=6, broadcast=1)
    p = uniform(0.5, 2, 2, 3)
    e = np.array([2.0, 3.0], np.float32)
    check_numpy("Pow", {"a": p, "b": e}, p ** e.reshape(2, 1), opset=6, broadcast=1, axis=0)


def test_legacy_comparison_and_logic_broadcast():
    a, b = integers(0, 3, 2, 3).astype(np.float32), np.array([1, 2, 0], np.float32)
    check_numpy("Greater", {"a": a, "b": b}, a > b, opset=6, broadcast=1)
    check_numpy("Less", {"a": a, "b": b}, a < b, opset=1, broadcast=1)
    p, q = RNG.random((2, 3)) < 0.5, np.array([True, False])
    check_numpy("And", {"a": p, "b": q}, p & q.reshape(2, 1), opset=6, broadcast=1, axis=0)


def test_legacy_broadcast_needs_the_attribute():
    a, b = normal(2, 3), normal(3)
    message = import_error("Add", {"a": a, "b": b}, opset=6)
    assert "node 'n' (Add): inputs of shapes (2, 3) and (3,) differ and broadcast=0" in message
    message = import_error("Add", {"a": a, "b": normal(2)}, opset=6, broadcast=1)
    assert "does not match A (2, 3)" in message


# ---------------------------------------------------------------------------------------------
# Variadic ops
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic(op):
    inputs = {"a": normal(3, 1, 4), "b": normal(2, 1), "c": normal(4)}
    check_ort(op, inputs)
    check_ort(op, {"a": normal(2, 3)})
    check_ort(op, {"a": normal(2, 3), "b": normal(2, 3)})


@pytest.mark.parametrize("dtype", [np.int8, np.uint32, np.int64, np.float16])
def test_variadic_integers(dtype):
    inputs = {"a": integers(0, 50, 2, 3).astype(dtype), "b": integers(0, 50, 3).astype(dtype)}
    for op in ("Max", "Min"):
        check_ort(op, inputs)


def test_variadic_before_opset_8_needs_one_shape():
    a, b = normal(2, 3), normal(2, 3)
    check_numpy("Sum", {"a": a, "b": b}, a + b, opset=6)
    message = import_error("Max", {"a": a, "b": normal(3)}, opset=6)
    assert "node 'n' (Max): inputs have different shapes ((2, 3), (3,))" in message


# ---------------------------------------------------------------------------------------------
# Clip
# ---------------------------------------------------------------------------------------------


def test_clip_with_bound_inputs():
    x = normal(3, 4) * 3
    low, high = np.array(-1.0, np.float32), np.array(1.5, np.float32)
    check_ort("Clip", {"x": x, "lo": low, "hi": high})
    check_ort("Clip", {"x": x, "lo": low})
    model = make_model("Clip", {"x": x, "hi": high}, input_names=["x", "", "hi"])
    assert_same(run_cgc(model, {"x": x, "hi": high}), [np.minimum(x, high)])
    check_ort("Clip", {"x": x, "lo": high, "hi": low})  # min > max: every value is max


def test_clip_integers_and_missing_bounds():
    x = integers(-100, 100, 3, 4, dtype=np.int8)
    check_ort("Clip", {"x": x, "lo": np.array(-5, np.int8), "hi": np.array(7, np.int8)})
    check_ort("Clip", {"x": x})
    inf = np.array([np.inf, -np.inf, np.nan, 1.0], np.float32)
    check_numpy("Clip", {"x": inf}, inf, opset=13)


def test_clip_attributes_before_opset_11():
    x = np.array([-3.0, -0.5, 0.5, 3.0, np.inf], np.float32)
    check_numpy("Clip", {"x": x}, np.clip(x, -1, 2), opset=6, min=-1.0, max=2.0)
    flt_max = np.finfo(np.float32).max
    check_numpy("Clip", {"x": x}, np.clip(x, -flt_max, flt_max), opset=6)
    check_numpy("Clip", {"x": x}, np.minimum(x, 0.25), opset=1, max=0.25)
    check_numpy("Clip", {"x": x}, x, opset=1)
    half = x.astype(np.float16)  # the default bounds lie beyond float16's range
    check_numpy("Clip", {"x": half}, half, opset=6)


# ---------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("Elu", {}),
        ("Elu", {"alpha": 0.5}),
        ("Selu", {}),
        ("Selu", {"alpha": 2.0, "gamma": 3.0}),
        ("Celu", {"alpha": 2.0}),
        ("LeakyRelu", {}),
        ("LeakyRelu", {"alpha": 0.2}),
        ("ThresholdedRelu", {"alpha": 0.5}),
        ("HardSigmoid", {}),
        ("HardSigmoid", {"alpha": 0.5, "beta": 0.6}),
        ("HardSwish", {}),
        ("Softplus", {}),
        ("Softsign", {}),
        ("Mish", {}),
        ("Gelu", {}),
        ("Gelu", {"approximate": "tanh"}),
        ("Shrink", {}),
        ("Shrink", {"lambd": 1.0, "bias": 0.5}),
    ],
)
def test_activations(op, attrs):
    x = (normal(3, 4) * 3).astype(np.float32)
    check_ort(op, {"x": x}, rtol=1e-5, atol=1e-6, **attrs)


@pytest.mark.parametrize("op", ["Elu", "Selu", "Celu", "Softplus", "Mish", "HardSwish", "Gelu"])
def test_activations_in_half_precision_round_once(op):
    x = np.array([-3.0, -0.5, -0.01, 0.0, 0.5, 3.0], dtype=np.float16)
    model = make_model(op, {"x": x})
    want = run_onnxruntime(make_model(op, {"x": x.astype(np.float32)}), {"x": x.astype(np.float32)})
    assert_same(run_cgc(model, {"x": x}), [want[0].astype(np.float16)], rtol=1e-3, atol=1e-4)


def test_activations_on_large_inputs_do_not_overflow():
    x = np.array([-100.0, 100.0, 1000.0], dtype=np.float32)
    check_numpy("Softplus", {"x": x}, np.array([0.0, 100.0, 1000.0], np.float32), opset=22)
    check_numpy("Elu", {"x": x}, np.array([-1.0, 100.0, 1000.0], np.float32), opset=22)


def test_swish():
    x = normal(2, 5)
    want = x / (1 + np.exp(-0.5 * x))
    check_numpy("Swish", {"x": x}, want.astype(np.float32), opset=24, alpha=0.5)


def test_selu_defaults_of_opset_1():
    x = np.array([-1.0, 2.0], np.float32)
    alpha, gamma = 1.673200011253357, 1.0506999492645264
    want = np.where(x > 0, gamma * x, gamma * alpha * (np.exp(x) - 1)).astype(np.float32)
    check_numpy("Selu", {"x": x}, want, opset=1)


def test_shrink_on_integers_truncates():
    x = np.arange(-5, 6, dtype=np.int32)
    want = np.where(x < -1.5, x + 1.5, np.where(x > 1.5, x - 1.5, 0)).astype(np.int32)
    check_numpy("Shrink", {"x": x}, want, lambd=1.5, bias=1.5)


@pytest.mark.parametrize("slope_shape", [(1,), (5,), (4, 1), (3, 4, 5)])
def test_prelu_broadcasts_the_slope(slope_shape):
    check_ort("PRelu", {"x": normal(3, 4, 5), "slope": normal(*slope_shape)})


def test_prelu_before_opset_7():
    x, slope = normal(2, 3), np.array([0.25], np.float32)
    check_numpy("PRelu", {"x": x, "s": slope}, np.where(x < 0, 0.25 * x, x), opset=6)
    message = import_error("PRelu", {"x": x, "s": normal(3)}, opset=6)
    assert "node 'n' (PRelu): slope (3,) must have X's shape (2, 3) or one element" in message


def test_gelu_rejects_unknown_approximations():
    message = import_error("Gelu", {"x": normal(2)}, opset=20, approximate="sigmoid")
    assert "node 'n' (Gelu): attribute approximate=sigmoid is not supported" in message


# ---------------------------------------------------------------------------------------------
# Casts
# ---------------------------------------------------------------------------------------------

CAST_VALUES = np.array([0.47, -2.5, 3.75, 1000.0, -1e-7, 0.0, np.nan, np.inf, -np.inf])


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (np.float32, np.float16),
        (np.float32, np.float64),
        (np.float16, np.float32),
        (np.float64, np.float16),
        (np.float32, ml_dtypes.bfloat16),
        (ml_dtypes.bfloat16, np.float32),
        (np.float32, np.bool_),
        (np.bool_, np.float32),
        (np.int32, np.float32),
        (np.int16, np.int8),
        (np.int64, np.uint8),
        (np.uint8, np.int32),
        (np.int8, np.bool_),
    ],
)
def test_cast(source, target):
    if np.dtype(source).kind in "iub":
        x = np.array([0, 1, -3, 200, 127, -128, 5], dtype=np.int64).astype(source)
    else:
        x = CAST_VALUES.astype(np.float32).astype(source)
    to = helper.np_dtype_to_tensor_dtype(np.dtype(target))
    check_numpy("Cast", {"x": x}, x.astype(target), to=to)


FLOAT8 = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"]


@pytest.mark.parametrize("target", FLOAT8)
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_to_float8(target, saturate):
    x = CAST_VALUES.astype(np.float32)
    dtype = np.dtype(getattr(ml_dtypes, target))
    if saturate:
        info = ml_dtypes.finfo(dtype)
        want = np.where(np.isnan(x), x, np.clip(x, float(info.min), float(info.max)))
        want = want.astype(dtype)
    else:
        want = x.astype(dtype)
    to = helper.np_dtype_to_tensor_dtype(dtype)
    check_numpy("Cast", {"x": x}, want, opset=21, to=to, saturate=saturate)
    back = want.astype(np.float32)
    check_numpy("Cast", {"x": want}, back, opset=21, to=TensorProto.FLOAT)


@pytest.mark.parametrize("target", ["int4", "uint4", "int2", "uint2", "float4_e2m1fn"])
def test_cast_to_narrow_types(target):
    x = np.arange(-9, 10).astype(np.float32) * 0.75
    dtype = np.dtype(getattr(ml_dtypes, target))
    to = helper.np_dtype_to_tensor_dtype(dtype)
    check_numpy("Cast", {"x": x}, x.astype(dtype), opset=25, to=to)


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
def test_cast_to_float8e8m0_rounds_to_powers_of_two(round_mode):
    from onnx.numpy_helper import to_float8e8m0

    x = np.array([0.0, 0.124, 0.25, 0.5, 1.1, 1.5, 1.49, 2.0, 3.0, 6.0, 1e30, 1e-30], np.float32)
    want = to_float8e8m0(x, saturate=True, round_mode=round_mode)
    to = TensorProto.FLOAT8E8M0
    check_numpy("Cast", {"x": x}, want, opset=25, to=to, round_mode=round_mode)


def test_cast_to_float8e8m0_without_saturation_overflows_to_nan():
    x = np.array([3e38, 1.0], np.float32)
    want = np.array([np.nan, 1.0], np.float32).astype(ml_dtypes.float8_e8m0fnu)
    to = TensorProto.FLOAT8E8M0
    check_numpy("Cast", {"x": x}, want, opset=25, to=to, saturate=0)


def test_cast_to_the_same_type_and_by_type_name_in_opset_1():
    x = normal(2, 3)
    check_numpy("Cast", {"x": x}, x, to=TensorProto.FLOAT)
    check_numpy("Cast", {"x": x}, x.astype(np.float64), opset=1, to="DOUBLE")
    check_numpy("Cast", {"x": x}, x.astype(np.int32), opset=1, to="int32")


def test_cast_like_takes_the_type_of_its_second_input():
    x = normal(2, 3) * 10
    like = np.ones((2,), np.int32)
    check_numpy("CastLike", {"x": x, "like": like}, x.astype(np.int32))
    like16 = np.ones((1,), np.float16)
    check_numpy("CastLike", {"x": x, "like": like16}, x.astype(np.float16), rtol=1e-3)


def test_cast_errors():
    x = normal(2)
    message = import_error("Cast", {"x": x}, to=TensorProto.STRING)
    assert "node 'n' (Cast): attribute to=STRING is not supported (cgc has no string tensors)" in (
        message
    )
    assert "to=COMPLEX64 is not supported" in import_error("Cast", {"x": x}, to=14)
    assert "to=BOGUS is not supported" in import_error("Cast", {"x": x}, opset=1, to="BOGUS")
    assert "round_mode=odd is not supported" in import_error(
        "Cast", {"x": x}, opset=25, to=TensorProto.FLOAT16, round_mode="odd"
    )


@pytest.mark.parametrize(
    ("source", "target"),
    [(np.int8, np.uint8), (np.uint32, np.int32), (np.uint16, np.int16), (np.bool_, np.uint8),
     (np.float32, np.int32), (np.int64, np.float64), (np.float16, np.uint16)],
)  # fmt: skip
def test_bit_cast(source, target):
    if np.dtype(source).kind == "f":
        x = np.array([0, 1.5, -2.25, 3e3, -0.0, np.inf, -np.inf, np.nan], dtype=source)
    else:
        x = np.array([0, 1, -1, -128, 127, 255, 65535, 4294967295]).astype(source)
    to = helper.np_dtype_to_tensor_dtype(np.dtype(target))
    check_numpy("BitCast", {"x": x}, x.view(target), opset=26, to=to)


def test_bit_cast_errors():
    x = normal(3)
    message = import_error("BitCast", {"x": x}, opset=26, to=TensorProto.INT16)
    assert "attribute to=int16 is not supported (16 bits; the input has 32)" in message


# ---------------------------------------------------------------------------------------------
# Identity and Dropout
# ---------------------------------------------------------------------------------------------


def test_identity():
    x = integers(0, 9, 2, 3)
    check_ort("Identity", {"x": x})


@pytest.mark.parametrize("opset", [7, 10, 12, 22])
def test_dropout_in_inference_is_the_identity(opset):
    x = normal(2, 3)
    check_numpy("Dropout", {"x": x}, x, opset=opset)
    model = make_model("Dropout", {"x": x}, opset=opset, outputs=("y", "mask"))
    y, mask = interpret(model, {"x": x})
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == (np.float32 if opset < 10 else np.bool_)
    assert mask.shape == x.shape and np.all(mask)


def test_dropout_with_a_zero_ratio_or_no_training():
    x = normal(2, 3)
    model = make_model(
        "Dropout", {"x": x, "r": np.array(0.0, np.float32), "t": np.array(True)}, opset=13
    )
    inputs = {"x": x, "r": np.array(0.0, np.float32), "t": np.array(True)}
    assert_same(run_cgc(model, inputs), [x])
    inputs = {"x": x, "r": np.array(0.5, np.float32), "t": np.array(False)}
    assert_same(run_cgc(model, inputs), [x])


def test_dropout_at_runtime_is_nan_where_it_would_be_random():
    x = normal(2, 3)
    inputs = {"x": x, "r": np.array(0.5, np.float32), "t": np.array(True)}
    (y,) = run_cgc(make_model("Dropout", inputs, opset=13), inputs)
    assert np.isnan(y).all()


def test_dropout_errors_for_random_masks():
    x = normal(2, 3)
    ratio = helper.make_tensor("r", TensorProto.FLOAT, (), [0.5])
    training = helper.make_tensor("t", TensorProto.BOOL, (), [True])
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y"], name="n")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3))],
        initializer=[ratio, training],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
    with pytest.raises(CgcError, match=r"node 'n' \(Dropout\): training_mode=true with ratio=0.5"):
        import_model(model)
    message = import_error("Dropout", {"x": x}, opset=6)
    assert "node 'n' (Dropout): is_test=0 (training) with ratio=0.5: random dropout" in message
    assert "model.eval() before export" in message  # how to turn it off
    check_numpy("Dropout", {"x": x}, x, opset=6, is_test=1)
    check_numpy("Dropout", {"x": x}, x, opset=6, ratio=0.0)


def test_unary_ops_fold_constants():
    model = onnx.parser.parse_model(
        """<ir_version: 10, opset_import: ["" : 21]>
        g (float[3] x) => (float[3] y) {
            c = Constant <value = float[3] {1.0, 4.0, 9.0}> ()
            s = Sqrt(c)
            y = Add(x, s)
        }"""
    )
    imported = import_model(model)
    names = [op.name for op in main_function(imported.module).body.block.ops]
    assert "wse.sqrt" not in names
    x = np.array([1.0, 1.0, 1.0], np.float32)
    assert_same(run_cgc(model, {"x": x}), [np.array([2.0, 3.0, 4.0], np.float32)])


def test_gelu_tanh_at_one():
    x = np.array([1.0], np.float32)
    inner = math.sqrt(2 / math.pi) * (1.0 + 0.044715)
    want = np.array([0.5 * (1 + math.tanh(inner))], np.float32)
    check_numpy("Gelu", {"x": x}, want, opset=20, approximate="tanh")
