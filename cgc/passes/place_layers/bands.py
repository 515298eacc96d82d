"""Bands: every layer a band of the mesh's full width, its rows in proportion to its time on
the whole mesh, at least the rows its SRAM needs.

This is the placement of a generation's decode step: its layers multiply one token's vector by
their resident matrices (MeshGEMV) or read a key-value cache, times that shrink about as the
rows grow, so rows in proportion to the times on the whole mesh balance the stages without a
search. A band as wide as the mesh also keeps a layer's rows many (a GEMV splits its matrix's
rows over them) where the balanced search keeps a layer of one-row activations as short as
its SRAM allows. The bands stack down the mesh in pipeline order, each against the one that
feeds it.
"""

from __future__ import annotations

from cgc.errors import DoesNotFitError
from cgc.machine.movement.layout import Rect
from cgc.passes.place_layers.layers import LayerTimings


def fewest_rows(layers: LayerTimings, index: int) -> int | None:
    """The fewest rows of the mesh's full width on which layer ``index`` fits, if any."""
    rows, cols = layers.target.rows, layers.target.cols
    if not layers.fits(layers.cost(index, (0, 0, cols, rows))):
        return None
    lo, probe = 1, 1
    while not layers.fits(layers.cost(index, (0, 0, cols, probe))):
        lo, probe = probe + 1, min(rows, 2 * probe)
    hi = probe
    while lo < hi:
        mid = (lo + hi) // 2
        if layers.fits(layers.cost(index, (0, 0, cols, mid))):
            hi = mid
        else:
            lo = mid + 1
    return lo


def bands(layers: LayerTimings) -> list[Rect]:
    """Every layer's band, in layer order; a ``DoesNotFitError`` naming the rows the bands
    need if they do not fit the mesh's."""
    rows, cols = layers.target.rows, layers.target.cols
    least = [fewest_rows(layers, i) for i in range(layers.count)]
    missing = [layers.layer_name(i) for i, r in enumerate(least) if r is None]
    if missing:
        raise DoesNotFitError(
            f"model does not fit on {layers.target.name} in pipelined mode: the layers "
            f"{missing} do not fit on the whole mesh"
        )
    need = [r or 1 for r in least]
    if sum(need) > rows:
        raise DoesNotFitError(
            f"model does not fit on {layers.target.name} in pipelined mode: its "
            f"{layers.count} layers need {sum(need)} rows as bands of the mesh's full width, "
            f"the mesh has {rows}"
        )
    whole = (0, 0, cols, rows)
    held = [max(layers.stage_cycles(layers.cost(i, whole)), 1.0) for i in range(layers.count)]
    share = [max(n, int(rows * h / sum(held))) for n, h in zip(need, held, strict=True)]
    while sum(share) > rows:  # the rows the floors took, from the layers with most to spare
        spare = max(range(layers.count), key=lambda i: (share[i] - need[i], -i))
        share[spare] -= 1
    left = rows - sum(share)
    for index in sorted(range(layers.count), key=lambda i: (-held[i], i))[:left]:
        share[index] += 1
    out, top = [], 0
    for height in share:
        out.append((0, top, cols, height))
        top += height
    return out
