"""MemoryX: the cluster's weight store and optimizer.

Weights and optimizer state live here, never on the wafer. For each layer MemoryX streams the
weights out (as the view a kernel asks for, in the element type the wafer computes with: the
master copies of a mixed-precision model stay 32-bit here), takes the gradients SwarmX has
summed, adding up those of a step's micro-batches, folds in the batch statistics of buffers
such as batch norm's running averages, and at the end of a step applies the optimizer
(``optimizers``: SGD, Adam, AdamW with torch.optim's arithmetic), after an optional
clipping of the gradients' global norm.

A sparse weight (``cgc.machine.sparse.sparsity``) keeps its dead values at 0, and MemoryX keeps its
gradient and optimizer state over its live positions only: vectors indexed by ``live``, the
flat positions of the live values, so that they take memory in proportion to the live count.
Every optimizer's arithmetic is elementwise, so the update of the live values is the dense
update of the masked gradient at those positions, bit for bit (the global norm of the
gradients may differ in the last bit: it sums the squares without the dead zeros). A dynamic
sparsity moves the masks after the update of the steps its rule says.

A MemoryX of an artifact whose weights are declared without data knows their shapes only: it
serves timing-only runs, which never ask it for numbers.

MemoryX holds the arrays it is given themselves, read-only, and never changes a weight in place
(an update, a fold or a mask replaces it): what runs make from an artifact's weight (the weight
laid out on the wafer, a filter's rows reordered) is right for as long as MemoryX holds that
array, and an artifact keeps it for its later runs (``Derived``), each of which opens a cluster
and a MemoryX of its own. To change an artifact's weight, assign it a new array.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import numpy as np

from cgc.errors import CgcError
from cgc.machine import reference
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import Target
from cgc.machine.program.artifact import WeightSpec
from cgc.machine.sparse.sparsity import Sparsity, live_bytes, live_count
from cgc.machine.training import optimizers


class NonFiniteError(CgcError):
    """A training step whose loss or gradients are not finite: the run stops there, its
    weights those of the step before, rather than train every weight into NaN. (Its one
    argument is its message, so that it crosses from a Ray actor as it is.)"""

    @classmethod
    def at(cls, step: int, found: str) -> NonFiniteError:
        """The error of step ``step`` (1-based), which ``found`` says what was not finite."""
        kept = f"the weights of step {step - 1}" if step > 1 else "the initial weights"
        return cls(
            f"step {step}: {found}; stopped with {kept} (a lower learning rate or "
            "max_grad_norm may help; allow_nonfinite trains on)",
            "max_grad_norm",
            "allow_nonfinite",
        )


T = TypeVar("T")


class Derived:
    """What runs made from an artifact's weights, kept for its later runs: by key, the value
    and the weight array it was made from (``MemoryX.kept``)."""

    def __init__(self) -> None:
        self.values: dict[Hashable, tuple[np.ndarray, Any]] = {}

    @classmethod
    def of(cls, owner: object) -> Derived:
        """The values kept for ``owner`` (an artifact), for as long as it lives."""
        key = id(owner)
        if key not in _DERIVED:
            _DERIVED[key] = cls()
            weakref.finalize(owner, _DERIVED.pop, key, None)
        return _DERIVED[key]


_DERIVED: dict[int, Derived] = {}
"""The values kept, by the id of their artifact."""


def _read_only(value: np.ndarray) -> np.ndarray:
    """``value`` as an array no one writes to any more: itself, made read-only, or a copy if
    it is a writable view of memory someone else may write (a slice of another array, a
    tensor's ``numpy()``), whose changes no flag of this one would stop."""
    array = np.asarray(value)
    if array.base is not None and array.flags.writeable:
        array = array.copy()
    array.flags.writeable = False
    return array


def _kind(values: np.ndarray | float) -> str:
    """``nan`` if ``values`` hold a NaN, else ``inf``."""
    return "nan" if np.isnan(values).any() else "inf"


class MemoryX:
    """Weights, gradients of the current step, and optimizer state."""

    def __init__(
        self,
        weights: Mapping[str, np.ndarray],
        target: Target,
        specs: Mapping[str, WeightSpec] | None = None,
        derived: Derived | None = None,
    ):
        self.weights = {name: _read_only(value) for name, value in weights.items()}
        self.given = dict(self.weights)
        """The weights as given (an artifact's), which ``derived`` keeps values of."""
        self.derived = derived
        self.specs = (
            dict(specs)
            if specs is not None
            else {name: WeightSpec.of(value) for name, value in self.weights.items()}
        )
        """Every weight's shape and stored element type, with or without data."""
        self.target = target
        self.gradients: dict[str, np.ndarray] = {}
        self.state: dict[str, dict[str, np.ndarray]] = {}
        self.steps = 0
        self.masks: dict[str, np.ndarray] = {}
        """The sparse weights' masks (``cgc.machine.sparse.sparsity``): their dead values stay 0."""
        self.live: dict[str, np.ndarray] = {}
        """Each sparse weight's live positions, flat and ascending: its gradient and its
        optimizer state are vectors over them."""
        self.sparsity: Sparsity | None = None
        """The sparsity's settings, and its record (``Sparsity.to_json``) in ``record``."""
        self.record: dict | None = None
        self.groups: dict[str, dict[str, float]] = {}
        """Per-weight settings over the step's (torch.optim's param groups: no weight decay
        on biases, a lower learning rate for some layers); the schedule scales each ``lr``."""

    def stream(
        self, name: str, shape: Sequence[int], perm: Sequence[int] | None, dtype: str
    ) -> np.ndarray:
        """The view of weight ``name`` that a ``ws.stream_weight`` asks for, in ``dtype``."""
        key = ("view", tuple(shape), None if perm is None else tuple(perm))
        view = self.kept(name, key, partial(reference.weight_view, self.weights[name], shape, perm))
        return view.astype(dtypes.dtype(dtype), copy=False)

    def kept(self, name: str, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``, a value made from weight ``name`` as MemoryX holds it now, by ``key``:
        one made before (by this MemoryX or another of the same ``derived``) from the same
        array if the weight is still as given, else made now."""
        source = self.weights[name]
        if self.derived is None or source is not self.given.get(name):
            return make()
        found = self.derived.values.get((name, key))
        if found is None or found[0] is not source:
            found = self.derived.values[(name, key)] = (source, make())
        return found[1]

    def receive(self, name: str, gradient: np.ndarray, perm: Sequence[int] | None) -> None:
        """Adds a summed gradient of a view of ``name`` to this step's gradient, in the weight's
        stored element type."""
        stored = self.weights[name]
        mapped = reference.weight_unview(gradient, stored.shape, perm).astype(stored.dtype)
        if name in self.live and not self._regrows_by_gradient():
            mapped = mapped.reshape(-1)[self.live[name]]
        if name in self.gradients:
            self.gradients[name] = self.gradients[name] + mapped
        else:
            self.gradients[name] = mapped

    def fold(self, updates: Sequence[Mapping], runs: Sequence[Mapping[str, np.ndarray]]) -> None:
        """Updates the buffers of a training step's ``updates`` (the manifest's
        ``training.buffers``) with each run's values by output name, run after run in sample
        order, as a loop over the step's micro-batches would: a running average moves by its
        momentum towards each run's value, a counter counts the runs."""
        for values in runs:
            for update in updates:
                name, output = update["buffer"], update["output"]
                old = self.weights[name]
                if output is None:
                    self.weights[name] = old + np.ones_like(old)
                else:
                    momentum = update["momentum"]
                    new = momentum * values[output] + (1 - momentum) * old
                    self.weights[name] = new.astype(old.dtype)

    def sparsify(self, record: Mapping, masks: Mapping[str, np.ndarray] | None = None) -> None:
        """Makes the weights of the sparsity ``record`` (``Sparsity.to_json``) sparse with
        ``masks``: their dead values are 0 from now on, and their gradients and optimizer
        state are kept over their live values. Without ``masks`` (a timing-only MemoryX) it
        knows their live counts only."""
        self.record = dict(record)
        self.sparsity = Sparsity.from_json(record)
        if masks is None:
            return
        # a weight all of whose values live is dense: kept, streamed and updated as one
        given = {name: np.asarray(mask, dtype=bool) for name, mask in masks.items()}
        self.masks = {name: mask for name, mask in given.items() if not mask.all()}
        self.live = {name: np.flatnonzero(mask) for name, mask in self.masks.items()}
        for name, live in self.live.items():
            kept = self.weights[name].reshape(-1)[live]
            self.weights[name] = self._scattered(name, kept)

    def restore(
        self,
        weights: Mapping[str, np.ndarray],
        state: dict[str, dict[str, np.ndarray]],
        steps: int,
        masks: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Takes up a checkpoint's weights, optimizer state, updates and masks (None: the
        ones it has, which a checkpoint without masks was written with). State written
        dense (by a MemoryX before it kept sparse weights' state over their live values)
        is kept over the live values."""
        self.weights.update(weights)
        if masks is not None and self.record is not None:
            self.sparsify(self.record, masks)
        for name, slots in state.items():
            if name in self.live:
                shape = self.specs[name].shape
                for slot, value in slots.items():
                    if value.ndim and tuple(value.shape) == tuple(shape):
                        slots[slot] = value.reshape(-1)[self.live[name]]
        self.state = state
        self.steps = steps

    def _scattered(self, name: str, live_values: np.ndarray) -> np.ndarray:
        """Weight ``name`` with ``live_values`` at its live positions and 0 elsewhere."""
        stored = self.weights[name]
        dense = np.zeros(stored.shape, dtype=stored.dtype)
        dense.reshape(-1)[self.live[name]] = live_values
        return dense

    def _regrows_by_gradient(self) -> bool:
        """Whether the step under way moves the masks by the gradients, which it then
        keeps dense until the update."""
        rule = self.sparsity
        return rule is not None and rule.regrow == "gradient" and rule.updates_at(self.steps + 1)

    def update_seconds(self, parameters: int) -> float:
        """Time for the optimizer to update ``parameters`` values."""
        return parameters / self.target.memoryx_update_params_per_s

    def footprint(
        self, trained: Sequence[str], optimizer: str | None, config: Mapping[str, float]
    ) -> optimizers.Footprint:
        """The bytes it holds: every weight, and for training the gradients of ``trained``
        and ``optimizer``'s state (a sparse weight's by its live values)."""
        stored = {name: spec.nbytes for name, spec in self.specs.items()}
        live = live_bytes(self.live_counts(), self.specs)
        return optimizers.footprint(stored, trained, optimizer, config, live)

    def live_counts(self) -> dict[str, int]:
        """The live values of each sparse weight: its mask's, or without masks (timing
        only) the record's density's; a weight all of whose values live is dense."""
        if self.live or self.record is None:
            return {name: int(live.size) for name, live in self.live.items()}
        density = self.record["density"]
        counts = {n: live_count(self.specs[n].size, density) for n in self.record["weights"]}
        return {name: n for name, n in counts.items() if n < self.specs[name].size}

    def apply(
        self,
        optimizer: str,
        config: Mapping[str, float],
        lr_factor: float = 1.0,
        max_grad_norm: float | None = None,
        allow_nonfinite: bool = False,
        loss: float = 0.0,
    ) -> float:
        """Updates every weight that received a gradient this step, with the learning rate
        scaled by ``lr_factor`` (a schedule) and the gradients first clipped to a global norm
        of ``max_grad_norm``; returns the gradients' global norm before clipping. A ``loss``
        or gradients that are not finite stop the step before any weight changes (a
        ``NonFiniteError``), unless ``allow_nonfinite``."""
        full = optimizers.settings(optimizer, config)
        update = optimizers.OPTIMIZERS[optimizer].update
        step = self.steps + 1
        moving = self.sparsity is not None and self.sparsity.updates_at(step)
        dense: dict[str, np.ndarray] = {}
        if self._regrows_by_gradient():  # the gradients were kept dense for the regrowth
            for name, live in self.live.items():
                if name in self.gradients:
                    dense[name] = self.gradients[name]
                    self.gradients[name] = dense[name].reshape(-1)[live]
        norm = optimizers.global_norm(self.gradients)
        if not (allow_nonfinite or (math.isfinite(norm) and math.isfinite(loss))):
            self._stop_nonfinite(step, loss)
        if max_grad_norm is not None:
            optimizers.clip_by_global_norm(self.gradients, max_grad_norm, norm)
        for name in sorted(self.gradients):
            state = self.state.get(name, {})
            own = {**full, **self.groups.get(name, {})}
            own["lr"] = own["lr"] * lr_factor
            if name in self.live:  # the update of the live values, the dead ones stay 0
                values = self.weights[name].reshape(-1)[self.live[name]]
                new = update(values, self.gradients[name], state, own)
                self.weights[name] = self._scattered(name, new)
            else:
                self.weights[name] = update(self.weights[name], self.gradients[name], state, own)
            if state:
                self.state[name] = state
        self.gradients.clear()
        self.steps = step
        if moving:
            self._move_masks(step, dense)
        return norm

    def _stop_nonfinite(self, step: int, loss: float) -> None:
        """A ``NonFiniteError`` naming a loss that is not finite and the first weight, in the
        model's order, whose gradient holds a NaN or an infinity (the norm alone overflows on
        huge finite ones: then the step goes on, as torch's clipping would)."""
        found = [] if math.isfinite(loss) else [f"the loss is {_kind(loss)}"]
        for name in [n for n in self.specs if n in self.gradients]:
            gradient = self.gradients[name]
            if not np.isfinite(gradient).all():
                found.append(f"the first gradient not finite is {name}'s ({_kind(gradient)})")
                break
        if found:
            self.gradients.clear()
            raise NonFiniteError.at(step, ", ".join(found))

    def _move_masks(self, step: int, gradients: Mapping[str, np.ndarray]) -> None:
        """The mask update of step ``step`` (``cgc.machine.sparse.sparsity``'s rule): drops and
        regrows live values of every sparse weight, zeroing the dropped values and giving
        the regrown ones zero state; ``gradients``: the step's dense gradients."""
        assert self.sparsity is not None
        for name in sorted(self.live):
            old = self.live[name]
            new = self.sparsity.moved(name, self.weights[name], old, gradients.get(name), step)
            if new is old:
                continue
            flat = self.weights[name].reshape(-1)
            self.live[name] = new
            self.weights[name] = self._scattered(name, flat[new])
            mask = np.zeros(flat.size, dtype=bool)
            mask[new] = True
            self.masks[name] = mask.reshape(self.weights[name].shape)
            # where each new live position was among the old ones, if it was
            where = np.minimum(np.searchsorted(old, new), old.size - 1)
            stayed = old[where] == new
            for slot, value in self.state.get(name, {}).items():
                if value.ndim:  # per live value; a step count is per weight
                    moved = np.zeros(new.shape, dtype=value.dtype)
                    moved[stayed] = value[where[stayed]]
                    self.state[name][slot] = moved
