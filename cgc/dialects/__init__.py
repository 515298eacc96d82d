"""cgc's dialects: ``wse`` (tensor level, layers, placement) and ``ws`` (weight streaming)."""

from __future__ import annotations

from dataclasses import dataclass, field
from io import StringIO

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.dialects.func import Func
from xdsl.ir import Attribute, Operation, TypeAttribute
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import ParseError, VerifyException

from cgc.dialects.wse import location_name
from cgc.errors import CgcError


def context() -> Context:
    """A context with every dialect cgc's IR uses."""
    from cgc.dialects.ws import WS
    from cgc.dialects.wse import WSE

    ctx = Context()
    for dialect in (Builtin, Func, WSE, WS):
        ctx.load_dialect(dialect)
    return ctx


@dataclass(eq=False, repr=False)
class _TypeCachingPrinter(Printer):
    """Prints each type once and reuses its text: a large module repeats a few types many
    thousand times, and types print the same wherever they stand."""

    _types: dict[Attribute, str] = field(default_factory=dict, init=False)

    def print_attribute(self, attribute: Attribute) -> None:
        if not isinstance(attribute, TypeAttribute):
            super().print_attribute(attribute)
            return
        text = self._types.get(attribute)
        if text is None:
            stream = StringIO()
            Printer(stream=stream).print_attribute(attribute)
            text = self._types[attribute] = stream.getvalue()
        self.print_string(text)


def print_module(module: ModuleOp) -> str:
    """MLIR text with the source locations (unknown ones left out)."""
    stream = StringIO()
    _TypeCachingPrinter(stream=stream, print_debuginfo=True).print_op(module)
    return stream.getvalue().replace(" loc(unknown)", "") + "\n"


def parse_module(text: str, source: str = "<text>") -> ModuleOp:
    """Parses and verifies MLIR text; problems become one-line errors naming the source
    position, or the op and its location."""
    try:
        module = Parser(context(), text, source).parse_module()
    except ParseError as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        raise CgcError(f"{lines[0]}: {lines[-1].strip()}") from None
    except VerifyException as e:
        raise CgcError(f"{source}: {_first_line(e)}") from None
    verify(module, source)
    return module


def verify(module: ModuleOp, source: str) -> None:
    """Verifies ``module``; a failure becomes a one-line error naming the op that broke a
    rule and the source node it came from."""
    try:
        module.verify()
    except VerifyException as e:
        culprit = _failing_op(module)
        where = ""
        if culprit is not None:
            name = location_name(culprit)
            where = f"{culprit.name}" + (f" (node {name})" if name else "") + ": "
        raise CgcError(f"{source}: invalid IR: {where}{_first_line(e)}") from None


def _failing_op(module: ModuleOp) -> Operation | None:
    """The first op, in program order, that fails its own checks."""
    for op in module.walk():
        try:
            op.verify(verify_nested_ops=False)
        except VerifyException:
            return op
    return None


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0]
