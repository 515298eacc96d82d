"""PyTorch's attention kept whole: ``aten.scaled_dot_product_attention`` (transformers'
default ``sdpa`` implementation) lowers to ``wse.attention`` without a mask or with one
known causal or open, and to its arithmetic otherwise; models compile, run and train through
``cgc.compile`` and ``cgc.torch`` sessions equal to torch eager."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import cgc

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
F = torch.nn.functional

WIDTH, HEADS, TOKENS, VOCAB = 32, 4, 6, 64


class Attend(torch.nn.Module):
    """A projection into query, key and value heads, then one form of SDPA."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.project = torch.nn.Linear(WIDTH, 3 * WIDTH)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (
            part.view(b, t, HEADS, d // HEADS).transpose(1, 2)
            for part in self.project(x).split(d, -1)
        )
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        if self.kind == "causal":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.kind == "open, scaled":
            y = F.scaled_dot_product_attention(q, k, v, scale=0.3)
        elif self.kind == "grouped":
            k, v = k[:, :2], v[:, :2]
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        elif self.kind == "causal boolean mask":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        elif self.kind == "causal additive mask":
            mask = torch.zeros(t, t).masked_fill(~causal, torch.finfo(torch.float32).min)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif self.kind == "other mask":
            mask = torch.zeros(t, t)
            mask[:, -1] = -2.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:  # "fewer keys": attention over the first half of the tokens
            y = F.scaled_dot_product_attention(q, k[:, :, : t // 2], v[:, :, : t // 2])
        return y.transpose(1, 2).reshape(b, t, d)


def compiled_and_run(model, *args):
    """The artifact of ``model`` and its outputs on ``args``, against eager's."""
    artifact = cgc.compile(model, args=args, target="mesh16x16", mode="weight_streaming")
    names = [spec["name"] for spec in artifact.manifest["inputs"]]
    got = cgc.run(artifact, {n: a.numpy() for n, a in zip(names, args, strict=True)})
    with torch.no_grad():
        want = model(*args)
    return artifact, next(iter(got.values())), want.numpy()


@pytest.mark.parametrize(
    ("kind", "fused"),
    [
        ("causal", True),
        ("open, scaled", True),
        ("grouped", True),
        ("causal boolean mask", True),
        ("causal additive mask", True),
        ("other mask", True),  # a bias the fused op adds as it is
        ("fewer keys", True),  # cross-attention: keys of another length
    ],
)
def test_every_form_equals_eager_and_fuses_where_it_can(kind, fused):
    torch.manual_seed(0)
    artifact, got, want = compiled_and_run(Attend(kind).eval(), torch.randn(2, TOKENS, WIDTH))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert ("wse.attention " in artifact.ir) == fused


def test_dropout_in_attention_is_told_how_to_turn_it_off():
    class Dropping(Attend):
        def forward(self, x):
            q = x.view(x.shape[0], TOKENS, HEADS, WIDTH // HEADS).transpose(1, 2)
            return F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)

    with pytest.raises(cgc.CgcError, match=r"dropout_p=0.1: random dropout cannot be reproduced"):
        cgc.compile(Dropping("x"), args=(torch.randn(2, TOKENS, WIDTH),), target="mesh16x16")


def tiny(name: str):
    """transformers' model ``name``, small, with its default attention (``sdpa``)."""
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=WIDTH, n_head=HEADS,
                                         vocab_size=VOCAB, n_positions=16)  # fmt: skip
        return transformers.GPT2LMHeadModel(config)
    if name == "llama":
        config = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=2 * WIDTH,
            num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=2,
            max_position_embeddings=16,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=2,
                                     num_attention_heads=HEADS, intermediate_size=2 * WIDTH,
                                     max_position_embeddings=16)  # fmt: skip
    return transformers.BertModel(config)


class Outputs(torch.nn.Module):
    """A transformers model's logits or last hidden state, from token ids."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        out = self.model(input_ids=ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_transformers_default_attention_compiles_fused_and_exact(name):
    """Before, torch's decomposition of SDPA failed on the symbolic batch (``Cannot view a
    tensor with shape [s33, 16, 64]``); now every block's attention is one wse.attention."""
    torch.manual_seed(0)
    model = tiny(name).eval()
    assert model.config._attn_implementation == "sdpa"
    ids = torch.randint(0, VOCAB, (2, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on tracing
        artifact, got, want = compiled_and_run(Outputs(model), ids)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert artifact.ir.count("wse.attention ") == 2


def test_a_cgc_torch_session_trains_gpt2_with_sdpa_as_eager_does(tmp_path):
    torch.manual_seed(0)
    model = tiny("gpt2")
    model.config.attn_pdrop = model.config.resid_pdrop = model.config.embd_pdrop = 0.0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0

    class WithLoss(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, ids, labels):
            logits = self.lm(input_ids=ids).logits
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    trained, reference = WithLoss(model), WithLoss(copy.deepcopy(model))
    data = torch.randint(0, VOCAB, (12, 9), generator=torch.Generator().manual_seed(1))
    batches = [(data[i : i + 4, :-1], data[i : i + 4, 1:]) for i in range(0, 12, 4)]

    def sgd(m):  # not Adam: the key bias's gradient is rounding noise, which Adam magnifies
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    optimizer = sgd(reference)
    want = []
    for ids, labels in batches:
        optimizer.zero_grad()
        loss = reference(ids, labels)
        loss.backward()
        optimizer.step()
        want.append(loss.item())
    wrapped = cgc.torch.module(trained)
    session_optimizer = cgc.torch.optimizer(sgd(wrapped))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with cgc.torch.session(num_csx=2, model_dir=tmp_path, target="mesh16x16") as s:
            got = [s.step(batch) for batch in cgc.torch.dataloader(batches)]
    assert session_optimizer is not None
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    for (name, a), b in zip(trained.named_parameters(), reference.parameters(), strict=True):
        np.testing.assert_allclose(a.detach(), b.detach(), rtol=1e-4, atol=1e-5, err_msg=name)
