"""A Hugging Face checkpoint's tensors under the names of the params-file model's weights.

``weights_from_hugging_face(tensors, config)`` renames the tensors of a ``transformers``
causal LM's ``state_dict`` (or its ``model.safetensors``) to the weights
``cgc.frontends.transformer`` declares for ``config``, in its layouts, so that
``cgc.compile(params, weights=...)`` (and ``cgc compile PARAMS --weights FILE``) runs the
checkpoint: the compiler renames a params-file model's weights when they are so named
(``is_hugging_face``). Two families of names are read:

* Llama, Qwen2 and Mistral (``model.embed_tokens``, ``model.layers.N.self_attn.q_proj``,
  ``model.layers.N.mlp.gate_proj``, ``model.layers.N.input_layernorm``, ``model.norm``,
  ``lm_head``): ``torch.nn.Linear`` weights are [out, in] and are transposed to cgc's
  [in, out]. Their rotary embedding already rotates in the ``rotate_half`` layout cgc uses,
  so no head is permuted.
* GPT-2 (``transformer.wte``, ``transformer.h.N.attn.c_attn``, ``transformer.h.N.mlp.c_fc``,
  ``transformer.ln_f``): its ``Conv1D`` weights are [in, out] already; the fused q/k/v
  projection ``c_attn`` is split in three.

Buffers a checkpoint may carry (rotary frequencies, GPT-2's causal masks) are dropped, and a
tied LM head's copy is dropped when the embedding is tied; any other tensor is an error naming
it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from cgc.errors import CgcError
from cgc.frontends.params import ModelConfig

_Rename = tuple[str, str, bool]
"""A pattern of a checkpoint's names, the cgc name it becomes (``\\1`` the block) and whether
the tensor is a ``torch.nn.Linear`` weight to transpose."""

_LLAMA: tuple[_Rename, ...] = (
    (r"model\.embed_tokens\.weight", "wte.weight", False),
    (r"model\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.weight", r"h.\1.attn.\2_proj.weight", True),
    (r"model\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.bias", r"h.\1.attn.\2_proj.bias", False),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"h.\1.attn.out_proj.weight", True),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.bias", r"h.\1.attn.out_proj.bias", False),
    (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"h.\1.mlp.\2_proj.weight", True),
    (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.bias", r"h.\1.mlp.\2_proj.bias", False),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"h.\1.ln_1.weight", False),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"h.\1.ln_2.weight", False),
    (r"model\.norm\.weight", "ln_f.weight", False),
    (r"lm_head\.weight", "lm_head.weight", True),
)
_GPT2: tuple[_Rename, ...] = (
    (r"transformer\.wte\.weight", "wte.weight", False),
    (r"transformer\.wpe\.weight", "wpe.weight", False),
    (r"transformer\.h\.(\d+)\.(ln_1|ln_2)\.(weight|bias)", r"h.\1.\2.\3", False),
    (r"transformer\.h\.(\d+)\.attn\.c_proj\.(weight|bias)", r"h.\1.attn.out_proj.\2", False),
    (r"transformer\.h\.(\d+)\.mlp\.c_fc\.(weight|bias)", r"h.\1.mlp.fc_in.\2", False),
    (r"transformer\.h\.(\d+)\.mlp\.c_proj\.(weight|bias)", r"h.\1.mlp.fc_out.\2", False),
    (r"transformer\.ln_f\.(weight|bias)", r"ln_f.\1", False),
    (r"lm_head\.weight", "lm_head.weight", True),
)
_GPT2_QKV = re.compile(r"transformer\.h\.(\d+)\.attn\.c_attn\.(weight|bias)")
_BUFFERS = re.compile(r".*(rotary_emb\.inv_freq|\.attn\.bias|\.attn\.masked_bias)")


HUGGING_FACE_PREFIXES = ("model.", "transformer.")
"""Where the names of a Hugging Face causal LM's body tensors start; none of a params-file
model's weights (``wte``, ``h.N``, ``ln_f``, ``lm_head``) does."""


def is_hugging_face(tensors: Mapping[str, np.ndarray]) -> bool:
    """Whether ``tensors`` are named as a Hugging Face causal LM's checkpoint names them."""
    return any(name.startswith(HUGGING_FACE_PREFIXES) for name in tensors)


def weights_from_hugging_face(
    tensors: Mapping[str, np.ndarray], config: ModelConfig
) -> dict[str, np.ndarray]:
    """``tensors`` (a Llama, Qwen2, Mistral or GPT-2 checkpoint's, by Hugging Face's names)
    as the weights of the params-file model of ``config``, by cgc's names and layouts."""
    gpt2 = any(name.startswith("transformer.") for name in tensors)
    renames = _GPT2 if gpt2 else _LLAMA
    weights: dict[str, np.ndarray] = {}
    for name, tensor in tensors.items():
        if _BUFFERS.fullmatch(name):
            continue
        if name == "lm_head.weight" and config.share_embedding_weights:
            continue
        qkv = _GPT2_QKV.fullmatch(name) if gpt2 else None
        if qkv:
            weights.update(_split_qkv(tensor, config, f"h.{qkv[1]}.attn", qkv[2]))
            continue
        renamed = _renamed(name, renames)
        if renamed is None:
            raise CgcError(f"{name}: not a tensor of a Hugging Face causal LM cgc can read")
        target, transpose = renamed
        weights[target] = np.asarray(tensor).T if transpose else np.asarray(tensor)
    return weights


def _renamed(name: str, renames: tuple[_Rename, ...]) -> tuple[str, bool] | None:
    for pattern, target, transpose in renames:
        match = re.fullmatch(pattern, name)
        if match:
            return match.expand(target), transpose
    return None


def _split_qkv(
    tensor: np.ndarray, config: ModelConfig, prefix: str, kind: str
) -> dict[str, np.ndarray]:
    """GPT-2's fused ``c_attn`` ([in, q | k | v]) as the three projections."""
    kv_width = config.num_kv_heads * config.head_dim
    q, k, v = np.split(np.asarray(tensor), [config.hidden_size, config.hidden_size + kv_width],
                       axis=-1)  # fmt: skip
    return {f"{prefix}.{n}_proj.{kind}": part for n, part in zip("qkv", (q, k, v), strict=True)}
