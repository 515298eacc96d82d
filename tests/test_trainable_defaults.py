"""The default trainable set of an ONNX model is its parameters, not the constants its
exporter lifted into initializers (``cgc.dialects.parameters``); ``--trainable`` and
``--frozen`` choose otherwise."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_cli import invoke

import cgc

F32 = np.float32


def constants_model(path) -> None:
    """A dense layer with a bias, an RMSNorm written out (its exponent, epsilon and scale as
    initializers), a 0-d scale, a one-element shift, an additive mask and a rotary-like table,
    and a squared-error loss."""
    rng = np.random.default_rng(0)
    inits = {
        "W": rng.standard_normal((4, 6)).astype(F32),
        "b": rng.standard_normal(6).astype(F32),
        "gamma": np.ones(6, F32),
        "two": np.array(2.0, F32),
        "eps": np.array([1e-6], F32),
        "scale": np.array(0.5, F32),
        "mask": np.array([0, 0, 0, -3.4e38, 0, 0], F32),
        "table": rng.standard_normal((3, 6)).astype(F32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h0"]),
        helper.make_node("Add", ["h0", "b"], ["h"]),
        helper.make_node("Pow", ["h", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["h", "rms"], ["normed"]),
        helper.make_node("Mul", ["normed", "gamma"], ["g"]),
        helper.make_node("Mul", ["g", "scale"], ["s"]),
        helper.make_node("Add", ["s", "mask"], ["masked"]),
        helper.make_node("Relu", ["masked"], ["r"]),
        helper.make_node("Mul", ["r", "table"], ["t"]),
        helper.make_node("Sub", ["t", "y"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "constants",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 6])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("constants")
    constants_model(root / "m.onnx")
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 3, 4)).astype(F32), rng.standard_normal((8, 3, 6)).astype(F32)
    np.savez(root / "data.npz", x=x, y=y)
    return root


def trained(model, **options) -> list[str]:
    artifact, _, _ = cgc.prepare_training(
        str(model / "m.onnx"), batch_size=4, target="mesh8x8", **options
    )
    return artifact.manifest["training"]["trainable"]


def test_an_onnx_models_constants_are_not_trained_by_default(model):
    assert trained(model) == ["W", "b", "gamma"]


def test_trainable_and_frozen_choose_otherwise(model):
    assert trained(model, trainable=[".*"]) == sorted(
        ["W", "b", "gamma", "two", "eps", "scale", "mask", "table"]
    )
    assert trained(model, frozen=["b"]) == ["W", "gamma"]
    assert trained(model, trainable=["table", "b"], frozen=["b"]) == ["table"]


def test_the_start_line_says_what_trains_and_what_is_frozen(model, tmp_path):
    result = invoke(
        "train", model / "m.onnx", "--data", model / "data.npz", "--batch-size", 4,
        "--steps", 2, "--target", "mesh8x8", "--model-dir", tmp_path / "run",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == (
        "training 36 parameters in 3 tensors, the model's parameters (default): W, b, gamma; "
        "frozen: two, eps, scale, mask, table (--trainable and --frozen choose)"
    )
    bad = invoke("train", model / "m.onnx", "--steps", 1, "--frozen", "(", "--model-dir", tmp_path)
    assert bad.exit_code == 2 and bad.output.startswith("error: --frozen (: not a regular")


@pytest.mark.slow
def test_transformers_llama_from_the_dynamo_exporter_trains_finite_by_default(tmp_path):
    """The exporter lifts the mask's -3.4e38 fill, the RMSNorm's exponent and the rotary
    tables into initializers named like the weights (``val_N``): trained too, they turned the
    first step's gradients into NaN; by default they are frozen and the loss stays finite."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
    )  # fmt: skip
    llama = transformers.LlamaForCausalLM(config).eval()

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.llama = llama

        def forward(self, ids, labels):
            logits = self.llama(input_ids=ids).logits
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())

    ids, labels = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    batch = torch.export.Dim("batch")
    shapes = ({0: batch}, {0: batch})
    with warnings.catch_warnings():  # the exporter's notes on its own work
        warnings.simplefilter("ignore")
        torch.onnx.export(WithLoss().eval(), (ids, labels), tmp_path / "llama.onnx", dynamo=True,
                          input_names=["ids", "labels"], dynamic_shapes=shapes)  # fmt: skip
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", ids=rng.integers(0, 64, (16, 8)),
             labels=rng.integers(0, 64, (16, 8)))  # fmt: skip
    args = ["train", tmp_path / "llama.onnx", "--data", tmp_path / "data.npz", "--batch-size", 4,
            "--steps", 4, "--optimizer", "adamw", "--lr", "1e-3", "--num-csx", 2]  # fmt: skip
    result = invoke(*args, "--model-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    frozen = result.output.splitlines()[0].split("; frozen: ")[1]
    assert "val_" in frozen  # the exporter's constants, by their lifted names
    losses = [float(line.split()[-1]) for line in result.output.splitlines() if "step" in line[:5]]
    assert len(losses) == 4 and all(np.isfinite(losses))
    everything = invoke(*args, "--trainable", ".*", "--model-dir", tmp_path / "all")
    assert everything.exit_code == 2
    assert everything.stderr.startswith("error: step 1: the first gradient not finite is val_")
