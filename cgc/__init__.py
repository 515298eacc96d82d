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
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from cgc.errors import CgcError
from cgc.machine.artifact import Artifact
from cgc.version import __version__

if TYPE_CHECKING:
    from cgc.machine.optimizers import Choice
    from cgc.machine.target import Target
    from cgc.runtime.cluster import RunStats
    from cgc.runtime.trainer import Evaluation, LoopOptions, TrainResult

__all__ = [
    "Artifact",
    "CgcError",
    "__version__",
    "compile",
    "load",
    "prepare_training",
    "run",
    "run_with_stats",
    "train",
]


def compile(
    model,
    mode: str = "auto",
    target: str | Target = "wse2",
    batch_size: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    num_csx: int = 1,
    dump_ir: str | os.PathLike | None = None,
    values: Mapping[str, np.ndarray] | None = None,
) -> Artifact:
    """Compiles an ONNX model (a path or a ModelProto) for ``target`` (a name, or any
    ``cgc.machine.Target`` value).

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
    from cgc.runtime.cluster import Cluster

    return Cluster(artifact, num_csx).infer(inputs)


def run(
    artifact: Artifact, inputs: Mapping[str, np.ndarray], num_csx: int | None = None
) -> dict[str, np.ndarray]:
    """Runs the artifact on ``num_csx`` simulated systems (default: as compiled); returns
    one array per graph output, keyed by output name."""
    return run_with_stats(artifact, inputs, num_csx)[0]


def prepare_training(
    model,
    batch_size: int,
    steps: int,
    optimizer: str = "sgd",
    lr_schedule: str = "constant",
    warmup_steps: int = 0,
    lr_step_size: int = 1,
    lr_gamma: float = 0.1,
    max_grad_norm: float | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    shuffle: bool = False,
    seed: int = 0,
    eval_data: Mapping[str, np.ndarray] | None = None,
    eval_every: int | None = None,
    num_csx: int = 1,
    swarmx_fanout: int | None = None,
    trainable: Sequence[str] = (),
    target: str | Target = "wse2",
    **settings: Choice,
) -> tuple[Artifact, LoopOptions, Evaluation | None]:
    """Compiles a training run of an ONNX model whose first output is the loss, in
    weight-streaming mode on ``num_csx`` systems, without running it: the training artifact,
    the loop's options and the held-out evaluation (with ``eval_data``).

    ``settings`` are the optimizer's, by torch.optim's keywords (``lr``, ``momentum``,
    ``dampening``, ``weight_decay``, ``nesterov``, ``betas``, ``eps``, ``amsgrad``: the table
    ``cgc.machine.optimizers.KEYWORDS``); one left out or None takes torch.optim's default for
    ``optimizer`` (``sgd``, ``adam`` or ``adamw``). ``lr_schedule`` is ``constant``,
    ``cosine`` (towards 0 at ``steps``) or ``step`` (times ``lr_gamma`` every ``lr_step_size``
    steps), after a linear warm-up of ``warmup_steps``; ``max_grad_norm`` clips the
    gradients' global norm.
    ``checkpoint_every`` writes ``model_dir/checkpoints/step-N/``; ``resume`` continues from
    the newest good one; ``shuffle`` visits each epoch's samples in an order drawn from
    ``seed``. With ``eval_data`` the held-out loss (forward only) is logged every
    ``eval_every`` steps and after the last. ``swarmx_fanout`` sets the children per SwarmX
    node (4 by default)."""
    from cgc.compiler.driver import TrainingOptions, compile_model
    from cgc.machine.target import resolve, with_swarmx_fanout
    from cgc.runtime.trainer import Evaluation, LoopOptions, schedule

    # bad settings fail here, before anything is compiled
    options = TrainingOptions(optimizer, trainable, **settings)
    loop = LoopOptions(
        steps,
        schedule(lr_schedule, warmup_steps, steps, lr_step_size, lr_gamma),
        max_grad_norm,
        checkpoint_every,
        resume,
        shuffle,
        seed,
    )
    if eval_every is not None and eval_data is None:
        raise CgcError("--eval-every needs --eval-data")
    machine = with_swarmx_fanout(resolve(target), swarmx_fanout)

    def compiled(training: TrainingOptions | None) -> Artifact:
        return compile_model(
            model, "weight_streaming", machine, batch_size, num_csx=num_csx, training=training
        )

    artifact = compiled(options)
    evaluation = None
    if eval_data is not None:
        forward = compiled(None)
        evaluation = Evaluation(forward, eval_data, steps if eval_every is None else eval_every)
    return artifact, loop, evaluation


def train(
    model,
    data: Mapping[str, np.ndarray],
    batch_size: int,
    steps: int,
    model_dir: str | os.PathLike,
    on_step: Callable[[dict], None] | None = None,
    **options,
) -> TrainResult:
    """Trains an ONNX model whose first output is the loss (``options`` as for
    ``prepare_training``); writes ``metrics.jsonl``, checkpoints and ``weights.safetensors``
    to ``model_dir`` and returns the per-step metrics and the final weights. ``on_step`` hears
    each step's metrics; skipped damaged checkpoints are Python warnings."""
    from cgc.runtime.trainer import train as run_training

    artifact, loop, evaluation = prepare_training(model, batch_size, steps, **options)
    return run_training(
        artifact,
        data,
        loop,
        model_dir,
        on_step,
        warn=lambda m: warnings.warn(m, stacklevel=3),
        evaluation=evaluation,
    )
