"""What a compile shows of its steps: the IR after each (``--dump-ir``,
``--print-ir-after-all``) and each step as it begins (a progress bar). The compilation's
pipeline callback (``cgc.compiler.driver``) tells them of every pass."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from xdsl.dialects.builtin import ModuleOp

from cgc.dialects import print_module
from cgc.errors import CgcError
from cgc.files import write_atomically


class IRDumps:
    """Writes ``NN-<pass>.mlir`` after every step and/or echoes the IR."""

    def __init__(self, directory: str | os.PathLike | None, echo: Callable[[str], None] | None):
        self.directory = Path(directory) if directory is not None else None
        self.echo = echo
        self.count = 0
        if self.directory is not None:
            if self.directory.exists() and not self.directory.is_dir():
                raise CgcError(f"--dump-ir {self.directory}: exists and is not a directory")
            self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def active(self) -> bool:
        """Whether anyone reads the IR between passes."""
        return self.directory is not None or self.echo is not None

    def __call__(self, step: str, module: ModuleOp) -> None:
        if not self.active:
            return
        text = print_module(module)
        if self.directory is not None:
            write_atomically(self.directory / f"{self.count:02d}-{step}.mlir", text.encode())
        if self.echo is not None:
            self.echo(f"// -----// IR Dump After {step} //----- //\n{text}")
        self.count += 1


OnPass = Callable[[int, int, str], None]
"""Told of each step of a compile as it begins: its number, how many the compilation has (0
while the model is imported: the passes are chosen after it) and its name."""


class Steps:
    """Counts the steps of one compilation (its import, its passes, its lowering) for
    ``on_pass``; ``context`` follows every name (which memory-plan trial it is)."""

    def __init__(self, on_pass: OnPass | None, context: str = ""):
        self.on_pass = on_pass
        self.context = context
        self.number = 0
        self.total = 0

    def expect(self, passes: int) -> None:
        """The compilation runs ``passes`` more passes, then its lowering."""
        self.total = self.number + passes + 1

    def begin(self, name: str) -> None:
        """Step ``name`` begins."""
        self.number += 1
        if self.on_pass is not None:
            total = max(self.total, self.number) if self.total else 0
            self.on_pass(self.number, total, name + self.context)
