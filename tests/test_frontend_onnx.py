"""The ONNX frontend: every supported op against onnxruntime, the interface, and the errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from xdsl.dialects.builtin import NameLoc, NoneAttr, StringAttr

from cgc.dialects import wse
from cgc.dialects.ir import main_function
from cgc.errors import CgcError
from cgc.frontends import zoo
from cgc.frontends.onnx import ImportedModel, TensorSpec, import_model, import_onnx

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def tensor(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def const(name, array):
    return helper.make_node("Constant", [], [name], name=name, value=tensor(name, array))


def make(nodes, inputs, outputs, inits=(), opset=13, check=True):
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    if check:  # fill in undeclared output shapes, then insist on a valid model
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        onnx.checker.check_model(model, full_check=True)
    return model


def rand(*shape, seed=0, low=None, high=None):
    rng = np.random.default_rng(seed)
    if low is not None:
        return rng.uniform(low, high, shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def ops_of(imported: ImportedModel) -> list[str]:
    return [op.name for op in main_function(imported.module).body.block.ops]


# ---------------------------------------------------------------------------------------------
# Ops against onnxruntime
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trans_a", "trans_b", "alpha", "beta", "c_shape"),
    [
        (0, 0, 1.0, 1.0, None),
        (0, 1, 1.0, 1.0, (5,)),
        (1, 0, 0.5, 1.0, (3, 5)),
        (1, 1, 1.0, 2.0, (1, 5)),
        (0, 1, 2.0, 0.25, (3, 1)),
        (0, 0, 1.0, 3.0, ()),
    ],
)
def test_gemm(onnx_check, trans_a, trans_b, alpha, beta, c_shape):
    a_shape = (4, 3) if trans_a else (3, 4)
    b_shape = (5, 4) if trans_b else (4, 5)
    inits = [tensor("b", rand(*b_shape, seed=1))]
    inputs = ["a", "b"]
    if c_shape is not None:
        inits.append(tensor("c", rand(*c_shape, seed=2)))
        inputs.append("c")
    node = helper.make_node(
        "Gemm", inputs, ["y"], name="fc", transA=trans_a, transB=trans_b, alpha=alpha, beta=beta
    )
    model = make([node], [vi("a", a_shape)], [vi("y", (3, 5))], inits)
    imported = onnx_check(model, {"a": rand(*a_shape)})
    names = ops_of(imported)
    assert names.count("wse.transpose") == trans_a + trans_b
    assert names.count("wse.mul") == (alpha != 1.0) + (beta != 1.0 and c_shape is not None)
    assert imported.initializers == ["b"] + (["c"] if c_shape is not None else [])


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((3, 4), (4, 5)),
        ((4,), (4, 5)),
        ((3, 4), (4,)),
        ((4,), (4,)),
        ((2, 3, 4), (4, 5)),
        ((2, 3, 4), (2, 4, 5)),
        ((5, 1, 3, 4), (2, 4, 6)),
        ((4,), (2, 4, 5)),
        ((2, 3, 4), (4,)),
    ],
)
def test_matmul(onnx_check, a, b):
    model = make(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
        [vi("a", a), vi("b", b)],
        [vi("y", None)],
    )
    onnx_check(model, {"a": rand(*a), "b": rand(*b, seed=1)})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize(
    ("a", "b"), [((2, 3), (3,)), ((2, 1, 4), (3, 1)), ((), (2, 3)), ((2, 3), (2, 3))]
)
def test_binary_broadcasting(onnx_check, op, a, b):
    model = make(
        [helper.make_node(op, ["a", "b"], ["y"], name="e")],
        [vi("a", a), vi("b", b)],
        [vi("y", None)],
    )
    onnx_check(model, {"a": rand(*a), "b": rand(*b, seed=1, low=0.5, high=2.0)})


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Erf"])
def test_unary(onnx_check, op):
    model = make(
        [helper.make_node(op, ["x"], ["y"], name="u")], [vi("x", (2, 3, 4))], [vi("y", None)]
    )
    onnx_check(model, {"x": rand(2, 3, 4) * 3})


@pytest.mark.parametrize(
    ("elem", "dtype"),
    [
        (TensorProto.INT64, np.int64),
        (TensorProto.INT32, np.int32),
        (TensorProto.DOUBLE, np.float64),
        (TensorProto.FLOAT16, np.float16),
    ],
)
def test_dtypes_are_kept(onnx_check, elem, dtype):
    w = (np.arange(6).reshape(2, 3) + 1).astype(dtype)
    model = make(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")],
        [vi("x", (2, 3), elem)],
        [vi("y", (2, 3), elem)],
        [tensor("w", w)],
    )
    imported = onnx_check(model, {"x": (np.arange(6).reshape(2, 3) * 3).astype(dtype)})
    assert imported.inputs[0].dtype == np.dtype(dtype).name
    if np.dtype(dtype).kind == "f":  # a float initializer is a parameter
        assert imported.weights["w"].dtype == dtype
        assert imported.initializers == ["w"]
    else:  # an integer one is data known at compile time, written inline
        assert imported.weights == {} and imported.initializers == []


def test_bool_passes_through(onnx_check):
    model = make(
        [helper.make_node("Identity", ["x"], ["y"], name="id")],
        [vi("x", (2, 3), TensorProto.BOOL)],
        [vi("y", (2, 3), TensorProto.BOOL)],
    )
    onnx_check(model, {"x": np.array([[True, False, True], [False, False, True]])})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -3])
def test_softmax(onnx_check, op, opset, axis):
    attrs = {} if axis is None else {"axis": axis}
    model = make(
        [helper.make_node(op, ["x"], ["y"], name="sm", **attrs)],
        [vi("x", (2, 3, 4))],
        [vi("y", (2, 3, 4))],
        opset=opset,
    )
    imported = onnx_check(model, {"x": rand(2, 3, 4) * 2})
    coerced = opset < 13 and axis not in (2, -1)
    assert ops_of(imported).count("wse.reshape") == (2 if coerced else 0)


CONV_CASES = {
    "basic": dict(x=(2, 3, 6, 6), w=(4, 3, 3, 3), attrs=dict(pads=[1, 1, 1, 1])),
    "no_bias": dict(x=(1, 2, 5, 5), w=(3, 2, 3, 3), attrs={}, bias=False),
    "group": dict(x=(2, 4, 5, 5), w=(6, 2, 3, 3), attrs=dict(group=2, pads=[1, 0, 1, 0])),
    "depthwise": dict(x=(1, 3, 5, 5), w=(3, 1, 3, 3), attrs=dict(group=3)),
    "stride": dict(x=(1, 2, 7, 7), w=(3, 2, 3, 3), attrs=dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    "dilation": dict(x=(1, 2, 8, 8), w=(3, 2, 3, 3), attrs=dict(dilations=[2, 2])),
    "asym_pads": dict(x=(1, 2, 6, 5), w=(2, 2, 3, 2), attrs=dict(pads=[0, 1, 2, 0])),
    "same_upper": dict(
        x=(1, 2, 7, 7), w=(3, 2, 4, 4), attrs=dict(auto_pad="SAME_UPPER", strides=[2, 2])
    ),
    "same_lower": dict(
        x=(1, 2, 7, 7), w=(3, 2, 4, 4), attrs=dict(auto_pad="SAME_LOWER", strides=[2, 2])
    ),
    "valid": dict(x=(1, 2, 7, 7), w=(3, 2, 3, 3), attrs=dict(auto_pad="VALID", strides=[2, 1])),
    "conv1d": dict(x=(2, 3, 9), w=(4, 3, 3), attrs=dict(strides=[2], pads=[1, 1])),
    "kernel_attr": dict(x=(1, 2, 5, 5), w=(2, 2, 3, 3), attrs=dict(kernel_shape=[3, 3])),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv(onnx_check, case):
    spec = CONV_CASES[case]
    inputs, inits = ["x", "w"], [tensor("w", rand(*spec["w"], seed=1))]
    if spec.get("bias", True):
        inputs.append("b")
        inits.append(tensor("b", rand(spec["w"][0], seed=2)))
    model = make(
        [helper.make_node("Conv", inputs, ["y"], name="conv", **spec["attrs"])],
        [vi("x", spec["x"])],
        [vi("y", None)],
        inits,
    )
    imported = onnx_check(model, {"x": rand(*spec["x"])})
    assert ops_of(imported).count("wse.add") == int(spec.get("bias", True))


POOL_CASES = {
    "max_2x2": ("MaxPool", (1, 2, 6, 6), dict(kernel_shape=[2, 2], strides=[2, 2])),
    "max_pads": ("MaxPool", (2, 2, 7, 7), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)),
    "max_ceil": ("MaxPool", (1, 2, 7, 7), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    "max_ceil_last_window_dropped": (
        "MaxPool",
        (1, 1, 6, 6),
        dict(kernel_shape=[3, 3], strides=[4, 4], pads=[2, 2, 2, 2], ceil_mode=1),
    ),
    "max_dilated": ("MaxPool", (1, 2, 8, 8), dict(kernel_shape=[2, 2], dilations=[2, 2])),
    "max_same_upper": (
        "MaxPool",
        (1, 2, 7, 7),
        dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
    ),
    "max_same_lower": (
        "MaxPool",
        (1, 2, 6, 5),
        dict(kernel_shape=[3, 2], strides=[1, 2], auto_pad="SAME_LOWER"),
    ),
    "max_1d": ("MaxPool", (2, 3, 9), dict(kernel_shape=[3], strides=[2], pads=[1, 0])),
    "avg_2x2": ("AveragePool", (1, 2, 6, 6), dict(kernel_shape=[2, 2], strides=[2, 2])),
    "avg_pads_excluded": (
        "AveragePool",
        (1, 2, 5, 5),
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    ),
    "avg_pads_included": (
        "AveragePool",
        (1, 2, 5, 5),
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
    ),
    "avg_ceil": (
        "AveragePool",
        (1, 2, 6, 6),
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    ),
    "avg_ceil_include_pad_no_overhang": (
        "AveragePool",
        (1, 2, 7, 7),
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4, ceil_mode=1, count_include_pad=1),
    ),
    "avg_dilated": (
        "AveragePool",
        (1, 2, 9, 9),
        dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
    ),
    "avg_ceil_valid_exact": (
        "AveragePool",
        (1, 2, 8, 8),
        dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, auto_pad="VALID"),
    ),
    "avg_same_lower_include_pad": (
        "AveragePool",
        (1, 2, 9, 9),
        dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER", count_include_pad=1),
    ),
    "avg_same_upper": (
        "AveragePool",
        (1, 2, 7, 7),
        dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
    ),
}


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pool(onnx_check, case):
    op, shape, attrs = POOL_CASES[case]
    model = make(
        [helper.make_node(op, ["x"], ["y"], name="pool", **attrs)],
        [vi("x", shape)],
        [vi("y", None)],
        opset=19,
    )
    imported = onnx_check(model, {"x": rand(*shape)})
    expected = "wse.max_pool" if op == "MaxPool" else "wse.avg_pool"
    assert ops_of(imported) == [expected, "func.return"]


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 7)])
def test_global_average_pool(onnx_check, shape):
    model = make(
        [helper.make_node("GlobalAveragePool", ["x"], ["y"], name="gap")],
        [vi("x", shape)],
        [vi("y", None)],
    )
    imported = onnx_check(model, {"x": rand(*shape)})
    assert imported.outputs[0].shape == (*shape[:2], *[1] * (len(shape) - 2))


AXES_AS_INPUT_FROM = {"ReduceMean": 18, "ReduceSum": 13, "ReduceMax": 18, "ReduceMin": 18}


@pytest.mark.parametrize("op", sorted(AXES_AS_INPUT_FROM))
@pytest.mark.parametrize(
    ("as_input", "axes", "keepdims", "noop"),
    [
        (False, [1], None, None),
        (False, [-1, 0], 0, None),
        (False, None, None, None),
        (False, None, 0, None),
        (True, [1, 2], None, None),
        (True, [-2], 0, None),
        (True, None, 1, None),
        (True, None, 0, 1),
    ],
)
def test_reductions(onnx_check, op, as_input, axes, keepdims, noop):
    """Axes come as an attribute before the op's opset change and as an input after it."""
    opset = AXES_AS_INPUT_FROM[op] - (0 if as_input else 2)
    attrs, inputs, inits = {}, ["x"], []
    if keepdims is not None:
        attrs["keepdims"] = keepdims
    if noop is not None:
        attrs["noop_with_empty_axes"] = noop
    if axes is not None and not as_input:
        attrs["axes"] = axes
    elif axes is not None:
        inputs.append("axes")
        inits.append(tensor("axes", np.array(axes, dtype=np.int64)))
    model = make(
        [helper.make_node(op, inputs, ["y"], name="reduce", **attrs)],
        [vi("x", (2, 3, 4))],
        [vi("y", None)],
        inits,
        opset=opset,
    )
    imported = onnx_check(model, {"x": rand(2, 3, 4)})
    assert imported.weights == {}  # the axes initializer is static: no weight op
    assert imported.initializers == []
    expected = (
        "wse."
        + {
            "ReduceMean": "reduce_mean",
            "ReduceSum": "reduce_sum",
            "ReduceMax": "reduce_max",
            "ReduceMin": "reduce_min",
        }[op]
    )
    assert ops_of(imported).count(expected) == (0 if noop else 1)


@pytest.mark.parametrize("axis", [0, 1, 2, 4, -1, -4])
def test_flatten(onnx_check, axis):
    model = make(
        [helper.make_node("Flatten", ["x"], ["y"], name="flat", axis=axis)],
        [vi("x", (2, 3, 4, 5))],
        [vi("y", None)],
    )
    onnx_check(model, {"x": rand(2, 3, 4, 5)})


@pytest.mark.parametrize(
    ("target", "source"),
    [
        ([0, -1], "initializer"),
        ([-1], "constant"),
        ([2, 0, 2, -1], "initializer"),
        ([0, 0, 4], "constant"),
        ([6, 4], "constant"),
    ],
)
def test_reshape(onnx_check, target, source):
    shape = np.array(target, dtype=np.int64)
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="r1")]
    inits = [tensor("s", shape)] if source == "initializer" else []
    if source == "constant":
        nodes.insert(0, const("s", shape))
    model = make(nodes, [vi("x", (2, 3, 4))], [vi("y", None)], inits)
    imported = onnx_check(model, {"x": rand(2, 3, 4)})
    assert ops_of(imported) == ["wse.reshape", "func.return"]


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose(onnx_check, perm):
    attrs = {} if perm is None else {"perm": perm}
    model = make(
        [helper.make_node("Transpose", ["x"], ["y"], name="t", **attrs)],
        [vi("x", (2, 3, 4))],
        [vi("y", None)],
    )
    onnx_check(model, {"x": rand(2, 3, 4)})


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_concat(onnx_check, axis):
    shapes = {1: [(2, 1, 3), (2, 2, 3), (2, 4, 3)], -1: [(2, 3, 1), (2, 3, 2), (2, 3, 4)]}
    shapes[0] = [(1, 2, 3), (2, 2, 3), (3, 2, 3)]
    a, b, c = shapes[axis]
    model = make(
        [helper.make_node("Concat", ["a", "w", "b"], ["y"], name="cat", axis=axis)],
        [vi("a", a), vi("b", c)],
        [vi("y", None)],
        [tensor("w", rand(*b, seed=3))],
    )
    onnx_check(model, {"a": rand(*a), "b": rand(*c, seed=1)})


@pytest.mark.parametrize("opset", [10, 13])
def test_identity_and_dropout_are_aliases(onnx_check, opset):
    if opset >= 12:
        dropout = helper.make_node("Dropout", ["h", "ratio"], ["d"], name="drop")
        inits = [tensor("ratio", np.array(0.5, dtype=np.float32))]
    else:
        dropout = helper.make_node("Dropout", ["h"], ["d", "mask"], name="drop", ratio=0.3)
        inits = []
    nodes = [
        helper.make_node("Identity", ["x"], ["h"], name="id"),
        dropout,
        helper.make_node("Relu", ["d"], ["y"], name="relu"),
        helper.make_node("Identity", ["y"], ["z"], name="id2"),
    ]
    model = make(nodes, [vi("x", (2, 3))], [vi("y", (2, 3)), vi("z", (2, 3))], inits, opset=opset)
    imported = onnx_check(model, {"x": rand(2, 3)})
    assert ops_of(imported) == ["wse.relu", "func.return"]
    assert imported.weights == {}


def test_constants_inline_or_frozen(onnx_check):
    big = rand(8, 9, seed=4)  # 72 elements: a frozen weight
    nodes = [
        const("small", rand(2, 3, seed=5)),
        const("big", big),
        helper.make_node("Constant", [], ["vf"], name="vf", value_float=2.5),
        helper.make_node("Constant", [], ["vfs"], name="vfs", value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Constant", [], ["vi"], name="vi", value_int=3),
        helper.make_node("Constant", [], ["vis"], name="vis", value_ints=[1, 2, 3]),
        helper.make_node("Constant", [], ["unused"], name="unused", value_float=1.0),
        helper.make_node("Add", ["x", "small"], ["a"], name="add_small"),
        helper.make_node("Mul", ["a", "vf"], ["b"], name="mul_vf"),
        helper.make_node("Add", ["b", "vfs"], ["y"], name="add_vfs"),
        helper.make_node("MatMul", ["big", "m"], ["z"], name="mm_big"),
        helper.make_node("Add", ["k", "vi"], ["k1"], name="add_vi"),
        helper.make_node("Mul", ["k1", "vis"], ["k2"], name="mul_vis"),
    ]
    model = make(
        nodes,
        [vi("x", (2, 3)), vi("m", (9, 2)), vi("k", (3,), I64)],
        [vi("y", (2, 3)), vi("z", (8, 2)), vi("k2", (3,), I64)],
    )
    imported = onnx_check(model)
    fn = main_function(imported.module)
    weights = [op for op in fn.body.block.ops if isinstance(op, wse.WeightOp)]
    constants = [op for op in fn.body.block.ops if isinstance(op, wse.ConstantOp)]
    assert [(w.weight_name.data, w.frozen is not None) for w in weights] == [("big", True)]
    assert weights[0].location == NameLoc(StringAttr("big"), NoneAttr())
    assert [c.location.desc.data for c in constants] == ["small", "vf", "vfs", "vi", "vis"]
    np.testing.assert_array_equal(imported.weights["big"], big)
    assert imported.initializers == []


def test_constants_and_initializers_as_outputs(onnx_check):
    nodes = [
        const("flags", np.array([[True, False], [False, True]])),
        const("codes", np.array([3, -1, 7], dtype=np.int8)),
        helper.make_node("Identity", ["flags"], ["f"], name="id_flags"),
        helper.make_node("Relu", ["x"], ["y"], name="relu"),
    ]
    model = make(
        nodes,
        [vi("x", (2,))],
        [
            vi("f", (2, 2), TensorProto.BOOL),
            vi("codes", (3,), TensorProto.INT8),
            vi("w", (2,), TensorProto.UINT8),
            vi("y", (2,)),
        ],
        [tensor("w", np.array([1, 200], dtype=np.uint8))],
    )
    imported = onnx_check(model)
    assert [s.dtype for s in imported.outputs] == ["bool", "int8", "uint8", "float32"]
    ops = main_function(imported.module).body.block.ops
    locations = [op.location.desc.data for op in ops if isinstance(op.location, NameLoc)]
    assert locations == ["relu", "flags", "codes", "w"]


@pytest.mark.parametrize("opset", [9, 15])
def test_batch_norm(onnx_check, opset):
    rng = np.random.default_rng(7)
    params = {
        "scale": rng.uniform(0.5, 1.5, 3),
        "bias": rng.uniform(-1, 1, 3),
        "mean": rng.uniform(-1, 1, 3),
        "var": rng.uniform(0.5, 2.0, 3),
    }
    inits = [tensor(k, v.astype(np.float32)) for k, v in params.items()]
    node = helper.make_node("BatchNormalization", ["x", *params], ["y"], name="bn", epsilon=1e-3)
    model = make([node], [vi("x", (2, 3, 4, 4))], [vi("y", None)], inits, opset=opset)
    onnx_check(model, {"x": rand(2, 3, 4, 4)})


@pytest.mark.parametrize(
    ("axis", "bias"), [(-1, True), (-1, False), (1, True), (2, False), (-2, True)]
)
def test_layer_norm(onnx_check, axis, bias):
    shape = (2, 3, 4, 5)
    normalized = shape[axis:]
    inputs = ["x", "scale"]
    inits = [tensor("scale", rand(*normalized, seed=1, low=0.5, high=1.5))]
    if bias:
        inputs.append("bias")
        inits.append(tensor("bias", rand(*normalized, seed=2)))
    node = helper.make_node("LayerNormalization", inputs, ["y"], name="ln", axis=axis, epsilon=1e-4)
    model = make([node], [vi("x", shape)], [vi("y", shape)], inits, opset=17)
    imported = onnx_check(model, {"x": rand(*shape)})
    (ln,) = [op for op in main_function(imported.module).walk() if isinstance(op, wse.LayerNormOp)]
    assert ln.axis.value.data == axis % 4
    assert (ln.bias is not None) == bias


@pytest.mark.parametrize("reduction", ["mean", "sum", "none", None])
@pytest.mark.parametrize("ignore_index", [None, 1, -100])
@pytest.mark.parametrize("weighted", [False, True])
def test_softmax_cross_entropy(onnx_check, reduction, ignore_index, weighted):
    labels = np.array([0, 1, 4, 1, 2, 3], dtype=np.int64)
    if ignore_index == -100:
        labels[2] = -100
    attrs = {} if reduction is None else {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    inputs, inits = ["scores", "labels"], []
    if weighted:
        inputs.append("w")
        inits.append(tensor("w", rand(5, seed=3, low=0.2, high=2.0)))
    node = helper.make_node("SoftmaxCrossEntropyLoss", inputs, ["loss"], name="sce", **attrs)
    model = make([node], [vi("scores", (6, 5)), vi("labels", (6,), I64)], [vi("loss", None)], inits)
    imported = onnx_check(model, {"scores": rand(6, 5) * 2, "labels": labels})
    assert imported.outputs[0].shape == ((6,) if reduction == "none" else ())


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_softmax_cross_entropy_log_prob_rank3(onnx_check, reduction):
    node = helper.make_node(
        "SoftmaxCrossEntropyLoss",
        ["scores", "labels"],
        ["loss", "log_prob"],
        name="sce",
        reduction=reduction,
        ignore_index=2,
    )
    model = make(
        [node],
        [vi("scores", (3, 4, 2)), vi("labels", (3, 2), I64)],
        [vi("loss", None), vi("log_prob", (3, 4, 2))],
    )
    labels = np.array([[0, 2], [3, 1], [1, 1]], dtype=np.int64)
    imported = onnx_check(model, {"scores": rand(3, 4, 2) * 2, "labels": labels})
    assert "wse.log_softmax" in ops_of(imported)


def test_unused_log_prob_emits_nothing(onnx_check):
    node = helper.make_node(
        "SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss", "log_prob"], name="sce"
    )
    model = make([node], [vi("scores", (3, 4)), vi("labels", (3,), I64)], [vi("loss", None)])
    imported = onnx_check(model, {"scores": rand(3, 4), "labels": np.array([0, 3, 1])})
    assert "wse.log_softmax" not in ops_of(imported)


# ---------------------------------------------------------------------------------------------
# IR shape: locations, weights, round trip
# ---------------------------------------------------------------------------------------------


def test_every_op_carries_its_node_location():
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc1", transB=1, alpha=0.5),
        helper.make_node("Relu", ["h"], ["r"]),  # unnamed: Relu_1
        helper.make_node("Gemm", ["r", "w2"], ["y"], name="fc2", transA=0),
    ]
    inits = [tensor("w", rand(4, 3)), tensor("b", rand(4)), tensor("w2", rand(4, 2))]
    model = make(nodes, [vi("x", (5, 3))], [vi("y", (5, 2))], inits)
    imported = import_model(model)
    located = [
        (op.name, op.location.desc.data)
        for op in main_function(imported.module).body.block.ops
        if isinstance(op.location, NameLoc)
    ]
    assert located == [
        ("wse.weight", "fc1"),
        ("wse.transpose", "fc1"),
        ("wse.matmul", "fc1"),
        ("wse.weight", "fc1"),
        ("wse.constant", "fc1"),
        ("wse.mul", "fc1"),
        ("wse.add", "fc1"),
        ("wse.relu", "Relu_1"),
        ("wse.weight", "fc2"),
        ("wse.matmul", "fc2"),
    ]


def test_shared_initializer_is_one_weight_op(onnx_check):
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm1"),
        helper.make_node("MatMul", ["h", "w"], ["y"], name="mm2"),
    ]
    model = make(nodes, [vi("x", (2, 3))], [vi("y", (2, 3))], [tensor("w", rand(3, 3))])
    imported = onnx_check(model, {"x": rand(2, 3)})
    assert ops_of(imported).count("wse.weight") == 1


def test_initializers_listed_as_inputs_are_weights(onnx_check):
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    model = make(nodes, [vi("x", (2, 3)), vi("w", (3,))], [vi("y", (2, 3))], [tensor("w", rand(3))])
    imported = onnx_check(model, {"x": rand(2, 3)})
    assert [s.name for s in imported.inputs] == ["x"]
    assert imported.initializers == ["w"]
    assert len(main_function(imported.module).body.block.args) == 1


def test_imported_model_interface():
    model = zoo.mlp(in_features=6, hidden=(5,), classes=3, with_loss=True)
    imported = import_model(model, batch_size=4, source="mlp.onnx")
    assert imported.inputs == [
        TensorSpec("x", (4, 6), "float32", 0),
        TensorSpec("labels", (4,), "int64", 0),
    ]
    assert imported.outputs == [
        TensorSpec("loss", (), "float32", None),
        TensorSpec("logits", (4, 3), "float32", 0),
    ]
    assert imported.initializers == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert sorted(imported.weights) == sorted(imported.initializers)
    assert imported.opset == 18
    assert imported.source == "mlp.onnx"
    fn = main_function(imported.module)
    assert [str(t) for t in fn.function_type.outputs.data] == [
        "tensor<f32>",
        "tensor<4x3xf32>",
    ]


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        (["N", 3], 0),  # the inputs' batch dim_param
        (["M", 3], None),  # another dim_param
        (None, 0),  # no declared shape, leading dim == batch size
        ([4, 3], None),  # static
    ],
)
def test_output_batch_axis(declared, expected):
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    model = make(nodes, [vi("x", ["N", 3])], [vi("y", declared)], check=False)
    imported = import_model(model, batch_size=4)
    assert imported.outputs == [TensorSpec("y", (4, 3), "float32", expected)]


def test_shape_override_binds_symbolic_dims(onnx_check):
    nodes = [helper.make_node("Softmax", ["x"], ["y"], name="sm")]
    model = make(nodes, [vi("x", ["N", "T", 4])], [vi("y", ["N", "T", 4])])
    imported = onnx_check(model, shapes={"x": (2, 5, 4)})
    assert imported.inputs == [TensorSpec("x", (2, 5, 4), "float32", 0)]
    assert imported.outputs[0].batch_axis == 0


def test_static_batch_size_may_match():
    imported = import_model(_relu_model([4, 3]), batch_size=4)
    assert imported.inputs == [TensorSpec("x", (4, 3), "float32", None)]


def test_load_from_file_with_external_data(tmp_path):
    model = zoo.mlp(in_features=8, hidden=(4,), classes=2)
    expected = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    path = tmp_path / "model.onnx"
    onnx.save(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="w.bin",
        size_threshold=0,
    )
    imported = import_onnx(path, batch_size=2)
    assert imported.source == "model.onnx"
    assert sorted(imported.weights) == sorted(expected)
    for name, array in expected.items():
        np.testing.assert_array_equal(imported.weights[name], array)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def _error(model, **kwargs) -> str:
    with pytest.raises(CgcError) as info:
        import_model(model, source="model.onnx", **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_all_unsupported_ops_are_listed_at_once():
    nodes = [
        helper.make_node("Foo", ["x"], ["a"], name="a"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Loop", ["r"], ["c"], name="c"),
        helper.make_node("Foo", ["c"], ["b"], name="b"),
        helper.make_node("FusedGemm", ["b"], ["f"], name="f", domain="com.microsoft"),
        helper.make_node("Foo", ["f"], ["g"]),
    ]
    nodes += [helper.make_node("Bar", ["g"], ["g0"], name="g_0")]
    nodes += [
        helper.make_node("Bar", [f"g{i}"], [f"g{i + 1}"], name=f"g_{i + 1}") for i in range(8)
    ]
    nodes += [helper.make_node("Relu", ["g8"], ["y"])]
    model = make(nodes, [vi("x", (2,))], [vi("y", (2,))], check=False)
    assert _error(model) == (
        "model.onnx: unsupported ops: Bar (nodes g_0, g_1, g_2, g_3, g_4, g_5 and 3 more), "
        "Foo (nodes a, b, Foo_5), Loop (node c), com.microsoft.FusedGemm (node f)"
    )


def _pool(op, outputs=("y",), **attrs):
    return make(
        [helper.make_node(op, ["x"], list(outputs), name="p1", kernel_shape=[2, 2], **attrs)],
        [vi("x", (1, 1, 5, 5))],
        [vi(o, None) for o in outputs],
        check=False,
    )


BAD_NODES = {
    "auto_pad": (
        _pool("MaxPool", auto_pad="SAME"),
        "model.onnx: node 'p1' (MaxPool): attribute auto_pad=SAME is not supported",
    ),
    "ceil_valid": (
        _pool("MaxPool", strides=[2, 2], ceil_mode=1, auto_pad="VALID"),
        "model.onnx: node 'p1' (MaxPool): attribute ceil_mode=1 is not supported with "
        "auto_pad=VALID",
    ),
    "reduction": (
        make(
            [
                helper.make_node(
                    "SoftmaxCrossEntropyLoss", ["x", "l"], ["y"], name="sce", reduction="max"
                )
            ],
            [vi("x", (2, 3)), vi("l", (2,), I64)],
            [vi("y", None)],
            check=False,
        ),
        "model.onnx: node 'sce' (SoftmaxCrossEntropyLoss): attribute reduction=max is not "
        "supported",
    ),
    "constant_string": (
        make(
            [
                helper.make_node("Constant", [], ["c"], name="c", value_string="hi"),
                helper.make_node("Identity", ["c"], ["y"], name="id"),
            ],
            [],
            [vi("y", None, TensorProto.STRING)],
            check=False,
        ),
        "model.onnx: node 'c' (Constant): attribute value_string is not supported",
    ),
    "non_constant_shape": (
        make(
            [helper.make_node("Reshape", ["x", "s"], ["y"], name="r1")],
            [vi("x", (2, 3)), vi("s", (2,), I64)],
            [vi("y", None)],
            check=False,
        ),
        "model.onnx: node 'r1' (Reshape): input 'shape' (graph input 's') must be a constant",
    ),
    "bad_reshape": (
        make(
            [helper.make_node("Reshape", ["x", "s"], ["y"], name="r1")],
            [vi("x", (2, 3))],
            [vi("y", None)],
            [tensor("s", np.array([4, -1], np.int64))],
            check=False,
        ),
        "model.onnx: node 'r1' (Reshape): cannot reshape (2, 3) into shape [4, -1]",
    ),
    "broadcast": (
        make(
            [helper.make_node("Add", ["x", "z"], ["y"], name="add")],
            [vi("x", (2, 3)), vi("z", (4,))],
            [vi("y", None)],
            check=False,
        ),
        "model.onnx: node 'add' (Add): shapes [(2, 3), (4,)] do not broadcast",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_NODES))
def test_node_errors(case):
    model, message = BAD_NODES[case]
    assert _error(model).startswith(message)


def test_missing_file(tmp_path):
    with pytest.raises(CgcError, match=r"^model\.onnx: no such file$"):
        import_onnx(tmp_path / "model.onnx")


def test_truncated_file(tmp_path):
    data = zoo.mlp().SerializeToString()
    path = tmp_path / "model.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CgcError, match=r"^model\.onnx: not a valid ONNX model \(.+\)$"):
        import_onnx(path, batch_size=2)


def test_missing_external_data(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(
        zoo.mlp(),
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="w.bin",
        size_threshold=0,
    )
    (tmp_path / "w.bin").unlink()
    with pytest.raises(
        CgcError,
        match=r"^model\.onnx: external data file 'w\.bin' of tensor 'fc1\.weight' is missing "
        r"\(--no-weights compiles the graph without them\)$",
    ):
        import_onnx(path, batch_size=2)
    # without its weights the graph imports, the float initializers declared by shape
    imported = import_onnx(path, batch_size=2, no_weights=True)
    assert imported.weights == {}
    assert imported.declared["fc1.weight"].shape == (32, 64)


def _relu_model(shape, dtype=F):
    return make(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [vi("x", shape, dtype)],
        [vi("y", None, dtype)],
        check=False,
    )


def test_unbound_symbolic_dimension():
    assert _error(_relu_model(["N", "T"]), batch_size=2) == (
        "model.onnx: input 'x' has symbolic dimension 'T' at axis 1; pass shapes x=D0xD1..."
    )


def test_symbolic_batch_needs_batch_size():
    message = _error(_relu_model(["N", 3]))
    assert message == "model.onnx: input 'x' has a symbolic batch dimension 'N'; pass batch_size"


def test_static_batch_with_other_batch_size():
    message = _error(_relu_model([4, 3]), batch_size=8)
    assert message.startswith("model.onnx: input 'x' has a static batch dimension 4")
    assert "export the model with a dynamic batch dimension" in message


def test_shape_override_of_unknown_input():
    message = _error(_relu_model([2, 3]), shapes={"q": (1, 2)})
    assert message.startswith("model.onnx: --shape names 'q', which is not a graph input")


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("input", "model.onnx: input 'x' has unsupported dtype string"),
        ("initializer", "model.onnx: tensor 'w' has unsupported dtype complex64"),
    ],
)
def test_unsupported_dtype(where, expected):
    if where == "input":
        model = _relu_model([2], TensorProto.STRING)
    else:
        model = make(
            [helper.make_node("Identity", ["w"], ["y"], name="id")],
            [],
            [vi("y", None, TensorProto.COMPLEX64)],
            [tensor("w", np.arange(3, dtype=np.complex64))],
            check=False,
        )
    assert _error(model).startswith(expected)


@pytest.mark.parametrize("opset", [0, onnx.defs.onnx_opset_version() + 1])
def test_opset_out_of_range(opset):
    model = make(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [vi("x", [2])],
        [vi("y", [2])],
        opset=opset,
        check=False,
    )
    assert _error(model).startswith(f"model.onnx: opset {opset} is not supported")
