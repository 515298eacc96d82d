"""Timing-only simulation: steps of an artifact on K systems, on shapes alone.

Nothing in a run's timing depends on the values it computes, so a timing-only simulation runs
the program once on shapes (``Cluster(numerics=False)``) and needs neither inputs nor weight
data: it gives exactly the time a run with numbers would take. Every step of a training run
costs the same, so N steps are N copies of one on the timeline (``Simulation``, of the
floor's ``cgc.machine.timing.run_stats``).
"""

from __future__ import annotations

from cgc.errors import OptionError
from cgc.machine.program.artifact import Artifact
from cgc.machine.timing.run_stats import Simulation
from cgc.runtime.cluster import Cluster

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
