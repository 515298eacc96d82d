"""A params file says a Hugging Face causal LM exactly: small random-weight ``transformers``
models (Llama 3.1 with grouped-query attention, rope_theta 500000 and llama3 rope scaling;
Qwen2 with q/k/v biases only; GPT-2), written as params files by ``hf_config.model_section``,
compiled with their weights renamed by ``weights_from_hugging_face`` and run on the simulator,
give transformers' eager logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import cgc  # noqa: E402
from cgc.frontends.hf_config import model_section  # noqa: E402
from cgc.frontends.hf_weights import weights_from_hugging_face  # noqa: E402
from cgc.frontends.params import ModelParams, load_params, parameter_count  # noqa: E402

SEQ, BATCH, VOCAB, WIDTH, LAYERS = 12, 2, 96, 64, 2
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # small, so that the test's head dimension has frequencies in all three bands
    "original_max_position_embeddings": 64,
}


def _case(name: str) -> Any:
    """The transformers model of case ``name``."""
    common = {"vocab_size": VOCAB, "attn_implementation": "eager"}
    if name == "gpt2":
        config = transformers.GPT2Config(
            n_embd=WIDTH, n_layer=LAYERS, n_head=4, n_positions=32, activation_function="gelu",
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(config)
    llama = dict(hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=112, max_position_embeddings=128,
                 **common)  # fmt: skip
    if name == "llama-3.1":
        config = transformers.LlamaConfig(
            rope_theta=500000.0,
            rope_scaling=LLAMA3_SCALING,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            **llama,
        )
        return transformers.LlamaForCausalLM(config)
    config = transformers.Qwen2Config(rope_theta=1000000.0, rms_norm_eps=1e-6,
                                      tie_word_embeddings=False, **llama)  # fmt: skip
    return transformers.Qwen2ForCausalLM(config)


def randomized(module: Any) -> Any:
    """``module`` in eval mode, its biases and norms random, so that a misplaced one shows."""
    with torch.no_grad():
        for key, tensor in module.named_parameters():
            if key.endswith("bias") or "norm" in key or "ln_" in key:
                tensor.copy_(torch.randn_like(tensor) * 0.5 + (0 if key.endswith("bias") else 1))
    return module.eval()


def assert_runs_as(
    params: ModelParams, weights: dict[str, np.ndarray], module: Any, seed: int
) -> None:
    """``params`` with ``weights``, compiled and run on random ids, give ``module``'s logits."""
    artifact = cgc.compile(params, mode="weight_streaming", init_seed=0, weights=weights)
    shape = (params.train_input.batch_size, params.train_input.max_sequence_length)
    ids = np.random.default_rng(seed).integers(0, params.model.vocab_size, shape)
    logits = cgc.run(artifact, {"input_ids": ids.astype(np.int32)})["logits"]
    with torch.no_grad():
        want = module(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["llama-3.1", "qwen2", "gpt2"])
def test_logits_match_transformers(tmp_path: Path, name: str) -> None:
    torch.manual_seed(0)
    module = randomized(_case(name))
    document = {
        "model": model_section(module.config),
        "train_input": {"batch_size": BATCH, "max_sequence_length": SEQ},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    params = load_params(path)
    tensors = {key: value.detach().numpy() for key, value in module.state_dict().items()}
    weights = weights_from_hugging_face(tensors, params.model)
    # every parameter comes from the checkpoint (the compile refuses names it does not know)
    assert sum(w.size for w in weights.values()) == parameter_count(params.model)
    assert_runs_as(params, weights, module, seed=1)


def test_the_command_line_runs_a_hugging_face_checkpoint(tmp_path: Path) -> None:
    """``cgc compile PARAMS --weights model.safetensors`` reads a checkpoint by Hugging Face's
    names; a tensor no params-file model has is one line naming it."""
    from click.testing import CliRunner
    from safetensors.numpy import save_file

    from cgc.cli import main

    torch.manual_seed(0)
    module = _case("llama-3.1").eval()
    path = tmp_path / "llama.yaml"
    document = {
        "model": model_section(module.config),
        "train_input": {"batch_size": BATCH, "max_sequence_length": SEQ},
    }
    path.write_text(yaml.safe_dump(document))
    tensors = {key: value.detach().numpy() for key, value in module.state_dict().items()}
    save_file(tensors, tmp_path / "model.safetensors")
    ids = np.random.default_rng(2).integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32)
    np.savez(tmp_path / "in.npz", input_ids=ids)
    runner = CliRunner()
    compiled = runner.invoke(
        main,
        ["compile", str(path), "--weights", str(tmp_path / "model.safetensors"),
         "--mode", "weight_streaming", "-o", str(tmp_path / "llama.cgc")],
    )  # fmt: skip
    assert compiled.exit_code == 0, compiled.output
    ran = runner.invoke(
        main,
        ["run", str(tmp_path / "llama.cgc"), "--inputs", str(tmp_path / "in.npz"),
         "--output", str(tmp_path / "out.npz")],
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    with torch.no_grad():
        want = module(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["logits"], want, rtol=1e-4, atol=1e-5)

    save_file({**tensors, "model.extra.weight": np.zeros(3, np.float32)}, tmp_path / "bad.st")
    refused = runner.invoke(
        main,
        ["compile", str(path), "--weights", str(tmp_path / "bad.st"), "-o", str(tmp_path / "b")],
    )
    assert refused.exit_code == 2
    assert refused.output == (
        "error: --weights: model.extra.weight: not a tensor of a Hugging Face causal LM cgc "
        "can read\n"
    )
    assert not (tmp_path / "b").exists()
