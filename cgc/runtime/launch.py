"""Opening the cluster an executor asks for (``cgc.runtime.executors``): the systems one after
another in this process (``cgc.runtime.cluster``), or with numbers as Ray actors
(``cgc.runtime.ray_cluster``), with the same numbers and the same timing.

This module stands above both clusters, so that neither imports the other's module back.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cgc.machine.program.artifact import Artifact
from cgc.machine.timing.run_stats import RunStats
from cgc.runtime.cluster import Cluster
from cgc.runtime.executors import LOCAL, Backend, connect


def open_cluster(
    artifact: Artifact,
    num_csx: int | None = None,
    numerics: bool = True,
    backend: Backend | None = None,
) -> Cluster:
    """A cluster running ``artifact`` where ``backend`` says: in this process, or with numbers
    on Ray, its systems and MemoryX actors (``cgc.runtime.ray_cluster``). A timing-only run
    stays here: it is one run of the program on shapes, whatever K."""
    backend = backend or Backend()
    if backend.executor == LOCAL or not numerics:
        return Cluster(artifact, num_csx, numerics)
    connect(backend.address)  # without Ray: the one-line error naming the extra
    from cgc.runtime.ray_cluster import RayCluster

    return RayCluster(artifact, num_csx, backend)


def run(
    artifact: Artifact,
    inputs: Mapping[str, np.ndarray],
    num_csx: int | None = None,
    backend: Backend | None = None,
) -> tuple[dict[str, np.ndarray], RunStats]:
    """Runs an artifact on the simulator; returns ``(outputs, stats)``."""
    with open_cluster(artifact, num_csx, backend=backend) as cluster:
        return cluster.infer(inputs)
