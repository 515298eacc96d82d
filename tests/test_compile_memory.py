"""Compiling and timing-only simulation cost memory by the program, not by the data (issue 13).

Each check runs in a child process under an address-space limit a few hundred MB above what
the same work takes at a small batch: a batch-sized array anywhere in the compiler or the
timing-only path (1e8 samples of 64 float32 features are 25.6 GB) breaks the limit. A
pipelined run at 1e6 samples is the largest batch the mlp fits pipelined at; its timeline once
held every sample's times, and a span each (1.2 GB).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cgc.machine.hardware.target import Target, get_target
from cgc.machine.program.bytecode import Route
from cgc.machine.timing.pipeline import SHOWN, Stage, simulate

HEADROOM = 400 << 20
"""Bytes of address space the child may use beyond what a batch of 8 used."""

CHILD = textwrap.dedent(
    """
    import resource, sys
    from cgc.compiler.driver import compile_model
    from cgc.frontends import zoo
    from cgc.runtime.cluster import Cluster
    model = zoo.MODELS["mlp"]()
    limit = int(sys.argv[1])
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    art = compile_model(model, mode=sys.argv[2], batch_size=int(sys.argv[3]))
    Cluster(art, None, numerics=False).infer(None)
    with open("/proc/self/status") as f:
        print(next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmPeak")))
    """
)


def _child(limit: int, mode: str, batch: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(limit), mode, str(batch)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("mode", "batch"),
    # the mlp fits pipelined up to a few million samples; beyond, auto picks weight streaming
    [("auto", 10**8), ("weight_streaming", 10**8), ("pipelined", 10**6)],
)
def test_compile_and_timing_only_run_do_not_grow_with_the_batch(mode: str, batch: int) -> None:
    small = _child(0, mode, 8)
    assert small.returncode == 0, small.stderr
    baseline = int(small.stdout.split()[-1])
    big = _child(baseline + HEADROOM, mode, batch)
    assert big.returncode == 0, big.stderr[-2000:]


def _random_stages(seed: int) -> list[Stage]:
    """Six stages, each fed by up to two earlier ones over routes of random hops and loads."""
    rng = np.random.default_rng(seed)

    def route(source: int) -> Route:
        return Route(source, 0, 1, 100, int(rng.integers(0, 4000)), int(rng.integers(1, 3000)), ())

    return [
        Stage(
            f"s{i}",
            float(rng.integers(100, 3000)),
            0.0,
            tuple(route(int(s)) for s in sorted(set(rng.integers(0, max(i, 1), size=2))) if i),
        )
        for i in range(6)
    ]


def _every_sample(
    stages: list[Stage], service: np.ndarray, samples: int, target: Target
) -> np.ndarray:
    """``[stage, sample]`` finish times over every sample: the module's formula, one cumulative
    maximum per stage."""
    count = np.arange(samples)
    finish = np.zeros((len(stages), samples))
    for i, stage in enumerate(stages):
        ready = np.zeros(samples)
        for r in stage.routes:
            ready = np.maximum(ready, finish[r.source] + target.seconds(r.hops))
        finish[i] = (count + 1) * service[i] + np.maximum.accumulate(ready - count * service[i])
    return finish


@pytest.mark.parametrize("seed", range(4))
def test_a_pipeline_timeline_keeps_its_first_samples_and_its_last_exactly(seed: int) -> None:
    # the timeline computes SHOWN samples, the next and the last, not all of them, and they
    # equal the recurrence over every sample
    target, batch, samples = get_target("mesh8x8"), 3, 5 * SHOWN + 7
    stages = _random_stages(seed)
    service = np.array([s.service_seconds(target, batch) for s in stages])
    finish = _every_sample(stages, service, samples, target)
    start = finish - service[:, None]
    timeline = simulate(stages, target, samples, batch)
    np.testing.assert_allclose(timeline.finish, finish[:, :SHOWN], rtol=1e-12)
    np.testing.assert_allclose(timeline.last_finish, finish[:, -1], rtol=1e-12)
    assert timeline.seconds == pytest.approx(finish.max(), rel=1e-12)
    assert timeline.drain_seconds == pytest.approx(finish.max() - start[:, -1].min(), rel=1e-9)
    # a span per shown sample and one for the rest, which ends as the last sample does
    spans = [s for s in timeline.spans("system 0") if s.track == "system 0: s5"]
    assert [s.name for s in spans[-2:]] == [f"sample {SHOWN - 1}", f"samples {SHOWN}-{samples - 1}"]
    assert (spans[-1].start, spans[-1].end) == pytest.approx((start[5, SHOWN], finish[5, -1]))


def test_a_pipeline_timeline_costs_by_the_stages_not_the_samples() -> None:
    # a trillion samples: the same few columns, and the rate of the slowest stage
    target, batch = get_target("mesh8x8"), 4
    stages = _random_stages(0)
    timeline = simulate(stages, target, 10**12, batch)
    assert timeline.finish.shape == (len(stages), SHOWN)
    assert timeline.seconds == pytest.approx(10**12 * timeline.period_seconds, rel=1e-6)
    assert len(timeline.spans("system 0")) == len(stages) * (SHOWN + 1)
