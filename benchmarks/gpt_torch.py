"""A GPT-2-style language model in PyTorch for the benchmarks: learned positions, pre-norm
blocks of causal attention and a tanh-GELU MLP, the LM head tied to the embedding."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    """The sizes of a model."""

    vocab: int
    width: int
    heads: int
    blocks: int
    tokens: int


class Block(torch.nn.Module):
    def __init__(self, shape: Shape):
        super().__init__()
        width = shape.width
        self.heads = shape.heads
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.c_attn = torch.nn.Linear(width, 3 * width)
        self.c_proj = torch.nn.Linear(width, width)
        self.c_fc = torch.nn.Linear(width, 4 * width)
        self.mlp_proj = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + self.c_proj((weights @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    """Logits of ``idx``; given ``targets``, their cross-entropy loss instead."""

    def __init__(self, shape: Shape):
        super().__init__()
        self.shape = shape
        self.wte = torch.nn.Embedding(shape.vocab, shape.width)
        self.wpe = torch.nn.Embedding(shape.tokens, shape.width)
        self.h = torch.nn.ModuleList([Block(shape) for _ in range(shape.blocks)])
        self.ln_f = torch.nn.LayerNorm(shape.width)
        self.lm_head = torch.nn.Linear(shape.width, shape.vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, self.shape.vocab), targets.reshape(-1))
