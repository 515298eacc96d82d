"""Computes a segment's forward activations again for its backward pass instead of keeping
them on the wafer from the forward pass (activation checkpointing).

In weight-streaming training every activation a backward layer needs stays on the wafer from
the forward pass until its backward layer has run. For deep models at their batch sizes that
is more than the wafer holds. This pass groups the forward layers into segments (the layers
whose names start with the same match of ``segments``: a transformer block ``h.3.``), and
right before the first backward layer of a segment it inserts a copy of the segment's
forward layers, ``<name>.recompute``, whose inputs are the values the segment received from
outside (the checkpoints: the residual stream entering the block); the segment's backward
layers then read the copies' results. The forward pass keeps only what crosses segment
boundaries, and a segment's activations live from its copy to its backward layers. The copies
create their weights again, so in weight-streaming mode the segment's weights stream a third
time.

Only the forward layers whose results the segment's backward layers use, directly or through
other copied layers, are copied. Run after ``autodiff`` and before ``schedule-streams``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Block, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from cgc.dialects import wse
from cgc.dialects.ir import main_function
from cgc.errors import CgcError
from cgc.machine.program.bytecode import GRADIENT_SUFFIX, RECOMPUTED_SUFFIX


def _segments(
    layers: Sequence[wse.LayerOp], pattern: re.Pattern[str]
) -> dict[str, list[wse.LayerOp]]:
    """The forward layers of each segment, in program order, segments in order of appearance."""
    found: dict[str, list[wse.LayerOp]] = {}
    for layer in layers:
        name = layer.layer_name.data
        if name.endswith((GRADIENT_SUFFIX, RECOMPUTED_SUFFIX)):
            continue
        match = pattern.match(name)
        if match is not None and match.group(0):
            found.setdefault(match.group(0), []).append(layer)
    return found


def _needed(forward: Sequence[wse.LayerOp], backward: set[wse.LayerOp]) -> list[wse.LayerOp]:
    """The layers of ``forward`` whose results ``backward`` uses, directly or through another
    such layer, in program order."""
    needed: set[wse.LayerOp] = set()
    for layer in reversed(forward):
        users = {use.operation for result in layer.results for use in result.uses}
        if users & backward or users & needed:
            needed.add(layer)
    return [layer for layer in forward if layer in needed]


def _recompute(block: Block, forward: list[wse.LayerOp], backward: list[wse.LayerOp]) -> None:
    """Inserts copies of ``forward`` before the first of ``backward`` and makes ``backward``
    read their results."""
    readers = set(backward)
    copied = _needed(forward, readers)
    if not copied:
        return
    first = min(backward, key=block.get_operation_index)
    mapping: dict[SSAValue, SSAValue] = {}
    for layer in copied:
        clone = layer.clone(value_mapper=dict(mapping))
        clone.properties["name"] = StringAttr(layer.layer_name.data + RECOMPUTED_SUFFIX)
        Rewriter.insert_op(clone, InsertPoint.before(first))
        mapping.update(zip(layer.results, clone.results, strict=True))
    for old, new in mapping.items():
        old.replace_uses_with_if(new, lambda use: use.operation in readers)


@dataclass(frozen=True)
class RecomputeActivationsPass(ModulePass):
    """Copies each segment's forward layers before its backward layers, which read the
    copies' results."""

    name = "recompute-activations"

    segments: str = ""
    """A regular expression; a forward layer whose name starts with a (non-empty) match
    belongs to the segment of that match. Empty: no segment, the pass does nothing."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if not self.segments:
            return
        try:
            pattern = re.compile(self.segments)
        except re.error as e:
            raise CgcError(f"recompute-activations: segments {self.segments!r}: {e}") from None
        block = main_function(op).body.block
        layers = [o for o in block.ops if isinstance(o, wse.LayerOp)]
        if any(layer.layer_name.data.endswith(RECOMPUTED_SUFFIX) for layer in layers):
            raise CgcError("recompute-activations: the module already recomputes activations")
        by_name = {layer.layer_name.data: layer for layer in layers}
        for forward in _segments(layers, pattern).values():
            backward = [
                by_name[f"{layer.layer_name.data}{GRADIENT_SUFFIX}"]
                for layer in forward
                if f"{layer.layer_name.data}{GRADIENT_SUFFIX}" in by_name
            ]
            if backward:
                _recompute(block, forward, backward)
