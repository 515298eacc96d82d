"""SwarmX: the broadcast/reduce tree between MemoryX and the K systems.

Each node has up to ``fanout`` children. Going down, a node copies every wavelet to all its
children (weights reach every system); going up, it sums its children's streams at line rate.
The sum runs in a fixed order (children left to right, level by level), so a result never
depends on timing, nor on where the nodes run: a cluster of Ray actors walks the same tree
(``combine``) with nodes that sum on the actors, and gets the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from cgc.machine.timing.streaming import Tree

Stream = TypeVar("Stream")


class SwarmX(Tree):
    """The tree for one cluster of ``systems`` systems, and its sums."""

    def reduce(self, streams: Sequence[np.ndarray]) -> np.ndarray:
        """Sums one gradient stream per system through the tree, in a fixed order."""
        return self.combine(streams, add)

    def combine(
        self, streams: Sequence[Stream], node: Callable[[Sequence[Stream]], Stream]
    ) -> Stream:
        """One stream per system through the tree: ``node`` makes each node's stream of its
        children's, level by level, left to right."""
        level = list(streams)
        while len(level) > 1:
            level = [node(level[i : i + self.fanout]) for i in range(0, len(level), self.fanout)]
        return level[0]


def add(group: Sequence[np.ndarray]) -> np.ndarray:
    """What a node sends up: its children's streams summed left to right."""
    total = group[0]
    for part in group[1:]:
        total = total + part
    return total
