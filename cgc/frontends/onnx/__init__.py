"""The ONNX frontend: an ONNX model becomes a ``func.func @main`` of WSE ops.

``importer`` holds the machinery (the ``Importer``, its conversion loop, values known at compile
time, the registry), ``model`` the reading of a model and its interface (opset, element types,
initializers, input and output shapes), ``nodes`` what op importers read and raise about a
node, ``attributes`` the readers of attributes and compile-time inputs the op families share;
each family module registers the importers of its ONNX ops. What they build IR with they share
with the PyTorch frontend: ``cgc.frontends.builders`` and ``cgc.frontends.formulas``.
"""

from cgc.frontends.imported import ImportedModel, TensorSpec
from cgc.frontends.onnx import (  # noqa: F401  (each module registers its importers)
    activations,
    attention,
    casts,
    constants,
    conv,
    elementwise,
    indexing,
    linear,
    loss,
    normalization,
    padding,
    pool,
    quantization,
    recurrent,
    reduction,
    reshapes,
    resize,
    sampling,
    signal,
    slicing,
)
from cgc.frontends.onnx.importer import OPS, import_model, import_onnx

SUPPORTED_OPS = tuple(sorted(OPS))
"""Every ONNX op type the frontend imports."""

__all__ = ["SUPPORTED_OPS", "ImportedModel", "TensorSpec", "import_model", "import_onnx"]
