"""A long training run keeps in memory only what does not grow with its steps (but for the
small metrics dict a step it returns); ``benchmarks/soak_training.py`` measures the RSS."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from conftest import mlp_train_data

import cgc
from cgc.frontends import zoo
from cgc.runtime.trainer import TRACED_STEPS, train


@pytest.fixture(scope="module")
def prepared():
    def loop(steps: int):
        return cgc.prepare_training(
            zoo.MODELS["mlp_train"](), batch_size=8, steps=steps, target="mesh16x16", lr=0.01
        )[:2]

    return loop


def test_a_run_keeps_the_timeline_of_its_first_steps_only(prepared, tmp_path):
    artifact, loop = prepared(TRACED_STEPS + 8)
    data = mlp_train_data(16, seed=0)
    one = train(artifact, data, loop, tmp_path / "a", trace_steps=1).spans
    kept = train(artifact, data, loop, tmp_path / "b").spans
    assert len(kept) == TRACED_STEPS * len(one), "the default: the steps a trace draws"
    assert {s.name.rsplit("(step ", 1)[1] for s in kept} == {
        f"{step})" for step in range(1, TRACED_STEPS + 1)
    }
    assert train(artifact, data, loop, tmp_path / "c", trace_steps=0).spans == []


def test_memory_does_not_grow_with_the_steps(prepared, tmp_path):
    """Traced bytes from step 40 to 140: only the metrics lines (~0.4 KiB a step); keeping
    every step's timeline added ~4 KiB a step."""
    artifact, loop = prepared(140)
    used: dict[int, int] = {}

    def measure(line: dict) -> None:
        if line["step"] in (40, 140):
            gc.collect()
            used[line["step"]] = tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        train(artifact, mlp_train_data(16, seed=0), loop, tmp_path, measure)
    finally:
        tracemalloc.stop()
    per_step = (used[140] - used[40]) / 100
    assert per_step < 1024, f"{per_step:.0f} bytes a step"
