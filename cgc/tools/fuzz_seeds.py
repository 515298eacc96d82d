"""The fuzzer's seeds: small valid ONNX models, and a tiny params file.

``cgc.tools.fuzz`` breaks these with the mutators of ``fuzz_mutators`` (models, params files,
bytes) and ``fuzz_artifacts`` (artifacts compiled from them).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
F32 = TensorProto.FLOAT


def _model(
    name: str, nodes: list, inputs: list, outputs: list, weights: dict[str, np.ndarray]
) -> onnx.ModelProto:
    initializers = [numpy_helper.from_array(array, key) for key, array in weights.items()]
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _vi(name: str, shape: list[int], elem: int = F32) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.5).astype(np.float32)


def seed_models() -> dict[str, onnx.ModelProto]:
    """Six small valid models, each exercising a different corner of the ONNX frontend."""
    rng = np.random.default_rng(0)
    node = helper.make_node
    models = {
        "mlp": _model(
            "mlp",
            [
                node("MatMul", ["x", "w1"], ["h"], name="fc1"),
                node("Add", ["h", "b1"], ["hb"], name="bias1"),
                node("Relu", ["hb"], ["r"], name="relu"),
                node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2", alpha=1.0, transB=0),
            ],
            [_vi("x", [2, 8])],
            [_vi("y", [2, 4])],
            {
                "w1": _rand(rng, 8, 16),
                "b1": _rand(rng, 16),
                "w2": _rand(rng, 16, 4),
                "b2": _rand(rng, 4),
            },
        ),
        "conv": _model(
            "conv",
            [
                node(
                    "Conv",
                    ["x", "k", "kb"],
                    ["c"],
                    name="conv",
                    pads=[1, 1, 1, 1],
                    kernel_shape=[3, 3],
                    strides=[1, 1],
                ),
                node("Relu", ["c"], ["r"], name="relu"),
                node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
                node("Flatten", ["p"], ["f"], name="flatten", axis=1),
                node("Gemm", ["f", "w", "b"], ["y"], name="fc", transB=1),
            ],
            [_vi("x", [2, 3, 8, 8])],
            [_vi("y", [2, 5])],
            {
                "k": _rand(rng, 4, 3, 3, 3),
                "kb": _rand(rng, 4),
                "w": _rand(rng, 5, 64),
                "b": _rand(rng, 5),
            },
        ),
        "embedding": _model(
            "embedding",
            [
                node("Gather", ["table", "ids"], ["e"], name="embed", axis=0),
                node("MatMul", ["e", "proj"], ["y"], name="proj"),
            ],
            [_vi("ids", [2, 5], TensorProto.INT64)],
            [_vi("y", [2, 5, 4])],
            {"table": _rand(rng, 10, 8), "proj": _rand(rng, 8, 4)},
        ),
        "movement": _model(
            "movement",
            [
                node("Reshape", ["x", "shape"], ["r"], name="reshape"),
                node("Concat", ["r", "c"], ["cat"], name="concat", axis=2),
                node("Slice", ["cat", "starts", "ends", "axes"], ["y"], name="slice"),
            ],
            [_vi("x", [2, 6])],
            [_vi("y", [2, 3, 3])],
            {
                "shape": np.array([2, 3, 2], np.int64),
                "c": _rand(rng, 2, 3, 2),
                "starts": np.array([1], np.int64),
                "ends": np.array([4], np.int64),
                "axes": np.array([2], np.int64),
            },
        ),
        "layernorm": _model(
            "layernorm",
            [
                node(
                    "LayerNormalization",
                    ["x", "g", "beta"],
                    ["y"],
                    name="ln",
                    axis=-1,
                    epsilon=1e-5,
                )
            ],
            [_vi("x", [2, 4, 8])],
            [_vi("y", [2, 4, 8])],
            {"g": _rand(rng, 8) + 1.0, "beta": _rand(rng, 8)},
        ),
        "softmax": _model(
            "softmax",
            [
                node("MatMul", ["x", "w"], ["z"], name="logits"),
                node("Softmax", ["z"], ["y"], name="softmax", axis=-1),
            ],
            [_vi("x", [2, 10])],
            [_vi("y", [2, 6])],
            {"w": _rand(rng, 10, 6)},
        ),
    }
    return models


TINY_PARAMS = """\
model:
  hidden_size: 64
  num_hidden_layers: 2
  num_heads: 4
  filter_size: 128
  vocab_size: 100
  max_position_embeddings: 32
train_input:
  batch_size: 4
  max_sequence_length: 32
optimizer:
  optimizer_type: adamw
  learning_rate: 0.001
runconfig:
  num_csx: 1
"""
"""A tiny params file (a GPT of two layers): the seed of the params door."""
