"""Indices that come with the data are checked at run time (issue 13).

Gather, GatherElements, GatherND, ScatterElements and ScatterND refuse an index outside
``[-size, size)`` of its axis, and the losses a class label outside ``[0, classes)`` that is
not ``ignore_index``, as onnxruntime does: the run ends with a one-line ``CgcError`` naming
the node, the first bad index, its position and the valid range. OneHot is not checked: ONNX
gives an all-``off`` row for an index out of range.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import mlp_train_data, run_imported, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper

import cgc
from cgc.cli import main
from cgc.errors import CgcError
from cgc.frontends import zoo
from cgc.frontends.onnx import import_model
from cgc.machine import reference

TARGET = "mesh16x16"
VOCAB, WIDTH = 100, 8
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, "t", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _embedding():
    """``embed``: a Gather of token ids [2, 4] from a table [VOCAB, WIDTH]."""
    table = np.random.default_rng(0).standard_normal((VOCAB, WIDTH)).astype(np.float32)
    return _model(
        [helper.make_node("Gather", ["table", "ids"], ["y"], name="embed", axis=0)],
        [helper.make_tensor_value_info("ids", I64, [2, 4])],
        [helper.make_tensor_value_info("y", F, [2, 4, WIDTH])],
        [numpy_helper.from_array(table, "table")],
    )


@pytest.fixture(scope="module")
def embedding():
    model = _embedding()
    return model, cgc.compile(model, target=TARGET, mode="weight_streaming")


def _ids(bad: int) -> np.ndarray:
    ids = np.arange(8, dtype=np.int64).reshape(2, 4)
    ids[1, 3] = bad
    return ids


def test_token_ids_in_range_and_negative_ones_run(embedding) -> None:
    model, artifact = embedding
    ids = _ids(-VOCAB)  # the first row, counted from the end
    (expected,) = run_onnxruntime(model, {"ids": ids})
    np.testing.assert_array_equal(cgc.run(artifact, {"ids": ids})["y"], expected)


@pytest.mark.parametrize("bad", [VOCAB, 150, -VOCAB - 1])
def test_token_id_out_of_vocabulary_names_node_and_index(embedding, bad) -> None:
    _, artifact = embedding
    message = f"node 'embed' (gather): index {bad} at [1, 3] is outside [-100, 100) of axis 0"
    with pytest.raises(CgcError) as info:
        cgc.run(artifact, {"ids": _ids(bad)})
    assert str(info.value) == message


def test_interpreter_checks_like_the_runtime() -> None:
    imported = import_model(_embedding())
    with pytest.raises(CgcError, match=r"^node 'embed' \(gather\): index 150 at \[1, 3\]"):
        run_imported(imported, {"ids": _ids(150)})


def test_cli_run_with_bad_token_id_exits_2_with_one_line(embedding, tmp_path) -> None:
    _, artifact = embedding
    artifact.save(tmp_path / "embed.cgc")
    np.savez(tmp_path / "in.npz", ids=_ids(150))
    result = CliRunner().invoke(
        main, ["run", str(tmp_path / "embed.cgc"), "--inputs", str(tmp_path / "in.npz")]
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line]
    assert len(lines) == 1, result.output
    assert "node 'embed' (gather): index 150 at [1, 3] is outside [-100, 100)" in lines[0]


def _run_op(node, inputs, feeds, out_shape):
    model = _model([node], inputs, [helper.make_tensor_value_info("y", F, out_shape)])
    artifact = cgc.compile(model, target=TARGET, mode="pipelined")
    return cgc.run(artifact, feeds)["y"], model


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def test_gather_elements_out_of_range() -> None:
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], name="pick", axis=1)
    inputs = [_vi("x", F, [2, 3]), _vi("i", I64, [2, 2])]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    good = np.array([[0, -3], [2, -1]])
    y, model = _run_op(node, inputs, {"x": x, "i": good}, [2, 2])
    np.testing.assert_array_equal(y, run_onnxruntime(model, {"x": x, "i": good})[0])
    with pytest.raises(CgcError, match=r"node 'pick' \(gather_elements\): index 3 at \[1, 0\] "
                       r"is outside \[-3, 3\) of axis 1"):  # fmt: skip
        _run_op(node, inputs, {"x": x, "i": np.array([[0, 1], [3, 0]])}, [2, 2])


def test_gather_nd_names_the_axis_of_the_bad_coordinate() -> None:
    node = helper.make_node("GatherND", ["x", "i"], ["y"], name="nd")
    inputs = [_vi("x", F, [2, 3, 4]), _vi("i", I64, [2, 2])]
    x = np.zeros((2, 3, 4), dtype=np.float32)
    with pytest.raises(CgcError, match=r"node 'nd' \(gather_nd\): index -4 at \[1, 1\] "
                       r"is outside \[-3, 3\) of axis 1"):  # fmt: skip
        _run_op(node, inputs, {"x": x, "i": np.array([[1, 2], [0, -4]])}, [2, 4])


def test_scatter_nd_out_of_range() -> None:
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="put")
    inputs = [_vi("x", F, [4, 3]), _vi("i", I64, [2, 1]), _vi("u", F, [2, 3])]
    feeds = {"x": np.zeros((4, 3), np.float32), "u": np.ones((2, 3), np.float32)}
    with pytest.raises(CgcError, match=r"node 'put' \(scatter_nd\): index 4 at \[1, 0\] "
                       r"is outside \[-4, 4\) of axis 0"):  # fmt: skip
        _run_op(node, inputs, {**feeds, "i": np.array([[1], [4]])}, [4, 3])


def test_scatter_elements_out_of_range() -> None:
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], name="put", axis=0)
    inputs = [_vi("x", F, [3, 2]), _vi("i", I64, [1, 2]), _vi("u", F, [1, 2])]
    feeds = {"x": np.zeros((3, 2), np.float32), "u": np.ones((1, 2), np.float32)}
    with pytest.raises(CgcError, match=r"node 'put' \(scatter_elements\): index -5 at \[0, 1\] "
                       r"is outside \[-3, 3\) of axis 0"):  # fmt: skip
        _run_op(node, inputs, {**feeds, "i": np.array([[2, -5]])}, [3, 2])


def test_one_hot_out_of_range_gives_off_rows_as_onnxruntime() -> None:
    node = helper.make_node("OneHot", ["i", "depth", "values"], ["y"], name="hot", axis=-1)
    inits = [
        numpy_helper.from_array(np.array(4, np.int64), "depth"),
        numpy_helper.from_array(np.array([-1.0, 2.0], np.float32), "values"),
    ]
    model = _model([node], [_vi("i", I64, [5])], [_vi("y", F, [5, 4])], inits, opset=11)
    indices = np.array([0, 4, -5, 7, -1])  # 4, -5 and 7 are outside [-4, 4)
    artifact = cgc.compile(model, target=TARGET, mode="pipelined")
    (expected,) = run_onnxruntime(model, {"i": indices})
    got = cgc.run(artifact, {"i": indices})["y"]
    np.testing.assert_array_equal(got, expected)
    assert (got[1:4] == -1.0).all()


def test_labels_out_of_classes_stop_training_at_the_loss(tmp_path) -> None:
    data = mlp_train_data(16, seed=3)
    data["labels"] = data["labels"] + 100
    with pytest.raises(CgcError) as info:
        cgc.train(zoo.MODELS["mlp_train"](), data, batch_size=8, steps=1, model_dir=tmp_path,
                  target=TARGET)  # fmt: skip
    message = str(info.value)
    assert message.startswith("node 'loss' (one_hot): label ") and "\n" not in message
    assert f"label {data['labels'][0]} at [0] is outside the classes [0, 10)" in message


def test_interpreter_checks_loss_labels() -> None:
    imported = import_model(zoo.MODELS["mlp_train"](), batch_size=8)
    data = mlp_train_data(8, seed=3)
    data["labels"][2] = -1
    with pytest.raises(
        CgcError, match=r"^node 'loss' \(softmax_cross_entropy\): label -1 at \[2\]"
    ):
        run_imported(imported, data)


def _loss_model(ignore_index: int):
    """The MLP's loss on its own: SoftmaxCrossEntropyLoss of trainable scores."""
    model = zoo.MODELS["mlp_train"]()
    for node in model.graph.node:
        if node.op_type == "SoftmaxCrossEntropyLoss":
            node.attribute.append(helper.make_attribute("ignore_index", ignore_index))
    return model


def test_labels_equal_to_ignore_index_still_train(tmp_path) -> None:
    data = mlp_train_data(16, seed=3)
    data["labels"][::2] = -100
    result = cgc.train(_loss_model(-100), data, batch_size=8, steps=2, model_dir=tmp_path,
                       target=TARGET)  # fmt: skip
    assert all(np.isfinite(m["loss"]) and m["loss"] > 0 for m in result.metrics)
    data["labels"][1] = 10
    with pytest.raises(CgcError, match=r"label 10 at \[1\] is outside the classes \[0, 10\) "
                       r"and is not ignore_index -100"):  # fmt: skip
        cgc.train(_loss_model(-100), data, batch_size=8, steps=1, model_dir=tmp_path / "b",
                  target=TARGET)  # fmt: skip


def test_check_is_one_pass_and_names_the_first_bad_index() -> None:
    indices = np.array([[0, 5, -7], [9, 1, 2]])
    with pytest.raises(reference.IndexOutOfRange, match=r"^index -7 at \[0, 2\] is outside"):
        reference.check_indices(indices, 6, 0)
    reference.check_indices(np.zeros((0, 3), np.int64), 0, 0)  # nothing to check
    reference.check_labels(np.array([0, -100, 9]), 10, -100)


@pytest.mark.parametrize("ignore_index", [None, 1, -1])
def test_negative_log_likelihood_checks_its_targets(ignore_index) -> None:
    """Out-of-range targets other than ignore_index are an error, as in onnxruntime; the
    in-range ones (and the ignored) give onnxruntime's loss."""
    extra = {} if ignore_index is None else {"ignore_index": ignore_index}
    node = helper.make_node(
        "NegativeLogLikelihoodLoss", ["x", "t"], ["y"], name="nll", reduction="none", **extra
    )
    inputs = [_vi("x", F, [3, 4, 2]), _vi("t", I64, [3, 2])]
    x = np.random.default_rng(0).standard_normal((3, 4, 2)).astype(np.float32)
    good = np.array(
        [[0, 3], [1, 2], [3, 0]] if ignore_index is None else [[0, 3], [1, ignore_index], [3, 0]]
    )
    y, model = _run_op(node, inputs, {"x": x, "t": good}, [3, 2])
    np.testing.assert_allclose(y, run_onnxruntime(model, {"x": x, "t": good})[0], rtol=1e-6)
    bad = good.copy()
    bad[2, 1] = 4
    with pytest.raises(CgcError, match=r"node 'nll' \(one_hot\): label 4 at \[2, 1\]"):
        _run_op(node, inputs, {"x": x, "t": bad}, [3, 2])
