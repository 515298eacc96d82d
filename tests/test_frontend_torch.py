"""The PyTorch frontend (cgc.frontends.torch): modules captured with torch.export, lowered from
core ATen into the WSE dialect, run on the simulator and compared with torch eager."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cgc
from cgc.errors import CgcError
from cgc.frontends.torch import capture, import_program


def eager(module: torch.nn.Module, *args: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return module(*args).numpy()


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return torch.softmax(self.fc2(F.gelu(self.fc1(x))), -1)


class Block(torch.nn.Module):
    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.attn(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + self.proj((weights @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TinyGPT(torch.nn.Module):
    """GPT-2's shape: learned positions, two blocks, the LM head tied to the embedding."""

    def __init__(self, vocab: int = 50, d: int = 32, length: int = 8):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(length, d)
        self.h = torch.nn.ModuleList([Block(d), Block(d)])
        self.ln_f = torch.nn.LayerNorm(d)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, stride=2, groups=2, bias=False)
        self.fc = torch.nn.Linear(8 * 1 * 1, 4)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        x = F.avg_pool2d(torch.tanh(self.conv2(x)), 1)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@pytest.fixture(scope="module")
def gpt() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT().eval()


@pytest.mark.parametrize("mode", ["pipelined", "weight_streaming"])
def test_an_mlp_matches_torch_at_any_batch(mode):
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(4, 16)
    artifact = cgc.compile(model, args=(x,), target="mesh8x8", mode=mode, batch_size=8)
    assert artifact.manifest["inputs"][0]["name"] == "x"
    wider = torch.randn(8, 16)
    out = cgc.run(artifact, {"x": wider.numpy()})["output"]
    np.testing.assert_allclose(out, eager(model, wider), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("num_csx", [1, 4])
def test_a_gpt_with_tied_embeddings_matches_torch(gpt, num_csx):
    idx = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(1))
    artifact = cgc.compile(
        gpt, args=(idx,), target="mesh8x8", mode="weight_streaming", num_csx=num_csx
    )
    out = cgc.run(artifact, {"idx": idx.numpy()})["output"]
    np.testing.assert_allclose(out, eager(gpt, idx), rtol=1e-4, atol=1e-5)


def test_weights_keep_their_state_dict_names_and_tied_ones_stay_one(gpt):
    idx = torch.zeros(2, 8, dtype=torch.int64)
    imported = import_program(capture(gpt, (idx,)))
    parameters = {n for n, _ in gpt.named_parameters()}  # lm_head.weight is wte.weight
    assert set(imported.initializers) == parameters
    assert "lm_head.weight" not in imported.weights
    np.testing.assert_array_equal(imported.weights["wte.weight"], gpt.wte.weight.detach())


def test_ops_carry_the_module_that_ran_them(gpt):
    idx = torch.zeros(2, 8, dtype=torch.int64)
    artifact = cgc.compile(gpt, args=(idx,), target="mesh8x8", mode="weight_streaming")
    for path in ('loc("h.0.attn")', 'loc("h.1.fc")', 'loc("ln_f")', 'loc("lm_head")'):
        assert path in artifact.ir


def test_a_cnn_with_batch_norm_matches_torch():
    torch.manual_seed(0)
    model = CNN()
    with torch.no_grad():  # statistics that are not the identity
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    model.eval()
    x = torch.randn(2, 3, 8, 8)
    artifact = cgc.compile(model, args=(x,), target="mesh8x8", mode="pipelined")
    out = cgc.run(artifact, {"x": x.numpy()})["output"]
    np.testing.assert_allclose(out, eager(model, x), rtol=1e-4, atol=1e-5)


def test_normalization_by_batch_statistics_matches_torch():
    """A batch norm in train() mode and an instance norm normalize by the batch's own
    statistics; inference returns the module's output only, not the buffers' new values."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(CNN(), torch.nn.Unflatten(1, (1, 4)), torch.nn.InstanceNorm1d(1))
    x = torch.randn(4, 3, 8, 8)
    artifact = cgc.compile(model.train(), args=(x,), target="mesh8x8", mode="weight_streaming")
    assert [o["name"] for o in artifact.manifest["outputs"]] == ["output"]
    out = cgc.run(artifact, {"input": x.numpy()})["output"]
    np.testing.assert_allclose(out, eager(model, x), rtol=1e-4, atol=1e-5)


class CausalMask(torch.nn.Module):
    """A mask built from sizes alone: the importer folds it, op by op, to one constant."""

    def forward(self, x):
        positions = torch.arange(x.shape[1])
        mask = (positions[None, :] <= positions[:, None]).unsqueeze(0).expand(x.shape[0], -1, -1)
        return x.masked_fill(~mask, 0.0)


def test_folded_ops_leave_nothing_behind():
    """The constants that folded ops consumed go, so no layer streams one for nothing."""
    x = torch.randn(4, 16, 16)
    artifact = cgc.compile(CausalMask(), args=(x,), target="mesh8x8", mode="weight_streaming")
    assert len(artifact.program.layers) == 1
    np.testing.assert_array_equal(cgc.run(artifact, {"x": x.numpy()})["output"], CausalMask()(x))


def test_buffers_are_frozen_weights():
    model = CNN().eval()
    imported = import_program(capture(model, (torch.randn(2, 3, 8, 8),)))
    assert "bn.running_mean" in imported.weights
    assert "bn.running_mean" not in imported.initializers
    text = str(imported.module)
    assert 'wse.weight "bn.running_var" {frozen}' in text
    assert 'wse.weight "bn.weight" :' in text  # a parameter: trainable


class Unsupported(torch.nn.Module):
    def forward(self, x):
        return (
            torch.slice_scatter(x, x[:, :1], 1, 0, 1)
            + torch.special.i0(x)
            + torch.slice_scatter(x, x[:, 1:2], 1, 1, 2)
        )


def test_unsupported_ops_are_listed_in_one_error():
    with pytest.raises(CgcError) as raised:
        cgc.compile(Unsupported(), args=(torch.randn(2, 3),), target="mesh8x8")
    assert str(raised.value) == (
        "<torch>: unsupported ops: aten.i0.default (node i0), "
        "aten.slice_scatter.default (nodes slice_scatter, slice_scatter_1)"
    )


class DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def test_a_module_export_cannot_capture_is_one_line():
    with pytest.raises(CgcError) as raised:
        cgc.compile(DataDependent(), args=(torch.randn(2, 3),), target="mesh8x8")
    message = str(raised.value)
    assert message.startswith("torch.export cannot capture DataDependent: ")
    assert "\n" not in message


def test_example_inputs_that_do_not_fit_forward():
    with pytest.raises(CgcError, match=r"the example inputs do not fit MLP\.forward"):
        cgc.compile(MLP(), args=(torch.randn(2, 16), torch.randn(2, 16)), target="mesh8x8")


def test_example_inputs_belong_to_a_torch_model(tmp_path):
    with pytest.raises(CgcError, match="args and kwargs are the example inputs"):
        cgc.compile(str(tmp_path / "m.onnx"), args=(1,))


def test_import_cgc_does_not_import_torch():
    code = "import sys, cgc, cgc.cli; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


# ---- the command line: cgc compile file.py:factory

FACTORY = """\
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))


def make():
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(4, 6),)


def wrong():
    return Net()
"""


def compile_cli(tmp_path, spec: str):
    from click.testing import CliRunner

    from cgc.cli import main

    out = tmp_path / "m.cgc"
    result = CliRunner().invoke(main, ["compile", spec, "--target", "mesh8x8", "-o", str(out)])
    return result, out


def test_cli_compiles_a_factory(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(FACTORY)
    result, out = compile_cli(tmp_path, f"{path}:make")
    assert result.exit_code == 0, result.output
    namespace: dict = {}
    exec(FACTORY, namespace)
    model, (x,) = namespace["make"]()
    got = cgc.run(cgc.load(out), {"x": x.numpy()})["output"]
    np.testing.assert_allclose(got, eager(model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("missing.py:make", "missing.py: no such file"),
        ("net.py:nothing", "net.py: no function 'nothing'"),
        ("net.py:wrong", "net.py:wrong: expected it to return (module, args) or (module, "
                         "args, kwargs), got Net"),
        ("net.py", "net.py: expected file.py:factory, a function that returns a module"),
    ],
)  # fmt: skip
def test_cli_factory_errors(tmp_path, monkeypatch, spec, message):
    (tmp_path / "net.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    result, _ = compile_cli(tmp_path, spec)
    assert result.exit_code == 2
    assert result.output == f"error: {message}\n"


def test_a_module_in_training_mode_with_dropout_is_told_how_to_turn_it_off():
    class Dropping(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.dropout = torch.nn.Linear(4, 4), torch.nn.Dropout(0.1)

        def forward(self, x):
            return self.dropout(self.linear(x))

    with pytest.raises(CgcError, match=r"native_dropout.default .*; random dropout cannot") as e:
        cgc.compile(Dropping().train(), args=(torch.ones(2, 4),), target="mesh8x8")
    assert "model.eval()" in str(e.value) and "attn_pdrop=0" in str(e.value)
