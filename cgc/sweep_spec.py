"""The spec of a design study (``cgc sweep SPEC.yaml``, ``cgc.sweep``): its YAML fields
checked, and the grid of points it asks for, each identified across runs by its parameters
and its model's bytes.

A generation's points (``measure: generation``) have three axes of their own, the prompt's
tokens, the new tokens and the sequences served at once (``prompt_len``, ``max_new_tokens``,
``concurrent``), None in another measure's points; a generation is timed dense (``sparsity``
0), its batch the sequences at once (``batch_size`` null)."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from cgc.errors import CgcError
from cgc.machine.hardware.target import MAX_BATCH, MAX_SYSTEMS, get_target, with_figures
from cgc.machine.program.mode import Mode
from cgc.options import MAX_TOKENS
from cgc.tools.paths import input_file, input_text

Row = dict[str, Any]
"""A point's parameters and its figures, as the table has them (JSON values only)."""

GENERATION = "generation"
MEASURES = ("training", "inference", GENERATION)
MODES = ("weight_streaming", "pipelined", "auto", Mode.WHOLE_WAFER.value)
SERVED = ("prompt_len", "max_new_tokens", "concurrent")
"""The axes of a generation's points alone: the prompt's tokens, the new tokens (a sequence's)
and the sequences served at once."""
FIELDS = ("models", "measure", "targets", "set", "mode", "sparsity", "batch_size", *SERVED,
          "num_csx")  # fmt: skip
"""The fields of a spec; all but ``models`` have defaults (``DEFAULTS``)."""
DEFAULTS: dict[str, Any] = {
    "measure": "training",
    "targets": ["wse2"],
    "set": [[]],
    "mode": ["weight_streaming"],
    "sparsity": [0],
    "batch_size": [None],
    "prompt_len": [1024],
    "max_new_tokens": [128],
    "concurrent": [1],
    "num_csx": [1],
}
MOST_POINTS = 10_000
"""Most points one spec asks for: a typing slip in an axis should not queue a month's work."""

PARAMETERS = ("model", "measure", "target", "set", "mode", "sparsity", "batch_size", *SERVED,
              "num_csx")  # fmt: skip
"""A point's parameters, outer axis first: its columns of the table."""
IDENTITY = ("source", "digest", *PARAMETERS[1:])
"""What identifies a point across runs (its key in the journal): its parameters, but the model
by what is read, not by the name the spec gives it."""


@dataclass(frozen=True)
class GridPoint:
    """One point of the grid: what to compile and simulate."""

    model: str
    """As the spec names it."""
    source: str
    """Where it is read from (an absolute path, or ``zoo:NAME``)."""
    digest: str
    """The SHA-256 of the file's bytes (empty for ``zoo:NAME``)."""
    measure: str
    target: str
    set: str
    """Target overrides, ``FIGURE=VALUE`` separated by spaces."""
    mode: str
    sparsity: float
    batch_size: int | None
    prompt_len: int | None
    """Of a generation's point alone, as ``max_new_tokens`` and ``concurrent``."""
    max_new_tokens: int | None
    concurrent: int | None
    num_csx: int

    def parameters(self) -> Row:
        """The point's columns of the table."""
        return {name: getattr(self, name) for name in PARAMETERS}

    def identity(self) -> Row:
        """The point's fields that ``key`` reads."""
        return {name: getattr(self, name) for name in IDENTITY}


def key(fields: Row) -> str:
    """The key of the point whose ``IDENTITY`` is in ``fields`` (a journal's line without
    them, from an older cgc, is the key of no point)."""
    return json.dumps([fields.get(name) for name in IDENTITY])


@dataclass(frozen=True)
class Spec:
    """A checked spec: the values of every axis, in the order given."""

    models: tuple[str, ...]
    sources: tuple[str, ...]
    digests: tuple[str, ...]
    measure: str
    targets: tuple[str, ...]
    set: tuple[str, ...]
    mode: tuple[str, ...]
    sparsity: tuple[float, ...]
    batch_size: tuple[int | None, ...]
    prompt_len: tuple[int | None, ...]
    """``(None,)`` but for a generation, as ``max_new_tokens`` and ``concurrent``."""
    max_new_tokens: tuple[int | None, ...]
    concurrent: tuple[int | None, ...]
    num_csx: tuple[int, ...]

    def points(self) -> list[GridPoint]:
        """The grid, models outermost and ``num_csx`` innermost (a series is contiguous)."""
        models = zip(self.models, self.sources, self.digests, strict=True)
        return [
            GridPoint(name, source, digest, self.measure, *values)
            for (name, source, digest), *values in itertools.product(models, *self.axes())
        ]

    def axes(self) -> list[tuple[Any, ...]]:
        """The values of each parameter but the model and the measure, in ``PARAMETERS``'
        order."""
        return [self.targets, self.set, self.mode, self.sparsity, self.batch_size,
                self.prompt_len, self.max_new_tokens, self.concurrent, self.num_csx]  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """The spec as the sweep's JSON records it."""
        data = asdict(self)
        del data["sources"], data["digests"]
        return data


def load_spec(path: str) -> Spec:
    """The spec in the YAML file at ``path``, checked: a bad field is a one-line CgcError
    naming the file, the field and the value."""
    text = input_text(path, "SPEC")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise CgcError(f"{path}: not YAML ({' '.join(str(error).split())})") from None
    except RecursionError:
        raise CgcError(f"{path}: not YAML we read (nested too deeply)") from None
    except ValueError as error:  # Python's own bound on the digits of an integer
        reason = str(error).split(";")[0]
        raise CgcError(f"{path}: not YAML we read ({reason})") from None
    if not isinstance(data, dict):
        raise CgcError(f"{path}: expected a mapping of the fields {', '.join(FIELDS)}")
    try:
        return _checked(data, Path(path).parent)
    except CgcError as error:
        raise CgcError(f"{path}: {error}") from None


def _checked(data: dict[Any, Any], base: Path) -> Spec:
    unknown = [name for name in data if name not in FIELDS]
    if unknown:
        raise CgcError(f"{unknown[0]}: not a field of a sweep (fields: {', '.join(FIELDS)})")
    if "models" not in data:
        raise CgcError("models: missing; give at least one model")
    given = {**DEFAULTS, **data}
    measure = given["measure"]
    if measure not in MEASURES:
        raise CgcError(f"measure: {_shown(measure)}: expected one of {', '.join(MEASURES)}")
    models = _axis(given, "models", _is_text, "a model name")
    targets = _axis(given, "targets", _is_text, "a target name")
    for name in targets:
        _field("targets", get_target, name)
    figures = _axis(given, "set", _is_assignments, "a list of FIGURE=VALUE")
    sets = [_overrides(assignments, targets) for assignments in figures]
    modes = _axis(given, "mode", lambda m: m in MODES, f"one of {', '.join(MODES)}")
    _check_modes(measure, modes)
    systems = _axis(given, "num_csx", _is_systems, f"a number of systems, 1 to {MAX_SYSTEMS}")
    levels = _axis(given, "sparsity", _is_level, "a fraction of zeros in [0, 1)")
    batches = _axis(given, "batch_size", _is_batch, f"a batch of 1 to {MAX_BATCH}, or null")
    prompts, news, concurrent = _served(data, given, measure, levels, batches)
    sources = tuple(_source(model, base, measure) for model in models)
    spec = Spec(
        models=tuple(models),
        sources=sources,
        digests=tuple(map(_digest, sources)),
        measure=measure,
        targets=tuple(targets),
        set=tuple(_distinct("set", sets)),
        mode=tuple(modes),
        sparsity=tuple(levels),
        batch_size=tuple(batches),
        prompt_len=tuple(prompts),
        max_new_tokens=tuple(news),
        concurrent=tuple(concurrent),
        num_csx=tuple(systems),
    )
    count = len(models) * math.prod(map(len, spec.axes()))
    if count > MOST_POINTS:
        raise CgcError(f"the grid has {count} points, more than a sweep of {MOST_POINTS}")
    return spec


def _check_modes(measure: str, modes: list[str]) -> None:
    """A CgcError for a mode that ``measure``'s points do not run in: a training step's is
    weight_streaming; whole_wafer is a generation's."""
    if measure == "training" and modes != ["weight_streaming"]:
        wrong = next(m for m in modes if m != "weight_streaming")
        raise CgcError(f"mode: {wrong}: a training step runs in weight_streaming mode")
    if measure != GENERATION and Mode.WHOLE_WAFER in modes:
        raise CgcError(f"mode: {Mode.WHOLE_WAFER}: serves a generation (measure: {GENERATION})")


def _served(
    data: dict[Any, Any], given: dict[Any, Any], measure: str, levels: list[Any], batches: list[Any]
) -> list[list[int | None]]:
    """The values of the axes ``SERVED``: a generation's, given or their defaults; ``[None]``
    each for another measure, which must not give them. A generation is timed dense, its
    batch the sequences at once: ``levels`` must be [0] and ``batches`` [None]."""
    if measure != GENERATION:
        for name in SERVED:
            if name in data:
                raise CgcError(f"{name}: applies to measure: {GENERATION} alone, not {measure}")
        return [[None]] * len(SERVED)
    if levels != [0]:
        wrong = next(v for v in levels if v != 0)
        raise CgcError(f"sparsity: {wrong}: a generation is timed dense (leave sparsity out)")
    if batches != [None]:
        wrong = next(v for v in batches if v is not None)
        raise CgcError(f"batch_size: {wrong}: a generation's batch is its concurrent sequences")
    tokens = f"a number of tokens, 1 to {MAX_TOKENS}"
    return [
        _axis(given, "prompt_len", _is_tokens, tokens),
        _axis(given, "max_new_tokens", _is_tokens, tokens),
        _axis(given, "concurrent", _is_tokens, f"a number of sequences, 1 to {MAX_TOKENS}"),
    ]


def _shown(value: object) -> str:
    """A value of the spec as YAML writes it."""
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def _axis(given: dict[Any, Any], name: str, ok: Callable[[Any], bool], what: str) -> list[Any]:
    """The values of the axis ``name`` (one value alone is an axis of one), each ``ok``."""
    values = given[name]
    values = values if isinstance(values, list) else [values]
    if not values:
        raise CgcError(f"{name}: []: give at least one value")
    for value in values:
        if not ok(value):
            raise CgcError(f"{name}: {_shown(value)}: expected {what}")
    return _distinct(name, values)


def _distinct(name: str, values: list[Any]) -> list[Any]:
    """``values``, unless one is given twice (a point would be simulated twice)."""
    repeated = [v for i, v in enumerate(values) if v in values[:i]]
    if repeated:
        raise CgcError(f"{name}: {_shown(repeated[0])} is given twice")
    return values


def _field(name: str, check: Callable[[Any], Any], value: Any) -> Any:
    """``check(value)``, its CgcError prefixed with the field's name."""
    try:
        return check(value)
    except CgcError as error:
        raise CgcError(f"{name}: {error}") from None


def _is_text(value: object) -> bool:
    return isinstance(value, str) and bool(value)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _is_systems(value: object) -> bool:
    return isinstance(value, int) and _is_count(value) and value <= MAX_SYSTEMS


def _is_tokens(value: object) -> bool:
    return isinstance(value, int) and _is_count(value) and value <= MAX_TOKENS


def _is_batch(value: object) -> bool:
    return value is None or (_is_count(value) and isinstance(value, int) and value <= MAX_BATCH)


def _is_level(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1


def _is_assignments(value: object) -> bool:
    """An override list: a list of ``FIGURE=VALUE`` strings, or one such string alone."""
    listed = value if isinstance(value, list) else [value]
    return all(isinstance(v, str) and "=" in v for v in listed)


def _overrides(assignments: str | list[str], targets: Sequence[str]) -> str:
    """An override list, normalised to ``FIGURE=VALUE`` separated by spaces in the order of
    the figures' names (one list in two orders is one point), if it makes a valid target of
    every one of ``targets``."""
    listed = assignments if isinstance(assignments, list) else [assignments]
    pairs = sorted((k.strip(), v.strip()) for k, _, v in (a.partition("=") for a in listed))
    names = [name for name, _ in pairs]
    twice = [name for i, name in enumerate(names) if name in names[:i]]
    if twice:
        raise CgcError(f"set: {twice[0]} is given twice in one list")
    normal = [f"{name}={value}" for name, value in pairs]
    for name in targets:
        try:
            with_figures(get_target(name), normal)
        except CgcError as error:
            raise CgcError(f"set: {str(error).removeprefix('--set ')}") from None
    return " ".join(normal)


def _source(model: str, base: Path, measure: str) -> str:
    """Where ``model`` is read from, once it is known to be readable: a params file or
    ``zoo:NAME`` is parsed now, an ONNX file found (its graph is read by its points; a
    generation reads none)."""
    from cgc.frontends.params import ZOO_PREFIX, is_params_source, load_params

    if model.startswith(ZOO_PREFIX):
        _field("models", load_params, model)
        return model
    path = str((base / model).resolve())
    if is_params_source(model):
        input_file(path, "models:")
        _field("models", load_params, path)
    elif model.lower().endswith(".onnx") and measure == GENERATION:
        raise CgcError(f"models: {model}: a generation reads params .yaml files and zoo:NAME")
    elif model.lower().endswith(".onnx"):
        input_file(path, "models:")
    else:
        raise CgcError(f"models: {model}: expected an .onnx file, a params .yaml file or zoo:NAME")
    return path


def _digest(source: str) -> str:
    """The SHA-256 of the bytes of the file at ``source``, empty for a zoo model (cgc's own,
    the same for a version of cgc, which the journal records)."""
    from cgc.frontends.params import ZOO_PREFIX

    if source.startswith(ZOO_PREFIX):
        return ""
    with open(source, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()
