"""What a compile holds fixed, folded into constants before attention is matched.

An ONNX file stores its exporter's lifted constants as initializers beside the weights: the
``1/sqrt(d)`` of attention, a mask's fill of -3.4e38, the pieces a mask is built from. The
dynamo exporter names them ``val_N`` like the weights, so the importer takes every float
initializer for a parameter and folds nothing they feed. Once the driver knows which weights a
compile holds fixed and reads as no parameter (``cgc.dialects.parameters``), their values are
as known as the importer's constants: this folds every op whose operands are all known, as the
importer folds shape arithmetic, so that the scale is an inline number and the mask one
weight of known values (``fuse-attention`` reads both), and a select whose condition is known
alike everywhere is the branch it takes.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import numpy as np
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import Rewriter

from cgc.dialects import wse
from cgc.dialects.ir import dense_to_numpy, main_function
from cgc.frontends.emitter import INLINE_LIMIT, constant_op, evaluate, foldable
from cgc.frontends.imported import ImportedModel
from cgc.passes.cache_keys_values import positions_argument


def fold_fixed_weights(
    module: ModuleOp,
    weights: dict[str, np.ndarray],
    fixed: Callable[[wse.WeightOp], bool],
) -> int:
    """Folds in ``module``'s ``@main`` the weights that are ``fixed`` (with their values in
    ``weights``) and every op computed from them and constants alone; the results too large to
    be inline become frozen weights added to ``weights``. Returns how many ops it folded."""
    known: dict[SSAValue, np.ndarray] = {}
    folded = 0
    for op in list(main_function(module).body.block.ops):
        if isinstance(op, wse.ConstantOp):
            known[op.result] = dense_to_numpy(op.value)
        elif isinstance(op, wse.WeightOp):
            array = _fixed_value(op, weights, fixed)
            if array is not None:
                known[op.result] = array
                if op.frozen is None:  # a frozen weight stays, by its name
                    folded += _replace(op, [array], weights, known)
        elif op.operands and foldable(op) and all(v in known for v in op.operands):
            values = evaluate(op, [known[v] for v in op.operands])
            if _weight_view(op):  # fold-constants makes it a view of the weight, no copy
                known[op.results[0]] = values[0]
            else:
                folded += _replace(op, values, weights, known)
        elif isinstance(op, wse.SelectOp) and (chosen := _chosen(op, known)) is not None:
            Rewriter.replace_op(op, [], [chosen])
            folded += 1
    return folded


def _chosen(op: wse.SelectOp, known: dict[SSAValue, np.ndarray]) -> SSAValue | None:
    """The branch a select takes everywhere, if its condition is known to be all alike and
    the branch has the select's type (the guards of rows whose keys are all masked, in a model
    whose masks mask no such row)."""
    condition = known.get(op.cond)
    if condition is None or not condition.size or not (condition == condition.flat[0]).all():
        return None
    branch = op.true_value if condition.flat[0] else op.false_value
    return branch if branch.type == op.result.type else None


def _weight_view(op: Operation) -> bool:
    """Whether ``op`` reshapes or transposes a weight."""
    return isinstance(op, wse.ReshapeOp | wse.TransposeOp) and isinstance(
        op.operands[0].owner, wse.WeightOp
    )


def _fixed_value(
    op: wse.WeightOp, weights: dict[str, np.ndarray], fixed: Callable[[wse.WeightOp], bool]
) -> np.ndarray | None:
    """The values of a weight the compile holds fixed, if known."""
    array = weights.get(op.weight_name.data)
    if array is None or op.perm is not None or array.shape != wse.tensor_shape(op.result):
        return None
    return array if fixed(op) else None


def _replace(
    op: Operation,
    values: list[np.ndarray],
    weights: dict[str, np.ndarray],
    known: dict[SSAValue, np.ndarray],
) -> int:
    """Replaces ``op`` by constants of ``values`` (a fixed weight by itself: inline, or a
    frozen weight of its own name)."""
    own = op.weight_name.data if isinstance(op, wse.WeightOp) else None
    new = []
    for array in values:
        made = constant_op(array, weights, own or _fresh(weights, _location_name(op)))
        made.location = op.location
        known[made.results[0]] = array
        new.append(made)
    Rewriter.replace_op(op, new)
    return 1


def _location_name(op: Operation) -> str:
    desc = getattr(op.location, "desc", None)
    return desc.data if desc is not None else "fixed"


def _fresh(weights: dict[str, np.ndarray], base: str) -> str:
    """A name for a folded weight that no weight has."""
    number = 1
    while f"{base}:fixed{number}" in weights:
        number += 1
    return f"{base}:fixed{number}"


def positions_constants_inline(imported: ImportedModel) -> ImportedModel:
    """``imported`` (a generation's program of a decoder graph) with the fixed weights its
    positions are combined with inline constants, so that ``cache-keys-values`` can evaluate
    a mask computed from them and the positions: boolean weights (masks an exporter or the
    folding computed ahead, too large to be inline), frozen integer ones (the indices a mask
    builder gathers with) and small frozen ones (a mask's fill, ``-inf``, which the IR text
    cannot hold). Parameters and large frozen float tables stay weights."""
    fn = main_function(imported.module)
    reached = _computed_from(positions_argument(fn))
    inlined = {}
    for op in reached:
        for operand in op.operands:
            weight = operand.owner
            if isinstance(weight, wse.WeightOp) and weight.perm is None:
                value = imported.weights.get(weight.weight_name.data)
                if value is not None and _mask_material(weight, value):
                    inlined[weight] = value
    for weight, value in inlined.items():
        constant = wse.ConstantOp(wse.dense_attr(value))
        constant.location = weight.location
        Rewriter.replace_op(weight, constant)
    used = {op.weight_name.data for op in fn.walk() if isinstance(op, wse.WeightOp)}
    weights = {name: value for name, value in imported.weights.items() if name in used}
    kept = [name for name in imported.initializers if name in weights]
    return dataclasses.replace(imported, weights=weights, initializers=kept)


def _computed_from(value: SSAValue) -> list[Operation]:
    """The ops whose results depend on ``value``."""
    found: dict[Operation, None] = {}
    pending = [value]
    while pending:
        for use in pending.pop().uses:
            if use.operation not in found:
                found[use.operation] = None
                pending.extend(use.operation.results)
    return list(found)


def _mask_material(weight: wse.WeightOp, value: np.ndarray) -> bool:
    """Whether ``weight`` is what a mask is built of rather than a model's tensor."""
    if value.dtype == np.bool_:
        return True
    return weight.frozen is not None and (value.dtype.kind == "i" or value.size <= INLINE_LIMIT)


def program_constants(imported: ImportedModel) -> ImportedModel:
    """``imported`` with its frozen weights named by their values as well: the programs of a
    generation share their parameters by name and run on one system, while a constant the
    frontend or the folding made for one shape (a mask over its tokens) is its program's
    own, though named alike in both."""
    renamed = {}
    for op in main_function(imported.module).walk():
        if isinstance(op, wse.WeightOp) and op.frozen is not None:
            name = op.weight_name.data
            value = imported.weights.get(name)
            if value is not None:
                digest = hashlib.sha256(value.tobytes() + str(value.shape).encode()).hexdigest()
                renamed[name] = f"{name}@{digest[:12]}"
                op.weight_name = StringAttr(renamed[name])
    weights = {renamed.get(n, n): value for n, value in imported.weights.items()}
    initializers = [renamed.get(n, n) for n in imported.initializers]
    return dataclasses.replace(imported, weights=weights, initializers=initializers)
