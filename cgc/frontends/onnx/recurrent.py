"""ONNX recurrent ops: RNN, GRU and LSTM, unrolled over their (static) sequence length."""

from __future__ import annotations
