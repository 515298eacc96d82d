"""The key-value cache of autoregressive generation: ``wse.kv_cache`` and
``wse.cached_attention``.

A cache is state: it outlives one run of a program, and the programs of one artifact (the
prompt's prefill and the token-by-token decode) share it by name. ``wse.kv_cache`` states one
(a layer's keys or values): ``capacity`` token rows for each of ``B`` sequences, token-major
``[B * capacity, kv_heads * d]`` as every activation is, laid out over the PEs of the layer
that reads it and kept there. ``wse.cached_attention`` writes the new tokens' keys and values
into their rows (in place, at each token's position) and attends each query to its
sequence's cached keys up to its own position. Neither op is ever folded, moved into another
layer or copied: the cache's bytes stay where they were first written. Semantics:
``cgc.machine.reference.attention.cached_attention``.
"""

from __future__ import annotations

from xdsl.dialects.builtin import (
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
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
    opt_prop_def,
    prop_def,
    result_def,
)

from cgc.dialects.wse.types import check, check_element, element_type, tensor_shape


@irdl_op_definition
class KvCacheOp(IRDLOperation):
    """The key or value cache ``name``: ``capacity`` token rows per sequence, ``[B *
    capacity, width]``; zeros before anything is written.

    Example: ``%kc = wse.kv_cache "h.0.attn.key" {capacity = 64 : i64} : tensor<128x64xf32>``.
    """

    name = "wse.kv_cache"
    cache_name = prop_def(StringAttr, prop_name="name")
    capacity = prop_def(IntegerAttr[IntegerType])
    result = result_def(TensorType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$name attr-dict `:` type($result)"

    def __init__(self, name: str, capacity: int, result_type: TensorType):
        super().__init__(
            result_types=[result_type],
            properties={"name": StringAttr(name), "capacity": IntegerAttr(capacity, i64)},
        )

    @property
    def sequences(self) -> int:
        """The sequences it holds rows for."""
        return tensor_shape(self.result)[0] // self.capacity.value.data

    def verify_(self) -> None:
        shape, capacity = tensor_shape(self.result), self.capacity.value.data
        check(capacity > 0, "the capacity must be positive")
        check(len(shape) == 2 and shape[0] % capacity == 0,
              f"a cache is [sequences * {capacity}, width], got {list(shape)}")  # fmt: skip


@irdl_op_definition
class CachedAttentionOp(IRDLOperation):
    """Writes ``key`` and ``value`` ``[B * s, kv_heads * d]`` (``s`` new tokens per
    sequence) into ``key_cache`` and ``value_cache`` at the rows of ``positions`` ``[B, s]``,
    then computes ``softmax(scale * q k^T) v`` per sequence and head of ``query`` ``[B * s,
    heads * d]``, each query seeing its sequence's cached keys at positions up to its own;
    ``heads`` query heads share ``kv_heads`` key and value heads. The result is like the
    query; with a ``window``, a query sees only the ``window`` latest positions up to its own
    (a sliding-window attention). A negative position is padding (of a prompt's last chunk):
    nothing is written for it, and its query's result is zeros. The caches are written in
    place: the op has an effect, not only a result."""

    name = "wse.cached_attention"
    query = operand_def(TensorType)
    key = operand_def(TensorType)
    value = operand_def(TensorType)
    key_cache = operand_def(TensorType)
    value_cache = operand_def(TensorType)
    positions = operand_def(TensorType)
    result = result_def(TensorType)
    heads = prop_def(IntegerAttr[IntegerType])
    kv_heads = prop_def(IntegerAttr[IntegerType])
    scale = prop_def(FloatAttr)
    window = opt_prop_def(IntegerAttr[IntegerType])
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$query `,` $key `,` $value `,` $key_cache `,` $value_cache `,` $positions attr-dict "
        "`:` functional-type(operands, results)"
    )

    def __init__(
        self,
        query: SSAValue,
        key: SSAValue,
        value: SSAValue,
        caches: tuple[SSAValue, SSAValue],
        positions: SSAValue,
        heads: int,
        kv_heads: int,
        scale: float,
        window: int = 0,
    ):
        properties: dict[str, Attribute] = {
            "heads": IntegerAttr(heads, i64),
            "kv_heads": IntegerAttr(kv_heads, i64),
            "scale": FloatAttr(scale, f64),
        }
        if window:
            properties["window"] = IntegerAttr(window, i64)
        super().__init__(
            operands=[query, key, value, caches[0], caches[1], positions],
            result_types=[query.type],
            properties=properties,
        )

    def verify_(self) -> None:
        heads, kv_heads = self.heads.value.data, self.kv_heads.value.data
        check(self.window is None or self.window.value.data > 0, "the window must be positive")
        check(heads > 0 and kv_heads > 0 and heads % kv_heads == 0,
              f"kv_heads {kv_heads} must divide heads {heads}")  # fmt: skip
        (tokens, width), where = tensor_shape(self.query), tensor_shape(self.positions)
        fits = len(where) == 2 and where[0] * where[1] == tokens
        check(fits, f"positions {list(where)} must be [sequences, tokens] of {tokens} tokens")
        check(isinstance(element_type(self.positions), IntegerType), "positions are integers")
        check(width % heads == 0, f"{width} columns do not split into {heads} heads")
        rows = (tokens, width // heads * kv_heads)
        for operand, what in ((self.key, "key"), (self.value, "value")):
            check(tensor_shape(operand) == rows, f"{what} shape must be {list(rows)}")
            check_element(operand, element_type(self.query), f"the {what}")
        cache = tensor_shape(self.key_cache)
        check(len(cache) == 2 and cache[1] == rows[1] and cache[0] % where[0] == 0,
              f"a cache must be [{where[0]} * capacity, {rows[1]}], got {list(cache)}")  # fmt: skip
        check(tensor_shape(self.value_cache) == cache, "the caches must be alike")
        for operand, what in ((self.key_cache, "key cache"), (self.value_cache, "value cache")):
            check_element(operand, element_type(self.query), f"the {what}")
        check(self.result.type == self.query.type, "the result must be typed like the query")
