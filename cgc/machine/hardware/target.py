"""What a target is: one wafer-scale system's mesh, SRAM, clock and arithmetic, and the
MemoryX and SwarmX around a cluster of them.

A ``Target`` is plain data; the compiler records the whole of it in the IR and the artifact,
so every pass and the runtime simulate exactly the machine a program was compiled for.

The named targets carry the published numbers (``reference/wse-hardware.md``):

* ``wse2``: a CS-2. The largest user rectangle of the SDK (750 x 994 PEs), 48 KiB per PE,
  the SDK's 850 MHz clock, one FP32 FMAC per cycle and four FP16, 24 routable colors, 1.2 Tb/s
  of off-wafer I/O (150 GB/s).
* ``wse3``: a CS-3. About 755 x 1170 PEs, 48 KiB, eight-wide FP16 SIMD, I/O 30 % above the
  CS-2's. Cerebras does not publish its clock; cgc assumes the CS-2's 850 MHz.
* ``meshRxC`` (e.g. ``mesh8x8``): R rows and C columns of WSE-2 PEs, for tests and studies.

The SwarmX model is the published one: a tree of 1:4 broadcast-reduce nodes between MemoryX
and the systems, summing gradients at line rate, each system fed at its 1.2 Tb/s (12 x 100 GbE,
150 GB/s). MemoryX and SwarmX performance is otherwise not published; ``ASSUMED`` lists every
figure that is an assumption, and ``--set FIGURE=VALUE`` (``with_figures``) changes any figure
for a what-if study, within the plausible range ``RANGES`` gives it.

Per-element costs of the vector ops are modelling choices, not published numbers: a PE does one
simple float op per element per SIMD lane per cycle and spends ``TRANSCENDENTAL_CYCLES`` on an
exp, log, tanh, erf, sqrt or divide (a short polynomial or Newton sequence on the FMAC unit).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from cgc.errors import CgcError, OptionError
from cgc.machine.hardware import dtypes

TRANSCENDENTAL_CYCLES = 8
"""Cycles per element for exp, log, tanh, sigmoid, erf, sqrt, reciprocal, divide and pow."""

WAVELET_BYTES = 4
"""A wavelet carries 32 bits of payload; one per link per direction per cycle."""


@dataclass(frozen=True)
class Target:
    """One wafer-scale system and the cluster around it."""

    name: str
    rows: int
    """Mesh rows of PEs available to programs."""
    cols: int
    """Mesh columns of PEs available to programs."""
    sram_bytes_per_pe: int
    clock_hz: float
    fmacs_32bit: int = 1
    """Fused multiply-accumulates per cycle per PE on 32-bit (and wider) values."""
    fmacs_16bit: int = 4
    """FMACs per cycle per PE on 16-bit floats (the SIMD width)."""
    colors: int = 24
    """Routable colors (virtual channels) per link."""
    io_bytes_per_s: float = 150e9
    """Off-wafer ingress (and, separately, egress) bandwidth of one system."""
    memoryx_bytes_per_s: float = 150e9
    """Rate at which MemoryX reads weights out (and takes gradients in)."""
    memoryx_capacity_bytes: int = 4 * 10**12
    memoryx_update_params_per_s: float = 20e9
    """Optimizer throughput of MemoryX in parameters per second."""
    swarmx_fanout: int = 4
    swarmx_link_bytes_per_s: float = 150e9
    swarmx_hop_seconds: float = 1e-6

    @property
    def pes(self) -> int:
        """Number of PEs on the mesh."""
        return self.rows * self.cols

    @property
    def sram_bytes(self) -> int:
        """SRAM on the whole mesh."""
        return self.pes * self.sram_bytes_per_pe

    @property
    def whole(self) -> tuple[int, int, int, int]:
        """The whole mesh as a rectangle ``(x, y, w, h)``."""
        return (0, 0, self.cols, self.rows)

    def fmacs(self, dtype: np.dtype | str) -> int:
        """FMACs (or simple vector ops) per cycle per PE on elements of ``dtype``: 16-bit
        floats get the SIMD width, everything else the 32-bit rate."""
        dt = dtypes.dtype(dtype)
        return self.fmacs_16bit if dtypes.is_float(dt) and dt.itemsize <= 2 else self.fmacs_32bit

    def peak_flops_per_pe_per_cycle(self, dtype: str = "float32") -> int:
        """Two flops per FMAC."""
        return 2 * self.fmacs(dtype)

    def seconds(self, cycles: float) -> float:
        """Wall-clock seconds of ``cycles`` at this target's clock."""
        return cycles / self.clock_hz

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict that ``from_json`` turns back into an equal Target."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Target:
        """Inverse of ``to_json``; a CgcError if ``data`` lacks a figure or has another key
        (``checked`` then checks the figures' values)."""
        names = [f.name for f in fields(cls)]
        missing = [name for name in names if name not in data]
        unknown = [key for key in data if key not in names]
        if missing or unknown:
            problem = f"lacks {missing[0]!r}" if missing else f"has an unknown key {unknown[0]!r}"
            raise CgcError(f"a target {problem}")
        return cls(**data)


KIB = 1024

MAX_SYSTEMS = 4096
"""Most systems in a cluster (``--num-csx``): beyond the largest cluster Cerebras describes
(2048 CS-3s), yet few enough for the simulator to keep some state per system."""
MAX_BATCH = 1 << 40
"""The largest global batch (``--batch-size``) cgc takes: a trillion samples, which a
timing-only step still times in seconds (the memory plan's search grows with the batch's
divisors; at 10^23 it ran for minutes)."""

RANGES: dict[str, tuple[int | float, int | float]] = {
    # a wse2 has 994 x 750; placing and routing keep maps of every link of the mesh (those of
    # traffic.Routes and RouteTensorsPass, about 160 bytes a PE): on 2048 x 2048 PEs a
    # pipelined compile of cerebras-gpt-111m peaks at 0.7 GiB
    "rows": (1, 2048),
    "cols": (1, 2048),
    "sram_bytes_per_pe": (KIB, KIB**3),  # 48 KiB
    "clock_hz": (1e6, 1e11),  # 850 MHz
    "fmacs_32bit": (1, 1024),  # 1
    "fmacs_16bit": (1, 1024),  # 4
    "colors": (1, 63),  # 24; the router keeps a link's colors as the bits of an int64
    "io_bytes_per_s": (1e3, 1e15),  # 150 GB/s
    "memoryx_bytes_per_s": (1e3, 1e15),  # 150 GB/s
    "memoryx_capacity_bytes": (KIB, 10**18),  # 12 TB
    "memoryx_update_params_per_s": (1e3, 1e15),  # 2e10
    "swarmx_fanout": (2, MAX_SYSTEMS),  # 4; a node has 2 children or more
    "swarmx_link_bytes_per_s": (1e3, 1e15),  # 150 GB/s
    "swarmx_hop_seconds": (1e-12, 1.0),  # 1 us
}
"""The plausible values of every figure, both ends included (the comments give a wse2's): far
outside any real machine, yet inside what keeps the simulator's arithmetic finite and its
memory bounded."""

FIGURES: tuple[str, ...] = tuple(f.name for f in fields(Target) if f.name != "name")
"""Every figure of a target, in declaration order."""
_INTEGRAL = {f.name for f in fields(Target) if f.type == "int"}


def checked(target: Target, origins: Mapping[str, str] | None = None) -> Target:
    """``target`` with every figure of its declared kind (an integer count, or a float rate),
    if every figure is a number in its range (``RANGES``); else a CgcError naming the first one
    that is not, after the option that gave it, if ``origins`` (option text by figure) has
    it."""
    if not isinstance(target.name, str) or not target.name:
        raise CgcError("a target needs a name")
    values = {key: _figure(target, key, origins or {}) for key in FIGURES}
    return Target.from_json({"name": target.name, **values})


def _figure(target: Target, key: str, origins: Mapping[str, str]) -> int | float:
    """Figure ``key`` of ``target`` as its declared kind, if it is a number in its range."""
    value = getattr(target, key)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        problem = f"must be a number, got {value!r}"
    else:
        # an int stays one: a huge one does not convert to float
        number = int(value) if isinstance(value, numbers.Integral) else float(value)
        low, high = RANGES[key]
        if isinstance(number, float) and not math.isfinite(number):
            problem = f"must be finite, got {number!r}"
        elif number <= 0:
            problem = f"must be positive, got {number!r}"
        elif key in _INTEGRAL and isinstance(number, float) and not number.is_integer():
            problem = f"must be a whole number, got {number!r}"
        elif not low <= number <= high:
            problem = f"{number!r} is outside its plausible range {low:g}..{high:g}"
        else:
            return int(number) if key in _INTEGRAL else float(number)
    origin = f"{origins[key]}: " if key in origins else ""
    raise CgcError(f"{origin}target '{target.name}': {key} {problem}")


def checked_batch(batch: int, systems: int) -> int:
    """``batch`` if it is a global batch that splits evenly over ``systems`` (1 to
    ``MAX_BATCH`` samples); else an OptionError naming ``batch_size``. Beyond the bound the memory
    plan would search for minutes for a batch no machine runs."""
    if isinstance(batch, bool) or not isinstance(batch, numbers.Integral):
        raise OptionError(f"batch_size must be a whole number, got {batch!r}", "batch_size")
    if batch < 1:
        raise OptionError(f"batch_size must be at least 1, got {batch}", "batch_size")
    if batch > MAX_BATCH:
        raise OptionError(
            f"batch_size must be at most 2^40 ({MAX_BATCH}), got {batch}", "batch_size"
        )
    if batch % systems:
        raise OptionError(
            f"batch_size {batch} does not split evenly over num_csx {systems} systems",
            "batch_size",
            "num_csx",
        )
    return int(batch)


def checked_systems(systems: int) -> int:
    """``systems`` if a cluster can have that many (1 to ``MAX_SYSTEMS``); else a CgcError
    naming ``num_csx``."""
    if isinstance(systems, bool) or not isinstance(systems, numbers.Integral):
        raise OptionError(f"num_csx must be a whole number, got {systems!r}", "num_csx")
    if systems < 1:
        raise OptionError(f"num_csx must be at least 1, got {systems}", "num_csx")
    if systems > MAX_SYSTEMS:
        raise OptionError(f"num_csx must be at most {MAX_SYSTEMS}, got {systems}", "num_csx")
    return int(systems)


ASSUMED: dict[str, str] = {
    "clock_hz": "the SDK's 850 MHz; the shipping clock is not published (design maximum 1.1 GHz)",
    "memoryx_bytes_per_s": "MemoryX streams at a system's I/O rate (it 'can match or exceed' it)",
    "memoryx_update_params_per_s": "MemoryX's optimizer updates 20 billion parameters a second",
    "swarmx_hop_seconds": "a SwarmX node adds 1 us to a stream",
}
"""The figures of the named targets that are not published, and what cgc assumes of them."""


def with_figures(target: Target, assignments: Sequence[str]) -> Target:
    """``target`` with figures changed by ``FIGURE=VALUE`` assignments (``--set``), checked."""
    given: dict[str, int | float] = {}
    origins: dict[str, str] = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        key = key.strip()
        if not sep or key not in FIGURES:
            known = ", ".join(FIGURES)
            raise CgcError(f"--set {assignment}: expected FIGURE=VALUE, FIGURE one of {known}")
        try:
            value = float(text)
        except ValueError:
            raise CgcError(f"--set {assignment}: {text!r} is not a number") from None
        given[key] = int(value) if key in _INTEGRAL and value.is_integer() else value
        origins[key] = f"--set {assignment}"
    return checked(Target.from_json({**target.to_json(), **given}), origins)


def target_from_figures(name: str, given: dict[str, int | float]) -> Target:
    """The target called ``name`` with the figures in ``given`` changed; a name cgc does not
    know needs every figure."""
    unknown = sorted(set(given) - set(FIGURES))
    if unknown:
        raise CgcError(f"target '{name}': no figure {', '.join(unknown)}")
    try:
        base = get_target(name)
    except CgcError:
        missing = [key for key in FIGURES if key not in given]
        if missing:
            raise CgcError(
                f"target '{name}' is not a named target, so it needs every figure; "
                f"missing {', '.join(missing)}"
            ) from None
        return checked(Target.from_json({"name": name, **given}))
    return checked(Target.from_json({**base.to_json(), **given}))


WSE2 = Target(
    name="wse2",
    rows=994,
    cols=750,
    sram_bytes_per_pe=48 * KIB,
    clock_hz=850e6,
    fmacs_32bit=1,
    fmacs_16bit=4,
    colors=24,
    io_bytes_per_s=150e9,
    memoryx_bytes_per_s=150e9,
    memoryx_capacity_bytes=12 * 10**12,
    memoryx_update_params_per_s=20e9,
    swarmx_fanout=4,
    swarmx_link_bytes_per_s=150e9,
    swarmx_hop_seconds=1e-6,
)

WSE3 = replace(
    WSE2,
    name="wse3",
    rows=1170,
    cols=755,
    fmacs_16bit=8,
    io_bytes_per_s=195e9,
    memoryx_bytes_per_s=195e9,
    swarmx_link_bytes_per_s=195e9,
)

TARGETS = {"wse2": WSE2, "wse3": WSE3}
_MESH = re.compile(r"mesh(\d+)x(\d+)")


def get_target(name: str, mesh: tuple[int, int] | None = None) -> Target:
    """The target called ``name``, optionally with its mesh resized to ``(rows, cols)``
    (``--mesh``), checked.

    ``NAME@RxC`` names target NAME with an R x C mesh: the name a resized target carries.
    """
    base, _, size = name.partition("@")
    if size:
        dims = _MESH.fullmatch(f"mesh{size}")
        if dims is None:
            raise CgcError(f"bad mesh size '{size}' in target '{name}'; expected ROWSxCOLS")
        return get_target(base, mesh or (int(dims[1]), int(dims[2])))
    if name in TARGETS:
        target = TARGETS[name]
    elif match := _MESH.fullmatch(name):
        rows, cols = int(match[1]), int(match[2])
        target = replace(WSE2, name=name, rows=rows, cols=cols)
    else:
        known = ", ".join([*TARGETS, "meshRxC (e.g. mesh8x8)"])
        raise CgcError(f"unknown target '{name}'; known targets: {known}")
    if mesh is None:
        return checked(target)
    rows, cols = mesh
    resized = replace(target, name=f"{name}@{rows}x{cols}", rows=rows, cols=cols)
    return checked(resized, dict.fromkeys(("rows", "cols"), f"--mesh {rows}x{cols}"))


def resolve(target: str | Target) -> Target:
    """A target given by name (as ``get_target`` reads it) or as a value (checked)."""
    return checked(target) if isinstance(target, Target) else get_target(target)


def with_swarmx_fanout(target: Target, fanout: int | None) -> Target:
    """``target`` with SwarmX nodes of ``fanout`` children (unchanged for None)."""
    if fanout is None:
        return target
    if fanout < 2:
        raise OptionError(
            f"swarmx_fanout {fanout}: a tree node needs at least 2 children", "swarmx_fanout"
        )
    return checked(
        replace(target, swarmx_fanout=fanout), {"swarmx_fanout": f"--swarmx-fanout {fanout}"}
    )
