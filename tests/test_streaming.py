"""The weight-streaming timeline (cgc.machine.streaming): micro-batches back to back, the
steady state of training steps whose updates overlap the next step, and the shortcut over
runs that repeat."""

from __future__ import annotations

import numpy as np
import pytest

from cgc.machine import streaming
from cgc.machine.streaming import Layer, Tree
from cgc.machine.target import get_target

T = get_target("wse2")


def layers(seed: int, count: int = 6) -> list[Layer]:
    rng = np.random.default_rng(seed)
    return [
        Layer(
            f"l{i}",
            cycles=float(rng.integers(1, 10**6)),
            host_in_bytes=float(rng.integers(0, 10**6)) * (i == 0),
            host_out_bytes=0.0,
            stream_in_bytes=float(rng.integers(0, 10**9)),
            stream_out_bytes=float(rng.integers(0, 10**9)) * (i % 2),
            update_parameters=int(rng.integers(0, 10**8)),
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("runs", [1, 2, 3, 40])
def test_repeating_runs_take_their_period_exactly(seed, training, runs, monkeypatch):
    """The shortcut over runs that repeat gives the time of simulating every run."""
    tree = Tree(4, T)
    fast = streaming.simulate(layers(seed), T, tree, runs, training, "s")
    monkeypatch.setattr(streaming.math, "isclose", lambda *a, **k: False)
    slow = streaming.simulate(layers(seed), T, tree, runs, training, "s")
    assert fast.seconds == pytest.approx(slow.seconds, rel=1e-12)
    for a, b in zip(fast.layers, slow.layers, strict=True):
        assert a.bound == b.bound
        assert (a.begin, a.end) == pytest.approx((b.begin, b.end), rel=1e-12)
    assert len(fast.spans) <= len(slow.spans)


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
