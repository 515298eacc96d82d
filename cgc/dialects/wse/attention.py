"""Attention: fused causal multi-head attention, its gradient, and rotary position embeddings.

The tensors are token-major, ``[T, heads * d]`` with ``T = batch * sequence`` tokens sample
after sample and each head's ``d`` dimensions side by side: the layout the weight-streaming
design keeps activations in (tokens along the wafer's rows, the hidden dimension along its
columns), so that attention needs no transposes. A fused kernel computes the scores and the
softmax on the fly and never stores the ``[sequence, sequence]`` probabilities; its gradient
computes them again. Semantics: ``cgc.machine.ref_attention``.
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
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import Pure

from cgc.dialects.wse.types import check, check_element, element_type, tensor_shape


def _head_properties(
    sequence: int, heads: int, kv_heads: int, causal: bool, scale: float
) -> dict[str, Attribute]:
    return {
        "sequence": IntegerAttr(sequence, i64),
        "heads": IntegerAttr(heads, i64),
        "kv_heads": IntegerAttr(kv_heads, i64),
        "causal": BoolAttr.from_bool(causal),
        "scale": FloatAttr(scale, f64),
    }


class HeadsOp(IRDLOperation):
    """Base of the attention ops: ``sequence`` tokens per sample, ``heads`` query heads sharing
    ``kv_heads`` key and value heads, a ``causal`` mask, the scores' ``scale``."""

    sequence = prop_def(IntegerAttr[IntegerType])
    heads = prop_def(IntegerAttr[IntegerType])
    kv_heads = prop_def(IntegerAttr[IntegerType])
    causal = prop_def(BoolAttr)
    scale = prop_def(FloatAttr)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)

    def check_heads(self, q: SSAValue, k: SSAValue, v: SSAValue) -> None:
        """Checks the shapes of query, key and value against the properties."""
        sequence, heads = self.sequence.value.data, self.heads.value.data
        kv_heads = self.kv_heads.value.data
        check(sequence > 0 and heads > 0 and kv_heads > 0, "sizes must be positive")
        check(heads % kv_heads == 0, f"kv_heads {kv_heads} must divide heads {heads}")
        (tokens, width), key = tensor_shape(q), tensor_shape(k)
        check(tokens % sequence == 0, f"{tokens} tokens are not samples of {sequence}")
        check(width % heads == 0, f"{width} columns do not split into {heads} heads")
        d = width // heads
        check(key == (tokens, kv_heads * d), f"key shape {key}, expected {(tokens, kv_heads * d)}")
        check(tensor_shape(v) == key, f"value shape {tensor_shape(v)} differs from key {key}")
        for value, what in ((k, "the key"), (v, "the value")):
            check_element(value, element_type(q), what)


@irdl_op_definition
class AttentionOp(HeadsOp):
    """``softmax(scale * q k^T + causal mask) v`` per sample and head of token-major ``q``
    ``[T, heads * d]``, ``k`` and ``v`` ``[T, kv_heads * d]``; the result is like ``q``."""

    name = "wse.attention"
    query = operand_def(TensorType)
    key = operand_def(TensorType)
    value = operand_def(TensorType)
    result = result_def(TensorType)
    assembly_format = (
        "$query `,` $key `,` $value attr-dict `:` `(` type($query) `,` type($key) `,` "
        "type($value) `)` `->` type($result)"
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
    ):
        super().__init__(
            operands=[query, key, value],
            result_types=[query.type],
            properties=_head_properties(sequence, heads, kv_heads, causal, scale),
        )

    def verify_(self) -> None:
        self.check_heads(self.query, self.key, self.value)
        check(self.result.type == self.query.type, "the result must be typed like the query")


@irdl_op_definition
class AttentionGradOp(HeadsOp):
    """The gradients of ``wse.attention``'s query, key and value, from the operands, the
    result ``out`` and its gradient ``dout`` (the probabilities computed again)."""

    name = "wse.attention_grad"
    operands_ = var_operand_def(TensorType)
    results_ = var_result_def(TensorType)
    assembly_format = "$operands_ attr-dict `:` type($operands_) `->` type($results_)"

    def __init__(self, operands: Sequence[SSAValue], forward: AttentionOp):
        props = {
            k: forward.properties[k] for k in ("sequence", "heads", "kv_heads", "causal", "scale")
        }
        super().__init__(
            operands=[operands],
            result_types=[[v.type for v in operands[:3]]],
            properties=props,
        )

    def verify_(self) -> None:
        check(len(self.operands_) == 5, "expects q, k, v, the result and its gradient")
        check(len(self.results_) == 3, "gives the gradients of q, k and v")
        q, k, v, out, dout = self.operands_
        self.check_heads(q, k, v)
        check(out.type == q.type and dout.type == q.type, "out and dout must be typed like q")
        for result, operand in zip(self.results_, (q, k, v), strict=True):
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
