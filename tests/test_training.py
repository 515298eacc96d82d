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
from conftest import mlp_train_data, mlp_training_fixtures
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file

import cgc
from cgc.errors import CgcError
from cgc.frontends import zoo, zoo_torch

TARGET = "mesh16x16"
SAMPLES, BATCH, STEPS = 40, 8, 6


model, data = mlp_training_fixtures(SAMPLES, seed=11)


def torch_reference(
    model,
    data,
    trainable=None,
    optimizer="sgd",
    schedule=None,
    max_grad_norm=None,
    forward=zoo_torch.mlp,
    **settings,
):
    """Per-step losses and final weights of the same training in PyTorch; ``schedule`` makes
    an LR scheduler of the optimizer."""
    weights = {t.name: torch.tensor(numpy_helper.to_array(t)) for t in model.graph.initializer}
    names = trainable or list(weights)
    for name in names:
        weights[name].requires_grad_(True)
    kind = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    optimizer = kind[optimizer]([weights[n] for n in names], **settings)
    scheduler = schedule(optimizer) if schedule else None
    losses = []
    for step in range(STEPS):
        index = np.arange(step * BATCH, (step + 1) * BATCH) % SAMPLES
        logits = forward(weights, torch.tensor(data["x"][index]))
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(data["labels"][index]))
        optimizer.zero_grad()
        loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_([weights[n] for n in names], max_grad_norm)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
    return losses, {k: v.detach().numpy() for k, v in weights.items()}


def same_training(result, losses, weights) -> None:
    """cgc's per-step losses and final weights are PyTorch's, to float32 rounding, and the
    loss went down."""
    np.testing.assert_allclose([m["loss"] for m in result.metrics], losses, rtol=1e-5, atol=1e-6)
    for name, value in weights.items():
        np.testing.assert_allclose(result.weights[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    assert losses[-1] < losses[0]


def train_small(model, data, model_dir, **options):
    """``cgc.train`` with this file's batch, step count and target unless ``options`` give
    others."""
    return cgc.train(
        model,
        data,
        model_dir=model_dir,
        **{"batch_size": BATCH, "steps": STEPS, "target": TARGET, **options},
    )


SGD_SETTINGS = [
    {"lr": 0.1},
    {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
    {"lr": 0.05, "momentum": 0.9, "nesterov": True},
]


@pytest.mark.parametrize("num_csx", [1, 2])
@pytest.mark.parametrize("settings", SGD_SETTINGS, ids=["plain", "momentum", "nesterov"])
def test_matches_pytorch(model, data, settings, num_csx, tmp_path) -> None:
    result = train_small(
        model,
        data,
        model_dir=tmp_path,
        num_csx=num_csx,
        **settings,
    )
    losses, weights = torch_reference(model, data, **settings)
    assert result.weights.keys() == weights.keys()
    same_training(result, losses, weights)


def warmup_cosine(optimizer):
    """Two warm-up steps, then cosine decay to 0 at the last step."""
    start = torch.optim.lr_scheduler.LinearLR(optimizer, 0.5, 1.0, total_iters=1)
    decay = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=STEPS - 2)
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [start, decay], [2])


ADAM_RUNS = {
    "adam": ({"optimizer": "adam", "lr": 0.01}, {}),
    "adam-amsgrad-wd": (
        {"optimizer": "adam", "lr": 0.01, "amsgrad": True, "weight_decay": 0.05},
        {},
    ),
    "adamw-betas-eps": (
        {"optimizer": "adamw", "lr": 0.02, "betas": (0.8, 0.95), "eps": 1e-6},
        {},
    ),
    "adamw-cosine-clip": (
        {"optimizer": "adamw", "lr": 0.02, "max_grad_norm": 0.5},
        {"lr_schedule": "cosine", "warmup_steps": 2},
    ),
    "sgd-step-clip": (
        {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "max_grad_norm": 1.0},
        {"lr_schedule": "step", "lr_step_size": 2, "lr_gamma": 0.5},
    ),
}
TORCH_SCHEDULES = {
    "adamw-cosine-clip": warmup_cosine,
    "sgd-step-clip": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
}


@pytest.mark.parametrize("num_csx", [1, 4])
@pytest.mark.parametrize("run", list(ADAM_RUNS))
def test_optimizers_schedules_and_clipping_match_pytorch(model, data, run, num_csx, tmp_path):
    settings, loop = ADAM_RUNS[run]
    result = train_small(
        model,
        data,
        model_dir=tmp_path,
        num_csx=num_csx,
        **settings,
        **loop,
    )
    losses, weights = torch_reference(model, data, schedule=TORCH_SCHEDULES.get(run), **settings)
    same_training(result, losses, weights)


def mlp_loss(weights, x, labels):
    logits = zoo_torch.mlp({k: torch.tensor(v) for k, v in weights.items()}, torch.tensor(x))
    return torch.nn.functional.cross_entropy(logits, torch.tensor(labels)).item()


@pytest.mark.parametrize("num_csx", [1, 2])
def test_held_out_loss_is_measured_with_the_weights_of_the_step(model, data, num_csx, tmp_path):
    held_out = mlp_train_data(20, seed=4)  # two whole batches of 8
    result = train_small(
        model,
        data,
        steps=5,
        model_dir=tmp_path,
        num_csx=num_csx,
        lr=0.1,
        eval_data=held_out,
        eval_every=2,
    )
    assert ["eval_loss" in m for m in result.metrics] == [False, True, False, True, True]
    # the loss after the last step, from the final weights, in torch
    batches = [(held_out["x"][i : i + 8], held_out["labels"][i : i + 8]) for i in (0, 8)]
    want = np.mean([mlp_loss(result.weights, x, t) for x, t in batches])
    assert result.metrics[-1]["eval_loss"] == pytest.approx(want, rel=1e-5)
    assert result.metrics[-1]["eval_loss"] != result.metrics[1]["eval_loss"]


CNN_TRAINABLE = zoo_torch.TRAINABLE["cnn_train"]


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(12)
    return {
        "x": rng.standard_normal((SAMPLES, 3, 16, 16)).astype(np.float32),
        "labels": rng.integers(0, 10, SAMPLES),
    }


@pytest.mark.parametrize("num_csx", [1, 4])
@pytest.mark.parametrize(
    "settings",
    [
        {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9},
        {"optimizer": "adam", "lr": 0.005, "weight_decay": 0.01},
    ],
    ids=["sgd", "adam"],
)
def test_cnn_matches_pytorch(images, settings, num_csx, tmp_path) -> None:
    """Convolutions (input and filter gradients), batch norm, max and average pooling."""
    model = zoo.MODELS["cnn_train"]()
    result = train_small(
        model,
        images,
        model_dir=tmp_path,
        num_csx=num_csx,
        trainable=CNN_TRAINABLE,
        **settings,
    )
    trained = [n for n in (t.name for t in model.graph.initializer) if "running" not in n]
    losses, weights = torch_reference(
        model, images, trainable=trained, forward=zoo_torch.cnn, **settings
    )
    same_training(result, losses, weights)


def test_systems_agree_to_float_rounding(model, data, tmp_path) -> None:
    runs = {
        k: train_small(
            model,
            data,
            model_dir=tmp_path / str(k),
            num_csx=k,
            lr=0.1,
            momentum=0.9,
        )
        for k in (1, 2, 4, 8)
    }
    for k in (2, 4, 8):
        np.testing.assert_allclose(
            [m["loss"] for m in runs[k].metrics],
            [m["loss"] for m in runs[1].metrics],
            rtol=1e-6,
        )
        for name, value in runs[1].weights.items():
            np.testing.assert_allclose(runs[k].weights[name], value, rtol=1e-5, atol=1e-7)


def test_trainable_selects_parameters(model, data, tmp_path) -> None:
    chosen = ["fc3.weight", "fc3.bias"]
    result = train_small(
        model,
        data,
        model_dir=tmp_path,
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
    with pytest.raises(CgcError, match="does not split evenly over num_csx 3"):
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
    static = zoo.MODELS["mlp_train"]()
    for value in static.graph.input:
        value.type.tensor_type.shape.dim[0].dim_value = 8
    with pytest.raises(
        CgcError,
        match=r"input 'x' has a static batch dimension 8, but each system runs 4 samples "
        r"\(batch_size over num_csx\); export the model with a dynamic batch dimension",
    ):
        cgc.train(static, data, batch_size=8, steps=1, model_dir=tmp_path, num_csx=2)
    inference = zoo.MODELS["mlp"]()
    with pytest.raises(CgcError, match="first output must be a scalar float loss"):
        cgc.train(
            inference, {"x": data["x"]}, batch_size=8, steps=1, model_dir=tmp_path, target=TARGET
        )


def regression_model(loss_kind: str):
    """y = x @ w; the loss is 0.5 * sum((y - t)^2), or a product of two batch means."""
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    t = helper.make_tensor_value_info("t", TensorProto.FLOAT, ["N", 2])
    loss = helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])
    w = nh.from_array(np.random.default_rng(4).standard_normal((3, 2)).astype(np.float32), "w")
    half = nh.from_array(np.array(0.5, np.float32), "half")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"], name="fc"),
        helper.make_node("Sub", ["y", "t"], ["d"], name="err"),
        helper.make_node("Mul", ["d", "d"], ["sq"], name="sq"),
    ]
    if loss_kind == "sum":
        nodes += [
            helper.make_node("ReduceSum", ["sq"], ["total"], name="total", keepdims=0),
            helper.make_node("Mul", ["total", "half"], ["loss"], name="loss"),
        ]
    else:
        nodes += [
            helper.make_node("ReduceMean", ["sq"], ["m1"], name="m1", keepdims=0),
            helper.make_node("ReduceMean", ["y"], ["m2"], name="m2", keepdims=0),
            helper.make_node("Mul", ["m1", "m2"], ["loss"], name="loss"),
        ]
    graph = helper.make_graph(nodes, "reg", [x, t], [loss], initializer=[w, half])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_sum_reduced_loss_splits_over_systems(tmp_path) -> None:
    rng = np.random.default_rng(8)
    data = {
        "x": rng.standard_normal((16, 3)).astype(np.float32),
        "t": rng.standard_normal((16, 2)).astype(np.float32),
    }
    runs = [
        cgc.train(
            regression_model("sum"),
            data,
            batch_size=8,
            steps=4,
            num_csx=k,
            model_dir=tmp_path / str(k),
            target="mesh4x4",
            lr=0.01,
            trainable=["w"],
        )
        for k in (1, 2)
    ]
    np.testing.assert_allclose(
        [m["loss"] for m in runs[1].metrics], [m["loss"] for m in runs[0].metrics], rtol=1e-5
    )
    np.testing.assert_allclose(runs[1].weights["w"], runs[0].weights["w"], rtol=1e-5, atol=1e-7)
    w = torch.tensor(
        numpy_helper.to_array(regression_model("sum").graph.initializer[0]), requires_grad=True
    )
    optimizer = torch.optim.SGD([w], lr=0.01)
    for step in range(4):
        index = np.arange(step * 8, (step + 1) * 8) % 16
        y = torch.tensor(data["x"][index]) @ w
        loss = 0.5 * ((y - torch.tensor(data["t"][index])) ** 2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert runs[0].metrics[step]["loss"] == pytest.approx(loss.item(), rel=1e-5)
    np.testing.assert_allclose(runs[0].weights["w"], w.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_loss_that_is_a_graph_input_is_named(tmp_path) -> None:
    """A first output that is a graph input passed through: the error names it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [])
    graph = helper.make_graph([], "passthrough", [x], [x])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = {"x": np.zeros((8,), np.float32)}
    with pytest.raises(CgcError, match=r"the loss 'x' \(from node graph input x\)"):
        cgc.train(model, data, batch_size=8, steps=1, num_csx=2, model_dir=tmp_path)


def test_loss_that_does_not_split_over_systems(tmp_path) -> None:
    data = {"x": np.zeros((8, 3), np.float32), "t": np.zeros((8, 2), np.float32)}
    with pytest.raises(CgcError, match=r"cannot tell whether the loss 'loss' .* averages or sums"):
        cgc.train(
            regression_model("product"),
            data,
            batch_size=8,
            steps=1,
            num_csx=2,
            model_dir=tmp_path,
            target="mesh4x4",
        )
    result = cgc.train(
        regression_model("product"),
        data,
        batch_size=8,
        steps=1,
        num_csx=1,
        model_dir=tmp_path,
        target="mesh4x4",
    )
    assert len(result.metrics) == 1


def export_with_loss(module, data: dict, path):
    """``module(*inputs) -> loss`` exported by torch's TorchScript exporter with a dynamic
    batch and the parameters under their own names (no constant folding)."""
    import contextlib
    import io
    import warnings

    import onnx

    example = tuple(torch.from_numpy(a[:BATCH]) for a in data.values())
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            example,
            str(path),
            input_names=list(data),
            output_names=["loss"],
            dynamic_axes={name: {0: "batch"} for name in data},
            dynamo=False,
            opset_version=17,
            do_constant_folding=False,
        )
    return onnx.load(str(path))


def torch_training(module, data, optimizer, steps=STEPS, schedule=None, max_grad_norm=None):
    """Per-step losses of ``module`` (a copy) trained by ``optimizer(params)`` on the same
    batches as cgc, and its final parameters."""
    reference = type(module)()
    reference.load_state_dict(module.state_dict())
    reference.eval()  # as exported: batch norm on its running statistics, no dropout
    params = dict(reference.named_parameters())
    opt = optimizer(params.values())
    scheduler = schedule(opt) if schedule else None
    losses = []
    for step in range(steps):
        index = np.arange(step * BATCH, (step + 1) * BATCH) % SAMPLES
        loss = reference(*(torch.from_numpy(a[index]) for a in data.values()))
        opt.zero_grad()
        loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params.values(), max_grad_norm)
        opt.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
    return losses, {n: p.detach().numpy() for n, p in params.items()}


@pytest.fixture(scope="module")
def language_model(tmp_path_factory):
    """A small GPT-style language model with its loss, exported by torch, and the module it
    came from."""
    from test_torch_exports import GPT, SEQ, VOCAB

    class LM(GPT):
        def forward(self, ids, targets):
            logits = super().forward(ids)
            return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    torch.manual_seed(0)
    module = LM()
    with torch.no_grad():  # the exporter would merge equal initializers (the norms' ones)
        for name, param in module.named_parameters():
            if ".ln" in name or name.startswith("ln"):
                param.add_(torch.randn(param.shape) * 0.1)
    rng = np.random.default_rng(5)
    ids = rng.integers(0, VOCAB, (SAMPLES, SEQ)).astype(np.int64)
    data = {"ids": ids, "targets": np.roll(ids, -1, axis=1)}
    model = export_with_loss(module, data, tmp_path_factory.mktemp("lm") / "lm.onnx")
    return model, module, data


class TorchCNN(torch.nn.Module):
    """A small CNN written in torch: conv, batch norm, ReLU, max pooling, a strided conv,
    average pooling, a linear head and the cross-entropy."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 12, 3, stride=2, padding=1, groups=4)
        self.head = torch.nn.Linear(12, 10)

    def forward(self, x, labels):
        F = torch.nn.functional
        h = F.max_pool2d(torch.relu(self.bn(self.conv1(x))), 2)
        h = F.adaptive_avg_pool2d(torch.relu(self.conv2(h)), 1).flatten(1)
        return F.cross_entropy(self.head(h), labels)


@pytest.mark.parametrize("num_csx", [1, 4])
def test_torch_built_cnn_matches_pytorch(images, num_csx, tmp_path) -> None:
    torch.manual_seed(1)
    module = TorchCNN().eval()
    with torch.no_grad():  # running statistics that are not the defaults
        module.bn.running_mean.uniform_(-0.1, 0.1)
        module.bn.running_var.uniform_(0.5, 1.5)
    model = export_with_loss(module, images, tmp_path / "cnn.onnx")
    result = train_small(
        model,
        images,
        model_dir=tmp_path / "run",
        num_csx=num_csx,
        trainable=[r"conv\d\..*", r"bn\.(weight|bias)", r"head\..*"],
        optimizer="adam",
        lr=0.01,
    )
    losses, weights = torch_training(module, images, lambda p: torch.optim.Adam(p, lr=0.01))
    same_training(result, losses, weights)


@pytest.mark.parametrize("num_csx", [1, 4])
def test_gpt_language_model_matches_pytorch(language_model, num_csx, tmp_path) -> None:
    """Embeddings (gather), layer norms, causal attention, GELU, the LM head, cross-entropy
    over every token; AdamW with warm-up, cosine decay and clipping."""
    model, module, data = language_model
    settings = {"optimizer": "adamw", "lr": 3e-3, "weight_decay": 0.05}
    result = train_small(
        model,
        data,
        model_dir=tmp_path,
        num_csx=num_csx,
        lr_schedule="cosine",
        warmup_steps=2,
        max_grad_norm=1.0,
        **settings,
    )
    losses, params = torch_training(
        module,
        data,
        lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.05),
        schedule=warmup_cosine,
        max_grad_norm=1.0,
    )
    np.testing.assert_allclose([m["loss"] for m in result.metrics], losses, rtol=1e-5, atol=1e-6)
    assert sorted(result.weights) == sorted(params)
    width = module.ln.weight.shape[0]
    for name, want in params.items():
        got = result.weights[name]
        if name.endswith("qkv.bias"):
            # The key bias shifts every score of a query alike, which softmax ignores: its
            # true gradient is 0, and Adam turns both sides' float noise into full steps.
            keys = slice(width, 2 * width)
            assert np.abs(got[keys] - want[keys]).max() <= 2 * 3e-3 * STEPS
            got, want = np.delete(got, np.r_[keys]), np.delete(want, np.r_[keys])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=name)
    assert losses[-1] < losses[0]


def test_swarmx_fanout_changes_the_tree_not_the_numbers(model, data, tmp_path) -> None:
    runs = {
        fanout: train_small(
            model,
            data,
            steps=2,
            model_dir=tmp_path / str(fanout),
            num_csx=8,
            swarmx_fanout=fanout,
            lr=0.1,
        )
        for fanout in (2, 8)
    }
    for name, value in runs[8].weights.items():
        np.testing.assert_allclose(runs[2].weights[name], value, rtol=1e-5, atol=1e-7)
    # three levels of 2 against one of 8: the gradients take longer to come back
    seconds = {f: r.metrics[0]["simulated_seconds"] for f, r in runs.items()}
    assert seconds[2] > seconds[8]
    with pytest.raises(CgcError, match=r"^swarmx_fanout 1: a tree node needs at least 2"):
        cgc.train(model, data, batch_size=8, steps=1, model_dir=tmp_path, swarmx_fanout=1)
