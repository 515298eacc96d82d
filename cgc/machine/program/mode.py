"""The execution modes a program is compiled for."""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """How a program runs on the wafer. A member equals its string (``Mode.PIPELINED ==
    "pipelined"``), as the manifest and the command line write it."""

    PIPELINED = "pipelined"
    """Every layer's weights on the wafer, the layers a pipeline over rectangles of PEs."""
    WEIGHT_STREAMING = "weight_streaming"
    """Weights streamed from MemoryX one layer at a time, the whole wafer per layer."""


REQUESTS = (Mode.PIPELINED.value, Mode.WEIGHT_STREAMING.value, "auto")
"""What a compile may ask for: a mode, or ``auto`` (the compiler chooses)."""
