"""Element types, small IR helpers and the attributes of the ``wse`` dialect.

The element types cgc computes with map one to one onto numpy dtypes (``NUMPY_DTYPES``); the
helpers read the static shape and element type of a tensor value, build dense and
``array<i64: ...>`` attributes, and check what the op verifiers of every family check. The
attributes describe where things are on the machine: ``#wse.rect`` (a rectangle of PEs),
``#wse.route`` (how a tensor reaches a layer) and ``#wse.target`` (the whole machine).

Nothing here imports another module of the package: every op family builds on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeAlias

import numpy as np
from xdsl.dialects.builtin import (
    AnyFloat,
    ArrayAttr,
    BytesAttr,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    Float4E2M1FNType,
    Float8E4M3FNType,
    Float8E4M3FNUZType,
    Float8E5M2FNUZType,
    Float8E5M2Type,
    Float8E8M0FNUType,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    IntegerType,
    NameLoc,
    Signedness,
    StringAttr,
    TensorType,
    UnitAttr,
    bf16,
    f16,
    f32,
    f64,
    i1,
    i8,
    i16,
    i32,
    i64,
)
from xdsl.ir import Attribute, Data, Operation, ParametrizedAttribute, SSAValue
from xdsl.irdl import IRDLOperation, irdl_attr_definition, param_def
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from cgc.errors import CgcError
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import Target, target_from_figures

# ---------------------------------------------------------------------------------------------
# Element types and tensors
# ---------------------------------------------------------------------------------------------


def _unsigned(width: int) -> IntegerType:
    return IntegerType(width, Signedness.UNSIGNED)


ElementType: TypeAlias = IntegerType | AnyFloat
"""The kinds of element type cgc computes with: integers (bools among them) and floats."""

NUMPY_DTYPES: dict[ElementType, str] = {
    f64: "float64",
    f32: "float32",
    f16: "float16",
    bf16: "bfloat16",
    Float8E4M3FNType(): "float8_e4m3fn",
    Float8E4M3FNUZType(): "float8_e4m3fnuz",
    Float8E5M2Type(): "float8_e5m2",
    Float8E5M2FNUZType(): "float8_e5m2fnuz",
    Float8E8M0FNUType(): "float8_e8m0fnu",
    Float4E2M1FNType(): "float4_e2m1fn",
    i64: "int64",
    i32: "int32",
    i16: "int16",
    i8: "int8",
    IntegerType(4): "int4",
    IntegerType(2): "int2",
    _unsigned(64): "uint64",
    _unsigned(32): "uint32",
    _unsigned(16): "uint16",
    _unsigned(8): "uint8",
    _unsigned(4): "uint4",
    _unsigned(2): "uint2",
    i1: "bool",
}
"""numpy dtype names of the element types cgc computes with."""
_ELEMENTS = {name: element for element, name in NUMPY_DTYPES.items()}


def numpy_dtype(element: Attribute) -> str:
    """The numpy dtype name of an element type."""
    if isinstance(element, ElementType) and element in NUMPY_DTYPES:
        return NUMPY_DTYPES[element]
    raise ValueError(f"element type {element} is not supported")


def element_of_numpy(dtype: str | np.dtype) -> ElementType:
    """The element type of a numpy dtype."""
    name = dtypes.dtype(dtype).name
    try:
        return _ELEMENTS[name]
    except KeyError:
        raise ValueError(f"dtype {name} is not supported") from None


def dense_attr(array: np.ndarray) -> DenseIntOrFPElementsAttr:
    """A dense elements attribute holding ``array`` (built from its bytes, not element-wise)."""
    array = np.asarray(array)
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return DenseIntOrFPElementsAttr(
        TensorType(element_of_numpy(array.dtype), array.shape), BytesAttr(data)
    )


def tensor_shape(value: SSAValue | Attribute) -> tuple[int, ...]:
    """The static shape of a tensor-typed value or type."""
    ty = value.type if isinstance(value, SSAValue) else value
    assert isinstance(ty, TensorType)
    return tuple(ty.get_shape())


def element_type(value: SSAValue | Attribute) -> Attribute:
    """The element type of a tensor-typed value or type."""
    ty = value.type if isinstance(value, SSAValue) else value
    assert isinstance(ty, TensorType)
    return ty.get_element_type()


def i64_array(values: Sequence[int]) -> DenseArrayBase:
    """An ``array<i64: ...>`` attribute."""
    return DenseArrayBase.from_list(i64, [int(v) for v in values])


def check(condition: bool, message: str) -> None:
    """A verifier's rule: ``message`` is the VerifyException unless ``condition`` holds."""
    if not condition:
        raise VerifyException(message)


def shape_rule(rule: Callable[..., Any], *args: object) -> tuple[int, ...]:
    """Runs a ``cgc.dialects.shapes`` rule, turning its ValueError into a VerifyException."""
    try:
        return rule(*args)
    except ValueError as e:
        raise VerifyException(str(e)) from e


def check_element(value: SSAValue, expected: Attribute, what: str) -> None:
    """The rule that ``value`` (``what``) has ``expected`` element type."""
    check(element_type(value) == expected, f"{what} must have element type {expected}")


def check_result_shape(op: IRDLOperation, expected: Sequence[int]) -> None:
    """The rule that ``op``'s result has the shape its operands imply."""
    got = tensor_shape(op.results[0])
    check(
        got == tuple(expected),
        f"{op.name} result shape {got} does not match the inferred shape {tuple(expected)}",
    )


# ---------------------------------------------------------------------------------------------
# Attributes
# ---------------------------------------------------------------------------------------------


@irdl_attr_definition
class RouteAttr(ParametrizedAttribute):
    """``#wse.route<"SOURCE", color C, lanes L, wavelets N, busiest B, hops H, path [...]>``:
    how a tensor that layer SOURCE computes reaches the layer that carries this attribute.

    The tensor crosses the mesh on ``L`` parallel lanes, each a dimension-ordered path of
    links, all on color ``C``; ``N`` wavelets per run of the per-system batch in all. ``B``
    is the load of the busiest link any lane uses, counting every route that shares it (a
    link moves one wavelet per cycle, so the consumer cannot take a batch in fewer than ``B``
    cycles); ``H`` the hops of the longest lane. ``path`` lists the PEs where the first lane
    starts, turns and ends as ``x, y`` pairs.
    """

    name = "wse.route"
    source: StringAttr
    color: IntAttr = param_def(converter=IntAttr.get)
    lanes: IntAttr = param_def(converter=IntAttr.get)
    wavelets: IntAttr = param_def(converter=IntAttr.get)
    busiest: IntAttr = param_def(converter=IntAttr.get)
    hops: IntAttr = param_def(converter=IntAttr.get)
    path: ArrayAttr[IntAttr]

    FIELDS: ClassVar[tuple[str, ...]] = ("color", "lanes", "wavelets", "busiest", "hops")

    def verify(self) -> None:
        if self.lanes.data < 1:
            raise VerifyException(f"a route needs at least one lane, got {self.lanes.data}")
        if len(self.path.data) % 2 or len(self.path.data) < 4:
            raise VerifyException("a route's path lists at least two x, y pairs")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            source = parser.parse_str_literal()
            values = []
            for field_name in cls.FIELDS:
                parser.parse_punctuation(",")
                parser.parse_keyword(field_name)
                values.append(IntAttr(parser.parse_integer(allow_negative=False)))
            parser.parse_punctuation(",")
            parser.parse_keyword("path")
            path = parser.parse_comma_separated_list(
                parser.Delimiter.SQUARE, lambda: parser.parse_integer(allow_negative=False)
            )
        return (StringAttr(source), *values, ArrayAttr(IntAttr(v) for v in path))

    def print_parameters(self, printer: Printer) -> None:
        fields = ", ".join(f"{f} {getattr(self, f).data}" for f in self.FIELDS)
        path = ", ".join(str(v.data) for v in self.path.data)
        printer.print_string("<")
        printer.print_string_literal(self.source.data)
        printer.print_string(f", {fields}, path [{path}]>")


@irdl_attr_definition
class TargetAttr(Data[Target]):
    """``#wse.target<"NAME", rows = R, cols = C, ...>``: the whole machine a module is
    compiled for (``cgc.machine.hardware.target.Target``), every figure written out.

    The driver sets it once, as the module's ``wse.target`` attribute, and every pass reads
    it. Written by hand, ``#wse.target<"NAME">`` is a named target (``wse2``, ``wse3``,
    ``meshRxC``) and ``#wse.target<"NAME", field = value, ...>`` that target with some figures
    changed; a name cgc does not know needs every figure.
    """

    name = "wse.target"

    @classmethod
    def parse_parameter(cls, parser: AttrParser) -> Target:
        with parser.in_angle_brackets():
            target_name = parser.parse_str_literal()
            given: dict[str, int | float] = {}
            while parser.parse_optional_punctuation(",") is not None:
                key = parser.parse_identifier()
                parser.parse_punctuation("=")
                given[key] = parser.parse_number()
        try:
            return target_from_figures(target_name, given)
        except CgcError as e:
            parser.raise_error(str(e))

    def print_parameter(self, printer: Printer) -> None:
        printer.print_string("<")
        printer.print_string_literal(self.data.name)
        for key, value in self.data.to_json().items():
            if key != "name":
                printer.print_string(f", {key} = {_number_text(value)}")
        printer.print_string(">")


def _number_text(value: int | float) -> str:
    """``value`` as MLIR reads it back: floats keep a decimal point before any exponent."""
    if isinstance(value, int):
        return str(value)
    text = repr(float(value))
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}e{exponent}" if exponent else mantissa


@irdl_attr_definition
class RectAttr(ParametrizedAttribute):
    """``#wse.rect<x, y, WxH>``: a rectangle of PEs on the mesh.

    ``x`` is the column and ``y`` the row of the top-left PE; the rectangle is ``W`` columns
    wide and ``H`` rows high.
    """

    name = "wse.rect"
    x: IntAttr = param_def(converter=IntAttr.get)
    y: IntAttr = param_def(converter=IntAttr.get)
    w: IntAttr = param_def(converter=IntAttr.get)
    h: IntAttr = param_def(converter=IntAttr.get)

    def verify(self) -> None:
        if self.x.data < 0 or self.y.data < 0:
            raise VerifyException(f"rectangle origin must be non-negative, got {self.as_tuple()}")
        if self.w.data <= 0 or self.h.data <= 0:
            raise VerifyException(
                f"rectangle size must be positive, got {self.w.data}x{self.h.data}"
            )

    def as_tuple(self) -> tuple[int, int, int, int]:
        """``(x, y, w, h)``."""
        return (self.x.data, self.y.data, self.w.data, self.h.data)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            x = parser.parse_integer(allow_negative=False)
            parser.parse_punctuation(",")
            y = parser.parse_integer(allow_negative=False)
            parser.parse_punctuation(",")
            dims = parser.parse_dimension_list()
            if len(dims) != 2:
                parser.raise_error("expected WxH")
        return (IntAttr(x), IntAttr(y), IntAttr(dims[0]), IntAttr(dims[1]))

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.x.data}, {self.y.data}, {self.w.data}x{self.h.data}>")


# ---------------------------------------------------------------------------------------------
# IR helpers
# ---------------------------------------------------------------------------------------------


def location_name(op: Operation) -> str | None:
    """The source node name an op's location carries, if any."""
    loc = op.location
    return loc.desc.data if isinstance(loc, NameLoc) else None


def properties_as_python(op: Operation) -> dict:
    """An op's properties as plain Python values (ints, floats, bools, strings, int lists)."""
    out: dict = {}
    for key, attr in sorted(op.properties.items()):
        if isinstance(attr, DenseArrayBase):
            out[key] = [int(v) for v in attr.get_values()]
        elif isinstance(attr, IntegerAttr):
            value = attr.value.data
            out[key] = bool(value) if attr.type == i1 else int(value)
        elif isinstance(attr, FloatAttr):
            out[key] = float(attr.value.data)
        elif isinstance(attr, StringAttr):
            out[key] = attr.data
        elif isinstance(attr, UnitAttr):
            out[key] = True
    return out


def mnemonic(op: Operation) -> str:
    """The op's name without its dialect prefix, e.g. ``matmul``."""
    return op.name.split(".", 1)[1]
