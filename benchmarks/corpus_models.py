"""The models of the corpus benchmark (``bench_corpus.py``): transformers' architectures with
random weights (nothing is downloaded), tiny and at a real size, the ways a user exports them
to ONNX, and the params-file twin of those cgc can also build from a params file.

- ``CASES``: every model, by name (``gpt2-tiny``, ``gpt2-124m``, ``llama-1b``, ``gpt2-6x512``,
  ...): its architecture, size class, config, sequence lengths and the batches it is measured
  at.
- ``build(case, impl)``: the module (``attn_implementation`` ``eager`` or ``sdpa``), wrapped to
  take positional inputs and return its main output, with example inputs of batch 2 (so no
  exporter specializes the batch to 1).
- ``export_onnx(built, exporter, path)``: ``ts`` (TorchScript, opset 17), ``tsnv`` (the same
  with transformers' vmap mask builder replaced by its vmap-free one,
  ``transformers.integrations.executorch.sdpa_mask_without_vmap``: the only way TorchScript
  traces transformers' causal masks), ``dyn`` (dynamo, opset 18: torch's default) and
  ``dyn23`` (dynamo, opset 23, which writes ONNX's own ``Attention`` op); a symbolic batch
  axis in every one.
- ``params_twin(case, batch)``: the same architecture as a cgc ``ModelParams`` (GPT-2 and
  Llama; None for the others), in float32 like the exports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers as tf

IMPLS = ("eager", "sdpa")
"""transformers' attention implementations (``attn_implementation``); sdpa is its default."""
EXPORTERS = ("ts", "tsnv", "dyn", "dyn23")
"""The ONNX exporters, as ``export_onnx`` names them."""
EXAMPLE_BATCH = 2
"""The batch of the example inputs: not 1, so that no exporter specializes it."""
SIZES = ("small", "real")


@dataclass(frozen=True)
class Case:
    """One model of the corpus."""

    name: str
    arch: str
    """``gpt2``, ``bert``, ``distilbert``, ``llama``, ``qwen2``, ``mistral``, ``t5enc``,
    ``t5``, ``whisper`` or ``vit``."""
    size: str
    """``small`` (seconds to export and compile) or ``real`` (minutes, gigabytes)."""
    config: Mapping[str, Any]
    """The keyword arguments of the architecture's transformers config."""
    seq: int
    """Tokens of the (encoder's) input; for ViT the image side in pixels; for Whisper the
    encoder's tokens (the mel frames are twice as many)."""
    decoder_seq: int = 0
    """Tokens of the decoder's input (T5, Whisper)."""
    ws_batch: int = 8
    """The global batch of the weight-streaming measurement."""
    pipelined_batch: int = 1
    """The batch of the pipelined measurement."""
    external_data: bool = False
    """Write the ONNX weights to an external data file (large models)."""
    head: bool = True
    """GPT-2 with its LM head (``GPT2LMHeadModel``, logits), else its blocks alone
    (``GPT2Model``, the last hidden state)."""
    note: str = ""

    @property
    def vocab(self) -> int:
        """The vocabulary of the token inputs."""
        return int(self.config.get("vocab_size", 128))

    @property
    def attention_blocks(self) -> int:
        """How many attention blocks the model has (self and cross)."""
        c = self.config
        if self.arch == "gpt2":
            return int(c["n_layer"])
        if self.arch == "distilbert":
            return int(c["n_layers"])
        if self.arch == "t5enc":
            return int(c["num_layers"])
        if self.arch == "t5":
            return int(c["num_layers"]) + 2 * int(c["num_decoder_layers"])
        if self.arch == "whisper":
            return int(c["encoder_layers"]) + 2 * int(c["decoder_layers"])
        return int(c["num_hidden_layers"])


def _tiny(arch: str) -> Case:
    """The survey's tiny model of ``arch``: 2 layers, width 64, 4 heads, vocab 128, 16 tokens."""
    decoder_like = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 128,
                    "max_position_embeddings": 32, "use_cache": False}  # fmt: skip
    t5 = {"d_model": 64, "d_kv": 16, "num_heads": 4, "num_layers": 2, "num_decoder_layers": 2,
          "d_ff": 128, "vocab_size": 128, "relative_attention_num_buckets": 8,
          "use_cache": False}  # fmt: skip
    configs: dict[str, tuple[dict[str, Any], int, int]] = {
        "gpt2": ({"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 128, "n_positions": 32,
                  "use_cache": False}, 16, 0),
        "bert": ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "intermediate_size": 128, "vocab_size": 128, "max_position_embeddings": 32},
                 16, 0),
        "distilbert": ({"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128,
                        "vocab_size": 128, "max_position_embeddings": 32}, 16, 0),
        "llama": (decoder_like, 16, 0),
        "qwen2": ({**decoder_like, "use_sliding_window": False}, 16, 0),
        "mistral": ({**decoder_like, "sliding_window": 8}, 16, 0),
        "t5enc": (t5, 16, 0),
        "t5": (t5, 16, 16),
        "whisper": ({"d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
                     "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                     "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 128,
                     "num_mel_bins": 16, "max_source_positions": 16,
                     "max_target_positions": 32}, 16, 16),
        "vit": ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "intermediate_size": 128, "image_size": 16, "patch_size": 4,
                 "num_channels": 3}, 16, 0),
    }  # fmt: skip
    config, seq, decoder_seq = configs[arch]
    return Case(f"{arch}-tiny", arch, "small", config, seq, decoder_seq)


LLAMA_1B = {
    "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 32000,
    "max_position_embeddings": 2048, "use_cache": False,
}  # fmt: skip
"""A Llama of about 1.1B parameters (Llama 3.2 1B's blocks, Llama 2's vocabulary)."""

BERT_BASE = {
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512,
}  # fmt: skip
"""BERT-base's shape (bert-base-uncased): 12 layers of width 768, 12 heads."""

REAL = (
    Case("gpt2-124m", "gpt2", "real",
         {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024,
          "use_cache": False}, 1024, note="GPT-2 small"),
    Case("bert-base", "bert", "real", BERT_BASE, 512, note="bert-base-uncased"),
    Case("bert-base-128", "bert", "real", BERT_BASE, 128,
         note="bert-base-uncased on 128 tokens, as bench_pipeline.py places it"),
    Case("distilbert-base", "distilbert", "real",
         {"dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072, "vocab_size": 30522,
          "max_position_embeddings": 512}, 512, note="distilbert-base-uncased"),
    Case("llama-1b", "llama", "real", LLAMA_1B, 1024, external_data=True,
         note="2048 wide, 16 layers, 32 heads / 8 kv heads"),
    Case("qwen2-0.5b", "qwen2", "real",
         {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
          "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
          "max_position_embeddings": 2048, "tie_word_embeddings": True,
          "use_sliding_window": False, "use_cache": False}, 1024, note="Qwen2-0.5B"),
    Case("mistral-1b", "mistral", "real", {**LLAMA_1B, "sliding_window": 512}, 1024,
         external_data=True, note="llama-1b's shape, a sliding window of 512"),
    Case("t5enc-small", "t5enc", "real",
         {"d_model": 512, "d_kv": 64, "num_heads": 8, "num_layers": 6, "num_decoder_layers": 6,
          "d_ff": 2048, "vocab_size": 32128, "use_cache": False}, 512, note="t5-small encoder"),
    Case("t5-small", "t5", "real",
         {"d_model": 512, "d_kv": 64, "num_heads": 8, "num_layers": 6, "num_decoder_layers": 6,
          "d_ff": 2048, "vocab_size": 32128, "use_cache": False}, 512, 128, note="t5-small"),
    Case("whisper-base", "whisper", "real",
         {"d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 8,
          "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048,
          "vocab_size": 51865, "num_mel_bins": 80, "max_source_positions": 1500,
          "max_target_positions": 448}, 1500, 128, note="whisper-base, 30 s of audio"),
    Case("vit-base", "vit", "real",
         {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
          "intermediate_size": 3072, "image_size": 224, "patch_size": 16, "num_channels": 3},
         224, note="vit-base-patch16-224, 197 tokens"),
    Case("gpt2-6x512", "gpt2", "real",
         {"n_layer": 6, "n_embd": 512, "n_head": 8, "vocab_size": 50257, "n_positions": 1024,
          "use_cache": False}, 128,
         note="issue 30's held-out-style GPT-2 (as bench_torch's GPT-2-mid): 6 blocks x 512, "
              "128 tokens, GPT-2's vocabulary and tied LM head"),
    Case("gpt2-6x512-blocks", "gpt2", "real",
         {"n_layer": 6, "n_embd": 512, "n_head": 8, "vocab_size": 50257, "n_positions": 1024,
          "use_cache": False}, 128, head=False,
         note="gpt2-6x512 without its LM head (GPT2Model), the in-house decoder's counterpart"),
)  # fmt: skip

ARCHS = ("gpt2", "bert", "distilbert", "llama", "qwen2", "mistral", "t5enc", "t5", "whisper",
         "vit")  # fmt: skip
CASES: dict[str, Case] = {c.name: c for c in (*(_tiny(a) for a in ARCHS), *REAL)}
GOAL_CASE = "gpt2-6x512-blocks"
"""The case of the pipelined goal (0.45 of the bound, dynamo export): the blocks, as the
in-house decoder (0.48) they are held against. With its LM head the model writes 128 x 50257
float32 logits a sample (25.7 MB), which the host links (150 GB/s on wse2) take 171 us to carry:
at most 5,830 samples/s, 0.053 of its compute bound, however the wafer is placed (cgc reaches
4,491, every layer's stage below that period but the head's)."""
DECODER_CASES = ("gpt2-6x512", "gpt2-6x512-blocks")
"""The cases measured beside the in-house decoder of their shape (``zoo.decoder``)."""


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------


class Wrapped(torch.nn.Module):
    """A transformers model called with positional inputs (bound to ``names``), returning its
    ``output`` tensor alone (``logits`` or ``last_hidden_state``)."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...], output: str):
        super().__init__()
        self.model, self.names, self.output = model, names, output

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        inputs = (x,) if y is None else (x, y)
        out = self.model(**dict(zip(self.names, inputs, strict=True)), return_dict=True)
        return out[self.output]


@dataclass
class Built:
    """A case's module in eval mode, its example inputs and their names."""

    case: Case
    impl: str
    module: Wrapped
    args: tuple[torch.Tensor, ...]
    names: tuple[str, ...]


_MODELS: dict[str, tuple[type, type, tuple[str, ...], str]] = {
    "gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel, ("input_ids",), "logits"),
    "bert": (tf.BertConfig, tf.BertModel, ("input_ids",), "last_hidden_state"),
    "distilbert": (tf.DistilBertConfig, tf.DistilBertModel, ("input_ids",), "last_hidden_state"),
    "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, ("input_ids",), "logits"),
    "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, ("input_ids",), "logits"),
    "mistral": (tf.MistralConfig, tf.MistralForCausalLM, ("input_ids",), "logits"),
    "t5enc": (tf.T5Config, tf.T5EncoderModel, ("input_ids",), "last_hidden_state"),
    "t5": (tf.T5Config, tf.T5ForConditionalGeneration, ("input_ids", "decoder_input_ids"),
           "logits"),
    "whisper": (tf.WhisperConfig, tf.WhisperModel, ("input_features", "decoder_input_ids"),
                "last_hidden_state"),
    "vit": (tf.ViTConfig, tf.ViTModel, ("pixel_values",), "last_hidden_state"),
}  # fmt: skip
"""Per architecture: its config and model classes, input names and the output kept."""

_WHISPER_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                   "decoder_start_token_id": 1}  # fmt: skip


def build(case: Case, impl: str) -> Built:
    """The case's model with ``impl`` attention, random weights (seed 0), in eval mode.

    transformers initializes biases to zero and norm scales to one; those constants would let
    an exporter drop the biases (the dynamo exporter's optimizer folds a zero bias away) or
    merge equal initializers (TorchScript writes one tensor for all of them), so a model
    would be measured without work a trained one has. Every parameter gets noise on top."""
    config_class, model_class, names, output = _MODELS[case.arch]
    if case.arch == "gpt2" and not case.head:
        model_class, output = tf.GPT2Model, "last_hidden_state"
    settings = dict(case.config)
    if case.arch == "whisper":
        settings.update(_WHISPER_TOKENS)
    torch.manual_seed(0)
    config = config_class(attn_implementation=impl, **settings)
    kwargs = {"add_pooling_layer": False} if case.arch == "vit" else {}
    model = model_class(config, **kwargs).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    g = torch.Generator().manual_seed(1)
    b = EXAMPLE_BATCH
    if case.arch == "whisper":
        features = torch.randn(b, settings["num_mel_bins"], 2 * case.seq, generator=g)
        args: tuple[torch.Tensor, ...] = (features, _tokens(case, case.decoder_seq, g))
    elif case.arch == "vit":
        args = (torch.randn(b, settings["num_channels"], case.seq, case.seq, generator=g),)
    elif case.arch == "t5":
        args = (_tokens(case, case.seq, g), _tokens(case, case.decoder_seq, g))
    else:
        args = (_tokens(case, case.seq, g),)
    return Built(case, impl, Wrapped(model, names, output).eval(), args, names)


def _tokens(case: Case, length: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(3, case.vocab, (EXAMPLE_BATCH, length), generator=g)


# ---------------------------------------------------------------------------------------------
# Exporting
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def vmap_free_masks() -> Iterator[None]:
    """transformers' sdpa (and eager) mask builder replaced by its vmap-free one while the
    block runs, as ``transformers.integrations.executorch`` does for export."""
    import transformers.masking_utils as masking
    from transformers.integrations.executorch import sdpa_mask_without_vmap

    functions = masking.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    saved = masking.sdpa_mask, functions["sdpa"]
    masking.sdpa_mask = sdpa_mask_without_vmap
    functions["sdpa"] = sdpa_mask_without_vmap
    try:
        yield
    finally:
        masking.sdpa_mask, functions["sdpa"] = saved


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The exporters' progress lines and warnings kept off the benchmark's output."""
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        torch.no_grad(),
    ):
        warnings.simplefilter("ignore")
        yield


def export_onnx(built: Built, exporter: str, path: Path, sequence: bool = False) -> Path:
    """Writes the model exported by ``exporter`` (``EXPORTERS``) to ``path``, the batch axis
    of every input and of the output symbolic (and their sequence axis, with ``sequence``: a
    decoder to generate with); large models' weights in an external file."""
    names, out = list(built.names), ["out"]
    symbolic = {0: "batch", 1: "sequence"} if sequence else {0: "batch"}
    with quiet():
        if exporter in ("ts", "tsnv"):
            masks = vmap_free_masks() if exporter == "tsnv" else contextlib.nullcontext()
            axes = {name: symbolic for name in (*names, *out)}
            with masks:
                torch.onnx.export(
                    built.module, built.args, str(path), dynamo=False, opset_version=17,
                    input_names=names, output_names=out, dynamic_axes=axes,
                )  # fmt: skip
        elif exporter in ("dyn", "dyn23"):
            dims = {0: torch.export.Dim("batch")}
            if sequence:
                dims[1] = torch.export.Dim("sequence", max=built.case.seq * 4)
            torch.onnx.export(
                built.module, built.args, str(path), dynamo=True,
                opset_version=23 if exporter == "dyn23" else 18, input_names=names,
                output_names=out, dynamic_shapes=tuple(dims for _ in names),
                external_data=built.case.external_data, optimize=True, verify=False,
                report=False,
            )  # fmt: skip
        else:
            raise ValueError(f"unknown exporter {exporter!r}; expected one of {EXPORTERS}")
    return path


# ---------------------------------------------------------------------------------------------
# Params-file twins
# ---------------------------------------------------------------------------------------------


def params_twin(case: Case, batch: int) -> Any | None:
    """The case's architecture as a cgc ``ModelParams`` at global batch ``batch`` (float32
    like the exports, one system), or None where no params file can say it."""
    from cgc.frontends.params import load_params

    c = case.config
    if not case.head:  # a params file's language model always has its head
        return None
    if case.arch == "gpt2":
        base = load_params("zoo:cerebras-gpt-111m")  # GPT-2's architecture
        width = int(c["n_embd"])
        model = dataclasses.replace(
            base.model, hidden_size=width, num_hidden_layers=int(c["n_layer"]),
            num_heads=int(c["n_head"]), num_kv_heads=int(c["n_head"]), filter_size=4 * width,
            vocab_size=int(c["vocab_size"]), max_position_embeddings=int(c["n_positions"]),
            layer_norm_epsilon=1e-5, share_embedding_weights=True,
            use_projection_bias_in_attention=True, use_ffn_bias_in_attention=True,
            use_ffn_bias=True, use_bias_in_output=False,
        )  # fmt: skip
    elif case.arch == "llama":
        base = load_params("zoo:llama-7b")
        width, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
        model = dataclasses.replace(
            base.model, hidden_size=width, num_hidden_layers=int(c["num_hidden_layers"]),
            num_heads=heads, num_kv_heads=int(c["num_key_value_heads"]),
            filter_size=int(c["intermediate_size"]), vocab_size=int(c["vocab_size"]),
            max_position_embeddings=int(c["max_position_embeddings"]),
            rotary_dim=width // heads, rope_theta=float(c.get("rope_theta", 10000.0)),
            layer_norm_epsilon=1e-6,
            share_embedding_weights=bool(c.get("tie_word_embeddings", False)),
        )  # fmt: skip
    else:
        return None
    return dataclasses.replace(
        base,
        name=f"{case.name}-twin",
        source=f"{case.name} (params twin)",
        model=model,
        train_input=dataclasses.replace(
            base.train_input, batch_size=batch, max_sequence_length=case.seq
        ),
        runconfig=dataclasses.replace(base.runconfig, num_csx=1, precision="float32"),
    )
