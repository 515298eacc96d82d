"""The training loop: steps of a training artifact on the simulated cluster.

Step ``i`` (0-based) takes the samples ``[i * B, (i + 1) * B)`` modulo the sample count, where
B is the global batch (the per-system batch times K). Every step appends one JSON line to
``metrics.jsonl``; at the end ``weights.safetensors`` holds every initializer, trained or not.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cgc.errors import CgcError
from cgc.runtime.artifact import Artifact, weights_to_bytes
from cgc.runtime.files import write_atomically
from cgc.runtime.vm import Cluster


@dataclass
class TrainResult:
    """What a training run produced."""

    metrics: list[dict] = field(default_factory=list)
    weights: dict[str, np.ndarray] = field(default_factory=dict)


def check_data(artifact: Artifact, data: Mapping[str, np.ndarray]) -> int:
    """Checks that ``data`` holds every model input with one sample count; returns it."""
    specs = artifact.manifest["inputs"]
    missing = [s["name"] for s in specs if s["name"] not in data]
    if missing:
        raise CgcError(
            f"training data lacks {missing}; it needs one array per model input "
            f"({[s['name'] for s in specs]}), first axis = samples"
        )
    counts = {len(data[s["name"]]) for s in specs}
    if len(counts) != 1 or 0 in counts:
        raise CgcError(f"training data arrays have different or zero sample counts: {counts}")
    return counts.pop()


def train(
    artifact: Artifact,
    data: Mapping[str, np.ndarray],
    steps: int,
    model_dir: str | os.PathLike,
    on_step: Callable[[dict], None] | None = None,
) -> TrainResult:
    """Runs ``steps`` training steps and writes the metrics and final weights."""
    training = artifact.manifest.get("training")
    if not training:
        raise CgcError("the artifact was not compiled for training")
    if steps < 1:
        raise CgcError(f"--steps {steps}: must be at least 1")
    samples = check_data(artifact, data)
    names = [spec["name"] for spec in artifact.manifest["inputs"]]
    cluster = Cluster(artifact)
    batch = cluster.batch * cluster.num_csx
    directory = Path(model_dir)
    directory.mkdir(parents=True, exist_ok=True)
    result = TrainResult()
    with open(directory / "metrics.jsonl", "w") as log:
        for step in range(steps):
            index = np.arange(step * batch, (step + 1) * batch) % samples
            loss, stats = cluster.train_step({n: np.asarray(data[n])[index] for n in names})
            line = {
                "step": step + 1,
                "loss": loss,
                "simulated_seconds": stats.simulated_seconds,
                "samples_per_second": stats.samples_per_second,
            }
            log.write(json.dumps(line) + "\n")
            log.flush()
            result.metrics.append(line)
            if on_step is not None:
                on_step(line)
    kept = training["initializers"]
    result.weights = {n: cluster.memoryx.weights[n] for n in kept if n in cluster.memoryx.weights}
    write_atomically(directory / "weights.safetensors", weights_to_bytes(result.weights))
    return result
