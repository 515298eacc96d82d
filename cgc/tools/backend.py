"""cgc as an ONNX backend (``onnx.backend.base.Backend``).

``prepare`` checks the model and returns a ``CgcRep``; the representation compiles the model
the first time it sees inputs of given shapes (binding every symbolic dimension to them),
keeps the artifact for those shapes, and runs it on the simulator. The backend compiles for
weight streaming on a small mesh by default, which keeps compiling cheap; ``mode`` and
``target`` keyword arguments choose otherwise.

    import cgc.tools.backend
    outputs = cgc.tools.backend.run_model(model, [x])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

from cgc.errors import NeedsInputValuesError
from cgc.machine.program.artifact import Artifact
from cgc.machine.program.mode import Mode
from cgc.runtime.cluster import Cluster

DEFAULT_MODE = Mode.WEIGHT_STREAMING
DEFAULT_TARGET = "mesh8x8"
MAX_ARTIFACTS = 16
"""Artifacts a representation keeps (the oldest goes first): one per input signature and
fixed input values, which a caller feeding ever new shape values would otherwise grow."""


class CgcRep(BackendRep):
    """A prepared model: compiled per input shapes, run on the simulator."""

    def __init__(self, model: onnx.ModelProto, mode: str, target: str):
        self.model = model
        self.mode = mode
        self.target = target
        initializers = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in initializers]
        self.output_names = [o.name for o in model.graph.output]
        self.artifacts: dict[tuple, Artifact] = {}
        self.specialized: dict[tuple, list[str]] = {}
        """The inputs each input signature's compiles fix to their values."""

    def artifact(self, inputs: Mapping[str, np.ndarray]) -> Artifact:
        """The artifact compiled for these input shapes and dtypes.

        A model whose shapes depend on the values of some inputs (a Reshape's target shape, a
        Resize's scales, fed at run time) is compiled again with those inputs fixed to this
        run's values; that artifact serves only runs with the same values.
        """
        key = tuple((name, inputs[name].shape, inputs[name].dtype.str) for name in inputs)
        fixed = self.specialized.get(key, [])
        while True:
            bound = {name: inputs[name] for name in fixed}
            value_key = (key, tuple((name, a.tobytes()) for name, a in bound.items()))
            if value_key in self.artifacts:
                return self.artifacts[value_key]
            try:
                artifact = self._compile(inputs, bound)
            except NeedsInputValuesError as e:
                more = [name for name in e.inputs if name in inputs and name not in fixed]
                if not more:
                    raise
                fixed = self.specialized[key] = fixed + more
                continue
            if len(self.artifacts) >= MAX_ARTIFACTS:
                del self.artifacts[next(iter(self.artifacts))]
            self.artifacts[value_key] = artifact
            return artifact

    def _compile(self, inputs: Mapping[str, np.ndarray], bound: dict) -> Artifact:
        from cgc.compiler.driver import compile_model

        shapes = {name: array.shape for name, array in inputs.items() if name not in bound}
        return compile_model(
            self.model, mode=self.mode, target=self.target, shapes=shapes, values=bound
        )

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Runs the model on a list (graph input order) or dict of arrays."""
        if isinstance(inputs, Mapping):
            arrays = {name: np.asarray(inputs[name]) for name in self.input_names}
        else:
            values = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            arrays = {n: np.asarray(v) for n, v in zip(self.input_names, values, strict=True)}
        artifact = self.artifact(arrays)
        taken = {spec["name"] for spec in artifact.manifest["inputs"]}
        outputs, _ = Cluster(artifact).infer({n: a for n, a in arrays.items() if n in taken})
        return namedtupledict("Outputs", self.output_names)(
            *(outputs[name] for name in self.output_names)
        )


class CgcBackend(Backend):
    """The cgc compiler and simulator behind the ONNX backend interface."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> CgcRep:
        super().prepare(model, device, **kwargs)
        return CgcRep(model, kwargs.get("mode", DEFAULT_MODE), kwargs.get("target", DEFAULT_TARGET))

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Runs one node by wrapping it in a model of its inputs and outputs."""
        super().run_node(node, inputs, device, outputs_info, **kwargs)
        arrays = [np.asarray(v) for v in inputs]
        names = [n for n in node.input if n]
        graph_inputs = [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in zip(names, arrays, strict=True)
        ]
        graph_outputs = [
            helper.make_tensor_value_info(
                n,
                helper.np_dtype_to_tensor_dtype(np.dtype(outputs_info[i][0]))
                if outputs_info
                else onnx.TensorProto.UNDEFINED,
                outputs_info[i][1] if outputs_info else None,
            )
            for i, n in enumerate(node.output)
            if n
        ]
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(
            helper.make_graph([node], "node", graph_inputs, graph_outputs),
            opset_imports=[helper.make_opsetid("", opset)],
        )
        return cls.prepare(model, device, **kwargs).run(arrays)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """cgc simulates its own machine; it answers to the CPU device."""
        return device.upper() == "CPU"


prepare = CgcBackend.prepare
run_model = CgcBackend.run_model
run_node = CgcBackend.run_node
supports_device = CgcBackend.supports_device
