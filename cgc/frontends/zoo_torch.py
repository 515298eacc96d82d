"""The built-in zoo models written in PyTorch, as independent references for training.

Each function computes a zoo model's logits from a dict of torch tensors keyed by the ONNX
initializer names, so that the same initial weights train in both; ``TRAINABLE`` lists what a
PyTorch module would call parameters (batch norm's running statistics are buffers).
Importing this module needs torch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

F = torch.nn.functional


def mlp(weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``zoo.mlp``: Gemm + ReLU layers, then a last Gemm."""
    h = x
    layers = sorted({name.split(".")[0] for name in weights if name.startswith("fc")})
    for i, layer in enumerate(layers):
        h = h @ weights[f"{layer}.weight"].T + weights[f"{layer}.bias"]
        h = torch.relu(h) if i < len(layers) - 1 else h
    return h


def cnn(w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``zoo.cnn``, its batch norm in inference form (running statistics)."""
    h = F.conv2d(x, w["conv1.weight"], w["conv1.bias"], padding=1)
    h = F.batch_norm(
        h, w["bn1.running_mean"], w["bn1.running_var"], w["bn1.weight"], w["bn1.bias"], eps=1e-5
    )
    h = F.max_pool2d(torch.relu(h), 2, 2)
    h = F.avg_pool2d(torch.relu(F.conv2d(h, w["conv2.weight"], w["conv2.bias"], padding=1)), 2)
    return h.mean(dim=(2, 3)) @ w["fc.weight"].T + w["fc.bias"]


FORWARD: dict[str, Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]] = {
    "mlp_train": mlp,
    "cnn_train": cnn,
}
"""The logits of each zoo training model."""

TRAINABLE: dict[str, list[str]] = {
    "mlp_train": [r".*"],
    "cnn_train": [r"conv\d\..*", r"bn1\.(weight|bias)", r"fc\..*"],
}
"""The ``--trainable`` patterns that select each model's PyTorch parameters."""
