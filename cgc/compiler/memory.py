"""The weight-streaming memory plan: how a model's activations fit in the wafer's SRAM.

In weight-streaming mode a system keeps on the wafer every activation of its batch that a
later layer still needs (for training, those the backward pass reads), plus the working set
of the layer running. When that exceeds the SRAM the compiler does what a real weight-streaming
compiler does instead of refusing the model:

* it splits the per-system batch into micro-batches, each a run of the program with its weights
  streamed again and its gradients summed in MemoryX (gradient accumulation);
* for a model built of segments (transformer blocks) it may compute each segment's activations
  again for its backward pass (``recompute-activations``), keeping only what crosses the
  segments: the extra forward pass and weight stream buy a far larger micro-batch.

The plan takes, for each choice about recomputing, the largest micro-batch (a divisor of the
per-system batch) predicted to fit, and of those the one whose step the machine's timing
engine finds fastest. For a model of repeated blocks the prediction measures small copies
of it (one and two blocks, micro-batches of one and two samples) and extrapolates: exact for
the SRAM of identical blocks. Each choice's plan is then compiled whole and checked exactly
(should it not fit, it takes the next smaller micro-batch that does, keeping its choice about
recomputing), and the whole programs' timing picks between them: the copies predict the time
only roughly (the edges of a copy of one or two blocks weigh more than in the whole). What
does not fit even one sample at a time is an error naming the layer and the bytes a PE would
need.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from cgc.errors import CgcError, OptionError
from cgc.machine.hardware.target import Target
from cgc.machine.hardware.units import human_bytes
from cgc.machine.timing import streaming
from cgc.machine.timing.cost import LayerSram, Peak, Profile

Build = Callable[[int, bool, int | None], Profile]
"""``build(micro_batch, recompute, blocks)``: the SRAM profile (``cgc.machine.profile``) of the
model's program at a micro-batch of that many samples per system, recomputing segment
activations or not, with that many blocks (None: all of them)."""


@dataclass(frozen=True)
class MemoryPlan:
    """How a weight-streaming program fits the wafer."""

    micro_batch: int
    """Samples per run of the program on one system."""
    micro_batches: int
    """Runs per training step (or per batch) on one system."""
    recompute: bool
    """Whether segment activations are computed again for the backward pass."""
    peak_bytes_per_pe: int
    reason: str
    """Why, for people (empty when the whole batch fits as it is)."""

    def to_json(self) -> dict[str, int | bool | str]:
        """The manifest's ``memory_plan``."""
        return {
            "micro_batch": self.micro_batch,
            "micro_batches": self.micro_batches,
            "recompute": self.recompute,
            "peak_sram_bytes_per_pe": self.peak_bytes_per_pe,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Measure:
    """A program's SRAM (peak, and per layer) and the time of its runs on one system."""

    peak: Peak
    layers: list[LayerSram]
    seconds: float


def measure(found: Profile, target: Target, runs: int) -> Measure:
    """A program's SRAM in the steady state of its runs (its profile) and the time of ``runs``
    runs back to back on one system (the weight-streaming timeline, without the optimizer's
    update, which every plan shares)."""
    layers = [
        streaming.Layer(
            r.name, r.cycles, r.host_in_bytes, r.host_out_bytes, r.stream_in_bytes,
            r.stream_out_bytes,
        )
        for r in found.records
    ]  # fmt: skip
    timeline = streaming.simulate(layers, target, streaming.Tree(1, target), runs, False, "")
    return Measure(found.peak, found.layers, timeline.seconds)


def extrapolated(one: Measure, two: Measure, blocks: int, segments: re.Pattern[str]) -> float:
    """The peak SRAM of a model of ``blocks`` identical blocks, measured with one and two.

    Each block leaves its activations for the backward pass to the layers after it (those of
    the first block's segment excepted), so a copy of two blocks shows every layer of the
    whole model, the layers between the first block's forward and backward layers holding one
    block where the whole holds ``blocks - 1``. A block's share is what the layers outside
    every block (the head, between the forward and the backward pass) hold in the copy of two
    beyond the copy of one.
    """
    if blocks == 1:
        return float(one.peak.bytes_per_pe)
    names = [layer.name for layer in two.layers]
    first = next((m.group(0) for n in names if (m := segments.match(n))), None)
    if first is None:
        return float(two.peak.bytes_per_pe)
    own = [n.startswith(first) for n in names]
    forward_end = own.index(False)
    back = own.index(True, forward_end) if True in own[forward_end:] else len(names)
    held = {x.name: x.held for x in one.layers if not segments.match(x.name)}
    shared = [x.held - held[x.name] for x in two.layers if x.name in held]
    growth = max(shared, default=0)
    inner = [x.peak for x in two.layers[forward_end:back]]
    outer = [x.peak for x in two.layers[:forward_end] + two.layers[back:]]
    return float(max(max(outer, default=0), max(inner, default=0) + (blocks - 2) * growth))


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, largest first."""
    # pairs (d, n // d) with d up to the square root: O(sqrt n) steps, so that a batch of
    # millions of sequences costs milliseconds
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    large = [n // d for d in small if d * d != n]
    return large + small[::-1]


class Planner:
    """Finds the memory plan of one model (see the module's doc)."""

    def __init__(
        self,
        build: Build,
        target: Target,
        per_system_batch: int,
        blocks: int | None,
        recompute_choices: tuple[bool, ...],
        micro_batch: int | None,
        segments: str | None = None,
    ):
        self.build = build
        self.target = target
        self.batch = per_system_batch
        self.blocks = blocks
        """The model's repeated blocks, if it can be built with fewer (then the search
        measures small copies); None: every trial compiles the whole model."""
        self.choices = recompute_choices
        self.segments = re.compile(segments or "(?!)")
        """Where the blocks' names begin (a pattern that matches nothing for a model without
        blocks)."""
        self.forced = micro_batch
        self.probes: dict[tuple[int, bool, int], Measure] = {}
        if micro_batch is not None and (micro_batch < 1 or per_system_batch % micro_batch):
            raise OptionError(
                f"micro_batch_size {micro_batch} does not divide the per-system batch "
                f"{per_system_batch}",
                "micro_batch_size",
            )

    @property
    def capacity(self) -> int:
        return self.target.sram_bytes_per_pe

    def candidates(self) -> list[int]:
        """Micro-batch sizes to consider, largest first."""
        return [self.forced] if self.forced is not None else divisors(self.batch)

    def plan(self) -> MemoryPlan:
        """The plan, checked to fit on the whole program compiled by it."""
        if self.blocks is None:
            return self._first_fitting()
        estimates = [e for e in (self._estimate(choice) for choice in self.choices) if e]
        if not estimates:
            return self._refuse(min(self.candidates()))
        if len(estimates) == 1:
            return self._settle(estimates[0][1], estimates[0][2])
        # the copies predict each choice's time only roughly: the whole programs decide
        plans = [self._settle(micro_batch, recompute) for _, micro_batch, recompute in estimates]
        return min(plans, key=self._seconds)

    def _seconds(self, plan: MemoryPlan) -> float:
        """The time of a plan's runs, its whole program timed."""
        found = self.build(plan.micro_batch, plan.recompute, None)
        return measure(found, self.target, plan.micro_batches).seconds

    def _first_fitting(self) -> MemoryPlan:
        """Whole-program trials, for each choice in order until one fits."""
        for choice in self.choices[:-1]:
            try:
                return self._search_whole(choice)
            except CgcError:
                continue
        return self._search_whole(self.choices[-1])

    def _peak(self, micro_batch: int, recompute: bool) -> Peak:
        """The whole program's peak SRAM."""
        return self.build(micro_batch, recompute, None).peak

    def _settle(self, micro_batch: int, recompute: bool) -> MemoryPlan:
        """The whole program at ``micro_batch`` (or the next smaller size that fits)."""
        for size in [m for m in self.candidates() if m <= micro_batch]:
            peak = self._peak(size, recompute)
            if peak.bytes_per_pe <= self.capacity:
                return self._plan(size, recompute, peak)
        return self._refuse(min(self.candidates()), recompute)

    def _search_whole(self, recompute: bool) -> MemoryPlan:
        """Without small copies to measure: the whole program at the full batch, else at one
        sample and then the size the two suggest, stepping down while it does not fit."""
        sizes = self.candidates()
        peak = self._peak(sizes[0], recompute)
        if peak.bytes_per_pe <= self.capacity:
            return self._plan(sizes[0], recompute, peak)
        if len(sizes) == 1:
            return self._refuse(sizes[0], recompute, peak)
        smallest = self._peak(1, recompute)
        if smallest.bytes_per_pe > self.capacity:
            return self._refuse(1, recompute, smallest)
        slope = (peak.bytes_per_pe - smallest.bytes_per_pe) / (sizes[0] - 1)
        room = (self.capacity - smallest.bytes_per_pe) / slope if slope > 0 else len(sizes)
        guess = next(m for m in sizes if m - 1 <= room)
        return self._settle(guess, recompute)

    def _probe(self, micro_batch: int, recompute: bool, blocks: int) -> Measure:
        key = (micro_batch, recompute, blocks)
        if key not in self.probes:
            found = self.build(micro_batch, recompute, blocks)
            self.probes[key] = measure(found, self.target, self.batch // micro_batch)
        return self.probes[key]

    def _estimate(self, recompute: bool) -> tuple[float, int, bool] | None:
        """The step time, micro-batch and choice that the small copies predict for
        ``recompute``; None if not even one sample fits."""
        assert self.blocks is not None
        full = self.blocks

        def whole(micro_batch: int) -> float:
            """The whole model's SRAM per PE at a micro-batch (``extrapolated``)."""
            one, two = (self._probe(micro_batch, recompute, b) for b in (1, min(2, full)))
            return extrapolated(one, two, full, self.segments)

        def at(micro_batch: int) -> float:
            """Linear in the micro-batch, from one and two samples."""
            single = whole(1)
            return single if self.batch == 1 else single + (micro_batch - 1) * (whole(2) - single)

        fitting = [m for m in self.candidates() if at(m) <= self.capacity]
        if not fitting:
            return None
        chosen = fitting[0]
        first = self._probe(chosen, recompute, 1).seconds
        second = self._probe(chosen, recompute, min(2, full)).seconds
        seconds = first + (full - 1) * (second - first) if full > 1 else first
        return seconds, chosen, recompute

    def _plan(self, micro_batch: int, recompute: bool, peak: Peak) -> MemoryPlan:
        runs = self.batch // micro_batch
        parts = []
        if runs > 1:
            why = (
                "as --micro-batch-size asks"
                if self.forced is not None
                else f"a batch of {self.batch} does not fit the SRAM at once"
            )
            parts.append(f"{runs} micro-batches of {micro_batch} per system: {why}")
        if recompute:
            chosen = " (--recompute)" if self.choices == (True,) else ""
            parts.append(f"activations recomputed per segment for the backward pass{chosen}")
        return MemoryPlan(micro_batch, runs, recompute, peak.bytes_per_pe, "; ".join(parts))

    def _refuse(
        self, micro_batch: int, recompute: bool | None = None, peak: Peak | None = None
    ) -> MemoryPlan:
        """The error for a model that does not fit even ``micro_batch`` samples at a time."""
        choice = self.choices[-1] if recompute is None else recompute
        if peak is None:
            peak = self._peak(micro_batch, choice)
        how = " with activations recomputed per segment" if choice else ""
        raise CgcError(
            f"the model does not fit the SRAM of {self.target.name} even {micro_batch} "
            f"sample{'s' if micro_batch > 1 else ''} at a time{how}: layer '{peak.layer}' "
            f"needs {peak.bytes_per_pe} bytes ({human_bytes(peak.bytes_per_pe)}) of SRAM per "
            f"PE, a PE has {self.capacity} ({human_bytes(self.capacity)})"
        )
