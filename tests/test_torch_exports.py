"""Models exported by ``torch.onnx.export`` compile and match onnxruntime, in both modes.

Small configurations of a GPT-style decoder, a BERT-style encoder and a ViT-style image
classifier go through both of PyTorch's exporters (TorchScript and dynamo), with a symbolic
batch dimension that ``batch_size`` binds at compile time.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import onnx
import pytest
from conftest import run_onnxruntime

import cgc

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

BATCH, SEQ, VOCAB, WIDTH, HEADS = 2, 8, 40, 32, 4


class Block(nn.Module):
    """A pre-norm transformer block with fused QKV projection and GELU MLP."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc1, self.fc2 = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (
            part.view(b, t, HEADS, d // HEADS).transpose(1, 2)
            for part in self.qkv(self.ln1(x)).split(d, dim=-1)
        )
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    """Token and position embeddings, causal blocks, a tied-free LM head."""

    def __init__(self):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList([Block(causal=True) for _ in range(2)])
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class BERT(nn.Module):
    """torch's own TransformerEncoder over embeddings, with a padding mask and a pooler."""

    def __init__(self):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.ln = nn.LayerNorm(WIDTH)
        layer = nn.TransformerEncoderLayer(
            WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True, activation="gelu"
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.pooler = nn.Linear(WIDTH, WIDTH)

    def forward(self, ids, mask):
        x = self.ln(self.tokens(ids) + self.positions(torch.arange(ids.shape[1])))
        x = self.encoder(x, src_key_padding_mask=mask == 0)
        return x, torch.tanh(self.pooler(x[:, 0]))


class ViT(nn.Module):
    """Patch embedding by a strided conv, a class token, bidirectional blocks, a head."""

    def __init__(self, image: int = 16, patch: int = 4, classes: int = 10):
        super().__init__()
        self.patches = nn.Conv2d(3, WIDTH, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, WIDTH) * 0.02)
        self.positions = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, WIDTH) * 0.02)
        self.blocks = nn.ModuleList([Block(causal=False) for _ in range(2)])
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, classes)

    def forward(self, image):
        x = self.patches(image).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.positions
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x[:, 0]))


def _inputs(name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    if name == "vit":
        return {"image": rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32)}
    ids = {"ids": rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64)}
    if name == "bert":
        mask = np.ones((BATCH, SEQ), np.int64)
        mask[1, SEQ - 3 :] = 0
        ids["mask"] = mask
    return ids


MODELS = {"gpt": GPT, "bert": BERT, "vit": ViT}


def export(name: str, exporter: str, path) -> onnx.ModelProto:
    """Exports model ``name`` with a symbolic batch dimension on every input."""
    torch.manual_seed(0)
    module = MODELS[name]().eval()
    inputs = _inputs(name)
    args = tuple(torch.from_numpy(a) for a in inputs.values())
    kwargs: dict = {"input_names": list(inputs)}
    if exporter == "dynamo":
        batch = torch.export.Dim("batch", min=1, max=64)
        kwargs |= {"dynamo": True, "dynamic_shapes": tuple({0: batch} for _ in inputs)}
    else:
        kwargs |= {"dynamo": False, "opset_version": 17}
        kwargs["dynamic_axes"] = {n: {0: "batch"} for n in inputs}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), **kwargs)
    return onnx.load(str(path))


@pytest.mark.parametrize("mode", ["pipelined", "weight_streaming"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_export_matches_onnxruntime(name, exporter, mode, tmp_path):
    model = export(name, exporter, tmp_path / f"{name}.onnx")
    batch_param = model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert batch_param, "the export should keep the batch dimension symbolic"
    inputs = _inputs(name)
    expected = run_onnxruntime(model, inputs)
    artifact = cgc.compile(model, mode=mode, target="wse2", batch_size=BATCH)
    outputs = cgc.run(artifact, inputs)
    assert list(outputs) == [o.name for o in model.graph.output]
    for got, want in zip(outputs.values(), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
