"""Unstructured weight sparsity in training: deterministic masks, and training equal to a
PyTorch loop that applies the same masks to the gradients and the weights at every step."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
import torch
import yaml
from click.testing import CliRunner
from conftest import mlp_training_fixtures
from onnx import TensorProto, helper, numpy_helper

import cgc
from cgc.cli import main
from cgc.errors import CgcError
from cgc.frontends import zoo_torch
from cgc.machine.hardware.target import resolve
from cgc.machine.program.manifest import check_manifest
from cgc.machine.sparse.sparsity import Sparsity, live_count, mask
from cgc.runtime.memoryx import MemoryX

TARGET = "mesh16x16"
SAMPLES, BATCH, STEPS = 16, 8, 5


model, data = mlp_training_fixtures(SAMPLES, seed=5)


# -- masks ---------------------------------------------------------------------------------


def test_masks_are_deterministic_and_exact() -> None:
    w = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    a, b = mask("fc1.weight", w, 0.25, "random", 7), mask("fc1.weight", w, 0.25, "random", 7)
    assert a.dtype == bool and a.shape == w.shape and int(a.sum()) == 512 == live_count(2048, 0.25)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, mask("fc1.weight", w, 0.25, "random", 8))
    assert not np.array_equal(a, mask("fc2.weight", w, 0.25, "random", 7))
    big = mask("fc1.weight", w, 0.25, "magnitude", 7)
    assert np.abs(w[big]).min() >= np.abs(w[~big]).max()
    assert int(mask("b", np.zeros(3), 0.01, "random", 0).sum()) == 1  # never all dead


def test_default_choice_leaves_embeddings_norms_and_biases_dense() -> None:
    shapes = {"emb": (20, 8), "w": (8, 5), "b": (5,), "norm": (8,)}
    chosen = Sparsity(0.5).chosen(["b", "emb", "norm", "w"], shapes, dense={"emb"})
    assert chosen == ["w"]
    assert Sparsity(0.5, ("e.*",)).chosen(["emb", "w"], shapes, set()) == ["emb"]


def test_an_embedding_table_is_found_in_the_program(tmp_path) -> None:
    """A weight that a gather reads rows of is an embedding: dense by default."""
    emb = numpy_helper.from_array(np.ones((20, 8), np.float32), "emb")
    w = numpy_helper.from_array(np.ones((8, 5), np.float32), "w")
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"]),
        helper.make_node("MatMul", ["e", "w"], ["logits"]),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("labels", TensorProto.INT64, ["N"]),
        ],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [emb, w],
    )
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    artifact, _, _ = cgc.prepare_training(
        onnx_model, batch_size=4, target=TARGET, sparsity=0.5, lr=0.1
    )
    record = artifact.manifest["sparsity"]
    assert record == {"density": 0.5, "init": "random", "seed": 0, "weights": ["w"]}


# -- training against PyTorch --------------------------------------------------------------


def torch_reference(model, data, masks, optimizer, **settings):
    """The same training in PyTorch, the masks applied to the weights at the start and to
    the gradients and the weights at every step."""
    weights = {t.name: torch.tensor(numpy_helper.to_array(t)) for t in model.graph.initializer}
    live = {name: torch.tensor(m) for name, m in masks.items()}
    with torch.no_grad():
        for name, m in live.items():
            weights[name].mul_(m)
    for value in weights.values():
        value.requires_grad_(True)
    kind = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    opt = kind[optimizer](list(weights.values()), **settings)
    losses = []
    for step in range(STEPS):
        index = np.arange(step * BATCH, (step + 1) * BATCH) % SAMPLES
        logits = zoo_torch.mlp(weights, torch.tensor(data["x"][index]))
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(data["labels"][index]))
        opt.zero_grad()
        loss.backward()
        with torch.no_grad():
            for name, m in live.items():
                weights[name].grad.mul_(m)
        opt.step()
        with torch.no_grad():
            for name, m in live.items():
                weights[name].mul_(m)
        losses.append(loss.item())
    return losses, {k: v.detach().numpy() for k, v in weights.items()}


CASES = [
    ("sgd", {"lr": 0.1, "momentum": 0.9}, 1),
    ("adam", {"lr": 0.01}, 4),
    ("adamw", {"lr": 0.01, "weight_decay": 0.1}, 1),
]


@pytest.mark.parametrize(("optimizer", "settings", "num_csx"), CASES)
def test_static_sparse_training_matches_pytorch(
    model, data, optimizer, settings, num_csx, tmp_path
):
    result = cgc.train(
        model, data, model_dir=tmp_path, batch_size=BATCH, steps=STEPS, target=TARGET,
        num_csx=num_csx, optimizer=optimizer, sparsity=0.75, seed=3, **settings,
    )  # fmt: skip
    names = ["fc1.weight", "fc2.weight", "fc3.weight"]
    initial = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    masks = {n: mask(n, initial[n], 0.25, "random", 3) for n in names}
    losses, weights = torch_reference(model, data, masks, optimizer, **settings)
    np.testing.assert_allclose([m["loss"] for m in result.metrics], losses, rtol=1e-5, atol=1e-6)
    for name, value in weights.items():
        np.testing.assert_allclose(result.weights[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    for name, live in masks.items():
        assert not result.weights[name][~live].any(), name  # dead values stayed 0
        assert result.weights[name][live].all(), name
    assert losses[2] < losses[0]  # step 2 sees step 0's batch again


def test_density_one_is_the_dense_training(model, data, tmp_path) -> None:
    options = {"batch_size": BATCH, "steps": 3, "target": TARGET, "lr": 0.1}
    dense = cgc.train(model, data, model_dir=tmp_path / "a", **options)
    full = cgc.train(model, data, model_dir=tmp_path / "b", sparsity=0.0, **options)
    assert [m["loss"] for m in full.metrics] == [m["loss"] for m in dense.metrics]
    for name, value in dense.weights.items():
        np.testing.assert_array_equal(full.weights[name], value)


# -- bad options ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sparsity", "1"], "--sparsity 1: the fraction of zeros must be in [0, 1)"),
        (["--sparsity", "-0.5"], "--sparsity -0.5: the fraction of zeros must be in [0, 1)"),
        (["--sparse-params", "fc.*"], "--sparse-params needs --sparsity"),
        (["--sparsity", "0.5", "--sparse-params", "("], "--sparse-params '(': not a regular"),
        (["--sparsity", "0.5", "--sparse-params", "nothing"], "no trained weight is sparse"),
    ],
)
def test_bad_sparsity_options_name_the_option(model, args, message, tmp_path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    command = ["train", str(path), "--steps", "1", "--batch-size", "8", "--timing-only", *args]
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output


def test_bad_density_in_the_api_is_a_cgc_error() -> None:
    with pytest.raises(CgcError, match=r"density -0.5: must be in \(0, 1\]"):
        Sparsity(-0.5)


def test_resume_finds_the_masks_again_and_refuses_another_sparsity(model, data, tmp_path):
    options = {"batch_size": BATCH, "target": TARGET, "lr": 0.1, "sparsity": 0.5, "seed": 1}
    whole = cgc.train(model, data, model_dir=tmp_path / "a", steps=4, **options)
    cgc.train(model, data, model_dir=tmp_path / "b", steps=2, checkpoint_every=2, **options)
    resumed = cgc.train(model, data, model_dir=tmp_path / "b", steps=4, resume=True, **options)
    assert [m["loss"] for m in resumed.metrics] == [m["loss"] for m in whole.metrics]
    for name, value in whole.weights.items():
        np.testing.assert_array_equal(resumed.weights[name], value)
    changed = {**options, "sparsity": 0.25}
    expected = r"with sparsity density 0.5 random seed 1: .*this run has density 0.75"
    with pytest.raises(CgcError, match=expected):
        cgc.train(model, data, model_dir=tmp_path / "b", steps=4, resume=True, **changed)


def test_a_params_file_says_its_sparsity(tmp_path) -> None:
    """The ``sparsity`` section of a params file, with embeddings left dense by default."""
    document = {
        "model": {"hidden_size": 32, "num_hidden_layers": 1, "num_heads": 2, "vocab_size": 50},
        "train_input": {"batch_size": 2, "max_sequence_length": 8},
        "sparsity": {"density": 0.1, "init": "magnitude"},
    }
    path = tmp_path / "gpt.yaml"
    path.write_text(yaml.safe_dump(document))
    artifact, _, _ = cgc.prepare_training(str(path), target=TARGET, seed=4)
    record = artifact.manifest["sparsity"]
    assert (record["density"], record["init"], record["seed"]) == (0.1, "magnitude", 4)
    shapes = artifact.weight_specs
    assert record["weights"] and all(len(shapes[n].shape) == 2 for n in record["weights"])
    trained = artifact.manifest["training"]["trainable"]
    tables = [n for n in trained if "wte" in n or "wpe" in n]  # token and position tables
    assert len(tables) == 2 and not set(tables) & set(record["weights"])
    # the same section compiles an inference artifact sparse too
    inference = cgc.compile(str(path), mode="weight_streaming", target=TARGET, init_seed=4)
    assert inference.manifest["sparsity"]["weights"] == record["weights"]


# -- the record, the footprint, old checkpoints ---------------------------------------------


def test_a_static_record_keeps_its_keys_and_a_dynamic_one_is_checked(model) -> None:
    artifact, _, _ = cgc.prepare_training(
        model, batch_size=BATCH, target=TARGET, sparsity=0.5, no_weights=True
    )
    manifest = artifact.manifest
    assert set(manifest["sparsity"]) == {"density", "init", "seed", "weights"}
    dynamic = Sparsity(0.5, schedule="dynamic").to_json(manifest["sparsity"]["weights"])
    check_manifest({**manifest, "sparsity": dynamic})
    for changed, message in [
        ({"update_every": 1.5}, "sparsity.update_every: expected a whole number"),
        ({"schedule": "static"}, "sparsity.update_every: only a dynamic sparsity has it"),
        ({"decay": "cosine"}, "sparsity_decay cosine needs sparsity_end_step"),
        ({"drop_fraction": 1}, "sparsity_drop_fraction 1: must be in (0, 1)"),
    ]:
        with pytest.raises(CgcError, match=re.escape(message)):
            check_manifest({**manifest, "sparsity": {**dynamic, **changed}})
    missing = {k: v for k, v in dynamic.items() if k != "regrow"}
    with pytest.raises(CgcError, match=r"sparsity\.regrow: missing"):
        check_manifest({**manifest, "sparsity": missing})


def test_dense_state_of_an_old_checkpoint_is_kept_over_the_live_values() -> None:
    weights = {"w": np.arange(1, 9, dtype=np.float32).reshape(2, 4)}
    memoryx = MemoryX(weights, resolve(TARGET))
    live = np.array([[True, False, False, True], [False, True, False, False]])
    record = Sparsity(0.375).to_json(["w"])
    memoryx.sparsify(record, {"w": live})
    np.testing.assert_array_equal(memoryx.weights["w"], [[1, 0, 0, 4], [0, 6, 0, 0]])
    dense = {"w": {"exp_avg": np.arange(8, dtype=np.float32).reshape(2, 4),
                   "step": np.float32(3)}}  # fmt: skip
    memoryx.restore({"w": memoryx.weights["w"]}, dense, 3)
    np.testing.assert_array_equal(memoryx.state["w"]["exp_avg"], [0, 3, 5])
    assert memoryx.state["w"]["step"] == 3 and memoryx.steps == 3
    assert memoryx.footprint(["w"], "adam", {}).gradients == 3 * 4
