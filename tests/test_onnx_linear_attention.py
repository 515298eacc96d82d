"""The ONNX linear-algebra, attention and quantization importers through the whole compiler and
simulator, against onnxruntime (or a numpy reference where onnxruntime lacks the op)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import run_onnxruntime
from onnx import TensorProto, helper

import cgc.tools.backend
from cgc.errors import CgcError
from cgc.frontends.onnx import import_model


def graph_model(node, inputs: dict, outputs: dict | list, opset: int):
    """A one-node model; ``outputs`` maps names to arrays (typed outputs) or lists names."""
    ins = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for name, a in inputs.items()
    ]
    if isinstance(outputs, dict):
        outs = [
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for name, a in outputs.items()
        ]
    else:
        outs = [helper.make_value_info(name, helper.TypeProto()) for name in outputs]
    graph = helper.make_graph([node], "test", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def ort_outputs(node, inputs: dict, opset: int) -> list[np.ndarray]:
    """The node's outputs computed by onnxruntime."""
    names = [n for n in node.output if n]
    model = graph_model(node, inputs, names, opset)
    return run_onnxruntime(model, inputs)


def cgc_outputs(node, inputs: dict, expected: list[np.ndarray], opset: int) -> list:
    """The node's outputs computed by cgc (outputs typed like ``expected``)."""
    names = [n for n in node.output if n]
    model = graph_model(node, inputs, dict(zip(names, expected, strict=True)), opset)
    return list(cgc.tools.backend.run_model(model, list(inputs.values())))


def check(node, inputs: dict, opset: int, expected=None, rtol=1e-5, atol=1e-6) -> None:
    """cgc's outputs equal ``expected`` (onnxruntime's when not given): dtype, shape, values."""
    expected = ort_outputs(node, inputs, opset) if expected is None else expected
    got = cgc_outputs(node, inputs, expected, opset)
    for g, w in zip(got, expected, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)


def fails(node, inputs: dict, outputs: dict, opset: int, message: str) -> None:
    """Importing the node fails with a one-line error naming it and ``message``."""
    model = graph_model(node, inputs, outputs, opset)
    with pytest.raises(CgcError, match=message) as error:
        import_model(model)
    assert f"node '{node.name}' ({node.op_type})" in str(error.value)


def rand(*shape, seed=0, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def node(op: str, inputs: list[str], outputs: list[str], **attrs):
    return helper.make_node(op, inputs, outputs, name="n", **attrs)


# ---------------------------------------------------------------------------------------------
# Gemm, MatMul, Einsum, Det, SwiGLU
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [1, 6])
def test_gemm_old_broadcast_attribute(opset):
    a, b, c = rand(3, 4), rand(4, 5, seed=1), rand(5, seed=2)
    gemm = node("Gemm", ["a", "b", "c"], ["y"], broadcast=1, alpha=0.5, beta=2.0)
    check(gemm, {"a": a, "b": b, "c": c}, opset, [0.5 * a @ b + 2.0 * c])
    plain = node("Gemm", ["a", "b", "c"], ["y"])
    fails(plain, {"a": a, "b": b, "c": c}, {"y": a @ b}, opset, r"C \(5,\) must have")
    full = {"a": a, "b": b, "c": rand(3, 5, seed=3)}
    check(plain, full, opset, [a @ b + full["c"]])


def test_gemm_optional_c_and_integers():
    a, b = rand(4, 3), rand(5, 4, seed=1)
    check(node("Gemm", ["a", "b"], ["y"], transA=1, transB=1), {"a": a, "b": b}, 13)
    ints = {"a": np.arange(12, dtype=np.int32).reshape(3, 4), "b": np.ones((4, 2), np.int32)}
    ints["c"] = np.array([1, -1], np.int32)
    expected = (ints["a"] @ ints["b"] * 2 + ints["c"] * 3).astype(np.int32)
    check(node("Gemm", ["a", "b", "c"], ["y"], alpha=2.0, beta=3.0), ints, 13, [expected])
    fractions = node("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=0.75)
    expected = (ints["a"] @ ints["b"] * 0.5 + ints["c"] * 0.75).astype(np.int32)
    check(fractions, ints, 13, [expected])
    fails(node("Gemm", ["a", "b"], ["y"]), {"a": a.T, "b": b.T}, {"y": a.T @ b.T}, 9, "'C'")


def test_gemm_beta_zero_ignores_c():
    a, b = rand(3, 4), rand(4, 5, seed=1)
    c = np.full((3, 5), np.nan, np.float32)
    check(node("Gemm", ["a", "b", "c"], ["y"], beta=0.0), {"a": a, "b": b, "c": c}, 13, [a @ b])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_matmul_integers(dtype):
    a = np.arange(24, dtype=dtype).reshape(2, 3, 4) - 10
    b = np.arange(8, dtype=dtype).reshape(4, 2)
    check(node("MatMul", ["a", "b"], ["y"]), {"a": a, "b": b}, 13)


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("ij,jk->ik", [(3, 4), (4, 5)]),
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("ii->i", [(4, 4)]),
        ("ii", [(4, 4)]),
        ("bii->bi", [(2, 3, 3)]),
        ("iij,jk->ik", [(3, 3, 4), (4, 2)]),
        ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
        ("i,j->ij", [(3,), (4,)]),
        ("i,i", [(5,), (5,)]),
        ("ij->", [(3, 4)]),
        ("abc->cab", [(2, 3, 4)]),
        ("ij,jk", [(3, 4), (4, 2)]),
        ("ab,ab->ab", [(3, 4), (3, 4)]),
        ("ba , ab -> ", [(3, 4), (4, 3)]),
        ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
        ("...a,a->...", [(2, 3, 4), (4,)]),
        ("Ab,bA->A", [(3, 4), (4, 3)]),
    ],
)
def test_einsum(equation, shapes):
    inputs = {f"x{i}": rand(*s, seed=i) for i, s in enumerate(shapes)}
    expected = np.einsum(equation.replace(" ", ""), *inputs.values())
    einsum = node("Einsum", list(inputs), ["y"], equation=equation)
    check(einsum, inputs, 12, [np.asarray(expected, np.float32)], rtol=1e-4, atol=1e-5)


def test_einsum_integers_and_errors():
    inputs = {"a": np.arange(6, dtype=np.int64).reshape(2, 3), "b": np.ones((3, 2), np.int64)}
    check(node("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik"), inputs, 12)
    bad = node("Einsum", ["a", "b"], ["y"], equation="ijk,jk->ik")
    fails(bad, inputs, {"y": inputs["a"]}, 12, "attribute equation=ijk,jk->ik is not supported")


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (5, 5), (2, 2), (1, 1)])
def test_det(shape):
    x = rand(*shape)
    check(node("Det", ["x"], ["y"]), {"x": x}, 22, [np.linalg.det(x).astype(np.float32)], 1e-4)


def test_det_singular_and_pivoting():
    singular = np.array([[1, 2, 3], [2, 4, 6], [1, 0, 1]], np.float32)
    needs_pivot = np.array([[0, 1, 2], [1, 0, 3], [4, -3, 8]], np.float32)
    x = np.stack([singular, needs_pivot])
    check(node("Det", ["x"], ["y"]), {"x": x}, 11, [np.linalg.det(x).astype(np.float32)], 1e-5)
    fails(node("Det", ["x"], ["y"]), {"x": rand(2, 3)}, {"y": rand(1)}, 11, "not a batch")


@pytest.mark.parametrize("alpha", [None, 1.7])
def test_swiglu(alpha):
    a, b = rand(2, 3, 4), rand(2, 3, 4, seed=1)
    attrs = {} if alpha is None else {"alpha": alpha}
    gate = a / (1 + np.exp(-(alpha or 1.0) * a))
    check(node("SwiGLU", ["a", "b"], ["y"], **attrs), {"a": a, "b": b}, 28, [gate * b], 1e-5)
    fails(node("SwiGLU", ["a", "b"], ["y"]), {"a": a, "b": b[:1]}, {"y": a}, 28, "one shape")


# ---------------------------------------------------------------------------------------------
# Quantization
# ---------------------------------------------------------------------------------------------


def test_quantize_linear_per_tensor_and_axis():
    x = rand(2, 3, 4) * 50
    inputs = {"x": x, "s": np.array(0.7, np.float32), "z": np.array(120, np.uint8)}
    check(node("QuantizeLinear", ["x", "s", "z"], ["y"]), inputs, 10)
    check(node("QuantizeLinear", ["x", "s"], ["y"]), {"x": x, "s": inputs["s"]}, 13)
    per_axis = {"x": x, "s": np.array([0.5, 1.0, 2.0], np.float32)}
    per_axis["z"] = np.array([-3, 0, 5], np.int8)
    check(node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=-2), per_axis, 13)


def test_quantize_linear_blocked_and_output_dtype():
    x = rand(3, 5) * 20
    scale = np.array([[0.5, 2.0, 1.0], [1.5, 0.25, 3.0], [1.0, 1.0, 0.75]], np.float32)
    zp = np.array([[1, -2, 0], [3, 4, -5], [0, 7, -8]], np.int8)
    blocked = node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1, block_size=2)
    repeated = np.repeat(scale, 2, axis=1)[:, :5]
    expected = np.clip(np.rint(x / repeated) + np.repeat(zp, 2, axis=1)[:, :5], -128, 127)
    inputs = {"x": x, "s": scale, "z": zp}
    check(blocked, inputs, 21, [expected.astype(np.int8)])
    int16 = node("QuantizeLinear", ["x", "s"], ["y"], output_dtype=TensorProto.INT16)
    inputs = {"x": x * 1000, "s": np.array(0.3, np.float32)}
    check(int16, inputs, 21, [np.clip(np.rint(x * 1000 / np.float32(0.3)), -32768, 32767)
                              .astype(np.int16)])  # fmt: skip
    clash = node("QuantizeLinear", ["x", "s", "z"], ["y"], output_dtype=TensorProto.INT16)
    inputs = {"x": x, "s": np.array(0.3, np.float32), "z": np.array(1, np.uint8)}
    fails(clash, inputs, {"y": x.astype(np.int16)}, 21, "output_dtype=5 is not supported")


@pytest.mark.parametrize("dtype", ["int4", "uint4", "int2", "float4_e2m1fn"])
def test_quantize_linear_narrow_types(dtype):
    x = np.linspace(-20, 20, 12, dtype=np.float32).reshape(3, 4)
    target = np.dtype(getattr(ml_dtypes, dtype))
    scale = np.array([1.0, 2.0, 4.0], np.float32)
    zp = np.zeros(3, target)
    quantize = node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=0)
    scaled = x / scale[:, None]
    if dtype.startswith("float"):
        expected = scaled.astype(target)
    else:
        info = ml_dtypes.iinfo(target)
        expected = np.clip(np.rint(scaled), int(info.min), int(info.max)).astype(target)
    check(quantize, {"x": x, "s": scale, "z": zp}, 25, [expected])


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_quantize_linear_float8_saturation(dtype):
    target = np.dtype(getattr(ml_dtypes, dtype))
    x = np.array([0.0, 1.5, -300.0, 1e4, -1e6], np.float32)
    inputs = {"x": x, "s": np.array(2.0, np.float32), "z": np.zeros((), target)}
    low, high = float(ml_dtypes.finfo(target).min), float(ml_dtypes.finfo(target).max)
    for saturate in (0, 1):
        quantize = node("QuantizeLinear", ["x", "s", "z"], ["y"], saturate=saturate)
        scaled = x / 2
        expected = (np.clip(scaled, low, high) if saturate else scaled).astype(target)
        check(quantize, inputs, 19, [expected])


def test_dequantize_linear():
    x = np.arange(24, dtype=np.uint8).reshape(2, 3, 4) * 10
    inputs = {"x": x, "s": np.array([0.5, 1.0, 2.0], np.float32)}
    inputs["z"] = np.array([3, 100, 255], np.uint8)
    check(node("DequantizeLinear", ["x", "s", "z"], ["y"]), inputs, 13)
    scalar = {"x": x, "s": np.array(0.25, np.float32), "z": np.array(7, np.uint8)}
    check(node("DequantizeLinear", ["x", "s", "z"], ["y"]), scalar, 10)
    int32 = {"x": np.array([-70000, 5, 123456], np.int32), "s": np.array(0.5, np.float32)}
    check(node("DequantizeLinear", ["x", "s"], ["y"]), int32, 13)


def test_dequantize_linear_blocked_narrow_and_output_dtype():
    x = np.array([[-8, -3, 0, 2, 7], [1, 2, 3, 4, 5]], ml_dtypes.int4)
    scale = np.array([[0.5, 2.0], [1.0, 4.0]], np.float32)
    zp = np.array([[1, -2], [0, 3]], ml_dtypes.int4)
    blocked = node("DequantizeLinear", ["x", "s", "z"], ["y"], axis=1, block_size=3)
    wide = x.astype(np.float32) - np.repeat(zp, 3, axis=1)[:, :5].astype(np.float32)
    expected = wide * np.repeat(scale, 3, axis=1)[:, :5]
    check(blocked, {"x": x, "s": scale, "z": zp}, 21, [expected])
    half = node("DequantizeLinear", ["x", "s"], ["y"], output_dtype=TensorProto.FLOAT16)
    eight = np.array([0.5, -3.0, 448.0], ml_dtypes.float8_e4m3fn)
    inputs = {"x": eight, "s": np.array(2.0, np.float32)}
    check(half, inputs, 23, [(eight.astype(np.float32) * 2).astype(np.float16)])


def test_dynamic_quantize_linear():
    for x in (rand(3, 4) * 3, np.abs(rand(5)) + 1.0, -np.abs(rand(2, 2)), np.zeros(3, np.float32)):
        quantize = node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zp"])
        check(quantize, {"x": x}, 11)


def test_matmul_integer():
    a = np.random.default_rng(0).integers(0, 255, (3, 4)).astype(np.uint8)
    b = np.random.default_rng(1).integers(-128, 127, (4, 2)).astype(np.int8)
    inputs = {"a": a, "b": b, "za": np.array(3, np.uint8), "zb": np.array(-5, np.int8)}
    check(node("MatMulInteger", ["a", "b", "za", "zb"], ["y"]), inputs, 10)
    check(node("MatMulInteger", ["a", "b"], ["y"]), {"a": a, "b": b}, 10)
    rows, cols = np.array([3, 50, 200], np.uint8), np.array([-5, 7], np.int8)
    expected = (a.astype(np.int32) - rows[:, None]) @ (b.astype(np.int32) - cols)
    inputs = {"a": a, "b": b, "za": rows, "zb": cols}
    check(node("MatMulInteger", ["a", "b", "za", "zb"], ["y"]), inputs, 10, [expected])


@pytest.mark.parametrize("signed", [False, True])
def test_qlinear_matmul(signed):
    dtype, low, high = (np.int8, -128, 127) if signed else (np.uint8, 0, 255)
    rng = np.random.default_rng(2)
    inputs = {
        "a": rng.integers(low, high, (2, 3, 4)).astype(dtype),
        "sa": np.array(0.02, np.float32),
        "za": np.array(5, dtype),
        "b": rng.integers(low, high, (4, 3)).astype(dtype),
        "sb": np.array(0.03, np.float32),
        "zb": np.array(-3 if signed else 130, dtype),
        "sy": np.array(0.5, np.float32),
        "zy": np.array(10, dtype),
    }
    check(node("QLinearMatMul", list(inputs), ["y"]), inputs, 10, atol=1)


def conv2d(x: np.ndarray, w: np.ndarray, pad: int, group: int = 1) -> np.ndarray:
    """A stride-1 2-D integer convolution in int64."""
    padded = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, w.shape[2:], axis=(2, 3))
    per_group, out = x.shape[1] // group, w.shape[0] // group
    parts = [
        np.einsum(
            "nchwij,kcij->nkhw",
            windows[:, g * per_group : (g + 1) * per_group],
            w[g * out : (g + 1) * out].astype(np.int64),
        )
        for g in range(group)
    ]
    return np.concatenate(parts, axis=1)


def test_conv_integer():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = rng.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8)
    inputs = {"x": x, "w": w, "zx": np.array(128, np.uint8), "zw": np.array(100, np.uint8)}
    conv = node("ConvInteger", ["x", "w", "zx", "zw"], ["y"], pads=[1, 1, 1, 1], strides=[2, 1])
    check(conv, inputs, 10)
    per_channel = node("ConvInteger", ["x", "w", "", "zw"], ["y"])
    zw = np.array([1, 2, 3], np.uint8)
    expected = conv2d(x, w.astype(np.int32) - zw.reshape(3, 1, 1, 1), 0).astype(np.int32)
    check(per_channel, {"x": x, "w": w, "zw": zw}, 10, [expected])


def test_qlinear_conv():
    rng = np.random.default_rng(4)
    inputs = {
        "x": rng.integers(0, 255, (1, 2, 6, 6)).astype(np.uint8),
        "sx": np.array(0.01, np.float32),
        "zx": np.array(120, np.uint8),
        "w": rng.integers(-100, 100, (4, 1, 3, 3)).astype(np.int8),
        "sw": np.array([0.02, 0.01, 0.03, 0.05], np.float32),
        "zw": np.zeros(4, np.int8),
        "sy": np.array(0.1, np.float32),
        "zy": np.array(128, np.uint8),
        "bias": np.array([100, -200, 0, 50], np.int32),
    }
    conv = node("QLinearConv", list(inputs), ["y"], group=2, auto_pad="SAME_UPPER")
    # onnxruntime's u8s8 kernel saturates here: compare with numpy instead
    total = conv2d(inputs["x"].astype(np.int32) - 120, inputs["w"], 1, group=2)
    total = total + inputs["bias"].reshape(1, 4, 1, 1)
    factor = np.float32(0.01) * inputs["sw"].reshape(1, 4, 1, 1) / np.float32(0.1)
    expected = np.clip(np.rint(total * factor) + 128, 0, 255).astype(np.uint8)
    check(conv, inputs, 10, [expected])


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


def test_attention_4d_mask_past_and_outputs():
    q, k, v = rand(2, 4, 3, 8), rand(2, 4, 5, 8, seed=1), rand(2, 4, 5, 6, seed=2)
    past_k, past_v = rand(2, 4, 2, 8, seed=3), rand(2, 4, 2, 6, seed=4)
    mask = np.random.default_rng(5).random((3, 7)) > 0.3
    inputs = {"q": q, "k": k, "v": v, "m": mask, "pk": past_k, "pv": past_v}
    # onnxruntime masks with the lowest float, not -inf: compare the scores with a float mask
    for mode, m in ((0, mask), (3, mask), (2, rand(4, 3, 7, seed=6))):
        inputs["m"] = m
        attention = node(
            "Attention",
            list(inputs),
            ["y", "present_k", "present_v", "qk"],
            qk_matmul_output_mode=mode,
            scale=0.3,
        )
        check(attention, inputs, 23, atol=1e-5)


def test_attention_3d_gqa_causal_softcap():
    q, k, v = rand(2, 5, 16), rand(2, 5, 8, seed=1), rand(2, 5, 6, seed=2)
    attention = node(
        "Attention", ["q", "k", "v"], ["y"], q_num_heads=4, kv_num_heads=2, is_causal=1, softcap=2.0
    )
    check(attention, {"q": q, "k": k, "v": v}, 23, atol=1e-5)


def test_attention_3d_with_past_and_present():
    q, k, v = rand(2, 3, 8), rand(2, 3, 8, seed=1), rand(2, 3, 4, seed=2)
    inputs = {"q": q, "k": k, "v": v, "m": rand(3, 5, seed=5)}
    inputs["pk"], inputs["pv"] = rand(2, 2, 2, 4, seed=3), rand(2, 2, 2, 2, seed=4)
    attention = node(
        "Attention",
        list(inputs),
        ["y", "present_k", "present_v", "qk"],
        q_num_heads=2,
        kv_num_heads=2,
        is_causal=1,
        qk_matmul_output_mode=1,
        softcap=1.5,
    )
    check(attention, inputs, 24, atol=1e-5)


def test_attention_float_mask_short_and_softmax_precision():
    q, k, v = (rand(1, 2, 4, 8, seed=i, dtype=np.float16) for i in range(3))
    mask = (rand(2, 4, 3, seed=3) * 0.5).astype(np.float16)
    attention = node("Attention", ["q", "k", "v", "m"], ["y"], softmax_precision=1, is_causal=1)
    inputs = {"q": q, "k": k, "v": v, "m": mask}
    padded = np.concatenate([mask, np.full((2, 4, 1), -np.inf, np.float16)], axis=-1)
    causal = np.where(np.tril(np.ones((4, 4), bool)), 0, -np.inf)
    scores = (q.astype(np.float32) @ k.astype(np.float32).transpose(0, 1, 3, 2)) / np.sqrt(8)
    scores = scores + padded + causal
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = weights.astype(np.float16).astype(np.float32) @ v.astype(np.float32)
    check(attention, inputs, 23, [expected.astype(np.float16)], rtol=5e-3, atol=5e-3)


def reference_attention(q, k, v, bias):
    """Softmax attention with an additive bias; rows masked everywhere give zeros."""
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]) + bias
    empty = np.isneginf(np.max(bias + np.zeros_like(scores), axis=-1, keepdims=True))
    peak = np.where(np.isneginf(scores.max(-1, keepdims=True)), 0, scores.max(-1, keepdims=True))
    weights = np.exp(scores - peak)
    weights = weights / np.maximum(weights.sum(-1, keepdims=True), 1e-30)
    return np.where(empty, 0, weights) @ v


def test_attention_nonpad_kv_seqlen_causal():
    q, k, v = rand(2, 2, 3, 4), rand(2, 2, 6, 4, seed=1), rand(2, 2, 6, 4, seed=2)
    lengths = np.array([6, 2], np.int64)
    attention = node("Attention", ["q", "k", "v", "", "", "", "n"], ["y"], is_causal=1)
    rows, cols = np.arange(3)[:, None], np.arange(6)[None, :]
    offsets = (lengths - 3).reshape(2, 1, 1, 1)
    allowed = (cols <= rows + offsets) & (cols < lengths.reshape(2, 1, 1, 1))
    bias = np.where(allowed, 0.0, -np.inf).astype(np.float32)
    expected = reference_attention(q, k, v, bias).astype(np.float32)
    inputs = {"q": q, "k": k, "v": v, "n": lengths}
    check(attention, inputs, 24, [expected], atol=1e-5)


def test_attention_sliding_window():
    q, k, v = rand(1, 2, 4, 4), rand(1, 2, 6, 4, seed=1), rand(1, 2, 6, 4, seed=2)
    attention = node("Attention", ["q", "k", "v"], ["y"], left_window_size=2, right_window_size=1)
    diff = np.arange(4)[:, None] - np.arange(6)[None, :]
    bias = np.where((diff <= 2) & (-diff <= 1), 0.0, -np.inf).astype(np.float32)
    expected = reference_attention(q, k, v, bias).astype(np.float32)
    check(attention, {"q": q, "k": k, "v": v}, 25, [expected], atol=1e-5)


def test_attention_fully_masked_row_is_zero():
    q, k, v = rand(1, 1, 3, 4), rand(1, 1, 3, 4, seed=1), rand(1, 1, 3, 4, seed=2)
    mask = np.array([[True, False, True], [False, False, False], [True, True, True]])
    attention = node("Attention", ["q", "k", "v", "m"], ["y", "", "", "p"], qk_matmul_output_mode=3)
    bias = np.where(mask, 0.0, -np.inf).astype(np.float32)
    expected = reference_attention(q, k, v, bias).astype(np.float32)
    got = cgc_outputs(
        attention, {"q": q, "k": k, "v": v, "m": mask}, [expected, rand(1, 1, 3, 3)], 23
    )
    np.testing.assert_allclose(got[0], expected, atol=1e-5)
    assert not np.isnan(got[1]).any() and np.all(got[1][0, 0, 1] == 0)


def test_attention_errors():
    q = rand(1, 3, 8)
    inputs = {"q": q, "k": q, "v": q}
    fails(node("Attention", ["q", "k", "v"], ["y"]), inputs, {"y": q}, 23, "q_num_heads")
    heads = {"q_num_heads": 2, "kv_num_heads": 2}
    bad_mode = node("Attention", ["q", "k", "v"], ["y"], qk_matmul_output_mode=7, **heads)
    fails(bad_mode, inputs, {"y": q}, 23, "qk_matmul_output_mode=7")
    uneven = node("Attention", ["q", "k", "v"], ["y"], q_num_heads=2, kv_num_heads=3)
    fails(uneven, inputs, {"y": q}, 23, "heads")
    q4 = rand(1, 2, 3, 4)
    inputs = {"q": q4, "k": q4, "v": q4}
    fails(node("Attention", ["q", "k", "v"], ["y"], **heads), inputs, {"y": q4}, 25, "3-D")
    window = node("Attention", ["q", "k", "v"], ["y"], left_window_size=-2)
    fails(window, inputs, {"y": q4}, 25, "left_window_size=-2")


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"interleaved": 1},
        {"rotary_embedding_dim": 4},
        {"interleaved": 1, "rotary_embedding_dim": 4},
    ],
)
def test_rotary_embedding_position_ids(attrs):
    half = attrs.get("rotary_embedding_dim", 8) // 2
    inputs = {
        "x": rand(2, 3, 5, 8),
        "cos": rand(10, half, seed=1),
        "sin": rand(10, half, seed=2),
        "pos": np.array([[0, 1, 2, 3, 4], [9, 3, 3, 0, 7]], np.int64),
    }
    check(node("RotaryEmbedding", list(inputs), ["y"], **attrs), inputs, 23)


def test_rotary_embedding_3d_without_positions():
    inputs = {"x": rand(2, 5, 12), "cos": rand(2, 5, 2, seed=1), "sin": rand(2, 5, 2, seed=2)}
    rotary = node("RotaryEmbedding", list(inputs), ["y"], num_heads=3, interleaved=1)
    check(rotary, inputs, 23)
    fails(node("RotaryEmbedding", list(inputs), ["y"]), inputs, {"y": inputs["x"]}, 23, "num_heads")


# ---------------------------------------------------------------------------------------------
# LinearAttention
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "decay_width", "beta_width"),
    [("linear", 0, 0), ("gated", 8, 0), ("delta", 0, 1), ("gated_delta", 2, 2)],
)
def test_linear_attention(rule, decay_width, beta_width):
    batch, steps, q_heads, kv_heads, d_k, d_v = 2, 3, 4, 2, 4, 3
    inputs = {
        "q": rand(batch, steps, q_heads * d_k),
        "k": rand(batch, steps, kv_heads * d_k, seed=1) * 0.5,
        "v": rand(batch, steps, kv_heads * d_v, seed=2),
        "s": rand(batch, kv_heads, d_k, d_v, seed=3),
    }
    names = ["q", "k", "v", "s"]
    if decay_width:
        inputs["g"] = -np.abs(rand(batch, steps, decay_width, seed=4))
        names.append("g")
    if beta_width:
        names += [""] * (5 - len(names)) + ["b"]
        inputs["b"] = 1 / (1 + np.exp(-rand(batch, steps, beta_width, seed=5)))
    attention = node(
        "LinearAttention",
        names,
        ["y", "state"],
        q_num_heads=q_heads,
        kv_num_heads=kv_heads,
        update_rule=rule,
    )
    check(attention, inputs, 27, rtol=1e-4, atol=1e-5)


def test_linear_attention_errors():
    x = rand(1, 2, 4)
    inputs = {"q": x, "k": x, "v": x}
    gated = node("LinearAttention", ["q", "k", "v"], ["y", "s"], q_num_heads=1, kv_num_heads=1)
    fails(gated, inputs, {"y": x, "s": rand(1, 1, 4, 4)}, 27, "decay and beta")
    odd = node("LinearAttention", ["q", "k", "v"], ["y", "s"], q_num_heads=3, kv_num_heads=2)
    fails(odd, inputs, {"y": x, "s": rand(1, 2, 2, 2)}, 27, "multiple")
