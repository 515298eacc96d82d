"""The ONNX door (issue 13): broken or hostile ONNX files end in a one-line ``CgcError`` naming
the file and the culprit (exit code 2 from ``cgc compile``), never in an internal error, and a
tensor too large to hold is refused before anything is allocated for it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from test_frontend_onnx import _error as error

from cgc.cli import main
from cgc.errors import CgcError
from cgc.frontends.onnx import import_model, import_onnx

F = TensorProto.FLOAT


def vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def make(nodes, inputs, outputs, inits=(), opset=13):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def matmul():
    """``y = x @ w`` with a float initializer ``w``."""
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    return make([node], [vi("x", [2, 4])], [vi("y", [2, 3])], [w])


def relu(*attrs, inputs=("x",), outputs=("y",), **kwargs):
    node = helper.make_node("Relu", list(inputs), list(outputs), name="r", **kwargs)
    node.attribute.extend(attrs)
    return make([node], [vi("x", [2, 3])], [vi(o, [2, 3]) for o in outputs if o])


def mutated(mutate):
    model = matmul()
    mutate(model)
    return model


def _softmax(**attrs):
    node = helper.make_node("Softmax", ["x"], ["y"], name="s", **attrs)
    return make([node], [vi("x", [2, 3])], [vi("y", [2, 3])])


def _leaky_relu_with_graph_alpha():
    node = helper.make_node("LeakyRelu", ["x"], ["y"], name="l")
    node.attribute.append(helper.make_attribute("alpha", helper.make_graph([], "s", [], [])))
    return make([node], [vi("x", [2, 3])], [vi("y", [2, 3])])


def _two_valued_attribute():
    """An INT attribute with a FLOAT value set too."""
    model = _softmax(axis=1)
    model.graph.node[0].attribute[0].f = 2.0
    return model


def _short_tensor():
    """A float tensor of dims [3] with two values (``make_tensor`` refuses to build it)."""
    tensor = helper.make_tensor("c", F, [2], [1.0, 2.0])
    tensor.dims[0] = 3
    return tensor


def _two_writers():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name=n) for n in ("r1", "r2")]
    return make(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])])


def _writes_initializer():
    model = matmul()
    model.graph.node.insert(0, helper.make_node("Relu", ["x"], ["w"], name="r0"))
    return model


def _set(field, value, where=lambda m: m.graph.initializer[0]):
    return lambda m: setattr(where(m), field, value)


def _elem_type(value, where):
    return lambda m: setattr(where(m).type.tensor_type, "elem_type", value)


def _dim(value):
    return lambda m: setattr(m.graph.input[0].type.tensor_type.shape.dim[1], "dim_value", value)


BROKEN = {
    "raw data shorter than the dims": (
        mutated(_set("raw_data", b"\0" * 10)),
        "model.onnx: initializer 'w' has 10 bytes of raw_data, but its dims [4, 3] of float "
        "need 48",
    ),
    "raw data longer than the dims": (
        mutated(_set("raw_data", b"\0" * 52)),
        "model.onnx: initializer 'w' has 52 bytes of raw_data, but its dims [4, 3] of float "
        "need 48",
    ),
    "typed data shorter than the dims": (
        make(
            [helper.make_node("Identity", ["c"], ["y"], name="id")],
            [],
            [vi("y", [3])],
            [_short_tensor()],
        ),
        "model.onnx: initializer 'c' has 2 entries of float_data, but its dims [3] of float need 3",
    ),
    "element type outside the enum": (
        mutated(_set("data_type", 99)),
        "model.onnx: initializer 'w' has data type 99, not an ONNX element type",
    ),
    "undefined initializer type": (
        mutated(_set("data_type", TensorProto.UNDEFINED)),
        "model.onnx: initializer 'w' has data type UNDEFINED, not an ONNX element type",
    ),
    "undefined input type": (
        mutated(_elem_type(TensorProto.UNDEFINED, lambda m: m.graph.input[0])),
        "model.onnx: input 'x' has element type UNDEFINED, not an ONNX element type",
    ),
    "output type outside the enum": (
        mutated(_elem_type(77, lambda m: m.graph.output[0])),
        "model.onnx: output 'y' has element type 77, not an ONNX element type",
    ),
    "value_info type outside the enum": (
        mutated(lambda m: m.graph.value_info.append(vi("y", [2, 3], 123))),
        "model.onnx: value_info 'y' has element type 123, not an ONNX element type",
    ),
    "negative initializer dims": (
        mutated(lambda m: m.graph.initializer[0].dims.__setitem__(0, -4)),
        "model.onnx: initializer 'w' has negative dims [-4, 3]",
    ),
    "negative input dims": (
        mutated(_dim(-4)),
        "model.onnx: input 'x' has negative dims [2, -4]",
    ),
    "ints for an int": (
        _softmax(axis=[1, 2]),
        "model.onnx: node 's' (Softmax): attribute 'axis' is of kind INTS, but Softmax takes INT",
    ),
    "graph for a float": (
        _leaky_relu_with_graph_alpha(),
        "model.onnx: node 'l' (LeakyRelu): attribute 'alpha' is of kind GRAPH, but LeakyRelu "
        "takes FLOAT",
    ),
    "unknown attribute": (
        relu(helper.make_attribute("foo", 1)),
        "model.onnx: node 'r' (Relu): unknown attribute 'foo' (Relu has no attributes)",
    ),
    "attribute with two values": (
        _two_valued_attribute(),
        "model.onnx: node 's' (Softmax): attribute 'axis': ",
    ),
    "extra input": (
        relu(inputs=("x", "x")),
        "model.onnx: node 'r' (Relu): has 2 inputs; Relu-13 takes at most 1",
    ),
    "extra output": (
        relu(outputs=("y", "z")),
        "model.onnx: node 'r' (Relu): has 2 outputs; Relu-13 takes at most 1",
    ),
    "two nodes write one name": (
        _two_writers(),
        "model.onnx: node 'r2' (Relu): output 'y' has the name of an output of node 'r1' (Relu)",
    ),
    "a node writes a graph input": (
        relu(outputs=("x",)),
        "model.onnx: node 'r' (Relu): output 'x' has the name of input 'x'",
    ),
    "a node writes an initializer": (
        _writes_initializer(),
        "model.onnx: node 'r0' (Relu): output 'w' has the name of initializer 'w'",
    ),
    "no IR version": (
        mutated(_set("ir_version", 0, lambda m: m)),
        "model.onnx: IR version 0 is not supported",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_models_are_refused_in_one_line(case):
    model, expected = BROKEN[case]
    assert error(model).startswith(expected)


def test_models_the_checker_passes_still_import():
    """What the checker allows cgc still reads: Reshape's -1 is data, not a dimension; -1 in
    a declared shape marks an unknown dimension; an output may leave its type undefined."""
    shape = numpy_helper.from_array(np.array([-1], np.int64), "s")
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="r")]
    model = make(nodes, [vi("x", [2, 3])], [vi("y", [-1], TensorProto.UNDEFINED)], [shape])
    assert import_model(model).outputs[0].shape == (6,)


def test_constant_of_shape_of_terabytes_is_refused_before_allocation():
    dims = numpy_helper.from_array(np.array([10**6, 10**6], np.int64), "s")
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos")]
    model = make(nodes, [], [vi("y", None)], [dims])
    assert error(model) == (
        "model.onnx: node 'cos' (ConstantOfShape): output 'y' of [1000000, 1000000] float32 takes "
        "3.6 TiB (4000000000000 bytes), over cgc's 1.0 TiB limit"
    )


def test_range_of_terabytes_is_refused_before_allocation():
    limits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("a", 0), ("b", 10**12), ("d", 1))]  # fmt: skip
    nodes = [helper.make_node("Range", ["a", "b", "d"], ["y"], name="rg")]
    message = error(make(nodes, [], [vi("y", None, TensorProto.INT64)], limits))
    assert message.startswith(
        "model.onnx: node 'rg' (Range): output of [1000000000000] int64 takes"
    )


def test_folded_op_of_terabytes_is_refused_before_allocation():
    """Expand of a constant folds at compile time: its result is checked before it is."""
    one = numpy_helper.from_array(np.ones((1, 1), np.float32), "one")
    shape = numpy_helper.from_array(np.array([10**6, 10**6], np.int64), "s")
    nodes = [helper.make_node("Expand", ["one", "s"], ["y"], name="ex")]
    message = error(make(nodes, [], [vi("y", None)], [one, shape]))
    assert message.startswith("model.onnx: node 'ex' (Expand): result 0 of wse.")
    assert "takes 3.6 TiB (4000000000000 bytes)" in message


def test_input_shape_of_terabytes_is_refused():
    model = make([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", ["N", 64])],
                 [vi("y", ["N", 64])])  # fmt: skip
    assert error(model, shapes={"x": (99999999999, 64)}) == (
        "model.onnx: input 'x' of [99999999999, 64] float32 takes 23.3 TiB (25599999999744 bytes), "
        "over cgc's 1.0 TiB limit"
    )


# ---------------------------------------------------------------------------------------------
# External data
# ---------------------------------------------------------------------------------------------


def save_external(tmp_path, **info) -> str:
    """``matmul()`` with ``w`` in ``w.bin`` (48 bytes), its external data entries ``info``."""
    model = matmul()
    tensor = model.graph.initializer[0]
    (tmp_path / "w.bin").write_bytes(tensor.raw_data)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    entries = {"location": "w.bin", "offset": "0", "length": "48", **info}
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return str(path)


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"offset": "-8"}, "external data of tensor 'w': offset '-8' is not a whole number"),
        ({"length": "-8"}, "external data of tensor 'w': length '-8' is not a whole number"),
        ({"offset": "abc"}, "external data of tensor 'w': offset 'abc' is not a whole number"),
        (
            {"location": "../w.bin"},
            "external data of tensor 'w': location '../w.bin' is not a relative path inside "
            "the model's directory",
        ),
        (
            {"location": "/etc/passwd"},
            "external data of tensor 'w': location '/etc/passwd' is not a relative path",
        ),
        (
            {"offset": "40"},
            "external data file 'w.bin' of tensor 'w' has 48 bytes, fewer than offset 40 + "
            "length 48",
        ),
        (
            {"length": "40"},
            "initializer 'w' has 40 bytes of raw_data, but its dims [4, 3] of float need 48",
        ),
    ],
)
def test_bad_external_data_is_refused(tmp_path, info, expected):
    with pytest.raises(CgcError) as caught:
        import_onnx(save_external(tmp_path, **info))
    assert str(caught.value).startswith(f"m.onnx: {expected}")


def test_external_data_link_out_of_the_directory_is_refused(tmp_path):
    (tmp_path / "model").mkdir()
    path = save_external(tmp_path / "model")
    (tmp_path / "model" / "w.bin").rename(tmp_path / "w.bin")
    (tmp_path / "model" / "w.bin").symlink_to(tmp_path / "w.bin")
    with pytest.raises(CgcError, match=r"'w\.bin' of tensor 'w' is outside the model's directory"):
        import_onnx(path)


def test_good_external_data_still_loads(tmp_path):
    imported = import_onnx(save_external(tmp_path))
    np.testing.assert_array_equal(imported.weights["w"], np.ones((4, 3), np.float32))


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------


def compile_file(tmp_path, model, *args: str):
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    out = tmp_path / "m.cgc"
    return CliRunner().invoke(main, ["compile", str(path), "-o", str(out), *args])


@pytest.mark.parametrize(
    ("case", "args", "fragment"),
    [
        ("raw data shorter than the dims", (), "initializer 'w' has 10 bytes of raw_data"),
        ("element type outside the enum", (), "initializer 'w' has data type 99"),
        ("ints for an int", (), "node 's' (Softmax): attribute 'axis' is of kind INTS"),
        ("extra input", (), "node 'r' (Relu): has 2 inputs"),
        ("two nodes write one name", (), "node 'r2' (Relu): output 'y' has the name of"),
    ],
)
def test_cli_exits_2_with_one_line(tmp_path, case, args, fragment):
    result = compile_file(tmp_path, BROKEN[case][0], *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("error: m.onnx: "), result.output
    assert fragment in lines[0]


def test_cli_refuses_a_shape_of_terabytes(tmp_path):
    model = make([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", ["N", 64])],
                 [vi("y", ["N", 64])])  # fmt: skip
    result = compile_file(tmp_path, model, "--shape", "x=99999999999x64")
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        "error: m.onnx: input 'x' of [99999999999, 64] float32 takes 23.3 TiB (25599999999744 "
        "bytes), over cgc's 1.0 TiB limit"
    )
