"""cgc: a graph compiler and simulator for wafer-scale AI machines.

::

    art = cgc.compile("model.onnx", mode="weight_streaming", target="wse2", batch_size=8)
    art.save("model.cgc"); art = cgc.load("model.cgc")
    outputs = cgc.run(art, {"x": x}, num_csx=2)

Loading and running an artifact imports neither xDSL nor the compiler; ``compile`` and
``train`` import them when called.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from cgc.errors import CgcError, CgcWarning, OptionError
from cgc.machine.program.artifact import Artifact
from cgc.options import (
    Chosen,
    CompileOptions,
    GenerationOptions,
    SimulationOptions,
    SparsityOptions,
    TrainingOptions,
)
from cgc.version import __version__

if TYPE_CHECKING:
    from cgc.machine.timing.run_stats import RunStats, Simulation
    from cgc.runtime.trainer import Evaluation, LoopOptions, TrainResult
    from cgc.tools.generation import Generated

TRAINING_RECORDS = (CompileOptions, TrainingOptions, SparsityOptions)
"""The records of a training's options."""

__all__ = [
    "Artifact",
    "CgcError",
    "CgcWarning",
    "CompileOptions",
    "GenerationOptions",
    "SimulationOptions",
    "SparsityOptions",
    "TrainingOptions",
    "__version__",
    "compile",
    "generate",
    "load",
    "prepare_training",
    "run",
    "run_with_stats",
    "simulate",
    "train",
]


def compile(
    model,
    *records: CompileOptions | SparsityOptions,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    values: Mapping[str, np.ndarray] | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
    dump_ir: str | os.PathLike | None = None,
    **fields: Any,
) -> Artifact:
    """Compiles a model for a target: an ONNX model (a path or a ModelProto), or a params
    file (a ``.yaml`` path, ``zoo:NAME``, or a ``cgc.frontends.params.ModelParams``) of a
    GPT-class model, whose weights are declared without data (``init_seed`` draws them
    instead).

    The options are a ``cgc.options.CompileOptions`` and a ``SparsityOptions`` record, or
    their fields by name (which complete the records given; the records' fields say what each
    does): ``compile(model, mode="pipelined", target="wse3", batch_size=8)``. ``dump_ir``
    writes the IR after every pass; ``values`` fixes graph inputs that decide shapes to arrays
    known now (they are no longer inputs of the artifact); ``weights`` replaces weights of the
    model by name (the tensors of a ``weights.safetensors`` that ``train`` wrote, say).

    A ``torch.nn.Module`` is captured with ``torch.export`` on the example inputs ``args``
    and ``kwargs`` (axis 0 of each a symbolic batch if ``dynamic_batch``), and lowered from
    core ATen; a ``torch.export.ExportedProgram`` is lowered as it is. ``batch_size`` defaults
    to the example's.
    """
    from cgc.compiler.driver import compile_model

    chosen = Chosen("compile", (CompileOptions, SparsityOptions), records, fields)
    options = chosen[CompileOptions]
    if _is_torch(model):
        from cgc.frontends.torch import capture

        model = capture(model, args, kwargs, options.dynamic_batch)
    elif args or kwargs:
        raise CgcError("args and kwargs are the example inputs of a PyTorch model")
    return compile_model(
        model, options, chosen[SparsityOptions], values=values, weights=weights, dump_ir=dump_ir
    )


def _is_torch(model: object) -> bool:
    """Whether ``model`` is a torch module or exported program (torch imported or not)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module | torch.export.ExportedProgram)


def generate(
    model: object,
    prompt: object | None = None,
    *records: CompileOptions | GenerationOptions,
    attention_mask: object | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
    **fields: Any,
) -> Generated:
    """Generates tokens greedily after each prompt on the simulator, and times serving them:
    ``model`` is a params file, ``zoo:NAME`` or ``ModelParams`` (its weights from
    ``init_seed`` or ``weights``, a ``.safetensors`` checkpoint's tensors by cgc's or Hugging
    Face's names), a ``transformers`` causal LM, ``file.py:factory`` returning one (and
    its example ids, the default prompt), or a decoder graph: an ONNX decoder exported
    without its cache, any PyTorch causal LM whose ``forward`` takes ``position_ids``, or a
    ``cgc.frontends.decoder.GraphDecoder`` (``cgc.frontends.torch.causal.causal_decoder``
    takes transformers' GPT-2, Llama, Qwen2 and Mistral through ``torch.export`` as well);
    ``prompt`` is ``[B, P]`` token ids (with ``attention_mask`` for rows of different
    lengths) or a list of rows.

    The options are a ``CompileOptions`` (``mode``: ``pipelined``, ``whole_wafer``,
    ``weight_streaming`` or ``auto``; ``target``; ``num_csx``) and a ``GenerationOptions``
    (``max_new_tokens``; ``timing_only`` with ``prompt_len`` and ``concurrent``) record, or
    their fields by name. Returns a ``cgc.tools.generation.Generated``: ``tokens`` (left-padded
    prompts and the new tokens), ``new_tokens``, every step's ``logits`` and the ``serving``
    figures (time to first token, time per output token, tokens a second, the key-value
    cache's capacity)."""
    from cgc.tools.generation import generate as run_generation

    chosen = Chosen("generate", (CompileOptions, GenerationOptions), records, fields)
    return run_generation(
        model,
        prompt,
        chosen[CompileOptions],
        chosen[GenerationOptions],
        attention_mask=attention_mask,
        weights=weights,
    )


def load(path: str | os.PathLike) -> Artifact:
    """Reads an artifact file, checking its format and checksums."""
    return Artifact.load(path)


def run_with_stats(
    artifact: Artifact,
    inputs: Mapping[str, np.ndarray],
    options: SimulationOptions | None = None,
    /,
    **fields: Any,
) -> tuple[dict[str, np.ndarray], RunStats]:
    """Runs the artifact on the simulator; returns the outputs and the run's statistics.
    The options are a ``cgc.options.SimulationOptions`` record, or its fields by name:
    ``num_csx`` systems (default: as compiled); ``executor="ray"`` runs each system as a Ray
    actor (``pip install 'cgc[ray]'``) on the cluster at ``ray_address`` (default: a local
    instance), its actors packed on few nodes or spread (``ray_placement``): the same outputs
    and statistics, bit for bit."""
    from cgc.runtime.executors import Backend
    from cgc.runtime.launch import run as run_cluster

    where = Chosen("run", (SimulationOptions,), () if options is None else (options,), fields)
    chosen = where[SimulationOptions]
    return run_cluster(artifact, inputs, chosen.num_csx, Backend.of(chosen))


def run(
    artifact: Artifact,
    inputs: Mapping[str, np.ndarray],
    options: SimulationOptions | None = None,
    /,
    **fields: Any,
) -> dict[str, np.ndarray]:
    """Runs the artifact on the simulated systems; returns one array per graph output, keyed
    by output name. The options are ``run_with_stats``'s."""
    return run_with_stats(artifact, inputs, options, **fields)[0]


def prepare_training(
    model,
    *records: CompileOptions | TrainingOptions | SparsityOptions,
    eval_data: Mapping[str, np.ndarray] | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
    **fields: Any,
) -> tuple[Artifact, LoopOptions, Evaluation | None]:
    """Compiles a training run of a model whose first output is the loss (an ONNX model, or a
    params file, which says its own batch, systems and optimizer), in weight-streaming mode on
    ``num_csx`` systems, without running it: the training artifact, the loop's options and the
    held-out evaluation (with ``eval_data``).

    The options are ``cgc.options`` records (``CompileOptions``, ``TrainingOptions`` and
    ``SparsityOptions``, whose fields say what each does), or their fields by name, which
    complete the records given; the optimizer's settings are named by torch.optim's keywords
    (``lr=0.1``, ``betas=(0.9, 0.99)``). ``eval_data`` is held-out data whose loss is logged
    every ``eval_every`` steps; ``weights`` replaces weights of the model by name, as for
    ``compile``."""
    chosen = Chosen("prepare_training", TRAINING_RECORDS, records, fields)
    return _prepared(model, chosen, eval_data, weights)


def _prepared(
    model, chosen: Chosen, eval_data: Mapping[str, np.ndarray] | None, weights
) -> tuple[Artifact, LoopOptions, Evaluation | None]:
    """``prepare_training`` of the records ``chosen``."""
    from cgc.compiler.driver import compile_model
    from cgc.compiler.training import Training, training_of
    from cgc.frontends.params import ModelParams, is_params_source, load_params
    from cgc.machine.hardware.target import resolve, with_swarmx_fanout
    from cgc.machine.program.mode import Mode
    from cgc.runtime.trainer import Evaluation, LoopOptions, schedule

    options, run, sparse = chosen[CompileOptions], chosen[TrainingOptions], chosen[SparsityOptions]
    if isinstance(model, str | os.PathLike) and is_params_source(model):
        model = load_params(model)
    params = model if isinstance(model, ModelParams) else None
    max_grad_norm = run.max_grad_norm
    if params is not None and max_grad_norm is None:
        max_grad_norm = params.optimizer.max_gradient_norm
    training = training_of(params, run, sparse)  # bad settings fail here, before compiling
    loop = LoopOptions(
        run.steps,
        schedule(run.lr_schedule, run.warmup_steps, run.steps, run.lr_step_size, run.lr_gamma),
        max_grad_norm,
        run.checkpoint_every,
        run.resume,
        run.shuffle,
        run.seed,
        run.allow_nonfinite,
    )
    if run.eval_every is not None and eval_data is None:
        raise OptionError("eval_every needs eval_data", "eval_every", "eval_data")
    machine = with_swarmx_fanout(resolve(options.target), run.swarmx_fanout)
    mode = Mode.WEIGHT_STREAMING if options.mode == "auto" else options.mode
    streamed = dataclasses.replace(options, mode=mode, target=machine)

    def compiled(trains: Training | None, micro_batch: int | None) -> Artifact:
        forward = dataclasses.replace(streamed, micro_batch_size=micro_batch)
        if trains is None:
            forward = dataclasses.replace(forward, recompute=None)
        detect = SparsityOptions(detect_sparsity=sparse.detect_sparsity if trains else None)
        return compile_model(model, forward, detect, training=trains, weights=weights)

    artifact = compiled(training, options.micro_batch_size)
    evaluation = None
    if eval_data is not None:  # runs in the training's chunks, scaled as its losses
        forward = compiled(None, artifact.manifest["micro_batch"])
        steps = run.steps if run.eval_every is None else run.eval_every
        evaluation = Evaluation(forward, eval_data, steps)
    return artifact, loop, evaluation


def simulate(model, num_csx: int | None = None, steps: int = 1, training: bool = True,
             **fields: Any) -> Simulation:  # fmt: skip
    """Timing only: ``steps`` training steps (or, without ``training``, batches) of an
    artifact or of a model compiled here (the options, records or fields by name, as for
    ``prepare_training``, or for ``compile`` without ``training``) on ``num_csx`` systems, on
    shapes alone: no inputs and no weight data are needed, and the time is exactly a run's
    with numbers."""
    from cgc.runtime.simulation import simulate as run_simulation

    if isinstance(model, Artifact):
        if fields:
            raise CgcError(f"simulate: {sorted(fields)} apply to a model, not an artifact")
        return run_simulation(model, num_csx, steps)
    if training:
        artifact = prepare_training(model, steps=steps, num_csx=num_csx, **fields)[0]
    else:
        fields.setdefault("mode", "weight_streaming")
        artifact = compile(model, num_csx=num_csx, **fields)
    return run_simulation(artifact, None, steps)


def train(
    model,
    data: Mapping[str, np.ndarray],
    *records: CompileOptions | TrainingOptions | SparsityOptions | SimulationOptions,
    model_dir: str | os.PathLike,
    on_step: Callable[[dict], None] | None = None,
    eval_data: Mapping[str, np.ndarray] | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
    **fields: Any,
) -> TrainResult:
    """Trains a model whose first output is the loss (the options as for
    ``prepare_training``, and where its systems run, a ``SimulationOptions`` record or its
    fields, as for ``run_with_stats``; its ``num_csx`` is the compile's); writes
    ``metrics.jsonl``, checkpoints and ``weights.safetensors`` to ``model_dir`` and returns
    the per-step metrics and the final weights. ``on_step`` hears each step's metrics; skipped
    damaged checkpoints are Python warnings. On Ray, MemoryX is one more actor, and the losses
    and weights are the local run's, bit for bit."""
    from cgc.runtime.executors import Backend
    from cgc.runtime.trainer import train as run_training

    chosen = Chosen("train", (*TRAINING_RECORDS, SimulationOptions), records, fields)
    backend = Backend.of(chosen[SimulationOptions])
    artifact, loop, evaluation = _prepared(model, chosen, eval_data, weights)
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
