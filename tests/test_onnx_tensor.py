"""The ONNX tensor ops (constants, reshapes, slicing, padding and indexing in cgc/frontends/onnx/)
through the whole compiler and simulator.

Each model runs with ``cgc.tools.backend.run_model`` and is compared with onnxruntime where it runs
the op at that opset, else with a numpy reference. Ops whose result is a compile-time constant
(Shape, Size, Constant, EyeLike, Range, ConstantOfShape) feed a run-time op, so that the program
has work to do on the wafer.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from conftest import run_onnxruntime
from onnx import TensorProto, helper, numpy_helper

from cgc.compiler.driver import compile_model
from cgc.errors import CgcError
from cgc.frontends.onnx import import_model
from cgc.tools.backend import prepare, run_model

F = TensorProto.FLOAT
I64 = TensorProto.INT64
I32 = TensorProto.INT32
INT_MAX = np.iinfo(np.int64).max


def vi(name, dtype=F, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def tensor(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def ints(name, values):
    return tensor(name, np.asarray(values, dtype=np.int64))


def make(nodes, inputs, outputs, inits=(), opset=13, infer=True):
    """A model of ``nodes``; ``inputs`` and ``outputs`` are names or value infos. Shape
    inference declares the outputs' shapes (``infer=False`` for models it would reject)."""
    inputs = [vi(i) if isinstance(i, str) else i for i in inputs]
    outputs = [vi(o) if isinstance(o, str) else o for o in outputs]
    if not infer:
        for output in outputs:
            output.type.tensor_type.shape.SetInParent()
    graph = helper.make_graph(nodes, "t", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    if not infer:
        return model
    model = onnx.shape_inference.infer_shapes(model)
    for output in model.graph.output:  # the checker wants a shape, even one of unknown dims
        output.type.tensor_type.shape.SetInParent()
    return model


def node(op, inputs, outputs=("y",), **attrs):
    """A node named after its op and first output, e.g. ``reshape_y``."""
    return helper.make_node(
        op, list(inputs), list(outputs), name=f"{op.lower()}_{outputs[0]}", **attrs
    )


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def check(model, feeds, expected=None):
    """Runs ``model`` on cgc and compares with ``expected`` (default: onnxruntime)."""
    got = list(run_model(model, feeds))
    want = run_onnxruntime(model, feeds) if expected is None else expected
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-6, atol=1e-6)
    return got


def fails(model, feeds, match):
    """Compiling for the shapes of ``feeds`` fails with ``match`` (the backend would retry
    with the integer inputs fixed to these values; the compiler alone does not)."""
    names = [i.name for i in model.graph.input]
    shapes = {name: np.asarray(feed).shape for name, feed in zip(names, feeds, strict=True)}
    with pytest.raises(CgcError, match=match):
        compile_model(model, mode="weight_streaming", target="mesh8x8", shapes=shapes)


# ---------------------------------------------------------------------------------------------
# Constants and shapes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attr", "value", "want"),
    [
        ("value_float", 2.5, np.float32(2.5)),
        ("value_floats", [1.0, 2.0, 3.0], np.array([1, 2, 3], np.float32)),
        ("value", tensor("v", rand(2, 3, seed=4)), rand(2, 3, seed=4)),
    ],
)
def test_constant_float(attr, value, want):
    model = make(
        [node("Constant", [], ["c"], **{attr: value}), node("Add", ["x", "c"])],
        [vi("x", F, [2, 3])],
        ["y"],
        opset=13,
    )
    x = rand(2, 3)
    check(model, [x], [x + want])


@pytest.mark.parametrize(("attr", "value"), [("value_int", 3), ("value_ints", [1, 2, 3])])
def test_constant_int(attr, value):
    model = make(
        [node("Constant", [], ["c"], **{attr: value}), node("Add", ["x", "c"])],
        [vi("x", I64, [3])],
        [vi("y", I64)],
    )
    check(model, [np.array([5, 6, 7], np.int64)])


@pytest.mark.parametrize("linear", [True, False])
def test_constant_sparse_value(linear):
    dense = np.zeros((3, 4), np.float32)
    dense[0, 1], dense[2, 3] = 1.5, -2.0
    indices = np.array([1, 11]) if linear else np.array([[0, 1], [2, 3]])
    sparse = helper.make_sparse_tensor(
        tensor("v", np.array([1.5, -2.0], np.float32)), ints("i", indices), [3, 4]
    )
    model = make(
        [node("Constant", [], ["c"], sparse_value=sparse), node("Add", ["x", "c"])],
        [vi("x", F, [3, 4])],
        ["y"],
    )
    x = rand(3, 4)
    check(model, [x], [x + dense])


def test_constant_string_is_an_error():
    model = make(
        [node("Constant", [], ["c"], value_strings=["a"]), node("Identity", ["c"])],
        [],
        [vi("y", TensorProto.STRING)],
        infer=False,
    )
    with pytest.raises(CgcError, match=r"\(Constant\): attribute value_strings is not supported"):
        run_model(model, [])


@pytest.mark.parametrize(
    ("start", "end"),
    [(None, None), (1, None), (-1, None), (None, 1), (None, -1), (1, -1), (-10, 10), (1, 2)],
)
def test_shape(start, end):
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    model = make(
        [
            node("Shape", ["x"], ["s"], **attrs),
            node("Cast", ["s"], ["f"], to=F),
            node("Add", ["f", "b"]),
        ],
        [vi("x", F, [2, 3, 4]), vi("b", F, [1])],
        ["y"],
        opset=15,
    )
    check(model, [rand(2, 3, 4), np.array([0.5], np.float32)])


def test_size_and_shape_feed_a_reshape():
    # Flatten x to the shape of y, computed from Shape, Size and shape arithmetic
    model = make(
        [
            node("Size", ["x"], ["n"]),
            node("Shape", ["y"], ["s"]),
            node("Gather", ["s", "zero"], ["rows"], axis=0),
            node("Div", ["n", "rows"], ["cols"]),
            node("Unsqueeze", ["rows", "zero"], ["r1"]),
            node("Unsqueeze", ["cols", "zero"], ["c1"]),
            node("Concat", ["r1", "c1"], ["target"], axis=0),
            node("Reshape", ["x", "target"], ["z"]),
            node("Add", ["z", "y"], ["out"]),
        ],
        [vi("x", F, [2, 3, 4]), vi("y", F, [6, 1])],
        ["out"],
        [ints("zero", 0)],
    )
    check(model, [rand(2, 3, 4), rand(6, 1, seed=1)])


@pytest.mark.parametrize(
    ("value", "dtype"),
    [(None, np.float32), (np.array([7], np.int32), np.int32), (np.array([1.5]), np.float64)],
)
def test_constant_of_shape(value, dtype):
    attrs = {} if value is None else {"value": tensor("v", value)}
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = make(
        [node("ConstantOfShape", ["s"], ["c"], **attrs), node("Add", ["x", "c"])],
        [vi("x", elem, [2, 3])],
        [vi("y", elem)],
        [ints("s", [2, 3])],
    )
    check(model, [np.arange(6).reshape(2, 3).astype(dtype)])


def test_constant_of_shape_big_is_a_broadcast_view():
    model = make(
        [node("ConstantOfShape", ["s"], ["c"], value=tensor("v", np.array([0.25], np.float32))),
         node("Mul", ["x", "c"])],
        [vi("x", F, [300, 200])],
        ["y"],
        [ints("s", [300, 200])],
    )  # fmt: skip
    x = rand(300, 200)
    check(model, [x], [x * np.float32(0.25)])


def test_bfloat16_constant_of_shape_and_one_hot():
    bf16 = helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)
    model = make(
        [node("ConstantOfShape", ["s"], ["c"], value=tensor("v", np.array([1.5], bf16))),
         node("Add", ["x", "c"]),
         node("OneHot", ["i", "d", "vals"], ["z"], axis=0)],
        [vi("x", TensorProto.BFLOAT16, [2, 3]), vi("i", I64, [3]),
         vi("vals", TensorProto.BFLOAT16, [2])],
        [vi("y", TensorProto.BFLOAT16), vi("z", TensorProto.BFLOAT16)],
        [ints("s", [2, 3]), ints("d", 4)],
        opset=21,
    )  # fmt: skip
    x, values = np.arange(6).reshape(2, 3).astype(bf16), np.array([0.5, 2.0], bf16)
    hot = np.array([0, -1, 7])[None, :] % 4 == np.arange(4)[:, None]
    hot[:, 2] = False  # 7 is out of range
    check(
        model,
        [x, np.array([0, -1, 7]), values],
        [x + np.array(1.5, bf16), np.where(hot, values[1], values[0])],
    )


def test_constant_of_shape_stays_a_view_in_the_importer():
    model = make(
        [node("ConstantOfShape", ["s"], ["c"]), node("Add", ["x", "c"])],
        [vi("x", F, [300, 200])],
        ["y"],
        [ints("s", [300, 200])],
    )
    imported = import_model(model)
    (stored,) = imported.weights.values()
    assert stored.shape == (300, 200) and stored.strides == (0, 0)


@pytest.mark.parametrize(
    ("start", "limit", "delta", "dtype"),
    [(3, 9, 3, np.int32), (10, 4, -2, np.int64), (1.0, 5.0, 0.5, np.float32), (0, 0, 1, np.int64)],
)
def test_range(start, limit, delta, dtype):
    count = max(int(np.ceil((limit - start) / delta)), 0)
    if count == 0:  # an empty result: the model only imports
        return
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = make(
        [node("Range", ["a", "b", "d"], ["r"]), node("Add", ["x", "r"])],
        [vi("x", elem, [count])],
        [vi("y", elem)],
        [tensor(n, np.array(v, dtype)) for n, v in (("a", start), ("b", limit), ("d", delta))],
        opset=11,
    )
    check(model, [np.ones(count, dtype)])


@pytest.mark.parametrize(("k", "dtype"), [(0, None), (1, None), (-2, TensorProto.DOUBLE)])
def test_eye_like(k, dtype):
    attrs = {"k": k} | ({} if dtype is None else {"dtype": dtype})
    out = dtype or F
    model = make(
        [node("EyeLike", ["x"], ["e"], **attrs), node("Cast", ["x"], ["xc"], to=out),
         node("Add", ["xc", "e"])],
        [vi("x", F, [3, 4])],
        [vi("y", out)],
    )  # fmt: skip
    check(model, [rand(3, 4)])


# ---------------------------------------------------------------------------------------------
# Reshapes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "allowzero"),
    [([4, 6], 0), ([0, -1], 0), ([-1], 0), ([2, 0, 2, 2], 0), ([3, 8], 1), ([1, 1, 24], 0)],
)
def test_reshape(spec, allowzero):
    model = make(
        [node("Reshape", ["x", "s"], allowzero=allowzero)],
        [vi("x", F, [2, 3, 4])],
        ["y"],
        [ints("s", spec)],
        opset=14,
    )
    check(model, [rand(2, 3, 4)])


def test_reshape_attribute_before_opset_5():
    model = make([node("Reshape", ["x"], shape=[4, -1])], [vi("x", F, [2, 3, 4])], ["y"], opset=4)
    x = rand(2, 3, 4)
    check(model, [x], [x.reshape(4, 6)])


@pytest.mark.parametrize("spec", [[-1, -1], [5, -1], [0, 0, 0, 0]])
def test_reshape_errors(spec):
    model = make(
        [node("Reshape", ["x", "s"])],
        [vi("x", F, [2, 3, 4])],
        ["y"],
        [ints("s", spec)],
        infer=False,
    )
    fails(model, [rand(2, 3, 4)], r"reshape_y' \(Reshape\): .*shape")


def test_reshape_needs_a_known_shape():
    model = make(
        [node("Reshape", ["x", "s"])], [vi("x", F, [2, 3]), vi("s", I64, [1])], ["y"], infer=False
    )
    fails(
        model, [rand(2, 3), np.array([6])], "input 'shape' \\(graph input 's'\\) must be a constant"
    )


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    model = make([node("Flatten", ["x"], axis=axis)], [vi("x", F, [2, 3, 4])], ["y"])
    check(model, [rand(2, 3, 4)])


@pytest.mark.parametrize(
    ("opset", "given"), [(1, "attr"), (11, "attr"), (11, None), (13, "input"), (13, None)]
)
def test_squeeze(opset, given):
    inits, inputs, attrs = [], ["x"], {}
    if given == "attr":
        attrs["axes"] = [0, -1]
    elif given == "input":
        inits, inputs = [ints("axes", [0, -1])], ["x", "axes"]
    model = make([node("Squeeze", inputs, **attrs)], [vi("x", F, [1, 3, 1])], ["y"], inits, opset)
    check(model, [rand(1, 3, 1)])


def test_squeeze_of_a_wide_axis_is_an_error():
    model = make(
        [node("Squeeze", ["x"], axes=[1])], [vi("x", F, [1, 3])], ["y"], opset=11, infer=False
    )
    fails(model, [rand(1, 3)], "cannot squeeze axis 1 of size 3")


@pytest.mark.parametrize(
    ("opset", "axes"), [(1, [0]), (11, [0, -1]), (11, [3, 1]), (13, [2, 0, 4]), (13, [-1])]
)
def test_unsqueeze(opset, axes):
    if opset < 13:
        model = make([node("Unsqueeze", ["x"], axes=axes)], [vi("x", F, [2, 3])], ["y"], (), opset)
    else:
        model = make(
            [node("Unsqueeze", ["x", "a"])], [vi("x", F, [2, 3])], ["y"], [ints("a", axes)], opset
        )
    x = rand(2, 3)
    rank = 2 + len(axes)
    want = np.expand_dims(x, tuple(sorted(a % rank for a in axes)))
    check(model, [x], [want])


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1], [1, 2, 0]])
def test_transpose(perm):
    attrs = {} if perm is None else {"perm": perm}
    model = make([node("Transpose", ["x"], **attrs)], [vi("x", F, [2, 3, 4])], ["y"])
    x = rand(2, 3, 4)
    check(model, [x], [np.transpose(x, None if perm is None else [p % 3 for p in perm])])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    model = make(
        [node("DepthToSpace", ["x"], blocksize=2, mode=mode)], [vi("x", F, [2, 8, 3, 2])], ["y"]
    )
    check(model, [rand(2, 8, 3, 2)])


def test_depth_to_space_before_opset_11_is_dcr():
    model = make(
        [node("DepthToSpace", ["x"], blocksize=2)], [vi("x", F, [1, 4, 2, 3])], ["y"], (), 1
    )
    x = rand(1, 4, 2, 3)
    want = x.reshape(1, 2, 2, 1, 2, 3).transpose(0, 3, 4, 1, 5, 2).reshape(1, 1, 4, 6)
    check(model, [x], [want])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth(mode):
    x = rand(2, 3, 4, 6)
    model = make(
        [node("SpaceToDepth", ["x"], blocksize=2, mode=mode)], [vi("x", F, [2, 3, 4, 6])], ["y"],
        opset=28,
    )  # fmt: skip
    blocks = x.reshape(2, 3, 2, 2, 3, 2)
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    want = blocks.transpose(perm).reshape(2, 12, 2, 3)
    check(model, [x], [want])
    # DepthToSpace in the same mode undoes it
    back = make(
        [node("SpaceToDepth", ["x"], ["d"], blocksize=2, mode=mode),
         node("DepthToSpace", ["d"], blocksize=2, mode=mode)],
        [vi("x", F, [2, 3, 4, 6])],
        ["y"],
        opset=28,
    )  # fmt: skip
    check(back, [x], [x])


def test_space_to_depth_errors():
    model = make(
        [node("SpaceToDepth", ["x"], blocksize=2)], [vi("x", F, [1, 1, 3, 4])], ["y"], infer=False
    )
    fails(model, [rand(1, 1, 3, 4)], "does not divide into blocks")
    model = make(
        [node("DepthToSpace", ["x"], blocksize=2, mode="XYZ")],
        [vi("x", F, [1, 4, 1, 1])],
        ["y"],
        infer=False,
    )
    fails(model, [rand(1, 4, 1, 1)], "attribute mode=XYZ is not supported")


# ---------------------------------------------------------------------------------------------
# Joining, splitting, slicing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
def test_concat(axis):
    shapes = [[2, 3], [2, 3], [2, 3]]
    model = make(
        [node("Concat", ["a", "b", "c"], axis=axis)],
        [vi(n, F, s) for n, s in zip("abc", shapes, strict=True)],
        ["y"],
    )
    check(model, [rand(2, 3, seed=i) for i in range(3)])


def test_concat_default_axis_before_opset_4():
    model = make(
        [node("Concat", ["a", "b"])], [vi("a", F, [2, 3]), vi("b", F, [2, 1])], ["y"], (), 1
    )
    a, b = rand(2, 3), rand(2, 1, seed=1)
    check(model, [a, b], [np.concatenate([a, b], axis=1)])


def test_concat_leaves_out_empty_pieces():
    model = make(
        [node("Slice", ["b", "s", "e"], ["empty"]), node("Concat", ["a", "empty"], axis=1)],
        [vi("a", F, [2, 3]), vi("b", F, [2, 4])],
        ["y"],
        [ints("s", [4]), ints("e", [4]), ints("axes", [1])],
    )
    model.graph.node[0].input.append("axes")
    a = rand(2, 3)
    check(model, [a, rand(2, 4)], [a])


@pytest.mark.parametrize(("axis", "want"), [(1, (0, 7)), (0, (0, 3))])
def test_concat_of_empty_pieces(axis, want):
    """Pieces empty along another axis still join along this one; all empty gives zeros of
    the joined shape."""
    b = [0, 4] if axis == 1 else [0, 3]
    model = make(
        [node("Concat", ["a", "b"], axis=axis)], [vi("a", F, [0, 3]), vi("b", F, b)], ["y"]
    )
    (got,) = check(model, [rand(0, 3), rand(*b)])
    assert got.shape == want


def test_concat_of_pieces_that_do_not_join():
    model = make(
        [node("Concat", ["a", "b"], axis=1)],
        [vi("a", F, [2, 3]), vi("b", F, [3, 4])],
        ["y"],
        infer=False,
    )
    fails(model, [rand(2, 3), rand(3, 4)], r"node 'concat_y' \(Concat\): cannot concatenate")


@pytest.mark.parametrize(
    ("opset", "axis", "split", "outputs"),
    [
        (1, 0, [2, 5], 2),
        (11, 1, [1, 4], 2),
        (11, -1, None, 5),
        (13, 0, [1, 2, 4], 3),
        (13, 1, None, 5),
        (18, 0, "num", 4),
        (18, 1, "num", 3),
    ],
)
def test_split(opset, axis, split, outputs):
    x = rand(7, 5)
    names = [f"y{i}" for i in range(outputs)]
    inits, inputs, attrs = [], ["x"], {"axis": axis}
    if split == "num":
        attrs["num_outputs"] = outputs
    elif split is not None and opset < 13:
        attrs["split"] = split
    elif split is not None:
        inits, inputs = [ints("split", split)], ["x", "split"]
    model = make([node("Split", inputs, names, **attrs)], [vi("x", F, [7, 5])], names, inits, opset)
    size = x.shape[axis]
    if split == "num":
        chunk = -(-size // outputs)
        sizes = [chunk] * (outputs - 1) + [size - chunk * (outputs - 1)]
    else:
        sizes = split or [size // outputs] * outputs
    want = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    check(model, [x], want)


def test_split_opset_1_takes_split_as_an_input():
    model = make(
        [node("Split", ["x", "split"], ["a", "b"], axis=1)],
        [vi("x", F, [2, 5])],
        ["a", "b"],
        [ints("split", [3, 2])],
        opset=1,
    )
    x = rand(2, 5)
    check(model, [x], [x[:, :3], x[:, 3:]])


@pytest.mark.parametrize(
    ("opset", "split", "attrs", "message"),
    [
        (13, [2, 2], {}, r"split \[2, 2\] does not cut an axis of 6 into 2 parts"),
        (13, None, {}, "an axis of 6 does not split into 4 equal parts"),
        (18, None, {"num_outputs": 3}, "attribute num_outputs=3 is not supported"),
    ],
)
def test_split_errors(opset, split, attrs, message):
    count = 2 if split else 4
    names = [f"y{i}" for i in range(count)]
    inits = [ints("split", split)] if split else []
    inputs = ["x", "split"] if split else ["x"]
    model = make(
        [node("Split", inputs, names, **attrs)], [vi("x", F, [6])], names, inits, opset, infer=False
    )
    fails(model, [rand(6)], message)


SLICES = [
    ([0, 1], [2, 3], None, None),
    ([1], [INT_MAX], [1], None),
    ([-3], [-1], [-1], None),
    ([1000], [2000], [0], None),
    ([-1000], [1000], [2], [2]),
    ([4, 3], [0, -INT_MAX], [1, 2], [-1, -2]),
    ([-1], [-INT_MAX], [0], [-3]),
    ([0, 0, 3], [20, 10, 4], [0, 1, 2], [1, 1, 1]),
    ([2], [1], [1], [-1]),
]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), SLICES)
def test_slice(starts, ends, axes, steps):
    x = rand(5, 6, 4)
    inits = [ints("starts", starts), ints("ends", ends)]
    inputs = ["x", "starts", "ends"]
    if axes is not None or steps is not None:
        inits.append(ints("axes", axes if axes is not None else list(range(len(starts)))))
        inputs.append("axes")
    if steps is not None:
        inits.append(ints("steps", steps))
        inputs.append("steps")
    model = make([node("Slice", inputs)], [vi("x", F, [5, 6, 4])], ["y"], inits)
    if 0 in run_onnxruntime(model, [x])[0].shape:
        return  # empty results: the simulator has no zero-size tensors
    check(model, [x])


def test_slice_attributes_before_opset_10():
    model = make(
        [node("Slice", ["x"], starts=[1, -2], ends=[INT_MAX, 100], axes=[0, 2])],
        [vi("x", F, [5, 6, 4])],
        ["y"],
        opset=9,
    )
    check(model, [rand(5, 6, 4)])


def test_slice_opset_10_negative_steps():
    inits = [ints("s", [-1, 3]), ints("e", [-INT_MAX, 0]), ints("a", [0, 2]), ints("t", [-2, -1])]
    model = make(
        [node("Slice", ["x", "s", "e", "a", "t"])], [vi("x", F, [5, 6, 4])], ["y"], inits, 10
    )
    x = rand(5, 6, 4)
    check(model, [x], [x[::-2, :, 3:0:-1]])


def test_slice_step_zero_is_an_error():
    inits = [ints("s", [0]), ints("e", [3]), ints("a", [0]), ints("t", [0])]
    model = make(
        [node("Slice", ["x", "s", "e", "a", "t"])], [vi("x", F, [4])], ["y"], inits, infer=False
    )
    fails(model, [rand(4)], "the step of axis 0 is zero")


@pytest.mark.parametrize(("opset", "repeats"), [(13, [2, 1, 3]), (13, [1, 1, 1]), (6, [1, 2, 1])])
def test_tile(opset, repeats):
    model = make(
        [node("Tile", ["x", "r"])], [vi("x", F, [2, 3, 1])], ["y"], [ints("r", repeats)], opset
    )
    check(model, [rand(2, 3, 1)])


def test_tile_opset_1_repeats_one_axis():
    model = make(
        [node("Tile", ["x", "tiles", "axis"])],
        [vi("x", F, [2, 3])],
        ["y"],
        [ints("tiles", 3), ints("axis", 1)],
        opset=1,
    )
    x = rand(2, 3)
    check(model, [x], [np.tile(x, (1, 3))])


@pytest.mark.parametrize("shape", [[3, 4], [2, 1, 4], [1], [4, 1, 1, 1]])
def test_expand(shape):
    model = make([node("Expand", ["x", "s"])], [vi("x", F, [3, 1])], ["y"], [ints("s", shape)])
    check(model, [rand(3, 1)])


def test_expand_mismatch_is_an_error():
    model = make(
        [node("Expand", ["x", "s"])], [vi("x", F, [3, 2])], ["y"], [ints("s", [4])], infer=False
    )
    fails(model, [rand(3, 2)], r"shape \(3, 2\) does not expand to \[4\]")


# ---------------------------------------------------------------------------------------------
# Padding and cropping
# ---------------------------------------------------------------------------------------------

PADS = [
    ([1, 0, 2, 1], "constant"),
    ([1, 2, 1, 2], "reflect"),
    ([0, 3, 2, 1], "edge"),
    ([2, 1, 1, 4], "wrap"),
    ([-1, 1, 0, -2], "constant"),
    ([1, -1, -1, 2], "edge"),
    ([-1, 2, 1, -1], "reflect"),
]


@pytest.mark.parametrize(("pads", "mode"), PADS)
def test_pad(pads, mode):
    x = rand(4, 5)
    inits = [ints("pads", pads), tensor("v", np.float32(1.5))]
    model = make(
        [node("Pad", ["x", "pads", "v"], mode=mode)], [vi("x", F, [4, 5])], ["y"], inits, 19
    )
    check(model, [x])


@pytest.mark.parametrize("opset", [1, 2, 10])
def test_pad_attributes_before_opset_11(opset):
    key = "paddings" if opset < 2 else "pads"
    model = make(
        [node("Pad", ["x"], mode="constant", value=2.0, **{key: [0, 1, 2, 0]})],
        [vi("x", F, [2, 3])],
        ["y"],
        opset=opset,
    )
    x = rand(2, 3)
    check(model, [x], [np.pad(x, [(0, 2), (1, 0)], constant_values=2.0)])


@pytest.mark.parametrize("axes", [[1], [-1, 0]])
def test_pad_axes(axes):
    pads = [1, 2] if len(axes) == 1 else [1, 0, 2, 3]
    inits = [ints("pads", pads), tensor("v", np.float32(0.5)), ints("axes", axes)]
    model = make(
        [node("Pad", ["x", "pads", "v", "axes"])], [vi("x", F, [2, 3])], ["y"], inits, opset=18
    )
    check(model, [rand(2, 3)])


def test_pad_runtime_value_and_integers():
    model = make(
        [node("Pad", ["x", "pads", "v"])],
        [vi("x", I32, [2, 3]), vi("v", I32, [])],
        [vi("y", I32)],
        [ints("pads", [1, 0, 0, 2])],
        opset=18,
    )
    check(model, [np.arange(6, dtype=np.int32).reshape(2, 3), np.array(-7, np.int32)])


def test_pad_errors():
    model = make(
        [node("Pad", ["x", "p"], mode="wrap")],
        [vi("x", F, [3])],
        ["y"],
        [ints("p", [1, 1])],
        18,
        infer=False,
    )
    fails(model, [rand(3)], "attribute mode=wrap is not supported")
    model = make(
        [node("Pad", ["x", "p"])], [vi("x", F, [3])], ["y"], [ints("p", [1])], 18, infer=False
    )
    fails(model, [rand(3)], r"pads \[1\] need two amounts for each of 1 axes")


@pytest.mark.parametrize(
    ("shape", "axes", "target"),
    [((6, 5, 3), None, [4, 8, 3]), ((6, 5, 3), [0, 1], [3, 5]), ((3, 6, 5), [-2, -1], [3, 9])],
)
def test_center_crop_pad(shape, axes, target):
    x = rand(*shape)
    attrs = {} if axes is None else {"axes": axes}
    model = make(
        [node("CenterCropPad", ["x", "s"], **attrs)],
        [vi("x", F, list(shape))],
        ["y"],
        [ints("s", target)],
        opset=18,
    )
    axes = list(range(len(shape))) if axes is None else [a % len(shape) for a in axes]
    out_shape = list(shape)
    for a, t in zip(axes, target, strict=True):
        out_shape[a] = t
    want = np.zeros(out_shape, np.float32)
    src, dst = [], []
    for a in range(len(shape)):
        n, m = shape[a], out_shape[a]
        if m <= n:
            src.append(slice((n - m) // 2, (n - m) // 2 + m))
            dst.append(slice(None))
        else:
            src.append(slice(None))
            dst.append(slice((m - n) // 2, (m - n) // 2 + n))
    want[tuple(dst)] = x[tuple(src)]
    check(model, [x], [want])


# ---------------------------------------------------------------------------------------------
# Gathers and scatters
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("axis", "indices"), [(0, [[0, 2], [-1, 1]]), (1, [3, -4, 0]), (-1, 1), (2, [[1], [0]])]
)
def test_gather(axis, indices):
    model = make(
        [node("Gather", ["x", "i"], axis=axis)],
        [vi("x", F, [3, 4, 2]), vi("i", I64, np.shape(indices))],
        ["y"],
    )
    check(model, [rand(3, 4, 2), np.array(indices, np.int64)])


def test_gather_from_a_constant_with_int32_indices():
    model = make(
        [node("Gather", ["table", "i"], axis=0)], [vi("i", I32, [2, 2])], ["y"],
        [tensor("table", rand(5, 3))],
    )  # fmt: skip
    check(model, [np.array([[4, 0], [-1, 2]], np.int32)])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    indices = np.array([[0, 2, -1], [1, 0, 2]], np.int64)
    model = make(
        [node("GatherElements", ["x", "i"], axis=axis)],
        [vi("x", F, [3, 3]), vi("i", I64, [2, 3])],
        ["y"],
    )
    check(model, [rand(3, 3), indices])


@pytest.mark.parametrize(
    ("batch_dims", "data", "indices"),
    [(0, (2, 3, 4), [[0, 1], [1, -1]]), (0, (2, 3, 4), [[[1]], [[0]]]), (1, (2, 3, 4), [[1], [2]])],
)
def test_gather_nd(batch_dims, data, indices):
    model = make(
        [node("GatherND", ["x", "i"], batch_dims=batch_dims)],
        [vi("x", F, list(data)), vi("i", I64, np.shape(indices))],
        ["y"],
    )
    check(model, [rand(*data), np.array(indices, np.int64)])


@pytest.mark.parametrize(
    ("op", "opset", "reduction", "axis"),
    [
        ("Scatter", 9, None, 0),
        ("Scatter", 10, None, 1),
        ("ScatterElements", 11, None, -1),
        ("ScatterElements", 16, "add", 0),
        ("ScatterElements", 16, "mul", 1),
        ("ScatterElements", 18, "max", 0),
        ("ScatterElements", 18, "min", 1),
    ],
)
def test_scatter_elements(op, opset, reduction, axis):
    attrs = {"axis": axis} | ({} if reduction is None else {"reduction": reduction})
    indices = np.array([[1, 0, 2], [0, 2, 1]], np.int64)
    if opset >= 11:
        indices[0, 0] = -2
    model = make(
        [node(op, ["x", "i", "u"], **attrs)],
        [vi("x", F, [3, 3]), vi("i", I64, [2, 3]), vi("u", F, [2, 3])],
        ["y"],
        opset=opset,
    )
    check(model, [rand(3, 3), indices, rand(2, 3, seed=1)])


@pytest.mark.parametrize("reduction", [None, "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    attrs = {} if reduction is None else {"reduction": reduction}
    indices = np.array([[0], [2]], np.int64) if reduction is None else np.array([[0], [0]])
    model = make(
        [node("ScatterND", ["x", "i", "u"], **attrs)],
        [vi("x", F, [4, 2, 3]), vi("i", I64, [2, 1]), vi("u", F, [2, 2, 3])],
        ["y"],
        opset=18,
    )
    check(model, [rand(4, 2, 3), indices.astype(np.int64), rand(2, 2, 3, seed=1)])


def test_scatter_reduction_needs_its_opset():
    model = make(
        [node("ScatterND", ["x", "i", "u"], reduction="max")],
        [vi("x", F, [4]), vi("i", I64, [1, 1]), vi("u", F, [1])],
        ["y"],
        opset=16,
    )
    fails(model, [rand(4), np.array([[0]]), rand(1)], "attribute reduction=max is not supported")


def tensor_scatter_reference(cache, update, starts, axis, circular):
    out = cache.copy()
    size = cache.shape[axis]
    for b in range(cache.shape[0]):
        for s in range(update.shape[axis]):
            position = starts[b] + s
            position = position % size if circular else position
            src = [b] + [slice(None)] * (cache.ndim - 1)
            dst = list(src)
            src[axis], dst[axis] = s, position
            out[tuple(dst)] = update[tuple(src)]
    return out


@pytest.mark.parametrize(
    ("mode", "axis", "starts"),
    [
        ("linear", -2, [1, 0]),
        ("circular", -2, [3, 4]),
        ("linear", 1, None),
        ("circular", 2, [2, 1]),
    ],
)
def test_tensor_scatter(mode, axis, starts):
    cache, update = rand(2, 5, 3, 4), rand(2, 5, 3, 4, seed=1)
    axis_n = axis % 4
    update = np.take(update, range(2), axis=axis_n)
    inputs = [vi("c", F, list(cache.shape)), vi("u", F, list(update.shape))]
    feeds, names = [cache, update], ["c", "u"]
    if starts is not None:
        inputs.append(vi("w", I64, [2]))
        feeds.append(np.array(starts, np.int64))
        names.append("w")
    model = make([node("TensorScatter", names, mode=mode, axis=axis)], inputs, ["y"], opset=24)
    want = tensor_scatter_reference(cache, update, starts or [0, 0], axis_n, mode == "circular")
    check(model, feeds, [want])


@pytest.mark.parametrize(("batch_axis", "time_axis"), [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis, time_axis):
    x = rand(4, 4, 2)
    lengths = np.array([4, 3, 1, 2], np.int64)
    model = make(
        [node("ReverseSequence", ["x", "l"], batch_axis=batch_axis, time_axis=time_axis)],
        [vi("x", F, [4, 4, 2]), vi("l", I64, [4])],
        ["y"],
        opset=10,
    )
    check(model, [x, lengths])


# ---------------------------------------------------------------------------------------------
# Masks, one-hot, running sums
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1, -7, 9])
def test_trilu(upper, k):
    inputs, feeds = [vi("x", F, [2, 3, 5])], [rand(2, 3, 5)]
    if k is not None:
        inputs.append(vi("k", I64, []))
        feeds.append(np.array(k, np.int64))
    names = ["x"] if k is None else ["x", "k"]
    model = make([node("Trilu", names, upper=upper)], inputs, ["y"], opset=14)
    check(model, feeds)


def test_trilu_with_a_constant_k_on_integers():
    model = make(
        [node("Trilu", ["x", "k"], upper=0)], [vi("x", I32, [4, 4])], [vi("y", I32)],
        [ints("k", 1)], opset=14,
    )  # fmt: skip
    check(model, [np.arange(16, dtype=np.int32).reshape(4, 4)])


@pytest.mark.parametrize(
    ("opset", "axis", "indices", "index_type"),
    [
        (11, -1, [[1, 9], [2, -3]], I64),
        (11, 0, [[1, 9], [2, -3]], I64),
        (11, 1, [1.0, 3.0, -1.0], F),
        (9, -1, [0, 2, -1], I32),
    ],
)
def test_one_hot(opset, axis, indices, index_type):
    index_dtype = helper.tensor_dtype_to_np_dtype(index_type)
    model = make(
        [node("OneHot", ["i", "depth", "v"], axis=axis)],
        [vi("i", index_type, np.shape(indices)), vi("v", F, [2])],
        ["y"],
        [tensor("depth", np.array(4.0, np.float32))],
        opset=opset,
    )
    feeds = [np.array(indices, index_dtype), np.array([-1.0, 5.0], np.float32)]
    if opset < 11:  # negative indices are off everywhere before opset 11
        hot = np.array(indices)[..., None] == np.arange(4)
        check(model, feeds, [np.where(np.moveaxis(hot, -1, axis), 5.0, -1.0).astype(np.float32)])
    else:
        check(model, feeds)


def test_one_hot_needs_a_known_depth():
    model = make(
        [node("OneHot", ["i", "d", "v"])],
        [vi("i", I64, [2]), vi("d", I64, []), vi("v", F, [2])],
        ["y"],
        opset=11,
        infer=False,
    )
    fails(model, [np.array([0, 1]), np.array(3), np.array([0, 1], np.float32)], "depth")


@pytest.mark.parametrize(
    ("axis", "exclusive", "reverse", "dtype"),
    [(0, 0, 0, F), (1, 1, 0, F), (-1, 0, 1, TensorProto.DOUBLE), (0, 1, 1, I32)],
)
def test_cumsum(axis, exclusive, reverse, dtype):
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    model = make(
        [node("CumSum", ["x", "axis"], exclusive=exclusive, reverse=reverse)],
        [vi("x", dtype, [3, 4])],
        [vi("y", dtype)],
        [tensor("axis", np.array(axis, np.int32))],
        opset=14,
    )
    check(model, [(rand(3, 4) * 4).astype(np_dtype)])


def test_cumsum_of_a_vector_with_a_runtime_axis():
    model = make(
        [node("CumSum", ["x", "axis"], exclusive=1)],
        [vi("x", F, [5]), vi("axis", I32, [])],
        ["y"],
        opset=11,
    )
    check(model, [rand(5), np.array(-1, np.int32)])


# ---------------------------------------------------------------------------------------------
# Data-dependent shapes
# ---------------------------------------------------------------------------------------------


def test_non_zero_and_compress_of_known_inputs():
    cond = np.array([True, False, True, True])
    model = make(
        [node("NonZero", ["k"], ["nz"]), node("Compress", ["x", "cond"], ["c"], axis=1),
         node("Cast", ["nz"], ["nzf"], to=F), node("Add", ["nzf", "b"], ["z"])],
        [vi("x", F, [2, 4]), vi("b", F, [2, 3])],
        ["c", "z"],
        [tensor("cond", cond), tensor("k", np.array([[0, 1, 2], [3, 0, 0]], np.float32))],
    )  # fmt: skip
    check(model, [rand(2, 4), rand(2, 3, seed=1)])


def test_compress_of_a_known_condition_without_axis_flattens():
    model = make(
        [node("Compress", ["x", "cond"])],
        [vi("x", F, [2, 3])],
        ["y"],
        [tensor("cond", np.array([0, 1, 1, 0, 1], bool))],
        opset=11,
    )
    x = rand(2, 3)
    check(model, [x], [x.reshape(-1)[[1, 2, 4]]])


@pytest.mark.parametrize(
    ("op", "inputs", "dtypes", "message"),
    [
        ("NonZero", ["x"], [F], "input 'X' (graph input 'x') must be a constant: the output "
         "shape of NonZero depends on it"),
        ("Compress", ["x", "c"], [F, TensorProto.BOOL], "input 'condition' (graph input 'c') "
         "must be a constant: the output shape of Compress depends on it"),
        ("Unique", ["x"], [F], "input 'X' (graph input 'x') must be a constant: the output "
         "shape of Unique depends on it"),
        ("NonMaxSuppression", ["x", "s"], [F, F], "input 'boxes' (graph input 'x') must be a "
         "constant: the output shape of NonMaxSuppression depends on it"),
    ],
)  # fmt: skip
def test_data_dependent_shapes_are_errors(op, inputs, dtypes, message):
    model = make(
        [node(op, inputs)],
        [vi(n, t, [1, 2, 4]) for n, t in zip(inputs, dtypes, strict=True)],
        [vi("y", I64 if op in ("NonZero", "NonMaxSuppression") else F)],
        opset=11,
        infer=False,
    )
    feeds = [np.ones((1, 2, 4), helper.tensor_dtype_to_np_dtype(t)) for t in dtypes]
    fails(model, feeds, re.escape(message))


@pytest.mark.parametrize("sorted_", [1, 0])
@pytest.mark.parametrize("axis", [None, 0, -1])
def test_unique_of_a_run_time_input_specializes_on_its_value(sorted_, axis):
    """The backend fixes the input to its value; the four outputs match onnxruntime."""
    attrs = {"sorted": sorted_} if axis is None else {"sorted": sorted_, "axis": axis}
    outputs = ["y", "first", "inverse", "counts"]
    model = make(
        [node("Unique", ["x"], outputs, **attrs)],
        [vi("x", F, [3, 4])],
        [vi(name, F if name == "y" else I64) for name in outputs],
        opset=11,
        infer=False,
    )
    x = np.array([[2, 1, 2, 1], [0, 5, 0, 5], [2, 1, 2, 1]], np.float32)
    check(model, [x])


@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cum_prod(exclusive, reverse):
    model = make(
        [node("CumProd", ["x", "a"], exclusive=exclusive, reverse=reverse)],
        [vi("x", F, [3, 4])],
        ["y"],
        [ints("a", 1)],
        26,
        infer=False,
    )
    x = rand(3, 4) + 1.5
    source = x[:, ::-1] if reverse else x
    want = np.cumprod(source, axis=1)
    if exclusive:
        want = np.concatenate([np.ones((3, 1), np.float32), want[:, :-1]], axis=1)
    want = want[:, ::-1] if reverse else want
    (got,) = run_model(model, [x])
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_the_backend_fixes_shape_inputs_to_their_values():
    """A Reshape whose target shape is fed at run time compiles once per shape value."""
    model = make(
        [node("Reshape", ["x", "s"])], [vi("x", F, [2, 6]), vi("s", I64, [2])], ["y"], infer=False
    )
    rep = prepare(model)
    x = rand(2, 6)
    for shape in ([3, 4], [4, 3], [3, 4]):
        (got,) = rep.run([x, np.array(shape, np.int64)])
        np.testing.assert_array_equal(got, x.reshape(shape))
    assert len(rep.artifacts) == 2
    assert [spec["name"] for spec in next(iter(rep.artifacts.values())).manifest["inputs"]] == ["x"]


def test_onnx_models_are_valid():
    """A sanity check of the helpers: the models this module builds pass the checker."""
    model = make([node("Flatten", ["x"])], [vi("x", F, [2, 3])], ["y"])
    onnx.checker.check_model(model)


@pytest.mark.parametrize(
    ("nodes", "inputs", "inits", "opset", "message"),
    [
        (
            [node("TensorScatter", ["c", "u"], axis=0)],
            [vi("c", F, [2, 3]), vi("u", F, [1, 3])],
            [],
            24,
            r"\(TensorScatter\): attribute axis=0 is not supported \(axis 0 is the batch\)",
        ),
        (
            [node("EyeLike", ["x"], ["e"]), node("Add", ["x", "e"])],
            [vi("x", F, [2, 3, 4])],
            [],
            13,
            r"\(EyeLike\): the input must be 2-D, got shape \(2, 3, 4\)",
        ),
        (
            [node("ScatterElements", ["x", "i", "u"])],
            [vi("x", F, [3, 3]), vi("u", F, [2, 2])],
            [ints("i", [[0, 1, 2], [1, 2, 0]])],
            13,
            r"\(ScatterElements\): indices \(2, 3\) and updates \(2, 2\) need one shape",
        ),
        (
            [node("Range", ["a", "b", "d"], ["r"]), node("Add", ["x", "r"])],
            [vi("x", I64, [3])],
            [ints("a", 0), ints("b", 3), ints("d", 0)],
            11,
            r"\(Range\): input 'delta' must not be zero",
        ),
        (
            [node("OneHot", ["i", "d", "v"])],
            [vi("i", I64, [2])],
            [ints("d", 0), tensor("v", np.array([0, 1], np.float32))],
            11,
            r"\(OneHot\): input 'depth' must be positive, got 0",
        ),
        (
            [node("GatherElements", ["x", "i"])],
            [vi("x", F, [3, 3])],
            [ints("i", [0, 1])],
            13,
            r"\(GatherElements\): indices \(2,\) must have the data's rank 2",
        ),
    ],
)
def test_node_errors(nodes, inputs, inits, opset, message):
    model = make(nodes, inputs, ["y"], inits, opset, infer=False)
    feeds = []
    for value in inputs:
        t = value.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        feeds.append(np.zeros(shape, helper.tensor_dtype_to_np_dtype(t.elem_type)))
    fails(model, feeds, message)


def test_compile_fixes_inputs_given_values():
    """``cgc.compile(values=...)`` makes a shape input a constant and drops it from the inputs."""
    import cgc

    model = make(
        [node("Reshape", ["x", "s"])], [vi("x", F, [2, 6]), vi("s", I64, [2])], ["y"], infer=False
    )
    artifact = cgc.compile(
        model, mode="weight_streaming", target="mesh8x8", values={"s": np.array([4, 3])}
    )
    assert [spec["name"] for spec in artifact.manifest["inputs"]] == ["x"]
    x = rand(2, 6)
    np.testing.assert_array_equal(cgc.run(artifact, {"x": x})["y"], x.reshape(4, 3))
    with pytest.raises(CgcError, match=r"a value is given for 'z', which is not a graph input"):
        cgc.compile(model, target="mesh8x8", values={"z": np.array([1])})
    with pytest.raises(CgcError, match=r"the value of input 's' is int32, not int64"):
        cgc.compile(model, target="mesh8x8", values={"s": np.array([4, 3], np.int32)})
    with pytest.raises(
        CgcError,
        match=r"the value of input 's' has shape \[3\], but the input is declared as \[2\]",
    ):
        cgc.compile(model, target="mesh8x8", values={"s": np.array([4, 3, 1])})
    symbolic = make(
        [node("Reshape", ["x", "s"])], [vi("x", F, [2, 6]), vi("s", I64, ["n"])], ["y"], infer=False
    )
    fixed = cgc.compile(symbolic, target="mesh8x8", values={"s": np.array([3, 4])})
    np.testing.assert_array_equal(cgc.run(fixed, {"x": x})["y"], x.reshape(3, 4))
    with pytest.raises(CgcError, match=r"has shape \[2, 1\], but the input is declared as \[\?\]"):
        cgc.compile(symbolic, target="mesh8x8", values={"s": np.array([[4], [3]])})


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("score_threshold", [None, 0.3])
def test_non_max_suppression_of_known_boxes(center, score_threshold):
    """Boxes and scores fed at run time: the backend compiles again with them fixed, and the
    selection equals onnxruntime's (ties in score included)."""
    rng = np.random.default_rng(center)
    corners = rng.uniform(0, 10, (2, 12, 4)).astype(np.float32)
    if center:
        corners[..., :2] /= 3  # centers close together, so that boxes overlap
        corners[..., 2:] = corners[..., 2:] / 2 + 0.5
    scores = rng.uniform(0, 1, (2, 3, 12)).astype(np.float32)
    scores[:, :, 5] = scores[:, :, 2]
    inits = [ints("limit", [8]), tensor("iou", np.array([0.2], np.float32))]
    names = ["boxes", "scores", "limit", "iou"]
    if score_threshold is not None:
        inits.append(tensor("floor", np.array([score_threshold], np.float32)))
        names.append("floor")
    model = make(
        [node("NonMaxSuppression", names, center_point_box=center)],
        [vi("boxes", F, [2, 12, 4]), vi("scores", F, [2, 3, 12])],
        [vi("y", I64, None)],
        inits,
        opset=11,
        infer=False,
    )
    (got,) = check(model, [corners, scores])
    assert 0 < len(got) < 2 * 3 * 8, "some boxes are kept, some suppressed"
