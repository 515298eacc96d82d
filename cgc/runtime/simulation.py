"""Timing-only simulation: steps of an artifact on K systems, on shapes alone.

Nothing in a run's timing depends on the values it computes, so a timing-only simulation runs
the program once on shapes (``Cluster(numerics=False)``) and needs neither inputs nor weight
data: it gives exactly the time a run with numbers would take. Every step of a training run
costs the same, so N steps are N copies of one on the timeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cgc.errors import OptionError
from cgc.machine.hardware.target import ASSUMED, Target
from cgc.machine.program.artifact import Artifact
from cgc.machine.timing.streaming import Span
from cgc.runtime.cluster import Cluster, RunStats


@dataclass(frozen=True)
class Simulation:
    """``steps`` steps (training) or batches (inference) of an artifact, timed."""

    stats: RunStats
    """One step (or one global batch)."""
    steps: int
    training: bool
    target: Target
    """The target simulated (the artifact's, with any figures changed)."""

    @property
    def seconds(self) -> float:
        """All the steps, one after another."""
        return self.steps * self.stats.simulated_seconds

    @property
    def assumed(self) -> dict[str, float]:
        """The unpublished figures of the target and their values in this simulation."""
        figures = self.target.to_json()
        return {name: figures[name] for name in ASSUMED}

    def spans(self, steps: int | None = None) -> list[Span]:
        """The timeline of the first ``steps`` steps (default: all), one after another."""
        step = self.stats.simulated_seconds
        shown = self.steps if steps is None else min(steps, self.steps)
        if self.steps == 1:
            return list(self.stats.spans)
        return [
            Span(s.track, f"{s.name} (step {k + 1})", s.start + k * step, s.end + k * step)
            for k in range(shown)
            for s in self.stats.spans
        ]

    def to_json(self) -> dict[str, Any]:
        """The statistics of one step, and the whole run's figures."""
        return {
            **self.stats.to_json(),
            "timing_only": True,
            "training": self.training,
            "steps": self.steps,
            "total_simulated_seconds": self.seconds,
            "assumed": self.assumed,
        }


MAX_STEPS = 1_000_000
"""Most steps a timing-only run simulates: about the longest published training (Llama 3's
15T tokens at 16M a step), and a ``timing.jsonl`` of 100 MiB."""


def check_steps(steps: int) -> None:
    """An OptionError naming ``steps`` unless a timing-only run can simulate that many."""
    if steps < 1:
        raise OptionError(f"steps {steps}: must be at least 1", "steps")
    if steps > MAX_STEPS:
        raise OptionError(
            f"steps {steps}: a timing-only run simulates at most {MAX_STEPS:,}", "steps"
        )


def simulate(artifact: Artifact, num_csx: int | None = None, steps: int = 1) -> Simulation:
    """``steps`` training steps of a training artifact (else batches of one global batch each)
    on ``num_csx`` systems (default: as compiled), timing only."""
    check_steps(steps)
    cluster = Cluster(artifact, num_csx, numerics=False)
    training = bool(artifact.manifest.get("training"))
    stats = cluster.train_step()[1] if training else cluster.infer()[1]
    return Simulation(stats, steps, training, cluster.target)
