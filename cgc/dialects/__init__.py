"""cgc's dialects: ``wse`` (tensor level, layers, placement) and ``ws`` (weight streaming)."""

from __future__ import annotations

from io import StringIO

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.dialects.func import Func
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import ParseError

from cgc.errors import CgcError


def context() -> Context:
    """A context with every dialect cgc's IR uses."""
    from cgc.dialects.ws import WS
    from cgc.dialects.wse import WSE

    ctx = Context()
    for dialect in (Builtin, Func, WSE, WS):
        ctx.load_dialect(dialect)
    return ctx


def print_module(module: ModuleOp) -> str:
    """MLIR text with the source locations (unknown ones left out)."""
    stream = StringIO()
    Printer(stream=stream, print_debuginfo=True).print_op(module)
    return stream.getvalue().replace(" loc(unknown)", "") + "\n"


def parse_module(text: str, source: str = "<text>") -> ModuleOp:
    """Parses and verifies MLIR text; problems become one-line errors naming the source."""
    try:
        module = Parser(context(), text, source).parse_module()
    except ParseError as e:
        first = str(e).strip().splitlines()[0]
        raise CgcError(f"{source}: {first}") from None
    verify(module, source)
    return module


def verify(module: ModuleOp, source: str) -> None:
    """Verifies ``module``; a failure becomes a one-line error."""
    from xdsl.utils.exceptions import VerifyException

    try:
        module.verify()
    except VerifyException as e:
        raise CgcError(f"{source}: invalid IR: {str(e).strip().splitlines()[0]}") from None
