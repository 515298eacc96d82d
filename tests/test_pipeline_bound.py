"""Where a pipelined artifact's compute bound goes (``cgc.machine.timing.pipeline_bound``): all PEs
times the period adds up by term to one, its model FLOPs are the throughput over the bound,
each stage's part is its area's share of the mesh, a slow stage shows as waiting, and
``cgc inspect`` says it in text and JSON."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import cgc
from cgc.cli import main
from cgc.frontends import zoo
from cgc.machine.hardware.target import resolve
from cgc.machine.timing.pipeline import pipeline_figures, pipeline_stages
from cgc.machine.timing.pipeline_bound import TERMS, StageTime, artifact_bound, decompose

BATCH = 4


@pytest.fixture(scope="module")
def placed():
    """The example MLP pipelined on a 16 x 16 mesh (three stages, some PEs left over)."""
    return cgc.compile(zoo.MODELS["mlp"](), mode="pipelined", target="mesh16x16", batch_size=BATCH)


@pytest.fixture(scope="module")
def bound(placed):
    found = artifact_bound(placed, pipeline_stages(placed))
    assert found is not None
    return found


def test_the_shares_add_up_to_one_and_each_stage_is_its_areas_share(placed, bound):
    assert sum(bound.shares.values()) == pytest.approx(1.0, abs=1e-9)
    assert set(bound.shares) <= {key for key, _ in TERMS}
    # the SUMMA matmuls' broadcasts are named apart from the other kernels' movement, of
    # which there is none: the biases and activations run in the matmuls' epilogues
    assert bound.shares["collectives"] > 0 and "data_movement" not in bound.shares
    target = resolve("mesh16x16")
    areas = [w * h for _, _, w, h in (layer["rect"] for layer in placed.manifest["layers"])]
    assert bound.pes == target.pes and bound.placed_pes == sum(areas) < target.pes
    assert bound.shares["idle"] == pytest.approx(1 - sum(areas) / target.pes, abs=1e-12)
    for stage, area in zip(bound.stages, areas, strict=True):
        # a stage holds its area for the whole period, however that splits
        assert sum(stage.shares.values()) == pytest.approx(area / target.pes, abs=1e-12)
        assert stage.loss == pytest.approx(area / target.pes - stage.shares["model_flops"])
        assert all(share >= 0 for share in stage.shares.values()), stage


def test_the_useful_share_is_the_throughput_over_the_compute_bound(placed, bound):
    figures = pipeline_figures(placed)
    ratio = figures["samples_per_second"] / figures["bound_samples_per_second"]
    assert 0 < ratio < 1
    assert bound.useful == pytest.approx(ratio, rel=1e-9)
    assert bound.period_seconds == pytest.approx(1 / figures["samples_per_second"], rel=1e-12)


def test_a_stages_arithmetic_is_its_compute_cycles(placed, bound):
    """Model FLOPs and padding together are the layer's own compute cycles, over its
    area, per sample, as shares of all PEs times the period."""
    target = resolve("mesh16x16")
    whole = target.pes * bound.period_seconds
    for stage, layer in zip(bound.stages, placed.manifest["layers"], strict=True):
        arithmetic = stage.shares["model_flops"] + stage.shares.get("arithmetic", 0.0)
        seconds = target.seconds(layer["compute_cycles"]) / BATCH
        assert arithmetic * whole == pytest.approx(stage.area * seconds, rel=1e-9)
    # the slowest stage waits for nothing; the others wait for it
    slowest = max(bound.stages, key=lambda s: s.service_seconds)
    assert "waiting" not in slowest.shares
    assert all(s.shares["waiting"] > 0 for s in bound.stages if s is not slowest)


def test_one_slow_stage_shows_as_imbalance():
    """Three stages of 10 PEs each on 32: two take 1 us a sample, one 10 us."""
    fast = {"arithmetic": 0.5e-6, "collectives": 0.5e-6}
    slow = {"arithmetic": 5e-6, "collectives": 5e-6}
    peak = 1e9  # FLOP/s per PE: 1e-6 s of one PE per 1000 FLOPs
    stages = [
        StageTime("a", 10, 2000.0, fast),
        StageTime("b", 10, 20000.0, slow),
        StageTime("c", 10, 2000.0, fast),
    ]
    found = decompose(stages, 32, peak)
    assert found.period_seconds == pytest.approx(10e-6)
    whole = 32 * 10e-6
    assert found.shares["waiting"] == pytest.approx(2 * 10 * 9e-6 / whole)
    assert found.shares["idle"] == pytest.approx(2 * 10e-6 / whole)
    assert found.useful == pytest.approx(24000 / peak / whole)
    assert found.shares["waiting"] == max(found.shares.values())
    assert sum(found.shares.values()) == pytest.approx(1.0, abs=1e-9)
    assert [s.name for s in found.worst(2)] == ["a", "c"]
    assert {s.bound for s in found.worst(2)} == {"waiting"}
    assert found.stages[1].bound == "collectives"
    # balanced (b as fast as the others), nothing waits
    even = decompose([stages[0], StageTime("b", 10, 2000.0, fast), stages[2]], 32, peak)
    assert "waiting" not in even.shares and even.useful == pytest.approx(3 * found.useful / 1.2)


def test_inspect_says_where_the_bound_goes(placed, tmp_path):
    path = tmp_path / "mlp.cgc"
    placed.save(path)
    text = CliRunner().invoke(main, ["inspect", str(path)])
    assert text.exit_code == 0, text.output
    block = text.output.split("where the compute bound goes")[1].splitlines()[1:]
    (pes,) = [line for line in text.output.splitlines() if line.startswith("PEs: ")]
    placed_share, busy_share = (float(word[:-1]) for word in pes.split() if word.endswith("%"))
    assert 0 < busy_share <= placed_share <= 100
    assert block[0].split()[:4] == ["model", "FLOPs", "at", "peak"]
    assert sum(line.strip().startswith("loses ") for line in block) == 3
    data = json.loads(CliRunner().invoke(main, ["inspect", str(path), "--json"]).output)
    bound = data["compute_bound"]
    assert set(bound) >= {"ideal_seconds", "period_seconds", "pes", "placed_pes", "useful"}
    assert sum(bound["shares"].values()) == pytest.approx(1.0, abs=1e-9)
    assert [s["name"] for s in bound["stages"]] == ["fc1", "fc2", "fc3"]
    for stage in bound["stages"]:
        assert set(stage) == {"name", "area", "service_seconds", "loss", "bound", "shares"}
        assert stage["bound"] in stage["shares"]
    assert bound["useful"] * bound["period_seconds"] == pytest.approx(bound["ideal_seconds"])
