"""The params-file transformer frontend against an independent PyTorch implementation.

``cgc.frontends.transformer`` builds GPT-class models (GPT-2/3, GPT-J, GPT-NeoX, Llama)
directly in the WSE dialect. Here a tiny config of each family is compiled with drawn weights
(``init_seed``) and checked against the same architecture written in plain
``torch.nn.functional`` on a dict of tensors keyed by cgc's weight names: the logits, the
training loss, and the weights after one ``torch.optim.AdamW`` step; then that one step on
several systems, in micro-batches and with recomputed activations; mixed precision; and the
default compile, which declares the weights without data.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

import cgc
from cgc.frontends.params import ModelConfig, ModelParams, load_params
from cgc.machine.program.artifact import Artifact
from cgc.runtime.cluster import Cluster

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")
F = torch.nn.functional

TARGET = "mesh8x8"
SEQ = 8
VOCAB = 50
LR = 1e-2
ADAM_EPS = 1e-2
"""Adam's epsilon, far above torch's default: the first step then moves each weight by
``lr * g / (|g| + eps)``, which depends on the gradient's size and not only on its sign, and
gradients that are zero up to float rounding (the key biases' on the dimensions that do not
rotate, whose shift is the same for every key) move their weights by next to nothing instead
of a whole ``lr`` in a direction rounding chose."""

TINY: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt3": (
        "zoo:cerebras-gpt-111m",
        {"hidden_size": 32, "num_heads": 4, "filter_size": 64, "max_position_embeddings": 12},
    ),
    "gptj": (
        "zoo:gptj-6b",
        {"hidden_size": 64, "num_heads": 4, "filter_size": 96, "rotary_dim": 8},
    ),
    "neox": (
        "zoo:gpt-neox-20b",
        {"hidden_size": 48, "num_heads": 4, "filter_size": 64, "rotary_dim": 4},
    ),
    "llama": (
        "zoo:llama-7b",
        {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "filter_size": 48, "rotary_dim": 8},
    ),
    "relu": (
        "zoo:cerebras-gpt-111m",
        {
            "hidden_size": 32,
            "num_heads": 4,
            "filter_size": 64,
            "nonlinearity": "relu",
            "position_embedding_type": "rotary",
            "rotary_dim": 8,
            "use_projection_bias_in_attention": False,
            "use_ffn_bias_in_attention": False,
            "use_ffn_bias": False,
            "use_bias_in_output": True,
        },
    ),
}
"""Each variant: the zoo config it shrinks and what it changes besides the common tiny sizes."""


def tiny_params(variant: str, batch: int = 2, precision: str = "float32") -> ModelParams:
    """A tiny, consistent config of ``variant`` (a key of ``TINY``): 2 layers, vocabulary
    ``VOCAB``, sequences of ``SEQ``, global batch ``batch`` on one system, no clipping."""
    source, changes = TINY[variant]
    params = load_params(source)
    common: dict[str, Any] = {
        "num_hidden_layers": 2,
        "num_kv_heads": changes["num_heads"],
        "vocab_size": VOCAB,
        "max_position_embeddings": SEQ,
    }
    model = dataclasses.replace(params.model, **{**common, **changes})
    return dataclasses.replace(
        params,
        model=model,
        train_input=dataclasses.replace(
            params.train_input, batch_size=batch, max_sequence_length=SEQ
        ),
        optimizer=dataclasses.replace(params.optimizer, eps=ADAM_EPS, max_gradient_norm=None),
        runconfig=dataclasses.replace(params.runconfig, num_csx=1, precision=precision),
    )


def token_batch(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random ``input_ids`` and ``labels``, int32 [batch, SEQ]."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (batch, SEQ), dtype=np.int32)
    labels = rng.integers(0, VOCAB, (batch, SEQ), dtype=np.int32)
    return {"input_ids": ids, "labels": labels}


def spread_weights(artifact: Artifact, trainable: list[str], seed: int = 1) -> Artifact:
    """``artifact`` with its trained weights redrawn at scales that make every part of the
    model matter (the drawn ones put norms at one, biases at zero and attention near uniform);
    the frozen rotary tables stay cgc's."""
    rng = np.random.default_rng(seed)
    weights = dict(artifact.weights)
    for name in trainable:
        shape = weights[name].shape
        if name.endswith(".bias"):
            value = rng.normal(0.0, 0.2, shape)
        elif len(shape) == 1:
            value = 1.0 + rng.normal(0.0, 0.2, shape)
        elif name in ("wte.weight", "wpe.weight"):
            value = rng.normal(0.0, 0.5, shape)
        else:
            value = rng.normal(0.0, 1.5 / math.sqrt(shape[0]), shape)
        weights[name] = value.astype(np.float32)
    return dataclasses.replace(artifact, weights=weights)


# -- the reference ----------------------------------------------------------------------------


Tensors = Mapping[str, "torch.Tensor"]
Step = tuple[ModelParams, dict[str, np.ndarray], float, dict[str, np.ndarray]]
"""A config, a global batch, and the loss and trained weights of one step on it."""


def ref_norm(config: ModelConfig, w: Tensors, x: torch.Tensor, name: str) -> torch.Tensor:
    """LayerNorm (weight and bias) or RMSNorm (weight) ``name`` over the last axis."""
    eps = config.layer_norm_epsilon
    if config.norm_type == "layernorm":
        return F.layer_norm(x, x.shape[-1:], w[f"{name}.weight"], w[f"{name}.bias"], eps)
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w[f"{name}.weight"]


def ref_linear(w: Tensors, x: torch.Tensor, name: str) -> torch.Tensor:
    """``x @ W + b`` with ``W`` [in, out] (and ``b`` when the model has it)."""
    y = x @ w[f"{name}.weight"]
    bias = w.get(f"{name}.bias")
    return y if bias is None else y + bias


def ref_rotary(x: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """GPT-NeoX/Llama rotary embedding (``rotate_half``) of the first ``rotary_dim`` dims of
    each head of ``x`` [B, heads, S, d]."""
    seq = x.shape[2]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    x1, x2 = rot[..., : rotary_dim // 2], rot[..., rotary_dim // 2 :]
    rotate_half = torch.cat([-x2, x1], dim=-1)
    return torch.cat([rot * cos + rotate_half * sin, rest], dim=-1)


def ref_attention(config: ModelConfig, w: Tensors, x: torch.Tensor, prefix: str) -> torch.Tensor:
    """Causal (grouped-query) self-attention of ``x`` [B, S, H]."""
    b, s, _ = x.shape
    d = config.hidden_size // config.num_heads

    def split(y: torch.Tensor, heads: int) -> torch.Tensor:
        return y.view(b, s, heads, d).transpose(1, 2)

    q = split(ref_linear(w, x, f"{prefix}.q_proj"), config.num_heads)
    k = split(ref_linear(w, x, f"{prefix}.k_proj"), config.num_kv_heads)
    v = split(ref_linear(w, x, f"{prefix}.v_proj"), config.num_kv_heads)
    if config.position_embedding_type == "rotary":
        q, k = ref_rotary(q, config.rotary_dim), ref_rotary(k, config.rotary_dim)
    groups = config.num_heads // config.num_kv_heads
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    merged = context.transpose(1, 2).reshape(b, s, config.hidden_size)
    return ref_linear(w, merged, f"{prefix}.out_proj")


def ref_mlp(config: ModelConfig, w: Tensors, x: torch.Tensor, prefix: str) -> torch.Tensor:
    """The block's MLP: GELU (erf) or ReLU between two projections, or SwiGLU."""
    if config.nonlinearity == "swiglu":
        gate = ref_linear(w, x, f"{prefix}.gate_proj")
        up = ref_linear(w, x, f"{prefix}.up_proj")
        return ref_linear(w, F.silu(gate) * up, f"{prefix}.down_proj")
    inner = ref_linear(w, x, f"{prefix}.fc_in")
    hidden = F.relu(inner) if config.nonlinearity == "relu" else F.gelu(inner)
    return ref_linear(w, hidden, f"{prefix}.fc_out")


def ref_logits(config: ModelConfig, w: Tensors, ids: torch.Tensor) -> torch.Tensor:
    """The logits [B, S, V] of token ids [B, S]."""
    x = F.embedding(ids.long(), w["wte.weight"])
    if config.position_embedding_type == "learned":
        x = x + w["wpe.weight"][: ids.shape[1]]
    for index in range(config.num_hidden_layers):
        p = f"h.{index}"
        if config.parallel_attention:
            first = ref_norm(config, w, x, f"{p}.ln_1")
            second = ref_norm(config, w, x, f"{p}.ln_2") if config.use_untied_layer_norm else first
            x = (
                x
                + ref_attention(config, w, first, f"{p}.attn")
                + ref_mlp(config, w, second, f"{p}.mlp")
            )
        else:
            x = x + ref_attention(config, w, ref_norm(config, w, x, f"{p}.ln_1"), f"{p}.attn")
            x = x + ref_mlp(config, w, ref_norm(config, w, x, f"{p}.ln_2"), f"{p}.mlp")
    x = ref_norm(config, w, x, "ln_f")
    head = w["wte.weight"].T if config.share_embedding_weights else w["lm_head.weight"]
    logits = x @ head
    return logits + w["lm_head.bias"] if config.use_bias_in_output else logits


def ref_loss(
    config: ModelConfig, w: Tensors, ids: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy over all B*S tokens, in float32."""
    logits = ref_logits(config, w, ids).float()
    return F.cross_entropy(logits.reshape(-1, config.vocab_size), labels.reshape(-1).long())


def torch_weights(
    weights: Mapping[str, np.ndarray], names: list[str]
) -> dict[str, torch.nn.Parameter]:
    """Float32 torch parameters of ``names`` from ``weights``."""
    return {
        n: torch.nn.Parameter(torch.from_numpy(np.asarray(weights[n], np.float32).copy()))
        for n in names
    }


def torch_step(
    config: ModelConfig, artifact: Artifact, batch: Mapping[str, np.ndarray]
) -> tuple[float, dict[str, np.ndarray]]:
    """The loss of ``batch`` and the trained weights after one ``torch.optim.AdamW`` step with
    the artifact's optimizer settings."""
    training = artifact.manifest["training"]
    settings = training["optimizer"]
    assert settings["optimizer"] == "adamw"
    params = torch_weights(artifact.weights, training["trainable"])
    optimizer = torch.optim.AdamW(
        list(params.values()),
        lr=settings["lr"],
        betas=(settings["beta1"], settings["beta2"]),
        eps=settings["eps"],
        weight_decay=settings["weight_decay"],
        amsgrad=settings["amsgrad"],
    )
    ids, labels = (torch.from_numpy(batch[k]) for k in ("input_ids", "labels"))
    loss = ref_loss(config, params, ids, labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach()), {n: p.detach().numpy() for n, p in params.items()}


# -- compiling and running --------------------------------------------------------------------


def inference_artifact(params: ModelParams, batch: int) -> Artifact:
    """The weight-streaming inference artifact of ``params`` with weights from seed 0."""
    return cgc.compile(
        params, mode="weight_streaming", target=TARGET, batch_size=batch, num_csx=1, init_seed=0
    )


def training_artifact(params: ModelParams, batch: int, num_csx: int = 1, **options) -> Artifact:
    """The one-step AdamW training artifact of ``params`` with weights from seed 0."""
    return cgc.prepare_training(
        params,
        batch_size=batch,
        steps=1,
        optimizer="adamw",
        lr=LR,
        target=TARGET,
        num_csx=num_csx,
        init_seed=0,
        **options,
    )[0]


def cgc_step(
    artifact: Artifact, batch: Mapping[str, np.ndarray]
) -> tuple[float, dict[str, np.ndarray]]:
    """One training step of ``artifact`` on a fresh cluster: the loss and the trained weights."""
    cluster = Cluster(artifact)
    loss, _ = cluster.train_step(batch)
    trained = artifact.manifest["training"]["trainable"]
    return loss, {n: np.array(cluster.memoryx.weights[n]) for n in trained}


def assert_weights_close(
    got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], rtol: float, atol: float
) -> None:
    """Every weight of ``want`` is in ``got`` with its shape and close; names the first one
    that is not."""
    assert sorted(got) == sorted(want)
    for name in sorted(want):
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


# -- the tests --------------------------------------------------------------------------------


def expected_names(config: ModelConfig) -> set[str]:
    """The trained weights a model of ``config`` has, by the frontend's naming."""

    def suffixes(bias: bool) -> tuple[str, ...]:
        return (".weight", ".bias") if bias else (".weight",)

    norms = (".weight", ".bias") if config.norm_type == "layernorm" else (".weight",)
    swiglu = config.nonlinearity == "swiglu"
    mlp = ("gate_proj", "up_proj", "down_proj") if swiglu else ("fc_in", "fc_out")
    shared = config.parallel_attention and not config.use_untied_layer_norm
    names = {"wte.weight", *(f"ln_f{s}" for s in norms)}
    if config.position_embedding_type == "learned":
        names.add("wpe.weight")
    if not config.share_embedding_weights:
        names.add("lm_head.weight")
    if config.use_bias_in_output:
        names.add("lm_head.bias")
    for i in range(config.num_hidden_layers):
        for layer in ("q_proj", "k_proj", "v_proj"):
            names.update(
                f"h.{i}.attn.{layer}{s}" for s in suffixes(config.use_projection_bias_in_attention)
            )
        names.update(f"h.{i}.attn.out_proj{s}" for s in suffixes(config.use_ffn_bias_in_attention))
        names.update(
            f"h.{i}.mlp.{layer}{s}" for layer in mlp for s in suffixes(config.use_ffn_bias)
        )
        for norm in ("ln_1",) if shared else ("ln_1", "ln_2"):
            names.update(f"h.{i}.{norm}{s}" for s in norms)
    return names


@pytest.mark.parametrize("variant", sorted(TINY))
def test_forward_matches_torch(variant: str) -> None:
    params = tiny_params(variant)
    config = params.model
    art = inference_artifact(params, batch=2)
    trained = sorted(set(art.weights) - {"rotary.cos", "rotary.sin"})
    assert set(trained) == expected_names(config)
    art = spread_weights(art, trained)
    ids = token_batch(2)["input_ids"]
    got = cgc.run(art, {"input_ids": ids})["logits"]
    assert got.shape == (2, SEQ, VOCAB) and got.dtype == np.float32
    with torch.no_grad():
        want = ref_logits(config, torch_weights(art.weights, trained), torch.from_numpy(ids))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


def test_drawn_weights_follow_the_documented_init() -> None:
    params = tiny_params("gptj")
    weights = inference_artifact(params, batch=2).weights
    assert all(np.all(weights[n] == 0) for n in weights if n.endswith(".bias"))
    assert all(np.all(weights[n] == 1) for n in weights if re.search(r"ln_\w+\.weight$", n))
    std = float(np.std(weights["wte.weight"]))
    assert 0.015 < std < 0.025


@pytest.mark.parametrize("variant", sorted(TINY))
def test_training_step_matches_torch_adamw(variant: str) -> None:
    params = tiny_params(variant, batch=2)
    art = training_artifact(params, batch=2)
    training = art.manifest["training"]
    assert training["optimizer"]["lr"] == LR
    assert training["optimizer"]["eps"] == ADAM_EPS
    assert set(training["trainable"]) == expected_names(params.model)
    art = spread_weights(art, training["trainable"])
    batch = token_batch(2)
    loss, weights = cgc_step(art, batch)
    want_loss, want_weights = torch_step(params.model, art, batch)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert_weights_close(weights, want_weights, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def llama_step() -> Step:
    """The Llama-style config at a global batch of 4, its batch, and one step on one system
    in one run."""
    params = tiny_params("llama", batch=4)
    batch = token_batch(4, seed=3)
    art = training_artifact(params, batch=4)
    assert art.manifest["micro_batches"] == 1
    loss, weights = cgc_step(art, batch)
    return params, batch, loss, weights


@pytest.mark.parametrize(
    ("num_csx", "micro_batch_size"), [(2, None), (1, 2), (2, 1)], ids=["2csx", "2micro", "both"]
)
def test_systems_and_micro_batches_give_the_same_step(
    llama_step: Step,
    num_csx: int,
    micro_batch_size: int | None,
) -> None:
    params, batch, loss, weights = llama_step
    art = training_artifact(params, 4, num_csx, micro_batch_size=micro_batch_size)
    assert art.manifest["num_csx"] == num_csx
    assert art.manifest["micro_batches"] == (2 if micro_batch_size else 1)
    got_loss, got_weights = cgc_step(art, batch)
    assert got_loss == pytest.approx(loss, rel=1e-5)
    assert_weights_close(got_weights, weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("micro_batch_size", [None, 2], ids=["whole", "2micro"])
def test_recompute_is_bit_identical(
    llama_step: Step,
    micro_batch_size: int | None,
) -> None:
    params, batch, _, _ = llama_step
    steps = [
        cgc_step(
            training_artifact(params, 4, micro_batch_size=micro_batch_size, recompute=recompute),
            batch,
        )
        for recompute in (False, True)
    ]
    (plain_loss, plain), (recomputed_loss, recomputed) = steps
    assert recomputed_loss == plain_loss
    assert sorted(recomputed) == sorted(plain)
    for name in plain:
        np.testing.assert_array_equal(recomputed[name], plain[name], err_msg=name)


def test_recompute_matches_the_single_run_step(
    llama_step: Step,
) -> None:
    params, batch, loss, weights = llama_step
    art = training_artifact(params, 4, 2, micro_batch_size=1, recompute=True)
    assert art.manifest["memory_plan"]["recompute"] is True
    got_loss, got_weights = cgc_step(art, batch)
    assert got_loss == pytest.approx(loss, rel=1e-5)
    assert_weights_close(got_weights, weights, rtol=1e-5, atol=1e-6)


def test_bfloat16_runs_near_float32() -> None:
    full = tiny_params("llama", batch=2)
    half = tiny_params("llama", batch=2, precision="bfloat16")
    batch = token_batch(2)
    full_art, half_art = (training_artifact(p, batch=2) for p in (full, half))
    trained = half_art.manifest["training"]["trainable"]
    for name in trained:
        assert half_art.weights[name].dtype == np.float32, name
        np.testing.assert_array_equal(half_art.weights[name], full_art.weights[name])
    assert half_art.weights["rotary.cos"].dtype.name == "bfloat16"  # a table, not trained
    ir_weights = dict(
        re.findall(r'ws\.stream_weight "([^"]+)" : tensor<(?:\d+x)*(\w+)>', half_art.ir)
    )
    assert set(trained) <= set(ir_weights)
    assert {ir_weights[n] for n in trained} == {"bf16"}
    full_loss = Cluster(full_art).train_step(batch)[0]
    half_loss, half_weights = cgc_step(half_art, batch)
    assert math.isfinite(half_loss)
    assert half_loss == pytest.approx(full_loss, rel=2e-2)
    for name in trained:  # the update lands on the float32 masters
        assert half_weights[name].dtype == np.float32, name
        assert np.all(np.isfinite(half_weights[name])), name
    assert not np.array_equal(half_weights["wte.weight"], half_art.weights["wte.weight"])

    forward = inference_artifact(half, batch=2)
    logits = cgc.run(forward, {"input_ids": batch["input_ids"]})["logits"]
    assert logits.shape == (2, SEQ, VOCAB) and logits.dtype.name == "bfloat16"
    assert np.all(np.isfinite(logits.astype(np.float32)))
    want = cgc.run(inference_artifact(full, batch=2), {"input_ids": batch["input_ids"]})["logits"]
    np.testing.assert_allclose(logits.astype(np.float32), want, atol=2e-2)


def test_default_compile_declares_weights_without_data() -> None:
    params = tiny_params("llama")
    art = cgc.compile(params, mode="weight_streaming", target=TARGET, batch_size=2, num_csx=1)
    assert art.weights == {}
    declared = art.declared
    assert set(expected_names(params.model)) <= set(declared)
    drawn = inference_artifact(params, batch=2).weights
    assert sorted(declared) == sorted(drawn)
    for name, spec in declared.items():
        assert spec.shape == drawn[name].shape, name
        assert spec.dtype == "float32", name
    with pytest.raises(cgc.CgcError, match="--timing-only"):
        cgc.run(art, {"input_ids": token_batch(2)["input_ids"]})
