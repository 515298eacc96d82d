"""Pictures of a pipelined placement: ``cgc inspect ARTIFACT --placement FILE.png | -``.

The mesh with every layer's rectangle, labelled and shaded by the stage's utilization (its
FLOPs per sample over what its PEs could do while the slowest stage takes one sample), and
every route between layers (its first lane's path, in a hue per color). ``ascii_map`` draws
the same in text for a terminal; ``save_png`` with matplotlib (imported only then).
"""

from __future__ import annotations

import io
import os
import string
from dataclasses import dataclass

import numpy as np

from cgc.files import write_atomically
from cgc.machine.hardware.target import Target
from cgc.machine.program.artifact import Artifact
from cgc.machine.program.mode import Mode
from cgc.machine.timing.pipeline import pipeline_stages, simulate

LABELS = string.ascii_uppercase + string.ascii_lowercase + string.digits
"""One character per layer in the text map (layers beyond these share ``*``)."""


@dataclass(frozen=True)
class PlacedLayer:
    """One layer of a pipelined placement."""

    name: str
    region: tuple[int, int, int, int]
    """``(x, y, w, h)``: the column and row of the top-left PE, columns and rows."""
    utilization: float
    """FLOPs per sample over the peak of the stage's PEs during one slowest-stage period."""


def stages(artifact: Artifact) -> list[PlacedLayer]:
    """The layers of a pipelined artifact with their regions and utilizations."""
    m = artifact.manifest
    if m["mode"] != Mode.PIPELINED:
        raise ValueError("only a pipelined artifact places its layers on their own regions")
    target = Target.from_json(m["target"])
    batch = m["micro_batch"] or 1
    timeline = simulate(pipeline_stages(artifact), target, 1, batch)
    period = timeline.period_seconds * target.clock_hz
    peak = target.peak_flops_per_pe_per_cycle()
    result = []
    for layer in m["layers"]:
        x, y, w, h = layer["rect"]
        capacity = w * h * peak * period
        used = layer["flops"] / batch
        result.append(
            PlacedLayer(layer["name"], (x, y, w, h), used / capacity if capacity else 0.0)
        )
    return result


def ascii_map(artifact: Artifact, columns: int = 72, rows: int = 24) -> str:
    """The part of the mesh in use (from the top-left corner to the farthest placed PE)
    scaled to at most ``columns`` x ``rows`` characters, each cell showing the label of the
    layer that covers most of it ('.' for idle PEs), then a legend."""
    target = Target.from_json(artifact.manifest["target"])
    placed = stages(artifact)
    width = max((x + w for x, _, w, _ in (s.region for s in placed)), default=target.cols)
    height = max((y + h for _, y, _, h in (s.region for s in placed)), default=target.rows)
    cols, lines = min(columns, width), min(rows, height)
    regions = np.array([s.region for s in placed]).reshape(-1, 4)
    across = _coverage(regions[:, 0], regions[:, 2], width, cols)
    down = _coverage(regions[:, 1], regions[:, 3], height, lines)
    covered = down[:, :, None] * across[:, None, :]  # [layer, line, column]
    owner = covered.argmax(axis=0) if len(placed) else np.zeros((lines, cols), dtype=int)
    idle = covered.max(axis=0, initial=0.0) == 0
    grid = [
        "".join("." if idle[r, c] else _label(int(owner[r, c])) for c in range(cols))
        for r in range(lines)
    ]
    scale = f"{width / cols:.3g} x {height / lines:.3g} PEs per character"
    shown = ""
    if (width, height) != (target.cols, target.rows):
        shown = f"; rows 0-{height - 1}, columns 0-{width - 1} in use"
    text = [f"{target.name}: {target.rows} x {target.cols} PEs{shown} ({scale})", *grid]
    text.append("layers:")
    for index, stage in enumerate(placed):
        x, y, w, h = stage.region
        where = f"({x}, {y}) {w}x{h}"
        text.append(f"  {_label(index)} {stage.name}: {where}, utilization {stage.utilization:.1%}")
    routes = ", ".join(
        f"{placed[r.source].name} -> {placed[i].name} (color {r.color}, {r.lanes} lanes)"
        for i, info in enumerate(artifact.program.layers)
        for r in info.routes
    )
    text.append(f"routes: {routes or 'none'}")
    return "\n".join(text) + "\n"


def _label(index: int) -> str:
    return LABELS[index] if index < len(LABELS) else "*"


def _coverage(start: np.ndarray, size: np.ndarray, extent: int, cells: int) -> np.ndarray:
    """``[layer, cell]``: how many PEs of each span ``[start, start + size)`` fall in each of
    ``cells`` equal character cells over ``extent`` PEs."""
    edges = np.arange(cells + 1) * extent / cells
    low = np.maximum(start[:, None], edges[None, :-1])
    high = np.minimum((start + size)[:, None], edges[None, 1:])
    return np.clip(high - low, 0.0, None)


def save_png(artifact: Artifact, path: str | os.PathLike) -> None:
    """Draws the placement into a PNG file at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    target = Target.from_json(artifact.manifest["target"])
    placed = stages(artifact)
    figure, axes = plt.subplots(figsize=(8, 8 * target.rows / max(target.cols, 1) + 1))
    axes.add_patch(Rectangle((0, 0), target.cols, target.rows, facecolor="#f4f4f4"))
    colors = matplotlib.colormaps["viridis"]
    for stage in placed:
        x, y, w, h = stage.region
        axes.add_patch(
            Rectangle((x, y), w, h, facecolor=colors(min(stage.utilization, 1.0)), edgecolor="k")
        )
        axes.text(x + w / 2, y + h / 2, f"{stage.name} {stage.utilization:.0%}",
                  rotation=90 if h > w else 0, ha="center", va="center", fontsize=7,
                  color="w")  # fmt: skip
    palette = matplotlib.colormaps["tab20"]
    for info in artifact.program.layers:
        for route in info.routes:
            # the first lane's path, through the middle of its PEs, colored by its color
            xs = [v + 0.5 for v in route.path[0::2]]
            ys = [v + 0.5 for v in route.path[1::2]]
            axes.plot(xs, ys, color=palette(route.color % 20), linewidth=1.2)
            axes.add_patch(
                FancyArrowPatch((xs[-2], ys[-2]), (xs[-1], ys[-1]), arrowstyle="->",
                                mutation_scale=10, color=palette(route.color % 20))
            )  # fmt: skip
    axes.set_xlim(0, target.cols)
    axes.set_ylim(target.rows, 0)  # row 0 at the top, as on the wafer
    axes.set_aspect("equal")
    axes.set_xlabel("column")
    axes.set_ylabel("row")
    axes.set_title(f"{artifact.manifest['source']} on {target.name} (shade: utilization)")
    figure.colorbar(plt.cm.ScalarMappable(cmap=colors), ax=axes, label="utilization")
    image = io.BytesIO()
    # no software version in the file: the same artifact gives the same bytes
    figure.savefig(image, format="png", dpi=120, bbox_inches="tight", metadata={"Software": None})
    plt.close(figure)
    write_atomically(path, image.getvalue())
