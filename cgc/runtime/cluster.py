"""K simulated systems, MemoryX and SwarmX running one artifact.

The ``Cluster`` splits the samples into chunks of the compiled batch (a training step's
micro-batches), gives chunk ``c`` to system ``c mod K`` (an ``Executor`` of
``cgc.runtime.vm`` per chunk), sums the gradients through SwarmX into MemoryX, and hands the
layer records of the runs to the timing model of the floor (``cgc.machine.timing.run_stats``),
which makes them into each system's timeline and the run's statistics.

The timing never depends on the values: every run of the program costs the same. A
timing-only cluster (``numerics=False``) runs the program once, on shapes, whatever the number
of systems and samples: it needs no inputs and no weight data.

This class runs the systems one after another in this process; on Ray
(``cgc.runtime.ray_cluster``) they are actors, with the same numbers and the same timing;
``cgc.runtime.launch`` opens the one an executor asks for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cgc.errors import CgcError
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import Target, checked_systems
from cgc.machine.program.artifact import Artifact
from cgc.machine.program.bytecode import Opcode
from cgc.machine.program.mode import Mode
from cgc.machine.reference.indexing import first_bad
from cgc.machine.sparse import sparsity
from cgc.machine.timing.cost import LayerRecord, Sram
from cgc.machine.timing.run_stats import RunStats, RunTiming
from cgc.machine.training.optimizers import Footprint
from cgc.runtime.memoryx import Derived, MemoryX
from cgc.runtime.swarmx import SwarmX
from cgc.runtime.vm import Executor, OnLayer, System

OnStep = Callable[[int, int, str], None]
"""Told of each layer of each run of a cluster's call as it begins: its number among the
layers of all the runs (from 1), their count, and its name and run."""


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
        self.mode = Mode(manifest["mode"])
        self.num_csx = checked_systems(manifest["num_csx"] if num_csx is None else num_csx)
        self.numerics = numerics
        if numerics:
            artifact.require_weights(f"the artifact of {manifest['source']}")
        self.memoryx = MemoryX(
            artifact.weights, self.target, artifact.weight_specs, Derived.of(artifact)
        )
        # the arrays MemoryX holds (read-only; copies of views others may write) become the
        # artifact's, so that its later runs find what this one makes of them
        artifact.weights.update(self.memoryx.given)
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
        self.timing = RunTiming(
            self.program,
            self.target,
            self.mode,
            self.num_csx,
            self.batch,
            self.micro_batches,
            manifest.get("tokens_per_sample"),
            self.memoryx.specs,
        )
        """What the runs cost."""

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
                f"{self.batch}; compile with batch_size to match",
                "batch_size",
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
            deliver=self.mode == Mode.PIPELINED,
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
            pipelined = self.mode == Mode.PIPELINED
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
        sram_peak = max((r.sram_peak for r in (*runs, *self.timed_runs)), default=0)
        records = runs[0].records if runs else None
        return self.timing.stats(records, chunks, training, sram_peak, self._footprint(training))

    def _footprint(self, training: bool) -> Footprint:
        """What MemoryX holds for this artifact's runs."""
        if not training or not self.manifest.get("training"):
            return self.memoryx.footprint([], None, {})
        optimizer = self.manifest["training"]["optimizer"]
        config = {k: v for k, v in optimizer.items() if k != "optimizer"}
        trained = self.manifest["training"]["trainable"]
        return self.memoryx.footprint(trained, optimizer["optimizer"], config)
