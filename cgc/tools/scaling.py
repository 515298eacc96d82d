"""A scaling study: one model's training step on clusters of 1 to K systems, timing only.

For each cluster size the model is compiled for its per-system batch (the global batch split
over the systems, or a fixed batch per system), with the memory plan that fits it, and one
training step is simulated on shapes. The programs are built once for all sizes
(``StreamingCompiler(shared=True)``): sizes that share a micro-batch share a program, which
only the number of its runs per step and the SwarmX tree around it tell apart.

Throughput is samples per second; the speed-up of K systems is their throughput over one
system's with the same per-system batch policy, the efficiency the speed-up over K, and the
ideal line K times one system's throughput. The same study over levels of weight sparsity is
``cgc.tools.sparsity_study``.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cgc.compiler.driver import CompileRequest, StreamingCompiler
from cgc.compiler.sources import Source
from cgc.compiler.training import STREAMED_FOR_TRAINING, Training
from cgc.errors import CgcError
from cgc.machine.hardware.target import ASSUMED, Target, checked_systems
from cgc.machine.sparse.sparsity import Sparsity
from cgc.runtime.cluster import Cluster, Run


@dataclass(frozen=True)
class ScalingPoint:
    """One cluster size of a scaling study."""

    systems: int
    global_batch: int
    per_system_batch: int
    micro_batch: int
    micro_batches: int
    recompute: bool
    step_seconds: float
    samples_per_second: float
    tokens_per_second: float | None
    mfu: float
    bound: str
    speedup: float = 0.0
    """Throughput over one system's."""
    efficiency: float = 0.0
    """Speed-up over the systems."""
    ideal_samples_per_second: float = 0.0
    """The systems times one system's throughput."""


MOST_SIZES = 64
"""Most cluster sizes one sweep simulates: each compiles and simulates a step, seconds each."""


def per_system_batches(
    systems: Sequence[int], per_system_batch: int | None, global_batch: int | None
) -> list[int]:
    """The per-system batch of each cluster size: fixed, or the global batch split evenly."""
    if (per_system_batch is None) == (global_batch is None):
        raise CgcError("give one of --per-system-batch and --global-batch")
    sizes = ",".join(map(str, systems))
    if not systems or any(k < 1 for k in systems):
        raise CgcError(f"--num-csx {sizes}: every size must be >= 1")
    checked_systems(max(systems))
    repeated = [k for i, k in enumerate(systems) if k in systems[:i]]
    if repeated:
        raise CgcError(f"--num-csx {sizes}: {repeated[0]} is given twice")
    if len(systems) > MOST_SIZES:
        raise CgcError(f"--num-csx: {len(systems)} sizes, more than a sweep of {MOST_SIZES}")
    if per_system_batch is not None:
        if per_system_batch < 1:
            raise CgcError(f"--per-system-batch {per_system_batch}: must be at least 1")
        return [per_system_batch] * len(systems)
    assert global_batch is not None
    uneven = [k for k in systems if global_batch < 1 or global_batch % k]
    if uneven:
        raise CgcError(
            f"--global-batch {global_batch} does not split evenly over {uneven[0]} systems"
        )
    return [global_batch // k for k in systems]


def model_batch_sizes(systems: Sequence[int], batch: int | None) -> tuple[list[int], list[int]]:
    """The sizes the model's own global batch splits evenly over, and the others; no batch,
    or none splitting, is an error that says how to choose one."""
    if batch is None:
        raise CgcError(
            "the model has no batch of its own: give --global-batch or --per-system-batch"
        )
    even = [k for k in systems if k >= 1 and batch % k == 0]
    listed = ",".join(map(str, systems))
    if not even:
        raise CgcError(
            f"--num-csx {listed}: the model's batch of {batch} splits evenly over none of "
            "these sizes; give --global-batch or --per-system-batch"
        )
    return even, [k for k in systems if k not in even]


@dataclass(frozen=True)
class Clusters:
    """The clusters a study simulates a training step on, and the batch each runs."""

    systems: tuple[int, ...] = (1,)
    """Cluster sizes, in the order the study reports them."""
    per_system_batch: int | None = None
    """A fixed batch per system (weak scaling)."""
    global_batch: int | None = None
    """A fixed global batch split over the systems (strong scaling); neither: the model's,
    over the sizes it splits evenly over."""
    micro_batch_size: int | None = None
    """Fixes the memory plan's micro-batch (default: the largest that fits)."""
    recompute: bool | None = None
    """Fixes whether the plan recomputes activations (default: if faster)."""

    def batches(self, source: Source) -> tuple[list[int], list[int]]:
        """The sizes simulated and each one's per-system batch."""
        systems, global_batch = list(self.systems), self.global_batch
        if self.per_system_batch is None and global_batch is None:
            global_batch = source.batch_size
            systems = model_batch_sizes(systems, global_batch)[0]
        return systems, per_system_batches(systems, self.per_system_batch, global_batch)

    def request(self, source: Source, target: Target, training: Training, size: int,
                batch: int, sparsity: Sparsity | None = None) -> CompileRequest:  # fmt: skip
        """The compile request of one cluster of ``size`` systems at ``batch`` each."""
        return CompileRequest(
            source, target, size, batch, training, self.micro_batch_size, self.recompute, sparsity
        )


def study(
    source: Source, target: Target, training: Training, clusters: Clusters
) -> list[ScalingPoint]:
    """One timing-only training step per cluster size, in the order given, with speed-ups and
    efficiencies against one system (simulated too if 1 is not among the sizes)."""
    systems, batches = clusters.batches(source)
    compiler = StreamingCompiler(shared=True)
    timed: dict[int, list[Run]] = {}
    """Per program (by identity), its runs on shapes: one timing serves every size."""

    def point(k: int, batch: int) -> ScalingPoint:
        request = clusters.request(source, target, training, k, batch)
        artifact = compiler.artifact(request, STREAMED_FOR_TRAINING)
        key = id(artifact.program)
        cluster = Cluster(artifact, numerics=False, timed=timed.get(key))
        stats = cluster.train_step()[1]
        timed[key] = cluster.timed_runs
        plan = artifact.manifest["memory_plan"]
        return ScalingPoint(
            systems=k,
            global_batch=k * batch,
            per_system_batch=batch,
            micro_batch=plan["micro_batch"],
            micro_batches=plan["micro_batches"],
            recompute=plan["recompute"],
            step_seconds=stats.simulated_seconds,
            samples_per_second=stats.samples_per_second,
            tokens_per_second=stats.tokens_per_second,
            mfu=stats.mfu,
            bound=stats.bound or "compute",
        )

    points = [point(k, b) for k, b in zip(systems, batches, strict=True)]
    one = next((p for p in points if p.systems == 1), None)
    if one is None:
        fixed = clusters.per_system_batch is not None
        single = batches[0] if fixed else (clusters.global_batch or source.batch_size or 1)
        one = point(1, single)
    return [_relative(p, one) for p in points]


def _relative(p: ScalingPoint, one: ScalingPoint) -> ScalingPoint:
    speedup = p.samples_per_second / one.samples_per_second if one.samples_per_second else 0.0
    return ScalingPoint(
        **{
            **asdict(p),
            "speedup": speedup,
            "efficiency": speedup / p.systems,
            "ideal_samples_per_second": p.systems * one.samples_per_second,
        }
    )


COLUMNS = (
    ("systems", "systems", "{}"),
    ("step_seconds", "step (s)", "{:.4g}"),
    ("samples_per_second", "samples/s", "{:.4g}"),
    ("tokens_per_second", "tokens/s", "{:.4g}"),
    ("speedup", "speed-up", "{:.3f}"),
    ("efficiency", "efficiency", "{:.1%}"),
    ("mfu", "MFU", "{:.1%}"),
    ("micro_batches", "micro-batches", "{}"),
    ("bound", "bound", "{}"),
)


def cell(value: object, fmt: str) -> str:
    """A table's cell: ``value`` formatted, ``-`` for None."""
    return "-" if value is None else fmt.format(value)


def table_lines(
    headers: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int] = ()
) -> list[str]:
    """Columns two spaces apart, right-aligned but those numbered in ``left``."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def assumed_line(target: Target) -> str:
    """The unpublished figures of ``target`` a study rests on, as one line."""
    figures = target.to_json()
    assumed = ", ".join(f"{name} = {figures[name]:g}" for name in ASSUMED)
    return f"assumed (not published): {assumed}"


def study_json(target: Target, model: str) -> dict[str, Any]:
    """What the JSON of a study says of its model and target."""
    figures = target.to_json()
    return {
        "model": model,
        "target": figures,
        "assumed": {name: figures[name] for name in ASSUMED},
    }


def table_text(points: Sequence[ScalingPoint], target: Target) -> str:
    """The study as a table for people, with the assumptions it rests on."""
    rows = [[cell(getattr(p, key), fmt) for key, _, fmt in COLUMNS] for p in points]
    lines = table_lines([label for _, label, _ in COLUMNS], rows)
    return "\n".join([*lines, assumed_line(target)]) + "\n"


def to_json(points: Sequence[ScalingPoint], target: Target, model: str) -> dict[str, Any]:
    """The study as JSON."""
    return {**study_json(target, model), "points": [asdict(p) for p in points]}


def to_csv(points: Sequence[ScalingPoint]) -> str:
    """The study as CSV, one row per cluster size."""
    stream = io.StringIO()
    writer = csv.DictWriter(stream, fieldnames=list(asdict(points[0])), lineterminator="\n")
    writer.writeheader()
    for p in points:
        writer.writerow(asdict(p))
    return stream.getvalue()


def save_png(points: Sequence[ScalingPoint], path: str | os.PathLike[str], title: str) -> None:
    """Throughput and efficiency against the number of systems, the ideal line beside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cgc.files import write_atomically

    systems = [p.systems for p in points]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    left.plot(systems, [p.samples_per_second for p in points], "o-", label="cgc")
    left.plot(systems, [p.ideal_samples_per_second for p in points], "--", label="ideal")
    left.set(xscale="log", yscale="log", xlabel="systems", ylabel="samples / s")
    left.legend()
    right.plot(systems, [p.efficiency for p in points], "o-")
    right.axhline(1.0, linestyle="--", color="gray")
    right.set(xscale="log", xlabel="systems", ylabel="efficiency", ylim=(0, 1.05))
    for axis in (left, right):
        axis.minorticks_off()
        axis.set_xticks(systems, [str(k) for k in systems])
    figure.suptitle(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(figure)
    write_atomically(path, buffer.getvalue())
