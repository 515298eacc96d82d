"""Where a pipelined artifact's compute bound goes: its throughput's gap to every PE at peak,
split into terms that add up, read from the simulator's own numbers.

Definitions (per sample, in the steady state, on one system of ``pes`` PEs):

- The ideal time is the model's FLOPs over every PE at peak: ``ideal = F / (pes x peak)``,
  with ``peak`` one PE's FLOP/s (``Target.peak_flops_per_pe_per_cycle() x clock``), as
  ``cgc.machine.timing.pipeline.pipeline_figures`` counts the bound.
- The actual time is the pipeline's period ``P``: the slowest stage's service time
  (``cgc.machine.timing.pipeline``). A stage's service time ``s`` is its busy time per sample, the
  longest of its kernels, its host I/O and its busiest input link (``Stage.service_seconds``:
  they overlap), over the batch of a run.
- The whole is every PE held for a period, ``pes x P`` (PE-seconds per sample), so that
  ``ideal / P`` (the share of model FLOPs below) is the achieved throughput over the bound.
  It adds up as ``pes x P = (pes - placed) x P + sum over stages of area x P``, and each
  stage's ``area x P = area x s + area x (P - s)``.

The terms (``TERMS``), as shares of the whole, add up to one:

- ``idle``: the PEs no stage is placed on, ``(pes - placed) x P``.
- ``waiting``: stage imbalance, for each stage ``area x (P - s)``: its PEs waiting on the
  slowest stage.
- each stage's busy ``area x s``, split by the same per-kernel terms as weight streaming
  (``cgc.machine.timing.utilization.wafer_terms``, ``split``: the timing engine plans the layer's
  kernels again alone on its rectangle, its inputs delivered there, ``layer_kernels``):
  ``model_flops``, the layer's model FLOPs at peak ``F_stage / peak``; ``arithmetic``, the
  rest of its kernels' arithmetic cycles (padding of tiles, tile granularity, vector work
  below peak); ``arrival``, its kernels' operands arriving (relaid) where they compute;
  ``collectives``, the movement of its mesh algorithms not hidden by their arithmetic
  (SUMMA's broadcasts, split-k's reduction, attention's ring); ``data_movement``, the other
  kernels' movement (reductions of norms and softmax, gathers, relayouts); ``edge_io``, its
  tensors through the edge (its cycles beyond its kernels') and how much longer its host I/O
  takes than all that, when it does; and ``input_link``, how much longer its busiest input
  link takes than the longer of those, when it does.
  A kernel streaming weights or computing a weight gradient keeps the names it has in
  weight streaming (``weights_edge``, ``partial_sums``, ``gradient_movement``).

A stage loses its ``area x P`` less its model FLOPs; what binds it is its largest loss term.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cgc.machine.hardware.target import Target
from cgc.machine.program.artifact import Artifact
from cgc.machine.program.mode import Mode
from cgc.machine.timing.pipeline import Stage
from cgc.machine.timing.utilization import LABELS, KernelPlan, layer_kernels, wafer_terms

TERMS = (
    ("model_flops", "model FLOPs at peak"),
    ("arithmetic", LABELS["arithmetic"]),
    ("arrival", "operand arrival"),
    ("collectives", "broadcasts and reductions"),
    ("data_movement", LABELS["data_movement"]),
    ("weights_edge", LABELS["weights_edge"]),
    ("partial_sums", LABELS["partial_sums"]),
    ("gradient_movement", LABELS["gradient_movement"]),
    ("edge_io", LABELS["edge_io"]),
    ("input_link", "input links"),
    ("waiting", "waiting on the slowest stage"),
    ("idle", "PEs not placed"),
)
"""Where the compute bound goes, by key and label: the model's FLOPs at peak (their share is
the achieved throughput over the bound), then what the rest is lost to."""
BOUND_LABELS = dict(TERMS)
WORST = 3
"""Stages ``bound_lines`` names: those that lose the most."""


@dataclass(frozen=True)
class StageTime:
    """One stage's busy time per sample by term (seconds, not yet over its area), adding up
    to its service time; ``arithmetic`` is all its arithmetic, model FLOPs included."""

    name: str
    area: int
    flops: float
    """The model's FLOPs per sample on this stage."""
    terms: dict[str, float]

    @property
    def service_seconds(self) -> float:
        """Its service time per sample."""
        return sum(self.terms.values())


@dataclass(frozen=True)
class StageBound:
    """One stage's part of the whole: its area, service time, the share of the whole it
    loses (all of its ``area x period`` but its model FLOPs), what binds it (the key of its
    largest loss term) and its PE-time by term (shares of the whole)."""

    name: str
    area: int
    service_seconds: float
    loss: float
    bound: str
    shares: dict[str, float]


@dataclass(frozen=True)
class PipelineBound:
    """A pipeline's period against the ideal, the whole (``pes x period``) by term (shares
    adding up to one), and per stage its part."""

    ideal_seconds: float
    """Per sample: the model's FLOPs over every PE at peak."""
    period_seconds: float
    pes: int
    placed_pes: int
    shares: dict[str, float]
    stages: list[StageBound]

    @property
    def useful(self) -> float:
        """The share of model FLOPs: the achieved throughput over the compute bound."""
        return self.shares.get("model_flops", 0.0)

    def worst(self, count: int = WORST) -> list[StageBound]:
        """The ``count`` stages that lose the most, most first."""
        return sorted(self.stages, key=lambda s: -s.loss)[:count]

    def to_json(self) -> dict[str, Any]:
        """The ``compute_bound`` object of ``cgc inspect --json``."""
        return {**asdict(self), "useful": self.useful}


def _ordered(terms: Mapping[str, float]) -> dict[str, float]:
    """``terms`` in ``TERMS`` order, without the zero ones."""
    return {key: terms[key] for key, _ in TERMS if terms.get(key)}


def _stage(stage: StageTime, period: float, peak: float) -> dict[str, float]:
    """A stage's PE-seconds per sample by term: its busy time's terms times its area, its
    model FLOPs at peak taken out of its arithmetic, and its wait for the period."""
    terms = {key: stage.area * value for key, value in stage.terms.items()}
    useful = stage.flops / peak
    terms["arithmetic"] = terms.get("arithmetic", 0.0) - useful
    terms["model_flops"] = useful
    terms["waiting"] = stage.area * (period - stage.service_seconds)
    return terms


def decompose(stages: Sequence[StageTime], pes: int, peak: float) -> PipelineBound:
    """The whole, ``pes x period``, of a pipeline of ``stages`` on ``pes`` PEs of ``peak``
    FLOP/s each, by term (``TERMS``), and per stage its part."""
    period = max((s.service_seconds for s in stages), default=0.0)
    whole = pes * period
    placed = sum(s.area for s in stages)
    totals = {"idle": (pes - placed) * period}
    parts = []
    for stage in stages:
        terms = _stage(stage, period, peak)
        for key, value in terms.items():
            totals[key] = totals.get(key, 0.0) + value
        shares = _ordered({k: v / whole for k, v in terms.items()} if whole else {})
        lost = {k: v for k, v in shares.items() if k != "model_flops"}
        bound = max(lost, key=lost.__getitem__) if lost else ""
        loss = sum(lost.values())
        parts.append(StageBound(stage.name, stage.area, stage.service_seconds, loss, bound, shares))
    flops = sum(s.flops for s in stages)
    return PipelineBound(
        ideal_seconds=flops / (pes * peak) if pes and peak else 0.0,
        period_seconds=period,
        pes=pes,
        placed_pes=placed,
        shares=_ordered({k: v / whole for k, v in totals.items()} if whole else {}),
        stages=parts,
    )


def stage_time(
    stage: Stage,
    flops: float,
    area: int,
    kernels: Sequence[KernelPlan],
    target: Target,
    batch: int,
) -> StageTime:
    """A placed layer's busy time per sample by term: its wafer terms (``wafer_terms``,
    split), its host I/O's excess over them under ``edge_io``, and its busiest input link's
    excess over both (the three overlap: ``Stage.service_seconds``); ``flops``: its model
    FLOPs per run of ``batch``."""
    terms, _ = wafer_terms(stage.cycles, kernels, target.clock_hz, split=True)
    busy = sum(terms.values())
    host = stage.host_seconds(target)
    terms["edge_io"] += max(0.0, host - busy)
    terms["input_link"] = max(0.0, target.seconds(stage.link_cycles) - max(busy, host))
    return StageTime(stage.name, area, flops / batch, {k: v / batch for k, v in terms.items()})


def artifact_bound(artifact: Artifact, stages: Sequence[Stage]) -> PipelineBound | None:
    """Where a pipelined artifact's compute bound goes; ``stages``: its layers as pipeline
    stages (``cgc.machine.timing.pipeline.pipeline_stages``). None for another mode."""
    manifest, program = artifact.manifest, artifact.program
    if manifest["mode"] != Mode.PIPELINED:
        return None
    target = Target.from_json(manifest["target"])
    batch = manifest["micro_batch"] or 1
    known: dict[tuple[object, ...], list[KernelPlan]] = {}
    times = []
    for index, (layer, stage) in enumerate(zip(manifest["layers"], stages, strict=True)):
        info = program.layers[index]
        key = (program.layer_signatures[index], *info.rect)
        if key not in known:
            known[key] = layer_kernels(program, target, index)
        _, _, w, h = info.rect
        times.append(stage_time(stage, layer["flops"], w * h, known[key], target, batch))
    peak = target.peak_flops_per_pe_per_cycle() * target.clock_hz
    return decompose(times, target.pes, peak)
