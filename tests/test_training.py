"""Weight-streaming training of the example MLP against PyTorch (autograd + torch.optim.SGD).

The reference is written in torch independently of cgc: the same initial weights, the same
batches (step i takes samples [i*B, (i+1)*B) modulo the sample count), F.cross_entropy and
torch.optim.SGD.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from onnx import numpy_helper
from safetensors.numpy import load_file

import cgc
from cgc.errors import CgcError
from cgc.frontends import zoo

TARGET = "mesh16x16"
SAMPLES, BATCH, STEPS = 40, 8, 6


@pytest.fixture(scope="module")
def model():
    return zoo.MODELS["mlp_train"]()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    return {
        "x": rng.standard_normal((SAMPLES, 64)).astype(np.float32),
        "labels": rng.integers(0, 10, SAMPLES),
    }


def torch_reference(model, data, trainable=None, **sgd):
    """Per-step losses and final weights of the same training in PyTorch."""
    weights = {t.name: torch.tensor(numpy_helper.to_array(t)) for t in model.graph.initializer}
    names = trainable or list(weights)
    for name in names:
        weights[name].requires_grad_(True)
    optimizer = torch.optim.SGD([weights[n] for n in names], **sgd)
    losses = []
    for step in range(STEPS):
        index = np.arange(step * BATCH, (step + 1) * BATCH) % SAMPLES
        h = torch.tensor(data["x"][index])
        for layer in (1, 2, 3):
            h = h @ weights[f"fc{layer}.weight"].T + weights[f"fc{layer}.bias"]
            h = torch.relu(h) if layer < 3 else h
        loss = torch.nn.functional.cross_entropy(h, torch.tensor(data["labels"][index]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {k: v.detach().numpy() for k, v in weights.items()}


SGD_SETTINGS = [
    {"lr": 0.1},
    {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
    {"lr": 0.05, "momentum": 0.9, "nesterov": True},
]


@pytest.mark.parametrize("num_csx", [1, 2])
@pytest.mark.parametrize("settings", SGD_SETTINGS, ids=["plain", "momentum", "nesterov"])
def test_matches_pytorch(model, data, settings, num_csx, tmp_path) -> None:
    result = cgc.train(
        model,
        data,
        batch_size=BATCH,
        steps=STEPS,
        model_dir=tmp_path,
        num_csx=num_csx,
        target=TARGET,
        **settings,
    )
    losses, weights = torch_reference(model, data, **settings)
    np.testing.assert_allclose([m["loss"] for m in result.metrics], losses, rtol=1e-5, atol=1e-6)
    assert result.weights.keys() == weights.keys()
    for name, value in weights.items():
        np.testing.assert_allclose(result.weights[name], value, rtol=1e-4, atol=1e-6)
    assert losses[-1] < losses[0]


def test_systems_agree_to_float_rounding(model, data, tmp_path) -> None:
    runs = {
        k: cgc.train(
            model,
            data,
            batch_size=BATCH,
            steps=STEPS,
            model_dir=tmp_path / str(k),
            num_csx=k,
            target=TARGET,
            lr=0.1,
            momentum=0.9,
        )
        for k in (1, 2, 4)
    }
    for k in (2, 4):
        np.testing.assert_allclose(
            [m["loss"] for m in runs[k].metrics],
            [m["loss"] for m in runs[1].metrics],
            rtol=1e-6,
        )
        for name, value in runs[1].weights.items():
            np.testing.assert_allclose(runs[k].weights[name], value, rtol=1e-5, atol=1e-7)


def test_trainable_selects_parameters(model, data, tmp_path) -> None:
    chosen = ["fc3.weight", "fc3.bias"]
    result = cgc.train(
        model,
        data,
        batch_size=BATCH,
        steps=STEPS,
        model_dir=tmp_path,
        target=TARGET,
        lr=0.1,
        trainable=[r"fc3\..*"],
    )
    losses, weights = torch_reference(model, data, trainable=chosen, lr=0.1)
    np.testing.assert_allclose([m["loss"] for m in result.metrics], losses, rtol=1e-5, atol=1e-6)
    initial = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for name, value in weights.items():
        np.testing.assert_allclose(result.weights[name], value, rtol=1e-4, atol=1e-6)
        if name not in chosen:
            np.testing.assert_array_equal(result.weights[name], initial[name])


def test_outputs_in_model_dir(model, data, tmp_path) -> None:
    result = cgc.train(
        model, data, batch_size=BATCH, steps=3, model_dir=tmp_path, target=TARGET, lr=0.1, num_csx=2
    )
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    for line, metric in zip(lines, result.metrics, strict=True):
        assert line == metric
        assert {"step", "loss", "simulated_seconds", "samples_per_second"} <= line.keys()
        assert line["samples_per_second"] == pytest.approx(BATCH / line["simulated_seconds"])
    saved = load_file(tmp_path / "weights.safetensors")
    assert sorted(saved) == sorted(t.name for t in model.graph.initializer)
    for name, value in saved.items():
        np.testing.assert_array_equal(value, result.weights[name])


def test_training_errors(model, data, tmp_path) -> None:
    with pytest.raises(CgcError, match="does not split evenly over --num-csx 3"):
        cgc.train(model, data, batch_size=8, steps=1, model_dir=tmp_path, num_csx=3)
    with pytest.raises(CgcError, match="no trainable parameter reaches the loss"):
        cgc.train(
            model,
            data,
            batch_size=8,
            steps=1,
            model_dir=tmp_path,
            trainable=["nope"],
            target=TARGET,
        )
    with pytest.raises(CgcError, match=r"training data lacks \['labels'\]"):
        cgc.train(model, {"x": data["x"]}, batch_size=8, steps=1, model_dir=tmp_path, target=TARGET)
    inference = zoo.MODELS["mlp"]()
    with pytest.raises(CgcError, match="first output must be a scalar float loss"):
        cgc.train(
            inference, {"x": data["x"]}, batch_size=8, steps=1, model_dir=tmp_path, target=TARGET
        )
