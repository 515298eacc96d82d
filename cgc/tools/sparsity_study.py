"""A sparsity sweep: one model's timing-only training step at several levels of unstructured
weight sparsity (the fraction of a sparse weight's values that are zero; 0 is dense), on one
or more cluster sizes, and which layers stop benefiting, and why.

Every level compiles the model with ``Sparsity(1 - level, ...)`` through one shared
``StreamingCompiler`` (the programs are built once; a level only changes which values of the
weights stream) and simulates one step on shapes. The speed-up of a point is the dense
step's time (level 0, simulated even if not asked for) over its own, on as many systems.

Per layer, the figures of ``Cluster.train_step`` are added up over the repeated blocks
(``h.*.mlp.fc_in``, as ``cgc train --timing-only`` prints them). A layer's time in a step is
the longest of its parts per run (compute, weight stream, gradient stream) times the runs,
plus MemoryX's update of the weights it streams first. A layer that gains less than ``SLOW``
gets a reason read from the numbers: it has no weights, its weights stay dense, or, for a
sparse one, the part that now dominates it: the weight stream (values and index metadata),
the gradient stream, MemoryX's update, kernels on no sparse weight (the weight gradient),
or the sparse kernels' own cost and the term that binds them (the AXPYs and indices, the
weights arriving, the dense partial sums, the activations' multicast: ``plans.sparse``), the
last two from the layer's kernels planned again (``cgc.machine.timing.cost.Timing``).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cgc.compiler.driver import StreamingCompiler
from cgc.compiler.sources import Source
from cgc.compiler.training import STREAMED_FOR_TRAINING, Training
from cgc.errors import CgcError
from cgc.machine.hardware.target import Target
from cgc.machine.program.bytecode import Program
from cgc.machine.sparse.sparsity import Sparsity
from cgc.machine.timing.run_stats import RunStats
from cgc.machine.timing.utilization import (
    group_name,
    layer_kernels,
    layer_seconds,
    runs_per_step,
    stream_bound,
)
from cgc.options import SparsityOptions
from cgc.runtime.cluster import Cluster, Run
from cgc.tools.report import human_seconds
from cgc.tools.scaling import Clusters, assumed_line, cell, study_json, table_lines

MOST_LEVELS = 16
"""Most sparsity levels one sweep simulates: each compiles and simulates a step."""
SLOW = 1.5
"""A layer gaining less than this from sparsity has stopped benefiting: it gets a reason."""
CAUSES = (
    "no weights",
    "dense weights",
    "weight stream",
    "gradient stream",
    "MemoryX update",
    "dense kernels",
    "sparse kernel overhead",
)
"""What keeps a layer from benefiting, as ``LayerSpeedup.cause`` names it."""


def densities(levels: Sequence[float]) -> list[float]:
    """The density of each sparsity level (the fraction of zeros, 0 = dense); a level outside
    [0, 1), given twice, or too many of them, is a CgcError naming ``--sparsity``."""
    listed = ",".join(f"{s:g}" for s in levels)
    if not levels:
        raise CgcError("--sparsity: give at least one level, e.g. 0,0.5,0.9")
    bad = [s for s in levels if not 0 <= s < 1]  # also NaN
    if bad:
        raise CgcError(f"--sparsity {listed}: {bad[0]:g} is not a level in [0, 1)")
    repeated = [s for i, s in enumerate(levels) if s in levels[:i]]
    if repeated:
        raise CgcError(f"--sparsity {listed}: {repeated[0]:g} is given twice")
    if len(levels) > MOST_LEVELS:
        raise CgcError(f"--sparsity: {len(levels)} levels, more than a sweep of {MOST_LEVELS}")
    return [1.0 - s for s in levels]


@dataclass(frozen=True)
class LayerSpeedup:
    """A group of layers (the repeated blocks' added up) at one level, beside the dense step
    on as many systems: its figures per step, and why it gains little if it does."""

    name: str
    count: int
    dense_seconds: float
    """Its time in the dense step: its longest part per run times the runs, plus MemoryX's
    update of its weights."""
    seconds: float
    """The same at this level."""
    speedup: float
    compute_seconds: float
    weight_stream_seconds: float
    gradient_stream_seconds: float
    memoryx_update_seconds: float
    stream_in_bytes: float
    """Per step: the weights' values and metadata it streams in."""
    dense_stream_in_bytes: float
    flops: float
    """Per step: the model's FLOPs in it (a sparse matmul's live ones)."""
    dense_flops: float
    bound: str
    cause: str = ""
    """One of ``CAUSES`` when the speed-up is below ``SLOW`` (else empty)."""
    reason: str = ""
    """The cause, with the numbers that show it."""


@dataclass(frozen=True)
class SparsePoint:
    """One sparsity level on one cluster size."""

    sparsity: float
    density: float
    systems: int
    global_batch: int
    per_system_batch: int
    micro_batch: int
    micro_batches: int
    step_seconds: float
    samples_per_second: float
    tokens_per_second: float | None
    mfu: float
    """Over the FLOPs the model does at this level (a sparse matmul's live ones)."""
    model_flops: float
    stream_in_bytes: float
    """Per step, one system: weights and metadata from MemoryX."""
    stream_out_bytes: float
    """Per step, one system: gradients to MemoryX."""
    memoryx_update_seconds: float
    bound: str
    speedup: float = 0.0
    """The dense step's time over this one's, on as many systems."""
    layers: tuple[LayerSpeedup, ...] = field(default=(), repr=False)


@dataclass
class _Measured:
    """A point before it is compared with the dense one: its stats and its layers' kernels."""

    point: SparsePoint
    stats: RunStats
    program: Program
    target: Target


def sparsity_study(
    source: Source,
    target: Target,
    training: Training,
    levels: Sequence[float],
    clusters: Clusters,
    sparse: SparsityOptions | None = None,
) -> list[SparsePoint]:
    """One timing-only training step per sparsity level (fraction of zeros) and cluster size,
    levels outer, in the order given; each with its speed-up over the dense step on as many
    systems and its layers beside the dense ones. ``sparse``'s ``sparse_params``,
    ``sparsity_init`` and ``seed`` choose the sparse weights and their masks (``Sparsity``;
    default: every matrix but the embeddings, drawn at random from seed 0)."""
    sparse = sparse or SparsityOptions()
    chosen = densities(levels)
    systems, batches = clusters.batches(source)
    compiler = StreamingCompiler(shared=True)
    timed: dict[tuple[object, ...], list[Run]] = {}
    """Per level and program (its micro-batch and recomputing): its runs on shapes."""

    def measure(level: float, density: float, k: int, batch: int) -> _Measured:
        # as ``cgc train --sparsity LEVEL`` makes it; level 0 is the dense compile itself
        sparsity = (
            None
            if level == 0
            else Sparsity.of(level, tuple(sparse.sparse_params), sparse.sparsity_init, sparse.seed)
        )
        request = clusters.request(source, target, training, k, batch, sparsity)
        artifact = compiler.artifact(request, STREAMED_FOR_TRAINING)
        plan = artifact.manifest["memory_plan"]
        key = (level, plan["micro_batch"], plan["recompute"])
        cluster = Cluster(artifact, numerics=False, timed=timed.get(key))
        stats = cluster.train_step()[1]
        timed[key] = cluster.timed_runs
        layers = [x for x in stats.layers if "compute_seconds" in x]
        runs = stats.micro_batches
        point = SparsePoint(
            sparsity=level,
            density=density,
            systems=k,
            global_batch=k * batch,
            per_system_batch=batch,
            micro_batch=plan["micro_batch"],
            micro_batches=plan["micro_batches"],
            step_seconds=stats.simulated_seconds,
            samples_per_second=stats.samples_per_second,
            tokens_per_second=stats.tokens_per_second,
            mfu=stats.mfu,
            model_flops=stats.model_flops,
            stream_in_bytes=runs * sum(x["stream_in_bytes"] for x in layers),
            stream_out_bytes=runs * sum(x["stream_out_bytes"] for x in layers),
            memoryx_update_seconds=stats.update_seconds,
            bound=stats.bound or "compute",
        )
        return _Measured(point, stats, artifact.program, cluster.target)

    # the dense steps first: each level is compared as soon as it is measured, and its
    # program (its masks) dropped
    dense = {k: measure(0.0, 1.0, k, b) for k, b in zip(systems, batches, strict=True)}
    out = []
    for level, density in zip(levels, chosen, strict=True):
        for k, batch in zip(systems, batches, strict=True):
            measured = dense[k] if level == 0 else measure(level, density, k, batch)
            out.append(_compared(measured, dense[k]))
    return out


def _compared(m: _Measured, dense: _Measured) -> SparsePoint:
    """``m``'s point with its speed-up and its layers beside the dense ones."""
    p = m.point
    speedup = dense.point.step_seconds / p.step_seconds if p.step_seconds else 0.0
    mine, theirs = _groups(m.stats), _groups(dense.stats)
    layers = tuple(
        _layer_speedup(name, group, theirs[name], m, dense)
        for name, group in mine.items()
        if name in theirs
    )
    return SparsePoint(**{**_scalars(p), "speedup": speedup, "layers": layers})


def _scalars(p: SparsePoint) -> dict[str, Any]:
    """The point's fields but its layers."""
    return {k: v for k, v in asdict(p).items() if k != "layers"}


PARTS = (
    "compute_seconds",
    "weight_stream_seconds",
    "gradient_stream_seconds",
    "memoryx_update_seconds",
    "stream_in_bytes",
    "stream_out_bytes",
    "flops",
)
"""The figures of a layer added up over a group, per step."""


def _groups(stats: RunStats) -> dict[str, dict[str, Any]]:
    """The layers of a step added up by name with the block index starred, per step (the
    runs' parts times the runs, MemoryX's update once), each with its first layer's index."""
    groups: dict[str, dict[str, Any]] = {}
    runs = runs_per_step(stats)
    for index, layer in enumerate(stats.layers):
        if "compute_seconds" not in layer:
            continue
        group = groups.setdefault(
            group_name(layer["name"]),
            {"count": 0, "first": index, **dict.fromkeys(PARTS, 0.0)},
        )
        group["count"] += 1
        for part in PARTS:
            group[part] += (1 if part == "memoryx_update_seconds" else runs) * layer[part]
    for group in groups.values():
        group["seconds"] = layer_seconds(group, 1)  # the group's parts are the runs' already
        group["bound"] = stream_bound(group)
    return groups


def _layer_speedup(
    name: str, group: dict[str, Any], dense: dict[str, Any], m: _Measured, d: _Measured
) -> LayerSpeedup:
    speedup = dense["seconds"] / group["seconds"] if group["seconds"] else math.inf
    cause = reason = ""
    if speedup < SLOW and m.point.sparsity > 0:
        cause, reason = _reason(group, dense, m, d)
    return LayerSpeedup(
        name=name,
        count=group["count"],
        dense_seconds=dense["seconds"],
        seconds=group["seconds"],
        speedup=speedup,
        compute_seconds=group["compute_seconds"],
        weight_stream_seconds=group["weight_stream_seconds"],
        gradient_stream_seconds=group["gradient_stream_seconds"],
        memoryx_update_seconds=group["memoryx_update_seconds"],
        stream_in_bytes=group["stream_in_bytes"],
        dense_stream_in_bytes=dense["stream_in_bytes"],
        flops=group["flops"],
        dense_flops=dense["flops"],
        bound=group["bound"],
        cause=cause,
        reason=reason,
    )


def _ratio(a: float, b: float) -> float:
    return a / b if b else (1.0 if not a else math.inf)


def _reason(
    group: dict[str, Any], dense: dict[str, Any], m: _Measured, d: _Measured
) -> tuple[str, str]:
    """Why a group gains little at ``m``'s level: its cause (``CAUSES``) and the numbers."""
    if not dense["stream_in_bytes"] and not dense["stream_out_bytes"]:
        return "no weights", "no weights: its kernels are on activations alone, which stay dense"
    streamed = _ratio(group["stream_in_bytes"], dense["stream_in_bytes"])
    flops = _ratio(group["flops"], dense["flops"])
    if streamed > 0.999 and flops > 0.999:
        return "dense weights", "its weights stay dense (not among the sparse ones)"
    density = m.point.density
    parts = {  # each per step: the runs' parts times the runs, the update once
        "weight stream": group["weight_stream_seconds"],
        "gradient stream": group["gradient_stream_seconds"],
        "MemoryX update": group["memoryx_update_seconds"],
        "compute": group["compute_seconds"],
    }
    top = max(parts, key=parts.__getitem__)
    if top == "weight stream":
        return "weight stream", (
            f"bound by the weight stream: its bytes (live values, index metadata and any dense "
            f"weights it streams) are {streamed:.0%} of the dense ones, {streamed / density:.2f}x "
            "the live values alone"
        )
    if top == "gradient stream":
        gradients = _ratio(group["stream_out_bytes"], dense["stream_out_bytes"])
        return "gradient stream", (
            f"bound by the gradient stream: {gradients:.0%} of the dense gradients' bytes"
        )
    if top == "MemoryX update":
        update = _ratio(group["memoryx_update_seconds"], dense["memoryx_update_seconds"])
        return "MemoryX update", (
            f"bound by MemoryX's update of its weights, {update:.0%} of the dense update"
        )
    return _compute_reason(group["first"], m, d, density)


def _compute_reason(index: int, m: _Measured, d: _Measured, density: float) -> tuple[str, str]:
    """Why a compute-bound layer with sparse weights gains little: kernels on no sparse weight
    (their FLOPs the dense ones'), or the cost of those on sparse weights over the dense
    ones' times the density, and what binds the worst of them.

    The kernels are the same instructions in both programs: one on a sparse weight is one
    that does fewer FLOPs than its dense self, whatever its algorithm. Its dense self is
    the same program without sparse weights: the dense point's memory plan may differ."""
    dense = replace(m.program, sparse={})
    pairs = list(
        zip(
            layer_kernels(m.program, m.target, index),
            layer_kernels(dense, m.target, index),
            strict=True,
        )
    )
    if not pairs:
        return "dense kernels", "no kernels: its compute is host I/O and data movement"
    total = sum(s.cycles for s, _ in pairs) or 1.0
    on_sparse = [(s, x) for s, x in pairs if s.flops < x.flops]
    others: dict[str, float] = {}
    for s, x in pairs:
        if not s.flops < x.flops:
            others[s.name] = others.get(s.name, 0.0) + s.cycles
    rest = sum(others.values())
    if rest >= total / 2 or not on_sparse:
        chief = max(others, key=others.__getitem__)
        return "dense kernels", (
            f"{rest / total:.0%} of its compute is kernels on no sparse weight, chiefly "
            f"{chief} ({others[chief] / total:.0%})"
        )
    cycles = sum(s.cycles for s, _ in on_sparse)
    ideal = density * sum(x.cycles for _, x in on_sparse)
    worst = max(on_sparse, key=lambda p: p[0].cycles - density * p[1].cycles)
    imbalance = sum(s.cycles * s.detail.get("imbalance", 1.0) for s, _ in on_sparse) / cycles
    binds = worst[0].detail.get("binds")
    return "sparse kernel overhead", (
        f"its kernels on sparse weights take {_ratio(cycles, ideal):.2f}x the dense ones' "
        f"cycles times the density (column imbalance {imbalance:.2f}), most of all "
        f"{worst[0].name} ({worst[0].detail.get('algorithm')}, "
        f"{_ratio(worst[0].cycles, density * worst[1].cycles):.2f}x"
        + (f", bound by {binds})" if binds else ")")
    )


COLUMNS = (
    ("sparsity", "sparsity", "{:.0%}"),
    ("density", "density", "{:.3g}"),
    ("systems", "systems", "{}"),
    ("step_seconds", "step (s)", "{:.4g}"),
    ("samples_per_second", "samples/s", "{:.4g}"),
    ("tokens_per_second", "tokens/s", "{:.4g}"),
    ("speedup", "speed-up", "{:.3f}"),
    ("mfu", "MFU", "{:.1%}"),
    ("stream_in_bytes", "weights in (B)", "{:.3g}"),
    ("bound", "bound", "{}"),
)


def reference_level(points: Sequence[SparsePoint]) -> float:
    """The level whose layers the table explains: 90 % if swept, else the highest."""
    levels = {p.sparsity for p in points}
    return 0.9 if 0.9 in levels else max(levels)


def table_text(points: Sequence[SparsePoint], target: Target) -> str:
    """The sweep as tables for people: the steps, then per layer group (on the fewest
    systems) its dense time, its speed-up at every level, and at the reference level
    (``reference_level``) why it gains less than ``SLOW``; and the assumptions."""
    rows = [[cell(getattr(p, key), fmt) for key, _, fmt in COLUMNS] for p in points]
    lines = table_lines([label for _, label, fmt in COLUMNS], rows)
    fewest = min(p.systems for p in points)
    mine = [p for p in points if p.systems == fewest and p.sparsity > 0]
    if mine and mine[0].layers:
        at = reference_level(mine)
        explained = next(p for p in mine if p.sparsity == at)
        headers = ["layer", "count", "dense", *(f"x at {p.sparsity:.0%}" for p in mine)]
        headers.append(f"why below {SLOW:g}x at {at:.0%}")
        reasons = {g.name: g.reason for g in explained.layers}
        table = []
        # the levels' plans may differ (recomputing or not): layers by name, "-" where absent
        speedups = [{g.name: g.speedup for g in p.layers} for p in mine]
        for group in mine[0].layers:
            gains = [f"{x[group.name]:.2f}" if group.name in x else "-" for x in speedups]
            why = reasons.get(group.name, "")
            table.append(
                [group.name, str(group.count), human_seconds(group.dense_seconds), *gains, why]
            )
        lines.append(f"per layer on {fewest} system{'s' * (fewest > 1)}, per step:")
        lines += ["  " + x for x in table_lines(headers, table, left=(0, len(headers) - 1))]
        lines += ["  " + x for x in _shares(explained)]
    lines.append(assumed_line(target))
    return "\n".join(lines) + "\n"


def cause_shares(point: SparsePoint) -> dict[str, float]:
    """The share of the point's layer time (``LayerSpeedup.seconds`` summed) in layers gaining
    less than ``SLOW``, by cause; the rest under ``""``."""
    total = sum(g.seconds for g in point.layers) or 1.0
    shares: dict[str, float] = {}
    for g in point.layers:
        shares[g.cause] = shares.get(g.cause, 0.0) + g.seconds / total
    return shares


def _shares(point: SparsePoint) -> list[str]:
    shares = cause_shares(point)
    parts = [f"{cause} {shares[cause]:.0%}" for cause in CAUSES if cause in shares]
    gaining = shares.get("", 0.0)
    return [
        f"at {point.sparsity:.0%}, of the layers' time: {gaining:.0%} in layers gaining "
        f"{SLOW:g}x or more; " + (", ".join(parts) or "none below")
    ]


def to_json(points: Sequence[SparsePoint], target: Target, model: str) -> dict[str, Any]:
    """The sweep as JSON, each point with its layers."""
    return {**study_json(target, model), "slow": SLOW, "points": [asdict(p) for p in points]}


def to_csv(points: Sequence[SparsePoint]) -> str:
    """The sweep as CSV, one row per point (its layers left out)."""
    stream = io.StringIO()
    rows = [_scalars(p) for p in points]
    writer = csv.DictWriter(stream, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return stream.getvalue()


def save_png(points: Sequence[SparsePoint], path: str | os.PathLike[str], title: str) -> None:
    """Step time and speed-up against density (log axis), one line per cluster size, the
    ideal speed-up (one over the density) beside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cgc.files import write_atomically

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    shown = sorted({p.density for p in points})
    for k in sorted({p.systems for p in points}):
        mine = sorted((p for p in points if p.systems == k), key=lambda p: p.density)
        label = f"{k} system{'s' * (k > 1)}"
        x = [p.density for p in mine]
        left.plot(x, [p.step_seconds for p in mine], "o-", label=label)
        right.plot(x, [p.speedup for p in mine], "o-", label=label)
    right.plot(shown, [1 / d for d in shown], "--", color="gray", label="1 / density")
    left.set(xscale="log", yscale="log", xlabel="density", ylabel="step time (s)")
    right.set(xscale="log", yscale="log", xlabel="density", ylabel="speed-up over dense")
    for axis in (left, right):
        axis.minorticks_off()
        axis.set_xticks(shown, [f"{d:.3g}" for d in shown])
        axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(figure)
    write_atomically(path, buffer.getvalue())
