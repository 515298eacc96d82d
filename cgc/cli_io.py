"""What the ``cgc`` commands share of their files and terminal: output paths checked before
any work, files written whole, the progress bar's terminal, warnings, and weights read from a
``.safetensors`` file."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TextIO

import click
import numpy as np

from cgc.errors import CgcError
from cgc.tools.paths import Named, distinct_files, input_file, output_file


def write_file(path: str, data: bytes | Iterable[bytes]) -> None:
    """Writes ``data`` to ``path`` whole (``cgc.files.write_atomically``)."""
    from cgc.files import write_atomically

    write_atomically(path, data)


def check_outputs(
    paths: dict[str, str | None],
    inputs: dict[str, str | None],
    files: Iterable[Named] = (),
    trees: Iterable[Named] = (),
) -> None:
    """Checks the output files of ``paths`` (option -> path, if given) before any work, and
    that none of them, nor of ``files`` (what an output directory gets), is one of the files
    ``inputs`` names or another output, nor replaces one of ``trees`` holding an input
    (``distinct_files``)."""
    for option, path in paths.items():
        if path is not None:
            output_file(path, option)
    distinct_files(inputs.items(), [*paths.items(), *files], trees)


def terminal() -> TextIO | None:
    """Standard output if it is a terminal (a progress bar's place)."""
    return sys.stdout if sys.stdout.isatty() else None


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file (``--weights``)."""
    from cgc.machine.program.artifact import weights_from_bytes

    try:
        return weights_from_bytes(input_file(path, "--weights").read_bytes())
    except ValueError as e:
        raise CgcError(f"--weights {path}: {e}") from None
