"""The PyTorch frontend: a ``torch.nn.Module`` (or a ``torch.export.ExportedProgram``) to a
``func.func @main`` of ``wse`` ops, without ONNX on the way.

``capture`` runs ``torch.export`` (with a symbolic batch on axis 0 of every input where
``dynamic_batch`` asks for it) and decomposes the program to the core ATen opset;
``import_program`` lowers it at a batch size (``lowering.Lowering``). The op lowerings live in
one module per op family, as the ONNX frontend's do: ``elementwise``, ``linear``, ``shapes``,
``normalization``.

Importing this package imports torch; ``cgc`` imports it only when it is handed a module.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import re
import runpy
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.export import Dim, ExportedProgram
from torch.utils import _pytree as pytree

from cgc.errors import CgcError
from cgc.frontends.imported import ImportedModel
from cgc.frontends.torch import (
    attention,
    elementwise,
    indexing,
    linear,
    loss,
    normalization,
    shapes,
)
from cgc.frontends.torch.lowering import ATEN, Lowering, size_hint

__all__ = [
    "ALWAYS_WHOLE",
    "ATEN",
    "attention",
    "capture",
    "elementwise",
    "example_batch",
    "from_factory",
    "import_program",
    "indexing",
    "linear",
    "loss",
    "normalization",
    "shapes",
]


ALWAYS_WHOLE = ("aten.linear.default", "aten.scaled_dot_product_attention.default")
"""Ops ``capture`` never decomposes: a linear layer on a tensor of any rank is one matrix
product, where its decomposition flattens the rows into a matrix and back, moving the data
twice (ONNX's exporters keep it a MatMul too); PyTorch's attention is ``wse.attention``
(``cgc.frontends.torch.attention``), where its decomposition spells it out and, on a
symbolic batch, fails to."""


def capture(
    model: torch.nn.Module | ExportedProgram,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    dynamic_batch: bool = True,
    kept_whole: Sequence[str] = (),
) -> ExportedProgram:
    """``model`` exported with ``torch.export`` and decomposed to core ATen: an
    ``ExportedProgram`` as it is (decomposed), a module captured on the example ``args`` and
    ``kwargs``. The ops ``kept_whole`` (``aten.nll_loss_forward.default``) are not
    decomposed. A problem torch reports is a one-line CgcError with torch's reason."""
    if isinstance(model, ExportedProgram):
        program = model
    elif isinstance(model, torch.nn.Module):
        args, kwargs = _distinct(tuple(args), dict(kwargs or {}))
        shapes = _batch_dims(model, args, kwargs) if dynamic_batch else None
        try:
            with _quiet_torch():
                program = torch.export.export(model, args, kwargs, dynamic_shapes=shapes)
        except Exception as e:  # torch raises many kinds; every one is the user's model
            message = f"torch.export cannot capture {type(model).__name__}: {_reason(e)}"
            raise CgcError(message) from None
    else:
        raise CgcError(
            f"expected a torch.nn.Module or torch.export.ExportedProgram, got "
            f"{type(model).__name__}"
        )
    table = torch.export.default_decompositions()
    for op in [op for op in table if str(op) in (*ALWAYS_WHOLE, *kept_whole)]:
        del table[op]
    try:
        with _quiet_torch():
            return program.run_decompositions(table)
    except Exception as e:
        message = f"torch cannot decompose the program to core ATen: {_reason(e)}"
        raise CgcError(message) from None


FACTORY = re.compile(r"^(?P<path>.+\.py):(?P<name>[A-Za-z_][A-Za-z0-9_]*)$")
"""``path/to/file.py:factory``: a Python file and the function in it that returns a module
and its example inputs."""


def from_factory(spec: str, dynamic_batch: bool = True) -> ExportedProgram:
    """The program of the module that ``file.py:factory`` returns with its example inputs:
    ``(module, args)`` or ``(module, args, kwargs)``."""
    module, args, kwargs = made_by_factory(spec)
    return capture(module, args, kwargs, dynamic_batch)


def made_by_factory(
    spec: str,
) -> tuple[torch.nn.Module, tuple[Any, ...] | list[Any], dict[str, Any] | None]:
    """The module that ``file.py:factory`` returns, its example arguments and keyword
    arguments (None if it gives none)."""
    match = FACTORY.match(spec)
    assert match is not None
    path, name = Path(match["path"]), match["name"]
    if not path.is_file():
        raise CgcError(f"{path}: no such file")
    try:
        namespace = runpy.run_path(str(path))
    except (Exception, SystemExit, KeyboardInterrupt) as e:
        raise CgcError(f"{path}: running it failed: {_raised(e)}") from None
    factory = namespace.get(name)
    if not callable(factory):
        raise CgcError(f"{path}: no function '{name}'")
    try:
        made = factory()
    except (Exception, SystemExit, KeyboardInterrupt) as e:
        raise CgcError(f"{spec}: {_raised(e)}") from None
    if (
        not isinstance(made, tuple)
        or len(made) not in (2, 3)
        or not isinstance(made[0], torch.nn.Module)
        or not isinstance(made[1], tuple | list)
    ):
        raise CgcError(
            f"{spec}: expected it to return (module, args) or (module, args, kwargs), got "
            f"{type(made).__name__}"
        )
    return made[0], made[1], made[2] if len(made) == 3 else None


def import_program(
    program: ExportedProgram,
    batch_size: int | None = None,
    source: str = "<torch>",
    training: bool = False,
) -> ImportedModel:
    """The WSE IR of an exported program, its symbolic batch bound to ``batch_size`` (None:
    the example's); ``training`` keeps the buffer updates a training step makes."""
    return Lowering(program, batch_size, source, training).run()


def _distinct(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The example inputs with every tensor given more than once copied after its first
    place. ``torch.export`` makes one input of a tensor object passed twice (``forward(x, y)``
    captured on ``(t, t)`` computes with ``y`` alone, pytorch/pytorch#144683), while the
    compiled program takes an input per parameter, which a run may feed different values."""
    seen: set[int] = set()

    def once(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) in seen:
            return tensor.clone()
        seen.add(id(tensor))
        return tensor

    distinct: tuple[tuple, dict] = pytree.tree_map_only(torch.Tensor, once, (args, kwargs))
    return distinct


def _batch_dims(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """``dynamic_shapes`` making axis 0 of every tensor input one symbolic batch, by the
    names of ``model.forward``'s parameters."""
    batch = Dim("batch")
    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as e:
        message = f"the example inputs do not fit {type(model).__name__}.forward: {e}"
        raise CgcError(message) from None

    def spec(value: Any) -> Any:
        if isinstance(value, tuple):  # a *args parameter
            return tuple(spec(v) for v in value)
        return {0: batch} if isinstance(value, torch.Tensor) and value.dim() > 0 else None

    return {name: spec(value) for name, value in bound.arguments.items()}


def example_batch(program: ExportedProgram) -> int | None:
    """The example batch of a program captured with a symbolic batch; None without one."""
    for node in program.graph.nodes:
        value = node.meta.get("val")
        if node.op == "placeholder" and isinstance(value, torch.Tensor) and value.dim():
            size = value.shape[0]
            if not isinstance(size, int):
                return size_hint(size)
    return None


def _raised(error: BaseException) -> str:
    """What a user's code raised, in a line: a ``sys.exit`` (even ``sys.exit(0)``, which
    returns no module) or an interrupt ends the factory, not cgc."""
    if isinstance(error, SystemExit):
        return f"it called sys.exit({error.code!r}) instead of returning a module"
    if isinstance(error, KeyboardInterrupt):
        return "it was interrupted (KeyboardInterrupt) before returning a module"
    return f"{type(error).__name__}: {_reason(error)}"


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """torch's log lines, warnings and what it prints silenced while it exports: a model it
    cannot capture is one line of cgc's, not pages of torch's guards and partial graphs (which
    ``torch.export`` prints to stderr itself) before it."""
    previous = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _reason(error: BaseException) -> str:
    """The first line of what torch says, without its advice."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__
