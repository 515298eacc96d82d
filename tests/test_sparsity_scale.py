"""The sparsity sweep (``cgc scale --sparsity``): what must hold by construction, the layers'
reasons, bad levels, and its files."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from cgc.compiler.sources import source_of
from cgc.compiler.training import training_options
from cgc.errors import CgcError
from cgc.machine.hardware.target import get_target
from cgc.tools import sparsity_study
from cgc.tools.scaling import Clusters
from cgc.tools.sparsity_study import CAUSES, SLOW, SparsePoint, densities

MESH = get_target("mesh8x8")
LEVELS = [0.5, 0.9, 0]


def sweep(tiny: Path, levels, systems=(1,)) -> list[SparsePoint]:
    source = source_of(str(tiny), training=True)
    options = training_options(source.params)  # type: ignore[attr-defined]
    clusters = Clusters(tuple(systems), global_batch=8)
    return sparsity_study.sparsity_study(source, MESH, options, levels, clusters)


@pytest.fixture(scope="module")
def points(tiny) -> list[SparsePoint]:
    return sweep(tiny, LEVELS)


def test_levels_are_fractions_of_zeros_in_the_order_given(points):
    assert [p.sparsity for p in points] == LEVELS
    assert [p.density for p in points] == [0.5, pytest.approx(0.1), 1.0]


def test_the_dense_point_is_the_baseline(points):
    dense = points[-1]
    assert dense.speedup == 1.0
    assert all(g.speedup == 1.0 and not g.reason for g in dense.layers)
    for p in points:
        assert p.speedup == pytest.approx(dense.step_seconds / p.step_seconds)


def test_the_dense_point_is_simulated_when_not_listed(tiny, points):
    alone = sweep(tiny, [0.9])
    assert alone[0].speedup == points[1].speedup
    assert alone[0].step_seconds == points[1].step_seconds


def test_fewer_live_values_stream_fewer_bytes_and_do_fewer_flops(points):
    half, tenth, dense = points
    assert dense.stream_in_bytes > half.stream_in_bytes > tenth.stream_in_bytes
    assert dense.stream_out_bytes > half.stream_out_bytes > tenth.stream_out_bytes
    assert dense.model_flops > half.model_flops > tenth.model_flops
    assert dense.memoryx_update_seconds > half.memoryx_update_seconds
    assert half.memoryx_update_seconds > tenth.memoryx_update_seconds
    assert tenth.speedup > half.speedup > 1.0


def test_every_layer_is_beside_its_dense_self(points):
    dense = {g.name: g for g in points[-1].layers}
    for p in points:
        assert [g.name for g in p.layers] == list(dense)
        for g in p.layers:
            assert g.dense_seconds == dense[g.name].seconds
            assert g.speedup == pytest.approx(g.dense_seconds / g.seconds)
            assert g.stream_in_bytes <= g.dense_stream_in_bytes


def test_slow_layers_say_why_from_their_numbers(points):
    tenth = points[1]
    for g in tenth.layers:
        assert bool(g.reason) == (g.speedup < SLOW), g.name
        assert (g.cause in CAUSES) if g.reason else g.cause == ""
    by_name = {g.name: g for g in tenth.layers}
    # the attention scores have no weight; the output projection's stay dense by default
    assert by_name["h.*.attn.attention"].cause == "no weights"
    assert by_name["h.*.attn.attention.grad"].cause == "no weights"
    assert by_name["lm_head"].cause == "dense weights"
    # a sparse weight's layer either gains or names what is left of it
    sparse = [g for g in tenth.layers if g.stream_in_bytes < g.dense_stream_in_bytes]
    assert sparse
    assert all(g.cause not in ("no weights", "dense weights") for g in sparse)


def test_several_systems_compare_with_the_dense_step_on_as_many(tiny):
    points = sweep(tiny, [0.75], systems=(1, 2))
    assert [p.systems for p in points] == [1, 2]
    assert all(p.speedup > 1.0 for p in points)


@pytest.mark.parametrize(
    ("levels", "message"),
    [
        ([1.0], r"--sparsity 1: 1 is not a level in \[0, 1\)"),
        ([-0.1, 0.5], "--sparsity -0.1,0.5: -0.1 is not a level"),
        ([float("nan")], "--sparsity nan: nan is not a level"),
        ([0.5, 0.5], "--sparsity 0.5,0.5: 0.5 is given twice"),
        ([], "--sparsity: give at least one level"),
        ([i / 100 for i in range(17)], "--sparsity: 17 levels, more than a sweep of 16"),
    ],
)
def test_bad_levels_name_the_option(levels, message):
    with pytest.raises(CgcError, match=message) as caught:
        densities(levels)
    assert "\n" not in str(caught.value)


def test_the_tables_and_files(points, tmp_path):
    text = sparsity_study.table_text(points, MESH)
    assert "speed-up" in text and "h.*.attn.attention" in text
    assert "no weights" in text and "at 90%, of the layers' time" in text
    assert text.endswith("\n") and "assumed (not published)" in text
    data = sparsity_study.to_json(points, MESH, "tiny")
    again = json.loads(json.dumps(data))
    assert [p["sparsity"] for p in again["points"]] == LEVELS
    assert again["points"][1]["layers"][0]["name"] == points[1].layers[0].name
    rows = list(csv.DictReader(io.StringIO(sparsity_study.to_csv(points))))
    assert [float(r["sparsity"]) for r in rows] == LEVELS and "layers" not in rows[0]
    png = tmp_path / "sweep.png"
    sparsity_study.save_png(points, png, "tiny")
    first = png.read_bytes()
    assert first.startswith(b"\x89PNG")
    sparsity_study.save_png(points, png, "tiny")
    assert png.read_bytes() == first  # the same sweep draws the same file
