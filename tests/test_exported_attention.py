"""transformers' models as users export them: every attention block fused, outputs as eager's.

Small random-weight configurations of transformers' GPT-2, Llama (grouped-query heads and
rotary), Mistral (a sliding window), BERT, DistilBERT (``masked_fill`` with the scores in the
false branch), ViT, Whisper (cross-attention over another length) and T5 (a relative position
bias computed at run time, the fused op's bias operand), in the ``sdpa`` and
``eager`` attention implementations, through the dynamo exporter (opset 18, and 23 where
``scaled_dot_product_attention`` becomes ONNX's own ``Attention``) and the TorchScript one
(opset 17; decoders need transformers' vmap-free mask builder to trace). Each compiles with
every block fused (the manifest's census says so) and runs as torch eager does.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import pytest

import cgc

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SEQ, HEADS, WIDTH, VOCAB = 12, 4, 32, 64
"""Twelve tokens: longer than Mistral's window and than the inline limit of a mask's rows."""


def _config(arch: str, attention: str):
    small = {"attn_implementation": attention}
    if arch == "gpt2":
        return transformers.GPT2Config(
            n_layer=1, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB, n_positions=SEQ, **small
        )
    if arch in ("llama", "mistral"):
        config = transformers.LlamaConfig if arch == "llama" else transformers.MistralConfig
        extra = {"sliding_window": 5} if arch == "mistral" else {}
        return config(
            hidden_size=WIDTH, num_hidden_layers=1, num_attention_heads=HEADS,
            num_key_value_heads=2, intermediate_size=2 * WIDTH, vocab_size=VOCAB,
            max_position_embeddings=SEQ, use_cache=False, **extra, **small,
        )  # fmt: skip
    if arch == "bert":
        return transformers.BertConfig(
            hidden_size=WIDTH, num_hidden_layers=1, num_attention_heads=HEADS,
            intermediate_size=2 * WIDTH, vocab_size=VOCAB, max_position_embeddings=SEQ, **small,
        )  # fmt: skip
    if arch == "distilbert":
        return transformers.DistilBertConfig(
            dim=WIDTH, n_layers=1, n_heads=HEADS, hidden_dim=2 * WIDTH, vocab_size=VOCAB,
            max_position_embeddings=SEQ, **small,
        )  # fmt: skip
    if arch == "vit":
        return transformers.ViTConfig(
            hidden_size=WIDTH, num_hidden_layers=1, num_attention_heads=HEADS,
            intermediate_size=2 * WIDTH, image_size=8, patch_size=4, **small,
        )  # fmt: skip
    if arch == "t5":
        return transformers.T5Config(
            d_model=WIDTH, d_kv=WIDTH // HEADS, num_heads=HEADS, num_layers=1,
            num_decoder_layers=1, d_ff=2 * WIDTH, vocab_size=VOCAB,
            relative_attention_num_buckets=8, use_cache=False, **small,
        )  # fmt: skip
    return transformers.WhisperConfig(
        d_model=WIDTH, encoder_layers=1, decoder_layers=1, encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS, encoder_ffn_dim=2 * WIDTH, decoder_ffn_dim=2 * WIDTH,
        vocab_size=VOCAB, num_mel_bins=8, max_source_positions=SEQ, max_target_positions=SEQ,
        use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1, **small,
    )  # fmt: skip


class Outputs(torch.nn.Module):
    """The model called with its inputs by name, returning its main output alone."""

    def __init__(self, model, names: tuple[str, ...], output: str):
        super().__init__()
        self.model, self.names, self.output = model, names, output

    def forward(self, x, y=None):
        args = (x,) if y is None else (x, y)
        named = dict(zip(self.names, args, strict=True))
        return self.model(**named, return_dict=True)[self.output]


MODELS = {
    "gpt2": ("GPT2LMHeadModel", "logits"),
    "llama": ("LlamaForCausalLM", "logits"),
    "mistral": ("MistralForCausalLM", "logits"),
    "bert": ("BertModel", "last_hidden_state"),
    "distilbert": ("DistilBertModel", "last_hidden_state"),
}


def _model(arch: str, attention: str):
    """The wrapped model, its example inputs (batch 2), and how many attention blocks it
    has."""
    torch.manual_seed(0)
    config = _config(arch, attention)
    if arch == "vit":
        model = transformers.ViTModel(config, add_pooling_layer=False)
        wrapped = Outputs(model.eval(), ("pixel_values",), "last_hidden_state")
        return wrapped.eval(), (torch.randn(2, 3, 8, 8),), 1
    if arch == "t5":  # relative position biases; a decoder of 5 tokens
        model = transformers.T5ForConditionalGeneration(config)
        wrapped = Outputs(model.eval(), ("input_ids", "decoder_input_ids"), "logits")
        args = (torch.randint(3, VOCAB, (2, SEQ)), torch.randint(3, VOCAB, (2, 5)))
        return wrapped.eval(), args, 3
    if arch == "whisper":  # a decoder of 5 tokens attends to an encoder of SEQ
        model = transformers.WhisperModel(config)
        names = ("input_features", "decoder_input_ids")
        wrapped = Outputs(model.eval(), names, "last_hidden_state")
        args = (torch.randn(2, 8, 2 * SEQ), torch.randint(3, VOCAB, (2, 5)))
        return wrapped.eval(), args, 3
    kind, output = MODELS[arch]
    model = getattr(transformers, kind)(config)
    wrapped = Outputs(model.eval(), ("input_ids",), output)
    return wrapped.eval(), (torch.randint(3, VOCAB, (2, SEQ)),), 1


@contextlib.contextmanager
def _vmap_free_masks():
    """transformers' mask builder without ``vmap``, which the TorchScript exporter cannot
    trace (what its own executorch integration does)."""
    from transformers import masking_utils
    from transformers.integrations.executorch import sdpa_mask_without_vmap

    mapping = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    saved = masking_utils.sdpa_mask, mapping["sdpa"]
    masking_utils.sdpa_mask = mapping["sdpa"] = sdpa_mask_without_vmap
    try:
        yield
    finally:
        masking_utils.sdpa_mask, mapping["sdpa"] = saved


def _export(model, args: tuple, exporter: str, path) -> None:
    names = [f"input{i}" for i in range(len(args))]
    quiet = contextlib.redirect_stdout(io.StringIO())
    with warnings.catch_warnings(), quiet:
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            with _vmap_free_masks():
                torch.onnx.export(
                    model, args, path, dynamo=False, opset_version=17, input_names=names,
                    dynamic_axes={n: {0: "batch"} for n in names},
                )  # fmt: skip
            return
        opset = 23 if exporter == "dynamo23" else 18
        batch = torch.export.Dim("batch")
        program = torch.onnx.export(
            model, args, dynamo=True, opset_version=opset, input_names=names,
            dynamic_shapes=tuple({0: batch} for _ in args), verify=False, report=False,
        )  # fmt: skip
        program.save(str(path))


CASES = [
    ("gpt2", "sdpa", "dynamo"),
    ("gpt2", "sdpa", "dynamo23"),
    ("gpt2", "eager", "torchscript"),
    ("llama", "sdpa", "dynamo"),
    ("llama", "eager", "torchscript"),
    ("mistral", "sdpa", "dynamo"),
    ("bert", "sdpa", "dynamo"),
    ("bert", "eager", "torchscript"),
    ("distilbert", "eager", "dynamo"),
    ("vit", "sdpa", "torchscript"),
    ("whisper", "sdpa", "dynamo"),
    ("t5", "eager", "dynamo"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "attention", "exporter"), CASES)
def test_every_attention_block_is_fused_and_exact(arch, attention, exporter, tmp_path):
    model, args, blocks = _model(arch, attention)
    path = tmp_path / f"{arch}.onnx"
    _export(model, args, exporter, path)
    artifact = cgc.compile(path, mode="weight_streaming", batch_size=1)
    census = artifact.manifest["attention"]
    assert census == {"found": blocks, "fused": blocks, "first_unfused": None}
    one = tuple(a[:1] for a in args)
    names = [spec["name"] for spec in artifact.manifest["inputs"]]
    (got,) = cgc.run(artifact, {n: a.numpy() for n, a in zip(names, one, strict=True)}).values()
    with torch.no_grad():
        want = model(*one).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_padding_mask_from_an_input_is_the_fused_ops_bias(tmp_path):
    """An ``attention_mask`` input makes a mask known only at run time: the fused op adds it
    to the scores, and the padded samples come out as eager's."""
    torch.manual_seed(0)
    model = Outputs(
        transformers.BertModel(_config("bert", "sdpa")).eval(),
        ("input_ids", "attention_mask"),
        "last_hidden_state",
    ).eval()
    ids = torch.randint(3, VOCAB, (2, SEQ))
    mask = torch.ones(2, SEQ, dtype=torch.int64)
    mask[1, -3:] = 0
    path = tmp_path / "bert-mask.onnx"
    _export(model, (ids, mask), "dynamo", path)
    artifact = cgc.compile(path, mode="weight_streaming", batch_size=2)
    assert artifact.manifest["attention"] == {"found": 1, "fused": 1, "first_unfused": None}
    names = [spec["name"] for spec in artifact.manifest["inputs"]]
    feeds = dict(zip(names, (ids.numpy(), mask.numpy()), strict=True))
    (got,) = cgc.run(artifact, feeds).values()
    with torch.no_grad():
        want = model(ids, mask).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
