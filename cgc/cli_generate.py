"""``cgc generate``: a causal language model's tokens after a prompt, greedily, on the
simulator, and how fast the wafer would serve them."""

from __future__ import annotations

import json

import click

from cgc.cli_io import check_outputs, read_safetensors, write_file
from cgc.cli_options import chosen_records, record_options, target_options, targeted
from cgc.errors import CgcError
from cgc.files import npz_bytes
from cgc.options import CompileOptions, GenerationOptions
from cgc.tools.paths import load_npz, model_argument, model_file

PROMPT_ARRAYS = ("input_ids", "attention_mask")
"""What a prompt file holds: the token ids ``[B, P]``, and optionally which are tokens (for
rows of different lengths, padded on either side)."""


@click.command()
@click.argument("model")
@click.option("--prompt", "prompt_path", help=".npz: input_ids [B, P] (and attention_mask).")
@record_options(GenerationOptions, "max_new_tokens", "concurrent", "prompt_len", "timing_only")
@record_options(CompileOptions, "mode")
@target_options
@record_options(CompileOptions, "num_csx", "init_seed")
@click.option("--weights", "weights_path", help="A .safetensors file of weights, by name.")
@click.option("--output", "output_path", help=".npz to write: tokens and attention_mask.")
@click.option("--artifact", "artifact_path", help="Write the compiled generation here (.cgc).")
@click.option("--jsonl", "jsonl_path", help="Write each step's tokens and time here.")
@click.option("--stats-json", type=click.Path(), help="Write the serving figures here.")
@click.option("--trace", type=click.Path(), help="Write a Chrome trace (Perfetto) here.")
def generate(
    model,
    prompt_path,
    target,
    mesh,
    figures,
    weights_path,
    output_path,
    artifact_path,
    jsonl_path,
    stats_json,
    trace,
    **options,
) -> None:
    """Generate tokens after each prompt of --prompt with MODEL (a params .yaml file,
    zoo:NAME, an .onnx decoder exported without its cache, file.py:factory returning a
    PyTorch causal LM and its example ids, or a generation's .cgc artifact that --artifact
    wrote), greedily on the simulator; or, with --timing-only, time serving --concurrent
    sequences of --prompt-len tokens."""
    from cgc.runtime.trace import trace_json
    from cgc.tools.generation import generate as run_generation
    from cgc.tools.generation import generation_spans, generation_text

    model = model_argument(model, "MODEL")
    inputs = {"MODEL": model_file(model), "--prompt": prompt_path, "--weights": weights_path}
    outputs = {"--output": output_path, "--artifact": artifact_path, "--jsonl": jsonl_path,
               "--stats-json": stats_json, "--trace": trace}  # fmt: skip
    check_outputs(outputs, inputs)
    timing_only = options["timing_only"]
    if timing_only and output_path is not None:
        raise CgcError("--output: a timing-only generation makes no tokens")
    if timing_only and prompt_path is not None:
        raise CgcError("--prompt: a timing-only generation takes --prompt-len instead")
    prompt, mask = _prompt(prompt_path) if prompt_path is not None else (None, None)
    weights = None if weights_path is None else read_safetensors(weights_path)
    options["target"] = targeted(target, mesh, figures)
    chosen = chosen_records(options, CompileOptions, GenerationOptions)
    generated = run_generation(
        model,
        prompt,
        chosen[CompileOptions],
        chosen[GenerationOptions],
        attention_mask=mask,
        weights=weights,
        prompt_name="--prompt",
    )
    if output_path is not None and generated.tokens is not None:
        assert generated.attention_mask is not None
        arrays = {"tokens": generated.tokens, "attention_mask": generated.attention_mask}
        write_file(output_path, npz_bytes(arrays))
    if artifact_path is not None:
        write_file(artifact_path, generated.compiled.artifact().to_bytes())
    if jsonl_path is not None:
        lines = "".join(json.dumps(step) + "\n" for step in generated.steps())
        write_file(jsonl_path, lines.encode())
    if stats_json is not None:
        report = {"reason": generated.compiled.reason, **generated.serving.to_json()}
        write_file(stats_json, json.dumps(report, indent=1).encode())
    if trace is not None:
        write_file(trace, trace_json(generation_spans(generated)).encode())
    click.echo(generation_text(generated), nl=False)


def _prompt(path: str) -> tuple[object, object | None]:
    """The token ids and the attention mask (if any) of a prompt file."""
    arrays = load_npz(path, "--prompt")
    unknown = sorted(set(arrays) - set(PROMPT_ARRAYS))
    if unknown:
        raise CgcError(
            f"--prompt {path}: holds {unknown[0]!r}; a prompt holds {' and '.join(PROMPT_ARRAYS)}"
        )
    if "input_ids" not in arrays:
        raise CgcError(f"--prompt {path}: no input_ids")
    return arrays["input_ids"], arrays.get("attention_mask")
