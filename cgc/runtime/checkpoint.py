"""Training checkpoints: MemoryX's weights and optimizer state, and where the data stands.

A checkpoint of step N is the directory ``DIR/checkpoints/step-N/`` holding
``weights.safetensors`` (every weight MemoryX holds), ``optimizer.safetensors`` (each
parameter's state tensors, keyed ``<parameter>/<slot>``) and ``state.json`` (the step, the
number of optimizer updates, the data position and order, and the SHA-256 of both tensor
files). It is written into a
temporary directory beside it and renamed into place, so a run killed at any moment leaves
whole checkpoints only; the checksums catch one damaged later.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cgc.machine.artifact import weights_from_bytes, weights_to_bytes
from cgc.machine.files import permissions

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
    state = {
        "format": FORMAT,
        "step": checkpoint.step,
        "updates": checkpoint.updates,
        "data": checkpoint.data,
        "optimizer": checkpoint.optimizer,
        "sha256": {name: _digest(data) for name, data in files.items()},
    }
    files["state.json"] = (json.dumps(state, indent=1, sort_keys=True) + "\n").encode()
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
        )
    except CorruptCheckpoint:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpoint(f"{type(e).__name__}: {e}") from None


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
