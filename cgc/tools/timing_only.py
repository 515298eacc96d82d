"""What ``cgc train --timing-only`` does after compiling: simulate the steps on shapes alone,
report them, and write the trace, the statistics and ``DIR/timing.jsonl``; and the training
options such a run refuses."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cgc.errors import CgcError
from cgc.files import DirectoryLock, remove_stale_temporaries, write_atomically
from cgc.runtime.simulation import check_steps, simulate
from cgc.runtime.trace import trace_json
from cgc.runtime.trainer import TRACED_STEPS
from cgc.tools.report import has_batch_axis, simulation_json, simulation_text


def simulate_training(
    artifact, steps: int, model_dir: str | None, trace: str | None, stats_json: str | None
) -> None:
    """Times ``steps`` training steps on shapes alone, and reports them as ``cgc run
    --timing-only`` does: with each layer's MFU and what binds it, in the text and (under
    ``utilization``) in ``stats_json``."""
    simulation = simulate(artifact, steps=steps)
    batched = has_batch_axis(artifact.manifest)
    click.echo(simulation_text(simulation, batched=batched, program=artifact.program), nl=False)
    if stats_json:
        report = simulation_json(simulation, artifact.program)
        write_atomically(stats_json, json.dumps(report, indent=1).encode())
    if trace:
        write_atomically(trace, trace_json(simulation.spans(TRACED_STEPS)).encode())
        if steps > TRACED_STEPS:
            click.echo(f"trace: the first {TRACED_STEPS} of {steps} steps (every step is alike)")
    if model_dir:
        _write_simulated_metrics(Path(model_dir), simulation)


TRAINING_ONLY = {
    "eval_path": "--eval-data",
    "eval_every": "--eval-every",
    "checkpoint_every": "--checkpoint-every",
    "resume": "--resume",
    "shuffle": "--shuffle",
}
"""The options of ``cgc train`` that only a training with numbers uses."""


def check_options(steps: int, data_path: str | None, options: dict) -> None:
    """A CgcError unless a timing-only run can simulate ``steps`` steps and was given none of
    the options of a training with numbers (checked before compiling)."""
    check_steps(steps)
    given = ["--data"] if data_path else []
    given += [flag for key, flag in TRAINING_ONLY.items() if options.get(key)]
    if given:
        raise CgcError(f"--timing-only trains nothing: it takes no {', '.join(given)}")


def _write_simulated_metrics(directory: Path, simulation) -> None:
    """``timing.jsonl`` of a timing-only run: every step's simulated figures (a training's
    ``metrics.jsonl`` in the same directory stays as it is)."""
    stats = simulation.stats
    figures = {
        "simulated_seconds": stats.simulated_seconds,
        "samples_per_second": stats.samples_per_second,
        "tokens_per_second": stats.tokens_per_second,
        "mfu": stats.mfu,
    }
    # every step's line is the same but for its number, and there can be a million
    rest = json.dumps(figures)[1:]
    lines = (f'{{"step": {step}, {rest}\n'.encode() for step in range(1, simulation.steps + 1))
    with DirectoryLock(directory, f"--model-dir {directory}"):
        remove_stale_temporaries(directory, ["timing.jsonl"])  # a killed run's half-written file
        write_atomically(str(directory / "timing.jsonl"), lines)
    click.echo(f"wrote {directory}/timing.jsonl")
