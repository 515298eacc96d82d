"""SwarmX: the broadcast/reduce tree between MemoryX and the K systems.

Each node has up to ``fanout`` children. Going down, a node copies every wavelet to all its
children (weights reach every system); going up, it sums its children's streams at line rate.
The sum runs in a fixed order (children left to right, level by level), so a result never
depends on timing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cgc.machine.target import Target


def tree_depth(systems: int, fanout: int) -> int:
    """Levels of reduce nodes between MemoryX and ``systems`` leaves."""
    depth, reach = 0, 1
    while reach < systems:
        reach *= fanout
        depth += 1
    return depth


class SwarmX:
    """The tree for one cluster of ``systems`` systems."""

    def __init__(self, systems: int, target: Target):
        self.systems = systems
        self.fanout = target.swarmx_fanout
        self.target = target
        self.depth = tree_depth(systems, self.fanout)

    def link_seconds(self, nbytes: float) -> float:
        """How long ``nbytes`` occupy the path between MemoryX and a system: the stream runs at
        the slowest of MemoryX, the tree links and the system's ingress."""
        t = self.target
        return nbytes / min(t.memoryx_bytes_per_s, t.swarmx_link_bytes_per_s, t.io_bytes_per_s)

    @property
    def latency_seconds(self) -> float:
        """Time of flight through every level of the tree."""
        return (self.depth + 1) * self.target.swarmx_hop_seconds

    def reduce(self, streams: Sequence[np.ndarray]) -> np.ndarray:
        """Sums one gradient stream per system through the tree, in a fixed order."""
        level = list(streams)
        while len(level) > 1:
            level = [_sum(level[i : i + self.fanout]) for i in range(0, len(level), self.fanout)]
        return level[0]


def _sum(group: Sequence[np.ndarray]) -> np.ndarray:
    total = group[0]
    for part in group[1:]:
        total = total + part
    return total
