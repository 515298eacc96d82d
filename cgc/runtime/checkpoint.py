"""Training checkpoints: MemoryX's weights and optimizer state, and where the data stands.

A checkpoint of step N is the directory ``DIR/checkpoints/step-N/`` holding
``weights.safetensors`` (every weight MemoryX holds), ``optimizer.safetensors`` (each
parameter's state tensors, keyed ``<parameter>/<slot>``; a sparse weight's over its live
values), ``masks.safetensors`` with sparse weights (their masks as they stand: a dynamic
sparsity moves them) and ``state.json`` (the step, the
number of optimizer updates, the data position and order, the optimizer's settings, the
loop's (``loop``: the learning-rate schedule, the gradient clipping and the trained weights)
and the SHA-256 of both tensor files). It is written into a temporary directory beside it and
renamed into place, so a run killed at any moment leaves whole checkpoints only; the
checksums catch one damaged later.

A run may resume from a checkpoint only if it would have taken the checkpoint's steps
exactly as they were taken: then it ends as an uninterrupted run with its own settings
would. ``changed_setting`` applies that rule to the loop's settings:

- the learning-rate schedule (``--lr-schedule``, ``--warmup-steps``, ``--steps``,
  ``--lr-step-size``, ``--lr-gamma``) may change only if it gives every step already taken
  the same factor: extending ``--steps`` of a constant or step schedule passes, of a cosine
  one (which decays towards 0 at ``--steps``) it does not, past its first step;
- the gradient clipping (``--max-grad-norm``), the trained weights and their sparsity
  (``--sparsity``, its masks and its dynamic schedule) may not change at all: which steps
  a threshold clipped would take the gradients to tell;
- what only observes or saves the run (``--eval-data``, ``--eval-every``,
  ``--checkpoint-every``, ``--trace``) may change freely.

A checkpoint written before ``loop`` was recorded, or missing part of it, leaves those
settings unknown and unchecked.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from cgc.files import permissions, writing
from cgc.machine.program.artifact import weights_from_bytes, weights_to_bytes
from cgc.machine.sparse.sparsity import Sparsity
from cgc.machine.training.optimizers import Schedule

FORMAT = "cgc-checkpoint-1"
STEP_DIR = re.compile(r"step-(\d+)")


class CorruptCheckpoint(Exception):
    """A checkpoint directory that cannot be trusted; the message says why."""


@dataclass
class Checkpoint:
    """What a training run needs to continue exactly where it stood after ``step`` steps."""

    step: int
    weights: dict[str, np.ndarray]
    optimizer_state: dict[str, dict[str, np.ndarray]]
    updates: int
    """Optimizer updates MemoryX has applied."""
    data: dict
    """Where the data stands: the global batch, the shuffling (``shuffle``, ``seed``) and the
    next sample position; a run resumes only with the same order of samples."""
    optimizer: dict
    """The optimizer and its settings, which a resumed run must share."""
    loop: dict | None = None
    """The loop's settings that shaped the updates (``loop_record``); None in a checkpoint
    written before they were recorded, which leaves them unknown."""
    masks: dict[str, np.ndarray] | None = None
    """The sparse weights' masks; None without sparse weights, or in a checkpoint written
    before they were saved (a static sparsity's, which the run finds again)."""


SCHEDULE_SETTINGS = {
    "kind": "lr_schedule",
    "warmup_steps": "warmup_steps",
    "total_steps": "steps",
    "step_size": "lr_step_size",
    "gamma": "lr_gamma",
}
"""The keyword (``prepare_training``'s; ``--`` and dashes make the option) of each field of
a ``Schedule``."""


def loop_record(
    schedule: Schedule,
    max_grad_norm: float | None,
    trainable: Sequence[str],
    sparsity: Mapping[str, Any] | None = None,
) -> dict:
    """What a checkpoint records of the loop: every setting besides the optimizer's and the
    data order's that changes the updates of the steps (``sparsity``: the artifact's
    record, written as its settings, ``Sparsity.describe``, and weights)."""
    return {
        "schedule": asdict(schedule),
        "max_grad_norm": max_grad_norm,
        "trainable": sorted(trainable),
        "sparsity": None
        if sparsity is None
        else f"{Sparsity.from_json(sparsity).describe()}: " + ", ".join(sparsity["weights"]),
    }


def changed_setting(found: Checkpoint, record: dict) -> tuple[str, str, str] | None:
    """The first loop setting in which ``record`` (this run's ``loop_record``) differs from
    the one ``found`` was written with in a way that would have changed the steps it took,
    as (keyword, its value then, its value now); None if there is none (the rule is the
    module's)."""
    if found.loop is None:
        return None
    for key in ("trainable", "max_grad_norm", "sparsity"):
        then = found.loop.get(key, record[key])
        if key == "sparsity" and isinstance(then, str) and not then.startswith("density "):
            then = f"density {then}"  # written before the record named the density
        if then != record[key]:
            return key, _shown(then), _shown(record[key])
    if "schedule" not in found.loop:
        return None
    then, now = Schedule(**found.loop["schedule"]), Schedule(**record["schedule"])
    if then == now or all(then.factor(s) == now.factor(s) for s in range(found.step)):
        return None
    field = next(
        (f for f in _schedule_fields(then.kind) if getattr(then, f) != getattr(now, f)), "kind"
    )
    return SCHEDULE_SETTINGS[field], _shown(getattr(then, field)), _shown(getattr(now, field))


def _schedule_fields(kind: str) -> list[str]:
    """The fields of a ``Schedule`` of ``kind`` that its factors depend on, kind first (so a
    changed kind is named before the fields that mean something else under it)."""
    unused = {"constant": {"total_steps", "step_size", "gamma"},
              "cosine": {"step_size", "gamma"},
              "step": {"total_steps"}}.get(kind, set())  # fmt: skip
    return [f.name for f in fields(Schedule) if f.name not in unused]


def _shown(value: object) -> str:
    """A setting's value as a user would type it."""
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "(nothing)"
    return str(value)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _state_to_flat(state: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {f"{name}/{slot}": v for name, slots in state.items() for slot, v in slots.items()}


def _state_from_flat(flat: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    state: dict[str, dict[str, np.ndarray]] = {}
    for key, value in flat.items():
        name, slot = key.rsplit("/", 1)
        state.setdefault(name, {})[slot] = value
    return state


def save(root: Path, checkpoint: Checkpoint) -> Path:
    """Writes ``checkpoint`` under ``root`` (``DIR/checkpoints``) atomically; returns its
    directory."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{checkpoint.step}"
    files = {
        "weights.safetensors": weights_to_bytes(checkpoint.weights),
        "optimizer.safetensors": weights_to_bytes(_state_to_flat(checkpoint.optimizer_state)),
    }
    if checkpoint.masks:
        files["masks.safetensors"] = weights_to_bytes(checkpoint.masks)
    state = {
        "format": FORMAT,
        "step": checkpoint.step,
        "updates": checkpoint.updates,
        "data": checkpoint.data,
        "optimizer": checkpoint.optimizer,
        **({"loop": checkpoint.loop} if checkpoint.loop is not None else {}),
        "sha256": {name: _digest(data) for name, data in files.items()},
    }
    files["state.json"] = (json.dumps(state, indent=1, sort_keys=True) + "\n").encode()
    with writing(final):  # a full disk: no staging directory left, the old copy kept
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}."))
        os.chmod(staging, permissions(directory=True))  # mkdtemp's are owner-only
        try:
            for name, data in files.items():
                with open(staging / name, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            if final.exists():  # a step saved again (a resumed run) replaces the old copy
                shutil.rmtree(final)
            os.replace(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return final


def load(directory: Path) -> Checkpoint:
    """Reads and checks one checkpoint directory; raises CorruptCheckpoint saying why."""
    try:
        state = json.loads((directory / "state.json").read_text())
        if state.get("format") != FORMAT:
            raise CorruptCheckpoint(f"unknown format {state.get('format')!r}")
        blobs = {}
        for name, digest in state["sha256"].items():
            blobs[name] = (directory / name).read_bytes()
            if _digest(blobs[name]) != digest:
                raise CorruptCheckpoint(f"{name} does not match its checksum")
        return Checkpoint(
            step=int(state["step"]),
            weights=weights_from_bytes(blobs["weights.safetensors"]),
            optimizer_state=_state_from_flat(weights_from_bytes(blobs["optimizer.safetensors"])),
            updates=int(state["updates"]),
            data=dict(state["data"]),
            optimizer=dict(state["optimizer"]),
            loop=_loop_from(state.get("loop")),
            masks=_masks_from(blobs.get("masks.safetensors")),
        )
    except CorruptCheckpoint:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpoint(f"{type(e).__name__}: {e}") from None


def _loop_from(recorded: object) -> dict | None:
    """The ``loop`` record of a ``state.json``, its schedule checked (a bad one raises
    ValueError, TypeError or KeyError, which make the checkpoint corrupt)."""
    if recorded is None:
        return None
    loop = dict(recorded)  # type: ignore[call-overload]
    if "schedule" in loop:
        Schedule(**loop["schedule"])
    return loop


def _masks_from(data: bytes | None) -> dict[str, np.ndarray] | None:
    """The masks of a ``masks.safetensors``, if the checkpoint has one (a ValueError if
    one is not boolean, which makes the checkpoint corrupt)."""
    if data is None:
        return None
    masks = weights_from_bytes(data)
    for name, mask in masks.items():
        if mask.dtype != np.bool_:
            raise ValueError(f"the mask of {name} is {mask.dtype}, not bool")
    return masks


def saved_steps(root: Path) -> list[int]:
    """The steps of the checkpoint directories under ``root``, newest first."""
    if not root.is_dir():
        return []
    found = [STEP_DIR.fullmatch(p.name) for p in root.iterdir() if p.is_dir()]
    return sorted((int(m.group(1)) for m in found if m), reverse=True)


def latest(root: Path, warn) -> Checkpoint | None:
    """The newest checkpoint under ``root`` that loads and checks; each damaged newer one is
    reported through ``warn`` and skipped. None when there is none at all."""
    for step in saved_steps(root):
        try:
            return load(root / f"step-{step}")
        except CorruptCheckpoint as e:
            warn(f"checkpoint step-{step} is damaged ({e}); trying an earlier one")
    return None
