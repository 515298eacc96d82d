"""``fuse-rotary``: rotary embeddings written as their arithmetic run as ``wse.rotary``.

transformers' Llama-family attention applies ``x * cos + rotate_half(x) * sin`` to the query
and key heads; a model trained through a ``cgc.torch`` session equals the same loop in eager,
so the fused op's gradient (the inverse rotation) stands in for the arithmetic's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import cgc
from cgc.passes.fuse_rotary import repeats_halves

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))
from test_torch_training import TARGET, next_token_training_matches_eager  # noqa: E402


@pytest.mark.parametrize(
    ("table", "repeats"),
    [
        (np.array([1.0, 2.0, 1.0, 2.0]), True),
        (np.tile(np.arange(6.0), (5, 2)), True),
        (np.array([1.0, 2.0, 2.0, 1.0]), False),
        (np.array([1.0, 2.0, 3.0]), False),  # odd
        (np.zeros((2, 0)), False),
    ],
)
def test_a_table_must_repeat_its_halves(table, repeats):
    assert repeats_halves(table) == repeats


HEADS, WIDTH, TOKENS, VOCAB = 2, 16, 8, 16


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryHeads(torch.nn.Module):
    """Attention with rotary embeddings as transformers' Llama applies them: tables built from
    ``inv_freq`` (a buffer) as ``cat(freqs, freqs)``, rotating the query and key heads."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, WIDTH)
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.head = torch.nn.Linear(WIDTH, VOCAB)
        depth = WIDTH // HEADS
        inverse = 1.0 / (10000 ** (torch.arange(0, depth, 2).float() / depth))
        self.register_buffer("inv_freq", inverse, persistent=False)

    def forward(self, idx, targets):
        x = self.wte(idx)
        b, t, c = x.shape
        q, k, v = (
            part.view(b, t, HEADS, c // HEADS).transpose(1, 2)
            for part in self.qkv(x).split(WIDTH, dim=-1)
        )
        freqs = torch.outer(torch.arange(t, dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        q, k = (y * cos + rotate_half(y) * sin for y in (q, k))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        logits = self.head(x + y.transpose(1, 2).reshape(b, t, c))
        return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def test_rotary_heads_fuse_and_train_as_eager(tmp_path):
    torch.manual_seed(0)
    next_token_training_matches_eager(RotaryHeads(), VOCAB, TOKENS, tmp_path)
    idx = targets = torch.zeros(8, TOKENS, dtype=torch.int64)
    artifact = cgc.compile(
        RotaryHeads(), args=(idx, targets), mode="weight_streaming", target=TARGET
    )
    assert artifact.ir.count("wse.rotary ") == 2
    assert artifact.manifest["attention"] == {"found": 1, "fused": 1, "first_unfused": None}
