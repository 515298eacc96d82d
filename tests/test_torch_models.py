"""Hugging Face transformers models in small configurations with random weights, captured from
PyTorch: cgc matches torch eager in both execution modes and on 1 and 4 systems, and the same
model exported to ONNX and compiled through the ONNX frontend gives the same outputs and a
simulated time within 5 %."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import cgc  # noqa: E402

TOKENS = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(0))
IMAGES = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
TEXT = {"vocab_size": 100, "max_position_embeddings": 32, "attn_implementation": "eager"}


def gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(n_positions=32, n_embd=32, n_layer=2, n_head=4, **TEXT)
    config.vocab_size = 100
    return transformers.GPT2LMHeadModel(config)


def bert() -> torch.nn.Module:
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, **TEXT
    )
    return transformers.BertModel(config)


def llama() -> torch.nn.Module:
    """Grouped-query attention (4 heads, 2 key-value heads) and rotary embeddings."""
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **TEXT,
    )
    return transformers.LlamaForCausalLM(config)


def distilbert() -> torch.nn.Module:
    config = transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, **TEXT)
    return transformers.DistilBertModel(config)


def vit() -> torch.nn.Module:
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        attn_implementation="eager",
    )
    return transformers.ViTModel(config)


def resnet() -> torch.nn.Module:
    config = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"
    )
    return transformers.ResNetModel(config)


MODELS: dict[str, tuple[Callable[[], torch.nn.Module], torch.Tensor]] = {
    "gpt2": (gpt2, TOKENS),
    "bert": (bert, TOKENS),
    "llama": (llama, TOKENS),
    "distilbert": (distilbert, TOKENS),
    "vit": (vit, IMAGES),
    "resnet": (resnet, IMAGES),
}


class FirstOutput(torch.nn.Module):
    """A transformers model returning its first output as a tensor (logits or hidden states)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x, return_dict=False)[0]


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request) -> tuple[str, torch.nn.Module, torch.Tensor]:
    make, example = MODELS[request.param]
    torch.manual_seed(0)
    return request.param, FirstOutput(make()).eval(), example


def eager(module: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return module(x).numpy()


def run(artifact, x: torch.Tensor, num_csx: int | None = None) -> np.ndarray:
    name = artifact.manifest["inputs"][0]["name"]
    outputs, _ = cgc.run_with_stats(artifact, {name: x.numpy()}, num_csx=num_csx)
    return next(iter(outputs.values()))


@pytest.mark.parametrize(
    ("mode", "num_csx"), [("pipelined", 1), ("weight_streaming", 1), ("weight_streaming", 4)]
)
def test_matches_torch_eager(model, mode, num_csx):
    _, module, x = model
    artifact = cgc.compile(module, args=(x,), mode=mode, target="mesh8x8", num_csx=num_csx)
    np.testing.assert_allclose(run(artifact, x), eager(module, x), rtol=1e-4, atol=1e-5)


def test_both_frontends_agree(model, tmp_path: Path):
    name, module, x = model
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (x,),
            str(path),
            input_names=["x"],
            output_names=["output"],
            dynamic_axes={"x": {0: "batch"}},
            dynamo=False,
            # the exporter would fold batch norm into the convolutions: the same graph, please
            training=torch.onnx.TrainingMode.PRESERVE,
        )
    options = {"mode": "weight_streaming", "target": "mesh8x8"}
    from_torch = cgc.compile(module, args=(x,), **options)
    from_onnx = cgc.compile(str(path), batch_size=x.shape[0], **options)
    np.testing.assert_allclose(run(from_torch, x), run(from_onnx, x), rtol=1e-4, atol=1e-5)
    seconds = [cgc.simulate(a).stats.simulated_seconds for a in (from_torch, from_onnx)]
    assert seconds[0] == pytest.approx(seconds[1], rel=0.05)
