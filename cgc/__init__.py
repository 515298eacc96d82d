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
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from cgc.errors import CgcError, CgcWarning
from cgc.machine.program.artifact import Artifact
from cgc.version import __version__

if TYPE_CHECKING:
    from cgc.machine.hardware.target import Target
    from cgc.machine.timing.run_stats import RunStats, Simulation
    from cgc.machine.training.optimizers import Choice
    from cgc.runtime.trainer import Evaluation, LoopOptions, TrainResult

__all__ = [
    "Artifact",
    "CgcError",
    "CgcWarning",
    "__version__",
    "compile",
    "load",
    "prepare_training",
    "run",
    "run_with_stats",
    "simulate",
    "train",
]


def compile(
    model,
    mode: str = "auto",
    target: str | Target = "wse2",
    batch_size: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    num_csx: int | None = None,
    dump_ir: str | os.PathLike | None = None,
    values: Mapping[str, np.ndarray] | None = None,
    no_weights: bool = False,
    micro_batch_size: int | None = None,
    recompute: bool | None = None,
    init_seed: int | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    dynamic_batch: bool = True,
    sparsity: float | None = None,
    sparse_params: Sequence[str] = (),
    sparsity_init: str = "random",
    seed: int = 0,
    detect_sparsity: float | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
) -> Artifact:
    """Compiles a model for ``target`` (a name, or any ``cgc.machine.Target`` value): an ONNX
    model (a path or a ModelProto), or a params file (a ``.yaml`` path, ``zoo:NAME``, or a
    ``cgc.frontends.params.ModelParams``) of a GPT-class model, whose weights are declared
    without data (``init_seed`` draws them instead).

    ``mode`` is ``pipelined``, ``weight_streaming`` or ``auto``; ``batch_size`` binds the
    symbolic batch dimension of the inputs (the global batch, split over ``num_csx``; both
    default to a params file's); ``shapes`` gives whole input shapes by name; ``dump_ir``
    writes the IR after every pass; ``values`` fixes graph inputs that decide shapes to arrays
    known now (they are no longer inputs of the artifact); ``no_weights`` reads an ONNX
    model's graph without its weights (its external data may be absent). In weight-streaming
    mode the compiler splits a per-system batch that does not fit the SRAM into micro-batches
    and may recompute activations; ``micro_batch_size`` and ``recompute`` fix its choice.

    A ``torch.nn.Module`` is captured with ``torch.export`` on the example inputs ``args``
    and ``kwargs`` (axis 0 of each a symbolic batch if ``dynamic_batch``), and lowered from
    core ATen; a ``torch.export.ExportedProgram`` is lowered as it is. ``batch_size`` defaults
    to the example's.

    ``sparsity`` (the fraction of zeros, in [0, 1)) makes the weights ``sparse_params``
    match (default: every matrix but the embeddings) sparse, their live values drawn from
    ``seed`` or the largest (``sparsity_init="magnitude"``); ``detect_sparsity`` instead
    makes sparse the matrices with at least that fraction of zeros, their zeros dead. MemoryX
    streams a sparse weight's live values and their indices, and the wafer multiplies by
    those alone (``cgc.machine.sparse.tiles``). ``weights`` replaces weights of the model by
    name (the tensors of a ``weights.safetensors`` that ``train`` wrote, say).
    """
    from cgc.compiler.driver import compile_model
    from cgc.machine.sparse.sparsity import Sparsity

    if _is_torch(model):
        from cgc.frontends.torch import capture

        model = capture(model, args, kwargs, dynamic_batch)
    elif args or kwargs:
        raise CgcError("args and kwargs are the example inputs of a PyTorch model")

    return compile_model(
        model,
        mode=mode,
        target=target,
        batch_size=batch_size,
        shapes=shapes,
        num_csx=num_csx,
        dump_ir=dump_ir,
        values=values,
        no_weights=no_weights,
        micro_batch_size=micro_batch_size,
        recompute=recompute,
        init_seed=init_seed,
        sparsity=Sparsity.of(sparsity, sparse_params, sparsity_init, seed),
        detect_sparsity=detect_sparsity,
        weights=weights,
    )


def _is_torch(model: object) -> bool:
    """Whether ``model`` is a torch module or exported program (torch imported or not)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module | torch.export.ExportedProgram)


def load(path: str | os.PathLike) -> Artifact:
    """Reads an artifact file, checking its format and checksums."""
    return Artifact.load(path)


def run_with_stats(
    artifact: Artifact,
    inputs: Mapping[str, np.ndarray],
    num_csx: int | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    ray_placement: str | None = None,
) -> tuple[dict[str, np.ndarray], RunStats]:
    """Runs the artifact on the simulator; returns the outputs and the run's statistics.
    ``executor="ray"`` runs each system as a Ray actor (``pip install 'cgc[ray]'``) on the
    cluster at ``ray_address`` (default: a local instance), its actors packed on few nodes
    or spread (``ray_placement``): the same outputs and statistics, bit for bit."""
    from cgc.runtime.executors import Backend
    from cgc.runtime.launch import run as run_cluster

    return run_cluster(artifact, inputs, num_csx, Backend(executor, ray_address, ray_placement))


def run(
    artifact: Artifact,
    inputs: Mapping[str, np.ndarray],
    num_csx: int | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    ray_placement: str | None = None,
) -> dict[str, np.ndarray]:
    """Runs the artifact on ``num_csx`` simulated systems (default: as compiled); returns
    one array per graph output, keyed by output name. The executor's settings are
    ``run_with_stats``'s."""
    return run_with_stats(artifact, inputs, num_csx, executor, ray_address, ray_placement)[0]


def prepare_training(
    model,
    batch_size: int | None = None,
    steps: int = 1,
    optimizer: str | None = None,
    lr_schedule: str = "constant",
    warmup_steps: int = 0,
    lr_step_size: int = 1,
    lr_gamma: float = 0.1,
    max_grad_norm: float | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    shuffle: bool = False,
    seed: int = 0,
    allow_nonfinite: bool = False,
    eval_data: Mapping[str, np.ndarray] | None = None,
    eval_every: int | None = None,
    num_csx: int | None = None,
    swarmx_fanout: int | None = None,
    trainable: Sequence[str] = (),
    frozen: Sequence[str] = (),
    target: str | Target = "wse2",
    no_weights: bool = False,
    micro_batch_size: int | None = None,
    recompute: bool | None = None,
    init_seed: int | None = None,
    sparsity: float | None = None,
    sparse_params: Sequence[str] = (),
    sparsity_init: str = "random",
    sparsity_schedule: str | None = None,
    sparsity_update_every: int | None = None,
    sparsity_drop_fraction: float | None = None,
    sparsity_regrow: str | None = None,
    sparsity_decay: str | None = None,
    sparsity_end_step: int | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
    detect_sparsity: float | None = None,
    **settings: Choice,
) -> tuple[Artifact, LoopOptions, Evaluation | None]:
    """Compiles a training run of a model whose first output is the loss (an ONNX model, or a
    params file, which says its own batch, systems and optimizer), in weight-streaming mode on
    ``num_csx`` systems, without running it: the training artifact, the loop's options and the
    held-out evaluation (with ``eval_data``).

    ``settings`` are the optimizer's, by torch.optim's keywords (``lr``, ``momentum``,
    ``dampening``, ``weight_decay``, ``nesterov``, ``betas``, ``eps``, ``amsgrad``: the table
    ``cgc.machine.training.optimizers.KEYWORDS``); one left out or None takes the params file's,
    else torch.optim's default for ``optimizer`` (``sgd``, ``adam`` or ``adamw``; default the params
    file's, else ``sgd``). ``trainable`` (regular expressions matched in full against weight names)
    chooses the weights trained; by default an ONNX model's parameters, the weights it reads as a
    model reads its learned tensors, not the constants its exporter lifted into initializers
    (``cgc.dialects.parameters``), and every float weight of another model. ``frozen`` (likewise)
    holds weights fixed whatever ``trainable`` says. ``lr_schedule`` is ``constant``, ``cosine``
    (towards 0 at ``steps``) or ``step`` (times ``lr_gamma`` every ``lr_step_size`` steps), after a
    linear warm-up of ``warmup_steps``; ``max_grad_norm`` clips the gradients' global norm.
    ``checkpoint_every`` writes ``model_dir/checkpoints/step-N/``; ``resume`` continues from
    the newest good one; ``shuffle`` visits each epoch's samples in an order drawn from
    ``seed``. A loss or gradients that are not finite stop the run at that step (a
    ``CgcError`` naming the step and the first weight whose gradient is not finite, the
    weights those of the step before) unless ``allow_nonfinite``. With ``eval_data`` the
    held-out loss (forward only) is logged every
    ``eval_every`` steps and after the last. ``swarmx_fanout`` sets the children per SwarmX
    node (4 by default). ``no_weights``, ``micro_batch_size``, ``recompute`` and ``init_seed``
    are ``compile``'s. ``sparsity`` (the fraction of zeros, in [0, 1)) makes the weights that
    ``sparse_params`` match (default: every trained matrix but the embeddings) sparse, their
    live values drawn from ``seed`` or, with ``sparsity_init="magnitude"``, the largest
    initial ones (``cgc.machine.sparse.sparsity``). ``sparsity_schedule="dynamic"`` moves the masks
    every ``sparsity_update_every`` steps (until ``sparsity_end_step``), dropping a
    ``sparsity_drop_fraction`` of the live values (``sparsity_decay``: ``constant`` or
    ``cosine``) and regrowing as many by ``sparsity_regrow``: ``gradient`` (RigL) or
    ``random`` (SET). Without ``sparsity``, a params file's ``sparsity`` section says it.
    ``weights`` and ``detect_sparsity`` are ``compile``'s: a pruned model's zeros stay dead
    through its training."""
    from cgc.compiler.driver import TrainingOptions, compile_model, training_options
    from cgc.frontends.params import ModelParams, is_params_source, load_params
    from cgc.machine.hardware.target import resolve, with_swarmx_fanout
    from cgc.machine.sparse.sparsity import Sparsity
    from cgc.runtime.trainer import Evaluation, LoopOptions, schedule

    if isinstance(model, str | os.PathLike) and is_params_source(model):
        model = load_params(model)
    params = model if isinstance(model, ModelParams) else None
    if params is not None and max_grad_norm is None:
        max_grad_norm = params.optimizer.max_gradient_norm
    # bad settings fail here, before anything is compiled
    sparse = Sparsity.of(
        sparsity, sparse_params, sparsity_init, seed, sparsity_schedule,
        update_every=sparsity_update_every, drop_fraction=sparsity_drop_fraction,
        regrow=sparsity_regrow, decay=sparsity_decay, end_step=sparsity_end_step,
    )  # fmt: skip
    if sparse is None and params is not None and params.sparsity is not None:
        sparse = params.sparsity.sparsity(seed)
    options = training_options(params, optimizer, trainable, sparse, **settings)
    options.frozen = tuple(frozen)
    loop = LoopOptions(
        steps,
        schedule(lr_schedule, warmup_steps, steps, lr_step_size, lr_gamma),
        max_grad_norm,
        checkpoint_every,
        resume,
        shuffle,
        seed,
        allow_nonfinite,
    )
    if eval_every is not None and eval_data is None:
        raise CgcError("--eval-every needs --eval-data")
    machine = with_swarmx_fanout(resolve(target), swarmx_fanout)

    def compiled(training: TrainingOptions | None, micro_batch: int | None) -> Artifact:
        return compile_model(
            model,
            "weight_streaming",
            machine,
            batch_size,
            num_csx=num_csx,
            training=training,
            no_weights=no_weights,
            micro_batch_size=micro_batch,
            recompute=recompute if training else None,
            init_seed=init_seed,
            weights=weights,
            detect_sparsity=detect_sparsity if training else None,
        )

    artifact = compiled(options, micro_batch_size)
    evaluation = None
    if eval_data is not None:  # runs in the training's chunks, scaled as its losses
        forward = compiled(None, artifact.manifest["micro_batch"])
        evaluation = Evaluation(forward, eval_data, steps if eval_every is None else eval_every)
    return artifact, loop, evaluation


def simulate(
    model,
    num_csx: int | None = None,
    steps: int = 1,
    training: bool = True,
    **options,
) -> Simulation:
    """Timing only: ``steps`` training steps (or, without ``training``, batches) of an
    artifact or of a model compiled here (``options`` as for ``prepare_training``, or for
    ``compile`` without ``training``) on ``num_csx`` systems, on shapes alone: no inputs and
    no weight data are needed, and the time is exactly a run's with numbers."""
    from cgc.runtime.simulation import simulate as run_simulation

    if isinstance(model, Artifact):
        if options:
            raise CgcError(f"simulate: {sorted(options)} apply to a model, not an artifact")
        return run_simulation(model, num_csx, steps)
    if training:
        artifact = prepare_training(model, steps=steps, num_csx=num_csx, **options)[0]
    else:
        artifact = compile(model, mode=options.pop("mode", "weight_streaming"), num_csx=num_csx,
                           **options)  # fmt: skip
    return run_simulation(artifact, None, steps)


def train(
    model,
    data: Mapping[str, np.ndarray],
    batch_size: int | None,
    steps: int,
    model_dir: str | os.PathLike,
    on_step: Callable[[dict], None] | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    ray_placement: str | None = None,
    **options,
) -> TrainResult:
    """Trains a model whose first output is the loss (``options`` as for
    ``prepare_training``); writes ``metrics.jsonl``, checkpoints and ``weights.safetensors``
    to ``model_dir`` and returns the per-step metrics and the final weights. ``on_step`` hears
    each step's metrics; skipped damaged checkpoints are Python warnings. The executor's
    settings are ``run_with_stats``'s: on Ray, MemoryX is one more actor, and the losses
    and weights are the local run's, bit for bit."""
    from cgc.runtime.executors import Backend
    from cgc.runtime.trainer import train as run_training

    backend = Backend(executor, ray_address, ray_placement)
    artifact, loop, evaluation = prepare_training(model, batch_size, steps, **options)
    return run_training(
        artifact,
        data,
        loop,
        model_dir,
        on_step,
        warn=lambda m: warnings.warn(m, CgcWarning, stacklevel=3),
        evaluation=evaluation,
        backend=backend,
    )


def __getattr__(name: str) -> Any:
    """``cgc.torch``, the PyTorch training API, imported (with torch) when first used."""
    if name != "torch":
        raise AttributeError(f"module 'cgc' has no attribute {name!r}")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise CgcError("cgc.torch needs PyTorch: pip install cgc[torch]") from None
    from cgc import torch_api

    return torch_api
