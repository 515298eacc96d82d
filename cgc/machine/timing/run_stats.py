"""What runs of a program on K systems cost: one system's layer records (``LayerRecord``,
every run of the program costs the same) made into each system's timeline in the program's
mode, and the run's statistics (``RunStats``: time, rates, MFU, MemoryX's footprint).

``RunTiming`` asks ``cgc.machine.timing.pipeline`` (pipelined: every layer a stage on its own
rectangle, a system's runs flowing through the stages) or ``cgc.machine.timing.streaming``
(weight streaming: layers one after another on the wafer, their weights and gradients
streaming through SwarmX, a training step ending with MemoryX's update). Systems that run as
many chunks share one timeline (one track in a trace). The simulator (``cgc.runtime.cluster``)
runs the program and hands its records here; a ``Simulation`` is a timing-only run's steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from cgc.machine.hardware.target import ASSUMED, Target
from cgc.machine.program.artifact import WeightSpec
from cgc.machine.program.bytecode import RECOMPUTED_SUFFIX, Opcode, Program
from cgc.machine.program.mode import Mode
from cgc.machine.timing import pipeline, streaming
from cgc.machine.timing.cost import LayerRecord
from cgc.machine.timing.streaming import Span, Tree
from cgc.machine.training.optimizers import Footprint


@dataclass
class RunStats:
    """What a run or a training step cost on the simulated cluster."""

    mode: Mode
    target: str
    num_csx: int
    batch_size: int
    per_system_batch: int
    """The samples the busiest system takes."""
    simulated_seconds: float
    clock_hz: float
    pe_utilization: float
    peak_pe_sram_bytes: int
    layers: list[dict[str, Any]] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    wavelet_hops: float = 0.0
    pipeline: dict[str, Any] | None = None
    """Pipelined mode: the pipeline's rate, fill and drain, stages and routes."""
    micro_batches: int = 1
    """Runs of the program each system makes per training step (or batch)."""
    micro_batch: int = 1
    """The samples of one run of the program."""
    model_flops: float = 0.0
    """The model's FLOPs in the run, over all systems (recomputed activations left out)."""
    peak_flops_per_second: float = 0.0
    """The cluster's peak in the model's compute type."""
    tokens_per_sample: int | None = None
    memoryx: Footprint | None = None
    memoryx_capacity_bytes: int = 0
    bound: str | None = None
    """Weight streaming: what bounds the run (``streaming.BOUNDS``)."""
    update_seconds: float = 0.0

    @property
    def simulated_cycles(self) -> int:
        """The run's length in cycles of the wafer clock."""
        return round(self.simulated_seconds * self.clock_hz)

    @property
    def samples_per_second(self) -> float:
        """Samples processed per simulated second."""
        return self.batch_size / self.simulated_seconds if self.simulated_seconds else 0.0

    @property
    def tokens_per_second(self) -> float | None:
        """Tokens processed per simulated second, for a model of sequences."""
        if self.tokens_per_sample is None:
            return None
        return self.samples_per_second * self.tokens_per_sample

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization: the model's FLOPs per second over the cluster's peak."""
        if not self.simulated_seconds or not self.peak_flops_per_second:
            return 0.0
        return self.model_flops / self.simulated_seconds / self.peak_flops_per_second

    def to_json(self) -> dict[str, Any]:
        """The ``--stats-json`` object."""
        out: dict[str, Any] = {
            "mode": self.mode,
            "target": self.target,
            "num_csx": self.num_csx,
            "batch_size": self.batch_size,
            "per_system_batch": self.per_system_batch,
            "micro_batch": self.micro_batch,
            "micro_batches": self.micro_batches,
            "simulated_cycles": self.simulated_cycles,
            "simulated_seconds": self.simulated_seconds,
            "samples_per_second": self.samples_per_second,
            "tokens_per_second": self.tokens_per_second,
            "model_flops": self.model_flops,
            "mfu": self.mfu,
            "pe_utilization": self.pe_utilization,
            "peak_pe_sram_bytes": self.peak_pe_sram_bytes,
            "wavelet_hops": self.wavelet_hops,
            "bound": self.bound,
            "memoryx_update_seconds": self.update_seconds,
            "layers": self.layers,
        }
        if self.memoryx is not None:
            out["memoryx"] = {
                "weights_bytes": self.memoryx.weights,
                "gradients_bytes": self.memoryx.gradients,
                "optimizer_state_bytes": self.memoryx.optimizer_state,
                "total_bytes": self.memoryx.total,
                "capacity_bytes": self.memoryx_capacity_bytes,
            }
        if self.pipeline is not None:
            out["pipeline"] = self.pipeline
        return out


def system_tracks(runs_per_system: Sequence[int]) -> dict[int, str]:
    """One track name per distinct number of runs, naming the systems that made them: systems
    that run as often share a timeline (``system 0``, ``systems 0-3``)."""
    groups: dict[int, list[int]] = {}
    for system, runs in enumerate(runs_per_system):
        groups.setdefault(runs, []).append(system)
    names = {}
    for runs, members in groups.items():
        contiguous = members == list(range(members[0], members[-1] + 1))
        if len(members) == 1:
            names[runs] = f"system {members[0]}"
        elif contiguous:
            names[runs] = f"systems {members[0]}-{members[-1]}"
        else:
            names[runs] = "systems " + ", ".join(map(str, members))
    return names


@dataclass(frozen=True)
class Simulation:
    """``steps`` steps (training) or batches (inference) of an artifact, timed."""

    stats: RunStats
    """One step (or one global batch)."""
    steps: int
    training: bool
    target: Target
    """The target simulated (the artifact's, with any figures changed)."""

    @property
    def seconds(self) -> float:
        """All the steps, one after another."""
        return self.steps * self.stats.simulated_seconds

    @property
    def assumed(self) -> dict[str, float]:
        """The unpublished figures of the target and their values in this simulation."""
        figures = self.target.to_json()
        return {name: figures[name] for name in ASSUMED}

    def spans(self, steps: int | None = None) -> list[Span]:
        """The timeline of the first ``steps`` steps (default: all), one after another."""
        step = self.stats.simulated_seconds
        shown = self.steps if steps is None else min(steps, self.steps)
        if self.steps == 1:
            return list(self.stats.spans)
        return [
            Span(s.track, f"{s.name} (step {k + 1})", s.start + k * step, s.end + k * step)
            for k in range(shown)
            for s in self.stats.spans
        ]

    def to_json(self) -> dict[str, Any]:
        """The statistics of one step, and the whole run's figures."""
        return {
            **self.stats.to_json(),
            "timing_only": True,
            "training": self.training,
            "steps": self.steps,
            "total_simulated_seconds": self.seconds,
            "assumed": self.assumed,
        }


@dataclass(frozen=True)
class RunTiming:
    """What runs of ``program`` on ``num_csx`` systems of ``target`` cost, from the layer
    records of one run of it on one system."""

    program: Program
    target: Target
    mode: Mode
    num_csx: int
    batch: int
    """The samples of one run of the program."""
    micro_batches: int
    """Runs of the program each system makes per training step (or batch)."""
    tokens_per_sample: int | None
    specs: Mapping[str, WeightSpec]
    """Every weight's shape: a dense trained weight's parameters, which MemoryX updates."""

    @cached_property
    def tree(self) -> Tree:
        """The SwarmX tree between MemoryX and the systems."""
        return Tree(self.num_csx, self.target)

    def stats(
        self,
        records: Sequence[LayerRecord] | None,
        chunks: int,
        training: bool,
        sram_peak: int,
        footprint: Footprint,
    ) -> RunStats:
        """The statistics of ``chunks`` chunks, each a run whose layers did as ``records``
        say (None: no run was made), chunk ``c`` on system ``c mod K``; ``sram_peak``: the
        most bytes a PE held, ``footprint``: what MemoryX holds."""
        per_system = [len(range(k, chunks, self.num_csx)) for k in range(self.num_csx)]
        layers = records or []
        timelines = {
            count: self.timeline(layers, track, count, training)
            for count, track in system_tracks(per_system).items()
            if count
        }
        seconds = max((end for end, _ in timelines.values()), default=0.0)
        # MemoryX and SwarmX serve every system at once: their spans appear once
        spans = list(dict.fromkeys(s for _, group in timelines.values() for s in group))
        flops = 2 * chunks * sum(r.fmacs for r in layers)
        utilization = flops / (self.peak_flops() * seconds * self.num_csx) if seconds else 0.0
        figures = streaming_figures = None
        if self.mode == Mode.PIPELINED and records is not None:
            figures = self.pipeline_figures(layers, per_system[0])
        elif records is not None:
            streaming_figures = self.streaming(layers, per_system[0], training)
        stats = RunStats(
            mode=self.mode,
            target=self.target.name,
            num_csx=self.num_csx,
            batch_size=chunks * self.batch,
            per_system_batch=max(per_system, default=0) * self.batch,
            simulated_seconds=seconds,
            clock_hz=self.target.clock_hz,
            pe_utilization=utilization,
            peak_pe_sram_bytes=sram_peak,
            layers=self.layer_summary(layers, streaming_figures),
            spans=spans,
            wavelet_hops=chunks * sum(r.wavelet_hops for r in layers),
            pipeline=figures,
            micro_batches=self.micro_batches,
            micro_batch=self.batch,
            model_flops=chunks
            * sum(r.flops for r in layers if not r.name.endswith(RECOMPUTED_SUFFIX)),
            peak_flops_per_second=self.num_csx * self.peak_flops(),
            tokens_per_sample=self.tokens_per_sample,
            memoryx=footprint,
            memoryx_capacity_bytes=self.target.memoryx_capacity_bytes,
        )
        if streaming_figures is not None:
            stats.bound = streaming_figures.bound
            stats.update_seconds = streaming_figures.update_seconds
        return stats

    def peak_flops(self) -> float:
        """One system's peak FLOP rate in the type of the program's matmuls."""
        flops = self.target.peak_flops_per_pe_per_cycle(self.program.compute_dtype)
        return self.target.pes * flops * self.target.clock_hz

    def layer_summary(
        self, records: Sequence[LayerRecord], streamed: streaming.StreamingTimeline | None
    ) -> list[dict[str, Any]]:
        """Per layer: its cycles, FLOPs and streams, and (weight streaming) its figures on
        the timeline of ``streamed``."""
        summary: list[dict[str, Any]] = [
            {
                "name": r.name,
                "cycles": r.cycles,
                "flops": r.flops,
                "stream_in_bytes": r.stream_in_bytes,
                "stream_out_bytes": r.stream_out_bytes,
            }
            for r in records
        ]
        if streamed is not None:
            for entry, times in zip(summary, streamed.layers, strict=True):
                entry.update({k: v for k, v in times.to_json().items() if k != "name"})
        return summary

    def timeline(
        self, records: Sequence[LayerRecord], track: str, runs: int, training: bool
    ) -> tuple[float, list[Span]]:
        """One system's timeline of ``runs`` runs: its end and its spans."""
        if self.mode == Mode.PIPELINED:
            timeline = self.pipeline(records, runs)
            return timeline.seconds, timeline.spans(track)
        streamed = self.streaming(records, runs, training, track)
        return streamed.seconds, streamed.spans

    def pipeline_figures(self, records: Sequence[LayerRecord], runs: int) -> dict[str, Any]:
        """System 0's pipeline: rate, fill and drain, every stage and route."""
        timeline = self.pipeline(records, runs)
        period = timeline.period_seconds
        return {
            "samples": runs * self.batch,
            "period_seconds": period,
            "steady_samples_per_second": 1 / period if period else 0.0,
            "fill_seconds": timeline.fill_seconds,
            "drain_seconds": timeline.drain_seconds,
            "stages": pipeline.stage_figures(timeline, self.target, self.batch),
            "routes": pipeline.route_figures(timeline, self.target, self.batch),
        }

    def pipeline(self, records: Sequence[LayerRecord], runs: int) -> pipeline.PipelineTimeline:
        """One system's samples through the placed stages."""
        if not runs or not self.program.layers:
            return pipeline.simulate([], self.target, 0, self.batch)
        stages = [
            pipeline.Stage(
                record.name,
                record.cycles,
                record.host_in_bytes + record.host_out_bytes,
                layer.routes,
            )
            for record, layer in zip(records, self.program.layers, strict=True)
        ]
        return pipeline.simulate(stages, self.target, runs * self.batch, self.batch)

    def streaming(
        self, records: Sequence[LayerRecord], runs: int, training: bool, track: str = ""
    ) -> streaming.StreamingTimeline:
        """One system's runs through the weight-streaming timeline."""
        updates = self.update_parameters() if training else {}
        layers = [
            streaming.Layer(
                r.name,
                r.cycles,
                r.host_in_bytes,
                r.host_out_bytes,
                r.stream_in_bytes,
                r.stream_out_bytes,
                updates.get(index, 0),
            )
            for index, r in enumerate(records)
        ]
        return streaming.simulate(layers, self.target, self.tree, runs, training, track)

    def update_parameters(self) -> dict[int, int]:
        """Per layer, the parameters of the trained weights it is the first to stream
        (MemoryX updates each once per step, in the order the next step needs them; a sparse
        weight's live ones)."""
        trained = {
            ins.attrs["name"]
            for ins in self.program.instructions
            if ins.opcode == Opcode.STREAM_GRADIENT
        }
        first: dict[str, int] = {}
        for index, span in enumerate(self.program.layer_spans):
            for position in span:
                ins = self.program.instructions[position]
                if ins.opcode == Opcode.STREAM_WEIGHT and ins.attrs["name"] in trained:
                    first.setdefault(ins.attrs["name"], index)
        counts: dict[int, int] = {}
        sparse = self.program.sparse
        for name, index in first.items():
            size = sparse[name].live if name in sparse else self.specs[name].size
            counts[index] = counts.get(index, 0) + size
        return counts
