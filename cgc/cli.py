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
from pathlib import Path

import click

from cgc.cli_generate import generate
from cgc.cli_io import check_outputs, read_safetensors, terminal, warn, write_file
from cgc.cli_options import (
    chosen_backend,
    chosen_records,
    executor_options,
    plan_options,
    record_options,
    sparsity_options,
    target_name,
    target_options,
    targeted,
    weights_options,
)
from cgc.cli_sweep import sweep
from cgc.cli_train import scale, train
from cgc.errors import CgcError, CgcWarning
from cgc.files import close_pipes, npz_bytes
from cgc.options import CompileOptions, SimulationOptions, SparsityOptions, flag
from cgc.tools.paths import (
    input_text,
    load_npz,
    model_argument,
    model_file,
    not_dumped_over,
    output_directory,
)
from cgc.tools.progress import steps_bar

_SHAPE = re.compile(r"([^=]+)=(\d+(?:x\d+)*)")


def one_line(message: str) -> str:
    """``message`` with its line breaks written as escapes: names taken from a user's file
    may hold them, and an error is one line."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` for the command line: cgc's own warnings as one line each
    (the filters let no other through: torch's deprecations and numpy's overflow in a
    diverging run are noise around the lines that matter, shown only with --debug)."""
    warn(str(message))


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
        except CgcError as e:  # an error about options names them by their flags here
            text = e.worded(flag)
            click.echo(f"error: {one_line(text)}", err=True)
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


for command in (sweep, train, scale, generate):
    main.add_command(command)


def _shapes(values: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for value in values:
        match = _SHAPE.fullmatch(value)
        if match is None:
            raise CgcError(f"--shape {value}: expected NAME=D0xD1..., e.g. x=8x3x32x32")
        shapes[match[1]] = tuple(int(d) for d in match[2].split("x"))
    return shapes


def _torch_factory(spec: str):
    """The program of a PyTorch module that ``file.py:factory`` makes."""
    try:
        from cgc.frontends.torch import FACTORY, from_factory
    except ImportError:
        raise CgcError(f"{spec}: a PyTorch model needs torch: pip install cgc[torch]") from None
    if not FACTORY.match(spec):
        raise CgcError(f"{spec}: expected file.py:factory, a function that returns a module")
    return from_factory(spec)


@main.command()
@click.argument("model")
@click.option("-o", "--output", required=True, help="Artifact file to write.")
@record_options(CompileOptions, "mode")
@target_options
@record_options(CompileOptions, "batch_size")
@click.option("--shape", "shapes", multiple=True, help="NAME=D0xD1...: an input's shape.")
@record_options(CompileOptions, "num_csx")
@plan_options
@sparsity_options
@record_options(SparsityOptions, "seed")
@weights_options
@click.option("--dump-ir", type=click.Path(), help="Write the IR after every pass here.")
@click.option("--print-ir-after-all", is_flag=True, help="Print the IR after every pass.")
def compile(
    model,
    output,
    target,
    mesh,
    figures,
    shapes,
    weights_path,
    dump_ir,
    print_ir_after_all,
    **options,
) -> None:
    """Compile MODEL (an .onnx file, a params .yaml file, zoo:NAME, or file.py:factory, a
    function that returns a PyTorch module and its example inputs) into an artifact."""
    from cgc.compiler.driver import compile_model
    from cgc.machine.hardware.units import human_bytes
    from cgc.tools.report import summary_text

    model = model_argument(model, "MODEL")
    inputs = {"MODEL": model_file(model), "--weights": weights_path}
    check_outputs({"-o": output}, inputs)
    weights = None if weights_path is None else read_safetensors(weights_path)
    if dump_ir is not None:
        output_directory(dump_ir, "--dump-ir")
        not_dumped_over(inputs, dump_ir)
    if re.search(r"\.py(:[^/\\]*)?$", model):
        model = _torch_factory(model)
    echo = (lambda text: click.echo(text, err=True)) if print_ir_after_all else None
    options["target"] = targeted(target, mesh, figures)
    options["shapes"] = _shapes(shapes)
    chosen = chosen_records(options, CompileOptions, SparsityOptions)
    with contextlib.ExitStack() as stack:
        # the IR printed after every pass is progress enough, and would break the bar's line
        shown_on = None if print_ir_after_all else terminal()
        on_pass = steps_bar(stack, "compile", shown_on, estimates=False)
        artifact = compile_model(
            model,
            chosen[CompileOptions],
            chosen[SparsityOptions],
            weights=weights,
            dump_ir=dump_ir,
            print_ir_after_all=echo,
            on_pass=on_pass,
        )
    data = artifact.to_bytes()
    write_file(output, data)
    click.echo(summary_text(artifact), nl=False)
    click.echo(f"wrote {output} ({human_bytes(len(data))})")


@main.command()
@click.argument("artifact")
@click.option("--inputs", "inputs_path", help=".npz with one array per input.")
@click.option("--output", "output_path", help=".npz to write, one array per output.")
@record_options(SimulationOptions, "num_csx")
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
    check_outputs(
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
        on_step = steps_bar(stack, "run", terminal())
        opened = open_cluster(art, num_csx, not timing_only, chosen_backend(where))
        cluster = stack.enter_context(opened)
        outputs, stats = cluster.infer(inputs, on_step)
    if output_path is not None:
        write_file(output_path, npz_bytes(outputs))
    report = stats.to_json()
    if stats_json:
        if timing_only:
            report = simulation_json(Simulation(stats, 1, False, cluster.target), art.program)
        write_file(stats_json, json.dumps(report, indent=1).encode())
    if trace:
        write_file(trace, trace_json(stats.spans).encode())
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


def _is_params(spec: str) -> bool:
    from cgc.frontends.params import is_params_source

    return is_params_source(spec)


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
    check_outputs({"--placement": drawn}, {"ARTIFACT": model_file(artifact)})
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
    check_outputs({"-o": output}, {"FILE": file})
    chosen = get_target(target_name(target, mesh)) if target is not None else None
    text = input_text(file, "FILE")
    result = optimized(text, file, pipeline, chosen, split_input_file, verify_diagnostics)
    if output is not None:
        write_file(output, result.encode())
    else:
        click.echo(result, nl=False)
