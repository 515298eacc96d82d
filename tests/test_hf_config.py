"""A ``transformers`` causal LM read as params and weights (``cgc.frontends.hf_config``):
small random-weight GPT-2 (a set MLP width), Llama (grouped-query attention, llama3 rope
scaling, every bias), Qwen2 (tied embeddings, linear rope scaling) and Mistral (a sliding
window shorter than the sequence) models, read by ``causal_lm`` and compiled, give
transformers' eager logits; a config or module cgc cannot read is one line naming why."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_hf_exactness import LLAMA3_SCALING, assert_runs_as, randomized  # noqa: E402

from cgc.errors import CgcError  # noqa: E402
from cgc.frontends.hf_config import causal_lm, model_section, params_of  # noqa: E402
from cgc.frontends.params import parameter_count  # noqa: E402

SEQ, BATCH, VOCAB = 12, 2, 96
TINY = {"vocab_size": VOCAB, "attn_implementation": "eager"}
LLAMA_LIKE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 112,
    "max_position_embeddings": 128,
    **TINY,
}


def _module(name: str) -> Any:
    """The transformers causal LM of case ``name``."""
    if name.startswith("gpt2"):  # "gpt2-default": GPT-2's own tanh GELU, gelu_new
        activation = {} if name == "gpt2-default" else {"activation_function": "gelu"}
        config = transformers.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, n_positions=32, n_inner=80, **activation, **TINY,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(config)
    if name == "llama":
        config = transformers.LlamaConfig(
            rope_theta=500000.0, rope_scaling=LLAMA3_SCALING, attention_bias=True,
            mlp_bias=True, **LLAMA_LIKE,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config)
    if name == "qwen2":
        config = transformers.Qwen2Config(
            rope_scaling={"rope_type": "linear", "factor": 2.0}, tie_word_embeddings=True,
            **LLAMA_LIKE,
        )  # fmt: skip
        return transformers.Qwen2ForCausalLM(config)
    return transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=5,
                                                                      **LLAMA_LIKE))  # fmt: skip


@pytest.mark.parametrize("name", ["gpt2", "gpt2-default", "llama", "qwen2", "mistral"])
def test_a_causal_lm_runs_as_transformers_does(name: str) -> None:
    torch.manual_seed(0)
    module = randomized(_module(name))
    params, weights = causal_lm(module)
    assert params.source == f"<transformers {type(module.config).__name__}>"
    assert params.train_input.max_sequence_length == module.config.max_position_embeddings
    assert parameter_count(params.model) == sum(p.numel() for p in module.parameters())
    assert sum(w.size for w in weights.values()) == parameter_count(params.model)
    assert_runs_as(params_of(module.config, SEQ, BATCH), weights, module, seed=1)


def test_the_weights_are_float32() -> None:
    module = _module("mistral").to(torch.bfloat16)
    _, weights = causal_lm(module)
    assert {w.dtype for w in weights.values()} == {np.dtype(np.float32)}


def test_params_of_checks_as_a_params_file_does() -> None:
    config = transformers.GPT2Config(n_positions=32, activation_function="gelu")
    params = params_of(config, 32, batch_size=4, precision="bfloat16")
    assert (params.name, params.train_input.batch_size) == ("gpt2", 4)
    assert params.runconfig.precision == "bfloat16"
    with pytest.raises(CgcError) as error:
        params_of(config, 40)
    assert str(error.value) == (
        "<transformers GPT2Config>: model.max_position_embeddings: 32 is less than "
        "train_input.max_sequence_length 40 (learned positions)"
    )


@pytest.mark.parametrize(
    ("config", "settings", "message"),
    [
        (
            "BertConfig",
            {},
            "<transformers BertConfig>: model_type 'bert' is not one cgc reads "
            "(supported: gpt2, llama, mistral, qwen2)",
        ),
        (
            "GPT2Config",
            {"activation_function": "silu"},
            "<transformers GPT2Config>: activation_function='silu' is not supported (cgc "
            "computes GELU (its erf form, 'gelu', and its tanh approximation, 'gelu_new', "
            "'gelu_pytorch_tanh' or 'gelu_fast') and 'relu')",
        ),
        (
            "GPT2Config",
            {"activation_function": "gelu", "scale_attn_by_inverse_layer_idx": True},
            "<transformers GPT2Config>: scale_attn_by_inverse_layer_idx=True is not supported "
            "(cgc scales every layer's scores alike)",
        ),
        (
            "LlamaConfig",
            {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
            "<transformers LlamaConfig>: rope_scaling.rope_type='dynamic' is not supported (cgc "
            "stretches rotary frequencies linear or llama3)",
        ),
        (
            "LlamaConfig",
            {"hidden_act": "gelu"},
            "<transformers LlamaConfig>: hidden_act='gelu' is not supported (cgc's gated MLP is "
            "SwiGLU)",
        ),
        (
            "MistralConfig",
            {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 32},
            "<transformers MistralConfig>: head_dim=32 is not supported (cgc's heads are "
            "hidden_size / num_attention_heads = 64 / 4 wide)",
        ),
        (
            "Qwen2Config",
            {"num_hidden_layers": 2, "use_sliding_window": True, "max_window_layers": 1},
            "<transformers Qwen2Config>: layer_types mixes full_attention and sliding_attention "
            "layers, which is not supported (every block of cgc's model attends alike)",
        ),
    ],
)
def test_a_config_cgc_cannot_read(config: str, settings: dict[str, Any], message: str) -> None:
    with pytest.raises(CgcError) as error:
        model_section(getattr(transformers, config)(**settings))
    assert str(error.value) == message


def test_a_window_in_every_layer_is_read() -> None:
    config = transformers.Qwen2Config(use_sliding_window=True, sliding_window=7,
                                      max_window_layers=0, **LLAMA_LIKE)  # fmt: skip
    assert model_section(config)["attention_sliding_window_length"] == 7
    assert "attention_sliding_window_length" not in model_section(transformers.Qwen2Config())


@pytest.mark.parametrize("body", ["GPT2Model", "LlamaModel"])
def test_a_model_without_its_lm_head(body: str) -> None:
    config = _module("gpt2" if body == "GPT2Model" else "llama").config
    with pytest.raises(CgcError) as error:
        causal_lm(getattr(transformers, body)(config))
    assert str(error.value) == (
        f"{body} has no causal LM head (no lm_head.weight; load the model with "
        "transformers.AutoModelForCausalLM)"
    )


def test_not_a_transformers_model() -> None:
    with pytest.raises(CgcError) as error:
        causal_lm(torch.nn.Linear(2, 2))
    assert str(error.value) == (
        "Linear is not a transformers model (expected a PreTrainedModel, with .config and "
        ".state_dict())"
    )
