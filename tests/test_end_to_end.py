"""The whole path: ONNX -> artifact file -> simulator, checked against onnxruntime.

Every example model runs in both execution modes on one and on two simulated systems; the
global batch is split over the systems and the inputs hold two batches, so each system also
runs several chunks.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_onnxruntime

import cgc
from cgc.frontends import zoo

TARGET = "mesh16x16"


def reference(model, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in model.graph.output]
    return dict(zip(names, run_onnxruntime(model, inputs), strict=True))


@pytest.mark.parametrize("num_csx", [1, 2])
@pytest.mark.parametrize("mode", ["pipelined", "weight_streaming"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet", "transformer"])
def test_matches_onnxruntime(name: str, mode: str, num_csx: int, tmp_path) -> None:
    model = zoo.MODELS[name]()
    artifact = cgc.compile(model, mode=mode, target=TARGET, batch_size=4, num_csx=num_csx)
    artifact.save(tmp_path / f"{name}.cgc")
    loaded = cgc.load(tmp_path / f"{name}.cgc")
    assert loaded.manifest["mode"] == mode
    assert loaded.manifest["per_system_batch"] == 4 // num_csx
    inputs = zoo.sample_inputs(model, samples=8, seed=3)
    outputs, stats = cgc.run_with_stats(loaded, inputs)
    expected = reference(model, inputs)
    assert outputs.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_allclose(outputs[key], value, rtol=1e-4, atol=1e-5)
    assert stats.num_csx == num_csx
    assert stats.batch_size == 8
    assert stats.simulated_seconds > 0


def test_training_model_runs_forward_with_labels() -> None:
    model = zoo.MODELS["mlp_train"]()
    artifact = cgc.compile(model, mode="weight_streaming", target=TARGET, batch_size=4)
    inputs = zoo.sample_inputs(model, samples=4, seed=5)
    outputs = cgc.run(artifact, inputs)
    expected = reference(model, inputs)
    np.testing.assert_allclose(outputs["loss"], expected["loss"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(outputs["logits"], expected["logits"], rtol=1e-4, atol=1e-5)


def test_auto_picks_pipelined_when_the_model_fits() -> None:
    artifact = cgc.compile(zoo.MODELS["mlp"](), target=TARGET, batch_size=4)
    assert artifact.manifest["mode"] == "pipelined"
    assert "fit in the SRAM of mesh16x16" in artifact.manifest["mode_reason"]
    rects = [layer["rect"] for layer in artifact.manifest["layers"]]
    assert all(r[0] + r[2] <= 16 and r[1] + r[3] <= 16 for r in rects)


def test_auto_streams_weights_when_the_model_does_not_fit() -> None:
    model = zoo.mlp(in_features=256, hidden=(256, 256), classes=10)
    artifact = cgc.compile(model, target="mesh2x2", batch_size=4)
    assert artifact.manifest["mode"] == "weight_streaming"
    reason = artifact.manifest["mode_reason"]
    # more weights than the whole mesh has SRAM: no placement is tried
    assert "the weights (524.0 KiB) exceed the SRAM of mesh2x2 (192.0 KiB)" in reason
    inputs = zoo.sample_inputs(model, samples=4)
    np.testing.assert_allclose(
        cgc.run(artifact, inputs)["logits"],
        reference(model, inputs)["logits"],
        rtol=1e-4,
        atol=1e-5,
    )


def test_run_on_more_systems_than_compiled_splits_the_chunks() -> None:
    model = zoo.MODELS["mlp"]()
    artifact = cgc.compile(model, mode="weight_streaming", target=TARGET, batch_size=2)
    inputs = zoo.sample_inputs(model, samples=8, seed=7)
    one, stats_one = cgc.run_with_stats(artifact, inputs, num_csx=1)
    four, stats_four = cgc.run_with_stats(artifact, inputs, num_csx=4)
    np.testing.assert_array_equal(one["logits"], four["logits"])
    assert stats_four.simulated_seconds < stats_one.simulated_seconds
