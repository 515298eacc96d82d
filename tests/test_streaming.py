"""The weight-streaming timeline (cgc.machine.timing.streaming): micro-batches back to back, the
steady state of training steps whose updates overlap the next step, and the shortcut over
runs that repeat."""

from __future__ import annotations

import numpy as np
import pytest

from cgc.machine.hardware.target import get_target
from cgc.machine.timing import streaming
from cgc.machine.timing.streaming import Layer, Tree

T = get_target("wse2")


STREAMS = {  # bytes each layer streams in and out, relative to a random amount
    "mixed": (1.0, 1.0),
    "gradient-bound": (0.01, 20.0),
    "no gradients": (1.0, 0.0),
    "no streams": (0.0, 0.0),
}


def layers(seed: int, count: int = 6, streams: str = "mixed") -> list[Layer]:
    rng = np.random.default_rng(seed)
    weights, gradients = STREAMS[streams]
    return [
        Layer(
            f"l{i}",
            cycles=float(rng.integers(1, 10**6)),
            host_in_bytes=float(rng.integers(0, 10**6)) * (i == 0),
            host_out_bytes=0.0,
            stream_in_bytes=float(rng.integers(0, 10**9)) * weights,
            stream_out_bytes=float(rng.integers(0, 10**9)) * (i % 2) * gradients,
            update_parameters=int(rng.integers(0, 10**8)),
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("runs", [1, 2, 3, 40])
@pytest.mark.parametrize("streams", sorted(STREAMS))
def test_repeating_runs_take_their_period_exactly(seed, training, runs, streams, monkeypatch):
    """The shortcut over runs that repeat gives the time of simulating every run, and of
    every track: whether the gradients keep up with the wafer or fall further behind it
    every run, and whether a link is used at all."""
    tree = Tree(4, T)
    fast = streaming.simulate(layers(seed, streams=streams), T, tree, runs, training, "s")
    monkeypatch.setattr(streaming.math, "isclose", lambda *a, **k: False)
    slow = streaming.simulate(layers(seed, streams=streams), T, tree, runs, training, "s")
    assert fast.seconds == pytest.approx(slow.seconds, rel=1e-12)
    for a, b in zip(fast.layers, slow.layers, strict=True):
        assert a.bound == b.bound
        assert (a.begin, a.end) == pytest.approx((b.begin, b.end), rel=1e-12)
    assert track_extents(fast) == pytest.approx(track_extents(slow), rel=1e-12)
    if runs == 40:
        assert len(fast.spans) < len(slow.spans) / 4
    else:
        assert len(fast.spans) <= len(slow.spans)


def track_extents(timeline: streaming.StreamingTimeline) -> dict[tuple[str, str], float]:
    """When each track's first span starts and its last ends."""
    extents = {}
    for track in {x.track for x in timeline.spans}:
        on_it = [x for x in timeline.spans if x.track == track]
        extents[track, "start"] = min(x.start for x in on_it)
        extents[track, "end"] = max(x.end for x in on_it)
    return extents


ALTERNATING = [  # an MLP's inference on 8 x 8 PEs: its runs repeat every two runs, not one
    Layer("fc1", 367.0, 2048.0, 0.0, 8320.0, 0.0),
    Layer("fc2", 167.0, 0.0, 0.0, 4224.0, 0.0),
    Layer("fc3", 93.0, 0.0, 320.0, 1320.0, 0.0),
]


@pytest.mark.parametrize("runs", [2, 5, 6, 7, 40, 41])
def test_runs_that_repeat_every_few_runs_take_their_period_exactly(runs, monkeypatch):
    """The shortcut also takes runs that settle into a cycle of two (the runs that do not fill
    a cycle at the end run as they would): the time and the tracks of simulating every run."""
    target = get_target("mesh8x8")
    fast = streaming.simulate(ALTERNATING, target, Tree(1, target), runs, False, "s")
    monkeypatch.setattr(streaming, "_cycle", lambda *a: None)
    slow = streaming.simulate(ALTERNATING, target, Tree(1, target), runs, False, "s")
    assert fast.seconds == pytest.approx(slow.seconds, rel=1e-12)
    assert track_extents(fast) == pytest.approx(track_extents(slow), rel=1e-12)
    if runs >= 40:
        assert len(fast.spans) < len(slow.spans) / 4
        assert any(", as micro-batches " in x.name for x in fast.spans)


def test_a_trillion_runs_that_alternate_cost_a_few():
    target = get_target("mesh8x8")
    timeline = streaming.simulate(ALTERNATING, target, Tree(1, target), 1 << 40, False, "s")
    assert len(timeline.spans) < 100
    assert timeline.seconds >= target.seconds((1 << 40) * sum(x.cycles for x in ALTERNATING))


@pytest.mark.parametrize("streams", sorted(STREAMS))
def test_millions_of_runs_cost_a_few(streams):
    """A batch of millions of sequences, one a run: the runs turn steady within a few."""
    timeline = streaming.simulate(layers(0, streams=streams), T, Tree(16, T), 1 << 24, True, "s")
    assert len(timeline.spans) < 100
    compute = T.seconds((1 << 24) * sum(x.cycles for x in layers(0)))
    assert timeline.seconds >= compute * (1 - 1e-9)


def test_a_step_waits_for_its_weights_to_be_updated():
    """With an optimizer slower than the wafer, MemoryX bounds the step: the next step's
    weights leave only once updated."""
    slow = [Layer(f"l{i}", 1e3, 0, 0, 1e6, 1e6, 10**10) for i in range(3)]
    timeline = streaming.simulate(slow, T, Tree(1, T), 1, True, "s")
    assert timeline.bound == "MemoryX"
    assert timeline.seconds >= 3 * 10**10 / T.memoryx_update_params_per_s
    updates = [x for x in timeline.spans if x.track == "MemoryX"]
    weights = [x for x in timeline.spans if x.track == "MemoryX -> SwarmX"]
    assert [x.name for x in updates] == ["l0 update", "l1 update", "l2 update"]
    for update, stream in zip(updates, weights, strict=True):
        assert stream.start >= update.end


def test_the_stream_limit_names_the_slowest_part_of_the_path():
    import dataclasses

    assert streaming.stream_limit(T) == "weight stream"  # all three equal: the system's I/O
    assert streaming.stream_limit(dataclasses.replace(T, memoryx_bytes_per_s=1e9)) == "MemoryX"
    assert streaming.stream_limit(dataclasses.replace(T, swarmx_link_bytes_per_s=1e9)) == "SwarmX"


@pytest.mark.parametrize(
    ("stream_in", "stream_out", "bound"),
    [(1e9, 1e6, "weight stream"), (1e6, 1e9, "gradient stream")],
)
def test_the_bound_names_the_heavier_stream(stream_in, stream_out, bound):
    heavy = [Layer(f"l{i}", 1e3, 0, 0, stream_in, stream_out) for i in range(3)]
    assert streaming.simulate(heavy, T, Tree(1, T), 2, False, "s").bound == bound
