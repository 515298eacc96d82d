"""Options that several ``cgc`` commands share: the target, the weight-streaming plan and
the weights' sparsity."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from cgc.errors import CgcError
from cgc.machine.training.optimizers import KEYWORDS, OPTIMIZERS, SETTINGS

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


def plan_options(command: Callable) -> Callable:
    """The weight-streaming memory plan's and the weights' options."""
    return _options(
        command,
        (
            click.option(
                "--micro-batch-size",
                type=int,
                help="Samples per run of the program (default: the largest that fits).",
            ),
            click.option(
                "--recompute/--no-recompute",
                default=None,
                help="Recompute activations per transformer block (default: if faster).",
            ),
            click.option(
                "--no-weights",
                is_flag=True,
                help="Read an ONNX model's graph without its weights (timing-only artifact).",
            ),
            click.option(
                "--init-seed",
                type=click.IntRange(0, 2**63 - 1),
                help="Draw a params-file model's weights from this seed.",
            ),
        ),
    )


def sparsity_options(command: Callable) -> Callable:
    """``--sparsity``, ``--sparse-params`` and ``--sparsity-init``."""
    level = click.option(
        "--sparsity",
        type=float,
        help="Fraction of zeros of the sparse weights, e.g. 0.75 (0: dense).",
    )
    return _options(command, (level, *_which_sparse()))


def sparsity_levels_options(command: Callable) -> Callable:
    """``--sparsity`` as a list of levels, ``--sparse-params`` and ``--sparsity-init``."""
    levels = click.option(
        "--sparsity",
        "levels",
        help="Sparsity levels (fractions of zeros) to compare, e.g. 0,0.5,0.75,0.9,0.95.",
    )
    return _options(command, (levels, *_which_sparse()))


def _which_sparse() -> tuple[Callable, ...]:
    return (
        click.option(
            "--sparse-params",
            multiple=True,
            help="Regex over the sparse weights' names (repeatable).",
        ),
        click.option(
            "--sparsity-init",
            type=click.Choice(["random", "magnitude"]),
            default="random",
            show_default=True,
            help="Which values live: drawn from --seed, or the largest initial ones.",
        ),
    )


def dynamic_sparsity_options(command: Callable) -> Callable:
    """The settings of dynamic sparsity (``cgc.machine.sparse.sparsity``)."""
    return _options(
        command,
        (
            click.option("--sparsity-schedule", help="static, or dynamic: the masks move."),
            click.option("--sparsity-update-every", type=int, help="Steps per mask update [100]"),
            click.option("--sparsity-drop-fraction", type=float, help="Live share dropped [0.3]"),
            click.option("--sparsity-regrow", help="By gradient (RigL) or random (SET) [gradient]"),
            click.option("--sparsity-decay", help="Drop fraction constant or cosine [constant]"),
            click.option("--sparsity-end-step", type=int, help="Masks stop moving at this step."),
        ),
    )


def weights_options(command: Callable) -> Callable:
    """``--weights`` and ``--detect-sparsity``."""
    return _options(
        command,
        (
            click.option(
                "--weights", "weights_path", help="A .safetensors file of weights, by name."
            ),
            click.option(
                "--detect-sparsity",
                type=float,
                help="Weights with this fraction of zeros are sparse, their zeros dead.",
            ),
        ),
    )


def executor_options(command: Callable) -> Callable:
    """``--executor``, ``--ray-address`` and ``--ray-placement``: where a numeric run's
    systems run (``cgc.runtime.executors``)."""
    from cgc.runtime.executors import EXECUTORS, PLACEMENTS

    return _options(
        command,
        (
            click.option(
                "--executor",
                type=click.Choice(EXECUTORS),
                default="local",
                show_default=True,
                help="Run a numeric run's systems here, or each as a Ray actor (pip install "
                "'cgc[ray]'); timing-only runs stay here.",
            ),
            click.option(
                "--ray-address",
                help="The Ray cluster to join, e.g. auto  [default: a local instance]",
            ),
            click.option(
                "--ray-placement",
                type=click.Choice(PLACEMENTS),
                help="Keep the run's actors on few Ray nodes, or spread them over many  "
                "[default: pack]",
            ),
        ),
    )


def chosen_backend(options: dict) -> Backend:
    """The executor the options name (taken out of ``options``)."""
    from cgc.runtime.executors import Backend

    keys = ("executor", "ray_address", "ray_placement")
    return Backend(*(options.pop(key) for key in keys))


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


optimizer_choice = click.option(
    "--optimizer",
    type=click.Choice(list(OPTIMIZERS)),
    help="The optimizer MemoryX runs  [default: the params file's, or sgd]",
)


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
