"""MemoryX: the cluster's weight store and optimizer.

Weights and optimizer state live here, never on the wafer. For each layer MemoryX streams the
weights out (as the view a kernel asks for), takes the gradients SwarmX has summed, and at the
end of a step applies the optimizer with exactly torch.optim's arithmetic: float32 tensors,
scalar hyper-parameters rounded to float32 as torch does when it multiplies a float32 tensor
by a Python number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cgc.runtime import reference
from cgc.runtime.machine import Target


def _f32(value: float) -> np.float32:
    return np.float32(value)


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

    def apply(self, optimizer: str, config: Mapping[str, float]) -> None:
        """Updates every weight that received a gradient this step."""
        if optimizer != "sgd":
            raise ValueError(f"MemoryX has no optimizer {optimizer!r}")
        for name in sorted(self.gradients):
            self.weights[name] = self._sgd(name, self.gradients[name], config)
        self.gradients.clear()
        self.steps += 1

    def _sgd(self, name: str, grad: np.ndarray, config: Mapping[str, float]) -> np.ndarray:
        """torch.optim.SGD's update of one parameter."""
        param = self.weights[name]
        lr = config["lr"]
        momentum = config.get("momentum", 0.0)
        dampening = config.get("dampening", 0.0)
        weight_decay = config.get("weight_decay", 0.0)
        if weight_decay:
            grad = grad + _f32(weight_decay) * param
        if momentum:
            state = self.state.setdefault(name, {})
            if "momentum_buffer" in state:
                buf = state["momentum_buffer"] * _f32(momentum) + _f32(1 - dampening) * grad
            else:
                buf = grad.copy()
            state["momentum_buffer"] = buf
            grad = grad + _f32(momentum) * buf if config.get("nesterov", 0.0) else buf
        # numpy turns 0-d arithmetic into scalars; a weight stays an array
        return np.asarray(param + _f32(-lr) * grad, dtype=param.dtype)
