"""ONNX attention ops: Attention, RotaryEmbedding and their relatives."""

from __future__ import annotations
