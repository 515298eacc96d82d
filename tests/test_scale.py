"""The scaling study (``cgc scale``): its table's invariants, its files and its errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import cgc
from cgc.cli import main
from cgc.compiler.sources import source_of
from cgc.compiler.training import training_options
from cgc.machine.hardware.target import get_target
from cgc.tools import scaling

MESH = get_target("mesh8x8")


def study(tiny: Path, systems, **batch) -> list[scaling.ScalingPoint]:
    source = source_of(str(tiny), training=True)
    options = training_options(source.params)  # type: ignore[attr-defined]
    return scaling.study(source, MESH, options, scaling.Clusters(tuple(systems), **batch))


@pytest.fixture(scope="module")
def strong(tiny) -> list[scaling.ScalingPoint]:
    return study(tiny, [1, 2, 4, 8], global_batch=8)


def test_one_system_is_a_single_system_run(tiny, strong):
    one = strong[0]
    artifact = cgc.prepare_training(str(tiny), batch_size=8, num_csx=1, target=MESH)[0]
    alone = cgc.simulate(artifact).stats
    assert one.systems == 1 and one.step_seconds == alone.simulated_seconds
    assert one.samples_per_second == alone.samples_per_second
    assert (one.speedup, one.efficiency) == (1.0, 1.0)


def test_every_size_is_its_own_run(tiny, strong):
    four = strong[2]
    artifact = cgc.prepare_training(str(tiny), batch_size=8, num_csx=4, target=MESH)[0]
    assert four.step_seconds == cgc.simulate(artifact).stats.simulated_seconds
    assert four.per_system_batch == 2 and four.global_batch == 8


def test_efficiency_and_the_ideal_line(strong):
    one = strong[0]
    for point in strong:
        assert 0 < point.efficiency <= 1 + 1e-12
        assert point.speedup == pytest.approx(point.samples_per_second / one.samples_per_second)
        ideal = point.systems * one.samples_per_second
        assert point.ideal_samples_per_second == pytest.approx(ideal)
        assert point.samples_per_second <= point.ideal_samples_per_second * (1 + 1e-12)
    # more systems never make a step of the same global batch slower here
    seconds = [p.step_seconds for p in strong]
    assert seconds == sorted(seconds, reverse=True)


def test_weak_scaling_keeps_the_per_system_batch(tiny):
    points = study(tiny, [2, 4], per_system_batch=2)
    assert [p.global_batch for p in points] == [4, 8]
    assert all(p.per_system_batch == 2 for p in points)
    assert points[0].speedup > 1  # against one system of the same per-system batch


def test_batches_split_evenly_or_not_at_all():
    assert scaling.per_system_batches([1, 2, 4], None, 8) == [8, 4, 2]
    assert scaling.per_system_batches([1, 3], 5, None) == [5, 5]
    for args, message in [
        (([1, 3], None, 8), "does not split evenly over 3 systems"),
        (([1, 2], 4, 8), "give one of"),
        (([0, 2], None, 8), "every size must be >= 1"),
        (([1, 2, 4, 2], None, 8), "^--num-csx 1,2,4,2: 2 is given twice$"),
        ((list(range(1, 66)), 1, None), "^--num-csx: 65 sizes, more than a sweep of 64$"),
        (([1, 8192], 1, None), "^num_csx must be at most 4096, got 8192$"),
        (([1], 0, None), "--per-system-batch 0"),
    ]:
        with pytest.raises(cgc.CgcError, match=message):
            scaling.per_system_batches(*args)


def test_cli_writes_the_table_as_json_csv_and_png(tiny, tmp_path):
    paths = {kind: tmp_path / f"scale.{kind}" for kind in ("json", "csv", "png")}
    result = CliRunner().invoke(
        main,
        [
            "scale", str(tiny), "--num-csx", "1,2,4", "--target", "mesh8x8",
            "--json", str(paths["json"]), "--csv", str(paths["csv"]), "--png", str(paths["png"]),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:3] == ["systems", "step", "(s)"]
    assert [line.split()[0] for line in lines[1:4]] == ["1", "2", "4"]
    assert "assumed (not published)" in lines[-2] or "assumed (not published)" in lines[-1]
    data = json.loads(paths["json"].read_text())
    assert [p["systems"] for p in data["points"]] == [1, 2, 4]
    assert data["model"] == "tiny.yaml" and "memoryx_bytes_per_s" in data["assumed"]
    rows = list(csv.DictReader(paths["csv"].read_text().splitlines()))
    assert [int(r["systems"]) for r in rows] == [1, 2, 4]
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_models_batch_leaves_out_the_sizes_it_does_not_split_over(tiny):
    result = CliRunner().invoke(
        main, ["scale", str(tiny), "--target", "mesh8x8", "--num-csx", "1,3,2"]
    )
    assert result.exit_code == 0, result.output
    assert "batch of 8 does not split evenly over 3 systems: left out" in result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()[1:3]] == ["1", "2"]


def test_cli_names_bad_options(tiny, tmp_path):
    runner = CliRunner()
    for args, message in [
        (["--num-csx", "1,two"], "--num-csx 1,two: expected sizes"),
        (["--num-csx", "1,3", "--global-batch", "8"], "--global-batch 8 does not split evenly"),
        (["--num-csx", "3,5"], "the model's batch of 8 splits evenly over none of these sizes"),
        (["--set", "swarmx_fanout=1"], "swarmx_fanout"),
        (["--png", str(tmp_path / "no" / "x.png")], "does not exist"),
    ]:
        result = runner.invoke(main, ["scale", str(tiny), "--target", "mesh8x8", *args])
        assert result.exit_code == 2, result.output
        assert message in result.output
