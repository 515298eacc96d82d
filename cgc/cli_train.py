"""``cgc train`` and ``cgc scale``: a training run (or its time alone), and a training
step's scaling over cluster sizes and sparsity levels."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cgc.cli_io import check_outputs, read_safetensors, terminal, warn, write_file
from cgc.cli_options import (
    chosen_backend,
    chosen_records,
    chosen_settings,
    dynamic_sparsity_options,
    executor_options,
    optimizer_choice,
    optimizer_options,
    plan_options,
    record_options,
    sparsity_levels_options,
    sparsity_options,
    target_options,
    targeted,
    weights_options,
)
from cgc.errors import CgcError
from cgc.files import DirectoryLock
from cgc.machine.training.optimizers import KEYWORDS
from cgc.options import CompileOptions, SparsityOptions, TrainingOptions
from cgc.tools.paths import load_npz, model_argument, model_dir_files, model_file, output_directory
from cgc.tools.progress import step_reporter

if TYPE_CHECKING:
    from cgc.runtime.executors import Backend


@click.command()
@click.argument("model")
@click.option("--data", "data_path", help=".npz: one array per model input.")
@record_options(CompileOptions, "batch_size")
@click.option("--steps", type=int, required=True, help="Training steps.")
@click.option("--model-dir", type=click.Path(), help="Where metrics and weights go.")
@click.option(
    "--timing-only",
    is_flag=True,
    help="Simulate the steps' time alone: no data, no weights needed, nothing trained.",
)
@optimizer_choice
@optimizer_options
@record_options(
    TrainingOptions,
    "lr_schedule",
    "warmup_steps",
    "lr_step_size",
    "lr_gamma",
    "max_grad_norm",
    "checkpoint_every",
    "resume",
    "shuffle",
)
@click.option("--trace", type=click.Path(), help="Write the steps' Chrome trace (Perfetto) here.")
@click.option("--stats-json", type=click.Path(), help="Timing-only: write a step's statistics.")
@click.option("--eval-data", "eval_path", help=".npz of held-out samples; its loss is logged.")
@record_options(TrainingOptions, "eval_every", "seed", "allow_nonfinite")
@record_options(CompileOptions, "num_csx")
@record_options(TrainingOptions, "swarmx_fanout", "trainable", "frozen")
@sparsity_options
@dynamic_sparsity_options
@weights_options
@target_options
@plan_options
@executor_options
def train(model, data_path, steps, model_dir, timing_only, trace, stats_json, **options) -> None:
    """Train MODEL (first output: the loss; an .onnx file, a params .yaml file or zoo:NAME)
    in weight-streaming mode, or with --timing-only simulate its steps' time."""
    import cgc

    for option in ("trainable", "frozen"):
        for pattern in options[option]:
            try:
                re.compile(pattern)
            except re.error as e:
                raise CgcError(f"--{option} {pattern}: not a regular expression ({e})") from None
    model_argument(model, "MODEL")
    inputs = {
        "MODEL": model_file(model),
        "--data": data_path,
        "--eval-data": options["eval_path"],
        "--weights": options["weights_path"],
    }
    files, trees = model_dir_files(model_dir, timing_only, options)
    check_outputs({"--trace": trace, "--stats-json": stats_json}, inputs, files, trees)
    backend = chosen_backend(options)
    if not timing_only and (data_path is None or model_dir is None):
        raise CgcError("--data and --model-dir are required (or --timing-only)")
    if model_dir is not None:  # held until the command ends: a second run is refused at once
        output_directory(model_dir, "--model-dir")
        click.get_current_context().with_resource(
            DirectoryLock(model_dir, f"--model-dir {model_dir}")
        )
    if timing_only:
        from cgc.tools.timing_only import check_options

        check_options(steps, data_path, options)
    eval_path = options.pop("eval_path")
    held_out = load_npz(eval_path, "--eval-data") if eval_path is not None else None
    data = load_npz(data_path, "--data") if data_path is not None else None
    options["target"] = targeted(options.pop("target"), options.pop("mesh"), options.pop("figures"))
    options["steps"] = steps
    given = {k: options.pop(k) for k in list(options) if k in KEYWORDS}
    options.update(chosen_settings(given))
    weights_path = options.pop("weights_path")
    chosen = chosen_records(options, CompileOptions, TrainingOptions, SparsityOptions)
    artifact, loop, evaluation = cgc.prepare_training(
        model,
        chosen[CompileOptions],
        chosen[TrainingOptions],
        chosen[SparsityOptions],
        eval_data=held_out,
        weights=None if weights_path is None else read_safetensors(weights_path),
    )
    if timing_only:
        from cgc.tools.timing_only import simulate_training

        simulate_training(artifact, steps, model_dir, trace, stats_json)
    else:
        assert data is not None
        trainable = bool(chosen[TrainingOptions].trainable)
        _train(artifact, data, loop, model_dir, evaluation, trace, trainable, backend)


def _train(artifact, data, loop, model_dir: str, evaluation, trace, chosen: bool, backend: Backend):
    """Runs the training loop with numbers and reports it."""
    from cgc.runtime.trainer import TRACED_STEPS, check_data
    from cgc.runtime.trainer import train as run_training

    artifact.require_weights(artifact.manifest["source"])
    check_data(artifact, data)
    from cgc.tools.report import trained_line

    click.echo(trained_line(artifact, chosen))
    with contextlib.ExitStack() as stack:
        on_step = step_reporter(stack, loop.steps, terminal(), click.echo)
        traced = TRACED_STEPS if trace else 0
        result = run_training(
            artifact, data, loop, model_dir, on_step, warn, evaluation, traced, backend
        )
    if trace:
        from cgc.runtime.trace import trace_json

        write_file(trace, trace_json(result.spans).encode())
        if loop.steps > TRACED_STEPS:
            click.echo(f"trace: the first {TRACED_STEPS} steps of this run (every step is alike)")
    final = f"final loss {result.metrics[-1]['loss']:.6f}; " if result.metrics else ""
    click.echo(f"{final}wrote {model_dir}/metrics.jsonl and {model_dir}/weights.safetensors")


@click.command()
@click.argument("model")
@click.option(
    "--num-csx",
    "systems",
    help="Cluster sizes to simulate, comma-separated  [default: 1,2,4,...,64; 1 with --sparsity]",
)
@click.option("--per-system-batch", type=int, help="A fixed batch per system (weak scaling).")
@click.option(
    "--global-batch",
    type=int,
    help="A fixed global batch split over the systems  [default: the model's batch]",
)
@optimizer_choice
@target_options
@plan_options
@click.option("--json", "json_path", type=click.Path(), help="Write the table as JSON here.")
@click.option("--csv", "csv_path", type=click.Path(), help="Write the table as CSV here.")
@click.option("--png", "png_path", type=click.Path(), help="Draw throughput and efficiency here.")
@sparsity_levels_options
@record_options(SparsityOptions, "seed")
def scale(
    model,
    systems,
    per_system_batch,
    global_batch,
    optimizer,
    target,
    mesh,
    figures,
    micro_batch_size,
    recompute,
    no_weights,
    init_seed,
    json_path,
    csv_path,
    png_path,
    levels,
    sparse_params,
    sparsity_init,
    seed,
) -> None:
    """Simulate a training step of MODEL on clusters of every size in --num-csx (timing only)
    and tabulate throughput, speed-up, efficiency and what bounds each; with --sparsity, the
    step at every sparsity level against the dense one, and what stops each layer gaining."""
    from cgc.compiler.sources import ParamsSource, source_of
    from cgc.compiler.training import training_options
    from cgc.tools import scaling, sparsity_study

    model_argument(model, "MODEL")
    check_outputs(
        {"--json": json_path, "--csv": csv_path, "--png": png_path}, {"MODEL": model_file(model)}
    )
    if levels is None and (sparse_params or sparsity_init != "random"):
        raise CgcError("--sparse-params and --sparsity-init need --sparsity")
    default = "1" if levels is not None else "1,2,4,8,16,32,64"
    sizes = _sizes(systems if systems is not None else default)
    source = source_of(model, no_weights=no_weights, training=True, init_seed=init_seed)
    params = source.params if isinstance(source, ParamsSource) else None
    chosen = targeted(target, mesh, figures)
    if per_system_batch is None and global_batch is None:
        skipped = scaling.model_batch_sizes(sizes, source.batch_size)[1]
        if skipped:
            left_out = ", ".join(map(str, skipped))
            warn(
                f"the model's batch of {source.batch_size} does not split evenly over "
                f"{left_out} systems: left out (give --global-batch or --per-system-batch)"
            )
    training = training_options(params, optimizer)
    clusters = scaling.Clusters(
        tuple(sizes), per_system_batch, global_batch, micro_batch_size, recompute
    )
    if levels is None:
        study: Any = scaling
        points: Any = scaling.study(source, chosen, training, clusters)
    else:
        study = sparsity_study
        sparse = SparsityOptions(
            sparse_params=tuple(sparse_params), sparsity_init=sparsity_init, seed=seed
        )
        points = sparsity_study.sparsity_study(
            source, chosen, training, _levels(levels), clusters, sparse
        )
    click.echo(study.table_text(points, chosen), nl=False)
    if json_path is not None:
        text = json.dumps(study.to_json(points, chosen, source.name), indent=1)
        write_file(json_path, text.encode())
    if csv_path is not None:
        write_file(csv_path, study.to_csv(points).encode())
    if png_path is not None:
        study.save_png(points, Path(png_path), f"{source.name} on {chosen.name}")
        click.echo(f"wrote {png_path}")


def _comma_list(text: str, option: str, example: str, parse: Callable[[str], Any]) -> list:
    """The values of a comma-separated option, each parsed by ``parse`` (a ValueError for one
    it cannot read, a CgcError of its own for one out of range): none empty, none twice."""
    values = []
    for part in text.split(","):
        try:
            value = parse(part.strip())
        except ValueError:
            raise CgcError(f"{option} {text}: expected {example}, got {part.strip()!r}") from None
        if value in values:
            raise CgcError(f"{option} {text}: {part.strip()} is given twice")
        values.append(value)
    return values


def _level(part: str) -> float:
    level = float(part)
    if not 0 <= level < 1:
        raise ValueError(part)
    return level


def _levels(text: str) -> list[float]:
    return _comma_list(text, "--sparsity", "fractions of zeros in [0, 1) such as 0,0.5,0.9", _level)


def _size(part: str) -> int:
    from cgc.machine.hardware.target import checked_systems

    return checked_systems(int(part))


def _sizes(text: str) -> list[int]:
    return _comma_list(text, "--num-csx", "sizes such as 1,2,4,8", _size)
