"""Unstructured weight sparsity: which weights are sparse, and their masks.

A ``Sparsity`` says the density of the sparse weights (the fraction of their values that
live), which weights are sparse (regular expressions matched in full against weight names;
by default every trained matrix but the embeddings, as the published recipes keep
embeddings, norms and biases dense), how the live values are picked at the start (``random``:
a uniform draw of exactly ``round(density * size)`` positions; ``magnitude``: the largest
initial values) and the seed. A mask depends only on the seed, the weight's name and shape
(and for ``magnitude`` its initial values): the same run gets the same masks, and a resumed
one finds them again without storing them.

MemoryX keeps a sparse weight's dead values at zero: the gradients it receives are masked
before the optimizer runs and the weight after, which is what a PyTorch loop that applies
the mask to the gradients and the weights at every step computes.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cgc.errors import CgcError

INITS = ("random", "magnitude")
"""How the live values of a mask are picked."""


@dataclass(frozen=True)
class Sparsity:
    """The sparsity of a training run's weights."""

    density: float
    """The fraction of a sparse weight's values that live, in (0, 1]."""
    patterns: tuple[str, ...] = ()
    """Regular expressions matched in full against weight names; none: every trained
    matrix that is not an embedding."""
    init: str = "random"
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.density <= 1:
            raise CgcError(f"--sparsity {self.density:g}: the density must be in (0, 1]")
        if self.init not in INITS:
            raise CgcError(f"--sparsity-init {self.init}: expected one of {', '.join(INITS)}")
        if self.seed < 0:
            raise CgcError(f"--seed {self.seed}: must be >= 0")
        for pattern in self.patterns:
            try:
                re.compile(pattern)
            except re.error as e:
                message = f"--sparse-params {pattern!r}: not a regular expression: {e}"
                raise CgcError(message) from None

    def chosen(
        self, trained: Sequence[str], shapes: Mapping[str, Sequence[int]], embeddings: set[str]
    ) -> list[str]:
        """The trained weights this sparsity makes sparse: those the patterns match, or by
        default every matrix (rank 2 or more) that is not an embedding."""
        if self.patterns:
            compiled = [re.compile(p) for p in self.patterns]
            return [n for n in trained if any(p.fullmatch(n) for p in compiled)]
        return [n for n in trained if len(shapes[n]) >= 2 and n not in embeddings]

    def to_json(self, weights: Sequence[str]) -> dict[str, Any]:
        """The record an artifact keeps: the settings and the sparse weights."""
        return {"density": self.density, "init": self.init, "seed": self.seed,
                "weights": list(weights)}  # fmt: skip


def live_count(size: int, density: float) -> int:
    """The live values of a sparse weight of ``size`` values: at least one."""
    return max(1, round(density * size))


def mask(name: str, initial: np.ndarray, density: float, init: str, seed: int) -> np.ndarray:
    """The boolean mask of weight ``name`` (of ``initial``'s shape): ``live_count`` values
    live, drawn from ``(seed, name)`` or, for ``magnitude``, the largest ``|initial|`` (ties
    to the first in row-major order)."""
    size = initial.size
    live = live_count(size, density)
    if init == "magnitude":
        order = np.argsort(-np.abs(initial.astype(np.float64)).ravel(), kind="stable")
    else:
        order = np.random.default_rng([seed, zlib.crc32(name.encode())]).permutation(size)
    flat = np.zeros(size, dtype=bool)
    flat[order[:live]] = True
    return flat.reshape(initial.shape)


def masked(values: np.ndarray, live: np.ndarray) -> np.ndarray:
    """``values`` with the dead ones (``live`` false) set to 0, in their own type."""
    return np.where(live, values, 0).astype(values.dtype, copy=False)


def masks(record: Mapping[str, Any], weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The masks of an artifact's sparsity ``record`` (``Sparsity.to_json``), from the
    weights' initial values."""
    return {
        name: mask(name, weights[name], record["density"], record["init"], record["seed"])
        for name in record["weights"]
    }
