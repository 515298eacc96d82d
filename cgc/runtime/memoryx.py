"""MemoryX: the cluster's weight store and optimizer.

Weights and optimizer state live here, never on the wafer. For each layer MemoryX streams the
weights out (as the view a kernel asks for, in the element type the wafer computes with: the
master copies of a mixed-precision model stay 32-bit here), takes the gradients SwarmX has
summed, adding up those of a step's micro-batches, folds in the batch statistics of buffers
such as batch norm's running averages, and at the end of a step applies the optimizer
(``optimizers``: SGD, Adam, AdamW with torch.optim's arithmetic), after an optional
clipping of the gradients' global norm.

A MemoryX of an artifact whose weights are declared without data knows their shapes only: it
serves timing-only runs, which never ask it for numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cgc.machine import dtypes, optimizers, reference
from cgc.machine.artifact import WeightSpec
from cgc.machine.sparsity import masked
from cgc.machine.target import Target


class MemoryX:
    """Weights, gradients of the current step, and optimizer state."""

    def __init__(
        self,
        weights: Mapping[str, np.ndarray],
        target: Target,
        specs: Mapping[str, WeightSpec] | None = None,
    ):
        self.weights = {name: np.array(value) for name, value in weights.items()}
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
        """The sparse weights' masks (``cgc.machine.sparsity``): their dead values stay 0."""
        self.groups: dict[str, dict[str, float]] = {}
        """Per-weight settings over the step's (torch.optim's param groups: no weight decay
        on biases, a lower learning rate for some layers); the schedule scales each ``lr``."""

    def stream(
        self, name: str, shape: Sequence[int], perm: Sequence[int] | None, dtype: str
    ) -> np.ndarray:
        """The view of weight ``name`` that a ``ws.stream_weight`` asks for, in ``dtype``."""
        view = reference.weight_view(self.weights[name], shape, perm)
        return view.astype(dtypes.dtype(dtype), copy=False)

    def receive(self, name: str, gradient: np.ndarray, perm: Sequence[int] | None) -> None:
        """Adds a summed gradient of a view of ``name`` to this step's gradient, in the weight's
        stored element type."""
        stored = self.weights[name]
        mapped = reference.weight_unview(gradient, stored.shape, perm).astype(stored.dtype)
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

    def sparsify(self, masks: Mapping[str, np.ndarray]) -> None:
        """Makes the weights of ``masks`` sparse: their dead values are 0 from now on."""
        self.masks = dict(masks)
        for name, mask in self.masks.items():
            self.weights[name] = masked(self.weights[name], mask)

    def update_seconds(self, parameters: int) -> float:
        """Time for the optimizer to update ``parameters`` values."""
        return parameters / self.target.memoryx_update_params_per_s

    def footprint(
        self, trained: Sequence[str], optimizer: str | None, config: Mapping[str, float]
    ) -> optimizers.Footprint:
        """The bytes it holds: every weight, and for training the gradients of ``trained``
        and ``optimizer``'s state."""
        stored = {name: spec.nbytes for name, spec in self.specs.items()}
        return optimizers.footprint(stored, trained, optimizer, config)

    def apply(
        self,
        optimizer: str,
        config: Mapping[str, float],
        lr_factor: float = 1.0,
        max_grad_norm: float | None = None,
    ) -> float:
        """Updates every weight that received a gradient this step, with the learning rate
        scaled by ``lr_factor`` (a schedule) and the gradients first clipped to a global norm
        of ``max_grad_norm``; returns the gradients' global norm before clipping."""
        full = optimizers.settings(optimizer, config)
        update = optimizers.OPTIMIZERS[optimizer].update
        for name, mask in self.masks.items():
            if name in self.gradients:
                self.gradients[name] = masked(self.gradients[name], mask)
        if max_grad_norm is not None:
            norm = optimizers.clip_by_global_norm(self.gradients, max_grad_norm)
        else:
            norm = optimizers.global_norm(self.gradients)
        for name in sorted(self.gradients):
            state = self.state.get(name, {})
            own = {**full, **self.groups.get(name, {})}
            own["lr"] = own["lr"] * lr_factor
            self.weights[name] = update(self.weights[name], self.gradients[name], state, own)
            if name in self.masks:
                self.weights[name] = masked(self.weights[name], self.masks[name])
            if state:
                self.state[name] = state
        self.gradients.clear()
        self.steps += 1
        return norm
