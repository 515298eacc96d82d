"""The model-zoo 'light' models that ship with onnx compile for wse2 in both execution modes
and match onnxruntime.

They are opset-9 exports (initializers listed as graph inputs too, weights built by
ConstantOfShape, Dropout, LRN, Sum) of AlexNet, DenseNet-121, Inception v1 and v2, ResNet-50,
ShuffleNet, SqueezeNet, VGG-19 and ZFNet-512 at 224 x 224. Their weights are constants, so
every class ends with the same probability; the last feature map before the classifier,
which still depends on the image, is compared too.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_onnxruntime
from onnx import TensorProto, helper

import cgc

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = sorted(p.stem.removeprefix("light_") for p in LIGHT.glob("light_*.onnx"))
FEATURE_OPS = {"Conv", "Relu", "Concat", "MaxPool", "AveragePool", "BatchNormalization", "Sum"}


def test_all_nine_models_are_there():
    assert MODELS == [
        "bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
        "squeezenet", "vgg19", "zfnet512",
    ]  # fmt: skip


@cache
def model_and_inputs(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model with its last feature map as an extra output, and a random image."""
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"))
    assert model.opset_import[0].version == 9
    outputs = {o.name for o in model.graph.output}
    features = [
        n.output[0]
        for n in model.graph.node
        if n.op_type in FEATURE_OPS and n.output[0] not in outputs
    ][-1]
    model.graph.output.append(helper.make_tensor_value_info(features, TensorProto.FLOAT, None))
    initializers = {t.name for t in model.graph.initializer}
    (image,) = [i for i in model.graph.input if i.name not in initializers]
    shape = [d.dim_value for d in image.type.tensor_type.shape.dim]
    rng = np.random.default_rng(7)
    return model, {image.name: rng.standard_normal(shape).astype(np.float32)}


@cache
def expected(name: str) -> list[np.ndarray]:
    model, inputs = model_and_inputs(name)
    return run_onnxruntime(model, inputs)


PLACED = ("bvlc_alexnet", "inception_v1", "resnet50", "shufflenet", "squeezenet")
"""The models also compiled in pipelined mode here: placing the other four (VGG-19, ZFNet-512,
DenseNet-121, Inception v2) takes 15-50 s each on two cores, and the placement's numbers are
checked on these five and on random layer graphs (test_placement.py);
benchmarks/bench_pipeline.py places ResNet-50, GPT-2-style decoders and BERT-base."""

CASES = [(name, "weight_streaming") for name in MODELS] + [(name, "pipelined") for name in PLACED]


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_light_model_matches_onnxruntime(name, mode):
    model, inputs = model_and_inputs(name)
    artifact = cgc.compile(model, mode=mode, target="wse2")
    assert artifact.manifest["mode"] == mode
    outputs = cgc.run(artifact, inputs)
    assert list(outputs) == [o.name for o in model.graph.output]
    for got, want in zip(outputs.values(), expected(name), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
