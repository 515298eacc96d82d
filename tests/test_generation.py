"""Generation with a key-value cache: greedy tokens equal ``transformers``' ``generate`` on
small random-weight GPT-2 (its tanh GELU), Llama (grouped-query attention, llama3 rotary
scaling) and Mistral (a sliding window shorter than the generation) models as transformers
makes them by default (sdpa attention), for one sequence and for a batch of
prompts of different lengths, every step's logits within float32 rounding of eager; decoding
with the cache equals recomputing the whole prefix; the cache is a stated thing of the IR and
the bytecode, kept by the system and written in place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import cgc  # noqa: E402
from cgc.frontends.params import load_params  # noqa: E402
from cgc.machine.program.bytecode import Opcode  # noqa: E402
from cgc.runtime.generation import Generator, prompts_of  # noqa: E402

VOCAB, WIDTH, NEW = 96, 64, 8


def _model(name: str) -> Any:
    """A small random-weight ``transformers`` causal LM, its biases and norms randomized so
    that a misplaced one shows."""
    torch.manual_seed(0)
    common: dict[str, Any] = {"vocab_size": VOCAB}  # transformers' default attention (sdpa)
    llama = dict(hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=112, max_position_embeddings=64,
                 tie_word_embeddings=False, **common)  # fmt: skip
    if name == "gpt2":
        # GPT-2's own activation: the tanh approximation of GELU (gelu_new)
        config = transformers.GPT2Config(n_embd=WIDTH, n_layer=2, n_head=4, n_positions=64,
                                         **common)  # fmt: skip
        module = transformers.GPT2LMHeadModel(config)
    elif name == "llama":
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
        module = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(rope_theta=500000.0, rope_scaling=scaling, **llama)
        )
    else:
        module = transformers.MistralForCausalLM(
            transformers.MistralConfig(sliding_window=6, **llama)
        )
    with torch.no_grad():
        for key, tensor in module.named_parameters():
            if key.endswith("bias") or "norm" in key or "ln_" in key:
                tensor.copy_(torch.randn_like(tensor) * 0.3 + (0 if key.endswith("bias") else 1))
    return module.eval()


def _prompts(batch: bool) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and their attention mask, left-padded as transformers pads a batch."""
    rng = np.random.default_rng(3)
    if not batch:
        ids = rng.integers(0, VOCAB, (1, 7))
        return ids, np.ones_like(ids)
    ids = rng.integers(1, VOCAB, (3, 9))
    mask = np.ones_like(ids)
    mask[0, :4] = 0
    mask[2, :1] = 0
    ids[mask == 0] = 0
    return ids, mask


def _reference(module: Any, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """transformers' greedy tokens and every step's logits ``[N, B, V]``."""
    with torch.no_grad():
        out = module.generate(
            torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW,
            do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    return out.sequences.numpy(), torch.stack(out.logits).numpy()


@pytest.mark.parametrize("batch", [False, True], ids=["one", "batch"])
@pytest.mark.parametrize("name", ["gpt2", "llama", "mistral"])
def test_greedy_tokens_and_logits_equal_transformers(name: str, batch: bool) -> None:
    module = _model(name)
    ids, mask = _prompts(batch)
    generated = cgc.generate(module, ids, attention_mask=mask, max_new_tokens=NEW)
    tokens, logits = _reference(module, ids, mask)
    np.testing.assert_array_equal(generated.tokens, tokens)
    np.testing.assert_array_equal(generated.attention_mask[:, : ids.shape[1]], mask)
    assert generated.logits is not None
    np.testing.assert_allclose(generated.logits, logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["pipelined", "whole_wafer", "weight_streaming"])
def test_every_way_of_serving_generates_the_same_tokens(mode: str) -> None:
    module = _model("llama")
    ids, mask = _prompts(True)
    generated = cgc.generate(module, ids, attention_mask=mask, max_new_tokens=4, mode=mode)
    assert generated.compiled.mode == mode
    with torch.no_grad():
        want = module.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                               max_new_tokens=4, do_sample=False, pad_token_id=0)  # fmt: skip
    np.testing.assert_array_equal(generated.tokens, want.numpy())


def _params(tmp_path: Path, sequence: int) -> Path:
    document = {
        "model": {"hidden_size": 32, "num_hidden_layers": 2, "num_heads": 4, "filter_size": 64,
                  "vocab_size": 50, "max_position_embeddings": 32,
                  "position_embedding_type": "rotary", "rotary_dim": 8, "norm_type": "rmsnorm",
                  "nonlinearity": "swiglu", "extra_attention_params": {"num_kv_groups": 2}},
        "train_input": {"batch_size": 2, "max_sequence_length": sequence},
    }  # fmt: skip
    path = tmp_path / f"model-{sequence}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_decoding_with_the_cache_equals_recomputing_the_prefix(tmp_path: Path) -> None:
    """Every step's logits equal those the model (without a cache, on the whole sequence
    the generation made) gives at that step's position."""
    prompt = np.random.default_rng(0).integers(0, 50, (2, 5))
    generated = cgc.generate(_params(tmp_path, 5), prompt, max_new_tokens=6, init_seed=4)
    assert generated.tokens is not None and generated.logits is not None
    whole = generated.tokens[:, :-1]
    artifact = cgc.compile(_params(tmp_path, whole.shape[1]), init_seed=4)
    recomputed = cgc.run(artifact, {"input_ids": whole.astype(np.int32)})["logits"]
    steps = np.moveaxis(recomputed[:, prompt.shape[1] - 1 :], 1, 0)
    np.testing.assert_allclose(generated.logits, steps, rtol=1e-4, atol=1e-5)


def test_the_cache_is_stated_and_written_in_place(tmp_path: Path) -> None:
    """The IR states each layer's caches with their capacity; the bytecode loads them with a
    CACHE instruction; one system keeps them, the same arrays, from the prompt's run through
    every step."""
    prompt = np.random.default_rng(1).integers(0, 50, (2, 5))
    generated = cgc.generate(_params(tmp_path, 5), prompt, max_new_tokens=3, init_seed=0)
    compiled = generated.compiled
    for artifact in (compiled.prefill, compiled.decode):
        # the prompt's 5 tokens and the 2 fed back: the last new token never is
        assert 'wse.kv_cache "h.1.attn.value_cache" {capacity = 7 : i64}' in artifact.ir
        caches = [i for i in artifact.program.instructions if i.opcode == Opcode.CACHE]
        assert len(caches) == 4
    generator = Generator(compiled.prefill, compiled.decode, compiled.mode)
    prompts = prompts_of(prompt, None, 50, "prompt")
    generator.generate(prompts, 1)
    arrays = {name: id(array) for name, array in generator.system.caches.items()}
    tokens, _ = generator.generate(prompts, 3)
    assert {name: id(array) for name, array in generator.system.caches.items()} == arrays
    np.testing.assert_array_equal(tokens, generated.new_tokens)
    kept = generator.system.caches["h.0.attn.key_cache"].reshape(2, 7, -1)
    assert kept.any(axis=-1).all()  # every row written: the prompt's 5 and 2 decode steps'


def test_serving_figures_of_a_timing_only_generation() -> None:
    generated = cgc.generate("zoo:cerebras-gpt-111m", timing_only=True, prompt_len=64,
                             max_new_tokens=16, concurrent=2)  # fmt: skip
    serving = generated.serving
    assert generated.tokens is None
    figures = serving.to_json()
    for key in ("ttft_seconds", "tpot_seconds", "tokens_per_second",
                "tokens_per_second_per_sequence", "kv_capacity_tokens", "num_csx"):  # fmt: skip
        assert figures[key] > 0, key
    # the caches compiled (64 + 16 - 1 tokens for each of 2 sequences) fit what is stated
    assert figures["kv_capacity_tokens"] >= 2 * 79
    # a token's time is the decode step's layers (and its links), and the first token's the
    # prompts' program's
    decode = serving.decode
    assert serving.tpot_seconds >= sum(t.seconds for t in decode.layers) - 1e-15
    assert serving.ttft_seconds >= sum(t.seconds for t in serving.prefill.layers) - 1e-15
    assert decode.layers[0].name == "wte"
    assert generated.compiled.reason.startswith("the faster for 2 sequences at once")
    assert [s["step"] for s in generated.steps()] == list(range(16))


def test_a_model_too_big_for_its_systems_says_how_many_it_needs() -> None:
    with pytest.raises(cgc.CgcError, match=r"it needs at least 26 \(num_csx\)$"):
        cgc.generate("zoo:llama-3.1-405b", timing_only=True, prompt_len=2048,
                     max_new_tokens=1024, target="wse3", num_csx=4)  # fmt: skip


def test_a_params_model_gives_its_config_to_the_generation(tmp_path: Path) -> None:
    params = load_params(_params(tmp_path, 5))
    generated = cgc.generate(params, [[1, 2, 3], [4, 5]], max_new_tokens=2, init_seed=1)
    assert generated.tokens is not None and generated.tokens.shape == (2, 5)
    np.testing.assert_array_equal(generated.attention_mask, [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])


def test_the_pipelined_decode_takes_bands_and_the_prompts_its_rectangles() -> None:
    """In pipelined mode the decode step's layers lie in bands of the mesh's full width,
    stacked down it, and the prompts' program keeps every layer's rectangle."""
    generated = cgc.generate("zoo:cerebras-gpt-111m", timing_only=True, prompt_len=32,
                             max_new_tokens=4, mode="pipelined")  # fmt: skip
    decode = [tuple(layer["rect"]) for layer in generated.compiled.decode.manifest["layers"]]
    prompts = [tuple(layer["rect"]) for layer in generated.compiled.prefill.manifest["layers"]]
    assert prompts == decode
    assert {w for _, _, w, _ in decode} == {750}  # wse2's columns
    tops = [y for _, y, _, _ in decode]
    assert tops == sorted(tops) and tops[0] == 0
    assert all(y + h == nxt for (_, y, _, h), nxt in zip(decode, tops[1:], strict=False))


def test_a_long_prompt_runs_in_chunks_as_transformers_does() -> None:
    """Pipelined, a prompt longer than a chunk (``PIPELINED_CHUNK`` tokens) runs chunk after
    chunk, each writing its keys and values for the next: the tokens are transformers'."""
    from cgc.compiler.generation import PIPELINED_CHUNK

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4,
                                     n_positions=PIPELINED_CHUNK + 64)  # fmt: skip
    module = transformers.GPT2LMHeadModel(config).eval()
    rng = np.random.default_rng(4)
    ids = rng.integers(1, VOCAB, (2, PIPELINED_CHUNK + 20))
    mask = np.ones_like(ids)
    mask[1, :PIPELINED_CHUNK] = 0  # the second prompt ends in the first chunk's positions
    ids[mask == 0] = 0
    generated = cgc.generate(module, ids, attention_mask=mask, max_new_tokens=3, mode="pipelined")
    assert generated.compiled.serving.prompt_runs == 2
    with torch.no_grad():
        want = module.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                               max_new_tokens=3, do_sample=False, pad_token_id=0)  # fmt: skip
    np.testing.assert_array_equal(generated.tokens, want.numpy())


def test_the_positions_load_at_every_layer_that_reads_them(tmp_path: Path) -> None:
    """``positions`` (marked ``EVERY_LAYER``) loads from the host at each layer that reads it,
    so that no route carries it from the first layer to all the others."""
    from cgc.frontends import transformer

    params = load_params(_params(tmp_path, 5))
    imported = transformer.build_generation(params, 2, transformer.Generation(1, 8, False))
    artifact = cgc.compile(imported, mode="pipelined")
    program = artifact.program
    loads = [i for i in program.instructions if i.opcode == Opcode.INPUT and i.attrs["index"] == 1]
    register = loads[0].results[0]
    readers = {
        index
        for index, span in enumerate(program.layer_spans)
        for position in span
        if register in program.instructions[position].operands
    }
    assert len(loads) == len(readers) >= 4  # the two blocks' rotary and attention layers
    assert all(register not in inputs for inputs in program.layer_inputs)
