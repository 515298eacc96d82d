"""Options that several ``cgc`` commands share: the target, the weight-streaming plan, the
weights' sparsity, the executor and the optimizer. Those that set a field of a record of
``cgc.options`` are made from the record (``record_option``), so a field's flag, type,
default and help are written once, there."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from cgc.errors import CgcError
from cgc.machine.sparse.sparsity import DYNAMIC as DYNAMIC_SETTINGS
from cgc.machine.training.optimizers import KEYWORDS, OPTIMIZERS, SETTINGS
from cgc.options import (
    Chosen,
    CompileOptions,
    Options,
    SimulationOptions,
    SparsityOptions,
    TrainingOptions,
    flag,
)

if TYPE_CHECKING:
    from cgc.runtime.executors import Backend

MESH = re.compile(r"(\d+)x(\d+)")
"""A mesh size, ``--mesh ROWSxCOLS``."""


def _options(command: Callable, options: tuple[Callable, ...]) -> Callable:
    for option in reversed(options):
        command = option(command)
    return command


def target_options(command: Callable) -> Callable:
    """``--target``, ``--mesh`` and ``--set``."""
    return _options(
        command,
        (
            click.option(
                "--target", default="wse2", show_default=True, help="wse2, wse3 or meshRxC."
            ),
            click.option("--mesh", help="Override the target's mesh size, ROWSxCOLS."),
            click.option(
                "--set",
                "figures",
                multiple=True,
                metavar="FIGURE=VALUE",
                help="Change a figure of the target, e.g. memoryx_bytes_per_s=3e11 (repeatable).",
            ),
        ),
    )


def target_name(target: str, mesh: str | None) -> str:
    """The target ``--target`` names, its mesh resized by ``--mesh``."""
    if mesh is None:
        return target
    if MESH.fullmatch(mesh) is None:
        raise CgcError(f"--mesh {mesh}: expected ROWSxCOLS, e.g. 16x16")
    return f"{target}@{mesh}"


def targeted(target: str, mesh: str | None, figures: tuple[str, ...]):
    """The target named by ``--target``/``--mesh`` with ``--set`` figures changed."""
    from cgc.machine.hardware.target import get_target, with_figures

    chosen = get_target(target_name(target, mesh))
    return with_figures(chosen, figures) if figures else chosen


def record_option(kind: type[Options], name: str) -> Callable[[Callable], Callable]:
    """The command-line option of the field ``name`` of the record ``kind``, as its
    ``Option`` describes it (``cgc.options``)."""
    field = next(f for f in dataclasses.fields(kind) if f.name == name)
    how = kind.option_of(name)
    spelled = flag(name)
    if how.kind is bool:
        if field.default is None:  # on, off or the compiler's choice
            return click.option(f"{spelled}/--no-{spelled[2:]}", default=None, help=how.help)
        return click.option(spelled, is_flag=True, help=how.help)
    chosen: Any = how.kind
    if how.choices:
        chosen = click.Choice(list(how.choices))
    # a number out of its bounds is the record's to refuse, in one line naming the flag
    given: dict[str, Any] = {"multiple": True} if field.default == () else {}
    if field.default not in (None, ()):  # click's own default otherwise: None, or () if multiple
        given["default"] = field.default
    if how.show_default:
        given["show_default"] = True
    return click.option(spelled, name, type=chosen, help=how.help, **given)


def record_options(kind: type[Options], *names: str) -> Callable[[Callable], Callable]:
    """The command-line options of the fields ``names`` of the record ``kind``, in order."""
    return lambda command: _options(command, tuple(record_option(kind, n) for n in names))


def chosen_records(params: dict, *kinds: type[Options]) -> Chosen:
    """The records of ``kinds`` from a command's parameters, taken out of ``params``: those
    named as a field of one of them, and the optimizer's settings."""
    names = {name for kind in kinds for name in kind.names()}
    if TrainingOptions in kinds:
        names |= set(KEYWORDS)
    fields = {name: params.pop(name) for name in list(params) if name in names}
    return Chosen("cgc", kinds, (), {k: v for k, v in fields.items() if v is not None})


plan_options = record_options(
    CompileOptions, "micro_batch_size", "recompute", "no_weights", "init_seed"
)
"""The weight-streaming memory plan's and the weights' options."""
SPARSE = ("sparse_params", "sparsity_init")
"""Which weights are sparse and which of their values live."""
sparsity_options = record_options(SparsityOptions, "sparsity", *SPARSE)
DYNAMIC = tuple(f"sparsity_{setting}" for setting in ("schedule", *DYNAMIC_SETTINGS))
dynamic_sparsity_options = record_options(SparsityOptions, *DYNAMIC)
"""The settings of dynamic sparsity (``cgc.machine.sparse.sparsity``)."""


def sparsity_levels_options(command: Callable) -> Callable:
    """``--sparsity`` as a list of levels, ``--sparse-params`` and ``--sparsity-init``."""
    levels = click.option(
        "--sparsity",
        "levels",
        help="Sparsity levels (fractions of zeros) to compare, e.g. 0,0.5,0.75,0.9,0.95.",
    )
    return _options(command, (levels, *(record_option(SparsityOptions, n) for n in SPARSE)))


def weights_options(command: Callable) -> Callable:
    """``--weights`` and ``--detect-sparsity``."""
    weights = click.option(
        "--weights", "weights_path", help="A .safetensors file of weights, by name."
    )
    return _options(command, (weights, record_option(SparsityOptions, "detect_sparsity")))


EXECUTOR = ("executor", "ray_address", "ray_placement")
"""The fields of ``SimulationOptions`` that say where a numeric run's systems run
(``cgc.runtime.executors``)."""
executor_options = record_options(SimulationOptions, *EXECUTOR)


def chosen_backend(options: dict) -> Backend:
    """The executor the options name (taken out of ``options``)."""
    from cgc.runtime.executors import Backend

    return Backend.of(SimulationOptions(**{name: options.pop(name) for name in EXECUTOR}))


def _defaults(names: tuple[str, ...]) -> str:
    """torch.optim's defaults of the settings ``names`` across the optimizers that have them:
    the most common, then the others by optimizer."""
    values = {
        name: ",".join(f"{o.defaults[n]:g}" for n in names)
        for name, o in OPTIMIZERS.items()
        if names[0] in o.defaults
    }
    common = max(values.values(), key=list(values.values()).count)
    others = [f"{name}: {v}" for name, v in values.items() if v != common]
    return "; ".join([common, *others])


optimizer_choice = record_option(TrainingOptions, "optimizer")


def optimizer_options(command: Callable) -> Callable:
    """The optimizer's settings as options of ``command``, one per keyword of the table
    (``cgc.machine.training.optimizers``); an option not given leaves the optimizer's default."""
    for keyword, names in reversed(KEYWORDS.items()):
        setting = SETTINGS[names[0]]
        option = "--" + keyword.replace("_", "-")
        if setting.flag:
            command = click.option(option, is_flag=True, default=None, help=setting.help)(command)
            continue
        helps = " ".join(SETTINGS[n].help for n in names)
        shape = f" As {','.join(n.upper() for n in names)}." if len(names) > 1 else ""
        text = f"{helps}{shape}  [default: {_defaults(names)}]"
        kind = str if len(names) > 1 else float
        command = click.option(option, keyword, type=kind, help=text)(command)
    return command


def chosen_settings(options: dict) -> dict:
    """The optimizer settings given on the command line, as the API's keywords take them."""
    chosen = {}
    for keyword, value in options.items():
        if value is not None and len(KEYWORDS[keyword]) > 1:
            try:
                value = tuple(float(part) for part in value.split(","))
            except ValueError:
                raise CgcError(f"--{keyword} {value}: expected numbers, e.g. 0.9,0.999") from None
        chosen[keyword] = value
    return chosen
