"""cgc: a graph compiler and simulator for wafer-scale AI machines.

::

    art = cgc.compile("model.onnx", mode="weight_streaming", target="wse2", batch_size=8)
    art.save("model.cgc"); art = cgc.load("model.cgc")
    outputs = cgc.run(art, {"x": x}, num_csx=2)

Loading and running an artifact imports neither xDSL nor the compiler; ``compile`` and
``train`` import them when called.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from cgc.errors import CgcError
from cgc.runtime.artifact import Artifact

if TYPE_CHECKING:
    from cgc.runtime.trainer import TrainResult
    from cgc.runtime.vm import RunStats

__version__ = "0.1.0"
__all__ = ["Artifact", "CgcError", "compile", "load", "run", "run_with_stats", "train"]


def compile(
    model,
    mode: str = "auto",
    target: str = "wse2",
    batch_size: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    num_csx: int = 1,
    dump_ir: str | os.PathLike | None = None,
    values: Mapping[str, np.ndarray] | None = None,
) -> Artifact:
    """Compiles an ONNX model (a path or a ModelProto) for ``target``.

    ``mode`` is ``pipelined``, ``weight_streaming`` or ``auto``; ``batch_size`` binds the
    symbolic batch dimension of the inputs (the global batch, split over ``num_csx``);
    ``shapes`` gives whole input shapes by name; ``dump_ir`` writes the IR after every pass;
    ``values`` fixes graph inputs that decide shapes to arrays known now (they are no longer
    inputs of the artifact).
    """
    from cgc.compiler.driver import compile_model

    return compile_model(
        model,
        mode=mode,
        target=target,
        batch_size=batch_size,
        shapes=shapes,
        num_csx=num_csx,
        dump_ir=dump_ir,
        values=values,
    )


def load(path: str | os.PathLike) -> Artifact:
    """Reads an artifact file, checking its format and checksums."""
    return Artifact.load(path)


def run_with_stats(
    artifact: Artifact, inputs: Mapping[str, np.ndarray], num_csx: int | None = None
) -> tuple[dict[str, np.ndarray], RunStats]:
    """Runs the artifact on the simulator; returns the outputs and the run's statistics."""
    from cgc.runtime.vm import Cluster

    return Cluster(artifact, num_csx).infer(inputs)


def run(
    artifact: Artifact, inputs: Mapping[str, np.ndarray], num_csx: int | None = None
) -> dict[str, np.ndarray]:
    """Runs the artifact on ``num_csx`` simulated systems (default: as compiled); returns
    one array per graph output, keyed by output name."""
    return run_with_stats(artifact, inputs, num_csx)[0]


def train(
    model,
    data: Mapping[str, np.ndarray],
    batch_size: int,
    steps: int,
    model_dir: str | os.PathLike,
    optimizer: str = "sgd",
    lr: float = 0.01,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    num_csx: int = 1,
    trainable: Sequence[str] = (),
    target: str = "wse2",
) -> TrainResult:
    """Trains an ONNX model whose first output is the loss, in weight-streaming mode on
    ``num_csx`` systems; writes ``metrics.jsonl`` and ``weights.safetensors`` to
    ``model_dir`` and returns the per-step metrics and the final weights."""
    from cgc.compiler.driver import TrainingOptions, compile_model
    from cgc.runtime.trainer import train as run_training

    options = TrainingOptions(
        optimizer, lr, momentum, dampening, weight_decay, nesterov, tuple(trainable)
    )
    artifact = compile_model(
        model,
        mode="weight_streaming",
        target=target,
        batch_size=batch_size,
        num_csx=num_csx,
        training=options,
    )
    return run_training(artifact, data, steps, model_dir)
