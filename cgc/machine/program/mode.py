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
    WHOLE_WAFER = "whole_wafer"
    """Every layer's weights on the wafer, each spread over all of it, the layers running one
    after another on the whole wafer: how generation's decode runs when one sequence at a
    time is served (as WaferLLM runs it)."""


REQUESTS = (Mode.PIPELINED.value, Mode.WEIGHT_STREAMING.value, Mode.WHOLE_WAFER.value, "auto")
"""What a compile may ask for: a mode, or ``auto`` (the compiler chooses)."""
