"""A Hugging Face ``transformers`` causal LM as a params-file model and its weights.

``model_section(config)`` writes a ``transformers`` config (a ``GPT2Config``, ``LlamaConfig``,
``Qwen2Config`` or ``MistralConfig``, told apart by its ``model_type``) as the ``model:``
section of a params file; ``params_of(config, sequence_length)`` checks it into a
``ModelParams`` as a params file is checked, its messages naming the config
(``<transformers LlamaConfig>: model.num_heads: ...``); ``causal_lm(module)`` gives a
``transformers`` causal LM's params and its weights, renamed by
``cgc.frontends.hf_weights``, so that ``cgc.compile(params, weights=weights)`` computes what
the module computes. What is read:

* GPT-2: learned positions, LayerNorm, biases everywhere; ``activation_function``
  (``"gelu"``, the erf form; its tanh approximation, GPT-2's default ``"gelu_new"``, also
  named ``"gelu_pytorch_tanh"`` and ``"gelu_fast"``; or ``"relu"``), ``n_inner`` (``None``:
  ``4 * n_embd``),
  ``tie_word_embeddings``.
* Llama, Qwen2 and Mistral: rotary positions of base ``rope_theta``, RMSNorm, a SwiGLU MLP,
  grouped-query attention; ``rope_scaling`` (``linear`` or ``llama3``),
  ``tie_word_embeddings``; the biases (Llama's ``attention_bias`` on q/k/v and the output
  projection and ``mlp_bias`` on the MLP; Qwen2's on q/k/v only; none in Mistral); the
  sliding window (Mistral's ``sliding_window``, Qwen2's where ``layer_types`` slides in
  every layer).

A field that changes the arithmetic in a way cgc's params-file model cannot express (another
activation, another rope scaling, a ``head_dim`` other than ``hidden_size /
num_attention_heads``, ...) is a one-line ``CgcError`` naming the field and its value. Dropout
is not read: the model is read as ``module.eval()`` runs it.

Neither torch nor transformers is imported: configs and modules are read by their attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from cgc.errors import CgcError
from cgc.frontends.hf_weights import weights_from_hugging_face
from cgc.frontends.params import ModelParams, params_from_document
from cgc.frontends.params.keys import LLAMA3_SCALING_KEYS

_GPT2_ACTIVATIONS = ("gelu", "gelu_new", "relu")
"""GPT-2's ``activation_function`` values cgc computes, by the names of its ``nonlinearity``
too."""
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
"""``transformers``' names of GELU's tanh approximation (GPT-2's default, ``gelu_new``), all
the params file's ``gelu_new``."""
_GPT2_SWITCHES = (
    ("scale_attn_weights", False, "cgc scales the attention scores by 1/sqrt(head_dim)"),
    ("scale_attn_by_inverse_layer_idx", True, "cgc scales every layer's scores alike"),
    ("add_cross_attention", True, "cgc's models are decoder-only"),
)
"""GPT-2's switches of the attention cgc cannot follow: the field, the value refused, why."""


def reads(config: Any) -> bool:
    """Whether cgc reads ``config``'s ``model_type`` as a params model."""
    return getattr(config, "model_type", None) in _READERS


def model_section(config: Any) -> dict[str, Any]:
    """The params-file ``model:`` section of the ``transformers`` config ``config``."""
    kind = getattr(config, "model_type", None)
    reader = _READERS.get(kind) if isinstance(kind, str) else None
    if reader is None:
        raise CgcError(
            f"{_source(config)}: model_type {kind!r} is not one cgc reads "
            f"(supported: {', '.join(_READERS)})"
        )
    return reader(config)


def params_of(
    config: Any, sequence_length: int, batch_size: int = 1, precision: str = "float32"
) -> ModelParams:
    """The params of ``config``'s model run on ``batch_size`` sequences of
    ``sequence_length`` tokens in ``precision`` (``runconfig.precision``), checked as a params
    file is."""
    document = {
        "model": model_section(config),
        "train_input": {"batch_size": batch_size, "max_sequence_length": sequence_length},
        "runconfig": {"precision": precision},
    }
    name = getattr(config, "name_or_path", "") or config.model_type
    return params_from_document(document, name, _source(config))


def causal_lm(module: Any) -> tuple[ModelParams, dict[str, np.ndarray]]:
    """The params (one sequence of the config's ``max_position_embeddings`` tokens, float32)
    and the weights (float32, by cgc's names; sharing the module's memory where they can) of
    ``module``, a ``transformers`` causal LM: ``GPT2LMHeadModel``, ``LlamaForCausalLM``,
    ``Qwen2ForCausalLM`` or ``MistralForCausalLM``, as ``AutoModelForCausalLM`` loads them."""
    name = type(module).__name__
    config: Any = getattr(module, "config", None)
    if not hasattr(config, "model_type") or not callable(getattr(module, "state_dict", None)):
        raise CgcError(
            f"{name} is not a transformers model (expected a PreTrainedModel, with .config and "
            ".state_dict())"
        )
    tensors = module.state_dict()
    if "lm_head.weight" not in tensors:
        raise CgcError(
            f"{name} has no causal LM head (no lm_head.weight; load the model with "
            "transformers.AutoModelForCausalLM)"
        )
    params = params_of(config, config.max_position_embeddings)
    # .float() first: numpy has no bfloat16
    arrays = {key: tensor.detach().cpu().float().numpy() for key, tensor in tensors.items()}
    return params, weights_from_hugging_face(arrays, params.model)


def _source(config: Any) -> str:
    """How messages name ``config``."""
    return f"<transformers {type(config).__name__}>"


def _unsupported(config: Any, field: str, value: object, why: str) -> CgcError:
    return CgcError(f"{_source(config)}: {field}={value!r} is not supported ({why})")


def _gpt2(config: Any) -> dict[str, Any]:
    activation = config.activation_function
    if activation in _TANH_GELU:
        activation = "gelu_new"
    if activation not in _GPT2_ACTIVATIONS:
        raise _unsupported(
            config,
            "activation_function",
            activation,
            "cgc computes GELU (its erf form, 'gelu', and its tanh approximation, 'gelu_new', "
            "'gelu_pytorch_tanh' or 'gelu_fast') and 'relu'",
        )
    for field, refused, why in _GPT2_SWITCHES:
        if getattr(config, field, not refused) == refused:
            raise _unsupported(config, field, refused, why)
    return {
        "hidden_size": config.n_embd,
        "num_hidden_layers": config.n_layer,
        "num_heads": config.n_head,
        "filter_size": 4 * config.n_embd if config.n_inner is None else config.n_inner,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.n_positions,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "nonlinearity": activation,
        "share_embedding_weights": config.tie_word_embeddings,
        "use_bias": True,
    }


def _llama(config: Any) -> dict[str, Any]:
    bias = config.attention_bias
    return _llama_family(config, bias, bias, config.mlp_bias, None)


def _qwen2(config: Any) -> dict[str, Any]:
    # Qwen2 slides the window in the layers layer_types says (from max_window_layers on)
    kinds = set(config.layer_types)
    if len(kinds) > 1:
        raise CgcError(
            f"{_source(config)}: layer_types mixes {' and '.join(sorted(kinds))} layers, which "
            "is not supported (every block of cgc's model attends alike)"
        )
    window = config.sliding_window if kinds == {"sliding_attention"} else None
    return _llama_family(config, True, False, False, window)


def _mistral(config: Any) -> dict[str, Any]:
    return _llama_family(config, False, False, False, config.sliding_window)


def _llama_family(
    config: Any, qkv_bias: bool, output_bias: bool, mlp_bias: bool, window: int | None
) -> dict[str, Any]:
    """The ``model:`` section of a Llama-style config with these biases and sliding window."""
    if config.hidden_act not in ("silu", "swish"):
        raise _unsupported(config, "hidden_act", config.hidden_act, "cgc's gated MLP is SwiGLU")
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None)
    if head_dim is not None and head_dim * heads != hidden:
        raise _unsupported(
            config,
            "head_dim",
            head_dim,
            f"cgc's heads are hidden_size / num_attention_heads = {hidden} / {heads} wide",
        )
    model: dict[str, Any] = {
        "hidden_size": hidden,
        "num_hidden_layers": config.num_hidden_layers,
        "num_heads": heads,
        "extra_attention_params": {"num_kv_groups": config.num_key_value_heads},
        "filter_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "position_embedding_type": "rotary",
        "rope_theta": config.rope_theta,
        **_rope_scaling(config),
        "norm_type": "rmsnorm",
        "layer_norm_epsilon": config.rms_norm_eps,
        "nonlinearity": "swiglu",
        "share_embedding_weights": config.tie_word_embeddings,
        "use_projection_bias_in_attention": qkv_bias,
        "use_ffn_bias_in_attention": output_bias,
        "use_ffn_bias": mlp_bias,
    }
    if window is not None:
        model["attention_sliding_window_length"] = window
    return model


def _rope_scaling(config: Any) -> dict[str, Any]:
    """The ``pos_scaling_*`` keys of the config's ``rope_scaling``."""
    scaling = getattr(config, "rope_scaling", None) or {}
    # transformers' older configs name the type "type"
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return {}
    if kind == "linear":
        return {"pos_scaling_type": "linear", "pos_scaling_factor": scaling["factor"]}
    if kind == "llama3":
        return {
            "pos_scaling_type": "llama3",
            "pos_scaling_factor": scaling["factor"],
            "pos_scaling_extra_args": {key: scaling[key] for key in LLAMA3_SCALING_KEYS},
        }
    raise _unsupported(
        config, "rope_scaling.rope_type", kind, "cgc stretches rotary frequencies linear or llama3"
    )


_READERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "gpt2": _gpt2,
    "llama": _llama,
    "mistral": _mistral,
    "qwen2": _qwen2,
}
"""The ``model_type`` values read, and how."""
