"""The pass pipelines of the compile paths, as specs (``PIPELINES``), and how a request's
options are filled into them.

Every compile runs the ``front`` stage on the imported model, then the stage of its path:
``pipelined`` (placed on the wafer; after ``sparse`` when it is asked for a sparsity),
``whole_wafer`` (every layer on the whole wafer in turn: a generation's way of serving),
``weight_streaming`` (an inference streaming its weights), ``training`` or
``training_recomputing`` (a training, recomputing activations or not). A pass a request
configures (the rotary tables and attention masks the compile holds fixed, the sparse
weights, the weights a training trains, the optimizer) gets its options by ``stage_spec``;
the others run with their defaults. The specs a compile ran, joined by commas, are its
manifest's ``pipeline``, which ``cgc opt -p`` replays on the import's IR dump.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from xdsl.passes import ModulePass, PassPipeline, PassPipelineCallbackType
from xdsl.utils.arg_spec import parse_pipeline

from cgc.passes import all_passes

_FUSIONS = "fuse-rotary,fuse-attention"
_FRONT_REST = "decompose,fold-constants,channels-last,fold-constants,form-layers"

PIPELINES: dict[str, str] = {
    "front": f"{_FUSIONS},{_FRONT_REST}",
    "front_cached": f"{_FUSIONS},cache-keys-values,{_FRONT_REST}",
    "sparse": "select-sparse-weights",
    "pipelined": "fuse-epilogues,place-layers,route-tensors",
    "whole_wafer": "fuse-epilogues",
    "weight_streaming": "fuse-epilogues,schedule-streams",
    "training": "autodiff,fold-constants,schedule-streams",
    "training_recomputing": "autodiff,fold-constants,recompute-activations,schedule-streams",
}
"""The passes of each stage of a compile, without the options a request fills in."""


def stage_passes(stage: str) -> list[str]:
    """The names of the passes of ``stage``, in order."""
    return [spec.name for spec in parse_pipeline(PIPELINES[stage])]


def stage_spec(stage: str, *configured: ModulePass) -> str:
    """The spec of ``stage`` with the options of ``configured``: passes of the stage, each
    named once in it, that take the place of their names."""
    names = stage_passes(stage)
    specs = {p.name: pass_spec(p) for p in configured}
    assert all(names.count(name) == 1 for name in specs), (stage, list(specs))
    return ",".join(specs.get(name, name) for name in names)


def pass_registry() -> dict[str, Callable[[], type[ModulePass]]]:
    """cgc's passes by name, as xDSL's pipeline parser takes them."""
    return {name: _given(cls) for name, cls in all_passes().items()}


def _given(cls: type[ModulePass]) -> Callable[[], type[ModulePass]]:
    return lambda: cls


def pipeline(spec: str, callback: PassPipelineCallbackType | None = None) -> PassPipeline:
    """The pipeline of ``spec`` (cgc's passes), calling ``callback`` before, between and after
    its passes."""
    return PassPipeline.parse_spec(pass_registry(), spec, callback)


def pass_spec(p: ModulePass) -> str:
    """``name{option=value ...}`` with only the options that differ from their defaults,
    written so that xDSL's pipeline parser reads them back: strings quoted and escaped
    (xDSL's own ``ArgSpec`` printing escapes nothing), floats with a decimal point."""
    args = []
    for f in dataclasses.fields(p):
        value = getattr(p, f.name)
        if value != f.default:
            args.append(f"{f.name}={_spec_value(value)}")
    return p.name + ("{" + " ".join(args) + "}" if args else "")


def _spec_value(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(_spec_value(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float):
        mantissa, exponent, power = repr(value).partition("e")
        # the parser reads an exponent only after a decimal point (1e-05 is a name to it)
        if exponent and "." not in mantissa:
            return f"{mantissa}.0e{power}"
    return repr(value)
