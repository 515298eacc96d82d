"""The built-in example models: valid ONNX, deterministic, and imported exactly."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from cgc.frontends import zoo


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_model_is_valid_onnx(name):
    model = zoo.MODELS[name]()
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 10
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 18)]
    names = [n.name for n in model.graph.node]
    assert all(names) and len(set(names)) == len(names)
    for vi in model.graph.input:
        assert vi.type.tensor_type.shape.dim[0].dim_param == "N"


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
@pytest.mark.parametrize("batch", [2, 3])
def test_model_matches_onnxruntime(onnx_check, name, batch):
    model = zoo.MODELS[name]()
    imported = onnx_check(model, batch_size=batch, rtol=1e-4, atol=1e-5)
    assert all(spec.shape[0] == batch and spec.batch_axis == 0 for spec in imported.inputs)
    assert imported.initializers == [t.name for t in model.graph.initializer]


def test_mlp_train_outputs_loss_first(onnx_check):
    model = zoo.MODELS["mlp_train"]()
    feeds = {
        "x": np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32),
        "labels": np.array([0, 9, 3, 3], dtype=np.int64),
    }
    imported = onnx_check(model, feeds, batch_size=4)
    assert [s.name for s in imported.outputs] == ["loss", "logits"]
    assert imported.outputs[0].shape == ()
    assert [s.name for s in imported.inputs] == ["x", "labels"]


def test_builders_take_options(onnx_check):
    model = zoo.transformer_block(seq=4, dim=16, heads=2, ffn=24, seed=3)
    imported = onnx_check(model, batch_size=2)
    assert imported.outputs[0].shape == (2, 4, 16)
    imported = onnx_check(zoo.cnn(channels=1, size=8, classes=4), batch_size=2)
    assert imported.outputs[0].shape == (2, 4)
    imported = onnx_check(zoo.mlp(in_features=5, hidden=(7, 6, 3), classes=2), batch_size=3)
    assert imported.initializers[-2:] == ["fc4.weight", "fc4.bias"]


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_save_is_deterministic(tmp_path, name):
    zoo.save(zoo.MODELS[name](), tmp_path / "a.onnx")
    zoo.save(zoo.MODELS[name](), tmp_path / "b.onnx")
    data = (tmp_path / "a.onnx").read_bytes()
    assert data == (tmp_path / "b.onnx").read_bytes()
    assert onnx.load_model_from_string(data) == zoo.MODELS[name]()


def test_seed_changes_weights():
    a, b = zoo.mlp(seed=0), zoo.mlp(seed=1)
    assert a.graph.initializer[0].raw_data != b.graph.initializer[0].raw_data
