"""What the compiler can be given to compile: an ONNX model, or a params file.

A ``Source`` imports its model at any per-system batch, which is what lets the memory plan
(``cgc.compiler.memory``) split a batch into micro-batches; a params-file model can also be
built with fewer of its repeated blocks, which is what lets the plan measure small copies of
a very large model.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from cgc.errors import CgcError, OptionError
from cgc.frontends import transformer
from cgc.frontends.imported import ImportedModel
from cgc.frontends.onnx import import_model, import_onnx
from cgc.frontends.params import ModelParams, is_params_source, load_params
from cgc.machine.hardware import dtypes


class Source(abc.ABC):
    """A model to compile."""

    name: str
    """For messages: the file name or ``zoo:NAME``."""

    @property
    def batch_size(self) -> int | None:
        """The global batch the model comes with, if any."""
        return None

    @property
    def num_csx(self) -> int | None:
        """The systems the model comes with, if any."""
        return None

    @property
    def blocks(self) -> int | None:
        """Its repeated blocks, if ``imported`` can build it with fewer."""
        return None

    @property
    def rebatchable(self) -> bool:
        """Whether ``imported`` takes any batch (else only the one it was given with)."""
        return True

    @property
    def segments(self) -> str | None:
        """The pattern of its blocks' names (``ImportedModel.recompute_segments``), if any."""
        return None

    @abc.abstractmethod
    def imported(self, batch: int | None, blocks: int | None = None) -> ImportedModel:
        """The model at a per-system batch of ``batch`` (None: as declared), with ``blocks``
        of its repeated blocks (None: all)."""


class OnnxSource(Source):
    """An ONNX file or ``ModelProto``."""

    def __init__(
        self,
        model: str | os.PathLike[str] | onnx.ModelProto,
        shapes: Mapping[str, Sequence[int]] | None,
        values: Mapping[str, np.ndarray] | None,
        no_weights: bool,
    ):
        self.model = model
        self.shapes = shapes
        self.values = values
        self.no_weights = no_weights
        self.name = "<model>" if isinstance(model, onnx.ModelProto) else Path(model).name

    @property
    def rebatchable(self) -> bool:
        # a whole shape given by --shape fixes the batch too
        return not self.shapes

    def imported(self, batch: int | None, blocks: int | None = None) -> ImportedModel:
        if isinstance(self.model, onnx.ModelProto):
            return import_model(
                self.model, batch, self.shapes, values=self.values, no_weights=self.no_weights
            )
        return import_onnx(self.model, batch, self.shapes, self.values, self.no_weights)


class ImportedSource(Source):
    """A model imported already (at one batch)."""

    def __init__(self, model: ImportedModel):
        self.model = model
        self.name = model.source

    @property
    def rebatchable(self) -> bool:
        return False

    @property
    def segments(self) -> str | None:
        return self.model.recompute_segments

    def imported(self, batch: int | None, blocks: int | None = None) -> ImportedModel:
        return self.model


class ParamsSource(Source):
    """A params file (or ``zoo:NAME``): a GPT-class model built in the WSE dialect, its
    weights declared, or drawn from ``init_seed``; with ``buffers`` (its weights come from a
    file), the tables computed from the config are computed however the weights are."""

    def __init__(
        self, params: ModelParams, training: bool, init_seed: int | None, buffers: bool = False
    ):
        self.params = params
        self.training = training
        self.init_seed = init_seed
        self.buffers = buffers
        self.name = params.source
        transformer.check_supported(params)

    @property
    def batch_size(self) -> int:
        return self.params.train_input.batch_size

    @property
    def num_csx(self) -> int:
        return self.params.runconfig.num_csx

    @property
    def blocks(self) -> int:
        return self.params.model.num_hidden_layers

    @property
    def segments(self) -> str:
        return transformer.SEGMENTS

    def imported(self, batch: int | None, blocks: int | None = None) -> ImportedModel:
        return transformer.build(
            self.params,
            batch or 1,
            self.training,
            blocks,
            materialize=self.init_seed is not None,
            seed=self.init_seed or 0,
            buffers=self.buffers,
        )


class TorchSource(Source):
    """A ``torch.export`` program (``cgc.frontends.torch.capture``), lowered at any batch when
    it was captured with a symbolic one."""

    def __init__(self, program: Any, name: str = "<torch>", training: bool = False):
        from cgc.frontends.torch import example_batch

        self.program = program
        self.name = name
        self.training = training
        self.example_batch = example_batch(program)

    @property
    def batch_size(self) -> int | None:
        return self.example_batch

    @property
    def rebatchable(self) -> bool:
        return self.example_batch is not None

    def imported(self, batch: int | None, blocks: int | None = None) -> ImportedModel:
        from cgc.frontends.torch import import_program

        return import_program(self.program, batch, self.name, self.training)


def is_torch_program(model: object) -> bool:
    """Whether ``model`` is a ``torch.export.ExportedProgram`` (torch imported or not)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.export.ExportedProgram)


class WithWeights(Source):
    """Another source whose weights, some or all, come from a file (``--weights``): by name,
    of the model's shapes, in its element types."""

    def __init__(self, source: Source, weights: Mapping[str, np.ndarray], origin: str):
        if isinstance(source, ParamsSource):  # the file's model computes its own tables
            source = ParamsSource(source.params, source.training, source.init_seed, buffers=True)
        self.source = source
        self.weights = dict(weights)
        self.origin = origin
        self.name = source.name

    @property
    def batch_size(self) -> int | None:
        """The wrapped source's."""
        return self.source.batch_size

    @property
    def num_csx(self) -> int | None:
        """The wrapped source's."""
        return self.source.num_csx

    @property
    def blocks(self) -> int | None:
        """The wrapped source's."""
        return self.source.blocks

    @property
    def rebatchable(self) -> bool:
        """The wrapped source's."""
        return self.source.rebatchable

    @property
    def segments(self) -> str | None:
        """The wrapped source's."""
        return self.source.segments

    def imported(self, batch: int | None, blocks: int | None = None) -> ImportedModel:
        """The wrapped source's model with the file's weights (of a model with fewer blocks,
        those it has)."""
        model = self.source.imported(batch, blocks)
        specs = model.weight_specs
        unknown = sorted(set(self.weights) - set(specs))
        if unknown and blocks is None:
            raise CgcError(f"{self.origin}: '{unknown[0]}' is not a weight of {self.name}")
        given = {}
        for name in sorted(set(self.weights) & set(specs)):
            value, spec = self.weights[name], specs[name]
            if tuple(value.shape) != tuple(spec.shape):
                raise CgcError(
                    f"{self.origin}: '{name}' is {list(value.shape)}, the model's "
                    f"{list(spec.shape)}"
                )
            if dtypes.is_float(value.dtype) != dtypes.is_float(dtypes.dtype(spec.dtype)):
                raise CgcError(
                    f"{self.origin}: '{name}' is {value.dtype}, the model's {spec.dtype}"
                )
            given[name] = value.astype(dtypes.dtype(spec.dtype))
        declared = {k: v for k, v in model.declared.items() if k not in given}
        return dataclasses.replace(model, weights={**model.weights, **given}, declared=declared)


def source_of(
    model: str | os.PathLike[str] | onnx.ModelProto | ImportedModel | ModelParams,
    shapes: Mapping[str, Sequence[int]] | None = None,
    values: Mapping[str, np.ndarray] | None = None,
    no_weights: bool = False,
    training: bool = False,
    init_seed: int | None = None,
) -> Source:
    """The source a model argument names: an ONNX file or ModelProto, an imported model, a
    ``ModelParams``, or a params file or ``zoo:NAME``."""
    if isinstance(model, ImportedModel):
        return ImportedSource(model)
    if is_torch_program(model):
        if shapes or values or no_weights or init_seed is not None:
            raise OptionError(
                "shapes, fixed input values, no_weights and init_seed apply to ONNX and "
                "params-file models; a PyTorch model brings its example inputs and weights",
                "shapes",
                "no_weights",
                "init_seed",
            )
        return TorchSource(model, training=training)
    if isinstance(model, ModelParams):
        params = model
    elif not isinstance(model, onnx.ModelProto) and is_params_source(model):
        params = load_params(model)
    else:
        if init_seed is not None:
            raise OptionError(
                "init_seed draws the weights of a params-file model only", "init_seed"
            )
        return OnnxSource(model, shapes, values, no_weights)
    if shapes or values:
        raise OptionError(
            f"{params.source}: shapes and fixed input values apply to ONNX models; a "
            "params-file model takes batch_size (its sequence length is in the file)",
            "shapes",
            "batch_size",
        )
    return ParamsSource(params, training, init_seed)
