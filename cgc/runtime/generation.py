"""Greedy generation on the simulator with numbers.

A compiled generation is two programs (``cgc.compiler.generation``): the prompts' and the
decode step's. ``Generator`` runs them on one simulated system that keeps the weights and the
key-value caches from one run to the next: the prompts once, then the decode step once per
new token, each sequence's token written into its caches at its position. Nothing is
compiled again and no cache is copied between the steps.

Prompts of different lengths (``Prompts``) run together: each row's tokens from position 0,
right-padded to the longest; a causal model never lets a token see the padding after it, the
prompt's logits are read at each row's last token, and each row's decode writes its
positions over the padding's cache rows before any query can see them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cgc.errors import CgcError
from cgc.machine.hardware.target import Target
from cgc.machine.program.artifact import Artifact
from cgc.machine.program.mode import Mode
from cgc.machine.timing.cost import Sram
from cgc.runtime.memoryx import MemoryX
from cgc.runtime.vm import Executor, System

TOKEN_DTYPE = np.int32
"""The programs' token ids and positions."""


@dataclass(frozen=True)
class Prompts:
    """The prompts of a generation: each row's tokens, their count, and the padding the
    caller gave around them (kept for the output, in front)."""

    rows: list[np.ndarray]
    pads: list[np.ndarray]

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(row) for row in self.rows], dtype=TOKEN_DTYPE)

    @property
    def longest(self) -> int:
        return max(len(row) for row in self.rows)

    def padded(self) -> np.ndarray:
        """``[B, longest]``: each row's tokens from the left, zeros after."""
        out = np.zeros((len(self.rows), self.longest), dtype=TOKEN_DTYPE)
        for index, row in enumerate(self.rows):
            out[index, : len(row)] = row
        return out


def prompts_of(ids: object, mask: object | None, vocab: int, name: str) -> Prompts:
    """The prompts in ``ids`` (``[B, P]`` integers, or a list of rows of any lengths) with
    ``mask`` (``[B, P]``, nonzero at each row's tokens, which are contiguous: left or right
    padding); a CgcError naming ``name`` for an empty prompt, a token outside the
    vocabulary or a mask that does not fit."""
    if isinstance(ids, list | tuple) and ids and not np.isscalar(ids[0]):
        if mask is not None:
            raise CgcError(f"{name}: rows of their own lengths need no attention mask")
        rows = [_integers(_array(row, f"{name} row {i}"), f"{name} row {i}")
                for i, row in enumerate(ids)]  # fmt: skip
        flat = [i for i, row in enumerate(rows) if row.ndim != 1]
        if flat:
            raise CgcError(f"{name}: row {flat[0]} is not a list of token ids")
        pads = [row[:0] for row in rows]
    else:
        array = _integers(_array(ids, name), name)
        if array.ndim != 2:
            raise CgcError(f"{name}: expected [sequences, tokens] token ids, got {array.shape}")
        rows, pads = _masked(array, mask, name)
    if not rows:
        raise CgcError(f"{name}: no sequences")
    for index, row in enumerate(rows):
        if not row.size:
            raise CgcError(f"{name}: sequence {index} is empty")
        bad = np.flatnonzero((row < 0) | (row >= vocab))
        if bad.size:
            raise CgcError(
                f"{name}: token id {int(row[bad[0]])} (sequence {index}, token {int(bad[0])}) "
                f"is outside the vocabulary of {vocab} tokens"
            )
    return Prompts([r.astype(np.int64) for r in rows], [p.astype(np.int64) for p in pads])


def _array(value: object, name: str) -> np.ndarray:
    """``value`` as an array; a CgcError naming it if its rows are ragged."""
    try:
        return np.asarray(value)
    except ValueError:
        raise CgcError(f"{name}: rows of different lengths (give a list of rows)") from None


def _integers(array: np.ndarray, name: str) -> np.ndarray:
    if array.dtype.kind not in "iu":
        raise CgcError(f"{name}: token ids must be integers, got {array.dtype}")
    return array


def _masked(
    array: np.ndarray, mask: object | None, name: str
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each row's tokens where ``mask`` is set (all of them without one) and its padding."""
    if mask is None:
        return list(array), [row[:0] for row in array]
    keep = np.asarray(mask)
    if keep.shape != array.shape:
        raise CgcError(
            f"{name}: the attention mask {keep.shape} differs from the ids {array.shape}"
        )
    rows, pads = [], []
    for index, (row, kept) in enumerate(zip(array, keep.astype(bool), strict=True)):
        where = np.flatnonzero(kept)
        if where.size and where[-1] - where[0] + 1 != where.size:
            raise CgcError(f"{name}: sequence {index}'s attention mask has a hole in it")
        rows.append(row[kept])
        pads.append(row[~kept])
    return rows, pads


class Generator:
    """A compiled generation's programs on one simulated system with numbers."""

    def __init__(self, prefill: Artifact, decode: Artifact, mode: Mode):
        self.prefill = prefill
        self.decode = decode
        self.target = Target.from_json(prefill.manifest["target"])
        self.deliver = mode == Mode.PIPELINED
        prefill.require_weights(f"the generation of {prefill.manifest['source']}")
        # the programs share the model's parameters; each may hold constants of its own
        weights = {**decode.weights, **prefill.weights}
        specs = {**decode.weight_specs, **prefill.weight_specs}
        self.memoryx = MemoryX(weights, self.target, specs)
        self.system = System(Sram(self.target, strict=False))

    def _logits(self, artifact: Artifact, inputs: Sequence[np.ndarray]) -> np.ndarray:
        executor = Executor(artifact.program, self.target, self.system, self.memoryx, self.deliver)
        executor.run(inputs)
        return executor.outputs[0].astype(np.float32)

    def prompted(self, prompts: Prompts) -> np.ndarray:
        """The prompts' program over the prompts, chunk after chunk of the tokens it takes:
        the logits ``[B, V]`` of each sequence's last prompt token. A shorter prompt's
        padding writes rows past its prompt, which a decode step writes again before any
        query reads them, or none reads; the last chunk's padding past the longest prompt
        has negative positions, and writes nothing."""
        padded, lengths = prompts.padded(), prompts.lengths
        batch, longest = padded.shape
        chunk = self.prefill.manifest["inputs"][0]["shape"][1]
        logits: np.ndarray | None = None
        for start in range(0, longest, chunk):
            ids = np.zeros((batch, chunk), dtype=TOKEN_DTYPE)
            ids[:, : min(chunk, longest - start)] = padded[:, start : start + chunk]
            where = np.arange(start, start + chunk)
            where[where >= longest] = -1
            positions = np.ascontiguousarray(np.broadcast_to(where, ids.shape), TOKEN_DTYPE)
            last = np.clip(lengths - 1 - start, 0, chunk - 1) + chunk * np.arange(batch)
            out = self._logits(self.prefill, [ids, positions, last.astype(TOKEN_DTYPE)])
            logits = out if logits is None else logits
            here = (lengths - 1 >= start) & (lengths - 1 < start + chunk)
            logits[here] = out[here]
        assert logits is not None
        return logits

    def generate(self, prompts: Prompts, new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """Greedy decoding of ``new_tokens`` tokens after each prompt: the tokens ``[B,
        N]`` and every step's logits ``[N, B, V]``."""
        lengths = prompts.lengths
        batch = len(prompts.rows)
        steps = [self.prompted(prompts)]
        tokens = np.zeros((batch, new_tokens), dtype=np.int64)
        for step in range(new_tokens):
            tokens[:, step] = np.argmax(steps[-1], axis=-1)
            if step + 1 == new_tokens:
                break
            ids = tokens[:, step : step + 1].astype(TOKEN_DTYPE)
            where = (lengths + step)[:, None].astype(TOKEN_DTYPE)
            steps.append(self._logits(self.decode, [ids, where]))
        return tokens, np.stack(steps)


def joined(prompts: Prompts, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every row's prompt and new tokens, left-padded to one length as ``transformers``'
    ``generate`` returns a batch (the padding the caller gave, zeros where it gave none),
    and the attention mask of the result."""
    longest = prompts.longest
    rows, masks = [], []
    for pad, row, new in zip(prompts.pads, prompts.rows, tokens, strict=True):
        short = longest - len(row)
        given = pad[max(len(pad) - short, 0) :] if short else pad[:0]
        filler = np.zeros(short - len(given), dtype=np.int64)
        rows.append(np.concatenate([filler, given, row, new]))
        masks.append(np.repeat(np.array([0, 1], np.int64), [short, len(row) + len(new)]))
    return np.stack(rows), np.stack(masks)
