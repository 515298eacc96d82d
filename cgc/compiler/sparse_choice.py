"""Which weights a compile makes sparse: those a ``Sparsity`` names (by default the matrices
some matmul multiplies, not embedding tables), or with ``--detect-sparsity`` those with at
least that fraction of zeros, among the weights the program trains or else reads
(``cgc.passes.select_sparse_weights``, whose pass records them in a pipelined compile's
IR); the manifest's record of them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from cgc.errors import CgcError
from cgc.frontends.imported import ImportedModel
from cgc.machine.sparse.sparsity import Sparsity
from cgc.passes.select_sparse_weights import eligible_weights, no_sparse_weight


def _sparsity_entry(
    sparsity: Sparsity,
    imported: ImportedModel,
    candidates: Sequence[str],
    trains: bool,
    dense: set[str],
) -> dict:
    """The manifest's record of the sparse weights among ``candidates`` (by default not
    those in ``dense``)."""
    shapes = {name: spec.shape for name, spec in imported.weight_specs.items()}
    sparse = sparsity.chosen(candidates, shapes, dense)
    if not sparse:
        raise no_sparse_weight(sparsity, trains)
    return sparsity.to_json(sparse)


def sparsity_record(
    sparsity: Sparsity | None,
    detect_sparsity: float | None,
    imported: ImportedModel,
    module: ModuleOp,
    trains: bool,
) -> dict:
    """The manifest's sparsity record of a compile that asks for sparse weights (the
    ``sparsity`` given, or those of at least ``detect_sparsity`` zeros), among the weights
    ``module`` trains (``trains``), or else reads."""
    candidates, dense = eligible_weights(module, trains)
    if sparsity is not None:
        return _sparsity_entry(sparsity, imported, candidates, trains, dense)
    assert detect_sparsity is not None
    return _detected_entry(detect_sparsity, imported, candidates, dense)


def checked_threshold(threshold: float | None, sparsity: object) -> float | None:
    """``--detect-sparsity``'s fraction of zeros, if in (0, 1] and alone."""
    if threshold is None:
        return None
    if sparsity:
        raise CgcError("--detect-sparsity and --sparsity both say which weights are sparse")
    if not 0 < threshold <= 1:
        raise CgcError(f"--detect-sparsity {threshold:g}: the fraction of zeros must be in (0, 1]")
    return threshold


def _detected_entry(
    threshold: float, imported: ImportedModel, candidates: Sequence[str], dense: set[str]
) -> dict:
    """The record of the weights among ``candidates`` with at least ``threshold`` of zeros
    (matrices not in ``dense``): their zeros are the dead values."""
    shapes = {name: spec.shape for name, spec in imported.weight_specs.items()}
    matrices = [n for n in candidates if len(shapes[n]) >= 2 and n not in dense]
    unread = [n for n in matrices if n not in imported.weights]
    if unread:
        raise CgcError(
            f"detect_sparsity: weight '{unread[0]}' has no values to look at "
            "(declared by shape: a params file or no_weights)",
            "detect_sparsity",
            "no_weights",
        )
    zeros = {n: 1 - np.count_nonzero(imported.weights[n]) / imported.weights[n].size
             for n in matrices}  # fmt: skip
    chosen = [n for n in matrices if zeros[n] >= threshold]
    if not chosen:
        most = max(zeros, key=zeros.__getitem__, default=None)
        found = f"; the most: '{most}', {zeros[most]:.1%}" if most is not None else ""
        raise CgcError(
            f"--detect-sparsity {threshold:g}: no weight has that fraction of zeros{found}"
        )
    live = sum(np.count_nonzero(imported.weights[n]) for n in chosen)
    if not live:
        raise CgcError(f"--detect-sparsity: every value of {', '.join(chosen)} is zero")
    size = sum(imported.weights[n].size for n in chosen)
    return {"density": live / size, "init": "detected", "seed": 0, "weights": chosen}
