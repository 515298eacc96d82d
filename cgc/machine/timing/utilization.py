"""Model FLOPs utilization of a weight-streaming step, per layer and per step, and what binds
it, read from the simulator's own numbers.

A layer's time in a step (``layer_seconds``) is the longest of its parts per run (the wafer's
compute, its weight stream, its gradient stream: they overlap) times the runs, plus MemoryX's
update of the weights it is the first to stream. Its MFU is its model FLOPs over that time
times the peak; a recomputed layer's FLOPs are not the model's.

The time is attributed to terms (``TERMS``), which add up to the layer's time. The wafer's
cycles are the layer record's, kernel by kernel as the timing engine plans them again
(``program_kernels``): each plan's arithmetic (the model's FLOPs at peak, the rest padding of
tiles and vector work below peak), its operands' arrival and the movement the arithmetic does
not hide, named by the kernel: for the weight-streaming matmul the weights arriving through
the edge and the partial-sum chain along the rows (``plans.matmul``, ``plans.sparse``), for the
weight gradient the activations' multicast and the partial sums down the columns; then what
the streams take beyond the wafer (``weight stream``, ``gradient stream``) and MemoryX's
update. The step adds the time its timeline spends beyond its layers' (the SwarmX tree's
latency, waits; negative where streams overlap other layers) as its own term.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cgc.machine.hardware.target import Target
from cgc.machine.plans.kernel import Plan
from cgc.machine.program.bytecode import RECOMPUTED_SUFFIX, Program
from cgc.machine.timing.cost import Sram, Timing
from cgc.machine.timing.run_stats import RunStats
from cgc.machine.timing.streaming import stream_limit

BLOCK_INDEX = re.compile(r"\.\d+\.")
"""The index of a repeated block in a layer name (``h.3.attn.q_proj``)."""

TERMS = (
    ("model_flops", "model FLOPs"),
    ("arithmetic", "padding and vector work"),
    ("recompute", "recompute"),
    ("weights_edge", "weights through the edge"),
    ("partial_sums", "partial sums"),
    ("gradient_movement", "weight-gradient multicast"),
    ("data_movement", "other data movement"),
    ("edge_io", "edge and host I/O"),
    ("weight_stream", "weight stream"),
    ("gradient_stream", "gradient stream"),
    ("memoryx_update", "MemoryX update"),
    ("timeline", "timeline waits (+) or overlap (-)"),
)
"""Where the time of a step goes, by key and label: the model's FLOPs at peak (their share is
the MFU), then what the rest is lost to."""
LABELS = dict(TERMS)
STREAMING = ("stream", "stream-sparse")
"""The algorithms of the weight-streaming matmul: weights through the edge, partial sums."""
GRADIENT = ("row-reduce", "sampled")
"""The algorithms of the weight gradient: activations multicast, partial sums down."""
MATERIAL = 0.01
"""A plan's term binds when it adds more than this share of the arithmetic (the rest of
its arrival and movement is the fixed latency of crossing the mesh)."""


def group_name(name: str, every_layer: bool = False) -> str:
    """The group of a layer: its name with the block index starred (``h.*.attn.q_proj``),
    or its own name with ``every_layer``."""
    return name if every_layer else BLOCK_INDEX.sub(".*.", name)


def runs_per_step(stats: RunStats) -> int:
    """The runs of the program the busiest system makes in the step."""
    return stats.per_system_batch // stats.micro_batch if stats.micro_batch else 1


def layer_seconds(layer: Mapping[str, Any], runs: int) -> float:
    """A streamed layer's time in a step: its longest part per run (compute, weight or
    gradient stream) times the runs, plus MemoryX's update of its weights."""
    parts: tuple[float, ...] = (
        layer["compute_seconds"],
        layer["weight_stream_seconds"],
        layer["gradient_stream_seconds"],
    )
    update: float = layer["memoryx_update_seconds"]
    return runs * max(parts) + update


def stream_bound(layer: Mapping[str, Any]) -> str:
    """Which of a layer's overlapping parts takes longest: compute, weight or gradient
    stream."""
    parts = {
        "compute": layer["compute_seconds"],
        "weight stream": layer["weight_stream_seconds"],
        "gradient stream": layer["gradient_stream_seconds"],
    }
    return max(parts, key=parts.__getitem__)


PARTS = (
    ("compute_seconds", "compute"),
    ("weight_stream_seconds", "weights"),
    ("gradient_stream_seconds", "gradients"),
    ("swarmx_seconds", "SwarmX"),
    ("memoryx_update_seconds", "update"),
)
"""A streamed layer's parts in a step, by key (``LayerTime.to_json``'s) and label."""


def layer_groups(stats: RunStats, every_layer: bool) -> list[dict[str, Any]]:
    """The weight-streaming per-layer figures of one step (the layers' runs times the
    micro-batches, MemoryX's update once), the layers of repeated blocks added up under one
    name (``h.*.attn.q_proj``) unless ``every_layer``."""
    groups: dict[str, dict[str, Any]] = {}
    runs = runs_per_step(stats)
    for layer in stats.layers:
        if "compute_seconds" not in layer:
            continue
        key = group_name(layer["name"], every_layer)
        group = groups.setdefault(key, {"name": key, "count": 0, **{k: 0.0 for k, _ in PARTS}})
        group["count"] += 1
        for part, _ in PARTS:
            group[part] += (1 if part == "memoryx_update_seconds" else runs) * layer[part]
    for group in groups.values():
        group["bound"] = stream_bound(group)
    return list(groups.values())


@dataclass(frozen=True)
class KernelPlan:
    """One kernel of a layer as the timing engine planned it."""

    name: str
    plan: Plan

    @property
    def cycles(self) -> float:
        """Its cycles."""
        return self.plan.cost.cycles

    @property
    def flops(self) -> float:
        """Its FLOPs (a sparse kernel's live ones)."""
        return self.plan.cost.flops

    @property
    def detail(self) -> dict[str, Any]:
        """What it chose (``Plan.detail``)."""
        return self.plan.detail


def layer_kernels(program: Program, target: Target, index: int) -> list[KernelPlan]:
    """Layer ``index``'s kernels alone on its rectangle, its inputs delivered there in their
    default layout, in program order."""
    rect = program.layers[index].rect
    timing = Timing(program, target, Sram(target, False, rect), deliver=True)
    timing.enter_layer(index, rect)
    out = []
    for position in program.layer_spans[index][1:]:
        ins = program.instructions[position]
        plan = timing.step(ins)
        if ins.is_kernel and isinstance(plan, Plan):
            out.append(KernelPlan(ins.name, plan))
    return out


def program_kernels(program: Program, target: Target) -> list[tuple[float, list[KernelPlan]]]:
    """Per layer of one weight-streaming run of ``program`` (as the runtime times it), its
    cycles and its kernels' plans."""
    timing = Timing(program, target, Sram(target, strict=False))
    kernels: list[list[KernelPlan]] = []
    for ins in program.instructions:
        plan = timing.step(ins)
        if len(kernels) < len(timing.records):
            kernels.append([])
        if ins.is_kernel and isinstance(plan, Plan):
            kernels[-1].append(KernelPlan(ins.name, plan))
    return [(r.cycles, k) for r, k in zip(timing.records, kernels, strict=True)]


def kernel_terms(kernel: KernelPlan, split: bool = False) -> dict[str, float]:
    """A kernel's cycles by term (``TERMS``): its arithmetic, and its arrival and movement
    named by its algorithm. ``split`` (pipelined mode, ``cgc.machine.timing.pipeline_bound``) parts
    the other kernels' data movement: their operands' arrival (``arrival``), and their
    movement, the broadcasts and reductions of a mesh algorithm (``collectives``: SUMMA's
    panels, split-k's reduction, attention's ring) or else ``data_movement``."""
    cost, algorithm = kernel.plan.cost, kernel.detail.get("algorithm")
    rest = {"arrival": cost.arrival_cycles, "movement": cost.movement_cycles}
    if algorithm in STREAMING:
        named = {"weights_edge": rest["arrival"], "partial_sums": rest["movement"]}
    elif algorithm in GRADIENT:
        named = {"gradient_movement": rest["arrival"] + rest["movement"]}
    elif split:
        moved = "collectives" if algorithm else "data_movement"
        named = {"arrival": rest["arrival"], moved: rest["movement"]}
    else:
        named = {"data_movement": rest["arrival"] + rest["movement"]}
    return {"arithmetic": cost.compute_cycles, **named}


SPARSE_BINDS = {
    "the AXPYs and indices": "arithmetic",
    "the weights arriving": "weights through the edge",
    "the dense partial sums along the rows": "partial sums",
    "the dot products and indices": "arithmetic",
    "the partial sums down the columns": "weight-gradient multicast",
    "the activations' multicast": "weight-gradient multicast",
}
"""The terms ``plans.sparse`` names (``Plan.detail["binds"]``), as ``kernel_bound`` names
them."""


def kernel_bound(kernel: KernelPlan) -> str:
    """The term that binds a kernel: the one its plan names (the sparse kernels), else the
    last of arithmetic, arrival and movement that adds more than ``MATERIAL`` of its
    arithmetic beyond the mesh's latency (the first output's rows and columns)."""
    binds = kernel.detail.get("binds")
    if binds in SPARSE_BINDS:
        return SPARSE_BINDS[binds]
    cost, (out, *_) = kernel.plan.cost, kernel.plan.outputs
    latency = out.h + out.w
    terms = kernel_terms(kernel)
    bound = "arithmetic"
    for key, cycles in terms.items():
        if key != "arithmetic" and cycles - latency > MATERIAL * max(cost.compute_cycles, 1.0):
            bound = LABELS[key]
    return bound


@dataclass(frozen=True)
class Utilization:
    """A layer, or a group of them, in one step: its model FLOPs (all systems), its time,
    share of the step, MFU, what binds it, and its time by term (``TERMS``, seconds)."""

    name: str
    count: int
    flops: float
    seconds: float
    share: float
    mfu: float
    bound: str
    terms: dict[str, float]


@dataclass(frozen=True)
class StepUtilization:
    """A step's MFU, its time by term (shares of the step, adding up to one), and its
    layers (groups of repeated ones unless asked for every layer)."""

    mfu: float
    seconds: float
    shares: dict[str, float]
    layers: list[Utilization]
    stream_limit: str = ""
    """What sets the streams' rate: MemoryX, a SwarmX link, or the system's I/O (``weight
    stream``); empty without the target."""

    def to_json(self) -> dict[str, Any]:
        """The ``utilization`` object of ``--stats-json``."""
        return asdict(self)


def wafer_terms(
    cycles: float, kernels: Sequence[KernelPlan], clock_hz: float, split: bool = False
) -> tuple[dict[str, float], str]:
    """Per run, a layer's wafer seconds by term (its kernels' ``kernel_terms``, ``split`` or
    not, and the rest of its ``cycles`` as ``edge_io``: tensors through the edge) and the
    term binding most of them."""
    terms = dict.fromkeys(("arithmetic", "edge_io"), 0.0)
    bound_cycles: dict[str, float] = {}
    for kernel in kernels:
        for key, value in kernel_terms(kernel, split).items():
            terms[key] = terms.get(key, 0.0) + value
        bound = kernel_bound(kernel)
        bound_cycles[bound] = bound_cycles.get(bound, 0.0) + kernel.cycles
    terms["edge_io"] = cycles - sum(k.cycles for k in kernels)
    bound_cycles[LABELS["edge_io"]] = terms["edge_io"]
    bound = max(bound_cycles, key=bound_cycles.__getitem__)
    return {k: v / clock_hz for k, v in terms.items()}, bound


def _layer(
    layer: Mapping[str, Any],
    kernels: tuple[float, list[KernelPlan]] | None,
    stats: RunStats,
) -> Utilization:
    """One streamed layer's figures in the step (``kernels``: its cycles and plans, if
    known; else its wafer time is all arithmetic)."""
    runs = runs_per_step(stats)
    peak = stats.peak_flops_per_second / stats.num_csx
    compute = layer["compute_seconds"]
    if kernels is None:
        wafer, bound = {"arithmetic": layer["cycles"] / stats.clock_hz}, "arithmetic"
    else:
        wafer, bound = wafer_terms(*kernels, stats.clock_hz)
    wafer["edge_io"] = wafer.get("edge_io", 0.0) + compute - sum(wafer.values())  # host I/O
    terms = {key: runs * value for key, value in wafer.items()}
    recomputed = layer["name"].endswith(RECOMPUTED_SUFFIX)
    useful = 0.0 if recomputed else runs * layer["flops"] / peak
    terms["arithmetic"] -= useful
    terms["model_flops"] = useful
    if recomputed:
        terms = {"recompute": sum(terms.values())}
    streams = stream_bound(layer)
    weights, gradients = layer["weight_stream_seconds"], layer["gradient_stream_seconds"]
    terms["weight_stream"] = runs * max(0.0, weights - compute)
    terms["gradient_stream"] = runs * max(0.0, gradients - max(compute, weights))
    terms["memoryx_update"] = layer["memoryx_update_seconds"]
    if streams != "compute":
        bound = streams
    seconds = layer_seconds(layer, runs)
    if terms["memoryx_update"] > seconds / 2:
        bound = LABELS["memoryx_update"]
    flops = 0.0 if recomputed else layer["flops"] * stats.batch_size / (stats.micro_batch or 1)
    return _figures(layer["name"], 1, flops, seconds, bound, terms, stats)


def _figures(
    name: str,
    count: int,
    flops: float,
    seconds: float,
    bound: str,
    terms: dict[str, float],
    stats: RunStats,
) -> Utilization:
    step, peak = stats.simulated_seconds, stats.peak_flops_per_second
    ordered = {key: terms[key] for key, _ in TERMS if terms.get(key)}
    return Utilization(
        name=name,
        count=count,
        flops=flops,
        seconds=seconds,
        share=seconds / step if step else 0.0,
        mfu=flops / (seconds * peak) if seconds and peak else 0.0,
        bound=bound,
        terms=ordered,
    )


def _grouped(
    layers: Sequence[Utilization], stats: RunStats, every_layer: bool
) -> list[Utilization]:
    """The layers added up by ``group_name``; a group's bound is the one binding most of
    its time."""
    groups: dict[str, list[Utilization]] = {}
    for layer in layers:
        groups.setdefault(group_name(layer.name, every_layer), []).append(layer)
    out = []
    for name, members in groups.items():
        terms: dict[str, float] = {}
        bounds: dict[str, float] = {}
        for m in members:
            bounds[m.bound] = bounds.get(m.bound, 0.0) + m.seconds
            for key, value in m.terms.items():
                terms[key] = terms.get(key, 0.0) + value
        seconds = sum(m.seconds for m in members)
        flops = sum(m.flops for m in members)
        bound = max(bounds, key=bounds.__getitem__)
        out.append(_figures(name, len(members), flops, seconds, bound, terms, stats))
    return out


def step_utilization(
    stats: RunStats,
    program: Program | None = None,
    target: Target | None = None,
    every_layer: bool = False,
) -> StepUtilization | None:
    """A weight-streaming step's MFU, per layer (group) and by term; ``program`` and its
    ``target`` name the wafer's terms (without them the wafer's time is its arithmetic).
    None for a run with no streamed layers (pipelined mode)."""
    streamed = [layer for layer in stats.layers if "compute_seconds" in layer]
    if not streamed or len(streamed) != len(stats.layers):
        return None
    known: Sequence[tuple[float, list[KernelPlan]] | None] = [None] * len(streamed)
    if program is not None and target is not None:
        known = program_kernels(program, target)
    layers = [_layer(x, k, stats) for x, k in zip(streamed, known, strict=True)]
    totals: dict[str, float] = {}
    for layer in layers:
        for key, value in layer.terms.items():
            totals[key] = totals.get(key, 0.0) + value
    step = stats.simulated_seconds
    totals["timeline"] = step - sum(layer.seconds for layer in layers)
    shares = {key: totals[key] / step for key, _ in TERMS if totals.get(key) and step}
    limit = stream_limit(target) if target is not None else ""
    grouped = _grouped(layers, stats, every_layer)
    return StepUtilization(
        stats.mfu, step, shares, grouped, "system I/O" if limit == "weight stream" else limit
    )
