"""Dynamic sparsity (RigL, SET): training equal to a PyTorch loop that moves the masks by
its own implementation of the rule of ``cgc.machine.sparse.sparsity``; live counts that stay exact,
masks found again by a resumed run, optimizer state kept over the live values only."""

from __future__ import annotations

import math
import zlib

import numpy as np
import onnx
import pytest
import torch
import yaml
from click.testing import CliRunner
from conftest import mlp_training_fixtures
from onnx import numpy_helper

import cgc
from cgc.cli import main
from cgc.errors import CgcError
from cgc.frontends import zoo_torch
from cgc.machine.sparse.sparsity import Sparsity, live_count, mask
from cgc.machine.training import optimizers
from cgc.runtime import checkpoint
from cgc.runtime.cluster import Cluster

TARGET = "mesh16x16"
SAMPLES, BATCH, STEPS, DENSITY, SEED = 16, 8, 6, 0.25, 3
NAMES = ["fc1.weight", "fc2.weight", "fc3.weight"]
KIND = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
STATE = ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")


model, data = mlp_training_fixtures(SAMPLES, seed=5)


# -- the rule, in PyTorch ------------------------------------------------------------------


def moved_mask(name, weight, live, gradient, step, rule):
    """RigL's or SET's new mask of ``weight`` at step ``step`` (1-based): drop the
    ``floor(f * n)`` live values of least magnitude, regrow as many among the positions not
    live after the drop, by the dense gradient's magnitude or a draw of (seed, name, step);
    ties to the lower position."""
    fraction = rule["drop_fraction"]
    if rule.get("decay") == "cosine":
        fraction = fraction / 2 * (1 + math.cos(math.pi * step / rule["end_step"]))
    flat = live.flatten()
    positions = torch.nonzero(flat).squeeze(1)
    count = math.floor(fraction * positions.numel())
    magnitude = weight.detach().flatten()[positions].abs()
    kept = positions[torch.sort(magnitude, stable=True).indices[count:]]
    if rule["regrow"] == "gradient":
        score = gradient.flatten().abs()
    else:
        draw = np.random.default_rng([SEED, zlib.crc32(name.encode()), step]).random(flat.numel())
        score = torch.from_numpy(draw)
    after = torch.zeros_like(flat)
    after[kept] = True
    candidates = torch.nonzero(~after).squeeze(1)
    grown = candidates[torch.sort(score[candidates], descending=True, stable=True).indices[:count]]
    after[grown] = True
    return after.reshape(live.shape)


def torch_reference(model, data, optimizer, settings, rule, steps=STEPS):
    """The training in PyTorch: masks applied to the weights at the start and to the
    gradients and the weights at every step; after the optimizer step of every
    ``update_every``-th step (before ``end_step``) the masks move, the dropped weights are
    zeroed and the newly live ones get zero optimizer state. Returns the losses, the final
    weights and masks."""
    initial = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    weights = {name: torch.tensor(value) for name, value in initial.items()}
    live = {n: torch.tensor(mask(n, initial[n], DENSITY, "random", SEED)) for n in NAMES}
    with torch.no_grad():
        for name, m in live.items():
            weights[name].mul_(m)
    for value in weights.values():
        value.requires_grad_(True)
    opt = KIND[optimizer](list(weights.values()), **settings)
    losses = []
    for step in range(1, steps + 1):
        index = np.arange((step - 1) * BATCH, step * BATCH) % SAMPLES
        logits = zoo_torch.mlp(weights, torch.tensor(data["x"][index]))
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(data["labels"][index]))
        opt.zero_grad()
        loss.backward()
        dense = {name: weights[name].grad.clone() for name in live}
        with torch.no_grad():
            for name, m in live.items():
                weights[name].grad.mul_(m)
        opt.step()
        losses.append(loss.item())
        with torch.no_grad():
            for name, m in live.items():
                weights[name].mul_(m)
            end = rule.get("end_step")
            if step % rule["update_every"] or (end is not None and step >= end):
                continue
            for name in sorted(live):
                new = moved_mask(name, weights[name], live[name], dense[name], step, rule)
                weights[name].mul_(new)
                for slot in STATE:
                    if slot in opt.state[weights[name]]:
                        opt.state[weights[name]][slot][new & ~live[name]] = 0
                live[name] = new
    final = {k: v.detach().numpy() for k, v in weights.items()}
    return losses, final, {k: v.numpy() for k, v in live.items()}


def dynamic_options(rule):
    return {"sparsity_schedule": "dynamic",
            **{f"sparsity_{k}": v for k, v in rule.items()}}  # fmt: skip


def train(model, data, directory, optimizer, settings, rule, num_csx=1, **options):
    return cgc.train(
        model, data, model_dir=directory, batch_size=BATCH, target=TARGET, num_csx=num_csx,
        optimizer=optimizer, sparsity=1 - DENSITY, seed=SEED, **settings, **dynamic_options(rule),
        **{"steps": STEPS, **options},
    )  # fmt: skip


RIGL = {"update_every": 2, "drop_fraction": 0.3, "regrow": "gradient"}
SET = {"update_every": 2, "drop_fraction": 0.3, "regrow": "random"}
COSINE = {"decay": "cosine", "end_step": 5}
CASES = [
    ("sgd", {"lr": 0.1, "momentum": 0.9}, RIGL, 1),
    ("adam", {"lr": 0.01}, RIGL, 4),
    ("adamw", {"lr": 0.01, "weight_decay": 0.1}, {**RIGL, **COSINE}, 1),
    ("adamw", {"lr": 0.01, "weight_decay": 0.1}, SET, 1),
    ("sgd", {"lr": 0.1, "momentum": 0.9, "nesterov": True}, {**SET, **COSINE}, 4),
    ("adam", {"lr": 0.01, "amsgrad": True}, {**SET, "update_every": 1}, 1),
]


@pytest.mark.parametrize(("optimizer", "settings", "rule", "num_csx"), CASES)
def test_dynamic_sparse_training_matches_pytorch(
    model, data, optimizer, settings, rule, num_csx, tmp_path
):
    result = train(model, data, tmp_path, optimizer, settings, rule, num_csx,
                   checkpoint_every=STEPS)  # fmt: skip
    losses, weights, masks = torch_reference(model, data, optimizer, settings, rule)
    np.testing.assert_allclose([m["loss"] for m in result.metrics], losses, rtol=1e-5, atol=1e-6)
    for name, value in weights.items():
        np.testing.assert_allclose(result.weights[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    saved = checkpoint.load(tmp_path / "checkpoints" / f"step-{STEPS}")
    assert saved.masks is not None
    initial = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for name, live in masks.items():
        np.testing.assert_array_equal(saved.masks[name], live, err_msg=name)
        assert int(live.sum()) == live_count(live.size, DENSITY), name
        assert not result.weights[name][~live].any(), name  # dead values are 0
        start = mask(name, initial[name], DENSITY, "random", SEED)
        assert (live != start).any(), name  # the masks moved
        for slot, value in saved.optimizer_state[name].items():  # state of live values only
            assert value.shape in {(), (live.sum(),)}, (name, slot)
    assert losses[2] < losses[0]


def test_masks_are_deterministic_and_keep_their_live_count(model, data, tmp_path) -> None:
    rule = {**SET, "update_every": 1}
    runs = [train(model, data, tmp_path / str(i), "sgd", {"lr": 0.1}, rule, checkpoint_every=1,
                  steps=3) for i in range(2)]  # fmt: skip
    for step in (1, 2, 3):
        a, b = (checkpoint.load(tmp_path / str(i) / "checkpoints" / f"step-{step}") for i in (0, 1))
        assert a.masks is not None and b.masks is not None
        for name in NAMES:
            np.testing.assert_array_equal(a.masks[name], b.masks[name])
            assert int(a.masks[name].sum()) == live_count(a.masks[name].size, DENSITY)
    for name in NAMES:
        np.testing.assert_array_equal(runs[0].weights[name], runs[1].weights[name])


def test_the_rule_drops_the_smallest_and_regrows_the_largest_gradients() -> None:
    rule = Sparsity(0.5, schedule="dynamic", update_every=10, drop_fraction=0.5)
    weight = np.array([0.0, 3.0, 0.0, -1.0, 2.0, 0.0, 0.5, 0.0], np.float32)
    live = np.flatnonzero(weight)  # [1, 3, 4, 6]
    gradient = np.array([9, 0, 4, 1, 0, 4, 0, 0], np.float32)
    assert not rule.updates_at(5) and rule.updates_at(10)
    # drops 0.5 and -1; 0 (9) and 2 (4, the lower of a tie with 5) regrow
    np.testing.assert_array_equal(rule.moved("w", weight, live, gradient, 10), [0, 1, 2, 4])
    cosine = Sparsity(0.5, schedule="dynamic", decay="cosine", end_step=10, drop_fraction=0.5)
    assert cosine.drop_count(100, 5) == 25 and cosine.drop_count(100, 10) == 0
    assert not cosine.updates_at(100)


def test_resume_after_a_mask_update_is_exact(model, data, tmp_path) -> None:
    settings = {"lr": 0.01}
    whole = train(model, data, tmp_path / "a", "adam", settings, RIGL)
    train(model, data, tmp_path / "b", "adam", settings, RIGL, steps=3, checkpoint_every=3)
    resumed = train(model, data, tmp_path / "b", "adam", settings, RIGL, resume=True)
    assert [m["loss"] for m in resumed.metrics] == [m["loss"] for m in whole.metrics]
    for name, value in whole.weights.items():
        np.testing.assert_array_equal(resumed.weights[name], value, err_msg=name)
    changed = {**RIGL, "update_every": 3}
    expected = r"with sparsity density 0.25 random seed 3 dynamic gradient every 2"
    with pytest.raises(CgcError, match=expected):
        train(model, data, tmp_path / "b", "adam", settings, changed, resume=True)


def test_optimizer_state_and_footprint_of_the_live_values(model, data) -> None:
    artifact, _, _ = cgc.prepare_training(
        model, batch_size=BATCH, target=TARGET, optimizer="adam", sparsity=1 - DENSITY, seed=SEED
    )
    cluster = Cluster(artifact)
    cluster.train_step({k: v[:BATCH] for k, v in data.items()})
    memoryx = cluster.memoryx
    for name in NAMES:
        live = live_count(memoryx.weights[name].size, DENSITY)
        assert memoryx.state[name]["exp_avg"].shape == (live,)
        assert memoryx.state["fc1.bias"]["exp_avg"].shape == (32,)
    footprint = memoryx.footprint(artifact.manifest["training"]["trainable"], "adam", {})
    sizes = {"fc1": (2048, 32), "fc2": (1024, 32), "fc3": (320, 10)}
    gradients = 4 * sum(live_count(w, DENSITY) + b for w, b in sizes.values())
    assert footprint.gradients == gradients and footprint.optimizer_state == 2 * gradients
    timing = Cluster(artifact, numerics=False).memoryx
    assert timing.footprint(["fc1.weight"], "sgd", {"momentum": 0.9}).optimizer_state == 4 * 512
    assert optimizers.footprint({"w": 400}, ["w"], "sgd", {}, {"w": 40}).gradients == 40


# -- where it is said ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sparsity-schedule", "dynamic"], "--sparsity-schedule needs --sparsity"),
        (["--sparsity-regrow", "random"], "--sparsity-regrow needs --sparsity"),
        (["--sparsity", "0.5", "--sparsity-update-every", "10"],
         "--sparsity-update-every needs --sparsity-schedule dynamic"),
        (["--sparsity", "0.5", "--sparsity-schedule", "sometimes"],
         "--sparsity-schedule sometimes: expected one of static, dynamic"),
        (["--sparsity-update-every", "0"], "--sparsity-update-every 0: must be at least 1"),
        (["--sparsity-drop-fraction", "1.5"], "--sparsity-drop-fraction 1.5: must be in (0, 1)"),
        (["--sparsity-regrow", "lottery"], "--sparsity-regrow lottery: expected one of gradient"),
        (["--sparsity-decay", "linear"], "--sparsity-decay linear: expected one of constant"),
        (["--sparsity-decay", "cosine"], "--sparsity-decay cosine needs --sparsity-end-step"),
        (["--sparsity-end-step", "0"], "--sparsity-end-step 0: must be at least 1"),
    ],
)  # fmt: skip
def test_bad_dynamic_options_name_the_option(model, args, message, tmp_path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    if "--sparsity" not in args and not message.endswith("needs --sparsity"):
        args = ["--sparsity", "0.5", "--sparsity-schedule", "dynamic", *args]
    command = ["train", str(path), "--steps", "1", "--batch-size", "8", "--timing-only", *args]
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output


def test_the_command_line_trains_a_dynamic_sparsity(model, data, tmp_path) -> None:
    onnx.save(model, tmp_path / "mlp.onnx")
    np.savez(tmp_path / "data.npz", **data)
    command = ["train", str(tmp_path / "mlp.onnx"), "--data", str(tmp_path / "data.npz"),
               "--model-dir", str(tmp_path / "run"), "--steps", "2", "--batch-size", "8",
               "--sparsity", "0.75", "--sparsity-schedule", "dynamic", "--sparsity-regrow",
               "random", "--sparsity-update-every", "1", "--checkpoint-every", "2"]  # fmt: skip
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 0, result.output
    saved = checkpoint.load(tmp_path / "run" / "checkpoints" / "step-2")
    assert saved.loop is not None and "dynamic random every 1" in saved.loop["sparsity"]


def test_a_params_file_says_its_dynamic_sparsity(tmp_path) -> None:
    document = {
        "model": {"hidden_size": 32, "num_hidden_layers": 1, "num_heads": 2, "vocab_size": 50},
        "train_input": {"batch_size": 2, "max_sequence_length": 8},
        "sparsity": {"density": 0.1, "schedule": "dynamic", "update_every": 5,
                     "regrow": "random", "decay": "cosine", "end_step": 50},
    }  # fmt: skip
    path = tmp_path / "gpt.yaml"
    path.write_text(yaml.safe_dump(document))
    artifact, _, _ = cgc.prepare_training(str(path), target=TARGET, seed=4, no_weights=True)
    record = artifact.manifest["sparsity"]
    assert {k: v for k, v in record.items() if k != "weights"} == {
        "density": 0.1, "init": "random", "seed": 4, "schedule": "dynamic", "update_every": 5,
        "drop_fraction": 0.3, "regrow": "random", "decay": "cosine", "end_step": 50,
    }  # fmt: skip
    assert Sparsity.from_json(record).describe().endswith("cosine end 50")
