"""Routes every tensor that flows between placed layers: a path on the mesh and a color.

A tensor crosses from its producer's rectangle to its consumer's on parallel lanes, each routed
dimension-ordered (along the row, then down the column) and carrying an equal share of the
tensor's wavelets. Where the two rectangles share rows (or columns) the lanes run straight
across, one per shared row (or column); diagonal neighbours get lanes that share no link (see
``lane_ends``).

The link loads of all routes add up: a link moves one wavelet per cycle, so a route's busiest
link bounds how fast its consumer can take a batch (the pipeline's timing counts it). Colors
are given greedily in program order: a route takes the lowest color that no route already
crossing one of its links has, so no link carries two routes of one color, and no more routes
than the target has colors. The layer graph (which layer feeds which) is a networkx graph.

The pass sets ``routes`` on every layer that reads tensors of other layers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, IntAttr, ModuleOp, StringAttr
from xdsl.passes import ModulePass

from cgc.dialects import wse
from cgc.dialects.ir import main_function, module_target
from cgc.dialects.lowering import layer_graph, layer_works, tensor_edges
from cgc.errors import CgcError, DoesNotFitError
from cgc.machine.hardware.target import Target
from cgc.machine.movement.layout import Rect
from cgc.machine.movement.traffic import Routes, busiest_links, lane_ends, overlap


@dataclass
class PlannedRoute:
    """One tensor's route while routing."""

    source: int
    consumer: int
    lanes: int
    wavelets: int
    hops: int
    path: list[int]
    box: tuple[int, int]
    """Row and column of the top-left of the route's box on the link maps."""
    loads: np.ndarray
    """Wavelets per link of the box, ``[direction, row, col]`` (see ``Routes.link_loads``)."""
    color: int = -1
    busiest: int = 0

    def view(self, maps: np.ndarray) -> np.ndarray:
        """The part of a ``[direction, row, col]`` link map under the route's box."""
        row0, col0 = self.box
        _, rows, cols = self.loads.shape
        return maps[:, row0 : row0 + rows, col0 : col0 + cols]


def plan_route(rects: Sequence[Rect], producer: int, consumer: int, wavelets: int) -> PlannedRoute:
    """The lanes of one tensor from its producer's rectangle to its consumer's, and the
    wavelets they put on every link of their box."""
    src_r, src_c, dst_r, dst_c = lane_ends(rects[producer], rects[consumer])
    row0, col0 = int(min(src_r.min(), dst_r.min())), int(min(src_c.min(), dst_c.min()))
    rows = int(max(src_r.max(), dst_r.max())) - row0 + 1
    cols = int(max(src_c.max(), dst_c.max())) - col0 + 1
    lanes = Routes(row0, col0, rows, cols)
    lanes.add(src_r, src_c, dst_r, dst_c, wavelets / len(src_r))
    points = [
        (int(src_c[0]), int(src_r[0])),
        (int(dst_c[0]), int(src_r[0])),
        (int(dst_c[0]), int(dst_r[0])),
    ]
    path = [v for i, p in enumerate(points) if i == 0 or p != points[i - 1] for v in p]
    return PlannedRoute(
        producer, consumer, len(src_r), wavelets, lanes.max_hops, path, (row0, col0),
        lanes.link_loads(),
    )  # fmt: skip


class Router:
    """Routes the tensors between a module's placed layers."""

    def __init__(self, names: Sequence[str], rects: Sequence[Rect], graph: nx.MultiDiGraph,
                 target: Target):  # fmt: skip
        self.names = names
        self.rects = rects
        self.graph = graph
        """Which layer feeds which (``cgc.dialects.lowering.layer_graph``)."""
        self.target = target
        shape = (len(Routes.DIRECTIONS), target.rows + 1, target.cols + 1)
        self.colors = np.zeros(shape, dtype=np.int64)
        """Per link, a bit per color in use."""

    def route(self) -> list[list[PlannedRoute]]:
        """The routes into every layer, in the order of its inputs."""
        edges = tensor_edges(self.graph)
        routes: list[list[PlannedRoute]] = [[] for _ in self.names]
        for edge, busiest in zip(edges, busiest_links(self.rects, edges), strict=True):
            route = plan_route(self.rects, *edge)
            route.busiest = int(busiest)
            routes[route.consumer].append(route)
        for into in routes:
            for route in into:
                self._color(route)
        return routes

    def _color(self, route: PlannedRoute) -> None:
        """The lowest color free on all the route's links."""
        used_links = route.loads > 0
        taken = route.view(self.colors)
        in_use = int(np.bitwise_or.reduce(taken[used_links], initial=0))
        free = [c for c in range(self.target.colors) if not in_use >> c & 1]
        if not free:
            raise DoesNotFitError(
                f"model does not fit on {self.target.name} in pipelined mode: the tensor from "
                f"layer '{self.names[route.source]}' to layer '{self.names[route.consumer]}' "
                f"crosses links that already carry routes on all {self.target.colors} colors; "
                "use --mode weight_streaming"
            )
        route.color = free[0]
        taken[used_links] |= 1 << route.color


def route_attr(route: PlannedRoute, source: str) -> wse.RouteAttr:
    """The IR attribute of a planned route from layer ``source``."""
    return wse.RouteAttr(
        StringAttr(source),
        IntAttr(route.color),
        IntAttr(route.lanes),
        IntAttr(route.wavelets),
        IntAttr(route.busiest),
        IntAttr(route.hops),
        ArrayAttr(IntAttr(v) for v in route.path),
    )


@dataclass(frozen=True)
class RouteTensorsPass(ModulePass):
    """Gives every tensor between placed layers a route and a color (pipelined mode)."""

    name = "route-tensors"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        target = module_target(op)
        layers = [o for o in main_function(op).body.block.ops if isinstance(o, wse.LayerOp)]
        rects: list[tuple[str, Rect]] = []
        for layer in layers:
            name = layer.layer_name.data
            if layer.rect is None:
                raise CgcError(f"layer '{name}' has no rectangle; run place-layers first")
            x, y, w, h = layer.rect.as_tuple()
            if x + w > target.cols or y + h > target.rows:
                raise CgcError(
                    f"layer '{name}' lies outside the {target.rows}x{target.cols} mesh of "
                    f"{target.name}"
                )
            rects.append((name, (x, y, w, h)))
        for (name, a), (other, b) in itertools.combinations(rects, 2):
            if overlap(a, b):
                raise CgcError(f"layers '{name}' and '{other}' overlap on the mesh")
        works = [w for w in layer_works(main_function(op), target.whole) if w.layer is not None]
        names = [name for name, _ in rects]
        router = Router(names, [rect for _, rect in rects], layer_graph(works), target)
        for layer, planned in zip(layers, router.route(), strict=True):
            if planned:
                layer.routes = ArrayAttr(route_attr(r, names[r.source]) for r in planned)
            elif layer.routes is not None:
                del layer.properties["routes"]
