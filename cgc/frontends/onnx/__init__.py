"""The ONNX frontend: an ONNX model becomes a ``func.func @main`` of WSE ops.

``importer`` holds the machinery (loading, shapes, constants, errors, the registry),
``builders`` the small IR-building helpers the op importers share; each family module
registers the importers of its ONNX ops.
"""

from cgc.frontends.onnx import (  # noqa: F401  (each module registers its importers)
    attention,
    conv,
    elementwise,
    linear,
    loss,
    normalization,
    quantization,
    recurrent,
    reduction,
    signal,
    tensor,
)
from cgc.frontends.onnx.importer import (
    OPS,
    ImportedModel,
    TensorSpec,
    import_model,
    import_onnx,
)

SUPPORTED_OPS = tuple(sorted(OPS))
"""Every ONNX op type the frontend imports."""

__all__ = ["SUPPORTED_OPS", "ImportedModel", "TensorSpec", "import_model", "import_onnx"]
