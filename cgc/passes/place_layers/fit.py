"""Whether the layers fit the mesh at all, and the errors that say why not.

Before any search for a stage time, every layer needs a width on which its SRAM fits
(``narrowest_widths``), and those narrowest rectangles must pack onto the mesh
(``packable_widths``: the widest layers grow taller, then all layers share the rows in
bands). Where they cannot, ``DoesNotFitError`` names the layers that do not fit.
"""

from __future__ import annotations

from cgc.errors import DoesNotFitError
from cgc.machine.hardware.target import Target
from cgc.machine.hardware.units import human_bytes
from cgc.passes.place_layers.layers import LayerTimings


def narrowest_widths(layers: LayerTimings) -> list[int]:
    """Every layer's fewest columns (of its height) on which it fits; raises
    ``DoesNotFitError`` naming the layers that fit on no width."""
    least = [layers.narrowest_width(i) for i in range(layers.count)]
    if any(w is None for w in least):
        raise sram_shortfall_error(layers, [i for i, w in enumerate(least) if w is None])
    return [w for w in least if w is not None]


def packable_widths(layers: LayerTimings, narrowest: list[int]) -> list[int]:
    """Makes the narrowest rectangles pack. First the widest layers grow taller (doubling,
    up to the mesh's rows): a short wide layer makes its whole strip wide. If that is not
    enough, every layer gets an equal share of the rows, in ever more bands, so that more
    layers stack in a strip."""
    rows = layers.target.rows
    while layers.packed(narrowest) is None:
        short = [i for i in range(layers.count) if layers.heights[i] < rows and narrowest[i] > 1]
        if not short:
            return _widths_in_row_bands(layers)
        widest = max(short, key=lambda i: (narrowest[i], -i))
        width = layers.set_height(widest, min(2 * layers.heights[widest], rows))
        assert width is not None  # it fits on fewer rows, so on more
        narrowest[widest] = width
    return narrowest


def _widths_in_row_bands(layers: LayerTimings) -> list[int]:
    """The narrowest widths of the layers when each takes an equal share of the rows, in the
    fewest bands whose rectangles pack; raises ``DoesNotFitError`` if none do."""
    rows = layers.target.rows
    for bands in range(2, rows + 1):
        found = [layers.set_height(i, rows // bands) for i in range(layers.count)]
        widths = [w for w in found if w is not None]
        if len(widths) < layers.count:
            break
        if layers.packed(widths) is not None:
            return widths
    raise too_many_layers_error(layers)


def sram_shortfall_error(layers: LayerTimings, stuck: list[int]) -> DoesNotFitError:
    """The error for layers ``stuck`` that need more SRAM per PE than the whole mesh has."""
    t = layers.target
    full = {i: layers.cost(i, (0, 0, t.cols, t.rows)) for i in stuck}
    stuck = sorted(stuck, key=lambda i: (-full[i].sram_bytes_per_pe, i))
    per_pe = human_bytes(t.sram_bytes_per_pe)
    if len(stuck) == 1:
        (worst,) = stuck
        detail = (
            f"layer '{layers.layer_name(worst)}' needs "
            f"{human_bytes(full[worst].sram_bytes_per_pe)} per PE even on all "
            f"{t.cols}x{t.rows} PEs, {per_pe} available"
        )
    else:
        named = ", ".join(
            f"'{layers.layer_name(i)}' {human_bytes(full[i].sram_bytes_per_pe)}" for i in stuck[:4]
        )
        more = f" and {len(stuck) - 4} more" if len(stuck) > 4 else ""
        detail = (
            f"{len(stuck)} layers need more SRAM per PE than {per_pe} even on all "
            f"{t.cols}x{t.rows} PEs: {named}{more}"
        )
    return _does_not_fit(t, detail)


def too_many_layers_error(layers: LayerTimings) -> DoesNotFitError:
    """The error for layers whose narrowest rectangles, however tall, do not pack."""
    t = layers.target
    columns = sum(layers.set_height(i, t.rows) or t.cols for i in range(layers.count))
    return _does_not_fit(
        t,
        f"its {layers.count} layers, each on its narrowest rectangle, do not pack onto the "
        f"{t.rows}x{t.cols} mesh: as strips of all {t.rows} rows they need {columns} "
        f"columns ({human_bytes(columns * t.rows * t.sram_bytes_per_pe)} of SRAM), the mesh "
        f"has {t.cols} ({human_bytes(t.sram_bytes)})",
    )


def _does_not_fit(target: Target, detail: str) -> DoesNotFitError:
    return DoesNotFitError(
        f"model does not fit on {target.name} in pipelined mode: {detail}; "
        "use --mode weight_streaming"
    )
