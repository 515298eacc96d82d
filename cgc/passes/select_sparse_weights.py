"""Chooses the weights a sparsity makes sparse and records how many values of each live, in
the module's ``wse.sparse_weights`` (``cgc.dialects.ir``), which the placement counts in
SRAM.

The candidates are the weights the module trains (those it streams gradients of), or, when
it trains none, those it reads. ``patterns`` (regular expressions matched in full against
weight names) choose among them; by default every matrix some matmul multiplies is chosen,
but no embedding table (a weight some gather reads rows of) nor what the activations are
added to or scaled by (a position table, a norm's scale, a bias). A chosen weight of ``N``
values keeps ``live_count(N, density)`` of them (``cgc.machine.sparse.sparsity``); one that
keeps all stays dense.

The compile runs this pass before the placement when a pipelined compile is asked for a
sparsity; weight streaming needs nothing of it in the IR (one compiled program serves every
sparsity of a sweep) and chooses with ``eligible_weights`` after its pipeline. Weights
sparse by their zeros (``--detect-sparsity``) are chosen by their values, which the IR does
not hold: the compile records them itself.

Example: ``select-sparse-weights{density=0.25}`` on a module multiplying ``fc.weight``
(``tensor<32x64xf32>``) records ``wse.sparse_weights = {fc.weight = 512 : i64}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.passes import ModulePass

from cgc.dialects import ws, wse
from cgc.dialects.ir import set_module_sparse_weights
from cgc.errors import CgcError
from cgc.machine.sparse.sparsity import Sparsity, live_count


def eligible_weights(module: ModuleOp, trains: bool) -> tuple[list[str], set[str]]:
    """The weights of ``module`` a sparsity may make sparse (those it trains if ``trains``,
    else those it reads), sorted, and those among them it leaves dense by default:
    embeddings and the weights no matmul multiplies."""
    kinds = ws.StreamGradientOp if trains else wse.WeightOp | ws.StreamWeightOp
    candidates = sorted({op.weight_name.data for op in module.walk() if isinstance(op, kinds)})
    dense = _embeddings(module) | (set(candidates) - _multiplied(module))
    return candidates, dense


def no_sparse_weight(sparsity: Sparsity, trains: bool) -> CgcError:
    """The error of a sparsity that chooses no weight."""
    kind = "trained " if trains else ""
    return CgcError(
        f"--sparse-params: no {kind}weight is sparse"
        + (f" (patterns {list(sparsity.patterns)})" if sparsity.patterns else "")
    )


@dataclass(frozen=True)
class SelectSparseWeightsPass(ModulePass):
    """Records the live values of the weights a sparsity of ``density`` makes sparse."""

    name = "select-sparse-weights"

    density: float
    """The fraction of a sparse weight's values that live, in (0, 1]."""
    patterns: tuple[str, ...] = ()
    """Regular expressions matched in full against weight names; none: every matrix some
    matmul multiplies, but no embedding."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        sparsity = Sparsity(self.density, self.patterns)
        trains = any(isinstance(o, ws.StreamGradientOp) for o in op.walk())
        candidates, dense = eligible_weights(op, trains)
        shapes = _shapes(op)
        chosen = sparsity.chosen(candidates, shapes, dense)
        if not chosen:
            raise no_sparse_weight(sparsity, trains)
        sizes = {name: math.prod(shapes[name]) for name in chosen}
        live = {name: live_count(size, self.density) for name, size in sizes.items()}
        set_module_sparse_weights(op, {n: k for n, k in live.items() if k < sizes[n]})


def _shapes(module: ModuleOp) -> dict[str, tuple[int, ...]]:
    """The shape of every weight the module reads, as it reads it (a view of the stored
    tensor: the same values, the same rank for a matrix)."""
    found = {}
    for op in module.walk():
        if isinstance(op, wse.WeightOp | ws.StreamWeightOp):
            assert isinstance(op.result.type, TensorType)
            found[op.weight_name.data] = op.result.type.get_shape()
    return found


def _multiplied(module: ModuleOp) -> set[str]:
    """The weights some matmul multiplies: the matrices sparsity makes sparse by default
    (a position table added to the activations, a norm's scale, a bias stay dense)."""
    found = set()
    for op in module.walk():
        if isinstance(op, wse.MatmulOp | wse.MatmulTransposeAOp | wse.FusedMatmulOp):
            for operand in (op.lhs, op.rhs):
                owner = operand.owner
                if isinstance(owner, wse.WeightOp | ws.StreamWeightOp):
                    found.add(owner.weight_name.data)
    return found


def _embeddings(module: ModuleOp) -> set[str]:
    """The weights that some gather reads rows of: embedding tables (and the LM heads tied
    to them), which sparsity leaves dense by default."""
    found = set()
    for op in module.walk():
        if isinstance(op, wse.GatherOp):
            owner = op.operands[0].owner
            if isinstance(owner, wse.WeightOp | ws.StreamWeightOp):
                found.add(owner.weight_name.data)
    return found
