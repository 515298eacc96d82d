"""Places every layer on its own rectangle of PEs: the pipelined execution mode.

All weights stay on the wafer and every layer runs at once on its own rectangle. The mesh is
cut into horizontal bands (one band unless there are more layers than columns); the layers,
in pipeline order, get vertical strips of their band side by side, so each layer's producer
sits next to it. A strip is at least as wide as the layer needs to hold its weights and
buffers in every PE's SRAM, and the columns left over go to the layers in proportion to their
share of the work (flops). Costs and SRAM come from the simulator's timing-only run of each
layer on the candidate strip (``cgc.compiler.cost_model``).

A model that does not fit raises ``DoesNotFitError`` naming the shortfall.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, floor, prod

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from cgc import dtypes
from cgc.compiler.bytecode import lower
from cgc.compiler.cost_model import LayerCost, LayerCosts
from cgc.compiler.interpret import main_function
from cgc.compiler.targets import module_target
from cgc.dialects import wse
from cgc.errors import DoesNotFitError
from cgc.runtime.bytecode import Opcode, Program
from cgc.runtime.layout import Rect
from cgc.runtime.machine import Target
from cgc.runtime.report import human_bytes


class Placer:
    """Chooses the strips of one program's layers."""

    def __init__(self, program: Program, target: Target):
        self.program = program
        self.target = target
        self.count = len(program.layers)
        self.cost = LayerCosts(program, target, traffic=False)
        """Layer ``index`` alone on ``rect``: ``cost(index, rect)``; placement needs the
        memory and the flops, not the exact data movement."""

    def fits(self, cost: LayerCost) -> bool:
        """Whether every PE of the layer's rectangle holds its share."""
        return cost.sram_bytes_per_pe <= self.target.sram_bytes_per_pe

    def place(self) -> list[Rect]:
        """The rectangle of every layer, in layer order."""
        t = self.target
        bands = ceil(self.count / t.cols) if self.count else 1
        if bands > t.rows:
            raise DoesNotFitError(
                f"model does not fit on {t.name} in pipelined mode: {self.count} layers need "
                f"at least {self.count} PEs, the mesh has {t.pes}; use --mode weight_streaming"
            )
        per_band = ceil(self.count / bands) if self.count else 0
        height = t.rows // bands
        rects: list[Rect] = []
        for band in range(bands):
            members = list(range(band * per_band, min(self.count, (band + 1) * per_band)))
            rects += self._place_band(members, band * height, height)
        return rects

    def _place_band(self, members: list[int], top: int, height: int) -> list[Rect]:
        width = self.target.cols
        full = {i: self.cost(i, (0, top, width, height)) for i in members}
        narrowest = {i: self._narrowest(i, top, height, full[i]) for i in members}
        if any(w is None for w in narrowest.values()) or sum(narrowest.values()) > width:
            raise self._shortfall(members, narrowest, full, height)
        widths = self._share(members, narrowest, full, width)
        rects, x = [], 0
        for i in members:
            rects.append((x, top, widths[i], height))
            x += widths[i]
        return rects

    def _narrowest(self, index: int, top: int, height: int, full: LayerCost) -> int | None:
        """The fewest columns (of the band's height) on which the layer fits, if any.

        The search gallops up from the columns its weights and largest tensor alone need,
        then bisects: most layers fit close to that bound, and narrow candidates are the
        cheap ones to time.
        """
        if not self.fits(full):
            return None
        hi = self.target.cols
        least = ceil(self._least_bytes(index) / (height * self.target.sram_bytes_per_pe))
        lo = probe = min(max(least, 1), hi)
        while probe < hi and not self.fits(self.cost(index, (0, top, probe, height))):
            lo, probe = probe + 1, min(hi, 2 * probe)
        hi = probe
        while lo < hi:
            mid = (lo + hi) // 2
            if self.fits(self.cost(index, (0, top, mid, height))):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _least_bytes(self, index: int) -> int:
        """A lower bound of the SRAM layer ``index`` needs on any rectangle: its weights and
        its largest tensor (without padding)."""
        program = self.program
        weights, largest = 0, 0
        for position in program.layer_spans[index]:
            ins = program.instructions[position]
            for register in ins.results:
                shape, dtype = program.registers[register]
                size = prod(shape) * dtypes.dtype(dtype).itemsize
                if ins.opcode in (Opcode.WEIGHT, Opcode.CONSTANT):
                    weights += size
                else:
                    largest = max(largest, size)
        return weights + largest

    @staticmethod
    def _share(members, narrowest, full, width) -> dict[int, int]:
        """Columns per layer: at least its narrowest, the rest in proportion to its flops."""
        work = {i: max(full[i].flops, 1.0) for i in members}
        total = sum(work.values())
        widths = {i: max(narrowest[i], floor(width * work[i] / total)) for i in members}
        while sum(widths.values()) > width:
            shrinkable = [i for i in members if widths[i] > narrowest[i]]
            largest = max(shrinkable, key=lambda i: (widths[i] - narrowest[i], -i))
            widths[largest] -= 1
        spare = width - sum(widths.values())
        for i in sorted(members, key=lambda i: (-work[i], i))[:spare]:
            widths[i] += 1
        return widths

    def _shortfall(self, members, narrowest, full, height) -> DoesNotFitError:
        t = self.target
        per_pe = t.sram_bytes_per_pe
        stuck = sorted(
            (i for i in members if narrowest[i] is None),
            key=lambda i: (-full[i].sram_bytes_per_pe, i),
        )
        if len(stuck) == 1:
            (worst,) = stuck
            detail = (
                f"layer '{self.program.layers[worst].name}' needs "
                f"{human_bytes(full[worst].sram_bytes_per_pe)} per PE even on all "
                f"{t.cols}x{height} PEs of its band, {human_bytes(per_pe)} available"
            )
        elif stuck:
            named = ", ".join(
                f"'{self.program.layers[i].name}' {human_bytes(full[i].sram_bytes_per_pe)}"
                for i in stuck[:4]
            )
            more = f" and {len(stuck) - 4} more" if len(stuck) > 4 else ""
            detail = (
                f"{len(stuck)} layers need more SRAM per PE than {human_bytes(per_pe)} even on "
                f"all {t.cols}x{height} PEs of their band: {named}{more}"
            )
        else:
            columns = sum(narrowest.values())
            detail = (
                f"its layers need at least {columns} columns of {height} PEs "
                f"({human_bytes(columns * height * per_pe)} of SRAM), the mesh has {t.cols} "
                f"({human_bytes(t.cols * height * per_pe)})"
            )
        return DoesNotFitError(
            f"model does not fit on {t.name} in pipelined mode: {detail}; "
            "use --mode weight_streaming"
        )


@dataclass(frozen=True)
class PlaceLayersPass(ModulePass):
    """Gives every layer a rectangle of PEs (pipelined mode)."""

    name = "place-layers"

    target: str = ""
    """Target name; by default the module's ``wse.target``."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        target = module_target(op, self.target)
        program = lower(op, (0, 0, target.cols, target.rows))
        rects = Placer(program, target).place()
        layers = [o for o in main_function(op).body.block.ops if isinstance(o, wse.LayerOp)]
        for layer, rect in zip(layers, rects, strict=True):
            layer.rect = wse.RectAttr(*rect)
