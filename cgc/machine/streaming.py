"""The weight-streaming mode's timing: one system's layers, their weight and gradient streams
through the SwarmX tree, and MemoryX's update at the end of a training step.

The SwarmX tree (``Tree``): nodes of ``swarmx_fanout`` children between MemoryX and the K
systems, depth ``ceil(log_fanout K)``; a stream runs at the slowest rate on its path (MemoryX's,
a tree link's, the system's I/O), weights broadcast down and gradients summed up at line rate,
and arrives ``depth + 1`` hops after it leaves.

Layers run one after another on the whole wafer. MemoryX sends a layer's weights down the
SwarmX tree while the layer before it computes (one layer of look-ahead buffer: a layer's
weights leave no earlier than the previous layer starts), and a layer ends no earlier than its
weights have arrived, the tree's latency after they left. Every stream runs at the slowest
rate on its path: MemoryX's, a SwarmX link's or the system's I/O. Gradients leave on the
egress link as their layer finishes, summed at line rate on their way up the tree. A step of
several micro-batches runs them back to back: the weights of one stream while the previous
one ends. The step closes when the last gradient has reached MemoryX and MemoryX has updated
the weights.

Every system runs the same program on its own samples, and nothing in the timing depends on the
values, so one timeline serves all the systems that run as many micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cgc.machine.target import Target

BOUNDS = ("compute", "weight stream", "gradient stream", "SwarmX", "MemoryX")
"""What can bound a layer or a step."""


@dataclass(frozen=True)
class Span:
    """One interval on a timeline track, in seconds."""

    track: str
    name: str
    start: float
    end: float


def tree_depth(systems: int, fanout: int) -> int:
    """Levels of broadcast-reduce nodes between MemoryX and ``systems`` leaves."""
    depth, reach = 0, 1
    while reach < systems:
        reach *= fanout
        depth += 1
    return depth


class Tree:
    """The SwarmX tree between MemoryX and ``systems`` systems of ``target``: what a stream
    through it costs."""

    def __init__(self, systems: int, target: Target):
        self.systems = systems
        self.fanout = target.swarmx_fanout
        self.target = target
        self.depth = tree_depth(systems, self.fanout)

    def link_seconds(self, nbytes: float) -> float:
        """How long ``nbytes`` occupy the path between MemoryX and a system: the stream runs at
        the slowest of MemoryX, the tree links and the system's ingress."""
        t = self.target
        return nbytes / min(t.memoryx_bytes_per_s, t.swarmx_link_bytes_per_s, t.io_bytes_per_s)

    @property
    def latency_seconds(self) -> float:
        """Time of flight through every level of the tree."""
        return (self.depth + 1) * self.target.swarmx_hop_seconds


@dataclass(frozen=True)
class Layer:
    """One layer of a program as the timeline sees it, for one run of the program."""

    name: str
    cycles: float
    """Its kernels, compute and the data movement on the wafer."""
    host_in_bytes: float
    host_out_bytes: float
    stream_in_bytes: float
    """Weights from MemoryX."""
    stream_out_bytes: float
    """Gradients to MemoryX."""
    update_parameters: int = 0
    """Parameters whose last gradient of the step the layer sends: MemoryX's update of them is
    the layer's share of the step's end."""


@dataclass(frozen=True)
class LayerTime:
    """What one layer costs in a run, each part on its own, and what bounds it."""

    name: str
    begin: float
    end: float
    compute_seconds: float
    """Its kernels and its host I/O."""
    weight_stream_seconds: float
    gradient_stream_seconds: float
    swarmx_seconds: float
    """The tree's latency, once for each direction it streams in."""
    update_seconds: float
    """MemoryX's update of the weights whose gradients it sends, once per step."""

    @property
    def bound(self) -> str:
        """The part that takes longest."""
        parts = {
            "compute": self.compute_seconds,
            "weight stream": self.weight_stream_seconds,
            "gradient stream": self.gradient_stream_seconds,
        }
        return max(parts, key=parts.__getitem__)

    def to_json(self) -> dict[str, float | str]:
        """The figures, for ``--stats-json``."""
        return {
            "name": self.name,
            "begin_seconds": self.begin,
            "end_seconds": self.end,
            "compute_seconds": self.compute_seconds,
            "weight_stream_seconds": self.weight_stream_seconds,
            "gradient_stream_seconds": self.gradient_stream_seconds,
            "swarmx_seconds": self.swarmx_seconds,
            "memoryx_update_seconds": self.update_seconds,
            "bound": self.bound,
        }


@dataclass(frozen=True)
class Timeline:
    """One system's runs of the program (and, for training, the step's update)."""

    seconds: float
    spans: list[Span]
    layers: list[LayerTime]
    """The layers of the first run."""
    update_seconds: float
    bound: str
    """What bounds the whole: the part of ``BOUNDS`` that alone would take longest."""


def stream_limit(target: Target) -> str:
    """Which of MemoryX, a SwarmX link and the system's I/O sets the rate of a stream."""
    rates = {
        "MemoryX": target.memoryx_bytes_per_s,
        "SwarmX": target.swarmx_link_bytes_per_s,
        "weight stream": target.io_bytes_per_s,
    }
    return min(rates, key=rates.__getitem__)


class _Clock:
    """The moments the wafer, the ingress link and the egress link are free."""

    def __init__(self, start: float):
        self.layer_end = self.previous_start = self.ingress_free = start
        self.egress_free = self.egress_end = start


def simulate(
    layers: Sequence[Layer],
    target: Target,
    swarmx: Tree,
    runs: int,
    training: bool,
    track: str,
    start: float = 0.0,
) -> Timeline:
    """``runs`` runs of ``layers`` back to back on one system from ``start``, then for
    ``training`` MemoryX's update; the system's spans go on ``track``."""
    clock = _Clock(start)
    spans: list[Span] = []
    first: list[LayerTime] = []
    for run in range(runs):
        suffix = f" (micro-batch {run + 1})" if runs > 1 else ""
        for layer in layers:
            figures = _layer(layer, target, swarmx, clock, spans, track, suffix)
            if run == 0:
                first.append(figures)
    end = max(clock.layer_end, clock.egress_end)
    update = sum(f.update_seconds for f in first) if training else 0.0
    if training and first:
        spans.append(Span("MemoryX", "optimizer update", end, end + update))
    bound = _bound(first, runs, update, target)
    return Timeline(end + update, spans, first, update, bound)


def _layer(
    layer: Layer,
    target: Target,
    swarmx: Tree,
    clock: _Clock,
    spans: list[Span],
    track: str,
    suffix: str,
) -> LayerTime:
    """Places one layer on the timeline; returns its figures."""
    weights = swarmx.link_seconds(layer.stream_in_bytes)
    gradients = swarmx.link_seconds(layer.stream_out_bytes)
    latency = swarmx.latency_seconds
    arrive = clock.layer_end
    if layer.stream_in_bytes:
        send = max(clock.ingress_free, clock.previous_start)
        clock.ingress_free = send + weights
        arrive = clock.ingress_free + latency
        spans.append(Span("MemoryX -> SwarmX", f"{layer.name} weights{suffix}", send, arrive))
    host_in = layer.host_in_bytes / target.io_bytes_per_s
    host_out = layer.host_out_bytes / target.io_bytes_per_s
    begin = clock.layer_end + host_in
    clock.layer_end = max(begin + target.seconds(layer.cycles), arrive) + host_out
    spans.append(Span(track, f"{layer.name}{suffix}", begin, clock.layer_end))
    clock.previous_start = begin
    if layer.stream_out_bytes:
        send = max(clock.egress_free, clock.layer_end)
        clock.egress_free = send + gradients
        clock.egress_end = clock.egress_free + latency
        spans.append(
            Span("SwarmX -> MemoryX", f"{layer.name} gradients{suffix}", send, clock.egress_end)
        )
    directions = bool(layer.stream_in_bytes) + bool(layer.stream_out_bytes)
    return LayerTime(
        name=layer.name,
        begin=begin - host_in,
        end=clock.layer_end,
        compute_seconds=target.seconds(layer.cycles) + host_in + host_out,
        weight_stream_seconds=weights,
        gradient_stream_seconds=gradients,
        swarmx_seconds=directions * latency,
        update_seconds=layer.update_parameters / target.memoryx_update_params_per_s,
    )


def _bound(layers: Sequence[LayerTime], runs: int, update: float, target: Target) -> str:
    """What alone would take longest: the compute, the streams (limited by the slowest part
    of their path), the tree's latencies, or MemoryX's update."""
    if not layers:
        return "compute"
    compute = runs * sum(f.compute_seconds for f in layers)
    streams = runs * max(
        sum(f.weight_stream_seconds for f in layers),
        sum(f.gradient_stream_seconds for f in layers),
    )
    latency = runs * sum(f.swarmx_seconds for f in layers)
    parts = {"compute": compute, "SwarmX": latency, "MemoryX": update}
    limit = stream_limit(target)
    parts[limit] = parts.get(limit, 0.0) + streams
    return max(parts, key=parts.__getitem__)
