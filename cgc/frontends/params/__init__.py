"""Params files: a GPT-class language model and its training run, in Cerebras Model Zoo style.

A params file is YAML with four sections, keyed as the Cerebras Model Zoo keys them::

    model:          # the network: hidden_size, num_hidden_layers, num_heads, vocab_size, ...
    train_input:    # batch_size (the global batch, in sequences), max_sequence_length
    optimizer:      # optimizer_type, learning_rate, betas, eps, weight_decay, ...
    runconfig:      # num_csx, precision
    sparsity:       # density, param_name_patterns, init, schedule (static or dynamic) and
                    # update_every, drop_fraction, regrow, decay, end_step (optional)

``load_params`` reads one (a path, or ``zoo:NAME`` for a built-in one from
``cgc/frontends/configs``) into a ``ModelParams``, and ``params_from_document`` checks one
already read (a document built in code, named by its ``source``); any problem is a
``CgcError`` whose one line names the file and the key path (``gpt.yaml: model.num_heads: 12
does not divide hidden_size 1000``). Values are checked strictly: ``true`` is not an integer,
``1.5`` is not an integer, an integer is an acceptable float, a key given twice is an error,
and every integer has an upper limit (``INTEGER_LIMITS``) far above any real model.
``parameter_count`` gives the exact number of trainable parameters of the model a
``ModelConfig`` describes.

The package reads a file in steps, one module each: ``strict_yaml`` (the text into one YAML
document), ``keys`` (the keys cgc knows, and the Model Zoo's housekeeping it skips),
``sections`` (each section's values checked into its record) and ``records`` (the records, and
what they say: the parameter count, the optimizer's settings); this module finds the file and
runs the steps.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from cgc.errors import CgcError
from cgc.files import special_kind
from cgc.frontends.params.keys import (
    MODEL_KEYS,
    OPTIMIZER_KEYS,
    REQUIRED_SECTIONS,
    RUNCONFIG_KEYS,
    SECTIONS,
    SPARSITY_KEYS,
    TRAIN_INPUT_KEYS,
    without_housekeeping,
)
from cgc.frontends.params.records import (
    INTEGER_LIMITS,
    ModelConfig,
    ModelParams,
    OptimizerConfig,
    RunConfig,
    SparsityConfig,
    TrainInput,
    optimizer_settings,
    parameter_count,
)
from cgc.frontends.params.sections import (
    Section,
    read_model,
    read_optimizer,
    read_runconfig,
    read_sparsity,
    read_train_input,
    show,
)
from cgc.frontends.params.strict_yaml import load_yaml

__all__ = [
    "INTEGER_LIMITS",
    "PARAMS_SUFFIXES",
    "ZOO_PREFIX",
    "ModelConfig",
    "ModelParams",
    "OptimizerConfig",
    "RunConfig",
    "SparsityConfig",
    "TrainInput",
    "is_params_source",
    "load_params",
    "optimizer_settings",
    "parameter_count",
    "params_from_document",
    "zoo_names",
]

ZOO_PREFIX = "zoo:"
"""A command-line MODEL of the form ``zoo:NAME`` names a built-in params file."""

PARAMS_SUFFIXES = (".yaml", ".yml")


def _parse(text: bytes, name: str, source: str) -> ModelParams:
    """Reads and checks the YAML ``text`` of a params file."""
    return params_from_document(load_yaml(text, source), name, source)


def params_from_document(document: object, name: str, source: str) -> ModelParams:
    """Checks ``document``, a params file's sections as YAML reads them (a mapping of section
    names to mappings), into a ``ModelParams`` named ``name``; messages name ``source``."""
    if not isinstance(document, dict):
        raise CgcError(
            f"{source}: expected a mapping of sections ({', '.join(SECTIONS)}) at the top "
            f"level, got {'an empty file' if document is None else show(document)}"
        )
    document = without_housekeeping(document, source)
    for key in REQUIRED_SECTIONS:
        if key not in document:
            raise CgcError(f"{source}: missing required section {key}")

    def section(key: str, known: Sequence[str]) -> Section:
        return Section(source, key, document.get(key, {}), known)

    train_input = read_train_input(section("train_input", TRAIN_INPUT_KEYS))
    return ModelParams(
        name=name,
        source=source,
        model=read_model(section("model", MODEL_KEYS), train_input.max_sequence_length),
        train_input=train_input,
        optimizer=read_optimizer(section("optimizer", OPTIMIZER_KEYS)),
        runconfig=read_runconfig(section("runconfig", RUNCONFIG_KEYS), train_input.batch_size),
        sparsity=(
            read_sparsity(section("sparsity", SPARSITY_KEYS)) if "sparsity" in document else None
        ),
    )


def _zoo_directory() -> Traversable:
    return resources.files("cgc.frontends").joinpath("configs")


def zoo_names() -> list[str]:
    """The names of the built-in params files, sorted."""
    suffix = PARAMS_SUFFIXES[0]
    return sorted(
        entry.name.removesuffix(suffix)
        for entry in _zoo_directory().iterdir()
        if entry.name.endswith(suffix)
    )


def is_params_source(spec: str | os.PathLike[str]) -> bool:
    """Whether a command-line MODEL names a params file (``.yaml``/``.yml``) or ``zoo:NAME``."""
    text = os.fspath(spec)
    return text.startswith(ZOO_PREFIX) or Path(text).suffix.lower() in PARAMS_SUFFIXES


def load_params(spec: str | os.PathLike[str]) -> ModelParams:
    """Reads and checks ``zoo:NAME`` or the params file at the path ``spec``."""
    text = os.fspath(spec)
    if text.startswith(ZOO_PREFIX):
        name = text.removeprefix(ZOO_PREFIX)
        names = zoo_names()
        if name not in names:
            raise CgcError(f"{text}: no built-in model of that name (known: {', '.join(names)})")
        data = _zoo_directory().joinpath(name + PARAMS_SUFFIXES[0]).read_bytes()
        return _parse(data, name, text)
    path = Path(text)
    if path.suffix.lower() not in PARAMS_SUFFIXES:
        raise CgcError(f"{path.name}: not a params file (expected a .yaml or .yml file)")
    kind = special_kind(path)
    if kind is not None:
        raise CgcError(f"{path}: is {kind}, not a params file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CgcError(f"{path.name}: no such file") from None
    except OSError as error:
        raise CgcError(f"{path.name}: cannot read ({error.strerror})") from None
    return _parse(data, path.stem, path.name)
