"""``cgc opt`` on xDSL's opt main: parses cgc IR, runs a pipeline of cgc's passes
(``cgc.compiler.pipelines``) over it and prints the result, a case at a time with
``--split-input-file``; with ``--verify-diagnostics`` an error is printed in place of its
case's output instead of ending the run."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException
from xdsl.utils.target import Target as OutputTarget
from xdsl.xdsl_opt_main import xDSLOptMain

from cgc.compiler.pipelines import pass_registry, pipeline
from cgc.dialects import context, parse_module, print_module, verify
from cgc.dialects.ir import set_module_target
from cgc.errors import CgcError
from cgc.machine.hardware.target import Target


@dataclass(frozen=True)
class CgcIR(OutputTarget):
    """cgc's IR as cgc prints it (``print_module``): custom forms, no unknown locations."""

    name = "cgc-ir"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        output.write(print_module(module))


SPLIT_MARKER = "// -----"
"""The line that separates the cases of a file read with ``--split-input-file``."""


class CgcOptMain(xDSLOptMain):
    """xDSL's opt main with cgc's dialects and passes, reading ``text`` (the file ``source``)
    as cgc IR and printing it as cgc does; ``target``, if any, is recorded in every module
    before the passes run. Its errors are ``CgcError``s (one line, naming the file)."""

    def __init__(self, text: str, source: str, target: Target | None, args: list[str]):
        self.text = text
        self.source = source
        self.target = target
        super().__init__("cgc opt", args)

    def register_all_dialects(self) -> None:
        self.ctx = context()

    def register_all_passes(self) -> None:
        for name, factory in pass_registry().items():
            self.register_pass(name, factory)

    def register_all_targets(self) -> None:
        self.available_targets[CgcIR.name] = lambda: CgcIR

    def setup_pipeline(self) -> None:
        spec = self.args.passes
        try:
            self.pipeline = pipeline(spec, self._verified)
        except (ArgSpecParseError, ValueError) as e:
            known = ", ".join(sorted(self.available_passes))
            raise CgcError(f"-p {spec}: {_pipeline_error(e)} (passes: {known})") from None

    def _verified(
        self, done: ModulePass | None, module: ModuleOp, following: ModulePass | None
    ) -> None:
        """Verifies the module after each pass (the parser verified it before the first)."""
        if done is not None:
            verify(module, f"{self.source} after {done.name}")

    def get_input_stream(self) -> tuple[IO[bytes], str]:
        return io.BytesIO(self.text.encode()), "mlir"

    def prepare_input(self) -> tuple[list[tuple[IO[bytes], int]], str]:
        if not self.args.split_input_file:
            return super().prepare_input()
        # xDSL splits wherever the marker stands, also in a comment that quotes it (a
        # FileCheck line expecting it in the output): cases end at lines of the marker alone
        lines = self.text.splitlines(keepends=True)
        markers = [n for n, line in enumerate(lines) if line.strip() == SPLIT_MARKER]
        bounds = zip([-1, *markers], [*markers, len(lines)], strict=True)
        cases: list[tuple[IO[bytes], int]] = [
            (io.BytesIO("".join(lines[a + 1 : b]).encode()), a + 1) for a, b in bounds
        ]
        return cases, "mlir"

    def parse_chunk(
        self, chunk: IO[bytes], file_extension: str, start_offset: int = 0
    ) -> ModuleOp | None:
        # a case is padded to its place in the file, so that its messages give the file's lines
        text = "\n" * start_offset + chunk.read().decode()
        with self._diagnosed():
            return parse_module(text, self.source)

    def apply_passes(self, prog: ModuleOp) -> None:
        if self.target is not None:
            set_module_target(prog, self.target)
        with self._diagnosed():
            super().apply_passes(prog)

    @contextlib.contextmanager
    def _diagnosed(self) -> Iterator[None]:
        """With ``--verify-diagnostics``, a CgcError becomes the diagnostic xDSL's run prints
        as its case's output."""
        try:
            yield
        except CgcError as e:
            if not self.args.verify_diagnostics:
                raise
            raise DiagnosticException(f"error: {e}") from None


def _pipeline_error(error: BaseException) -> str:
    """xDSL's multi-line pipeline error as one line: the column, then the complaint."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    position = next((line for line in lines if line.startswith("pass-pipeline:")), None)
    column = f"column {position.rsplit(':', 1)[-1]}: " if position else ""
    return column + lines[-1]


def optimized(
    text: str,
    source: str,
    spec: str,
    target: Target | None = None,
    split_input_file: bool = False,
    verify_diagnostics: bool = False,
) -> str:
    """What ``cgc opt`` prints for ``text`` (the file ``source``) after the pipeline ``spec``."""
    args = [f"--passes={spec}", f"--target={CgcIR.name}"]
    args += ["--split-input-file"] * split_input_file
    args += ["--verify-diagnostics"] * verify_diagnostics
    output = io.StringIO()
    with contextlib.redirect_stdout(output):  # the results and the diagnostics alike
        CgcOptMain(text, source, target, args).run()
    return output.getvalue()
