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
one ends. When the last gradient has reached MemoryX, it updates the weights layer by layer in
the order the next step streams them, which starts as soon as its first weights are new.

Every system runs the same program on its own samples, and nothing in the timing depends on the
values, so one timeline serves all the systems that run as many micro-batches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from cgc.machine.hardware.target import Target

INGRESS = "MemoryX -> SwarmX"
"""The track of the weight streams."""
EGRESS = "SwarmX -> MemoryX"
"""The track of the gradient streams."""
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

    def stream_seconds(self, nbytes: float) -> float:
        """From the first of ``nbytes`` leaving MemoryX to the last arriving at a system, on
        an idle tree (no bytes: no time)."""
        return self.link_seconds(nbytes) + (self.latency_seconds if nbytes else 0.0)


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
    """Parameters of the trained weights this layer is the first to stream: MemoryX updates
    them, in the order the layers stream them, between one step and the next."""


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
    """MemoryX's update of the trained weights it is the first to stream, once per step."""

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
class StreamingTimeline:
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
    rates = {  # on a tie, the system's own I/O: the published figure
        "weight stream": target.io_bytes_per_s,
        "SwarmX": target.swarmx_link_bytes_per_s,
        "MemoryX": target.memoryx_bytes_per_s,
    }
    return min(rates, key=rates.__getitem__)


class _Clock:
    """The moments the wafer, the ingress link and the egress link are free, and when MemoryX
    has each layer's weights of this step (after the previous step's update)."""

    def __init__(self, start: float, ready: Sequence[float] = ()):
        self.layer_end = self.previous_start = self.ingress_free = start
        self.egress_free = self.egress_end = start
        self.ready = list(ready)
        """Per layer, when its weights are updated for this step (none: already)."""

    @property
    def end(self) -> float:
        """When the wafer has finished and the last gradient has reached MemoryX."""
        return max(self.layer_end, self.egress_end)

    MOMENTS = ("layer_end", "previous_start", "ingress_free", "egress_free", "egress_end")
    """Every moment the next run depends on."""

    @property
    def state(self) -> tuple[float, ...]:
        """The ``MOMENTS``."""
        return tuple(getattr(self, name) for name in self.MOMENTS)

    def advance(self, seconds: Sequence[float]) -> None:
        """Moves each of the ``MOMENTS`` its ``seconds`` later."""
        for name, later in zip(self.MOMENTS, seconds, strict=True):
            setattr(self, name, getattr(self, name) + later)


MOST_CYCLE = 4
"""The longest cycle of runs a timeline looks for: runs may settle into a pattern that repeats
every few runs rather than every run (a layer's weights arriving before or after the wafer
is free, in turn)."""


def _step(
    layers: Sequence[Layer],
    target: Target,
    swarmx: Tree,
    runs: int,
    clock: _Clock,
    track: str,
) -> tuple[list[Span], list[LayerTime]]:
    """``runs`` runs of ``layers`` back to back on ``clock``: their spans, and the figures of
    the first run's layers.

    Every run after the first is the same max-plus map of the moments the next one depends
    on (``_Clock.state``), so once ``k`` runs moved the moments as the ``k`` before them did
    (``_cycle``) every later ``k`` runs move them so too: those runs cost that, exactly, and
    their spans are one span a track that says so; the few runs that do not fill a cycle
    run as the first ones did.
    """
    spans: list[Span] = []
    first: list[LayerTime] = []
    backlog = sum(swarmx.link_seconds(layer.stream_out_bytes) for layer in layers)
    states = [clock.state]
    run = 0
    while run < runs:
        suffix = f" (micro-batch {run + 1})" if runs > 1 else ""
        for index, layer in enumerate(layers):
            ready = clock.ready[index] if run == 0 and clock.ready else 0.0
            figures = _layer(layer, target, swarmx, clock, spans, track, suffix, ready)
            if run == 0:
                first.append(figures)
        states.append(clock.state)
        left = runs - run - 1
        found = _cycle(states, backlog) if left else None
        if found is not None and left >= found[0]:
            k, moved, periods = found
            cycles = left // k
            spans += _repeated(spans, run, k, cycles, periods)
            clock.advance([cycles * m for m in moved])
            run += cycles * k
            states = [clock.state]
        run += 1
    return spans, first


def _cycle(
    states: Sequence[tuple[float, ...]], backlog: float
) -> tuple[int, list[float], dict[str, float]] | None:
    """The shortest cycle of runs, up to ``MOST_CYCLE``, over which the last runs moved the
    moments as every later cycle will (``_periods``, the first run left out: it starts from
    nothing), with what it moves them by and each track's period; None if none yet."""
    for k in range(1, MOST_CYCLE + 1):
        if len(states) < k + 2:
            return None
        moved = [b - a for a, b in zip(states[-1 - k], states[-1], strict=True)]
        periods = _periods(moved, k * backlog)
        if periods is not None:
            return k, moved, periods
    return None


def _periods(moved: Sequence[float], backlog: float) -> dict[str, float] | None:
    """How much later each run moves the spans of the ingress and egress tracks (and of the
    wafer's, under any other name) from a run that moved the ``_Clock.MOMENTS`` by ``moved``
    on, if every later run will; else ``None``.

    The wafer and the ingress link wait on each other: they are steady once a run moves all
    their moments by one period (moving every moment by the same time commutes with a
    max-plus map). Nothing waits on the egress link; it is steady at that period too, or
    at its own busy time per run, ``backlog``, once that is longer: then every gradient
    waits for the one before it, not for its layer, and the more so each run. A moment a
    run does not move is one no layer sets (a link no layer uses); it stays where it is."""
    period = moved[0]
    *wafer, egress, egress_end = moved
    if not all(math.isclose(m, period) or m == 0 for m in wafer):
        return None
    if not math.isclose(egress, egress_end):
        return None
    backlogged = egress > period and math.isclose(egress, backlog)
    if not (egress == 0 or math.isclose(egress, period) or backlogged):
        return None
    return {INGRESS: period, EGRESS: egress if backlogged else period}


def _repeated(
    spans: list[Span], run: int, k: int, cycles: int, periods: dict[str, float]
) -> list[Span]:
    """One span a track for the ``cycles`` cycles of ``k`` runs after ``run`` that repeat the
    spans of the ``k`` runs up to it a period apart (``_periods``)."""
    numbers = range(run - k + 2, run + 2)
    mine = [x for x in spans if any(x.name.endswith(f" (micro-batch {n})") for n in numbers)]
    last = run + 1 + cycles * k
    if k == 1:
        repeats = f"micro-batches {run + 2}-{last}, each as micro-batch {run + 1}"
    else:
        repeats = f"micro-batches {run + 2}-{last}, as micro-batches {numbers[0]}-{run + 1}"
    out = []
    for track in dict.fromkeys(x.track for x in mine):
        on_it = [x for x in mine if x.track == track]
        period = periods.get(track, periods[INGRESS])
        start = min(x.start for x in on_it) + period
        end = max(x.end for x in on_it) + cycles * period
        out.append(Span(track, repeats, start, end))
    return out


def simulate(
    layers: Sequence[Layer],
    target: Target,
    swarmx: Tree,
    runs: int,
    training: bool,
    track: str,
    start: float = 0.0,
) -> StreamingTimeline:
    """``runs`` runs of ``layers`` back to back on one system from ``start``; the system's
    spans go on ``track``.

    A training step ends with MemoryX's update, which needs every gradient of the step (its
    clipping needs their global norm) and runs layer by layer in the order the next step
    streams the weights, so the next step starts as soon as its first layer's weights are
    updated and a layer's weights stream no earlier than they are. The step's time is the
    steady state's: the time from one step's end to the next's, over a step that followed
    another; its spans are that step's, the previous step's update among them.
    """
    clock = _Clock(start)
    spans, first = _step(layers, target, swarmx, runs, clock, track)
    if not training or not first:
        bound = _bound(first, runs, 0.0, target)
        return StreamingTimeline(clock.end, spans, first, 0.0, bound)
    update = sum(f.update_seconds for f in first)
    previous = clock.end
    ready, done = [], previous
    updates: list[Span] = []
    for figures in first:
        if figures.update_seconds:
            updates.append(
                Span("MemoryX", f"{figures.name} update", done, done + figures.update_seconds)
            )
        done += figures.update_seconds
        ready.append(done)
    steady = _Clock(clock.layer_end, ready)
    spans, first = _step(layers, target, swarmx, runs, steady, track)
    shift = clock.layer_end - start
    period = steady.end - previous
    moved = [Span(x.track, x.name, x.start - shift, x.end - shift) for x in updates + spans]
    timed = [replace(f, begin=f.begin - shift, end=f.end - shift) for f in first]
    return StreamingTimeline(period, moved, timed, update, _bound(timed, runs, update, target))


def _layer(
    layer: Layer,
    target: Target,
    swarmx: Tree,
    clock: _Clock,
    spans: list[Span],
    track: str,
    suffix: str,
    ready: float,
) -> LayerTime:
    """Places one layer on the timeline, its weights leaving MemoryX no earlier than
    ``ready``; returns its figures."""
    weights = swarmx.link_seconds(layer.stream_in_bytes)
    gradients = swarmx.link_seconds(layer.stream_out_bytes)
    latency = swarmx.latency_seconds
    arrive = clock.layer_end
    if layer.stream_in_bytes:
        send = max(clock.ingress_free, clock.previous_start, ready)
        clock.ingress_free = send + weights
        arrive = clock.ingress_free + latency
        spans.append(Span(INGRESS, f"{layer.name} weights{suffix}", send, arrive))
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
        spans.append(Span(EGRESS, f"{layer.name} gradients{suffix}", send, clock.egress_end))
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
    weights = sum(f.weight_stream_seconds for f in layers)
    gradients = sum(f.gradient_stream_seconds for f in layers)
    latency = runs * sum(f.swarmx_seconds for f in layers)
    parts = {"compute": compute, "SwarmX": latency, "MemoryX": update}
    limit = stream_limit(target)
    if limit == "weight stream" and gradients > weights:
        limit = "gradient stream"
    parts[limit] = parts.get(limit, 0.0) + runs * max(weights, gradients)
    return max(parts, key=parts.__getitem__)
