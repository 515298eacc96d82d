"""Model FLOPs utilization of a weight-streaming step (``cgc.machine.timing.utilization``):
per layer it is the layer's FLOPs over its time at the cluster's peak, its time adds up by
term, the binding term of the streaming matmul follows its shapes, and the report and its JSON
say it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import cgc
from cgc.cli import main
from cgc.machine.hardware.target import resolve
from cgc.machine.movement.layout import Layout
from cgc.machine.plans import plan
from cgc.machine.plans.kernel import STREAM, Operand
from cgc.machine.program.bytecode import RECOMPUTED_SUFFIX
from cgc.machine.timing.utilization import KernelPlan, kernel_bound, step_utilization
from cgc.tools.report import simulation_text


@pytest.fixture(scope="module")
def trained(tiny):
    """The tiny GPT's training artifact on an 8 x 8 mesh, and one simulated step of it."""
    artifact = cgc.prepare_training(str(tiny), num_csx=2, micro_batch_size=2, target="mesh8x8")[0]
    return artifact, cgc.simulate(artifact)


def test_a_layers_mfu_is_its_flops_over_its_time_at_the_targets_peak(trained):
    artifact, sim = trained
    stats, target = sim.stats, resolve("mesh8x8")
    step = step_utilization(stats, artifact.program, sim.target, every_layer=True)
    assert step is not None
    # the peak from the target's own figures: PEs x FLOPs per PE per cycle x clock x systems
    dtype = artifact.program.compute_dtype
    peak = target.pes * target.peak_flops_per_pe_per_cycle(dtype) * target.clock_hz
    runs = stats.per_system_batch // stats.micro_batch
    chunks = stats.batch_size // stats.micro_batch
    assert runs == 2 and chunks == 4
    by_name = {u.name: u for u in step.layers}
    assert len(by_name) == len(stats.layers)
    for layer in stats.layers:
        u = by_name[layer["name"]]
        longest = max(
            layer["compute_seconds"],
            layer["weight_stream_seconds"],
            layer["gradient_stream_seconds"],
        )
        seconds = runs * longest + layer["memoryx_update_seconds"]
        flops = 0.0 if layer["name"].endswith(RECOMPUTED_SUFFIX) else chunks * layer["flops"]
        assert u.seconds == pytest.approx(seconds)
        assert u.flops == pytest.approx(flops)
        assert u.mfu == pytest.approx(flops / (seconds * 2 * peak))
        assert u.share == pytest.approx(seconds / stats.simulated_seconds)
        assert sum(u.terms.values()) == pytest.approx(seconds)
        assert u.terms.get("model_flops", 0.0) == pytest.approx(
            runs * layer["flops"] / peak if flops else 0.0
        )
    assert any(u.mfu > 0 for u in step.layers)


def test_the_steps_time_adds_up_by_term_and_its_model_flops_are_its_mfu(trained):
    artifact, sim = trained
    step = step_utilization(sim.stats, artifact.program, sim.target)
    assert step is not None
    assert sum(step.shares.values()) == pytest.approx(1.0)
    assert step.shares["model_flops"] == pytest.approx(sim.stats.mfu) == pytest.approx(step.mfu)
    assert step.shares["memoryx_update"] > 0  # a training step ends with MemoryX's update
    # repeated blocks are grouped, their FLOPs and time added up
    grouped = {u.name: u for u in step.layers}
    assert "h.*.mlp.fc_in" in grouped and grouped["h.*.mlp.fc_in"].count == 2


def _matmul(m: int, k: int, n: int) -> KernelPlan:
    """The weight-streaming matmul of an ``[m, k]`` activation by a streamed ``[k, n]``
    float16 weight on the whole of an 8 x 8 mesh."""
    target = resolve("mesh8x8")
    # the activations already where the kernel takes them: 8 x 8 tiles
    a = Operand((m, k), "float16", layout=Layout((m, k), "float16", 0, 0, 8, 8))
    b = Operand((k, n), "float16", STREAM)
    planned = plan("matmul", target, target.whole, [a, b], {}, [((m, n), "float16")])
    assert planned.detail["algorithm"] == "stream"
    return KernelPlan("matmul", planned)


def test_the_streaming_matmuls_binding_term_follows_its_shapes():
    # many activation rows per PE row: each weight row arriving feeds much arithmetic
    assert kernel_bound(_matmul(1024, 512, 512)) == "arithmetic"
    # one activation row per PE row: a PE multiplies each weight value once, faster than the
    # edge brings the column's weight rows in
    assert kernel_bound(_matmul(8, 512, 512)) == "weights through the edge"
    # one weight row per PE column: each PE's partial sums take longer along the row chain
    # than its few products take to form
    assert kernel_bound(_matmul(1024, 8, 512)) == "partial sums"
    # the kernel's own account of its cycles names the same causes
    binds = [_matmul(*shape).detail["binds"] for shape in MATMUL_SHAPES]
    assert binds == [
        "arithmetic",
        "the weights through the ramp",
        "the partial sums along the rows",
    ]


MATMUL_SHAPES = ((1024, 512, 512), (8, 512, 512), (1024, 8, 512))


def _reported_utilization(result, stats) -> dict:
    """The ``utilization`` a timing-only command printed and wrote to ``stats``, checked: its
    table shown, its MFU the run's, its shares adding up to one."""
    assert result.exit_code == 0, result.output
    assert "step MFU" in result.output and "share     MFU  bound" in result.output
    report = json.loads(stats.read_text())
    use = report["utilization"]
    assert use["mfu"] == pytest.approx(report["mfu"])
    assert sum(use["shares"].values()) == pytest.approx(1.0)
    return use


def test_a_starved_weight_stream_binds_and_the_json_says_so(tiny, tmp_path):
    artifact = cgc.prepare_training(str(tiny), num_csx=1, target="mesh8x8")[0]
    path, stats = tmp_path / "tiny.cgc", tmp_path / "stats.json"
    artifact.save(path)
    runner = CliRunner()
    args = ["run", str(path), "--timing-only", "--stats-json", str(stats)]
    use = _reported_utilization(runner.invoke(main, args), stats)
    for layer in use["layers"]:
        assert {"name", "count", "flops", "seconds", "share", "mfu", "bound", "terms"} <= set(layer)
    slow = runner.invoke(main, [*args, "--set", "memoryx_bytes_per_s=1e6"])
    assert slow.exit_code == 0, slow.output
    starved = json.loads(stats.read_text())["utilization"]
    bounds = {x["name"]: x["bound"] for x in starved["layers"]}
    assert bounds["h.*.mlp.fc_in"] == "weight stream"
    assert max(starved["shares"], key=starved["shares"].__getitem__) == "weight_stream"


def test_without_the_program_the_wafers_time_is_its_arithmetic(trained):
    _, sim = trained
    step = step_utilization(sim.stats)
    assert step is not None and step.stream_limit == ""
    assert not {"partial_sums", "weights_edge", "data_movement"} & set(step.shares)
    assert "step MFU" in simulation_text(sim)


def test_a_timing_only_training_reports_its_mfu_as_a_timing_only_run_does(tiny, tmp_path):
    stats = tmp_path / "stats.json"
    args = ["train", str(tiny), "--timing-only", "--steps", "2", "--target", "mesh8x8"]
    use = _reported_utilization(
        CliRunner().invoke(main, [*args, "--stats-json", str(stats)]), stats
    )
    # the program was passed: its kernels name the wafer's terms beyond its arithmetic
    assert {"partial_sums", "weights_edge", "data_movement"} & set(use["shares"])
    assert "h.*.mlp.fc_in" in {layer["name"] for layer in use["layers"]}
