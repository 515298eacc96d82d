"""ONNX reductions, normalizations and losses through the whole compiler and simulator.

Each model runs through ``cgc.backend`` (import, passes, artifact, simulator) and is compared
with onnxruntime, or with numpy where onnxruntime lacks the op's opset. Most models hold
several nodes, one per attribute variant, so that one compilation covers them all.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from conftest import run_onnxruntime
from onnx import TensorProto, helper, numpy_helper

import cgc.tools.backend
from cgc.errors import CgcError
from cgc.frontends.onnx import import_model

F = TensorProto.FLOAT
F16 = TensorProto.FLOAT16
I32 = TensorProto.INT32
I64 = TensorProto.INT64
BOOL = TensorProto.BOOL


def vi(name: str, dtype: int, shape: Sequence[int] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def init(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def model_of(nodes, inputs, outputs, inits=(), opset=13, check=True) -> onnx.ModelProto:
    """A model whose undeclared output shapes come from shape inference, checked; without
    ``check`` (for ops whose function onnx cannot infer or has deprecated) as given."""
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    if check:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        onnx.checker.check_model(model, full_check=True)
    return model


def run_cgc(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of the compiled model on the simulator."""
    initializers = {t.name for t in model.graph.initializer}
    arrays = [feeds[i.name] for i in model.graph.input if i.name not in initializers]
    if (
        any(n.op_type == "GroupNormalization" for n in model.graph.node)
        and model.opset_import[0].version < 21
    ):
        # onnx's checker, which the backend runs first, rejects the deprecated opset-18 op
        rep = cgc.tools.backend.CgcRep(
            model, cgc.tools.backend.DEFAULT_MODE, cgc.tools.backend.DEFAULT_TARGET
        )
        return list(rep.run(arrays))
    return list(cgc.tools.backend.run_model(model, arrays))


def assert_outputs(got, want, rtol=1e-5, atol=1e-5) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        w = np.asarray(w)
        assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype}, expected {w.dtype}"
        assert g.shape == w.shape, f"output {i}: shape {g.shape}, expected {w.shape}"
        np.testing.assert_allclose(
            g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, err_msg=f"output {i}"
        )


def check_with_ort(model, feeds, rtol=1e-5, atol=1e-5) -> None:
    assert_outputs(run_cgc(model, feeds), run_onnxruntime(model, feeds), rtol, atol)


def import_error(model: onnx.ModelProto) -> str:
    with pytest.raises(CgcError) as info:
        import_model(model)
    return str(info.value)


def rand(*shape, low=-2.0, high=2.0, seed=0, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(dtype)


def variants(op: str, inputs: list[str], attrs_list: list[dict]) -> list[onnx.NodeProto]:
    """One node of ``op`` per attribute set, with outputs y0, y1, ..."""
    return [
        helper.make_node(op, inputs, [f"y{i}"], name=f"n{i}", **attrs)
        for i, attrs in enumerate(attrs_list)
    ]


# ---------------------------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------------------------

REDUCE_OPS = [
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
]  # fmt: skip


def reduce_data(op: str) -> np.ndarray:
    """Positive data for the log-sum (its sums must be positive), signed data otherwise."""
    low = 0.2 if op == "ReduceLogSum" else -2.0
    return rand(2, 3, 4, low=low, seed=len(op))


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_axes_attribute(op):
    """Before opset 18 (13 for ReduceSum) the axes are an attribute; none means all axes."""
    attrs = [{"axes": [1]}, {"axes": [-1, 0], "keepdims": 0}, {}, {"keepdims": 0}]
    outputs = [vi(f"y{i}", F) for i in range(len(attrs))]
    model = model_of(variants(op, ["x"], attrs), [vi("x", F, (2, 3, 4))], outputs, opset=11)
    check_with_ort(model, {"x": reduce_data(op)})


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_axes_input(op):
    """From opset 18 (13 for ReduceSum) the axes are an input; empty or missing axes reduce
    every axis, or nothing with noop_with_empty_axes."""
    opset = 13 if op == "ReduceSum" else 18
    nodes = [
        helper.make_node(op, ["x", "ax12"], ["y0"]),
        helper.make_node(op, ["x", "ax_neg"], ["y1"], keepdims=0),
        helper.make_node(op, ["x", "ax_empty"], ["y2"]),
        helper.make_node(op, ["x", "ax_empty"], ["y3"], noop_with_empty_axes=1),
        helper.make_node(op, ["x"], ["y4"], keepdims=0),
        helper.make_node(op, ["x"], ["y5"], noop_with_empty_axes=1),
    ]
    inits = [
        init("ax12", np.array([1, 2], np.int64)),
        init("ax_neg", np.array([-2], np.int64)),
        init("ax_empty", np.zeros(0, np.int64)),
    ]
    outputs = [vi(f"y{i}", F) for i in range(len(nodes))]
    model = model_of(nodes, [vi("x", F, (2, 3, 4))], outputs, inits, opset=opset)
    check_with_ort(model, {"x": reduce_data(op)})


@pytest.mark.parametrize("op", ["ReduceL2", "ReduceLogSumExp", "ReduceSumSquare", "ReduceL1"])
def test_reduce_integers(op):
    """Sqrt, log and exp of integer data are computed on floats and truncated back."""
    axes = init("axes", np.array([1], np.int64))
    node = helper.make_node(op, ["x", "axes"], ["y"])
    model = model_of([node], [vi("x", I32, (3, 4))], [vi("y", I32)], [axes], opset=18)
    x = np.random.default_rng(1).integers(-3, 4, (3, 4)).astype(np.int32)
    check_with_ort(model, {"x": x})


def test_reduce_max_min_of_booleans():
    """Opset 20 reduces booleans, with False < True."""
    axes = init("axes", np.array([1], np.int64))
    nodes = [
        helper.make_node("ReduceMax", ["x", "axes"], ["hi"]),
        helper.make_node("ReduceMin", ["x", "axes"], ["lo"]),
    ]
    model = model_of(nodes, [vi("x", BOOL, (4, 2))], [vi("hi", BOOL), vi("lo", BOOL)], [axes], 20)
    x = np.array([[True, True], [True, False], [False, True], [False, False]])
    check_with_ort(model, {"x": x})


def test_reduce_log_sum_exp_is_stable():
    """Large values and infinities do not overflow: the sum is shifted by the finite maximum."""
    node = helper.make_node("ReduceLogSumExp", ["x"], ["y"], axes=[1], keepdims=0)
    model = model_of([node], [vi("x", F, (3, 3))], [vi("y", F)], opset=13)
    x = np.array([[1000, 999, 998], [-np.inf, -np.inf, -np.inf], [-np.inf, 0, 1]], np.float32)
    (got,) = run_cgc(model, {"x": x})
    peak = np.array([1000, 0, 1], np.float64)
    with np.errstate(divide="ignore"):
        want = np.log(np.exp(x - peak[:, None]).sum(1)) + peak
    want[1] = -np.inf
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6)


EMPTY_SET_VALUES = {
    "ReduceSum": 0.0, "ReduceProd": 1.0, "ReduceMax": -np.inf, "ReduceMin": np.inf,
    "ReduceL1": 0.0, "ReduceL2": 0.0, "ReduceSumSquare": 0.0, "ReduceLogSum": -np.inf,
    "ReduceLogSumExp": -np.inf,
}  # fmt: skip


@pytest.mark.parametrize("op", sorted(EMPTY_SET_VALUES))
def test_reduce_empty_set(op):
    """Reducing an axis of size 0 gives the op's identity; reducing another axis of an empty
    tensor gives an empty result."""
    nodes = [
        helper.make_node(op, ["x"], ["y0"], axes=[1]),
        helper.make_node(op, ["x"], ["y1"], axes=[2], keepdims=0),
    ]
    model = model_of(nodes, [vi("x", F, (2, 0, 3))], [vi("y0", F), vi("y1", F)], opset=11)
    got = run_cgc(model, {"x": np.zeros((2, 0, 3), np.float32)})
    want = [np.full((2, 1, 3), EMPTY_SET_VALUES[op], np.float32), np.zeros((2, 0), np.float32)]
    assert_outputs(got, want)


def test_reduce_errors():
    node = helper.make_node("ReduceL2", ["x"], ["y"], axes=[3])
    graph = helper.make_graph([node], "g", [vi("x", F, (2, 3))], [vi("y", F, (2, 3))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert "node 'ReduceL2_0' (ReduceL2): attribute axes=3 is out of range for rank 2" in (
        import_error(model)
    )
    node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], name="mean")
    graph = helper.make_graph(
        [node], "g", [vi("x", F, (2, 3)), vi("axes", I64, (1,))], [vi("y", F, (2, 1))]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    message = import_error(model)
    assert "node 'mean' (ReduceMean): input 'axes'" in message
    assert message.endswith("must be a constant")


# ---------------------------------------------------------------------------------------------
# ArgMax, ArgMin, TopK
# ---------------------------------------------------------------------------------------------

TIES = np.array(
    [[[1, 3, 3, 0], [2, 2, 1, 2], [5, 0, 5, 5]], [[0, 0, 0, 0], [4, 1, 4, 1], [1, 2, 3, 4]]],
    np.float32,
)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("opset", [11, 13])
def test_arg_max_min(op, opset):
    """axis, keepdims, and from opset 12 select_last_index; ties pick the first index (or
    the last)."""
    attrs = [{}, {"axis": 2, "keepdims": 0}, {"axis": -2}]
    if opset >= 12:
        attrs += [
            {"axis": 2, "select_last_index": 1},
            {"axis": 0, "select_last_index": 1, "keepdims": 0},
        ]
    outputs = [vi(f"y{i}", I64) for i in range(len(attrs))]
    model = model_of(variants(op, ["x"], attrs), [vi("x", F, TIES.shape)], outputs, opset=opset)
    check_with_ort(model, {"x": TIES})


def test_top_k_attribute_k():
    """Opset 1 takes k as an attribute; the k largest come sorted, ties by lower index."""
    node = helper.make_node("TopK", ["x"], ["v", "i"], k=3, axis=2)
    model = model_of([node], [vi("x", F, TIES.shape)], [vi("v", F), vi("i", I64)], opset=1)
    (values, indices) = run_cgc(model, {"x": TIES})
    order = np.argsort(-TIES, axis=2, kind="stable")[..., :3]
    np.testing.assert_array_equal(indices, order)
    np.testing.assert_array_equal(values, np.take_along_axis(TIES, order, axis=2))


@pytest.mark.parametrize("opset", [10, 11, 24])
def test_top_k_input_k(opset):
    """From opset 10 k is an input; from 11 largest=0 picks the smallest."""
    nodes = [helper.make_node("TopK", ["x", "k2"], ["v0", "i0"])]
    if opset >= 11:
        nodes.append(helper.make_node("TopK", ["x", "k1"], ["v1", "i1"], axis=-3, largest=0))
        nodes.append(helper.make_node("TopK", ["x", "k2"], ["v2", "i2"], axis=1, sorted=1))
    inits = [init("k2", np.array([2], np.int64)), init("k1", np.array([1], np.int64))]
    outputs = [
        vi(f"{kind}{i}", {"v": F, "i": I64}[kind]) for i in range(len(nodes)) for kind in "vi"
    ]
    model = model_of(nodes, [vi("x", F, TIES.shape)], outputs, inits, opset=opset)
    check_with_ort(model, {"x": TIES})


def test_top_k_errors():
    inits = [init("k", np.array([5], np.int64))]
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="top")
    graph = helper.make_graph([node], "g", [vi("x", F, (2, 4))], [vi("v", F), vi("i", I64)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    assert "node 'top' (TopK): k=5 is out of range: axis 1 has 4 elements" in import_error(model)
    graph = helper.make_graph(
        [node], "g", [vi("x", F, (2, 4)), vi("k", I64, (1,))], [vi("v", F), vi("i", I64)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    message = import_error(model)
    assert "node 'top' (TopK): input 'K'" in message
    assert message.endswith("must be a constant")


# ---------------------------------------------------------------------------------------------
# Hardmax
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [11, 13])
def test_hardmax(opset):
    """Before opset 13 the input is coerced to 2-D at the axis (default 1); from 13 the op
    runs along one axis (default -1). Ties: the first maximum."""
    attrs = [{}, {"axis": 0}, {"axis": 1}, {"axis": -1}]
    outputs = [vi(f"y{i}", F) for i in range(len(attrs))]
    nodes = variants("Hardmax", ["x"], attrs)
    model = model_of(nodes, [vi("x", F, TIES.shape)], outputs, opset=opset)
    check_with_ort(model, {"x": TIES})


# ---------------------------------------------------------------------------------------------
# Batch normalization
# ---------------------------------------------------------------------------------------------


def channel_params(channels: int, seed: int = 3, shape=None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (channels,) if shape is None else shape
    return {
        "scale": rng.uniform(0.5, 1.5, shape).astype(np.float32),
        "bias": rng.uniform(-1, 1, shape).astype(np.float32),
        "mean": rng.uniform(-1, 1, shape).astype(np.float32),
        "var": rng.uniform(0.5, 2.0, shape).astype(np.float32),
    }


def batch_norm_reference(x, p, epsilon, axes):
    """Y with the batch's statistics over ``axes``, the batch mean and variance."""
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    shape = (1, *p["scale"].shape, *[1] * (x.ndim - 1 - p["scale"].ndim))
    y = (x - mean) / np.sqrt(var + epsilon) * p["scale"].reshape(shape) + p["bias"].reshape(shape)
    return y, mean.reshape(p["mean"].shape), var.reshape(p["var"].shape)


@pytest.mark.parametrize("opset", [14, 15])
def test_batch_norm_training_mode(opset):
    """training_mode=1 normalizes with the batch statistics and outputs the running ones."""
    params = channel_params(3)
    node = helper.make_node(
        "BatchNormalization",
        ["x", *params],
        ["y", "running_mean", "running_var"],
        training_mode=1,
        momentum=0.8,
        epsilon=1e-3,
    )
    outputs = [vi("y", F), vi("running_mean", F), vi("running_var", F)]
    inits = [init(k, v) for k, v in params.items()]
    model = model_of([node], [vi("x", F, (4, 3, 2, 2))], outputs, inits, opset=opset)
    check_with_ort(model, {"x": rand(4, 3, 2, 2)}, rtol=1e-4, atol=1e-5)


def test_batch_norm_training_outputs_before_opset_14():
    """Opset 9 with five outputs trains: running mean and var, then the batch's own."""
    params = channel_params(3)
    outs = ["y", "mean_out", "var_out", "saved_mean", "saved_var"]
    node = helper.make_node("BatchNormalization", ["x", *params], outs, epsilon=1e-3)
    inits = [init(k, v) for k, v in params.items()]
    shapes = [(4, 3, 5), (3,), (3,), (3,), (3,)]
    outputs = [vi(n, F, shape) for n, shape in zip(outs, shapes, strict=True)]
    model = model_of([node], [vi("x", F, (4, 3, 5))], outputs, inits, opset=9)
    x = rand(4, 3, 5)
    y, mean, var = batch_norm_reference(x, params, 1e-3, (0, 2))
    running = [0.9 * params["mean"] + 0.1 * mean, 0.9 * params["var"] + 0.1 * var]
    assert_outputs(run_cgc(model, {"x": x}), [y, *running, mean, var], rtol=1e-4)


@pytest.mark.parametrize("is_test", [0, 1])
def test_batch_norm_opset_6_is_test(is_test):
    """Before opset 7, is_test=0 (the default) means training: batch statistics."""
    params = channel_params(2)
    node = helper.make_node("BatchNormalization", ["x", *params], ["y"], is_test=is_test)
    inits = [init(k, v) for k, v in params.items()]
    model = model_of([node], [vi("x", F, (3, 2, 4))], [vi("y", F)], inits, opset=6)
    x = rand(3, 2, 4)
    if is_test:
        s = {k: v[:, None] for k, v in params.items()}
        want = (x - s["mean"]) / np.sqrt(s["var"] + 1e-5) * s["scale"] + s["bias"]
    else:
        want = batch_norm_reference(x, params, 1e-5, (0, 2))[0]
    assert_outputs(run_cgc(model, {"x": x}), [want], rtol=1e-4)


def test_batch_norm_per_activation():
    """spatial=0 (opset 7) has one parameter per activation, shape (C, D1, ...)."""
    params = channel_params(2, shape=(2, 3))
    node = helper.make_node("BatchNormalization", ["x", *params], ["y"], spatial=0)
    inits = [init(k, v) for k, v in params.items()]
    model = model_of([node], [vi("x", F, (4, 2, 3))], [vi("y", F)], inits, opset=7)
    x = rand(4, 2, 3)
    p = params
    want = (x - p["mean"]) / np.sqrt(p["var"] + 1e-5) * p["scale"] + p["bias"]
    assert_outputs(run_cgc(model, {"x": x}), [want], rtol=1e-5)


def test_batch_norm_mixed_types():
    """Opset 15 lets the parameters have their own float types."""
    params = channel_params(3)
    params["mean"] = params["mean"].astype(np.float16)
    params["var"] = params["var"].astype(np.float16)
    node = helper.make_node("BatchNormalization", ["x", *params], ["y"])
    inits = [init(k, v) for k, v in params.items()]
    model = model_of([node], [vi("x", F16, (2, 3, 4))], [vi("y", F16)], inits, opset=15)
    check_with_ort(model, {"x": rand(2, 3, 4, dtype=np.float16)}, rtol=2e-3, atol=2e-3)


# ---------------------------------------------------------------------------------------------
# Layer, RMS, instance and group normalization
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("axis", "bias"), [(-1, True), (1, False), (0, True)])
def test_layer_norm_statistics_outputs(axis, bias):
    """Mean and InvStdDev keep the normalized axes as size 1."""
    shape = (2, 3, 4)
    normalized = shape[axis:]
    inputs, inits = ["x", "scale"], [init("scale", rand(*normalized, low=0.5, seed=1))]
    if bias:
        inputs.append("b")
        inits.append(init("b", rand(*normalized, seed=2)))
    node = helper.make_node("LayerNormalization", inputs, ["y", "mean", "inv_std"], axis=axis)
    outputs = [vi("y", F), vi("mean", F), vi("inv_std", F)]
    model = model_of([node], [vi("x", F, shape)], outputs, inits, opset=17)
    check_with_ort(model, {"x": rand(*shape)}, rtol=1e-4)


def test_layer_norm_stash_type():
    """float16 data with stash_type=1 computes the statistics in float32, which the Mean and
    InvStdDev outputs have."""
    node = helper.make_node("LayerNormalization", ["x", "scale"], ["y", "mean", "inv_std"])
    inits = [init("scale", rand(4, low=0.5, seed=1, dtype=np.float16))]
    outputs = [vi("y", F16), vi("mean", F), vi("inv_std", F)]
    model = model_of([node], [vi("x", F16, (3, 4))], outputs, inits, opset=17)
    check_with_ort(model, {"x": rand(3, 4, dtype=np.float16)}, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_rms_norm(axis):
    shape = (2, 3, 4)
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=axis, epsilon=1e-3)
    inits = [init("scale", rand(*shape[axis:], low=0.5, seed=1))]
    model = model_of([node], [vi("x", F, shape)], [vi("y", F)], inits, opset=23)
    check_with_ort(model, {"x": rand(*shape)}, rtol=1e-4)


@pytest.mark.parametrize("opset", [6, 22])
def test_instance_norm(opset):
    params = channel_params(3)
    node = helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["y"], epsilon=1e-3)
    inits = [init(k, params[k]) for k in ("scale", "bias")]
    model = model_of([node], [vi("x", F, (2, 3, 4, 2))], [vi("y", F)], inits, opset=opset)
    x = rand(2, 3, 4, 2)
    mean, var = x.mean((2, 3), keepdims=True), x.var((2, 3), keepdims=True)
    s, b = params["scale"][:, None, None], params["bias"][:, None, None]
    want = (x - mean) / np.sqrt(var + 1e-3) * s + b
    assert_outputs(run_cgc(model, {"x": x}), [want], rtol=1e-4)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_norm(opset):
    """Opset 18 scales and shifts each group (num_groups values), opset 21 each channel."""
    count = 2 if opset == 18 else 6
    inits = [init("scale", rand(count, low=0.5, seed=1)), init("bias", rand(count, seed=2))]
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=2)
    outputs = [vi("y", F, (2, 6, 3))]
    model = model_of([node], [vi("x", F, (2, 6, 3))], outputs, inits, opset, check=False)
    check_with_ort(model, {"x": rand(2, 6, 3)}, rtol=1e-4)


def test_normalization_errors():
    inits = [init("scale", rand(2)), init("bias", rand(2))]
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=4)
    graph = helper.make_graph([node], "g", [vi("x", F, (1, 6, 2))], [vi("y", F)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert "attribute num_groups=4 is not supported (6 channels do not split evenly)" in (
        import_error(model)
    )
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=3)
    graph = helper.make_graph([node], "g", [vi("x", F, (1, 6, 2))], [vi("y", F)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    assert "input 'scale' must have shape (6,), got (2,)" in import_error(model)
    node = helper.make_node("LayerNormalization", ["x", "scale"], ["y"], stash_type=7)
    graph = helper.make_graph([node], "g", [vi("x", F, (3, 2))], [vi("y", F)], inits[:1])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert (
        "attribute stash_type=INT64 is not supported "
        "(expected one of float32, float64, float16, bfloat16)" in import_error(model)
    )
    params = [init(k, v) for k, v in channel_params(4).items()]
    node = helper.make_node("BatchNormalization", ["x", *(p.name for p in params)], ["y"])
    graph = helper.make_graph([node], "g", [vi("x", F, (2, 3, 5))], [vi("y", F)], params)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    assert "(BatchNormalization): input 'scale' must have shape (3,)" in import_error(model)
    node = helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["y"])
    graph = helper.make_graph([node], "g", [vi("x", F, (2, 2))], [vi("y", F)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    assert "the input needs rank >= 3 (N x C x D1 x ...), got 2" in import_error(model)


# ---------------------------------------------------------------------------------------------
# LRN, LpNormalization, MeanVarianceNormalization
# ---------------------------------------------------------------------------------------------


def test_lrn():
    attrs = [{"size": 3}, {"size": 5, "alpha": 0.01, "beta": 0.5, "bias": 2.0}, {"size": 1}]
    nodes = variants("LRN", ["x"], attrs)
    outputs = [vi(f"y{i}", F) for i in range(len(attrs))]
    model = model_of(nodes, [vi("x", F, (2, 5, 3, 2))], outputs, opset=13)
    check_with_ort(model, {"x": rand(2, 5, 3, 2)}, rtol=1e-5)


def test_lrn_even_size():
    """An even window reaches one more channel after than before (onnxruntime refuses it)."""
    node = helper.make_node("LRN", ["x"], ["y"], size=2, alpha=0.1, beta=0.5, bias=2.0)
    model = model_of([node], [vi("x", F, (2, 3, 4))], [vi("y", F)], opset=1)
    x = rand(2, 3, 4)
    squares = np.pad(x * x, [(0, 0), (0, 1), (0, 0)])
    window = squares[:, :3] + squares[:, 1:]
    want = x / (2.0 + 0.1 / 2 * window) ** 0.5
    assert_outputs(run_cgc(model, {"x": x}), [want])


def test_lp_norm():
    """p=1 and p=2 along an axis; an all-zero row stays zero."""
    attrs = [{}, {"p": 1, "axis": 0}, {"p": 2, "axis": 1}]
    nodes = variants("LpNormalization", ["x"], attrs)
    outputs = [vi(f"y{i}", F) for i in range(len(attrs))]
    model = model_of(nodes, [vi("x", F, (3, 4))], outputs, opset=13)
    x = rand(3, 4)
    x[1] = 0.0
    x[:, 2] = 0.0
    check_with_ort(model, {"x": x})


def test_lp_norm_bad_p():
    node = helper.make_node("LpNormalization", ["x"], ["y"], name="lp", p=3)
    graph = helper.make_graph([node], "g", [vi("x", F, (3, 4))], [vi("y", F, (3, 4))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert "node 'lp' (LpNormalization): attribute p=3 is not supported (expected 1 or 2)" in (
        import_error(model)
    )


def test_mean_variance_norm():
    attrs = [{}, {"axes": [1]}, {"axes": [-1, 0]}]
    nodes = variants("MeanVarianceNormalization", ["x"], attrs)
    outputs = [vi(f"y{i}", F, (2, 3, 4, 2)) for i in range(len(attrs))]
    model = model_of(nodes, [vi("x", F, (2, 3, 4, 2))], outputs, opset=13, check=False)
    check_with_ort(model, {"x": rand(2, 3, 4, 2)}, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------

LOSS_VARIANTS = [
    (reduction, weighted, ignore)
    for reduction in ("mean", "sum", "none")
    for weighted in (False, True)
    for ignore in (None, 1, -7)
]


def loss_model(op: str, shape: tuple[int, ...], opset: int, log_prob: bool = False):
    """One node per (reduction, weighted, ignore_index) variant."""
    nodes, outputs = [], []
    for i, (reduction, weighted, ignore) in enumerate(LOSS_VARIANTS):
        attrs = {"reduction": reduction}
        if ignore is not None:
            attrs["ignore_index"] = ignore
        labels = "labels_neg" if ignore == -7 else "labels"
        ins = ["x", labels, "w"] if weighted else ["x", labels]
        outs = [f"loss{i}", f"logp{i}"] if log_prob else [f"loss{i}"]
        nodes.append(helper.make_node(op, ins, outs, **attrs))
        outputs += [vi(name, F) for name in outs]
    inits = [init("w", rand(shape[1], low=0.2, seed=5))]
    labels_shape = (shape[0], *shape[2:])
    inputs = [vi(n, I64, labels_shape) for n in ("labels", "labels_neg")]
    return model_of(nodes, [vi("x", F, shape), *inputs], outputs, inits, opset=opset)


def loss_feeds(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Labels where every third one is 1 (an ignore_index inside the classes), and a copy with
    some -7 (an ignore_index outside them) for the variants that ignore -7."""
    labels = np.random.default_rng(9).integers(0, shape[1], (shape[0], *shape[2:]))
    labels.reshape(-1)[::3] = 1
    negative = labels.copy()
    negative.reshape(-1)[1::4] = -7
    return {"x": rand(*shape), "labels": labels, "labels_neg": negative}


@pytest.mark.parametrize(("shape", "opset"), [((5, 4), 13), ((2, 3, 2, 3), 22)])
def test_negative_log_likelihood_loss(shape, opset):
    model = loss_model("NegativeLogLikelihoodLoss", shape, opset)
    check_with_ort(model, loss_feeds(shape), rtol=1e-5)


def test_softmax_cross_entropy_loss_with_log_prob():
    shape = (2, 4, 3)
    model = loss_model("SoftmaxCrossEntropyLoss", shape, 12, log_prob=True)
    check_with_ort(model, loss_feeds(shape), rtol=1e-5)


def test_loss_errors():
    node = helper.make_node(
        "NegativeLogLikelihoodLoss", ["x", "t"], ["loss"], name="nll", reduction="max"
    )
    graph = helper.make_graph(
        [node], "g", [vi("x", F, (3, 4)), vi("t", I64, (3,))], [vi("loss", F, ())]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert (
        "node 'nll' (NegativeLogLikelihoodLoss): attribute reduction=max is not supported "
        "(expected mean, sum or none)" in import_error(model)
    )
    node = helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["loss"], name="nll")
    graph = helper.make_graph(
        [node], "g", [vi("x", F, (3, 4)), vi("t", I64, (4,))], [vi("loss", F, ())]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert "the labels' shape (4,) does not match the input's (3, 4)" in import_error(model)
