"""MemoryX: the cluster's weight store and optimizer.

Weights and optimizer state live here, never on the wafer. For each layer MemoryX streams the
weights out (as the view a kernel asks for), takes the gradients SwarmX has summed, and at the
end of a step applies the optimizer (``optimizers``: SGD, Adam, AdamW with torch.optim's
arithmetic), after an optional clipping of the gradients' global norm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cgc.machine import optimizers, reference
from cgc.machine.target import Target


class MemoryX:
    """Weights, gradients of the current step, and optimizer state."""

    def __init__(self, weights: Mapping[str, np.ndarray], target: Target):
        self.weights = {name: np.array(value) for name, value in weights.items()}
        self.target = target
        self.gradients: dict[str, np.ndarray] = {}
        self.state: dict[str, dict[str, np.ndarray]] = {}
        self.steps = 0

    def stream(self, name: str, shape: Sequence[int], perm: Sequence[int] | None) -> np.ndarray:
        """The view of weight ``name`` that a ``ws.stream_weight`` asks for."""
        return reference.weight_view(self.weights[name], shape, perm)

    def stream_seconds(self, nbytes: float) -> float:
        """Time for MemoryX to read ``nbytes`` out (or take them in)."""
        return nbytes / self.target.memoryx_bytes_per_s

    def receive(self, name: str, gradient: np.ndarray, perm: Sequence[int] | None) -> None:
        """Adds a summed gradient of a view of ``name`` to this step's gradient."""
        mapped = reference.weight_unview(gradient, self.weights[name].shape, perm)
        if name in self.gradients:
            self.gradients[name] = self.gradients[name] + mapped
        else:
            self.gradients[name] = mapped.astype(self.weights[name].dtype, copy=True)

    def update_seconds(self, parameters: int) -> float:
        """Time for the optimizer to update ``parameters`` values."""
        return parameters / self.target.memoryx_update_params_per_s

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
        full["lr"] = full["lr"] * lr_factor
        if max_grad_norm is not None:
            norm = optimizers.clip_by_global_norm(self.gradients, max_grad_norm)
        else:
            norm = optimizers.global_norm(self.gradients)
        for name in sorted(self.gradients):
            state = self.state.get(name, {})
            self.weights[name] = update(self.weights[name], self.gradients[name], state, full)
            if state:
                self.state[name] = state
        self.gradients.clear()
        self.steps += 1
        return norm
