"""The pipelined mode's timing: samples flowing one after another through placed stages.

Every layer is a stage on its own rectangle. A stage takes one sample at a time; its service
time per sample is the longest of its kernels' cycles, its host I/O and the busiest link of
the routes that feed it (a link moves one wavelet per cycle; the routing counted every route
sharing it), for a run of the per-system batch, over the batch: a stage receives the next
sample, from the host as from its producers, while it computes this one (its input buffer is
doubled, as the SDK's pipelines double theirs). A sample can start on a stage once every
producer has finished it and its tensors have crossed their routes' hops, once the host has
sent it (the host link streams the samples one after another, each taking the stage's host
I/O), and once the stage has finished the sample before:

    finish[i, s] = max(ready[i, s], finish[i, s - 1]) + service[i]
                 = (s + 1) * service[i] + max over k <= s of (ready[i, k] - k * service[i])

so the whole timeline is one cumulative maximum per stage over the samples; and as every
sample costs the same, that maximum is at ``k = 0`` or ``k = s`` (``simulate``), so a timeline
computes its first samples and its last, not all of them (a batch can have billions: time and
memory by the stages, not the samples). The fill is the first sample's latency through the
pipeline, the drain the time from the last sample's start to the end; in between the slowest
stage sets the rate.

The simulator times a system's runs with the layer records it made
(``cgc.machine.timing.run_stats``); ``cgc inspect`` times a compiled artifact with the costs
its manifest holds (``pipeline_stages``, ``pipeline_figures``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cgc.machine.hardware.target import Target
from cgc.machine.program.artifact import Artifact
from cgc.machine.program.bytecode import Route
from cgc.machine.timing.streaming import Span


@dataclass(frozen=True)
class Stage:
    """One layer as a pipeline stage; its costs are per run of the per-system batch."""

    name: str
    cycles: float
    """The layer's kernels (compute and the data movement inside its rectangle)."""
    host_bytes: float
    """Bytes to and from the host (graph inputs and outputs)."""
    routes: tuple[Route, ...]
    """How its inputs from other stages reach it."""

    @property
    def link_cycles(self) -> float:
        """The busiest link of the routes that feed it."""
        return float(max((r.busiest for r in self.routes), default=0))

    def host_seconds(self, target: Target) -> float:
        """Its inputs from and outputs to the host, for a run of the batch."""
        return self.host_bytes / target.io_bytes_per_s

    def service_seconds(self, target: Target, batch: int) -> float:
        """How long the stage holds one sample of a batch of ``batch``: the longest of its
        kernels, its host I/O and its busiest input link, which overlap."""
        links = target.seconds(self.link_cycles)
        return max(target.seconds(self.cycles), self.host_seconds(target), links) / batch


SHOWN = 64
"""Samples a timeline keeps one by one, from the first: a batch can have billions, and the
rest follow the same recurrence (its spans summarize them)."""


@dataclass(frozen=True)
class PipelineTimeline:
    """When every stage starts and finishes the first ``SHOWN`` samples and the last."""

    stages: list[Stage]
    samples: int
    start: np.ndarray
    """``[stage, sample]`` seconds, for the first ``min(samples, SHOWN)`` samples."""
    finish: np.ndarray
    rest_start: np.ndarray
    """``[stage]`` seconds: when each stage starts the first sample after ``start``'s (the
    last sample when there is none)."""
    last_start: np.ndarray
    """``[stage]`` seconds: when each stage starts the last sample."""
    last_finish: np.ndarray
    service: np.ndarray
    """Seconds per sample, per stage."""

    @property
    def seconds(self) -> float:
        """From the first sample entering to the last leaving."""
        return float(self.last_finish.max(initial=0.0))

    @property
    def fill_seconds(self) -> float:
        """The first sample's latency: until every stage has finished it."""
        return float(self.finish[:, 0].max(initial=0.0)) if self.finish.size else 0.0

    @property
    def drain_seconds(self) -> float:
        """From the last sample's first start (on the stage that takes it first) to the
        end."""
        if not self.finish.size:
            return 0.0
        return self.seconds - float(self.last_start.min())

    @property
    def period_seconds(self) -> float:
        """The slowest stage's service time: the steady state's time per sample."""
        return float(self.service.max(initial=0.0))

    def spans(self, track: str) -> list[Span]:
        """A span per stage and sample of the first ``SHOWN`` samples, on a track per stage
        named after ``track``, and one per stage for the samples after them."""
        shown = self.start.shape[1]
        out: list[Span] = []
        for index, stage in enumerate(self.stages):
            name = f"{track}: {stage.name}"
            times = zip(self.start[index], self.finish[index], strict=True)
            out += [Span(name, f"sample {s}", float(b), float(e)) for s, (b, e) in enumerate(times)]
            if self.samples > shown:
                rest = f"samples {shown}-{self.samples - 1}"
                begin, end = float(self.rest_start[index]), float(self.last_finish[index])
                out.append(Span(name, rest, begin, end))
        return out


def sampled(samples: int) -> np.ndarray:
    """The samples a timeline of ``samples`` samples computes: the first ``SHOWN``, the one
    after them and the last (ascending, without repeats)."""
    head = np.arange(min(samples, SHOWN + 1))
    return np.unique(np.append(head, samples - 1)) if samples else head


def simulate(stages: Sequence[Stage], target: Target, samples: int, batch: int) -> PipelineTimeline:
    """The timeline of ``samples`` samples through ``stages`` (in program order: producers
    first) whose costs are for runs of ``batch`` samples.

    Only the ``sampled`` samples are computed, exactly as if all were: a stage's ready time is
    the latest of lines in the sample (every sample costs the same), so ``ready[k] - k *
    service`` is convex in ``k`` and its maximum over ``k <= s`` is at ``k = 0`` or ``k = s``,
    both sampled. Its finish times are again the latest of lines, and so on down the stages.
    """
    service = np.array([s.service_seconds(target, batch) for s in stages])
    count = sampled(samples)
    finish = np.zeros((len(stages), count.size))
    for index, stage in enumerate(stages):
        ready = (count + 1) * stage.host_seconds(target) / batch
        for route in stage.routes:
            ready = np.maximum(ready, finish[route.source] + target.seconds(route.hops))
        slack = np.maximum.accumulate(ready - count * service[index])
        finish[index] = (count + 1) * service[index] + slack
    start = finish - service[:, None]
    shown = min(samples, SHOWN)
    # columns: the shown samples, the one after them and the last (none without samples)
    rest, last = (min(shown, count.size - 1), -1) if samples else (slice(0), slice(0))
    return PipelineTimeline(
        list(stages),
        samples,
        start[:, :shown],
        finish[:, :shown],
        start[:, rest],
        start[:, last],
        finish[:, last],
        service,
    )


def stage_figures(timeline: PipelineTimeline, target: Target, batch: int) -> list[dict[str, Any]]:
    """Per stage and sample: its service time and what bounds it, and how busy the stage
    was over the whole run."""
    total = timeline.seconds
    samples = timeline.samples
    out = []
    for stage, service in zip(timeline.stages, timeline.service, strict=True):
        out.append(
            {
                "name": stage.name,
                "service_seconds": float(service),
                "compute_seconds": target.seconds(stage.cycles) / batch,
                "link_seconds": target.seconds(stage.link_cycles) / batch,
                "busy_fraction": float(samples * service / total) if total else 0.0,
            }
        )
    return out


def route_figures(timeline: PipelineTimeline, target: Target, batch: int) -> list[dict[str, Any]]:
    """Per route: its tensor's wavelets per sample and its busiest link's share of the whole
    run's cycles."""
    cycles = timeline.seconds * target.clock_hz
    runs = timeline.samples / batch
    out = []
    for stage in timeline.stages:
        for route in stage.routes:
            out.append(
                {
                    "source": timeline.stages[route.source].name,
                    "consumer": stage.name,
                    "color": route.color,
                    "lanes": route.lanes,
                    "hops": route.hops,
                    "wavelets_per_sample": route.wavelets / batch,
                    "busiest_link_wavelets_per_sample": route.busiest / batch,
                    "busiest_link_load": runs * route.busiest / cycles if cycles else 0.0,
                }
            )
    return out


def pipeline_stages(artifact: Artifact) -> list[Stage]:
    """A pipelined artifact's layers as stages, with the compiler's costs."""
    return [
        Stage(layer["name"], layer["cycles"], layer["host_bytes"], info.routes)
        for layer, info in zip(artifact.manifest["layers"], artifact.program.layers, strict=True)
    ]


def pipeline_figures(artifact: Artifact) -> dict[str, float]:
    """Throughput of a pipelined artifact (its slowest stage or link) against the compute
    bound, and the latency of one sample through it."""
    target = Target.from_json(artifact.manifest["target"])
    batch = artifact.manifest["micro_batch"] or 1
    timeline = simulate(pipeline_stages(artifact), target, 1, batch)
    flops = sum(layer["flops"] for layer in artifact.manifest["layers"]) / batch
    peak = target.pes * target.peak_flops_per_pe_per_cycle() * target.clock_hz
    period = timeline.period_seconds
    return {
        "samples_per_second": 1 / period if period else 0.0,
        "bound_samples_per_second": peak / flops if flops else 0.0,
        "latency_seconds": timeline.fill_seconds,
    }
