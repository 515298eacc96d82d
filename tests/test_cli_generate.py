"""``cgc generate`` from the command line: a transformers causal LM through ``file.py:factory``
generates transformers' tokens, with the tokens, the steps and the serving figures written;
every bad input is one line naming the culprit, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from cgc.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FACTORY = """
import torch, transformers

def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=32, activation_function="gelu",
                                     attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config).eval(), (torch.tensor([[5, 9, 2, 7]]),)

def headless():
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4,
                                     n_positions=32, attn_implementation="eager")
    return transformers.GPT2Model(config).eval(), (torch.tensor([[5, 9]]),)
"""


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_a_transformers_model_generates_its_tokens(tmp_path: Path) -> None:
    (tmp_path / "models.py").write_text(FACTORY)
    out, steps, stats = tmp_path / "out.npz", tmp_path / "steps.jsonl", tmp_path / "s.json"
    code, output = _invoke(
        "generate", f"{tmp_path / 'models.py'}:gpt2", "--max-new-tokens", "5",
        "--output", str(out), "--jsonl", str(steps), "--stats-json", str(stats),
        "--trace", str(tmp_path / "trace.json"),
    )  # fmt: skip
    assert code == 0, output
    assert output.startswith("mode: ")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=32, activation_function="gelu",
                                     attn_implementation="eager")  # fmt: skip
    module = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        want = module.generate(torch.tensor([[5, 9, 2, 7]]), max_new_tokens=5, do_sample=False,
                               pad_token_id=0)  # fmt: skip
    np.testing.assert_array_equal(np.load(out)["tokens"], want.numpy())
    lines = [json.loads(line) for line in steps.read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(5))
    assert [line["tokens"][0] for line in lines] == want[0, 4:].tolist()
    figures = json.loads(stats.read_text())
    assert figures["ttft_seconds"] == lines[0]["seconds"]
    assert figures["tpot_seconds"] == lines[1]["seconds"]
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert any(event["name"].startswith("prompts: ") for event in events)
    first = min(e["ts"] for e in events if e["name"].startswith("token 1: "))
    assert first == pytest.approx(figures["ttft_seconds"] * 1e6)


def _params(tmp_path: Path, positions: int = 32) -> str:
    """A small GPT; with many positions, rotary ones (a table of them would not fit)."""
    rotary = {"position_embedding_type": "rotary", "rotary_dim": 8} if positions > 32 else {}
    document = {
        "model": {"hidden_size": 32, "num_hidden_layers": 2, "num_heads": 4, "filter_size": 64,
                  "vocab_size": 50, "max_position_embeddings": positions, **rotary},
        "train_input": {"batch_size": 1, "max_sequence_length": 8},
    }  # fmt: skip
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


def _prompt(tmp_path: Path, ids: np.ndarray, **more: np.ndarray) -> str:
    path = tmp_path / "prompt.npz"
    np.savez(path, input_ids=ids, **more)
    return str(path)


def _refused(tmp_path: Path, *args: str) -> str:
    """The one line of a refused generation; nothing is written."""
    out = tmp_path / "stats.json"
    code, output = _invoke("generate", *args, "--stats-json", str(out))
    assert code == 2, output
    assert output.count("\n") == 1, output
    assert not out.exists()
    return output


def test_bad_prompts_are_refused_naming_them(tmp_path: Path) -> None:
    model = _params(tmp_path)
    outside = _prompt(tmp_path, np.array([[1, 2, 50]]))
    assert _refused(tmp_path, model, "--prompt", outside, "--init-seed", "0") == (
        "error: --prompt: token id 50 (sequence 0, token 2) is outside the vocabulary of "
        "50 tokens\n"
    )
    empty = _prompt(tmp_path, np.zeros((1, 0), np.int64))
    assert _refused(tmp_path, model, "--prompt", empty, "--init-seed", "0") == (
        "error: --prompt: sequence 0 is empty\n"
    )
    holed = _prompt(tmp_path, np.array([[1, 2, 3]]), attention_mask=np.array([[1, 0, 1]]))
    assert "attention mask has a hole" in _refused(tmp_path, model, "--prompt", holed,
                                                   "--init-seed", "0")  # fmt: skip
    other = tmp_path / "other.npz"
    np.savez(other, tokens=np.array([[1, 2]]))
    assert "holds 'tokens'; a prompt holds input_ids and attention_mask" in _refused(
        tmp_path, model, "--prompt", str(other), "--init-seed", "0"
    )


def test_lengths_past_the_positions_or_the_cache_are_refused(tmp_path: Path) -> None:
    prompt = _prompt(tmp_path, np.array([[1, 2, 3, 4]]))
    line = _refused(tmp_path, _params(tmp_path), "--prompt", prompt, "--init-seed", "0",
                    "--max-new-tokens", "40")  # fmt: skip
    assert "a prompt of 4 tokens and 40 new tokens feed 43 positions, past the model's 32" in line
    line = _refused(tmp_path, _params(tmp_path, 1 << 20), "--timing-only", "--prompt-len",
                    "4096", "--max-new-tokens", "4096", "--concurrent", "64", "--target", "wse2",
                    "--mesh", "8x8", "--mode", "whole_wafer")  # fmt: skip
    assert "64 sequence(s) of 8191 tokens (a prompt of 4096 and 4096 new) need 524224" in line
    assert "in whole_wafer mode the SRAM left beside the model holds at most" in line


def test_bad_options_and_models_are_refused(tmp_path: Path) -> None:
    (tmp_path / "models.py").write_text(FACTORY)
    model = _params(tmp_path)
    line = _refused(tmp_path, model, "--timing-only", "--prompt-len", "4", "--concurrent", "0")
    assert "--concurrent" in line and "0" in line
    assert _refused(tmp_path, f"{tmp_path / 'models.py'}:headless").startswith(
        "error: GPT2Model has no causal LM head"
    )
    prompt = _prompt(tmp_path, np.array([[1, 2]]))
    assert "--init-seed" in _refused(tmp_path, model, "--prompt", prompt)
    assert "--prompt-len" in _refused(tmp_path, model, "--timing-only")
    onnx_file = tmp_path / "decoder.onnx"
    onnx_file.write_bytes(b"")
    line = _refused(tmp_path, str(onnx_file), "--prompt", prompt)
    assert line.startswith("error: decoder.onnx: not a valid ONNX model")


def test_the_compiled_generation_is_an_artifact_inspect_reads(tmp_path: Path) -> None:
    """``--artifact`` writes both programs in one file (the same bytes twice over); ``cgc
    inspect`` states its caches, their capacity and the serving figures."""
    model = _params(tmp_path)
    written = []
    for name in ("a.cgc", "b.cgc"):
        code, output = _invoke("generate", model, "--timing-only", "--prompt-len", "6",
                               "--max-new-tokens", "4", "--concurrent", "2", "--mode",
                               "pipelined", "--artifact", str(tmp_path / name))  # fmt: skip
        assert code == 0, output
        written.append((tmp_path / name).read_bytes())
    assert written[0] == written[1]
    code, output = _invoke("inspect", str(tmp_path / "a.cgc"))
    assert code == 0, output
    assert "key-value caches: 4 (" in output
    assert "9 tokens for each of 2 sequences" in output
    assert "longest context: " in output and "serving: time to first token" in output
    code, output = _invoke("inspect", "--json", str(tmp_path / "a.cgc"))
    info = json.loads(output)
    assert [c["name"] for c in info["generation"]["decode"]["caches"]] == [
        f"h.{b}.attn.{kind}_cache" for b in (0, 1) for kind in ("key", "value")
    ]
    assert info["generation"]["serving"]["kv_capacity_tokens"] >= 2 * 9  # the caches compiled


def test_a_timing_only_generation_takes_no_weights(tmp_path: Path) -> None:
    line = _refused(tmp_path, _params(tmp_path), "--timing-only", "--prompt-len", "4",
                    "--init-seed", "1")  # fmt: skip
    assert line == "error: --init-seed: a timing-only generation declares its weights\n"


def test_prompts_given_as_rows_are_checked() -> None:
    import cgc
    from cgc.runtime.generation import prompts_of

    for ids, mask, message in (
        ([[1, 2], [3]], [[1, 1], [1, 0]], "rows of their own lengths need no attention mask"),
        ([[1, 2], [[4, 5]]], None, "row 1 is not a list of token ids"),
        ([[1, [2, 3]]], None, "rows of different lengths"),
    ):
        with pytest.raises(cgc.CgcError, match=message):
            prompts_of(ids, mask, 50, "prompt")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ('rects="fc1@0,0"', "error: place-layers: rects: 'fc1@0,0' is not name@x,y,w,h"),
        ('rects="fc1@0,0,9,9"', "error: place-layers: rects: 'fc1@0,0,9,9' is not inside"),
        ('rects="fc1@0,0,1,1" bands=true', "error: place-layers: rects and bands are two"),
    ],
)
def test_a_placement_given_badly_is_one_line(options: str, message: str) -> None:
    mlir = Path(__file__).parent / "filecheck" / "place-layers.mlir"
    code, output = _invoke("opt", str(mlir), "--target", "mesh8x3", "-p",
                           f"place-layers{{{options}}}")  # fmt: skip
    assert code == 2 and output.startswith(message) and output.count("\n") == 1, output


def test_a_generation_runs_again_from_its_artifact(tmp_path: Path) -> None:
    """``--artifact`` keeps both programs, the weights and the serving figures: the artifact
    generates the same tokens without compiling again, and refuses what would recompile it."""
    model = _params(tmp_path)
    prompt = _prompt(tmp_path, np.array([[1, 2, 3, 4], [5, 6, 7, 8]]))
    first, again = tmp_path / "first.npz", tmp_path / "again.npz"
    code, output = _invoke("generate", model, "--prompt", prompt, "--init-seed", "3",
                           "--max-new-tokens", "5", "--output", str(first), "--artifact",
                           str(tmp_path / "gen.cgc"))  # fmt: skip
    assert code == 0, output
    code, again_output = _invoke("generate", str(tmp_path / "gen.cgc"), "--prompt", prompt,
                                 "--max-new-tokens", "3", "--output", str(again))  # fmt: skip
    assert code == 0, again_output
    np.testing.assert_array_equal(np.load(again)["tokens"], np.load(first)["tokens"][:, :7])
    assert again_output.splitlines()[:4] == output.splitlines()[:4]  # the same figures
    refused = _refused(tmp_path, str(tmp_path / "gen.cgc"), "--prompt", prompt, "--concurrent", "3")
    assert refused == (
        "error: --concurrent: the generation's artifact was compiled otherwise; compile it "
        "again to change it\n"
    )
    assert "past the caches' 8 the artifact was compiled for" in _refused(
        tmp_path, str(tmp_path / "gen.cgc"), "--prompt", prompt, "--max-new-tokens", "6"
    )
