"""The ``cgc`` command line.

Exit codes: 0 success; 2 a problem with the user's input (one line on stderr naming the
culprit); 1 an internal error (a traceback only with ``--debug``). ``run``, ``inspect`` and
``train``'s training loop import neither xDSL nor the compiler; ``compile``, ``train`` and
``opt`` import them when they start.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import click
import numpy as np

from cgc.cli_options import (
    chosen_settings,
    dynamic_sparsity_options,
    executor_options,
    optimizer_choice,
    optimizer_options,
    plan_options,
    sparsity_levels_options,
    sparsity_options,
    target_options,
    weights_options,
)
from cgc.cli_sweep import sweep
from cgc.errors import CgcError, CgcWarning
from cgc.files import DirectoryLock, close_pipes, npz_bytes
from cgc.machine.training.optimizers import KEYWORDS
from cgc.tools.paths import (
    Named,
    distinct_files,
    input_file,
    input_text,
    load_npz,
    model_argument,
    model_dir_files,
    model_file,
    not_dumped_over,
    output_directory,
    output_file,
)
from cgc.tools.progress import step_reporter, steps_bar

if TYPE_CHECKING:
    from cgc.runtime.executors import Backend

_SHAPE = re.compile(r"([^=]+)=(\d+(?:x\d+)*)")
_MESH = re.compile(r"(\d+)x(\d+)")


def one_line(message: str) -> str:
    """``message`` with its line breaks written as escapes: names taken from a user's file
    may hold them, and an error is one line."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` for the command line: cgc's own warnings as one line each
    (the filters let no other through: torch's deprecations and numpy's overflow in a
    diverging run are noise around the lines that matter, shown only with --debug)."""
    _warn(str(message))


class Application(click.Group):
    """Turns exceptions into the documented exit codes, and warnings into ``warning:``
    lines."""

    def invoke(self, ctx: click.Context):
        ctx.call_on_close(close_pipes)  # FIFOs a door opened and no output went to: end them
        with warnings.catch_warnings():
            if not ctx.params.get("debug"):
                warnings.simplefilter("ignore")
                warnings.simplefilter("always", CgcWarning)
                warnings.showwarning = _show_warning
            return self._invoke(ctx)

    def _invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CgcError as e:
            click.echo(f"error: {one_line(str(e))}", err=True)
            sys.exit(2)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Exception as e:  # an internal error: say so, with the trace on request
            if ctx.obj and ctx.obj.get("debug"):
                traceback.print_exc()
            else:
                click.echo(
                    f"internal error: {type(e).__name__}: {e} (rerun with --debug)", err=True
                )
            sys.exit(1)


@click.group(cls=Application)
@click.version_option(package_name="cgc")
@click.option("--debug", is_flag=True, help="Show Python tracebacks of internal errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """cgc: compile models for a wafer-scale engine and run them on its simulator."""
    ctx.obj = {"debug": debug}


main.add_command(sweep)


def _shapes(values: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for value in values:
        match = _SHAPE.fullmatch(value)
        if match is None:
            raise CgcError(f"--shape {value}: expected NAME=D0xD1..., e.g. x=8x3x32x32")
        shapes[match[1]] = tuple(int(d) for d in match[2].split("x"))
    return shapes


def _target_name(target: str, mesh: str | None) -> str:
    if mesh is None:
        return target
    if _MESH.fullmatch(mesh) is None:
        raise CgcError(f"--mesh {mesh}: expected ROWSxCOLS, e.g. 16x16")
    return f"{target}@{mesh}"


def _torch_factory(spec: str):
    """The program of a PyTorch module that ``file.py:factory`` makes."""
    try:
        from cgc.frontends.torch import FACTORY, from_factory
    except ImportError:
        raise CgcError(f"{spec}: a PyTorch model needs torch: pip install cgc[torch]") from None
    if not FACTORY.match(spec):
        raise CgcError(f"{spec}: expected file.py:factory, a function that returns a module")
    return from_factory(spec)


def _write_atomically(path: str, data: bytes | Iterable[bytes]) -> None:
    from cgc.files import write_atomically

    write_atomically(path, data)


def _outputs(
    paths: dict[str, str | None],
    inputs: dict[str, str | None],
    files: Iterable[Named] = (),
    trees: Iterable[Named] = (),
) -> None:
    """Checks the output files of ``paths`` (option -> path, if given) before any work, and
    that none of them, nor of ``files`` (what an output directory gets), is one of the files
    ``inputs`` names or another output, nor replaces one of ``trees`` holding an input
    (``distinct_files``)."""
    for option, path in paths.items():
        if path is not None:
            output_file(path, option)
    distinct_files(inputs.items(), [*paths.items(), *files], trees)


def _targeted(target: str, mesh: str | None, figures: tuple[str, ...]):
    """The target named by ``--target``/``--mesh`` with ``--set`` figures changed."""
    from cgc.machine.hardware.target import get_target, with_figures

    chosen = get_target(_target_name(target, mesh))
    return with_figures(chosen, figures) if figures else chosen


@main.command()
@click.argument("model")
@click.option("-o", "--output", required=True, help="Artifact file to write.")
@click.option(
    "--mode",
    type=click.Choice(["pipelined", "weight_streaming", "auto"]),
    default="auto",
    show_default=True,
    help="Execution mode; auto picks pipelined when the model fits in SRAM.",
)
@target_options
@click.option("--batch-size", type=int, help="Global batch: the leading dim of every input.")
@click.option("--shape", "shapes", multiple=True, help="NAME=D0xD1...: an input's shape.")
@click.option("--num-csx", type=int, help="Systems to split over  [default: the model's, or 1]")
@plan_options
@sparsity_options
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the masks.")
@weights_options
@click.option("--dump-ir", type=click.Path(), help="Write the IR after every pass here.")
@click.option("--print-ir-after-all", is_flag=True, help="Print the IR after every pass.")
def compile(
    model,
    output,
    mode,
    target,
    mesh,
    figures,
    batch_size,
    shapes,
    num_csx,
    micro_batch_size,
    recompute,
    no_weights,
    init_seed,
    dump_ir,
    print_ir_after_all,
    **sparse,
) -> None:
    """Compile MODEL (an .onnx file, a params .yaml file, zoo:NAME, or file.py:factory, a
    function that returns a PyTorch module and its example inputs) into an artifact."""
    from cgc.compiler.driver import compile_model
    from cgc.machine.hardware.units import human_bytes
    from cgc.machine.sparse.sparsity import Sparsity
    from cgc.tools.report import summary_text

    model = model_argument(model, "MODEL")
    inputs = {"MODEL": model_file(model), "--weights": sparse["weights_path"]}
    _outputs({"-o": output}, inputs)
    weights = None if sparse["weights_path"] is None else _safetensors(sparse["weights_path"])
    if dump_ir is not None:
        output_directory(dump_ir, "--dump-ir")
        not_dumped_over(inputs, dump_ir)
    if re.search(r"\.py(:[^/\\]*)?$", model):
        model = _torch_factory(model)
    echo = (lambda text: click.echo(text, err=True)) if print_ir_after_all else None
    with contextlib.ExitStack() as stack:
        # the IR printed after every pass is progress enough, and would break the bar's line
        terminal = None if print_ir_after_all else _terminal()
        on_pass = steps_bar(stack, "compile", terminal, estimates=False)
        artifact = compile_model(
            model,
            mode=mode,
            target=_targeted(target, mesh, figures),
            batch_size=batch_size,
            shapes=_shapes(shapes),
            num_csx=num_csx,
            dump_ir=dump_ir,
            print_ir_after_all=echo,
            no_weights=no_weights,
            micro_batch_size=micro_batch_size,
            recompute=recompute,
            init_seed=init_seed,
            sparsity=Sparsity.of(
                sparse["sparsity"], sparse["sparse_params"], sparse["sparsity_init"], sparse["seed"]
            ),
            detect_sparsity=sparse["detect_sparsity"],
            weights=weights,
            on_pass=on_pass,
        )
    data = artifact.to_bytes()
    _write_atomically(output, data)
    click.echo(summary_text(artifact), nl=False)
    click.echo(f"wrote {output} ({human_bytes(len(data))})")


@main.command()
@click.argument("artifact")
@click.option("--inputs", "inputs_path", help=".npz with one array per input.")
@click.option("--output", "output_path", help=".npz to write, one array per output.")
@click.option("--num-csx", type=int, help="Systems to run on (default: as compiled).")
@click.option(
    "--timing-only",
    is_flag=True,
    help="Simulate the time alone: no numbers, no inputs needed (one global batch).",
)
@click.option(
    "--set",
    "figures",
    multiple=True,
    metavar="FIGURE=VALUE",
    help="Change a figure of the artifact's target that does not shape the program.",
)
@click.option("--stats-json", type=click.Path(), help="Write the run's statistics here.")
@click.option("--trace", type=click.Path(), help="Write a Chrome trace (Perfetto) here.")
@executor_options
def run(
    artifact, inputs_path, output_path, num_csx, timing_only, figures, stats_json, trace, **where
) -> None:
    """Run ARTIFACT on the simulator."""
    from cgc.machine.program.artifact import Artifact
    from cgc.machine.timing.run_stats import Simulation
    from cgc.runtime.launch import open_cluster
    from cgc.runtime.trace import trace_json
    from cgc.tools.report import has_batch_axis, simulation_json, simulation_text

    model_argument(artifact, "ARTIFACT")
    _outputs(
        {"--output": output_path, "--stats-json": stats_json, "--trace": trace},
        {"ARTIFACT": artifact, "--inputs": inputs_path},
    )
    if timing_only and output_path is not None:
        raise CgcError("--output: a timing-only run computes no outputs")
    if not timing_only and inputs_path is None:
        raise CgcError("--inputs is required (or --timing-only)")
    inputs = load_npz(inputs_path, "--inputs") if inputs_path is not None else None
    art = Artifact.load(artifact)
    _retarget(art, figures)
    if not timing_only:
        art.require_weights(artifact)
    with contextlib.ExitStack() as stack:
        on_step = steps_bar(stack, "run", _terminal())
        cluster = stack.enter_context(open_cluster(art, num_csx, not timing_only, _backend(where)))
        outputs, stats = cluster.infer(inputs, on_step)
    if output_path is not None:
        _write_atomically(output_path, npz_bytes(outputs))
    report = stats.to_json()
    if stats_json:
        if timing_only:
            report = simulation_json(Simulation(stats, 1, False, cluster.target), art.program)
        _write_atomically(stats_json, json.dumps(report, indent=1).encode())
    if trace:
        _write_atomically(trace, trace_json(stats.spans).encode())
    if timing_only:
        simulation = Simulation(stats, 1, False, cluster.target)
        batched = has_batch_axis(art.manifest)
        click.echo(simulation_text(simulation, batched=batched, program=art.program), nl=False)
    else:
        from cgc.tools.report import run_lines

        for line in run_lines(outputs, stats, has_batch_axis(art.manifest)):
            click.echo(line)


PROGRAM_FIGURES = ("rows", "cols", "sram_bytes_per_pe", "colors")
"""Figures of a target that shaped a compiled program: changing them needs a new compile."""


def _retarget(art, figures: tuple[str, ...]) -> None:
    """Changes figures of an artifact's target that do not shape its program (``--set``)."""
    from cgc.machine.hardware.target import Target, with_figures

    if not figures:
        return
    for figure in figures:
        if figure.partition("=")[0].strip() in PROGRAM_FIGURES:
            raise CgcError(
                f"--set {figure}: the compiled program depends on it; compile again with --set"
            )
    target = with_figures(Target.from_json(art.manifest["target"]), figures)
    art.manifest["target"] = target.to_json()


@main.command()
@click.argument("model")
@click.option("--data", "data_path", help=".npz: one array per model input.")
@click.option("--batch-size", type=int, help="Global batch per step  [default: the model's]")
@click.option("--steps", type=int, required=True, help="Training steps.")
@click.option("--model-dir", type=click.Path(), help="Where metrics and weights go.")
@click.option(
    "--timing-only",
    is_flag=True,
    help="Simulate the steps' time alone: no data, no weights needed, nothing trained.",
)
@optimizer_choice
@optimizer_options
@click.option(
    "--lr-schedule",
    type=click.Choice(["constant", "cosine", "step"]),
    default="constant",
    show_default=True,
    help="After the warm-up: constant, cosine decay towards 0 at --steps, or step decay.",
)
@click.option("--warmup-steps", type=int, default=0, show_default=True, help="Linear warm-up.")
@click.option("--lr-step-size", type=int, default=1, show_default=True, help="Step decay period.")
@click.option("--lr-gamma", type=float, default=0.1, show_default=True, help="Step decay factor.")
@click.option("--max-grad-norm", type=float, help="Clip the gradients' global norm to this.")
@click.option(
    "--checkpoint-every", type=int, default=0, help="Checkpoint to DIR/checkpoints every N steps."
)
@click.option("--resume", is_flag=True, help="Continue from the newest good checkpoint.")
@click.option("--shuffle", is_flag=True, help="Shuffle the samples of every epoch.")
@click.option("--trace", type=click.Path(), help="Write the steps' Chrome trace (Perfetto) here.")
@click.option("--stats-json", type=click.Path(), help="Timing-only: write a step's statistics.")
@click.option("--eval-data", "eval_path", help=".npz of held-out samples; its loss is logged.")
@click.option("--eval-every", type=int, help="Measure the held-out loss every N steps.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the shuffling.")
@click.option(
    "--allow-nonfinite",
    is_flag=True,
    help="Train on through a NaN or infinite loss or gradient (else the run stops there).",
)
@click.option("--num-csx", type=int, help="Systems  [default: the params file's, or 1]")
@click.option("--swarmx-fanout", type=int, help="Children per SwarmX node  [default: 4]")
@click.option(
    "--trainable",
    multiple=True,
    help="Regex over initializer names to train (repeatable)  [default: an ONNX model's "
    "parameters, not its exporter's constants]",
)
@click.option("--frozen", multiple=True, help="Regex over initializer names never trained.")
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
    _outputs({"--trace": trace, "--stats-json": stats_json}, inputs, files, trees)
    backend = _backend(options)
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
    target = _targeted(options.pop("target"), options.pop("mesh"), options.pop("figures"))
    settings = {k: options.pop(k) for k in list(options) if k in KEYWORDS}
    weights_path = options.pop("weights_path")
    artifact, loop, evaluation = cgc.prepare_training(
        model,
        steps=steps,
        eval_data=held_out,
        target=target,
        weights=None if weights_path is None else _safetensors(weights_path),
        **options,
        **chosen_settings(settings),
    )
    if timing_only:
        from cgc.tools.timing_only import simulate_training

        simulate_training(artifact, steps, model_dir, trace, stats_json)
    else:
        assert data is not None
        chosen = bool(options["trainable"])
        _train(artifact, data, loop, model_dir, evaluation, trace, chosen, backend)


def _backend(options: dict) -> Backend:
    """The executor the options name (taken out of ``options``)."""
    from cgc.runtime.executors import Backend

    keys = ("executor", "ray_address", "ray_placement")
    return Backend(*(options.pop(key) for key in keys))


def _train(artifact, data, loop, model_dir: str, evaluation, trace, chosen: bool, backend: Backend):
    """Runs the training loop with numbers and reports it."""
    from cgc.runtime.trainer import TRACED_STEPS, check_data
    from cgc.runtime.trainer import train as run_training

    artifact.require_weights(artifact.manifest["source"])
    check_data(artifact, data)
    from cgc.tools.report import trained_line

    click.echo(trained_line(artifact, chosen))
    with contextlib.ExitStack() as stack:
        on_step = step_reporter(stack, loop.steps, _terminal(), click.echo)
        traced = TRACED_STEPS if trace else 0
        result = run_training(
            artifact, data, loop, model_dir, on_step, _warn, evaluation, traced, backend
        )
    if trace:
        from cgc.runtime.trace import trace_json

        _write_atomically(trace, trace_json(result.spans).encode())
        if loop.steps > TRACED_STEPS:
            click.echo(f"trace: the first {TRACED_STEPS} steps of this run (every step is alike)")
    final = f"final loss {result.metrics[-1]['loss']:.6f}; " if result.metrics else ""
    click.echo(f"{final}wrote {model_dir}/metrics.jsonl and {model_dir}/weights.safetensors")


def _terminal() -> TextIO | None:
    """Standard output if it is a terminal (a progress bar's place)."""
    return sys.stdout if sys.stdout.isatty() else None


def _warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


@main.command()
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
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the masks.")
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
    from cgc.compiler.driver import training_options
    from cgc.compiler.sources import ParamsSource, source_of
    from cgc.tools import scaling, sparsity_study

    model_argument(model, "MODEL")
    _outputs(
        {"--json": json_path, "--csv": csv_path, "--png": png_path}, {"MODEL": model_file(model)}
    )
    if levels is None and (sparse_params or sparsity_init != "random"):
        raise CgcError("--sparse-params and --sparsity-init need --sparsity")
    default = "1" if levels is not None else "1,2,4,8,16,32,64"
    sizes = _sizes(systems if systems is not None else default)
    source = source_of(model, no_weights=no_weights, training=True, init_seed=init_seed)
    params = source.params if isinstance(source, ParamsSource) else None
    chosen = _targeted(target, mesh, figures)
    if per_system_batch is None and global_batch is None:
        skipped = scaling.model_batch_sizes(sizes, source.batch_size)[1]
        if skipped:
            left_out = ", ".join(map(str, skipped))
            _warn(
                f"the model's batch of {source.batch_size} does not split evenly over "
                f"{left_out} systems: left out (give --global-batch or --per-system-batch)"
            )
    training = training_options(params, optimizer)
    batches = (per_system_batch, global_batch, micro_batch_size, recompute)
    if levels is None:
        study: Any = scaling
        points: Any = scaling.study(source, chosen, training, sizes, *batches)
    else:
        study = sparsity_study
        points = sparsity_study.sparsity_study(
            source, chosen, training, _levels(levels), sizes, *batches,
            sparse_params, sparsity_init, seed,
        )  # fmt: skip
    click.echo(study.table_text(points, chosen), nl=False)
    if json_path is not None:
        text = json.dumps(study.to_json(points, chosen, source.name), indent=1)
        _write_atomically(json_path, text.encode())
    if csv_path is not None:
        _write_atomically(csv_path, study.to_csv(points).encode())
    if png_path is not None:
        study.save_png(points, Path(png_path), f"{source.name} on {chosen.name}")
        click.echo(f"wrote {png_path}")


def _is_params(spec: str) -> bool:
    from cgc.frontends.params import is_params_source

    return is_params_source(spec)


def _safetensors(path: str) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file (``--weights``)."""
    from cgc.machine.program.artifact import weights_from_bytes

    try:
        return weights_from_bytes(input_file(path, "--weights").read_bytes())
    except ValueError as e:
        raise CgcError(f"--weights {path}: {e}") from None


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


@main.command()
@click.argument("artifact")
@click.option("--disasm", is_flag=True, help="Also print the disassembled bytecode.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead.")
@click.option("--ir", is_flag=True, help="Also print the final IR.")
@click.option(
    "--placement",
    help="Draw the pipelined placement: a PNG file, or - for a map in the terminal.",
)
def inspect(artifact, disasm, as_json, ir, placement) -> None:
    """Show what ARTIFACT holds: manifest, placement (and where the compute bound goes) or
    stream schedule, bytecode. A params file or zoo:NAME is compiled for its training run
    first (weights declared, timing only)."""
    from cgc.machine.program.artifact import Artifact
    from cgc.tools.report import inspect_json, summary_text

    model_argument(artifact, "ARTIFACT")
    drawn = placement if placement != "-" else None  # "-": the terminal
    _outputs({"--placement": drawn}, {"ARTIFACT": model_file(artifact)})
    # reading an artifact imports no compiler: only other names may be params files
    if not artifact.endswith(".cgc") and _is_params(artifact):
        import cgc

        art = cgc.prepare_training(artifact)[0]
    else:
        art = Artifact.load(artifact)
    if placement is not None:
        _draw_placement(art, artifact, placement)
        return
    if as_json:
        click.echo(json.dumps(inspect_json(art), indent=1))
        return
    click.echo(summary_text(art), nl=False)
    if ir:
        click.echo("final IR:\n" + art.ir, nl=False)
    if disasm:
        click.echo("bytecode:\n" + art.program.disassemble(), nl=False)


def _draw_placement(art, path: str, where: str) -> None:
    from cgc.tools import picture

    if art.manifest["mode"] != "pipelined":
        raise CgcError(
            f"--placement: {path} is a {art.manifest['mode']} artifact, whose layers each run "
            "on the whole wafer in turn; compile with --mode pipelined to place them"
        )
    if where == "-":
        click.echo(picture.ascii_map(art), nl=False)
        return
    picture.save_png(art, Path(where))
    click.echo(f"wrote {where}")


@main.command()
@click.argument("file", type=click.Path())
@click.option("-p", "--pipeline", default="", help="Passes to run, e.g. 'decompose,form-layers'.")
@click.option("-o", "--output", help="Write the result here instead of stdout.")
@click.option("--target", help="Record this target in the module first (wse2, wse3, meshRxC).")
@click.option("--mesh", help="With --target: its mesh resized to ROWSxCOLS.")
@click.option(
    "--split-input-file", is_flag=True, help="Take each part between '// -----' lines alone."
)
@click.option(
    "--verify-diagnostics",
    is_flag=True,
    help="Print every error as output and go on (exit 0): for tests that check the messages.",
)
def opt(file, pipeline, output, target, mesh, split_input_file, verify_diagnostics) -> None:
    """Parse FILE.mlir, run cgc passes over it and print the result."""
    from cgc.machine.hardware.target import get_target
    from cgc.tools.opt_main import optimized

    if mesh is not None and target is None:
        raise CgcError("--mesh needs --target")
    _outputs({"-o": output}, {"FILE": file})
    chosen = get_target(_target_name(target, mesh)) if target is not None else None
    text = input_text(file, "FILE")
    result = optimized(text, file, pipeline, chosen, split_input_file, verify_diagnostics)
    if output is not None:
        _write_atomically(output, result.encode())
    else:
        click.echo(result, nl=False)
