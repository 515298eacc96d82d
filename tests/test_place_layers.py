"""The placement's shortcuts change what it asks, not what it answers.

The pipelined placement times layers on candidate rectangles with the machine's exact cost
(``cgc.machine.timing.cost``), and most of its compile time is those timings. Its shortcuts skip
timings that cannot change its answer: lower bounds that rule a rectangle out untimed (every PE
at peak, host I/O the same on any rectangle), candidate heights a wider rectangle already
missed, and the layers that failed a width timed first. Each case places a model both ways, the
search with these shortcuts and without, and checks the same rectangles come out of fewer
timings. One more shortcut skips the balanced widths when strips keep the time of the slowest
layer on the whole width (no balance beats that): the strips' search then starts from that time,
lower than it would, and may end elsewhere within its tolerance, which is what its test checks.

The search's last step, strips of different widths, is checked against strips of one width.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
import pytest
from test_placement import MESHES, random_graph

import cgc
from cgc.dialects.lowering import LayerWork
from cgc.frontends import zoo
from cgc.machine.hardware.target import Target
from cgc.machine.movement.layout import Rect
from cgc.machine.timing.pipeline import pipeline_figures
from cgc.passes import place_layers
from cgc.passes.place_layers import strips
from cgc.passes.place_layers.layers import STAGE_TIME_TOLERANCE, spanned_width
from cgc.passes.place_layers.placer import TRIM_SPLITS, Placer
from cgc.passes.place_layers.strips import Strips

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


class Unpruned(Placer):
    """The search without the shortcuts that cannot change its answer: no lower bounds, no
    candidate heights skipped for the times wider rectangles took, the layers timed in program
    order."""

    def fewest_pes(self, index: int, limit: float) -> float:
        return 0.0

    @property
    def timed_first(self) -> list[int]:
        return []

    @timed_first.setter
    def timed_first(self, value: list[int]) -> None:
        pass

    @property
    def times_by_height(self) -> dict[tuple[int, int], dict[int, float]]:
        return {}

    @times_by_height.setter
    def times_by_height(self, value: dict[tuple[int, int], dict[int, float]]) -> None:
        pass


def placed_both_ways(
    model: onnx.ModelProto, target: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Rect], list[Rect], int, int]:
    """Compiles ``model``; the rectangles of the search with and without its shortcuts, and
    the rectangles each timed."""
    found: list[tuple[list[Rect], list[Rect], int, int]] = []

    class Both(Placer):
        def __init__(self, works: Sequence[LayerWork], target: Target, live=None):
            super().__init__(works, target, live)
            self.reference = Unpruned(works, target, live)

        def place(self) -> list[Rect]:
            rects, want = super().place(), self.reference.place()
            found.append((rects, want, len(self.costs.known), len(self.reference.costs.known)))
            return rects

    monkeypatch.setattr(place_layers, "Placer", Both)
    cgc.compile(model, mode="pipelined", target=target, batch_size=4)
    (result,) = found
    return result


def test_shortcuts_place_random_graphs_as_the_full_search(monkeypatch):
    asked, unpruned = 0, 0
    for seed in range(10):
        rows, cols = MESHES[seed % len(MESHES)]
        rects, want, timed, full = placed_both_ways(
            random_graph(seed), f"mesh{rows}x{cols}", monkeypatch
        )
        assert rects == want, seed
        assert timed <= full, seed
        asked, unpruned = asked + timed, unpruned + full
    assert asked < unpruned


@pytest.mark.parametrize(
    ("model", "target"),
    [
        (zoo.cnn, "mesh16x16"),
        (zoo.resnet, "mesh32x32"),
        (zoo.transformer_block, "mesh16x16"),
        (lambda: zoo.decoder(blocks=1, seq=16, width=128, heads=2), "mesh64x48"),
    ],
)
def test_shortcuts_place_models_as_the_full_search(model, target, monkeypatch):
    rects, want, timed, full = placed_both_ways(model(), target, monkeypatch)
    assert rects == want
    assert timed < full


class Balanced(Placer):
    """The search that always runs the balance before the strips."""

    def strips_at_whole_width_time(self) -> None:
        return None


@pytest.mark.parametrize("seed", [*range(0, 60, 6), 43, 58])
def test_skipping_the_balance_stays_within_the_tolerance(seed, monkeypatch):
    # seeds 43 and 58 place differently with and without the balance
    rows, cols = MESHES[seed % len(MESHES)]
    target = f"mesh{rows}x{cols}"
    skipped, _ = slowest_stage(Placer, random_graph(seed), target, monkeypatch, 4)
    balanced, _ = slowest_stage(Balanced, random_graph(seed), target, monkeypatch, 4)
    assert skipped <= balanced * (1 + STAGE_TIME_TOLERANCE)


class OneWidth(Placer):
    """The search without strips of different widths."""

    def mixed_width_strips(self, found: tuple[Strips, float]) -> tuple[Strips, float]:
        return found


def slowest_stage(
    placer: type[Placer],
    model: onnx.ModelProto,
    target: str,
    monkeypatch: pytest.MonkeyPatch,
    batch: int = 1,
) -> tuple[float, set[int]]:
    """Compiles ``model`` with ``placer``; its slowest stage's cycles, and its strips' widths."""
    found: list[tuple[float, set[int]]] = []

    class Timed(placer):  # type: ignore[valid-type, misc]
        def place(self) -> list[Rect]:
            rects = super().place()
            cycles = max(self.stage_cycles(self.cost(i, r)) for i, r in enumerate(rects))
            found.append((cycles, {w for _, _, w, _ in rects}))
            return rects

    monkeypatch.setattr(place_layers, "Placer", Timed)
    cgc.compile(model, mode="pipelined", target=target, batch_size=batch)
    (result,) = found
    return result


@pytest.mark.parametrize("seed", [1, 15, 16, 26])
def test_strips_of_different_widths_beat_one_width_on_random_graphs(seed, monkeypatch):
    # layers that want other widths than their neighbours' (as a decoder's attention and MLP
    # may): strips of different widths, each for its run of layers, make the slowest stage
    # faster than strips of one
    rows, cols = MESHES[seed % len(MESHES)]
    target = f"mesh{rows}x{cols}"
    mixed, widths = slowest_stage(Placer, random_graph(seed), target, monkeypatch, 4)
    one, _ = slowest_stage(OneWidth, random_graph(seed), target, monkeypatch, 4)
    assert mixed * (1 + STAGE_TIME_TOLERANCE) < one
    assert len(widths) > 1


def test_layers_rise_for_their_lanes_where_strips_would_give_up(monkeypatch):
    # ResNet-50's residual tensors skip layers: on its short candidate heights a layer at a
    # strip's end leaves a tensor to the next strip few lanes, and a stage time every layer
    # keeps fails on those lanes unless their ends rise a candidate height
    model = onnx.load(str(LIGHT / "light_resnet50.onnx"))
    rates = {}
    for raises in (0, strips.LANE_RAISES):
        monkeypatch.setattr(strips, "LANE_RAISES", raises)
        artifact = cgc.compile(model, mode="pipelined", target="wse2")
        rates[raises] = pipeline_figures(artifact)["samples_per_second"]
    assert rates[strips.LANE_RAISES] > 1.02 * rates[0]


class Unsettled(Placer):
    """The search without its last step: no layer leaves rows below its lowest candidate height."""

    def trimmed_rows(self, rects: list[Rect]) -> list[Rect]:
        return rects


def placed(placer: type[Placer], model, target: str, monkeypatch, batch: int = 1):
    """Compiles ``model`` with ``placer``: the placer (its search done) and its rectangles."""
    found: list[tuple[Placer, list[Rect]]] = []

    class Recorded(placer):  # type: ignore[valid-type, misc]
        def place(self) -> list[Rect]:
            rects = super().place()
            found.append((self, rects))
            return rects

    monkeypatch.setattr(place_layers, "Placer", Recorded)
    cgc.compile(model, mode="pipelined", target=target, batch_size=batch)
    (result,) = found
    return result


def settling_cases():
    yield "resnet50", onnx.load(str(LIGHT / "light_resnet50.onnx")), "wse2", 1
    for seed in range(4):
        rows, cols = MESHES[seed % len(MESHES)]
        yield f"random {seed}", random_graph(seed), f"mesh{rows}x{cols}", 4


@pytest.mark.parametrize(("label", "model", "target", "batch"), list(settling_cases()))
def test_layers_at_their_ladders_end_leave_the_rows_they_do_not_need(
    label, model, target, batch, monkeypatch
):
    # ResNet-50's stem max pool and first 1x1 convolution sit on their lowest candidate heights
    # far below the stage time: they give up rows, and the stage time stays
    settled, rects = placed(Placer, model, target, monkeypatch, batch)
    unsettled, before = placed(Unsettled, model, target, monkeypatch, batch)
    assert settled.placement_cycles(rects) <= unsettled.placement_cycles(before)
    period = settled.placement_cycles(rects)
    fewer = 0
    for index, ((x, y, w, h), (*_, was)) in enumerate(zip(rects, before, strict=True)):
        assert h <= was
        fewer += h < was
        if was != unsettled.height_choices[index][0]:
            assert h == was
            continue
        finer = {-(-settled.initial_heights[index] // k) for k in range(1, TRIM_SPLITS + 1)}
        below = [r for r in finer if r < h]
        if below:
            rows = max(below)
            trial = [*rects[:index], (x, y, w, rows), *rects[index + 1 :]]
            cost = settled.cost(index, (0, 0, w, rows))
            assert not settled.fits(cost) or settled.placement_cycles(trial) > period
    assert fewer or label != "resnet50"


@pytest.mark.parametrize(
    ("model", "target"),
    [
        (zoo.cnn, "mesh16x16"),
        (zoo.resnet, "mesh32x32"),
        (lambda: zoo.decoder(blocks=1, seq=16, width=128, heads=2), "mesh64x48"),
    ],
)
def test_a_layer_costs_the_same_on_the_columns_its_tensors_split_across(model, target, monkeypatch):
    # a kernel sees a rectangle's width only through how its tensors' columns split across
    # it, so the placement times a layer on the fewest columns that split them alike
    placer, _ = placed(Placer, model(), target, monkeypatch)
    for index in range(placer.count):
        height = placer.heights[index]
        for width in range(1, placer.target.cols + 1):
            rect = (0, 0, width, height)
            spanned = placer.cost(index, rect)
            whole = placer.costs(placer.works[index], 0, rect)
            assert (spanned.cycles, spanned.sram_bytes_per_pe, spanned.host_bytes) == (
                whole.cycles,
                whole.sram_bytes_per_pe,
                whole.host_bytes,
            ), (placer.layer_name(index), width)


def test_layers_hold_no_columns_their_tensors_leave_empty(monkeypatch):
    # 64-column layers on a 160-column mesh: their strips are wider than 64 columns, and each
    # layer keeps 64 of them (the rest would hold nothing), as fast
    model = zoo.mlp(64, (64, 64, 64), 64)
    placer, rects = placed(Placer, model, "mesh8x160", monkeypatch, 4)
    wide, _ = placed(Unnarrowed, model, "mesh8x160", monkeypatch, 4)
    assert max(w for _, _, w, _ in rects) <= 64
    assert any(w > 64 for _, _, w, _ in wide.final)
    assert placer.placement_cycles(rects) <= wide.placement_cycles(wide.final)
    for index, (_, _, width, _) in enumerate(rects):
        assert spanned_width(placer.columns[index], width) == width


class Unnarrowed(Placer):
    """The search whose layers keep their strips' widths."""

    final: list[Rect] = []

    def narrowed_to_their_tiles(self, rects: list[Rect]) -> list[Rect]:
        self.final = rects
        return rects
