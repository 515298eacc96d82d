"""``cgc.torch``: a PyTorch training loop run as weight-streaming training on the simulator.

::

    model = cgc.torch.module(model)          # captured at the first step; weights to MemoryX
    optimizer = cgc.torch.optimizer(torch.optim.AdamW(model.parameters(), lr=3e-4))
    loader = cgc.torch.dataloader(torch_data_loader)
    with cgc.torch.session(num_csx=4, model_dir="run", target="wse2") as s:
        for batch in loader:
            loss = s.step(batch)

The module's forward returns the loss, or the session's ``loss_fn(output, target)`` makes it
of the batch's last tensor. The optimizer's class (SGD, Adam, AdamW), the settings of each of
its param groups (per-weight settings in MemoryX) and a learning-rate scheduler made on it
(StepLR, CosineAnnealingLR, a LinearLR warm-up, or a SequentialLR of a warm-up and one of
those) are read and run by MemoryX; parameters that no group trains, or that do not require
gradients, stay frozen. After the session the module's parameters hold the trained weights.

Importing this module imports torch; ``cgc`` imports it only when ``cgc.torch`` is used.
"""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cgc.errors import CgcError
from cgc.files import append_whole, permissions, write_atomically, writing
from cgc.frontends.torch import capture
from cgc.frontends.torch.lowering import to_numpy
from cgc.machine.program.artifact import Artifact, weights_to_bytes
from cgc.machine.program.mode import Mode
from cgc.machine.training import optimizers
from cgc.machine.training.optimizers import Schedule
from cgc.options import Chosen, CompileOptions, SparsityOptions, TrainingOptions
from cgc.runtime.trainer import final_weights, metrics_before, strict_json

__all__ = ["Module", "Session", "TorchOptimizer", "dataloader", "module", "optimizer", "session"]

OPTIMIZERS: dict[type, str] = {
    torch.optim.SGD: "sgd",
    torch.optim.Adam: "adam",
    torch.optim.AdamW: "adamw",
}
"""The torch.optim classes MemoryX runs, by cgc's name of each."""

OFF = {"maximize": False, "capturable": False, "differentiable": False}
"""Group options MemoryX does not run, at the only value it runs them with."""

KEPT_WHOLE = ("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default")
"""Ops left whole by the capture: a cross-entropy stays one op, so the compiler can tell that
it averages over the batch and split its gradients over systems and micro-batches."""

_current: dict[str, Any] = {}
"""The module and optimizer wrapped last: what a session trains unless it is told."""

SESSION_RECORDS = (CompileOptions, TrainingOptions, SparsityOptions)
"""The records of a session's options."""
SESSION_OPTIONS = {
    "target",
    "num_csx",
    "micro_batch_size",
    "max_grad_norm",
    "checkpoint_every",
    "resume",
    *(name for name in SparsityOptions.names() if name != "detect_sparsity"),
}
"""The fields a session takes by name (the optimizer, its settings and schedule are the
torch optimizer's)."""


# -- module ------------------------------------------------------------------------------


class Module:
    """A torch module to train on the simulator; everything else is the module's own
    (``model.parameters()``, calling it)."""

    def __init__(self, model: torch.nn.Module):
        if not isinstance(model, torch.nn.Module):
            raise CgcError(
                f"cgc.torch.module: expected a torch.nn.Module, got {type(model).__name__}"
            )
        self.model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)


def module(model: torch.nn.Module | Module) -> Module:
    """``model`` to be trained by the next session."""
    wrapped = model if isinstance(model, Module) else Module(model)
    _current["module"] = wrapped
    return wrapped


# -- optimizer and schedule --------------------------------------------------------------


class TorchOptimizer:
    """The optimizer MemoryX runs for a torch.optim optimizer: its name, the settings of
    each param group (by cgc's setting names) and the learning-rate schedule."""

    def __init__(self, optimizer: torch.optim.Optimizer, lr_scheduler: Any = None):
        kind = type(optimizer)
        if kind not in OPTIMIZERS:
            names = ", ".join(k.__name__ for k in OPTIMIZERS)
            raise CgcError(f"cgc.torch.optimizer: {kind.__name__} is not supported ({names})")
        self.optimizer = optimizer
        self.name = OPTIMIZERS[kind]
        if self.name == "adam" and any(
            g.get("decoupled_weight_decay") for g in optimizer.param_groups
        ):
            self.name = "adamw"  # Adam(decoupled_weight_decay=True) is AdamW
        self.groups = [self._settings(i, g) for i, g in enumerate(optimizer.param_groups)]
        scheduler = lr_scheduler if lr_scheduler is not None else _attached_scheduler(optimizer)
        self.schedule = schedule_of(scheduler)

    def _settings(self, index: int, group: Mapping[str, Any]) -> dict[str, float]:
        """Group ``index``'s settings; an option MemoryX does not run is a CgcError."""
        for option, value in OFF.items():
            if group.get(option, value) != value:
                raise CgcError(
                    f"cgc.torch.optimizer: param group {index}: {option}={group[option]} "
                    "is not supported"
                )
        given: dict[str, float] = {}
        for name in optimizers.OPTIMIZERS[self.name].defaults:
            if name in ("beta1", "beta2"):
                given[name] = float(group["betas"][name == "beta2"])
            elif name == "lr":  # a scheduler keeps the lr it scales as initial_lr
                given[name] = float(group.get("initial_lr", group["lr"]))
            else:
                given[name] = float(group[name])
        try:
            return optimizers.settings(self.name, given)
        except ValueError as e:
            raise CgcError(f"cgc.torch.optimizer: param group {index}: {e}") from None

    @property
    def keywords(self) -> dict[str, optimizers.Choice]:
        """The first group's settings as the API's keywords (``betas`` as a pair)."""
        first = self.groups[0]
        out: dict[str, optimizers.Choice] = {
            k: v for k, v in first.items() if k not in ("beta1", "beta2")
        }
        if "beta1" in first:
            out["betas"] = (first["beta1"], first["beta2"])
        return out

    def parameters(self) -> Iterator[tuple[torch.nn.Parameter, dict[str, float]]]:
        """Every parameter the optimizer trains, with its group's settings."""
        for group, settings in zip(self.optimizer.param_groups, self.groups, strict=True):
            for param in group["params"]:
                if param.requires_grad:
                    yield param, settings


def optimizer(optimizer: torch.optim.Optimizer, lr_scheduler: Any = None) -> TorchOptimizer:
    """The torch.optim ``optimizer`` (and its ``lr_scheduler``: by default the one made on
    it, if any) for the next session."""
    wrapped = TorchOptimizer(optimizer, lr_scheduler)
    _current["optimizer"] = wrapped
    return wrapped


def _attached_scheduler(optimizer: torch.optim.Optimizer) -> Any:
    """The learning-rate scheduler made on ``optimizer``, if there is one: torch keeps no
    link from an optimizer to its scheduler, so it is found among what refers to it."""
    found = [
        o
        for o in gc.get_referrers(optimizer)
        if isinstance(o, torch.optim.lr_scheduler.LRScheduler) and o.optimizer is optimizer
    ]
    nested = {id(s) for o in found if isinstance(o, torch.optim.lr_scheduler.SequentialLR)
              for s in o._schedulers}  # fmt: skip
    outer = [o for o in found if id(o) not in nested]
    if len(outer) > 1:
        raise CgcError(
            "cgc.torch.optimizer: several lr schedulers are made on the optimizer; "
            "pass lr_scheduler="
        )
    return outer[0] if outer else None


SUPPORTED_SCHEDULERS = (
    "StepLR, CosineAnnealingLR, LinearLR warm-up, SequentialLR of a warm-up and one of them"
)


def schedule_of(scheduler: Any) -> Schedule:
    """cgc's schedule of a torch.optim.lr_scheduler (None: constant); one it cannot run is a
    CgcError."""
    if scheduler is None:
        return Schedule()
    if scheduler.last_epoch != 0:
        raise CgcError(
            f"cgc.torch: the lr scheduler has stepped already ({scheduler.last_epoch} steps); "
            "make a new one"
        )
    lr_scheduler = torch.optim.lr_scheduler
    if isinstance(scheduler, lr_scheduler.SequentialLR):
        parts, milestones = scheduler._schedulers, scheduler._milestones
        warmup = _warmup_steps(parts[0]) if len(parts) == 2 else None
        if warmup is None or list(milestones) != [warmup]:
            raise _unsupported(
                scheduler,
                "a SequentialLR must be a LinearLR warm-up of w steps, milestones=[w], "
                "then one scheduler",
            )
        then = schedule_of_one(parts[1], warmup)
        if then is None:
            raise _unsupported(parts[1])
        return then
    warmup = _warmup_steps(scheduler)
    if warmup is not None:
        return Schedule("constant", warmup)
    found = schedule_of_one(scheduler, 0)
    if found is None:
        raise _unsupported(scheduler)
    return found


def schedule_of_one(scheduler: Any, warmup: int) -> Schedule | None:
    """A StepLR or CosineAnnealingLR after ``warmup`` steps of warm-up as a schedule."""
    lr_scheduler = torch.optim.lr_scheduler
    if isinstance(scheduler, lr_scheduler.StepLR):
        return Schedule("step", warmup, warmup + 1, scheduler.step_size, scheduler.gamma)
    if isinstance(scheduler, lr_scheduler.CosineAnnealingLR):
        if scheduler.eta_min != 0:
            raise _unsupported(scheduler, "eta_min must be 0")
        return Schedule("cosine", warmup, warmup + scheduler.T_max)
    return None


def _warmup_steps(scheduler: Any) -> int | None:
    """``w`` for a LinearLR that warms up as cgc's schedules do: from ``1 / w`` to 1 over
    ``w - 1`` steps."""
    if not isinstance(scheduler, torch.optim.lr_scheduler.LinearLR) or scheduler.end_factor != 1:
        return None
    steps = round(1 / scheduler.start_factor)
    if (
        steps >= 1
        and math.isclose(scheduler.start_factor * steps, 1)
        and scheduler.total_iters == steps - 1
    ):
        return steps
    return None


def _unsupported(scheduler: Any, why: str = "") -> CgcError:
    reason = f": {why}" if why else f" (supported: {SUPPORTED_SCHEDULERS})"
    return CgcError(f"cgc.torch: lr scheduler {type(scheduler).__name__} is not supported{reason}")


# -- data ----------------------------------------------------------------------------------


class DataLoader:
    """A torch DataLoader (any iterable of batches) whose batches go to ``Session.step``."""

    def __init__(self, loader: Iterable[Any]):
        if not isinstance(loader, Iterable):
            raise CgcError(
                "cgc.torch.dataloader: expected an iterable of batches, got "
                f"{type(loader).__name__}"
            )
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]


def dataloader(loader: Iterable[Any]) -> DataLoader:
    """``loader``'s batches, each a tensor, a tuple of tensors (the forward's arguments, and
    with ``loss_fn`` the target last) or a dict of them (the forward's keywords)."""
    return DataLoader(loader)


# -- session -------------------------------------------------------------------------------


class _WithLoss(torch.nn.Module):
    """``loss_fn(model(*inputs), target)``: a forward that returns the loss."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor]):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *batch: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.model(*batch[:-1]), batch[-1])


class Session:
    """Weight-streaming training steps of a module on ``num_csx`` simulated systems."""

    def __init__(
        self,
        model: Module,
        optimizer: TorchOptimizer,
        *records: CompileOptions | TrainingOptions | SparsityOptions,
        model_dir: str | os.PathLike = "cgc-run",
        loss_fn: Callable[..., torch.Tensor] | None = None,
        **fields: Any,
    ):
        unused = sorted(set(fields) - SESSION_OPTIONS)
        if unused:
            taken = ", ".join(sorted(SESSION_OPTIONS))
            raise CgcError(f"cgc.torch.session: {unused[0]} is not one of its options ({taken})")
        chosen = Chosen("cgc.torch.session", SESSION_RECORDS, records, fields)
        self.model = model
        self.optimizer = optimizer
        self.directory = Path(model_dir)
        self.loss_fn = loss_fn
        self.options = chosen[CompileOptions]
        """The compile's options: the target, the systems (default 1), the micro-batch."""
        self.training = chosen[TrainingOptions]
        """The loop's options: clipping and checkpoints (the optimizer is ``optimizer``)."""
        self.sparsity = chosen[SparsityOptions].chosen()
        """The sparsity of the trained weights (``cgc.machine.sparse.sparsity``), named by their
        ``state_dict`` keys."""
        self.steps = 0
        """Steps taken, including those a resumed run skips."""
        self.metrics: list[dict] = []
        self.artifact: Artifact | None = None
        self.cluster: Any = None
        self.names: dict[int, str] = {}
        """The weight name of each parameter, by its id."""
        self._resumed = 0

    def __enter__(self) -> Session:
        self.directory.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        if kind is None:
            self.close()

    # -- the step --------------------------------------------------------------------------

    def step(self, batch: Any) -> float:
        """One training step on the global batch ``batch``; returns its loss."""
        args = self._arguments(batch)
        if self.cluster is None:
            self._start(args)
        if self.steps < self._resumed:  # done before the checkpoint the run resumed from
            self.steps += 1
            return float(self.metrics[self.steps - 1]["loss"])
        assert self.artifact is not None
        specs = self.artifact.manifest["inputs"]
        if len(args) != len(specs):
            raise CgcError(
                f"cgc.torch: the batch has {len(args)} tensors, the model takes {len(specs)}"
            )
        data = {spec["name"]: to_numpy(t) for spec, t in zip(specs, args, strict=True)}
        factor = self.optimizer.schedule.factor(self.steps)
        loss, stats = self.cluster.train_step(data, factor, self.training.max_grad_norm)
        self.steps += 1
        self._log({
            "step": self.steps,
            "loss": loss,
            "lr": self.optimizer.groups[0]["lr"] * factor,
            "grad_norm": self.cluster.grad_norm,
            "simulated_seconds": stats.simulated_seconds,
            "samples_per_second": stats.samples_per_second,
        })  # fmt: skip
        if self.training.checkpoint_every and self.steps % self.training.checkpoint_every == 0:
            self._checkpoint()
        return loss

    def _arguments(self, batch: Any) -> tuple[torch.Tensor, ...]:
        """The forward's tensors of a batch, in order."""
        if isinstance(batch, torch.Tensor):
            batch = (batch,)
        elif isinstance(batch, Mapping):
            batch = tuple(batch.values())
        if not isinstance(batch, tuple | list) or not all(
            isinstance(t, torch.Tensor) for t in batch
        ):
            raise CgcError(
                "cgc.torch: a batch must be a tensor, or a tuple, list or dict of tensors"
            )
        return tuple(batch)

    # -- the first step: capture, compile, weights to MemoryX --------------------------------

    def _start(self, args: tuple[torch.Tensor, ...]) -> None:
        from cgc.compiler.driver import compile_model
        from cgc.compiler.training import Training
        from cgc.runtime.cluster import Cluster

        model = self.model.model
        traced = model if self.loss_fn is None else _WithLoss(model, self.loss_fn)
        self.names = _parameter_names(traced)
        trained = {self.names[id(p)]: settings for p, settings in self.optimizer.parameters()
                   if id(p) in self.names}  # fmt: skip
        if not trained:
            raise CgcError(
                "cgc.torch: no parameter of the module is trained by the optimizer with "
                "requires_grad"
            )
        # compile_model takes any source; its signature names the file kinds
        program: Any = capture(traced, args, kept_whole=KEPT_WHOLE)
        training = Training(
            self.optimizer.name, sorted(trained), self.sparsity, **self.optimizer.keywords
        )
        batch = args[0].shape[0] if args[0].dim() else None
        streamed = replace(self.options, mode=Mode.WEIGHT_STREAMING, batch_size=batch)
        if streamed.num_csx is None:
            streamed = replace(streamed, num_csx=1)
        self.artifact = compile_model(program, streamed, training=training)
        self.cluster = Cluster(self.artifact)
        base = self.optimizer.groups[0]
        self.cluster.memoryx.groups = {n: s for n, s in trained.items() if s != base}
        if self.training.resume:
            self._resumed = self._load_checkpoint()
        else:  # a new run: checkpoints of an earlier one must not be resumed into it later
            shutil.rmtree(self.directory / "checkpoints", ignore_errors=True)
        kept = self.metrics[: self._resumed]
        write_atomically(
            self.directory / "metrics.jsonl", "".join(json.dumps(m) + "\n" for m in kept).encode()
        )

    # -- metrics, checkpoints, the end -------------------------------------------------------

    def _log(self, line: dict) -> None:
        self.metrics.append(line)
        path = self.directory / "metrics.jsonl"
        with writing(path):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, permissions(directory=False))
        try:
            append_whole(fd, path, (json.dumps(strict_json(line)) + "\n").encode())
        finally:
            os.close(fd)

    def _optimizer_record(self) -> dict:
        """The optimizer settings a checkpoint records: the artifact's and the groups'."""
        assert self.artifact is not None
        record = dict(self.artifact.manifest["training"]["optimizer"])
        record["groups"] = {n: dict(s) for n, s in sorted(self.cluster.memoryx.groups.items())}
        return record

    def _checkpoint(self) -> None:
        from cgc.runtime import checkpoint

        memoryx = self.cluster.memoryx
        data = {
            "global_batch": self.cluster.global_batch,
            "next_sample": self.steps * self.cluster.global_batch,
        }
        state = checkpoint.Checkpoint(
            self.steps,
            memoryx.weights,
            memoryx.state,
            memoryx.steps,
            data,
            self._optimizer_record(),
            self._loop_record(),
            memoryx.masks or None,
        )
        checkpoint.save(self.directory / "checkpoints", state)

    def _loop_record(self) -> dict:
        """The loop settings a checkpoint records (``checkpoint.loop_record``)."""
        from cgc.runtime import checkpoint

        assert self.artifact is not None
        training = self.artifact.manifest["training"]
        return checkpoint.loop_record(
            self.optimizer.schedule,
            self.training.max_grad_norm,
            training["trainable"],
            self.artifact.manifest.get("sparsity"),
        )

    def _load_checkpoint(self) -> int:
        """Loads the newest good checkpoint into MemoryX; returns the steps it had done."""
        from cgc.runtime import checkpoint

        found = checkpoint.latest(self.directory / "checkpoints", lambda _: None)
        if found is None:
            return 0
        if found.optimizer != self._optimizer_record():
            raise CgcError(
                f"cgc.torch: resume: checkpoint step-{found.step} was written with other "
                "optimizer settings"
            )
        changed = checkpoint.changed_setting(found, self._loop_record())
        if changed is not None:
            setting, then, now = changed
            raise CgcError(
                f"cgc.torch: resume: checkpoint step-{found.step} was written with {setting} "
                f"{then}, this run has {now}"
            )
        memoryx = self.cluster.memoryx
        memoryx.restore(found.weights, found.optimizer_state, found.updates, found.masks)
        self.metrics = metrics_before(self.directory / "metrics.jsonl", found.step)
        if len(self.metrics) != found.step:
            raise CgcError(f"cgc.torch: resume: metrics.jsonl lacks steps before step-{found.step}")
        return found.step

    def close(self) -> None:
        """Copies the trained weights into the module's parameters and writes them to
        ``weights.safetensors``."""
        if self.cluster is None:
            return
        weights = self.cluster.memoryx.weights
        model = self.model.model
        traced = model if self.loss_fn is None else _WithLoss(model, self.loss_fn)
        with torch.no_grad():
            for param in traced.parameters():
                name = self.names.get(id(param))
                if name in weights:  # a copy: MemoryX's arrays are read-only
                    param.copy_(torch.tensor(np.asarray(weights[name])).reshape(param.shape))
            for name, buffer in traced.named_buffers():
                if name in weights:  # the running statistics MemoryX kept
                    buffer.copy_(torch.tensor(np.asarray(weights[name])).reshape(buffer.shape))
        assert self.artifact is not None
        kept = final_weights(self.artifact.manifest["training"], weights)
        write_atomically(self.directory / "weights.safetensors", weights_to_bytes(kept))


def session(
    model: Module | torch.nn.Module | None = None,
    optimizer: TorchOptimizer | torch.optim.Optimizer | None = None,
    *records: CompileOptions | TrainingOptions | SparsityOptions,
    **options: Any,
) -> Session:
    """A training session of ``model`` with ``optimizer`` (default: the ones wrapped last by
    ``cgc.torch.module`` and ``cgc.torch.optimizer``); the options are ``Session``'s:
    ``model_dir``, ``loss_fn``, and ``cgc.options`` records or their fields by name
    (``SESSION_OPTIONS``: ``num_csx``, ``target``, ``micro_batch_size``, ``max_grad_norm``,
    ``checkpoint_every``, ``resume`` and the sparsity's, ``cgc train``'s)."""
    if model is None and "module" not in _current:
        raise CgcError("cgc.torch.session: no module; wrap one with cgc.torch.module(model)")
    if optimizer is None and "optimizer" not in _current:
        raise CgcError("cgc.torch.session: no optimizer; wrap one with cgc.torch.optimizer(...)")
    chosen = _current["module"] if model is None else model
    wrapped_model = chosen if isinstance(chosen, Module) else Module(chosen)
    given = _current["optimizer"] if optimizer is None else optimizer
    wrapped_optimizer = given if isinstance(given, TorchOptimizer) else TorchOptimizer(given)
    return Session(wrapped_model, wrapped_optimizer, *records, **options)


# -- helpers -------------------------------------------------------------------------------


def _parameter_names(model: torch.nn.Module) -> dict[int, str]:
    """The weight name of every parameter, by its id: its first ``state_dict`` key (as the
    frontend names a tied parameter)."""
    names: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), name)
    return names
