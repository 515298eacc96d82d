"""onnx's 'light' ResNet-50 as the benchmarks measure it: its batch, fixed at 1 in the file
(its input's leading dimension and the constant shape it reshapes its features to before the
classifier), freed, so that it compiles at any batch."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import numpy_helper


def resnet50() -> onnx.ModelProto:
    """ResNet-50 with a free batch."""
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    return with_free_batch(onnx.load(str(light / "light_resnet50.onnx")))


def with_free_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (whose batch is fixed at 1) with a free batch: its input's leading dimension
    symbolic, and the leading 1 of every constant shape it reshapes to inferred (-1)."""
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    shapes = {n.input[1] for n in model.graph.node if n.op_type == "Reshape"}
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.name in shapes:
            shape = numpy_helper.to_array(tensor).copy()
            if shape[0] == 1:
                shape[0] = -1
                model.graph.initializer[index].CopyFrom(numpy_helper.from_array(shape, tensor.name))
    for output in model.graph.output:
        output.type.tensor_type.shape.dim[0].dim_param = "batch"
    del model.graph.value_info[:]
    return model
