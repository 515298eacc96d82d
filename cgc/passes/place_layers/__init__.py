"""Places every layer on its own rectangle of PEs: the pipelined execution mode.

All weights stay on the wafer and every layer runs at once on its own rectangle, so the
slowest layer (stage) sets the pipeline's throughput. A layer's tensors spread their matrix
rows over the rectangle's rows, so the balanced widths keep a rectangle no taller than the
most rows any of its tensors has (unless it needs more PEs to hold its weights): a layer of
56-row activations gets 56 rows, not the mesh's 994; the strips below may give it fewer, or
more for a kernel that uses them. The rectangles, in pipeline order, stack into vertical
strips of the mesh (``packing``), top to bottom in one strip and bottom to top in
the next, each strip starting level with the end of the one before, so that a layer's producer
sits against it. Where strips do not fit (a few wide, short layers make their strips wide and
empty), each rectangle goes to the highest free place nearest the one before (a skyline packing).

The widths balance the stages (``balance``): the placement bisects on the stage time, giving
every layer the fewest columns on which it takes no longer (and on which its SRAM holds its
share) and keeping the smallest time whose rectangles still pack onto the mesh, no layer's
busiest input link (the routes sharing it added up, as routed) slower than it. Then it chooses
the heights (``strips``): it bisects again below that time over strips of one width, as many
as fit the mesh, in which every layer takes the fewest rows of its candidate heights that keep
it within the time (its rows split ``k`` ways, or multiplied for a matmul that splits its
contraction over groups of rows), the two ends of a tensor whose lanes fall behind that time
rising one candidate height at a time (more rows are more lanes to the next strip), and takes
those strips if they beat the balanced widths; strips that keep the time of the slowest layer
on the whole width beat any, so when some do the balance does not run and the strips' search
starts from that time. Last, strips of different widths: one width wastes the columns a
layer's tiles leave (a 512-column matmul takes 3 columns a PE on 171 to 255 of them), so a
bisection below the time found so far gives every run of consecutive layers its own strip
width, the runs and widths that take the fewest columns (dynamic programming), among widths
near the strips' and those at which the slowest layer's tiles change. The columns left over
then widen the strips, a layer on its lowest candidate height that keeps the time on
fewer rows gives them up, and a layer keeps only the columns its tensors split across (a
64-column layer in a 250-column strip, 64 of them: the same time, and the placement's share
of PEs placed counts no PE that would hold nothing), where its lanes still keep up
(``placer``).

Timing a layer on a rectangle is the placement's cost (``layers``), so it skips the timings
that cannot change its answer: a kernel sees a rectangle's width only through how its tensors'
columns split across it, so a layer is timed on the fewest columns that split them alike (the
widths between two of its tile widths cost one timing, and a 64-column layer on 250 columns is
timed on 64); no layer computes faster than those columns' PEs at peak, after its host I/O,
which bounds from below the columns or rows that can keep a time; a candidate height on
which a layer missed a time on more columns is not timed on fewer; and the layer that last
missed a time on every candidate height of a width is timed first on the next.

A stage's time is the longer of its kernels and its host I/O (which overlap: the host sends
the next sample while the layer computes), each the machine's answer for the layer's work on
the candidate rectangle (``cgc.machine.timing.cost``), the engine the simulator runs,
so the compiler's estimate is the time a run takes. A model that does not fit raises
``DoesNotFitError`` naming the layers that do not (``fit``).

With ``bands`` the placement is not searched: every layer takes a band of the mesh's full
width, its rows by its share of the bytes kept and of the time (``bands``: a generation's
decode step).

The modules, each standing on those before it: ``packing`` (rectangles onto the mesh),
``layers`` (the layers' heights and timings, and the packing and link checks), ``fit`` (the
layers' narrowest rectangles and the errors), ``balance`` (balanced widths), ``strips`` (the
strips' search), ``placer`` (the steps in order), ``bands`` (the bands); this module holds the
pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntAttr, ModuleOp
from xdsl.passes import ModulePass

from cgc.dialects import wse
from cgc.dialects.ir import main_function, module_sparse_weights, module_target
from cgc.dialects.lowering import layer_works
from cgc.errors import CgcError
from cgc.machine.hardware.target import Target
from cgc.machine.movement.layout import Rect
from cgc.passes.place_layers.bands import bands
from cgc.passes.place_layers.layers import LayerTimings
from cgc.passes.place_layers.placer import Placer


def placement_spec(rects: Mapping[str, Rect]) -> str:
    """``rects`` as ``PlaceLayersPass.rects`` takes them."""
    return ";".join(f"{name}@{','.join(map(str, rect))}" for name, rect in rects.items())


def _given_rects(spec: str, target: Target) -> dict[str, Rect]:
    """The rectangles of ``PlaceLayersPass.rects``, by layer name; a CgcError naming an entry
    that is not ``name@x,y,w,h`` of a rectangle inside the mesh."""
    rects: dict[str, Rect] = {}
    for entry in spec.split(";"):
        name, _, numbers = entry.rpartition("@")
        values = numbers.split(",")
        if not name or len(values) != 4 or not all(v.isdigit() for v in values):
            raise CgcError(f"place-layers: rects: {entry!r} is not name@x,y,w,h")
        x, y, w, h = (int(v) for v in values)
        if w < 1 or h < 1 or x + w > target.cols or y + h > target.rows:
            raise CgcError(
                f"place-layers: rects: {entry!r} is not inside the {target.rows}x{target.cols} mesh"
            )
        rects[name] = (x, y, w, h)
    return rects


@dataclass(frozen=True)
class PlaceLayersPass(ModulePass):
    """Gives every layer a rectangle of PEs (pipelined mode). ``rects``, when given
    (``name@x,y,w,h;...``), are the rectangles another program of the same artifact placed
    its layers on: the layers of those names keep them and nothing is searched, so that
    generation's prompt and decode programs find their weights and key-value caches on the
    same PEs."""

    name = "place-layers"
    rects: str = ""
    bands: bool = False
    """Every layer a band of full-width rows by its share of the bytes kept and of the time
    (``bands``): generation's decode step, whose layers read their resident weights."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        target = module_target(op)
        works = [w for w in layer_works(main_function(op), target.whole) if w.layer is not None]
        if self.rects and self.bands:
            raise CgcError("place-layers: rects and bands are two placements; give one")
        if self.rects:
            given = _given_rects(self.rects, target)
            missing = [w.layer.layer_name.data for w in works
                       if w.layer is not None and w.layer.layer_name.data not in given]  # fmt: skip
            if missing:
                raise CgcError(f"place-layers: no rectangle given for the layers {missing}")
            placed = [given[w.layer.layer_name.data] for w in works if w.layer is not None]
        elif self.bands:
            placed = bands(LayerTimings(works, target, module_sparse_weights(op)))
        else:
            placed = Placer(works, target, module_sparse_weights(op)).place()
        for work, rect in zip(works, placed, strict=True):
            assert work.layer is not None
            x, y, w, h = rect
            work.layer.rect = wse.RectAttr(IntAttr(x), IntAttr(y), IntAttr(w), IntAttr(h))
