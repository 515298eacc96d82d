"""The artifact manifest's schema, and the checks a manifest read from a file must pass.

``SCHEMA`` is the one statement of what a manifest holds: every key the compiler writes and
the runtime, the tools and the command line read, with its type and range. It is written in
a small subset of JSON Schema:

* ``type``: ``object``, ``array``, ``string``, ``integer``, ``number``, ``boolean``, ``null``,
  or a list of them (a value of any of them); ``integer`` and ``number`` exclude booleans,
  ``number`` excludes NaN and the infinities;
* ``properties`` and ``required`` of an object; an object has no other keys, unless its
  ``additionalProperties`` gives the schema of every other key's value (a map by name);
* ``items``, ``minItems`` and ``maxItems`` of an array;
* ``minimum``, ``maximum`` and ``exclusiveMinimum`` of a number, ``enum`` of a string.

``check_manifest`` checks a parsed manifest against it, then what the schema cannot say
(batch sizes that agree, names that are unique, optimizer settings in range); a problem is a
CgcError naming the key's path (``manifest: training.optimizer.lr: expected a number, got
"x"``). ``parse_json`` parses JSON from a file with its nesting depth bounded first, so a
hostile file cannot exhaust the parser's recursion.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from cgc.errors import CgcError
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import MAX_SYSTEMS
from cgc.machine.program.mode import Mode
from cgc.machine.sparse.sparsity import DECAYS, DYNAMIC, INITS, REGROWS, SCHEDULES, Sparsity
from cgc.machine.training import optimizers

MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects a JSON text of an artifact may have: a
manifest nests five levels, the bytecode's attributes a few more."""

DTYPES: tuple[str, ...] = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", *dtypes.EXTENDED_FLOATS, *dtypes.EXTENDED_INTS,
)  # fmt: skip
"""The element types a tensor of an artifact may have (no object or string arrays)."""

Schema = dict[str, Any]

_COUNT: Schema = {"type": "integer", "minimum": 0}
_POSITIVE: Schema = {"type": "integer", "minimum": 1}
_AMOUNT: Schema = {"type": "number", "minimum": 0}
_NAME: Schema = {"type": "string"}
_NAMES: Schema = {"type": "array", "items": _NAME}
_SHAPE: Schema = {"type": "array", "items": _COUNT}
_DTYPE: Schema = {"type": "string", "enum": list(DTYPES)}

_TENSOR: Schema = {
    "type": "object",
    "required": ["name", "shape", "dtype", "batch_axis"],
    "properties": {
        "name": _NAME,
        "shape": _SHAPE,
        "dtype": _DTYPE,
        "batch_axis": {"type": ["integer", "null"], "minimum": 0, "maximum": 0},
    },
}

_LAYER_FIGURES = {
    "weight_bytes": _COUNT,
    "cycles": _AMOUNT,
    "compute_cycles": _AMOUNT,
    "movement_cycles": _AMOUNT,
    "arrival_cycles": _AMOUNT,
    "link_wavelets": _AMOUNT,
    "flops": _AMOUNT,
    "sram_bytes_per_pe": _COUNT,
    "stream_in_bytes": _AMOUNT,
    "stream_out_bytes": _AMOUNT,
    "host_bytes": _AMOUNT,
    "activation_in_bytes": _COUNT,
    "activation_out_bytes": _COUNT,
}
_LAYER: Schema = {
    "type": "object",
    "required": ["name", "rect", "weights", *_LAYER_FIGURES],
    "properties": {
        "name": _NAME,
        "rect": {"type": "array", "items": _COUNT, "minItems": 4, "maxItems": 4},
        "weights": _NAMES,
        **_LAYER_FIGURES,
    },
}

_MEMORY_PLAN: Schema = {
    "type": ["object", "null"],
    "required": ["micro_batch", "micro_batches", "recompute", "peak_sram_bytes_per_pe", "reason"],
    "properties": {
        "micro_batch": _POSITIVE,
        "micro_batches": _POSITIVE,
        "recompute": {"type": "boolean"},
        "peak_sram_bytes_per_pe": _COUNT,
        "reason": {"type": "string"},
    },
}

_OPTIMIZER: Schema = {
    "type": "object",
    "required": ["optimizer"],
    "properties": {
        "optimizer": {"type": "string", "enum": list(optimizers.OPTIMIZERS)},
        **{
            name: {"type": "boolean"} if setting.flag else {"type": "number"}
            for name, setting in optimizers.SETTINGS.items()
        },
    },
}

_BUFFER: Schema = {
    "type": "object",
    "required": ["buffer", "output", "momentum"],
    "properties": {
        "buffer": _NAME,
        "output": {"type": ["string", "null"]},
        "momentum": {"type": "number", "minimum": 0, "maximum": 1},
    },
}

_SPARSITY: Schema = {
    "type": ["object", "null"],
    "required": ["density", "init", "seed", "weights"],
    "properties": {
        "density": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "init": {"type": "string", "enum": list(INITS)},
        "seed": _COUNT,
        "weights": _NAMES,
        "schedule": {"type": "string", "enum": list(SCHEDULES)},
        "update_every": _POSITIVE,
        "drop_fraction": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "regrow": {"type": "string", "enum": list(REGROWS)},
        "decay": {"type": "string", "enum": list(DECAYS)},
        "end_step": {"type": ["integer", "null"], "minimum": 1},
    },
}
"""A static sparsity's record has the first four keys; a dynamic one all of them."""

_TRAINING: Schema = {
    "type": ["object", "null"],
    "required": [
        "loss",
        "loss_scale",
        "batch_reduction",
        "optimizer",
        "trainable",
        "initializers",
    ],
    "properties": {
        "loss": _NAME,
        "loss_scale": {"type": "number", "exclusiveMinimum": 0},
        "batch_reduction": {"type": ["string", "null"], "enum": ["mean", "sum"]},
        "optimizer": _OPTIMIZER,
        "trainable": _NAMES,
        "initializers": _NAMES,
        "buffers": {"type": "array", "items": _BUFFER},
    },
}

_ATTENTION: Schema = {
    "type": ["object", "null"],
    "required": ["found", "fused", "first_unfused"],
    "properties": {
        "found": {"type": "integer", "minimum": 0},
        "fused": {"type": "integer", "minimum": 0},
        "first_unfused": {
            "type": ["object", "null"],
            "required": ["name", "reason"],
            "properties": {"name": {"type": "string"}, "reason": {"type": "string"}},
        },
    },
}
"""The attention blocks a compile found and fused, and the first it left with the reason."""

_CACHE: Schema = {
    "type": "object",
    "required": ["name", "layer", "capacity", "sequences", "shape", "dtype", "bytes_per_token",
                 "rect", "tile", "tile_bytes"],
    "properties": {
        "name": _NAME,
        "layer": _NAME,
        "capacity": _POSITIVE,
        "sequences": _POSITIVE,
        "shape": _SHAPE,
        "dtype": _DTYPE,
        "bytes_per_token": _COUNT,
        "rect": {"type": "array", "items": _COUNT, "minItems": 4, "maxItems": 4},
        "tile": {"type": "array", "items": _COUNT, "minItems": 2, "maxItems": 2},
        "tile_bytes": _COUNT,
    },
}  # fmt: skip
"""A key-value cache a program keeps (``cgc.machine.program.caches``)."""

SERVING_FIGURES = (
    "prompt_tokens",
    "prompt_chunks",
    "new_tokens",
    "num_csx",
    "ttft_seconds",
    "tpot_seconds",
    "tokens_per_second",
    "tokens_per_second_per_sequence",
    "kv_capacity_tokens",
)
"""The serving figures a generation's artifact always has (``cgc inspect`` shows them)."""

_SECONDS: Schema = {"type": "number", "minimum": 0}
_PASS: Schema = {
    "type": "object",
    "required": ["layers", "link_seconds", "systems", "sequences", "mode"],
    "properties": {
        "layers": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "system", "seconds", "compute_seconds", "arrival_seconds",
                             "movement_seconds"],
                "properties": {
                    "name": _NAME,
                    "system": _COUNT,
                    "seconds": _SECONDS,
                    "compute_seconds": _SECONDS,
                    "arrival_seconds": _SECONDS,
                    "movement_seconds": {"type": "number"},
                },
            },
        },
        "link_seconds": _SECONDS,
        "systems": {"type": "integer", "minimum": 1, "maximum": MAX_SYSTEMS},
        "sequences": _POSITIVE,
        "mode": {"type": "string", "enum": list(Mode)},
    },
}  # fmt: skip
"""One program's pass over the systems (``cgc.machine.timing.serving.Pass.record``)."""
_TIMING: Schema = {
    "type": "object",
    "required": ["prefill", "decode", "prompt_tokens", "prompt_runs", "new_tokens",
                 "kv_capacity_tokens", "kv_bytes_per_token"],
    "properties": {
        "prefill": _PASS,
        "decode": _PASS,
        "prompt_tokens": _COUNT,
        "prompt_runs": _POSITIVE,
        "new_tokens": _POSITIVE,
        "kv_capacity_tokens": _COUNT,
        "kv_bytes_per_token": _COUNT,
    },
}  # fmt: skip

_GENERATION: Schema = {
    "type": "object",
    "required": ["decode", "serving", "timing"],
    "properties": {
        "timing": _TIMING,
        "decode": {
            "type": "object",
            "required": ["inputs", "outputs", "pipeline", "layers", "caches"],
            "properties": {
                "inputs": {"type": "array", "items": _TENSOR},
                "outputs": {"type": "array", "items": _TENSOR, "minItems": 1},
                "pipeline": {"type": "string"},
                "layers": {"type": "array", "items": _LAYER},
                "caches": {"type": "array", "items": _CACHE},
            },
        },
        "serving": {
            "type": "object",
            "required": list(SERVING_FIGURES),
            "properties": {name: {"type": "number", "minimum": 0} for name in SERVING_FIGURES},
            "additionalProperties": {"type": ["string", "number"]},
        },
    },
}
"""A generation's decode step (the artifact's own program is its prompts'), and its serving
figures (``cgc.machine.timing.serving``)."""

SCHEMA: Schema = {
    "type": "object",
    "required": [
        "format_version",
        "cgc_version",
        "source",
        "mode",
        "mode_reason",
        "target",
        "num_csx",
        "per_system_batch",
        "micro_batch",
        "micro_batches",
        "memory_plan",
        "tokens_per_sample",
        "inputs",
        "outputs",
        "pipeline",
        "layers",
        "training",
    ],
    "properties": {
        "format_version": _POSITIVE,
        "cgc_version": {"type": "string"},
        "source": {"type": "string"},
        "mode": {"type": "string", "enum": list(Mode)},
        "mode_reason": {"type": "string"},
        # its figures and their ranges are the target's own (cgc.machine.hardware.target.checked)
        "target": {"type": "object", "additionalProperties": {"type": ["string", "number"]}},
        "num_csx": {"type": "integer", "minimum": 1, "maximum": MAX_SYSTEMS},
        "per_system_batch": {"type": ["integer", "null"], "minimum": 1},
        "micro_batch": {"type": ["integer", "null"], "minimum": 1},
        "micro_batches": _POSITIVE,
        "memory_plan": _MEMORY_PLAN,
        "tokens_per_sample": {"type": ["integer", "null"], "minimum": 1},
        "inputs": {"type": "array", "items": _TENSOR},
        "outputs": {"type": "array", "items": _TENSOR, "minItems": 1},
        "pipeline": {"type": "string"},
        "layers": {"type": "array", "items": _LAYER},
        "training": _TRAINING,
        "attention": _ATTENTION,
        "sparsity": _SPARSITY,
        "caches": {"type": "array", "items": _CACHE},
        "generation": _GENERATION,
        "declared_weights": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["shape", "dtype"],
                "properties": {"shape": _SHAPE, "dtype": _DTYPE},
            },
        },
    },
}
"""Every key of a manifest: the keys ``required`` lists always appear (``null`` when they do
not apply); ``declared_weights`` (weights without data), ``training.buffers`` (buffers a
training step updates), ``attention`` (in artifacts of cgc before it counted attention
blocks), ``caches`` (a program without key-value caches) and ``generation`` (an artifact of
one program) may be left out."""


# ---------------------------------------------------------------------------------------------
# JSON with bounded nesting
# ---------------------------------------------------------------------------------------------

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_OPENING = np.frombuffer(b"[{", np.uint8)
_CLOSING = np.frombuffer(b"]}", np.uint8)


def json_depth(text: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text, counted on its bytes
    without parsing (strings left out). On malformed JSON the count may be off after the
    first error, where a parser stops anyway."""
    codes = np.frombuffer(_STRING.sub(b'""', text), np.uint8)
    steps = np.isin(codes, _OPENING).astype(np.int64) - np.isin(codes, _CLOSING)
    return int(np.cumsum(steps).max(initial=0))


def parse_json(text: bytes, what: str) -> Any:
    """The JSON value of ``text``; a ValueError naming ``what`` if it is malformed or nested
    deeper than ``MAX_JSON_DEPTH``."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{what} nests {depth} levels deep (at most {MAX_JSON_DEPTH})")
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} is not valid JSON ({e})") from None


# ---------------------------------------------------------------------------------------------
# The validator
# ---------------------------------------------------------------------------------------------

_KINDS: dict[str, str] = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def shown(value: Any, limit: int = 40) -> str:
    """A value as JSON, shortened to about ``limit`` characters."""
    try:
        text = json.dumps(value, sort_keys=True)
    except (ValueError, TypeError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is(kind: str, value: Any) -> bool:
    """Whether ``value`` (parsed JSON) is of schema type ``kind``."""
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
    checks = {"object": dict, "array": list, "string": str, "boolean": bool}
    return value is None if kind == "null" else isinstance(value, checks[kind])


def _where(path: str) -> str:
    return f"{path}: " if path else ""


def validate(value: Any, schema: Schema, path: str = "") -> None:
    """Checks ``value`` against ``schema``; a CgcError naming the path of the first value
    that does not fit (``training.optimizer.lr``, ``layers[2].rect``)."""
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    kind = next((k for k in kinds if _is(k, value)), None)
    if kind is None:
        expected = " or ".join(_KINDS[k] for k in kinds)
        raise CgcError(f"{_where(path)}expected {expected}, got {shown(value)}")
    if kind == "object":
        _validate_object(value, schema, path)
    elif kind == "array":
        _validate_array(value, schema, path)
    elif kind in ("integer", "number"):
        _validate_number(value, schema, path)
    elif kind == "string" and "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(json.dumps(c) for c in schema["enum"])
        raise CgcError(f"{_where(path)}expected one of {choices}, got {shown(value)}")


def _validate_object(value: dict[str, Any], schema: Schema, path: str) -> None:
    prefix = f"{path}." if path else ""
    for key in schema.get("required", ()):
        if key not in value:
            raise CgcError(f"{prefix}{key}: missing")
    properties = schema.get("properties", {})
    other = schema.get("additionalProperties")
    for key, item in value.items():
        if key in properties:
            validate(item, properties[key], prefix + key)
        elif other is not None:
            validate(item, other, f"{prefix}{key}")
        else:
            raise CgcError(f"{prefix}{key}: unknown key")


def _validate_array(value: list[Any], schema: Schema, path: str) -> None:
    low, high = schema.get("minItems", 0), schema.get("maxItems")
    if len(value) < low or (high is not None and len(value) > high):
        count = str(low) if low == high else f"at least {low}"
        raise CgcError(f"{_where(path)}expected {count} items, got {len(value)}")
    if "items" in schema:
        for index, item in enumerate(value):
            validate(item, schema["items"], f"{path}[{index}]")


def _validate_number(value: float, schema: Schema, path: str) -> None:
    if "minimum" in schema and value < schema["minimum"]:
        raise CgcError(f"{_where(path)}expected at least {schema['minimum']}, got {value}")
    if "maximum" in schema and value > schema["maximum"]:
        raise CgcError(f"{_where(path)}expected at most {schema['maximum']}, got {value}")
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        raise CgcError(
            f"{_where(path)}expected more than {schema['exclusiveMinimum']}, got {value}"
        )


# ---------------------------------------------------------------------------------------------
# What the schema cannot say
# ---------------------------------------------------------------------------------------------


def check_manifest(manifest: Any) -> dict[str, Any]:
    """``manifest`` if it fits ``SCHEMA`` and its entries agree with each other; else a
    CgcError starting ``manifest:`` and naming the key."""
    try:
        _upgrade(manifest)
        validate(manifest, SCHEMA)
        _check_batches(manifest)
        _check_unique(manifest, "inputs")
        _check_unique(manifest, "outputs")
        if manifest["training"] is not None:
            _check_training(manifest["training"], manifest["outputs"])
        _check_sparsity(manifest)
    except CgcError as e:
        raise CgcError(f"manifest: {e}") from None
    checked: dict[str, Any] = manifest
    return checked


def _check_batches(manifest: Mapping[str, Any]) -> None:
    """The per-system batch is the micro-batches' samples, and every tensor with a batch
    axis has the micro-batch's samples on it: a run splits its inputs by them."""
    micro, runs, whole = (
        manifest["micro_batch"], manifest["micro_batches"], manifest["per_system_batch"],
    )  # fmt: skip
    if (micro is None) != (whole is None) or (micro is not None and micro * runs != whole):
        raise CgcError(
            f"per_system_batch: {whole} is not micro_batch {micro} x micro_batches {runs}"
        )
    if micro is None and runs != 1:  # a program without a batch axis runs once
        raise CgcError(f"micro_batches: {runs} runs of a program without a batch axis")
    for key in ("inputs", "outputs"):
        for index, spec in enumerate(manifest[key]):
            if spec["batch_axis"] == 0 and spec["shape"][:1] != [micro]:
                raise CgcError(
                    f"{key}[{index}].shape: {spec['shape']} does not start with the "
                    f"micro_batch {micro}, yet its batch_axis is 0"
                )


def _check_unique(manifest: Mapping[str, Any], key: str) -> None:
    seen: set[str] = set()
    for index, spec in enumerate(manifest[key]):
        if spec["name"] in seen:
            raise CgcError(f"{key}[{index}].name: {shown(spec['name'])} appears twice")
        seen.add(spec["name"])


def _upgrade(manifest: Any) -> None:
    """Moves the sparsity record of a training artifact written before records had their
    own key (``training.sparsity``) to the top level."""
    training = manifest.get("training") if isinstance(manifest, dict) else None
    if isinstance(training, dict) and "sparsity" in training and "sparsity" not in manifest:
        manifest["sparsity"] = training.pop("sparsity")


def _check_sparsity(manifest: Mapping[str, Any]) -> None:
    """A dynamic sparsity has all its settings, which go together; a training artifact's
    sparse weights are weights it trains."""
    sparsity, training = manifest.get("sparsity"), manifest["training"]
    if sparsity is None:
        return
    names = sparsity["weights"]
    if len(set(names)) != len(names):
        raise CgcError("sparsity.weights: names a weight twice")
    dynamic = sparsity.get("schedule", "static") == "dynamic"
    for key in DYNAMIC:
        if (key in sparsity) != dynamic:
            problem = "missing" if dynamic else "only a dynamic sparsity has it"
            raise CgcError(f"sparsity.{key}: {problem}")
    try:
        Sparsity.from_json(sparsity)
    except CgcError as e:
        raise CgcError(f"sparsity: {e}") from None
    if training is None:
        return
    if set(sparsity["weights"]) - set(training["trainable"]):
        raise CgcError("sparsity.weights: names a weight that does not train")


def _check_training(training: Mapping[str, Any], outputs: list[dict[str, Any]]) -> None:
    """The optimizer's settings are its own and in range; buffers fold outputs that exist."""
    optimizer = training["optimizer"]
    config = {k: v for k, v in optimizer.items() if k != "optimizer"}
    # the runtime reads every setting of its optimizer (the footprint, the learning rate)
    for name in optimizers.OPTIMIZERS[optimizer["optimizer"]].defaults:
        if name not in config:
            raise CgcError(f"training.optimizer.{name}: missing")
    try:
        optimizers.settings(optimizer["optimizer"], config)
    except ValueError as e:
        raise CgcError(f"training.optimizer: {e}") from None
    names = {spec["name"] for spec in outputs}
    for index, update in enumerate(training.get("buffers", [])):
        if update["output"] is not None and update["output"] not in names:
            raise CgcError(
                f"training.buffers[{index}].output: {shown(update['output'])} is not an output"
            )
