"""``cgc sweep SPEC.yaml``: a design study, every point of a grid of models, targets,
overrides, modes, sparsity levels, batches (or a generation's prompt lengths, new tokens and
sequences at once) and cluster sizes compiled and simulated on shapes as an independent task,
locally or on Ray (``cgc.sweep``)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

import click

from cgc.runtime.executors import EXECUTORS, LOCAL
from cgc.tools.paths import distinct_files, model_file, output_directory


@click.command()
@click.argument("spec")
@click.option(
    "-o",
    "--output",
    "directory",
    required=True,
    help="Directory of the table, the plot and the journal a re-run resumes from.",
)
@click.option(
    "--executor",
    type=click.Choice(EXECUTORS),
    default=LOCAL,
    show_default=True,
    help="local: this machine's processes; ray: Ray tasks.",
)
@click.option(
    "--jobs",
    type=int,
    help="Points at once (local), or the CPUs of a local Ray instance (not with "
    "--ray-address: a cluster's CPUs are its own)  [default: the CPUs]",
)
@click.option("--ray-address", help="The Ray cluster to run on, e.g. auto or ray://HOST:10001.")
def sweep(spec: str, directory: str, executor: str, jobs: int | None, ray_address: str | None):
    """Simulate every point of the grid in SPEC (a YAML file; see cgc.sweep), timing
    only, and write DIR/sweep.csv, DIR/sweep.json and DIR/scaling.png. A re-run with the same
    DIR computes only the points not finished yet."""
    from cgc.files import LOCK
    from cgc.sweep import JOURNAL, checked_options, run_sweep
    from cgc.sweep_spec import load_spec
    from cgc.sweep_table import OUTPUTS, table_text

    checked_options(executor, jobs, ray_address)
    output_directory(directory, "-o")
    chosen = load_spec(spec)
    models = [("models:", model_file(source)) for source in chosen.sources]
    written = [("-o", str(Path(directory, name))) for name in (JOURNAL, *OUTPUTS, LOCK)]
    distinct_files([("SPEC", spec), *models], written)
    with contextlib.ExitStack() as stack:
        shown = _progress(stack, len(chosen.points()))
        outcome = run_sweep(chosen, directory, executor, jobs, ray_address, shown)
    click.echo(table_text(outcome.rows, chosen.measure), nl=False)
    failed = sum(row["error"] is not None for row in outcome.rows)
    click.echo(
        f"{outcome.ran} points simulated, {outcome.skipped} found in {directory} (skipped), "
        f"{failed} failed"
    )
    click.echo(f"wrote {', '.join(map(str, outcome.files))}")


def _progress(stack: contextlib.ExitStack, total: int) -> Callable[[int, int, dict], None]:
    """A bar on a terminal, a line per point otherwise."""
    if not sys.stdout.isatty():
        return _log
    from cgc.sweep_table import SweepBar

    bar = SweepBar(total, sys.stdout)
    stack.callback(bar.close)
    errors = 0

    def draw(done: int, _total: int, row: dict) -> None:
        nonlocal errors
        errors += row["error"] is not None
        bar({"step": done, "errors": errors})

    return draw


def _log(done: int, total: int, row: dict) -> None:
    from cgc.sweep_table import THROUGHPUT, unit

    rate = THROUGHPUT[row["measure"]]
    what = f"error: {row['error']}" if row["error"] else f"{row[rate]:.4g} {unit(rate)}"
    click.echo(f"point {done}/{total} ({row['model']}, {row['num_csx']} systems): {what}")
