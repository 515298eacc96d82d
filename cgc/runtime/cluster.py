"""K simulated systems, MemoryX and SwarmX running one artifact, and what a run costs.

The ``Cluster`` splits the samples into chunks of the compiled batch (a training step's
micro-batches), gives chunk ``c`` to system ``c mod K`` (an ``Executor`` of
``cgc.runtime.vm`` per chunk), and turns the layer records into time:

* pipelined: every layer is a pipeline stage on its own rectangle; a layer's inputs from other
  layers arrive on its rectangle over their routes, and a system's runs flow through the
  stages as ``cgc.runtime.pipeline`` times them (the slowest stage or link sets the rate);
* weight streaming: layers run one after another on the wafer, their weights and gradients
  streaming through SwarmX as ``cgc.machine.timing.streaming`` times them; a training step ends with
  SwarmX's last reduction and MemoryX's update.

The timing never depends on the values: every run of the program costs the same, and systems
that run as many chunks share one timeline (one track in a trace). A timing-only cluster
(``numerics=False``) runs the program once, on shapes, whatever the number of systems and
samples: it needs no inputs and no weight data.

``open_cluster`` makes the cluster of an executor (``cgc.runtime.executors``): this class runs the
systems one after another in this process; on Ray (``cgc.runtime.ray_cluster``) they are
actors, with the same numbers and the same timing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cgc.errors import CgcError
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import Target, checked_systems
from cgc.machine.program.artifact import Artifact
from cgc.machine.program.bytecode import Opcode
from cgc.machine.reference.indexing import first_bad
from cgc.machine.sparse import sparsity
from cgc.machine.timing import streaming
from cgc.machine.timing.cost import LayerRecord, Sram
from cgc.machine.timing.streaming import Span
from cgc.machine.training.optimizers import Footprint
from cgc.runtime import pipeline
from cgc.runtime.executors import LOCAL, Backend, connect
from cgc.runtime.memoryx import MemoryX
from cgc.runtime.swarmx import SwarmX
from cgc.runtime.vm import Executor, OnLayer, System

OnStep = Callable[[int, int, str], None]
"""Told of each layer of each run of a cluster's call as it begins: its number among the
layers of all the runs (from 1), their count, and its name and run."""

RECOMPUTED = ".recompute"
"""The name suffix of the layers that compute forward activations again for the backward
pass: their FLOPs are not the model's."""


@dataclass
class RunStats:
    """What a run or a training step cost on the simulated cluster."""

    mode: str
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


@dataclass(frozen=True)
class Run:
    """What one run of the program did on one system: every layer's record, the gradients it
    streamed out (by weight name and view; None without numbers) and its outputs."""

    records: list[LayerRecord]
    gradients: list[tuple[str, list[int] | None, np.ndarray | None]]
    outputs: dict[int, np.ndarray]
    optimizer: tuple[str, dict[str, float]] | None
    sram_peak: int
    """The most bytes a PE of its system had held when the run ended."""

    @classmethod
    def of(cls, executor: Executor) -> Run:
        """The run an executor made."""
        return cls(
            executor.records,
            executor.gradients,
            executor.outputs,
            executor.optimizer,
            executor.system.sram.peak,
        )


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


def cast_input(name: str, array: np.ndarray, dtype: str) -> np.ndarray:
    """``array``, fed for input ``name``, in the input's ``dtype``.

    A float input takes numbers of any type, rounded (float64 to float32, say); an integer
    input takes integers and bools, and a bool input bools. A narrowing integer cast would
    wrap (token id 2**32 + 3 fed for an int32 input would run as id 3), so where the cast can
    lose values they are checked, by their minimum and maximum: one out of range is a
    CgcError naming the input, the first such value and the type."""
    want = dtypes.dtype(dtype)
    if array.dtype == want:
        return array
    integer = dtypes.is_integer(want)
    if integer:  # not can_cast: ml_dtypes casts floats "same_kind" to its 4-bit integers
        accepted = dtypes.is_integer(array.dtype) or array.dtype == np.bool_
    else:
        accepted = np.can_cast(array.dtype, want, casting="same_kind")
    if not accepted:
        raise CgcError(f"input '{name}' has dtype {array.dtype}; the model takes {dtype}")
    if integer and array.size and not np.can_cast(array.dtype, want, casting="safe"):
        low, high = dtypes.integer_range(want)
        if int(array.min()) < low or int(array.max()) > high:
            where = first_bad((array < low) | (array > high))
            assert where is not None
            at = f" at {list(where)}" if where else ""
            raise CgcError(
                f"input '{name}' holds {array[where]}{at}, outside the range of {dtype} "
                f"[{low}, {high}]"
            )
    return array.astype(want)


class Cluster:
    """K systems, MemoryX and SwarmX running one artifact."""

    def __init__(
        self,
        artifact: Artifact,
        num_csx: int | None = None,
        numerics: bool = True,
        timed: list[Run] | None = None,
    ):
        """``timed``: a timing-only cluster's runs of the same program on the same target,
        made already (by another cluster of a study): they serve this one too."""
        manifest = artifact.manifest
        self.artifact = artifact
        self.manifest = manifest
        self.program = artifact.program
        self.target = Target.from_json(manifest["target"])
        self.mode = manifest["mode"]
        self.num_csx = checked_systems(manifest["num_csx"] if num_csx is None else num_csx)
        self.numerics = numerics
        if numerics:
            artifact.require_weights(f"the artifact of {manifest['source']}")
        self.memoryx = MemoryX(artifact.weights, self.target, artifact.weight_specs)
        sparse = manifest.get("sparsity")
        if sparse is not None:  # timing-only: the live counts, for the footprint
            found = sparse["init"] == sparsity.DETECTED  # its masks are the stored zeros
            masks = sparsity.masks(sparse, self.memoryx.weights) if numerics or found else None
            self.memoryx.sparsify(sparse, masks)
        self.swarmx = SwarmX(self.num_csx, self.target)
        self.grad_norm: float | None = None
        """The global norm of the last training step's summed gradients, before clipping."""
        # a timing-only run makes one run of the program on one system: all are alike
        self.systems = [System(Sram(self.target)) for _ in range(self.num_csx if numerics else 1)]
        # a model without a batch axis runs its fixed shapes as one sample per system
        self.batch = manifest["micro_batch"] or 1
        self.micro_batches: int = manifest.get("micro_batches", 1)
        self.timed_runs: list[Run] = list(timed or [])
        """A timing-only cluster's runs of the program: the first, and the steady second."""

    @property
    def global_batch(self) -> int:
        """Samples of one training step: each system's micro-batches of the compiled batch."""
        return self.batch * self.micro_batches * self.num_csx

    # -- the data -------------------------------------------------------------------------

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
            array = cast_input(spec["name"], np.asarray(inputs[spec["name"]]), spec["dtype"])
            want = tuple(spec["shape"])
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

    def _chunk_count(self, inputs: Mapping[str, np.ndarray] | None) -> int:
        """Chunks of ``inputs`` (checked), or of one global batch without them."""
        if inputs is None:
            return self.micro_batches * self.num_csx
        return len(self._chunks(inputs))

    # -- running --------------------------------------------------------------------------

    def _execute(
        self, system: int, chunk: Sequence[np.ndarray], on_layer: OnLayer | None = None
    ) -> Run:
        executor = Executor(
            self.program,
            self.target,
            self.systems[system],
            self.memoryx,
            deliver=self.mode == "pipelined",
            on_layer=on_layer,
        )
        executor.run(chunk)
        return Run.of(executor)

    def _timed(self, runs: int, on_step: OnStep | None = None) -> Run:
        """A run of a timing-only cluster: the program on shapes, on one system, once for a
        system that runs once and twice for one that runs more (the second run finds the
        weights and constants of the first pinned, as every later run does)."""
        wanted = min(runs, 2)
        while len(self.timed_runs) < wanted:
            told = self._told(on_step, len(self.timed_runs), wanted)
            pipelined = self.mode == "pipelined"
            executor = Executor(self.program, self.target, self.systems[0], None, pipelined, told)
            executor.run(())
            self.timed_runs.append(Run.of(executor))
        return self.timed_runs[0]

    def _told(self, on_step: OnStep | None, run: int, runs: int) -> OnLayer | None:
        """``on_step`` told of the layers of run ``run`` of ``runs`` (from 0), numbered among
        the layers of all of them."""
        if on_step is None:
            return None
        per_run = sum(ins.opcode == Opcode.LAYER for ins in self.program.instructions)
        which = f" (batch {run + 1}/{runs})" if runs > 1 else ""
        return lambda number, name: on_step(run * per_run + number, runs * per_run, name + which)

    def _runs(
        self, inputs: Mapping[str, np.ndarray] | None, on_step: OnStep | None = None
    ) -> tuple[list[Run], int]:
        """The runs of the chunks of ``inputs``, chunk ``c`` on system ``c mod K``, and how many
        chunks there are: a run per chunk, or timing-only the one run that every chunk
        repeats (a batch can have billions)."""
        if not self.numerics:
            count = self._chunk_count(inputs)
            return [self._timed(-(-count // self.num_csx), on_step)], count
        if inputs is None:
            raise CgcError("a run with numbers needs inputs")
        chunks = self._chunks(inputs)
        runs = [
            self._execute(c % self.num_csx, chunk, self._told(on_step, c, len(chunks)))
            for c, chunk in enumerate(chunks)
        ]
        return runs, len(runs)

    def infer(
        self, inputs: Mapping[str, np.ndarray] | None = None, on_step: OnStep | None = None
    ) -> tuple[dict[str, np.ndarray], RunStats]:
        """Runs the samples in ``inputs`` (timing-only: without them, one global batch) and
        returns the outputs and the run's statistics; ``on_step`` is told of every layer of
        every run as it begins (``OnStep``; a progress bar)."""
        runs, chunks = self._runs(inputs, on_step)
        outputs = self._gather_outputs(runs) if self.numerics else {}
        return outputs, self._stats(runs, chunks, training=False)

    def loss(self, batch: Mapping[str, np.ndarray], loss_scale: float) -> float:
        """The loss (first output) of the global batch in ``batch``, forward only: each
        chunk's share scaled by ``loss_scale`` as in a training step."""
        return sum(float(run.outputs[0]) for run in self._runs(batch)[0]) * loss_scale

    def _gather_outputs(self, runs: Sequence[Run]) -> dict[str, np.ndarray]:
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
        batch: Mapping[str, np.ndarray] | None = None,
        lr_factor: float = 1.0,
        max_grad_norm: float | None = None,
        allow_nonfinite: bool = False,
    ) -> tuple[float, RunStats]:
        """One training step on the global batch in ``batch`` (timing-only: without it), the
        learning rate scaled by ``lr_factor`` and the gradients clipped to a global norm of
        ``max_grad_norm``; returns the loss (``grad_norm`` keeps the gradients' norm before
        clipping). Chunk ``c`` is micro-batch ``c // K`` of system ``c mod K``. A loss or
        gradients that are not finite stop the step before the update (a
        ``NonFiniteError``), unless ``allow_nonfinite``."""
        count = self._chunk_count(batch)
        if count != self.micro_batches * self.num_csx:
            raise CgcError(
                f"a training step takes {self.global_batch} samples ({self.num_csx} systems x "
                f"{self.micro_batches} micro-batches x {self.batch}); got {count * self.batch}"
            )
        runs, chunks = self._runs(batch)
        stats = self._stats(runs, chunks, training=True)
        if not self.numerics:
            return 0.0, stats
        # Each chunk's loss covers its slice; the seed of its backward pass was loss_scale
        # (1/(K x micro-batches) for a mean over the batch, 1 for a sum), and so is its share.
        losses = [float(r.outputs[0]) for r in runs]
        loss = sum(losses) * self.manifest["training"]["loss_scale"]
        self._update(runs, lr_factor, max_grad_norm, allow_nonfinite, loss)
        return loss, stats

    def _update(
        self,
        runs: Sequence[Run],
        lr_factor: float,
        max_grad_norm: float | None,
        allow_nonfinite: bool,
        loss: float,
    ) -> None:
        """The end of a training step: the gradients of each micro-batch summed through
        SwarmX into MemoryX, the buffers folded in, the optimizer applied (unless ``loss`` or
        the gradients are not finite and that is not allowed)."""
        for first in range(0, len(runs), self.num_csx):
            self._reduce_gradients(runs[first : first + self.num_csx])
        self.memoryx.fold(self._buffers(), self._named_outputs(runs))
        if runs[0].optimizer is not None:
            self.grad_norm = self.memoryx.apply(
                *runs[0].optimizer,
                lr_factor=lr_factor,
                max_grad_norm=max_grad_norm,
                allow_nonfinite=allow_nonfinite,
                loss=loss,
            )

    def _buffers(self) -> list[dict[str, Any]]:
        """The buffers a training step updates (the manifest's ``training.buffers``)."""
        return self.manifest["training"].get("buffers", [])

    def _named_outputs(self, runs: Sequence[Run]) -> list[dict[str, np.ndarray]]:
        """Each run's outputs that the buffers read, by name, as ``MemoryX.fold`` takes them
        (on Ray they travel to MemoryX's actor: not the logits)."""
        read = {update["output"] for update in self._buffers()}
        names = [spec["name"] for spec in self.manifest["outputs"]]
        return [
            {name: run.outputs[i] for i, name in enumerate(names) if name in read} for run in runs
        ]

    def _reduce_gradients(self, runs: Sequence[Run]) -> None:
        """SwarmX sums one micro-batch's gradients over the systems; MemoryX adds them up."""
        for position, (name, perm, _) in enumerate(runs[0].gradients):
            parts = [run.gradients[position][2] for run in runs]
            summed = self.swarmx.reduce([p for p in parts if p is not None])
            self.memoryx.receive(name, summed, perm)

    # -- MemoryX's state, and the cluster's end ---------------------------------------------

    def stored(self) -> MemoryX:
        """MemoryX as it stands, for checkpoints and final weights (on Ray: a copy of the
        actor's, fetched)."""
        return self.memoryx

    def restore(
        self,
        weights: Mapping[str, np.ndarray],
        state: dict[str, dict[str, np.ndarray]],
        steps: int,
        masks: Mapping[str, np.ndarray] | None,
    ) -> None:
        """MemoryX takes up a checkpoint's weights, optimizer state, updates and masks."""
        self.memoryx.restore(weights, state, steps, masks)

    def close(self) -> None:
        """Lets go of what the cluster holds outside this process (nothing, locally)."""

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what it cost ---------------------------------------------------------------------

    def _stats(self, runs: Sequence[Run], chunks: int, training: bool) -> RunStats:
        """The statistics of ``chunks`` chunks run as ``runs`` (``_runs``)."""
        per_system = [len(range(k, chunks, self.num_csx)) for k in range(self.num_csx)]
        records = runs[0].records if runs else []
        timelines = {
            count: self._timeline(records, track, count, training)
            for count, track in system_tracks(per_system).items()
            if count
        }
        seconds = max((end for end, _ in timelines.values()), default=0.0)
        # MemoryX and SwarmX serve every system at once: their spans appear once
        spans = list(dict.fromkeys(s for _, group in timelines.values() for s in group))
        flops = 2 * chunks * sum(r.fmacs for r in records)
        utilization = flops / (self._peak_flops() * seconds * self.num_csx) if seconds else 0.0
        figures = streaming_figures = None
        if self.mode == "pipelined" and runs:
            figures = self._pipeline_figures(records, per_system[0])
        elif runs:
            streaming_figures = self._streaming(records, per_system[0], training)
        stats = RunStats(
            mode=self.mode,
            target=self.target.name,
            num_csx=self.num_csx,
            batch_size=chunks * self.batch,
            per_system_batch=max(per_system, default=0) * self.batch,
            simulated_seconds=seconds,
            clock_hz=self.target.clock_hz,
            pe_utilization=utilization,
            peak_pe_sram_bytes=max((r.sram_peak for r in (*runs, *self.timed_runs)), default=0),
            layers=self._layer_summary(records, streaming_figures),
            spans=spans,
            wavelet_hops=chunks * sum(r.wavelet_hops for r in records),
            pipeline=figures,
            micro_batches=self.micro_batches,
            micro_batch=self.batch,
            model_flops=chunks * sum(r.flops for r in records if not r.name.endswith(RECOMPUTED)),
            peak_flops_per_second=self.num_csx * self._peak_flops(),
            tokens_per_sample=self.manifest.get("tokens_per_sample"),
            memoryx=self._footprint(training),
            memoryx_capacity_bytes=self.target.memoryx_capacity_bytes,
        )
        if streaming_figures is not None:
            stats.bound = streaming_figures.bound
            stats.update_seconds = streaming_figures.update_seconds
        return stats

    def _peak_flops(self) -> float:
        """One system's peak FLOP rate in the type of the program's matmuls."""
        flops = self.target.peak_flops_per_pe_per_cycle(self.program.compute_dtype)
        return self.target.pes * flops * self.target.clock_hz

    def _footprint(self, training: bool) -> Footprint:
        """What MemoryX holds for this artifact's runs."""
        if not training or not self.manifest.get("training"):
            return self.memoryx.footprint([], None, {})
        optimizer = self.manifest["training"]["optimizer"]
        config = {k: v for k, v in optimizer.items() if k != "optimizer"}
        trained = self.manifest["training"]["trainable"]
        return self.memoryx.footprint(trained, optimizer["optimizer"], config)

    def _layer_summary(
        self, records: Sequence[LayerRecord], streamed: streaming.Timeline | None
    ) -> list[dict[str, Any]]:
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

    def _timeline(
        self, records: Sequence[LayerRecord], track: str, runs: int, training: bool
    ) -> tuple[float, list[Span]]:
        """One system's timeline of ``runs`` runs: its end and its spans."""
        if self.mode == "pipelined":
            timeline = self._pipeline(records, runs)
            return timeline.seconds, timeline.spans(track)
        streamed = self._streaming(records, runs, training, track)
        return streamed.seconds, streamed.spans

    def _pipeline_figures(self, records: Sequence[LayerRecord], runs: int) -> dict[str, Any]:
        """System 0's pipeline: rate, fill and drain, every stage and route."""
        timeline = self._pipeline(records, runs)
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

    def _pipeline(self, records: Sequence[LayerRecord], runs: int) -> pipeline.Timeline:
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

    def _streaming(
        self, records: Sequence[LayerRecord], runs: int, training: bool, track: str = ""
    ) -> streaming.Timeline:
        """One system's runs through the weight-streaming timeline."""
        updates = self._update_parameters() if training else {}
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
        return streaming.simulate(layers, self.target, self.swarmx, runs, training, track)

    def _update_parameters(self) -> dict[int, int]:
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
            size = sparse[name].live if name in sparse else self.memoryx.specs[name].size
            counts[index] = counts.get(index, 0) + size
        return counts


def open_cluster(
    artifact: Artifact,
    num_csx: int | None = None,
    numerics: bool = True,
    backend: Backend | None = None,
) -> Cluster:
    """A cluster running ``artifact`` where ``backend`` says: in this process, or with numbers
    on Ray, its systems and MemoryX actors (``cgc.runtime.ray_cluster``). A timing-only run
    stays here: it is one run of the program on shapes, whatever K."""
    backend = backend or Backend()
    if backend.executor == LOCAL or not numerics:
        return Cluster(artifact, num_csx, numerics)
    connect(backend.address)  # without Ray: the one-line error naming the extra
    from cgc.runtime.ray_cluster import RayCluster

    return RayCluster(artifact, num_csx, backend)


def run(
    artifact: Artifact,
    inputs: Mapping[str, np.ndarray],
    num_csx: int | None = None,
    backend: Backend | None = None,
) -> tuple[dict[str, np.ndarray], RunStats]:
    """Runs an artifact on the simulator; returns ``(outputs, stats)``."""
    with open_cluster(artifact, num_csx, backend=backend) as cluster:
        return cluster.infer(inputs)
