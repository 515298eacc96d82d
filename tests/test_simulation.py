"""Timing-only simulation: the same time as a run with numbers, without inputs or weight data;
weights declared by shape; params-file models end to end on the command line; --set."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import token_batch

import cgc
from cgc.cli import main
from cgc.frontends import zoo
from cgc.runtime.cluster import Cluster
from cgc.tools.report import summary_text


def invoke(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


# --------------------------------------------------------------------------- the same time


@pytest.mark.parametrize(("micro_batch", "systems"), [(4, 2), (2, 2), (1, 1)])
def test_timing_only_training_step_equals_the_numeric_one(tiny, micro_batch, systems):
    """Whatever the systems and micro-batches, a step without numbers takes exactly the time,
    SRAM and layer costs of the step with them."""
    artifact = cgc.prepare_training(
        str(tiny),
        num_csx=systems,
        micro_batch_size=micro_batch,
        target="mesh8x8",
        init_seed=0,
    )[0]
    plan = artifact.manifest["memory_plan"]
    assert plan["micro_batch"] == micro_batch
    assert plan["micro_batches"] == 8 // systems // micro_batch
    loss, numeric = Cluster(artifact).train_step(token_batch(8))
    assert np.isfinite(loss)
    _, timed = Cluster(artifact, numerics=False).train_step()
    assert timed.simulated_seconds == numeric.simulated_seconds > 0
    assert timed.layers == numeric.layers
    assert timed.peak_pe_sram_bytes == numeric.peak_pe_sram_bytes
    assert timed.model_flops == numeric.model_flops
    assert timed.spans == numeric.spans
    simulated = cgc.simulate(artifact)
    assert simulated.stats.simulated_seconds == numeric.simulated_seconds
    assert simulated.to_json()["steps"] == 1


def test_micro_batches_run_back_to_back_and_update_once(tiny):
    artifact = cgc.prepare_training(str(tiny), num_csx=1, micro_batch_size=2, target="mesh8x8")[0]
    stats = cgc.simulate(artifact).stats
    assert (stats.per_system_batch, stats.micro_batches, stats.micro_batch) == (8, 4, 2)
    assert "per-system batch 8 as 4 runs of 2" in summary_text(artifact)
    systems = [s for s in stats.spans if s.track == "system 0"]
    # the layer table and the trace share one clock
    assert stats.layers[0]["end_seconds"] == pytest.approx(systems[0].end)
    # runs 1 and 2 are drawn in full; 3 and 4 repeat run 2 a period apart, drawn as one span
    explicit = {s.name.rsplit(" (", 1)[-1] for s in systems if s.name.endswith(")")}
    assert explicit == {"micro-batch 1)", "micro-batch 2)"}
    summary = [s for s in systems if not s.name.endswith(")")]
    assert [s.name for s in summary] == ["micro-batches 3-4, each as micro-batch 2"]
    assert summary[0].end == pytest.approx(max(s.end for s in stats.spans if s.track == "system 0"))
    # one update per step: each trained layer's weights once, whatever the micro-batches
    updates = [s.name for s in stats.spans if s.track == "MemoryX"]
    assert len(updates) == len(set(updates)) == 13  # the embedding, two blocks of six layers
    # four runs of the program take about four times one
    single = cgc.simulate(
        cgc.prepare_training(str(tiny), num_csx=4, micro_batch_size=2, target="mesh8x8")[0]
    ).stats
    assert 3 < stats.simulated_seconds / single.simulated_seconds <= 4.0001


def test_simulated_steps_are_copies_on_the_timeline(tiny):
    artifact = cgc.prepare_training(str(tiny), target="mesh8x8")[0]
    sim = cgc.simulate(artifact, steps=3)
    assert sim.seconds == pytest.approx(3 * sim.stats.simulated_seconds)
    spans = sim.spans()
    assert len(spans) == 3 * len(sim.stats.spans)
    # steps overlap a little: the last gradients of one drain as the next step starts
    assert 0 <= max(s.end for s in spans) - sim.seconds < sim.stats.simulated_seconds
    with pytest.raises(cgc.CgcError, match=r"^steps 0"):
        cgc.simulate(artifact, steps=0)


def test_figures_of_a_step(tiny):
    stats = cgc.simulate(cgc.prepare_training(str(tiny), target="mesh8x8")[0]).stats
    assert stats.tokens_per_second == pytest.approx(16 * stats.samples_per_second)
    assert 0 < stats.mfu <= 1
    assert stats.bound in ("compute", "weight stream", "gradient stream", "SwarmX", "MemoryX")
    mx = stats.memoryx
    assert mx is not None and mx.optimizer_state == 2 * mx.gradients > 0  # AdamW: two moments
    assert mx.total < stats.memoryx_capacity_bytes
    timed = [layer for layer in stats.layers if "compute_seconds" in layer]
    assert len(timed) == len(stats.layers) > 0
    assert {layer["bound"] for layer in timed} <= {"compute", "weight stream", "gradient stream"}


def test_pe_utilization_is_against_the_peak_of_the_programs_type(tiny, tmp_path):
    """All FLOPs over the model's FLOPs: the same in float32 and in bfloat16, whose peak is
    the 16-bit SIMD rate."""
    half = tmp_path / "half.yaml"
    half.write_text(tiny.read_text().replace("precision: float32", "precision: bfloat16"))
    ratios = []
    for params in (tiny, half):
        stats = cgc.simulate(cgc.prepare_training(str(params), target="mesh8x8")[0]).stats
        assert 0 < stats.mfu <= stats.pe_utilization <= 1
        ratios.append(stats.pe_utilization / stats.mfu)
    assert ratios[0] == pytest.approx(ratios[1])


# --------------------------------------------------------------------------- declared weights


def test_a_params_model_declares_its_weights_and_runs_timing_only(tiny, tmp_path):
    artifact = cgc.compile(str(tiny), mode="weight_streaming", target="mesh8x8")
    assert artifact.weights == {}
    declared = artifact.declared
    assert "wte.weight" in declared and declared["wte.weight"].shape == (50, 32)
    assert {spec.dtype for spec in declared.values()} <= {"float32"}
    path = tmp_path / "tiny.cgc"
    artifact.save(path)
    again = cgc.load(path)
    assert again.declared == declared
    with pytest.raises(cgc.CgcError, match="--timing-only"):
        cgc.run(again, {"input_ids": token_batch(4)["input_ids"]})
    stats = cgc.simulate(again, num_csx=2).stats
    assert stats.batch_size == 8 and stats.num_csx == 2


def test_a_declared_model_of_a_billion_parameters_is_a_small_file(tmp_path):
    artifact = cgc.compile("zoo:cerebras-gpt-1.3b", mode="weight_streaming", batch_size=16,
                           num_csx=16, micro_batch_size=1)  # fmt: skip
    path = tmp_path / "big.cgc"
    artifact.save(path)
    parameters = sum(spec.size for spec in artifact.declared.values())
    assert parameters > 1.3e9
    assert path.stat().st_size < 5 * 2**20  # the weights would take 5 GB


def test_onnx_without_its_weights(tmp_path):
    """A model whose external data is absent compiles with --no-weights and runs timing only."""
    model = zoo.mlp()
    path = tmp_path / "mlp.onnx"
    onnx.save(zoo.mlp(), path, save_as_external_data=True, location="mlp.bin", size_threshold=0)
    (tmp_path / "mlp.bin").unlink()
    with pytest.raises(cgc.CgcError, match="--no-weights"):
        cgc.compile(path, mode="weight_streaming", target="mesh8x8", batch_size=4)
    artifact = cgc.compile(
        path, mode="weight_streaming", target="mesh8x8", batch_size=4, no_weights=True
    )
    assert artifact.weights == {}
    assert artifact.declared["fc1.weight"].shape == (32, 64)
    full = cgc.compile(model, mode="weight_streaming", target="mesh8x8", batch_size=4)
    declared_run = cgc.simulate(artifact).stats
    numeric = cgc.run_with_stats(full, zoo.sample_inputs(model, 4))[1]
    assert declared_run.simulated_seconds == numeric.simulated_seconds


# --------------------------------------------------------------------------- command line


def test_cli_train_timing_only(tiny, tmp_path):
    stats, trace, run = tmp_path / "s.json", tmp_path / "t.json", tmp_path / "run"
    result = invoke("train", tiny, "--timing-only", "--steps", 3, "--target", "mesh8x8",
                    "--stats-json", stats, "--trace", trace, "--model-dir", run)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "3 training steps of 8 samples on 2 x mesh8x8" in result.output
    assert "MFU" in result.output and "tokens/s" in result.output
    assert "h.*.attn.q_proj" in result.output  # the blocks' layers added up
    assert "assumed (not published): clock_hz" in result.output
    data = json.loads(stats.read_text())
    assert data["timing_only"] and data["steps"] == 3 and data["num_csx"] == 2
    assert data["total_simulated_seconds"] == pytest.approx(3 * data["simulated_seconds"])
    lines = [json.loads(line) for line in (run / "timing.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert "loss" not in lines[0]
    assert not (run / "metrics.jsonl").exists()  # a training's, never a timing's
    names = {e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"}
    assert "h.0.attn.q_proj update (step 3)" in names


def test_cli_train_timing_only_traces_the_first_steps(tiny, tmp_path):
    trace = tmp_path / "t.json"
    result = invoke("train", tiny, "--timing-only", "--steps", 10**6, "--target", "mesh8x8",
                    "--trace", trace)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "trace: the first 16 of 1000000 steps" in result.output
    names = {e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"}
    assert "h.0.attn.q_proj update (step 16)" in names
    assert "h.0.attn.q_proj update (step 17)" not in names


def test_cli_train_timing_only_steps_have_a_limit(tiny, tmp_path):
    # refused before compiling; a million steps write a million lines without holding them
    result = invoke("train", tiny, "--timing-only", "--steps", 10**6 + 1)
    assert result.exit_code == 2
    assert result.output == (
        "error: --steps 1000001: a timing-only run simulates at most 1,000,000\n"
    )
    result = invoke("train", tiny, "--timing-only", "--steps", 10**6, "--target", "mesh8x8",
                    "--model-dir", tmp_path)  # fmt: skip
    assert result.exit_code == 0, result.output
    with (tmp_path / "timing.jsonl").open() as lines:
        for step, line in enumerate(lines, 1):
            assert line.startswith(f'{{"step": {step}, "simulated_seconds": ')
    assert step == 10**6
    assert json.loads(line)["mfu"] > 0


def test_a_batch_of_a_trillion_samples_is_timed_in_seconds(tiny):
    # every micro-batch of a timing-only step is one run, counted, never listed
    result = invoke("train", tiny, "--timing-only", "--steps", 1, "--target", "mesh8x8",
                    "--batch-size", 2**40)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "1 training step of 1099511627776 samples on 2 x mesh8x8" in result.output
    assert "micro-batches: 34359738368 of 16 per system" in result.output


@pytest.mark.parametrize(
    "option",
    [
        ["--data", "d.npz"],
        ["--eval-data", "e.npz"],
        ["--eval-every", "2"],
        ["--checkpoint-every", "1"],
        ["--resume"],
        ["--shuffle"],
    ],
)
def test_cli_train_timing_only_refuses_the_options_of_a_training(tiny, option):
    result = invoke("train", tiny, "--timing-only", "--steps", 1, *option)
    assert result.exit_code == 2
    assert result.output == f"error: --timing-only trains nothing: it takes no {option[0]}\n"


def test_cli_run_timing_only_needs_no_inputs(tiny, tmp_path):
    art = tmp_path / "tiny.cgc"
    result = invoke("compile", tiny, "-o", art, "--target", "mesh8x8", "--mode", "weight_streaming")
    assert result.exit_code == 0, result.output
    result = invoke("run", art, "--timing-only", "--num-csx", 4, "--stats-json", tmp_path / "s")
    assert result.exit_code == 0, result.output
    assert "1 batch of 16 samples on 4 x mesh8x8" in result.output
    result = invoke("run", art)
    assert result.exit_code == 2 and "--inputs is required" in result.output
    result = invoke("run", art, "--inputs", tmp_path / "none.npz")
    assert result.exit_code == 2


def test_set_changes_figures_and_names_bad_ones(tiny, tmp_path):
    art = tmp_path / "tiny.cgc"
    result = invoke("compile", tiny, "-o", art, "--target", "mesh8x8", "--mode",
                    "weight_streaming", "--set", "memoryx_bytes_per_s=3e9")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert cgc.load(art).manifest["target"]["memoryx_bytes_per_s"] == 3e9
    slow, fast = tmp_path / "slow.json", tmp_path / "fast.json"
    result = invoke("run", art, "--timing-only", "--set", "clock_hz=4.25e8", "--stats-json", slow)
    assert result.exit_code == 0, result.output
    assert "clock_hz = 4.25e+08" in result.output
    assert invoke("run", art, "--timing-only", "--stats-json", fast).exit_code == 0
    half, full = json.loads(slow.read_text()), json.loads(fast.read_text())
    # the program's kernels take the same cycles, which now last twice as long
    assert [x["cycles"] for x in half["layers"]] == [x["cycles"] for x in full["layers"]]
    assert half["layers"][1]["compute_seconds"] == pytest.approx(
        2 * full["layers"][1]["compute_seconds"]
    )
    assert half["simulated_seconds"] > full["simulated_seconds"]
    for args, message in [
        (("--set", "rows=4"), "--set rows=4: the compiled program depends on it"),
        (("--set", "clock=1"), "--set clock=1: expected FIGURE=VALUE"),
        (("--set", "clock_hz=fast"), "'fast' is not a number"),
        (("--set", "clock_hz=-1"), "clock_hz must be positive"),
    ]:
        result = invoke("run", art, "--timing-only", *args)
        assert result.exit_code == 2, result.output
        assert message in result.output


def test_a_pipelined_run_reports_no_memoryx(tmp_path):
    """Its weights stay on the wafer: neither MemoryX's bytes nor its and SwarmX's assumed
    figures belong in its report; a weight-streaming run keeps them."""
    zoo.save(zoo.MODELS["mlp"](), tmp_path / "mlp.onnx")
    reports = {}
    for mode in ("pipelined", "weight_streaming"):
        out = tmp_path / f"{mode}.cgc"
        compiled = invoke("compile", tmp_path / "mlp.onnx", "-o", out, "--mode", mode,
                          "--batch-size", 8, "--target", "mesh16x16")  # fmt: skip
        assert compiled.exit_code == 0, compiled.output
        reports[mode] = invoke("run", out, "--timing-only").output
    assert "MemoryX" not in reports["pipelined"]
    assert reports["pipelined"].splitlines()[-1] == "assumed (not published): clock_hz = 8.5e+08"
    assert "MemoryX: " in reports["weight_streaming"]
    assert "memoryx_bytes_per_s" in reports["weight_streaming"].splitlines()[-1]
