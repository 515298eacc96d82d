"""Attention: fused causal multi-head attention, its gradient, and rotary position embeddings.

The tensors are token-major, ``[T, heads * d]`` with ``T = batch * sequence`` tokens sample
after sample and each head's ``d`` dimensions side by side: the layout the weight-streaming
design keeps activations in (tokens along the wafer's rows, the hidden dimension along its
columns), so that attention needs no transposes. A fused kernel computes the scores and the
softmax on the fly and never stores the ``[sequence, sequence]`` probabilities; its gradient
computes them again. Semantics: ``cgc.machine.reference.attention``.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    BoolAttr,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    TensorType,
    f64,
    i64,
)
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import Pure

from cgc.dialects.wse.types import check, check_element, element_type, tensor_shape

HEAD_PROPERTIES = ("sequence", "heads", "kv_heads", "causal", "scale", "window", "key_sequence")
"""The properties every attention op has (the last two only where they are not their
defaults)."""


def _head_properties(
    sequence: int,
    heads: int,
    kv_heads: int,
    causal: bool,
    scale: float,
    window: int = 0,
    key_sequence: int | None = None,
) -> dict[str, Attribute]:
    properties: dict[str, Attribute] = {
        "sequence": IntegerAttr(sequence, i64),
        "heads": IntegerAttr(heads, i64),
        "kv_heads": IntegerAttr(kv_heads, i64),
        "causal": BoolAttr.from_bool(causal),
        "scale": FloatAttr(scale, f64),
    }
    if window:
        properties["window"] = IntegerAttr(window, i64)
    if key_sequence is not None and key_sequence != sequence:
        properties["key_sequence"] = IntegerAttr(key_sequence, i64)
    return properties


class HeadsOp(IRDLOperation):
    """Base of the attention ops: ``sequence`` query tokens per sample attending to
    ``key_sequence`` keys (default: as many), ``heads`` query heads sharing ``kv_heads`` key
    and value heads, a ``causal`` mask (with a ``window``: each query sees only the ``window``
    latest keys up to its own, as a sliding-window attention does), the scores' ``scale``."""

    sequence = prop_def(IntegerAttr[IntegerType])
    heads = prop_def(IntegerAttr[IntegerType])
    kv_heads = prop_def(IntegerAttr[IntegerType])
    causal = prop_def(BoolAttr)
    scale = prop_def(FloatAttr)
    window = opt_prop_def(IntegerAttr[IntegerType])
    key_sequence = opt_prop_def(IntegerAttr[IntegerType])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)

    @property
    def keys_per_sample(self) -> int:
        """Keys (and values) per sample."""
        given = self.key_sequence
        return self.sequence.value.data if given is None else given.value.data

    def check_heads(self, q: SSAValue, k: SSAValue, v: SSAValue) -> None:
        """Checks the shapes of query, key and value against the properties."""
        sequence, heads = self.sequence.value.data, self.heads.value.data
        kv_heads, keys = self.kv_heads.value.data, self.keys_per_sample
        window = 0 if self.window is None else self.window.value.data
        check(sequence > 0 and heads > 0 and kv_heads > 0, "sizes must be positive")
        check(keys > 0, "key_sequence must be positive")
        check(heads % kv_heads == 0, f"kv_heads {kv_heads} must divide heads {heads}")
        check(window >= 0, "the window must not be negative")
        causal = self.causal.value.data
        check(not window or bool(causal), "a window applies to a causal mask")
        check(not causal or keys == sequence, "a causal mask needs as many keys as queries")
        (tokens, width), key = tensor_shape(q), tensor_shape(k)
        check(tokens % sequence == 0, f"{tokens} tokens are not samples of {sequence}")
        check(width % heads == 0, f"{width} columns do not split into {heads} heads")
        d = width // heads
        expected = (tokens // sequence * keys, kv_heads * d)
        check(key == expected, f"key shape {key}, expected {expected}")
        check(tensor_shape(v) == key, f"value shape {tensor_shape(v)} differs from key {key}")
        for value, what in ((k, "the key"), (v, "the value")):
            check_element(value, element_type(q), what)

    def check_bias(self, q: SSAValue, bias: SSAValue) -> None:
        """Checks that ``bias`` broadcasts over the scores."""
        sequence = self.sequence.value.data
        full = (tensor_shape(q)[0] // sequence, self.heads.value.data, sequence,
                self.keys_per_sample)  # fmt: skip
        shape = tensor_shape(bias)
        fits = len(shape) == 4 and all(n in (1, m) for n, m in zip(shape, full, strict=True))
        check(fits and shape[3] == full[3], f"bias shape {shape} does not broadcast to {full}")
        check_element(bias, element_type(q), "the bias")


@irdl_op_definition
class AttentionOp(HeadsOp):
    """``softmax(scale * q k^T + mask + bias) v`` per sample and head of token-major ``q``
    ``[T, heads * d]``, ``k`` and ``v`` ``[T', kv_heads * d]``; the result is like ``q``. The
    optional ``bias`` ``[B or 1, heads or 1, sequence or 1, key_sequence]`` is added to the
    scores as it is (a mask known only at run time, as from a padding input, or a relative
    position bias)."""

    name = "wse.attention"
    query = operand_def(TensorType)
    key = operand_def(TensorType)
    value = operand_def(TensorType)
    bias = opt_operand_def(TensorType)
    result = result_def(TensorType)
    assembly_format = (
        "$query `,` $key `,` $value (`,` $bias^)? attr-dict `:` functional-type(operands, results)"
    )

    def __init__(
        self,
        query: SSAValue,
        key: SSAValue,
        value: SSAValue,
        sequence: int,
        heads: int,
        kv_heads: int,
        causal: bool,
        scale: float,
        window: int = 0,
        key_sequence: int | None = None,
        bias: SSAValue | None = None,
    ):
        super().__init__(
            operands=[query, key, value, [] if bias is None else [bias]],
            result_types=[query.type],
            properties=_head_properties(
                sequence, heads, kv_heads, causal, scale, window, key_sequence
            ),
        )

    def verify_(self) -> None:
        self.check_heads(self.query, self.key, self.value)
        check(self.result.type == self.query.type, "the result must be typed like the query")
        if self.bias is not None:
            self.check_bias(self.query, self.bias)


@irdl_op_definition
class AttentionGradOp(HeadsOp):
    """The gradients of ``wse.attention``'s query, key and value (and bias, if it has one),
    from the operands, the result ``out`` and its gradient ``dout`` (the probabilities
    computed again)."""

    name = "wse.attention_grad"
    operands_ = var_operand_def(TensorType)
    results_ = var_result_def(TensorType)
    assembly_format = "$operands_ attr-dict `:` type($operands_) `->` type($results_)"

    def __init__(self, operands: Sequence[SSAValue], forward: AttentionOp):
        props = {k: forward.properties[k] for k in HEAD_PROPERTIES if k in forward.properties}
        super().__init__(
            operands=[operands],
            result_types=[[v.type for v in operands[:-2]]],
            properties=props,
        )

    def verify_(self) -> None:
        biased = len(self.operands_) == 6
        check(
            len(self.operands_) in (5, 6),
            "expects q, k, v, (the bias,) the result and its gradient",
        )
        check(len(self.results_) == len(self.operands_) - 2, "gives a gradient per input")
        q, k, v, *rest = self.operands_
        out, dout = rest[-2:]
        self.check_heads(q, k, v)
        if biased:
            self.check_bias(q, rest[0])
        check(out.type == q.type and dout.type == q.type, "out and dout must be typed like q")
        for result, operand in zip(self.results_, self.operands_, strict=False):
            check(result.type == operand.type, "each gradient is typed like its operand")


@irdl_op_definition
class RotaryOp(IRDLOperation):
    """Rotary position embedding of token-major ``input`` ``[T, heads * d]``: the first
    ``r`` dimensions of every head rotate by the angles of the token's position, whose
    ``cos`` and ``sin`` ``[sequence, r]`` repeat their first half in their second (the
    ``rotate_half`` layout); ``inverse`` rotates back."""

    name = "wse.rotary"
    input = operand_def(TensorType)
    cos = operand_def(TensorType)
    sin = operand_def(TensorType)
    result = result_def(TensorType)
    heads = prop_def(IntegerAttr[IntegerType])
    inverse = prop_def(BoolAttr, default_value=BoolAttr.from_bool(False))
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$input `,` $cos `,` $sin attr-dict `:` `(` type($input) `,` type($cos) `,` "
        "type($sin) `)` `->` type($result)"
    )

    def __init__(
        self, input: SSAValue, cos: SSAValue, sin: SSAValue, heads: int, inverse: bool = False
    ):
        super().__init__(
            operands=[input, cos, sin],
            result_types=[input.type],
            properties={"heads": IntegerAttr(heads, i64), "inverse": BoolAttr.from_bool(inverse)},
        )

    def verify_(self) -> None:
        (tokens, width), table = tensor_shape(self.input), tensor_shape(self.cos)
        heads = self.heads.value.data
        check(heads > 0 and width % heads == 0, f"{width} columns do not split into {heads} heads")
        check(len(table) == 2 and tensor_shape(self.sin) == table, "cos and sin must be [S, r]")
        sequence, dims = table
        check(tokens % sequence == 0, f"{tokens} tokens are not samples of {sequence}")
        check(dims % 2 == 0 and dims <= width // heads, f"cannot rotate {dims} of each head")
        check(self.result.type == self.input.type, "the result must be typed like the input")


ATTENTION_OPS = (AttentionOp, AttentionGradOp, RotaryOp)
