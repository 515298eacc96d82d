"""K simulated systems, MemoryX and SwarmX running one artifact, and what a run costs.

The ``Cluster`` splits the samples into chunks of the per-system batch, gives chunk ``c`` to
system ``c mod K`` (an ``Executor`` of ``cgc.runtime.vm`` per chunk), and turns the layer
records into time:

* pipelined: every layer is a pipeline stage on its own rectangle; a layer's inputs from other
  layers arrive on its rectangle over their routes, and a system's runs flow through the
  stages as ``cgc.runtime.pipeline`` times them (the slowest stage or link sets the rate);
* weight streaming: layers run one after another on the wafer; the weights of a layer stream
  while the previous layer computes (one layer of look-ahead), a layer ends no earlier than
  its weights have arrived, gradients leave on the egress link as their layer finishes, and a
  training step ends with SwarmX's last reduction and MemoryX's update.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cgc.errors import CgcError
from cgc.machine import dtypes
from cgc.machine.artifact import Artifact
from cgc.machine.cost import Sram
from cgc.machine.target import Target
from cgc.runtime import pipeline
from cgc.runtime.memoryx import MemoryX
from cgc.runtime.swarmx import SwarmX
from cgc.runtime.vm import Executor, System


@dataclass(frozen=True)
class Span:
    """One interval on a timeline track, in seconds."""

    track: str
    name: str
    start: float
    end: float


@dataclass
class RunStats:
    """What a run or a training step cost on the simulated cluster."""

    mode: str
    target: str
    num_csx: int
    batch_size: int
    per_system_batch: int
    simulated_seconds: float
    clock_hz: float
    pe_utilization: float
    peak_pe_sram_bytes: int
    layers: list[dict] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    wavelet_hops: float = 0.0
    pipeline: dict | None = None
    """Pipelined mode: the pipeline's rate, fill and drain, stages and routes."""

    @property
    def simulated_cycles(self) -> int:
        """The run's length in cycles of the wafer clock."""
        return round(self.simulated_seconds * self.clock_hz)

    @property
    def samples_per_second(self) -> float:
        """Samples processed per simulated second."""
        return self.batch_size / self.simulated_seconds if self.simulated_seconds else 0.0

    def to_json(self) -> dict:
        """The ``--stats-json`` object."""
        return {
            "mode": self.mode,
            "target": self.target,
            "num_csx": self.num_csx,
            "batch_size": self.batch_size,
            "per_system_batch": self.per_system_batch,
            "simulated_cycles": self.simulated_cycles,
            "simulated_seconds": self.simulated_seconds,
            "samples_per_second": self.samples_per_second,
            "pe_utilization": self.pe_utilization,
            "peak_pe_sram_bytes": self.peak_pe_sram_bytes,
            "wavelet_hops": self.wavelet_hops,
            "layers": self.layers,
            **({"pipeline": self.pipeline} if self.pipeline is not None else {}),
        }


class Cluster:
    """K systems, MemoryX and SwarmX running one artifact."""

    def __init__(self, artifact: Artifact, num_csx: int | None = None, numerics: bool = True):
        manifest = artifact.manifest
        self.artifact = artifact
        self.manifest = manifest
        self.program = artifact.program
        self.target = Target.from_json(manifest["target"])
        self.mode = manifest["mode"]
        self.num_csx = manifest["num_csx"] if num_csx is None else num_csx
        if self.num_csx < 1:
            raise CgcError(f"--num-csx must be at least 1, got {self.num_csx}")
        self.numerics = numerics
        self.memoryx = MemoryX(artifact.weights, self.target)
        self.swarmx = SwarmX(self.num_csx, self.target)
        self.grad_norm: float | None = None
        """The global norm of the last training step's summed gradients, before clipping."""
        self.systems = [System(Sram(self.target)) for _ in range(self.num_csx)]
        # a model without a batch axis runs its fixed shapes as one sample per system
        self.batch = manifest["per_system_batch"] or 1

    def _chunks(self, inputs: Mapping[str, np.ndarray]) -> list[list[np.ndarray]]:
        """Splits the inputs into per-system chunks of the compiled batch."""
        specs = self.manifest["inputs"]
        missing = [s["name"] for s in specs if s["name"] not in inputs]
        if missing:
            raise CgcError(
                f"missing inputs {missing}; the model takes {[s['name'] for s in specs]}"
            )
        arrays = []
        samples = None
        for spec in specs:
            array = np.asarray(inputs[spec["name"]])
            want = tuple(spec["shape"])
            if dtypes.dtype(spec["dtype"]) != array.dtype:
                if not np.can_cast(array.dtype, spec["dtype"], casting="same_kind"):
                    raise CgcError(
                        f"input '{spec['name']}' has dtype {array.dtype}; the model takes "
                        f"{spec['dtype']}"
                    )
                array = array.astype(spec["dtype"])
            batched = spec["batch_axis"] == 0
            if batched:
                if array.shape[1:] != want[1:] or array.ndim != len(want):
                    raise CgcError(
                        f"input '{spec['name']}' has shape {array.shape}; the model takes "
                        f"(samples, {', '.join(map(str, want[1:]))})"
                    )
                if samples is not None and array.shape[0] != samples:
                    raise CgcError("batched inputs have different numbers of samples")
                samples = array.shape[0]
            elif array.shape != want:
                raise CgcError(
                    f"input '{spec['name']}' has shape {array.shape}; the model takes {want}"
                )
            arrays.append((array, batched))
        if samples is None:
            return [[a for a, _ in arrays]]
        if samples == 0 or samples % self.batch:
            raise CgcError(
                f"{samples} samples is not a multiple of the compiled per-system batch "
                f"{self.batch}; compile with --batch-size to match"
            )
        return [
            [a[c * self.batch : (c + 1) * self.batch] if b else a for a, b in arrays]
            for c in range(samples // self.batch)
        ]

    def _execute(self, system: int, chunk: Sequence[np.ndarray]) -> Executor:
        executor = Executor(
            self.program,
            self.target,
            self.systems[system],
            self.memoryx if self.numerics else None,
            deliver=self.mode == "pipelined",
        )
        executor.run(chunk)
        return executor

    def infer(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], RunStats]:
        """Runs the samples in ``inputs`` and returns the outputs and the run's statistics."""
        chunks = self._chunks(inputs)
        runs = [self._execute(c % self.num_csx, chunk) for c, chunk in enumerate(chunks)]
        per_system = [runs[k :: self.num_csx] for k in range(self.num_csx)]
        outputs = self._gather_outputs(runs) if self.numerics else {}
        return outputs, self._stats(per_system, len(chunks) * self.batch, training=False)

    def loss(self, batch: Mapping[str, np.ndarray], loss_scale: float) -> float:
        """The loss (first output) of the global batch in ``batch``, forward only: each
        system's share scaled by ``loss_scale`` as in a training step."""
        runs = [
            self._execute(c % self.num_csx, chunk) for c, chunk in enumerate(self._chunks(batch))
        ]
        return sum(float(run.outputs[0]) for run in runs) * loss_scale

    def _gather_outputs(self, runs: Sequence[Executor]) -> dict[str, np.ndarray]:
        outputs: dict[str, np.ndarray] = {}
        for index, spec in enumerate(self.manifest["outputs"]):
            parts = [run.outputs[index] for run in runs]
            if spec["batch_axis"] == 0:
                outputs[spec["name"]] = np.concatenate(parts, axis=0)
            elif len(parts) == 1:
                outputs[spec["name"]] = parts[0]
            else:
                raise CgcError(
                    f"output '{spec['name']}' has no batch axis; run exactly {self.batch} samples"
                )
        return outputs

    def train_step(
        self,
        batch: Mapping[str, np.ndarray],
        lr_factor: float = 1.0,
        max_grad_norm: float | None = None,
    ) -> tuple[float, RunStats]:
        """One training step on the global batch in ``batch``, the learning rate scaled by
        ``lr_factor`` and the gradients clipped to a global norm of ``max_grad_norm``; returns
        the loss (``grad_norm`` keeps the gradients' norm before clipping)."""
        chunks = self._chunks(batch)
        if len(chunks) != self.num_csx:
            raise CgcError(
                f"a training step takes {self.num_csx * self.batch} samples "
                f"({self.num_csx} systems x {self.batch}); got {len(chunks) * self.batch}"
            )
        runs = [self._execute(k, chunk) for k, chunk in enumerate(chunks)]
        if self.numerics:
            self._reduce_gradients(runs)
            if runs[0].optimizer is not None:
                self.grad_norm = self.memoryx.apply(
                    *runs[0].optimizer, lr_factor=lr_factor, max_grad_norm=max_grad_norm
                )
        stats = self._stats([[r] for r in runs], len(chunks) * self.batch, training=True)
        # Each system's loss covers its slice; the seed of its backward pass was loss_scale
        # (1/K for a mean over the batch, 1 for a sum), and so is its share of the loss.
        losses = [float(r.outputs[0]) for r in runs] if self.numerics else [0.0]
        return sum(losses) * self.manifest["training"]["loss_scale"], stats

    def _reduce_gradients(self, runs: Sequence[Executor]) -> None:
        for position, (name, perm, _) in enumerate(runs[0].gradients):
            summed = self.swarmx.reduce([run.gradient(position) for run in runs])
            self.memoryx.receive(name, summed, perm)

    def _stats(self, per_system: Sequence[Sequence[Executor]], samples: int, training: bool):
        timelines = [self._timeline(k, runs, training) for k, runs in enumerate(per_system)]
        seconds = max(end for end, _ in timelines)
        # MemoryX and SwarmX serve every system at once: their spans, the same in each
        # system's timeline, appear once
        spans = list(dict.fromkeys(s for _, system_spans in timelines for s in system_spans))
        records = [r for runs in per_system for run in runs for r in run.records]
        figures = None
        if self.mode == "pipelined" and per_system[0]:
            figures = self._pipeline_figures(per_system[0])
        fmacs = sum(r.fmacs for r in records)
        peak_rate = self.target.pes * self.target.fmacs_32bit * self.target.clock_hz
        utilization = fmacs / (peak_rate * seconds * self.num_csx) if seconds else 0.0
        return RunStats(
            mode=self.mode,
            target=self.target.name,
            num_csx=self.num_csx,
            batch_size=samples,
            per_system_batch=self.batch,
            simulated_seconds=seconds,
            clock_hz=self.target.clock_hz,
            pe_utilization=utilization,
            peak_pe_sram_bytes=max(s.sram.peak for s in self.systems),
            layers=self._layer_summary(per_system),
            spans=spans,
            wavelet_hops=sum(r.wavelet_hops for r in records),
            pipeline=figures,
        )

    def _pipeline_figures(self, runs: Sequence[Executor]) -> dict:
        """System 0's pipeline: rate, fill and drain, every stage and route."""
        timeline = self._pipeline(runs)
        period = timeline.period_seconds
        return {
            "samples": len(runs) * self.batch,
            "period_seconds": period,
            "steady_samples_per_second": 1 / period if period else 0.0,
            "fill_seconds": timeline.fill_seconds,
            "drain_seconds": timeline.drain_seconds,
            "stages": pipeline.stage_figures(timeline, self.target, self.batch),
            "routes": pipeline.route_figures(timeline, self.target, self.batch),
        }

    def _layer_summary(self, per_system: Sequence[Sequence[Executor]]) -> list[dict]:
        first = next((runs[0] for runs in per_system if runs), None)
        if first is None:
            return []
        return [
            {
                "name": r.name,
                "cycles": r.cycles,
                "flops": r.flops,
                "stream_in_bytes": r.stream_in_bytes,
                "stream_out_bytes": r.stream_out_bytes,
            }
            for r in first.records
        ]

    def _timeline(self, system: int, runs: Sequence[Executor], training: bool):
        track = f"system {system}"
        if self.mode == "pipelined":
            timeline = self._pipeline(runs)
            samples = [
                Span(f"{track}: {stage.name}", f"sample {sample}", float(begin), float(end))
                for stage, starts, ends in zip(
                    timeline.stages, timeline.start, timeline.finish, strict=True
                )
                for sample, (begin, end) in enumerate(zip(starts, ends, strict=True))
            ]
            return timeline.seconds, samples
        clock = 0.0
        spans: list[Span] = []
        for run in runs:
            clock = self._streaming_chunk(run, clock, track, spans)
        if training and runs:
            names = {name for name, _, _ in runs[0].gradients}
            update = self.memoryx.update_seconds(sum(self.memoryx.weights[n].size for n in names))
            spans.append(Span("MemoryX", "optimizer update", clock, clock + update))
            clock += update
        return clock, spans

    def _pipeline(self, runs: Sequence[Executor]) -> pipeline.Timeline:
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
            for record, layer in zip(runs[0].records, self.program.layers, strict=True)
        ]
        return pipeline.simulate(stages, self.target, len(runs) * self.batch, self.batch)

    def _streaming_chunk(self, run: Executor, start: float, track: str, spans: list[Span]):
        """Places one chunk's layers on the weight-streaming timeline; returns its end.

        The ingress link carries one layer's weights after another, each starting once the
        layer before it has started (one layer of look-ahead buffer); a stream arrives the
        tree's latency after it leaves. Gradients share the egress link the same way.
        """
        seconds, swarmx = self.target.seconds, self.swarmx
        previous_start = layer_end = link_free = egress_free = egress_end = start
        for record in run.records:
            arrive = layer_end
            if record.stream_in_bytes:
                send = max(link_free, previous_start)
                link_free = send + swarmx.link_seconds(record.stream_in_bytes)
                arrive = link_free + swarmx.latency_seconds
                spans.append(Span("MemoryX -> SwarmX", f"{record.name} weights", send, arrive))
            begin = layer_end + record.host_in_bytes / self.target.io_bytes_per_s
            layer_end = max(begin + seconds(record.cycles), arrive)
            layer_end += record.host_out_bytes / self.target.io_bytes_per_s
            spans.append(Span(track, record.name, begin, layer_end))
            previous_start = begin
            if record.stream_out_bytes:
                send = max(egress_free, layer_end)
                egress_free = send + swarmx.link_seconds(record.stream_out_bytes)
                egress_end = egress_free + swarmx.latency_seconds
                spans.append(
                    Span("SwarmX -> MemoryX", f"{record.name} gradients", send, egress_end)
                )
        return max(layer_end, egress_end)


def run(artifact: Artifact, inputs: Mapping[str, np.ndarray], num_csx: int | None = None):
    """Runs an artifact on the simulator; returns ``(outputs, stats)``."""
    return Cluster(artifact, num_csx).infer(inputs)
