"""ONNX signal-processing ops: DFT, STFT and the window generators."""

from __future__ import annotations
