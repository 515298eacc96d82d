"""Bands: every layer a band of the mesh's full width, its rows in proportion to the larger of
its share of the bytes the layers keep resident and its share of their time on the whole mesh,
at least the rows its SRAM needs.

This is the placement of a generation's decode step: its layers multiply one token's vector by
their resident matrices (MeshGEMV), a time set by the bytes each PE reads, or read a key-value
cache, whose small bytes take many products a byte (every query head of a group reads it):
rows by bytes give a matrix room to lay itself out for MeshGEMV, rows by time keep the caches'
layers from being starved, and the stages come out about balanced without a search; then
rows move one at a time to the slowest layer while that makes it faster. A band as wide as
the mesh also keeps a layer's rows many (a GEMV splits its matrix's rows over them) where the
balanced search keeps a layer of one-row activations as short as its SRAM allows. The bands
stack down the mesh in pipeline order, each against the one that feeds it.
"""

from __future__ import annotations

from math import inf

from cgc.errors import DoesNotFitError
from cgc.machine.movement.layout import Rect
from cgc.passes.place_layers.layers import LayerTimings

MOVES = 4
"""Rows moved at most, per layer, to even the bands' times."""


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


def _time(layers: LayerTimings, index: int, height: int) -> float:
    """Layer ``index``'s stage time on ``height`` rows of the mesh's width (infinite where it
    does not fit)."""
    cost = layers.cost(index, (0, 0, layers.target.cols, height))
    return layers.stage_cycles(cost) if layers.fits(cost) else inf


def _evened(layers: LayerTimings, share: list[int], need: list[int]) -> list[int]:
    """``share`` with rows moved to the slowest layer, the few it takes to be faster (a kernel
    whose layout just misses the SRAM on its rows falls back on a slower one: rows more give
    it room), each from the layer that stays fastest without it, while the slowest gets
    faster."""
    share = list(share)
    times = [_time(layers, i, h) for i, h in enumerate(share)]
    for _ in range(MOVES * layers.count):
        slowest = max(range(layers.count), key=lambda i: times[i])
        faster = (e for e in range(1, MOVES + 1)
                  if _time(layers, slowest, share[slowest] + e) < times[slowest])  # fmt: skip
        extra = next(faster, None)
        if extra is None:
            break
        moved = _donated(layers, share, need, times, slowest, extra)
        if moved is None:
            break
        share, times = moved
    return share


def _donated(
    layers: LayerTimings,
    share: list[int],
    need: list[int],
    times: list[float],
    taker: int,
    rows: int,
) -> tuple[list[int], list[float]] | None:
    """``rows`` rows moved to layer ``taker``, one at a time from the layer that stays fastest
    without one; None if no move leaves every layer faster than ``taker`` was."""
    share, times = list(share), list(times)
    limit = times[taker]
    for _ in range(rows):
        donors = [i for i in range(layers.count) if i != taker and share[i] > need[i]]
        after = {i: _time(layers, i, share[i] - 1) for i in donors}
        donor = min(donors, key=lambda i: (after[i], i), default=None)
        if donor is None or not after[donor] < limit:
            return None
        share[donor] -= 1
        times[donor] = after[donor]
    share[taker] += rows
    times[taker] = _time(layers, taker, share[taker])
    return (share, times) if times[taker] < limit else None


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
    times = [layers.stage_cycles(layers.cost(i, whole)) for i in range(layers.count)]
    kept = [float(layers.resident_bytes(i)) for i in range(layers.count)]
    held = [
        max(t / max(sum(times), 1.0), b / max(sum(kept), 1.0), 1e-9)
        for t, b in zip(times, kept, strict=True)
    ]
    share = [max(n, int(rows * h / sum(held))) for n, h in zip(need, held, strict=True)]
    while sum(share) > rows:  # the rows the floors took, from the layers with most to spare
        spare = max(range(layers.count), key=lambda i: (share[i] - need[i], -i))
        share[spare] -= 1
    left = rows - sum(share)
    for index in sorted(range(layers.count), key=lambda i: (-held[i], i))[:left]:
        share[index] += 1
    share = _evened(layers, share, need)
    out, top = [], 0
    for height in share:
        out.append((0, top, cols, height))
        top += height
    return out
