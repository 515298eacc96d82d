"""The training loop: steps of a training artifact on the simulated cluster.

Step ``i`` (0-based) takes the samples ``[i * B, (i + 1) * B)`` modulo the sample count, where
B is the global batch (the per-system batch times K), or with shuffling that stretch of the
epochs' permutations. Every step appends one JSON line to ``metrics.jsonl``; checkpoints go to
``checkpoints/step-N/``; at the end ``weights.safetensors`` holds every initializer, trained or
not. A run resumed from a checkpoint ends with exactly the metrics and weights of a run that
was never interrupted; one whose settings would have taken the checkpoint's steps otherwise
is refused (the rule: ``cgc.runtime.checkpoint``).

A run keeps in memory only what does not grow with its steps, but for the metrics it returns
(a line of JSON text a step): the timeline of its first ``trace_steps`` steps at most, for a trace.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np

from cgc.errors import CgcError, OptionError
from cgc.files import (
    DirectoryLock,
    append_whole,
    remove_stale_temporaries,
    write_atomically,
)
from cgc.machine.program.artifact import Artifact, weights_to_bytes
from cgc.machine.timing.streaming import Span
from cgc.machine.training.optimizers import Schedule
from cgc.runtime import checkpoint
from cgc.runtime.cluster import Cluster
from cgc.runtime.executors import Backend
from cgc.runtime.launch import open_cluster


class MetricLines(Sequence[dict]):
    """The metrics lines of a run, each held as its compact JSON text: a dict per step would
    grow a long training's memory by half a kilobyte a step. Reading a line gives its dict."""

    def __init__(self, lines: Iterable[dict] = ()):
        self._texts: list[bytes] = []
        for line in lines:
            self.append(line)

    def append(self, line: dict) -> None:
        self._texts.append(json.dumps(line, separators=(",", ":")).encode())

    def __len__(self) -> int:
        return len(self._texts)

    @overload
    def __getitem__(self, index: int) -> dict: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict]: ...
    def __getitem__(self, index: int | slice) -> dict | list[dict]:
        if isinstance(index, slice):
            return [json.loads(text) for text in self._texts[index]]
        return json.loads(self._texts[index])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"MetricLines({list(self)!r})"


@dataclass
class TrainResult:
    """What a training run produced."""

    metrics: MetricLines = field(default_factory=MetricLines)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    """The simulated timeline of the first steps this run took (``train``'s
    ``trace_steps``), one after another."""


TRACED_STEPS = 16
"""The steps whose timeline a run keeps for a trace by default: every step's is alike, a
trace of many thousands would not load in a viewer, and keeping them all would grow the
run's memory by kilobytes a step."""


def check_data(artifact: Artifact, data: Mapping[str, np.ndarray]) -> int:
    """Checks that ``data`` holds every model input with one sample count; returns it."""
    specs = artifact.manifest["inputs"]
    missing = [s["name"] for s in specs if s["name"] not in data]
    if missing:
        raise CgcError(
            f"training data lacks {missing}; it needs one array per model input "
            f"({[s['name'] for s in specs]}), first axis = samples"
        )
    scalars = [s["name"] for s in specs if np.ndim(data[s["name"]]) == 0]
    if scalars:
        raise CgcError(f"training data '{scalars[0]}' is a scalar; its first axis must be samples")
    counts = {len(data[s["name"]]) for s in specs}
    if len(counts) != 1 or 0 in counts:
        raise CgcError(f"training data arrays have different or zero sample counts: {counts}")
    return counts.pop()


def schedule(kind: str, warmup_steps: int, steps: int, step_size: int, gamma: float) -> Schedule:
    """The learning-rate schedule the options name; bad values are one-line errors."""
    try:
        return Schedule(kind, warmup_steps, steps, step_size, gamma)
    except ValueError as e:
        raise OptionError(f"lr_schedule {kind}: {e}", "lr_schedule") from None


@dataclass(frozen=True)
class LoopOptions:
    """What the training loop does around each step."""

    steps: int
    schedule: Schedule = field(default_factory=Schedule)
    """The learning rate's factor per step; cosine decay ends at ``steps``."""
    max_grad_norm: float | None = None
    """Clip the summed gradients to this global norm before the update."""
    checkpoint_every: int = 0
    """Write a checkpoint after every this many steps (0: never)."""
    resume: bool = False
    """Continue from the newest good checkpoint in the model directory, if there is one."""
    shuffle: bool = False
    """Visit the samples of each epoch in an order drawn from ``seed`` and the epoch."""
    seed: int = 0
    allow_nonfinite: bool = False
    """Train on through a loss or gradients that are not finite (else the run stops there)."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise OptionError(f"steps {self.steps}: must be at least 1", "steps")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise OptionError(
                f"max_grad_norm {self.max_grad_norm:g}: must be positive", "max_grad_norm"
            )
        if self.checkpoint_every < 0:
            raise OptionError(
                f"checkpoint_every {self.checkpoint_every}: must be >= 0", "checkpoint_every"
            )
        if self.seed < 0:
            raise OptionError(f"seed {self.seed}: must be >= 0", "seed")


def strict_json(line: Mapping[str, Any]) -> dict[str, Any]:
    """A metrics line as strict JSON takes it: a NaN or infinite figure (a run that went on
    with ``allow_nonfinite``) is null, where ``json.dumps`` would write a bare ``NaN`` that
    strict readers reject."""
    return {
        key: None if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in line.items()
    }


def sample_indices(step: int, batch: int, samples: int, shuffle: bool, seed: int) -> np.ndarray:
    """The samples of step ``step`` (0-based): positions ``[step * batch, (step + 1) * batch)``
    of the sequence of epochs, each epoch the samples in order or, with ``shuffle``, in the
    permutation drawn from ``(seed, epoch)`` (so any step can be found again without
    replaying the ones before)."""
    positions = np.arange(step * batch, (step + 1) * batch)
    epochs, offsets = np.divmod(positions, samples)
    if not shuffle:
        return offsets
    picked = np.empty_like(offsets)
    for epoch in np.unique(epochs):  # a batch spans at most a few epochs
        order = np.random.default_rng([seed, int(epoch)]).permutation(samples)
        mask = epochs == epoch
        picked[mask] = order[offsets[mask]]
    return picked


@dataclass(frozen=True)
class Evaluation:
    """Held-out data whose loss is measured every ``every`` steps (and after the last), by
    ``artifact``: the same model compiled forward only (weights streamed, no gradients)."""

    artifact: Artifact
    data: Mapping[str, np.ndarray]
    every: int

    def __post_init__(self) -> None:
        if self.every < 1:
            raise OptionError(f"eval_every {self.every}: must be at least 1", "eval_every")

    def due(self, step: int, loop: LoopOptions) -> bool:
        """Whether the held-out loss is measured after step ``step`` (0-based)."""
        return (step + 1) % self.every == 0 or step + 1 == loop.steps

    def check(self, batch: int) -> int:
        """Checks the held-out data against the model and a global batch of ``batch``;
        returns its sample count."""
        samples = check_data(self.artifact, self.data)
        if samples < batch:
            raise OptionError(
                f"eval_data has {samples} samples, fewer than one batch of {batch}", "eval_data"
            )
        return samples

    def loss(self, cluster: Cluster, weights: dict[str, np.ndarray], scale: float) -> float:
        """The mean loss over the held-out data's whole global batches, with ``weights``."""
        cluster.memoryx.weights = weights
        batch = cluster.global_batch
        names = [spec["name"] for spec in self.artifact.manifest["inputs"]]
        samples = self.check(batch)
        losses = [
            cluster.loss({n: np.asarray(self.data[n])[start : start + batch] for n in names}, scale)
            for start in range(0, samples - batch + 1, batch)
        ]
        return float(np.mean(losses))


def train(
    artifact: Artifact,
    data: Mapping[str, np.ndarray],
    loop: LoopOptions,
    model_dir: str | os.PathLike,
    on_step: Callable[[dict], None] | None = None,
    warn: Callable[[str], None] | None = None,
    evaluation: Evaluation | None = None,
    trace_steps: int = TRACED_STEPS,
    backend: Backend | None = None,
) -> TrainResult:
    """Runs the training steps (from the newest checkpoint with ``loop.resume``) on the
    systems ``backend`` says and writes the metrics, the checkpoints and the final weights;
    ``warn`` hears about damaged checkpoints skipped. The result keeps the timeline
    (``spans``) of the first ``trace_steps`` steps this run takes."""
    if not artifact.manifest.get("training"):
        raise CgcError("the artifact was not compiled for training")
    directory = Path(model_dir)
    lock = DirectoryLock(directory, f"model directory {directory}")
    with lock, open_cluster(artifact, backend=backend) as cluster:
        return _train(cluster, data, loop, directory, on_step, warn, evaluation, trace_steps)


def _train(
    cluster: Cluster,
    data: Mapping[str, np.ndarray],
    loop: LoopOptions,
    directory: Path,
    on_step: Callable[[dict], None] | None,
    warn: Callable[[str], None] | None,
    evaluation: Evaluation | None,
    trace_steps: int,
) -> TrainResult:
    """``train``'s steps on ``cluster``."""
    artifact = cluster.artifact
    training = artifact.manifest["training"]
    samples = check_data(artifact, data)
    names = [spec["name"] for spec in artifact.manifest["inputs"]]
    batch = cluster.global_batch
    base_lr = training["optimizer"]["lr"]
    directory.mkdir(parents=True, exist_ok=True)
    # a killed run's half-written files would otherwise stay in the directory for good
    remove_stale_temporaries(directory, ["metrics.jsonl", "weights.safetensors"])
    remove_stale_temporaries(directory / "checkpoints", ["step-*"])
    result = TrainResult()
    evaluator = None
    if evaluation is not None:
        evaluation.check(batch)
        evaluator = Cluster(evaluation.artifact, num_csx=cluster.num_csx)
    if loop.resume:
        first = _resume(cluster, directory, loop, training["optimizer"], warn or (lambda _: None))
    else:  # a new run: nothing of an earlier one may be resumed or taken for its result
        first = 0
        shutil.rmtree(directory / "checkpoints", ignore_errors=True)
        (directory / "weights.safetensors").unlink(missing_ok=True)
    result.metrics = MetricLines(metrics_before(directory / "metrics.jsonl", first))
    write_atomically(
        directory / "metrics.jsonl", "".join(json.dumps(m) + "\n" for m in result.metrics).encode()
    )
    clock = 0.0
    metrics = directory / "metrics.jsonl"
    with open(metrics, "ab", buffering=0) as log:
        for step in range(first, loop.steps):
            index = sample_indices(step, batch, samples, loop.shuffle, loop.seed)
            factor = loop.schedule.factor(step)
            loss, stats = cluster.train_step(
                {n: np.asarray(data[n])[index] for n in names},
                factor,
                loop.max_grad_norm,
                loop.allow_nonfinite,
            )
            line = {
                "step": step + 1,
                "loss": loss,
                "lr": base_lr * factor,
                "grad_norm": cluster.grad_norm,
                "simulated_seconds": stats.simulated_seconds,
                "samples_per_second": stats.samples_per_second,
            }
            if evaluation is not None and evaluator is not None and evaluation.due(step, loop):
                scale = training["loss_scale"]
                line["eval_loss"] = evaluation.loss(evaluator, cluster.stored().weights, scale)
            append_whole(log.fileno(), metrics, (json.dumps(strict_json(line)) + "\n").encode())
            result.metrics.append(line)
            if step - first < trace_steps:
                result.spans += _shifted(stats.spans, clock, step + 1)
            clock += stats.simulated_seconds
            if loop.checkpoint_every and (step + 1) % loop.checkpoint_every == 0:
                _save_checkpoint(cluster, directory, step + 1, loop)
            if on_step is not None:
                on_step(line)
    result.weights = final_weights(training, cluster.stored().weights)
    write_atomically(directory / "weights.safetensors", weights_to_bytes(result.weights))
    return result


def final_weights(training: Mapping, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What a run leaves in ``weights.safetensors``: every initializer, trained or not, and
    the buffers the steps updated."""
    buffers = [update["buffer"] for update in training.get("buffers", [])]
    return {n: weights[n] for n in [*training["initializers"], *buffers] if n in weights}


def _shifted(spans: list[Span], offset: float, step: int) -> list[Span]:
    return [
        Span(s.track, f"{s.name} (step {step})", s.start + offset, s.end + offset) for s in spans
    ]


def _data_order(loop: LoopOptions, batch: int, step: int) -> dict:
    return {"global_batch": batch, "shuffle": loop.shuffle, "seed": loop.seed,
            "next_sample": step * batch}  # fmt: skip


def _save_checkpoint(cluster: Cluster, directory: Path, step: int, loop: LoopOptions) -> None:
    memoryx = cluster.stored()
    data = _data_order(loop, cluster.global_batch, step)
    training = cluster.artifact.manifest["training"]
    state = checkpoint.Checkpoint(
        step,
        memoryx.weights,
        memoryx.state,
        memoryx.steps,
        data,
        training["optimizer"],
        _loop_record(loop, cluster.artifact.manifest),
        memoryx.masks or None,
    )
    checkpoint.save(directory / "checkpoints", state)


def _loop_record(loop: LoopOptions, manifest: Mapping) -> dict:
    trainable = manifest["training"]["trainable"]
    return checkpoint.loop_record(
        loop.schedule, loop.max_grad_norm, trainable, manifest.get("sparsity")
    )


def _check_loop(found: checkpoint.Checkpoint, loop: LoopOptions, manifest: Mapping) -> None:
    """A resumed run must have taken the checkpoint's steps as they were taken."""
    changed = checkpoint.changed_setting(found, _loop_record(loop, manifest))
    if changed is not None:
        keyword, then, now = changed
        raise OptionError(
            f"resume: checkpoint step-{found.step} was written with {keyword} {then}, this "
            f"run has {now}",
            "resume",
            keyword,
        )


def _check_order(found: checkpoint.Checkpoint, loop: LoopOptions, batch: int) -> None:
    """A resumed run must visit the samples in the order the checkpointed one did."""
    want = _data_order(loop, batch, found.step)
    options = {
        "global_batch": ("batch_size", "num_csx"),
        "shuffle": ("shuffle",),
        "seed": ("seed",),
    }
    for key, fields in options.items():
        if found.data.get(key) != want[key] and (key != "seed" or loop.shuffle):
            raise OptionError(
                f"resume: checkpoint step-{found.step} was written with {' x '.join(fields)} "
                f"{found.data.get(key)}, this run has {want[key]}",
                "resume",
                *fields,
            )


def _resume(
    cluster: Cluster,
    directory: Path,
    loop: LoopOptions,
    optimizer: dict,
    warn: Callable[[str], None],
) -> int:
    """Loads the newest good checkpoint into MemoryX; returns the steps it had done."""
    root = directory / "checkpoints"
    found = checkpoint.latest(root, warn)
    if found is None:
        if checkpoint.saved_steps(root):
            raise OptionError(f"resume: no checkpoint in {root} is intact", "resume")
        return 0
    if found.step > loop.steps:
        raise OptionError(
            f"resume: checkpoint step-{found.step} is beyond steps {loop.steps}", "resume", "steps"
        )
    if found.optimizer != optimizer:
        changed = sorted(k for k in {*found.optimizer, *optimizer}
                         if found.optimizer.get(k) != optimizer.get(k))  # fmt: skip
        raise OptionError(
            f"resume: checkpoint step-{found.step} was written with other optimizer "
            f"settings ({', '.join(changed)}); resume with the same ones",
            "resume",
        )
    _check_order(found, loop, cluster.global_batch)
    _check_loop(found, loop, cluster.artifact.manifest)
    unknown = sorted(set(found.weights) - set(cluster.memoryx.specs))
    if unknown:
        raise OptionError(
            f"resume: checkpoint step-{found.step} holds weights the model lacks: {unknown[:3]}",
            "resume",
        )
    cluster.restore(found.weights, found.optimizer_state, found.updates, found.masks)
    return found.step


def metrics_before(path: Path, step: int) -> list[dict]:
    """The metrics lines of the steps up to ``step`` that an earlier run wrote."""
    if step == 0 or not path.exists():
        return []
    lines = []
    for text in path.read_text().splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:  # a line cut short by a kill
            break
        if line.get("step", step + 1) > step:
            break
        lines.append(line)
    return lines
