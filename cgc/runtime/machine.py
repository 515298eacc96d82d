"""The machine a program runs on: one target's wafer, MemoryX and SwarmX numbers.

A ``Target`` is plain data. The compiler's registry (``cgc.compiler.targets``) builds the named
ones from ``reference/wse-hardware.md``; the artifact carries the whole description, so the
runtime simulates exactly the machine the program was compiled for.

Per-element costs of the vector ops are modelling choices, not published numbers: a PE does one
simple float op per element per SIMD lane per cycle and spends ``TRANSCENDENTAL_CYCLES`` on an
exp, log, tanh, erf, sqrt or divide (a short polynomial or Newton sequence on the FMAC unit).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from cgc import dtypes

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

    def to_json(self) -> dict:
        """A JSON-ready dict that ``from_json`` turns back into an equal Target."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Target:
        """Inverse of ``to_json``."""
        return cls(**data)
