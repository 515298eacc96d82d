"""Unstructured weight sparsity: which weights are sparse, their masks, and how they change.

A ``Sparsity`` says the density of the sparse weights (the fraction of their values that
live), which weights are sparse (regular expressions matched in full against weight names;
by default every trained matrix but the embeddings, as the published recipes keep
embeddings, norms and biases dense), how the live values are picked at the start (``random``:
a uniform draw of exactly ``round(density * size)`` positions; ``magnitude``: the largest
initial values) and the seed. A mask depends only on the seed, the weight's name and shape
(and for ``magnitude`` its initial values): the same run gets the same masks.

MemoryX keeps a sparse weight's dead values at zero: the gradients it receives are masked
before the optimizer runs and the weight after, which is what a PyTorch loop that applies
the mask to the gradients and the weights at every step computes. It keeps the gradients
and the optimizer state of a sparse weight over its live positions only.

Dynamic sparsity (``schedule="dynamic"``) moves the live positions during training, as RigL
(Evci et al. 2020, ``regrow="gradient"``) or SET (Mocanu et al. 2018, ``regrow="random"``).
The rule, exactly:

- Step ``t`` (1-based: the ``t``-th optimizer update) updates the masks when
  ``t % update_every == 0`` and, with an ``end_step``, ``t < end_step``. The step's normal
  optimizer update happens first, on the old masks (as SET's reference implementation and
  the PyTorch RigL port do; RigL's paper skips it, which would waste every
  ``update_every``-th batch and leave the optimizer's step count behind the loop's); the
  mask update follows it.
- Each sparse weight with ``n`` live values drops ``k = floor(f(t) * n)`` of them, where
  ``f(t)`` is ``drop_fraction`` (``decay="constant"``) or RigL's cosine decay
  ``drop_fraction / 2 * (1 + cos(pi * t / end_step))`` (``decay="cosine"``, which needs
  ``end_step``). The dropped ones are the ``k`` live values of least magnitude after the
  step's update; ties go to the lower row-major position (a stable sort).
- As many positions regrow, among those not live after the drop (as RigL's reference: a
  value just dropped may regrow), the ``k`` of largest score; ties go to the lower position.
  RigL's score is the magnitude of the step's dense gradient: the gradient MemoryX received
  (summed over the systems and micro-batches) before the mask and before clipping (clipping
  scales every gradient by one factor, which would not reorder them but by rounding). SET's
  score is a uniform draw from ``(seed, crc32(weight name), t)`` (``numpy.random.default_rng``,
  ``random(size)``, one value per position in row-major order).
- A regrown value that was dead starts at 0, with zero optimizer state (SGD's momentum,
  Adam's moments and AMSGrad's maximum; torch keeps one step count per tensor, which stays).
  A value dropped and regrown in the same update keeps its value and state (RigL's default,
  ``reinit_when_same=False``). A dropped value is 0 from then on.

So the live count of every sparse weight stays ``live_count(size, density)`` exactly, and
the masks depend only on the seed, the weights and the data: the same run gets the same
masks. A checkpoint saves them; a resumed run continues with them.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cgc.errors import CgcError, OptionError

DETECTED = "detected"
"""The ``init`` of the masks ``--detect-sparsity`` found: a weight's zeros are its dead
values."""
CHOSEN_INITS = ("random", "magnitude")
"""How the live values of a mask are picked, by a user's choice."""
INITS = (*CHOSEN_INITS, DETECTED)
"""How the live values of a mask are picked, or were found."""
SCHEDULES = ("static", "dynamic")
"""Whether the masks stay or move during training."""
REGROWS = ("gradient", "random")
"""How a dynamic mask picks the positions that regrow: RigL's or SET's."""
DECAYS = ("constant", "cosine")
"""How the fraction a dynamic mask drops changes over the steps."""
DYNAMIC = ("update_every", "drop_fraction", "regrow", "decay", "end_step")
"""The settings of dynamic sparsity, as the record and, ``sparsity_`` first, the options
(``cgc.options.SparsityOptions``) name them."""


def _option(setting: str) -> str:
    """The option (``cgc.options.SparsityOptions``' field) of a sparsity setting."""
    return "sparsity_" + setting


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
    schedule: str = "static"
    """``static``: the masks stay; ``dynamic``: they move by the module's rule."""
    update_every: int = 100
    """Dynamic: the steps between mask updates."""
    drop_fraction: float = 0.3
    """Dynamic: the fraction of the live values an update drops (at the start, with a
    cosine ``decay``), in (0, 1)."""
    regrow: str = "gradient"
    """Dynamic: ``gradient`` (RigL) or ``random`` (SET)."""
    decay: str = "constant"
    """Dynamic: ``constant`` drop fraction, or ``cosine`` decay to 0 at ``end_step``."""
    end_step: int | None = None
    """Dynamic: the masks stop moving at this step (None: never)."""

    def __post_init__(self) -> None:
        if not 0 < self.density <= 1:
            raise CgcError(f"sparsity density {self.density:g}: must be in (0, 1]")
        for option, value, choices in (
            ("sparsity_init", self.init, INITS),
            ("sparsity_schedule", self.schedule, SCHEDULES),
            ("sparsity_regrow", self.regrow, REGROWS),
            ("sparsity_decay", self.decay, DECAYS),
        ):
            if value not in choices:
                raise OptionError(f"{option} {value}: expected one of {', '.join(choices)}", option)
        if self.seed < 0:
            raise OptionError(f"seed {self.seed}: must be >= 0", "seed")
        if isinstance(self.update_every, bool) or self.update_every < 1:
            raise OptionError(
                f"sparsity_update_every {self.update_every}: must be at least 1",
                "sparsity_update_every",
            )
        if not 0 < self.drop_fraction < 1:
            raise OptionError(
                f"sparsity_drop_fraction {self.drop_fraction:g}: must be in (0, 1)",
                "sparsity_drop_fraction",
            )
        if self.end_step is not None and self.end_step < 1:
            raise OptionError(
                f"sparsity_end_step {self.end_step}: must be at least 1", "sparsity_end_step"
            )
        if self.decay == "cosine" and self.end_step is None:
            raise OptionError(
                "sparsity_decay cosine needs sparsity_end_step",
                "sparsity_decay",
                "sparsity_end_step",
            )
        for pattern in self.patterns:
            try:
                re.compile(pattern)
            except re.error as e:
                message = f"sparse_params {pattern!r}: not a regular expression: {e}"
                raise OptionError(message, "sparse_params") from None

    @classmethod
    def of(
        cls,
        level: float | None,
        patterns: Sequence[str] = (),
        init: str = "random",
        seed: int = 0,
        schedule: str | None = None,
        **dynamic: Any,
    ) -> Sparsity | None:
        """The sparsity that options given by name choose (``cgc train``'s, the API's): the
        ``level`` is the fraction of zeros (``sparsity=0.75``: a quarter of the values
        live; 0: all, which is the dense path), ``dynamic`` holds the ``DYNAMIC`` settings,
        None for "not given". None without a ``level``; a setting given without what it
        needs is a CgcError naming it."""
        unknown = sorted(set(dynamic) - set(DYNAMIC))
        if unknown:
            raise OptionError(f"{_option(unknown[0])}: not a sparsity setting", _option(unknown[0]))
        given = {k: v for k, v in dynamic.items() if v is not None}
        if level is None:
            named = [_option(k) for k in given] + ["sparse_params"] * bool(patterns)
            named += ["sparsity_schedule"] * (schedule is not None)
            if named:
                raise OptionError(f"{named[0]} needs sparsity", named[0], "sparsity")
            return None
        if given and (schedule or "static") == "static":
            first = _option(next(iter(given)))
            raise OptionError(
                f"{first} needs sparsity_schedule dynamic", first, "sparsity_schedule"
            )
        if isinstance(level, bool) or not 0 <= level < 1:
            raise OptionError(
                f"sparsity {level:g}: the fraction of zeros must be in [0, 1)", "sparsity"
            )
        if init not in CHOSEN_INITS:
            raise OptionError(
                f"sparsity_init {init}: expected one of {', '.join(CHOSEN_INITS)}",
                "sparsity_init",
            )
        density = 1.0 - level
        return cls(density, tuple(patterns), init, seed, schedule or "static", **given)

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Sparsity:
        """The settings of an artifact's record (``to_json``; the patterns are not kept)."""
        dynamic = {k: record[k] for k in DYNAMIC if k in record}
        return cls(record["density"], (), record["init"], record["seed"],
                   record.get("schedule", "static"), **dynamic)  # fmt: skip

    @property
    def dynamic(self) -> bool:
        """Whether the masks move during training."""
        return self.schedule == "dynamic"

    def chosen(
        self, candidates: Sequence[str], shapes: Mapping[str, Sequence[int]], dense: set[str]
    ) -> list[str]:
        """The weights among ``candidates`` this sparsity makes sparse: those the patterns
        match, or by default every matrix (rank 2 or more) not in ``dense`` (embeddings,
        position tables: what a matmul does not multiply)."""
        if self.patterns:
            compiled = [re.compile(p) for p in self.patterns]
            return [n for n in candidates if any(p.fullmatch(n) for p in compiled)]
        return [n for n in candidates if len(shapes[n]) >= 2 and n not in dense]

    def to_json(self, weights: Sequence[str]) -> dict[str, Any]:
        """The record an artifact keeps: the settings and the sparse weights (a static
        sparsity's as before dynamic sparsity was recorded)."""
        record: dict[str, Any] = {"density": self.density, "init": self.init,
                                  "seed": self.seed, "weights": list(weights)}  # fmt: skip
        if self.dynamic:
            record["schedule"] = self.schedule
            record.update({k: getattr(self, k) for k in DYNAMIC})
        return record

    def describe(self) -> str:
        """The settings as one line (a checkpoint's record; a static sparsity's as before
        dynamic sparsity was recorded): ``density 0.25 random seed 3`` and for a dynamic one
        ``dynamic gradient every 100 drop 0.3 constant`` and any ``end 1000``."""
        text = f"density {self.density:g} {self.init} seed {self.seed}"
        if self.dynamic:
            text += (f" dynamic {self.regrow} every {self.update_every} drop "
                     f"{self.drop_fraction:g} {self.decay}")  # fmt: skip
            text += f" end {self.end_step}" if self.end_step is not None else ""
        return text

    # -- the dynamic rule ----------------------------------------------------------------

    def updates_at(self, step: int) -> bool:
        """Whether the masks move after the optimizer update of step ``step`` (1-based)."""
        return (
            self.dynamic
            and step % self.update_every == 0
            and (self.end_step is None or step < self.end_step)
        )

    def drop_fraction_at(self, step: int) -> float:
        """The fraction of the live values an update at step ``step`` drops."""
        if self.decay == "cosine" and self.end_step is not None:
            return self.drop_fraction / 2 * (1 + math.cos(math.pi * step / self.end_step))
        return self.drop_fraction

    def drop_count(self, live: int, step: int) -> int:
        """The values an update at step ``step`` drops of a weight with ``live`` of them."""
        return math.floor(self.drop_fraction_at(step) * live)

    def moved(
        self,
        name: str,
        weight: np.ndarray,
        live: np.ndarray,
        gradient: np.ndarray | None,
        step: int,
    ) -> np.ndarray:
        """The live positions (flat, ascending) of sparse weight ``name`` after the mask
        update at step ``step``: ``live`` (flat, ascending) less the values of ``weight`` it
        drops plus the positions it regrows (by the magnitude of the dense ``gradient``, which
        ``regrow="gradient"`` needs, or by the draw of ``(seed, name, step)``)."""
        count = self.drop_count(live.size, step)
        if count == 0:
            return live
        flat = weight.reshape(-1)
        kept = live[np.argsort(np.abs(flat[live]), kind="stable")[count:]]
        if self.regrow == "gradient":
            if gradient is None:
                raise ValueError(f"regrowing {name} by its gradient needs the dense gradient")
            score = np.abs(gradient.reshape(-1))
        else:
            rng = np.random.default_rng([self.seed, zlib.crc32(name.encode()), step])
            score = rng.random(flat.size)
        dead = np.ones(flat.size, dtype=bool)
        dead[kept] = False
        candidates = np.flatnonzero(dead)
        # the largest scores first, ties to the lower position: a stable sort of the negation
        grown = candidates[np.argsort(-score[candidates], kind="stable")[:count]]
        return np.sort(np.concatenate([kept, grown]))


def live_count(size: int, density: float) -> int:
    """The live values of a sparse weight of ``size`` values: at least one."""
    return max(1, round(density * size))


def mask(name: str, initial: np.ndarray, density: float, init: str, seed: int) -> np.ndarray:
    """The boolean mask of weight ``name`` (of ``initial``'s shape): ``live_count`` values
    live, drawn from ``(seed, name)`` or, for ``magnitude``, the largest ``|initial|`` (ties
    to the first in row-major order); ``detected``: the nonzero values."""
    if init == DETECTED:
        return np.asarray(initial != 0)
    size = initial.size
    live = live_count(size, density)
    if init == "magnitude":
        order = np.argsort(-np.abs(initial.astype(np.float64)).ravel(), kind="stable")
    else:
        order = np.random.default_rng([seed, zlib.crc32(name.encode())]).permutation(size)
    flat = np.zeros(size, dtype=bool)
    flat[order[:live]] = True
    return flat.reshape(initial.shape)


def masks(record: Mapping[str, Any], weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The masks of an artifact's sparsity ``record`` (``Sparsity.to_json``), from the
    weights' initial values."""
    return {
        name: mask(name, weights[name], record["density"], record["init"], record["seed"])
        for name in record["weights"]
    }


def live_bytes(live: Mapping[str, int], specs: Mapping[str, Any]) -> dict[str, int]:
    """The bytes of the ``live`` values of each sparse weight, ``specs`` giving each
    weight's ``size`` and ``nbytes``: what its gradient and each tensor of its optimizer
    state take in MemoryX."""
    return {
        name: count * (specs[name].nbytes // max(1, specs[name].size))
        for name, count in live.items()
    }
