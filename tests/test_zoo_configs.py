"""Every built-in params file compiles for wse2 at its published batch and sequence length, in
weight-streaming mode for training, and simulates a step without a weight allocated; the
largest ones whole, in bounded memory. The LLMs served today (Llama 3.1, Qwen2) have their
published parameter counts and compile whole, timing-only."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

import cgc
from cgc.frontends.params import load_params, parameter_count, zoo_names


def reduced(name: str, blocks: int = 2):
    """The built-in model ``name`` with ``blocks`` transformer blocks, all else as published."""
    params = load_params(f"zoo:{name}")
    return dataclasses.replace(
        params, model=dataclasses.replace(params.model, num_hidden_layers=blocks)
    )


@pytest.mark.parametrize("name", zoo_names())
def test_every_builtin_config_trains_on_wse2_at_its_published_shape(name):
    params = reduced(name)
    sim = cgc.simulate(params)
    stats = sim.stats
    assert stats.batch_size == params.train_input.batch_size
    assert stats.num_csx == params.runconfig.num_csx
    assert stats.tokens_per_sample == params.train_input.max_sequence_length
    assert 0 < stats.peak_pe_sram_bytes <= 48 * 1024
    assert 0 < stats.mfu < 1 and stats.simulated_seconds > 0
    assert stats.memoryx is not None
    declared = sim_artifact_specs(params)
    parameters = sum(spec.size for name, spec in declared.items() if not name.startswith("rotary."))
    assert parameters == parameter_count(params.model)  # the rotary tables are buffers


def sim_artifact_specs(params):
    """The weights a compile of ``params`` declares (shapes only, no data)."""
    artifact = cgc.compile(params, mode="weight_streaming", micro_batch_size=1)
    assert artifact.weights == {}
    return artifact.declared


def _child_step(name: str, systems: int) -> dict:
    """Compile and one timing-only step of a whole built-in model in a fresh process: its
    figures and its peak resident memory."""
    code = (
        "import json, cgc\n"
        f"s = cgc.simulate('zoo:{name}', num_csx={systems}).stats\n"
        # the peak of this process's memory (a child's ru_maxrss keeps its parent's)
        "peak = [line for line in open('/proc/self/status') if line.startswith('VmHWM')]\n"
        "print(json.dumps({'layers': len(s.layers), 'seconds': s.simulated_seconds,"
        " 'rss': int(peak[0].split()[1]) * 1024}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_13b_step_needs_no_weight_memory():
    """Cerebras-GPT 13B (51 GB of float32 weights, 205 GB with gradients and Adam state) is
    compiled and timed in under 768 MiB, about what the interpreter, numpy and xDSL take, and
    less than two of its weight matrices."""
    result = _child_step("cerebras-gpt-13b", 12)
    assert result["layers"] > 40 * 3
    assert result["rss"] < 768 * 2**20


@pytest.mark.slow
def test_gpt3_175b_on_64_systems():
    result = _child_step("gpt3-175b", 64)
    assert result["layers"] > 96 * 3
    assert result["rss"] < 768 * 2**20


PUBLISHED_COUNTS = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "qwen2-72b": 72_706_203_648,
}
"""Hugging Face's count of each model of its config.json (``num_parameters()`` of
transformers' LlamaForCausalLM and Qwen2ForCausalLM)."""


@pytest.mark.parametrize(
    "name",
    [
        "llama-3.1-8b",
        "llama-3.1-70b",
        pytest.param("llama-3.1-405b", marks=pytest.mark.slow),  # 126 blocks: about 5 s
        "qwen2-72b",
    ],
)
def test_a_served_llm_has_its_published_count_and_compiles_whole(name):
    params = load_params(f"zoo:{name}")
    assert parameter_count(params.model) == PUBLISHED_COUNTS[name]
    artifact = cgc.compile(f"zoo:{name}", mode="weight_streaming")
    assert artifact.weights == {}
    declared = artifact.declared
    parameters = sum(spec.size for key, spec in declared.items() if not key.startswith("rotary."))
    assert parameters == PUBLISHED_COUNTS[name]
