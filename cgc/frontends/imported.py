"""What a frontend hands the compiler: the IR of a model, its weights and its interface.

Every frontend (the ONNX importer, the params-file builder) returns an ``ImportedModel``: a
``builtin.module`` holding ``func.func @main`` of ``wse`` ops, the side store of the weights
its ``wse.weight`` ops name (arrays, or shapes and types alone for weights declared without
data), and a ``TensorSpec`` for every graph input and output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects.builtin import ModuleOp, TensorType

from cgc.dialects import wse
from cgc.machine.program.artifact import WeightSpec


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: its name, static shape and numpy dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    batch_axis: int | None
    """0 when axis 0 is the batch dimension bound by ``batch_size``, else None."""

    @property
    def tensor_type(self) -> TensorType:
        """The tensor type of the graph's value."""
        return TensorType(wse.element_of_numpy(self.dtype), self.shape)


@dataclass(frozen=True)
class BufferUpdate:
    """How a training step changes a buffer that MemoryX keeps beside the weights (a batch
    norm's running statistics): each run of the program, in sample order, folds in its own
    value of output ``output``, ``buffer = (1 - momentum) * buffer + momentum * value``; a
    counter (``output`` None) adds one per run, as torch's ``num_batches_tracked`` does."""

    buffer: str
    output: str | None
    """The name of the program output holding the run's value; None for a counter."""
    momentum: float = 0.0

    def to_json(self) -> dict:
        return {"buffer": self.buffer, "output": self.output, "momentum": self.momentum}


@dataclass
class ImportedModel:
    """The result of an import: the IR, its side store of weights, and the graph's interface."""

    module: ModuleOp
    """A ``builtin.module`` holding one ``func.func @main``."""
    weights: dict[str, np.ndarray]
    """The side store: the initializers used as tensors and the large constants, by name."""
    inputs: list[TensorSpec]
    """The graph inputs that are not initializers, in graph order."""
    outputs: list[TensorSpec]
    """The graph outputs, in order."""
    initializers: list[str]
    """The initializers that became ``wse.weight`` ops (the trainable candidates), graph order."""
    opset: int
    """The default-domain opset of the model (0 for a model that is not ONNX)."""
    source: str
    """The file name, ``zoo:NAME``, or ``"<model>"``."""
    declared: dict[str, WeightSpec] = field(default_factory=dict)
    """Weights known by shape and type only (no data): a params-file model, or an ONNX graph
    imported with ``no_weights``. A weight is in ``weights`` or here, never both."""
    tokens_per_sample: int | None = None
    """For a model of sequences: the tokens each sample holds (its sequence length)."""
    recompute_segments: str | None = None
    """A regular expression whose match at the start of a layer's name gives the segment the
    layer belongs to (a transformer block): the unit whose activations the compiler may
    compute again in the backward pass instead of keeping them. None: no segments."""
    buffer_updates: list[BufferUpdate] = field(default_factory=list)
    """The buffers a training step updates (their initial values are in ``weights``); the
    outputs they name follow the model's own."""

    @property
    def weight_specs(self) -> dict[str, WeightSpec]:
        """Every weight's shape and type, stored or declared."""
        specs = {name: WeightSpec.of(array) for name, array in self.weights.items()}
        return {**specs, **self.declared}
