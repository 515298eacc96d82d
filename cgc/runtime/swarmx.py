"""SwarmX: the broadcast/reduce tree between MemoryX and the K systems.

Each node has up to ``fanout`` children. Going down, a node copies every wavelet to all its
children (weights reach every system); going up, it sums its children's streams at line rate.
The sum runs in a fixed order (children left to right, level by level), so a result never
depends on timing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cgc.machine.streaming import Tree


class SwarmX(Tree):
    """The tree for one cluster of ``systems`` systems, and its sums."""

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
