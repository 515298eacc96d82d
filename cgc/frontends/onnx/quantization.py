"""ONNX quantization ops: QuantizeLinear, DequantizeLinear and the integer products."""

from __future__ import annotations
