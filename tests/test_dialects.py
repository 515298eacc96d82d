"""The wse and ws dialects: typed builders, printing and parsing, verifiers, helpers."""

from __future__ import annotations

import io
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
from ir_builders import T, build
from xdsl.builder import ImplicitBuilder
from xdsl.dialects.builtin import (
    BFloat16Type,
    ComplexType,
    Float8E4M3FNType,
    IntegerType,
    ModuleOp,
    NameLoc,
    NoneAttr,
    Signedness,
    StringAttr,
    f16,
    f32,
    f64,
    i1,
    i8,
    i16,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, Region, SSAValue
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from cgc.dialects import context, parse_module, print_module, ws, wse
from cgc.dialects.ir import dense_to_numpy
from cgc.errors import CgcError

U8 = IntegerType(8, Signedness.UNSIGNED)


def generic(module: ModuleOp) -> str:
    stream = io.StringIO()
    Printer(stream=stream, print_generic_format=True).print_op(module)
    return stream.getvalue()


def parse(text: str) -> ModuleOp:
    """Parses without verifying."""
    return Parser(context(), text).parse_module()


def body_ops(module: ModuleOp) -> list:
    fn = next(iter(module.ops))
    return list(fn.body.block.ops)[:-1]


# ---------------------------------------------------------------------------------------------
# Every op: typed builder, verifier, custom and generic round trip
# ---------------------------------------------------------------------------------------------


def _layer(x):
    block = Block(arg_types=[x.type])
    with ImplicitBuilder(block):
        y = wse.ReluOp(block.args[0]).result
        w = wse.WeightOp("blk.w", T(3)).result
        z = wse.AddOp(y, w).result
        wse.YieldOp(z, y)
    layer = wse.LayerOp("blk", [x], [x.type, x.type], Region(block), wse.RectAttr(1, 2, 3, 4))
    return list(layer.results)


def _fused_matmul(a, w, g, r):
    """A matmul of one weight matrix, its columns scaled by ``g``, then ``relu(acc + r)``."""
    block = Block(arg_types=[T(2, 4), r.type])
    with ImplicitBuilder(block):
        wse.YieldOp(wse.ReluOp(wse.AddOp(block.args[0], block.args[1]).result).result)
    return [wse.FusedMatmulOp(a, w, [g], [r], Region(block), block.args[0].type).result]


def _empty_layer(x):
    block = Block(arg_types=[x.type])
    with ImplicitBuilder(block):
        ws.StreamGradientOp("g", block.args[0])
        wse.YieldOp()
    wse.LayerOp("sink", [x], [], Region(block))
    return []


def _stream_gradients(g):
    ws.StreamGradientOp("fc.weight", g, [1, 0])
    ws.StreamGradientOp("fc.bias", g)
    return []


def _attention_grad(q, k, v, out, dout):
    forward = wse.AttentionOp(q, k, v, 6, 4, 2, False, 0.25)
    return list(wse.AttentionGradOp([q, k, v, out, dout], forward).results)


def _optimizer_step():
    ws.OptimizerStepOp("adam", {"lr": 1e-3, "beta1": 0.9})
    return []


CASES: dict[str, tuple[list[Attribute], Callable[..., list[SSAValue]]]] = {
    "wse.weight": ([], lambda: [wse.WeightOp("w", T(3, 2)).result]),
    "wse.weight/frozen-perm": (
        [],
        lambda: [wse.WeightOp("c", T(4, 2, 3), frozen=True, perm=[2, 0, 1]).result],
    ),
    "wse.constant": (
        [],
        lambda: [wse.ConstantOp(wse.dense_attr(np.arange(6, dtype=np.float32).reshape(2, 3)))
                 .result],
    ),
    "wse.constant/i64": (
        [], lambda: [wse.ConstantOp(wse.dense_attr(np.array([3, -1], dtype=np.int64))).result]
    ),
    "wse.constant/i1": (
        [], lambda: [wse.ConstantOp(wse.dense_attr(np.array([True, False]))).result]
    ),
    **{
        cls.name: ([T(2, 3)], lambda x, cls=cls: [cls(x).result])
        for cls in (*wse.UNARY_OPS, wse.StopGradientOp)
    },
    **{
        cls.name: ([T(2, 3), T(3)], lambda a, b, cls=cls: [cls(a, b).result])
        for cls in wse.BINARY_OPS
    },
    **{
        cls.name: ([T(2, 3)], lambda x, cls=cls: [cls(x).result])
        for cls in wse.MATH_OPS
        if cls not in (wse.NotOp, wse.BitwiseNotOp)
    },
    "wse.not": ([T(2, 3, el=i1)], lambda x: [wse.NotOp(x).result]),
    "wse.bitwise_not": ([T(2, 3, el=i32)], lambda x: [wse.BitwiseNotOp(x).result]),
    "wse.bitwise_not/u8": ([T(4, el=U8)], lambda x: [wse.BitwiseNotOp(x).result]),
    "wse.is_nan": ([T(2, 3)], lambda x: [wse.IsNanOp(x).result]),
    "wse.is_inf": ([T(2, 3, el=f16)], lambda x: [wse.IsInfOp(x).result]),
    **{
        cls.name: ([T(2, 3, el=el), T(3, el=el)], lambda a, b, cls=cls: [cls(a, b).result])
        for cls, el in (
            (wse.ModOp, i32), (wse.FmodOp, f32), (wse.AndOp, i1), (wse.OrOp, i1),
            (wse.XorOp, i1), (wse.BitwiseAndOp, i64), (wse.BitwiseOrOp, i8),
            (wse.BitwiseXorOp, i16), (wse.ShiftLeftOp, U8), (wse.ShiftRightOp, i32),
            (wse.GreaterEqualOp, f32),
        )
    },
    "wse.mod/f64": ([T(4, el=f64), T(4, 1, el=f64)], lambda a, b: [wse.ModOp(a, b).result]),
    "wse.greater_equal/i64": (
        [T(2, 1, el=i64), T(1, 3, el=i64)],
        lambda a, b: [wse.GreaterEqualOp(a, b).result],
    ),
    "wse.select": (
        [T(2, 1, el=i1), T(3), T(2, 3)],
        lambda c, a, b: [wse.SelectOp(c, a, b).result],
    ),
    "wse.cast": ([T(2, 3)], lambda x: [wse.CastOp(x, i64).result]),
    "wse.cast/f8-no-saturate": (
        [T(2, 3)], lambda x: [wse.CastOp(x, Float8E4M3FNType(), saturate=False).result]
    ),
    "wse.cast/bf16-saturate": ([T(2, 3)], lambda x: [wse.CastOp(x, BFloat16Type(), True).result]),
    "wse.bitcast": ([T(2, 3)], lambda x: [wse.BitcastOp(x, i32).result]),
    **{
        cls.name: ([T(2, 3, 4)], lambda x, cls=cls: [cls(x, [0, 2], True).result,
                                                     cls(x, [1], False).result])
        for cls in wse.REDUCE_OPS
    },
    "wse.matmul": ([T(5, 2, 3), T(3, 4)], lambda a, b: [wse.MatmulOp(a, b).result]),
    "wse.conv": (
        [T(1, 4, 7, 7), T(6, 2, 3, 3)],
        lambda x, w: [wse.ConvOp(x, w, [2, 1], [1, 0, 1, 0], [1, 2], 2).result],
    ),
    "wse.max_pool": (
        [T(1, 2, 5, 5)],
        lambda x: [wse.MaxPoolOp(x, [2, 2], [2, 2], [0, 0, 1, 1], [1, 1]).result],
    ),
    "wse.avg_pool": (
        [T(1, 2, 5, 5)],
        lambda x: [wse.AvgPoolOp(x, [3, 2], [1, 2], [1, 0, 1, 1], [1, 1], True).result],
    ),
    "wse.max_pool/channels-last": (
        [T(1, 5, 5, 2)],
        lambda x: [wse.MaxPoolOp(x, [2, 2], [2, 2], [0, 0, 1, 1], [1, 1], True).result],
    ),
    "wse.avg_pool/channels-last": (
        [T(1, 5, 5, 2)],
        lambda x: [wse.AvgPoolOp(x, [3, 2], [1, 2], [1, 0, 1, 1], [1, 1], False, True).result],
    ),
    "wse.argmax_pool": (
        [T(1, 2, 5, 5)],
        lambda x: [wse.ArgMaxPoolOp(x, [3, 2], [1, 2], [1, 0, 1, 1], [1, 1], 1).result],
    ),
    "wse.argmax_pool/1d": (
        [T(2, 3, 7, el=f16)],
        lambda x: [wse.ArgMaxPoolOp(x, [3], [2], [1, 1], [2], 0).result],
    ),
    "wse.im2col": (
        [T(2, 4, 5, 5)],
        lambda x: [wse.Im2ColOp(x, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 2).result],
    ),
    "wse.im2col/channels-last": (
        [T(2, 5, 5, 4)],
        lambda x: [wse.Im2ColOp(x, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 2, True).result],
    ),
    "wse.col2im": (
        [T(2, 50, 18)],
        lambda p: [wse.Col2ImOp(p, (2, 4, 5, 5), [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 2).result],
    ),
    "wse.reshape": ([T(2, 3, 4)], lambda x: [wse.ReshapeOp(x, (6, 4)).result]),
    "wse.broadcast_to": ([T(3, 1)], lambda x: [wse.BroadcastToOp(x, (2, 3, 5)).result]),
    "wse.transpose": ([T(2, 3, 4)], lambda x: [wse.TransposeOp(x, [2, 0, 1]).result]),
    "wse.concat": ([T(2, 3), T(2, 5)], lambda a, b: [wse.ConcatOp([a, b, a], 1).result]),
    "wse.slice": ([T(6, 5)], lambda x: [wse.SliceOp(x, [1, 0], [6, 5], [2, 3]).result]),
    "wse.pad": ([T(2, 3)], lambda x: [wse.PadOp(x, [1, 0], [0, 2], 1.5).result]),
    **{
        f"wse.pad/{mode}": (
            [T(3, 4)], lambda x, mode=mode: [wse.PadOp(x, [1, 2], [2, 0], mode=mode).result]
        )
        for mode in ("reflect", "edge", "wrap")
    },
    "wse.one_hot": ([T(4, el=i64)], lambda x: [wse.OneHotOp(x, 5, f32).result]),
    "wse.gather": ([T(5, 4), T(2, 3, el=i64)], lambda d, i: [wse.GatherOp(d, i, 0).result]),
    "wse.gather/scalar-index-i32": (
        [T(2, 5, 4), T(el=i32)], lambda d, i: [wse.GatherOp(d, i, 1).result]
    ),
    "wse.gather_elements": (
        [T(3, 4), T(3, 2, el=i64)], lambda d, i: [wse.GatherElementsOp(d, i, 1).result]
    ),
    "wse.gather_nd": (
        [T(2, 3, 4), T(5, 2, el=i64)], lambda d, i: [wse.GatherNDOp(d, i, 0).result]
    ),
    "wse.gather_nd/batch-dims": (
        [T(2, 3, 4, el=i32), T(2, 6, 1, el=i64)], lambda d, i: [wse.GatherNDOp(d, i, 1).result]
    ),
    "wse.scatter_elements": (
        [T(3, 4), T(2, 4, el=i64), T(2, 4)],
        lambda d, i, u: [wse.ScatterElementsOp(d, i, u, 0, "add").result],
    ),
    "wse.scatter_elements/none-i32": (
        [T(3, 4, el=i32), T(3, 2, el=i64), T(3, 2, el=i32)],
        lambda d, i, u: [wse.ScatterElementsOp(d, i, u, 1, "none").result],
    ),
    "wse.scatter_nd": (
        [T(4, 3), T(2, 1, el=i64), T(2, 3)],
        lambda d, i, u: [wse.ScatterNDOp(d, i, u, "none").result],
    ),
    "wse.scatter_nd/max": (
        [T(4, 3), T(5, 2, el=i64), T(5)],
        lambda d, i, u: [wse.ScatterNDOp(d, i, u, "max").result],
    ),
    "wse.cumsum": ([T(2, 3)], lambda x: [wse.CumSumOp(x, 1, True, False).result]),
    "wse.cumprod": ([T(2, 3)], lambda x: [wse.CumProdOp(x, 0, False, True).result]),
    "wse.cumsum/reverse-i64": (
        [T(4, el=i64)], lambda x: [wse.CumSumOp(x, 0, False, True).result]
    ),
    "wse.topk": ([T(3, 5)], lambda x: list(wse.TopKOp(x, 1, 2, False).results)),
    "wse.topk/largest-i32": ([T(6, 2, el=i32)], lambda x: list(wse.TopKOp(x, 0, 6, True).results)),
    "wse.reverse": ([T(2, 3, 4)], lambda x: [wse.ReverseOp(x, [0, 2]).result]),
    "wse.tile": ([T(2, 3)], lambda x: [wse.TileOp(x, [2, 1]).result]),
    "wse.tile/i1-rank3": ([T(1, 2, 1, el=i1)], lambda x: [wse.TileOp(x, [3, 1, 4]).result]),
    "wse.softmax": ([T(2, 3, 4)], lambda x: [wse.SoftmaxOp(x, 1).result]),
    "wse.log_softmax": ([T(2, 3, 4)], lambda x: [wse.LogSoftmaxOp(x, 2).result]),
    "wse.layer_norm": (
        [T(2, 3, 4), T(3, 4), T(4)],
        lambda x, s, b: [wse.LayerNormOp(x, s, b, 1, 1e-5).result],
    ),
    "wse.layer_norm/no-bias": (
        [T(2, 3, 4), T(4)],
        lambda x, s: [wse.LayerNormOp(x, s, None, 2, 1e-3).result],
    ),
    "wse.batch_norm": (
        [T(2, 3, 4, 4), T(3), T(3), T(3), T(3)],
        lambda x, s, b, m, v: [wse.BatchNormOp(x, s, b, m, v, 1e-5).result],
    ),
    "wse.softmax_cross_entropy": (
        [T(3, 5), T(3, el=i64), T(5)],
        lambda s, lab, w: [wse.SoftmaxCrossEntropyOp(s, lab, w, "mean", -1).result],
    ),
    "wse.softmax_cross_entropy/none-rank3": (
        [T(2, 5, 3), T(2, 3, el=i64)],
        lambda s, lab: [wse.SoftmaxCrossEntropyOp(s, lab, None, "none", None).result],
    ),
    "wse.matmul_transpose_a": (
        [T(5, 3), T(5, 4)], lambda a, b: [wse.MatmulTransposeAOp(a, b).result]
    ),
    "wse.attention": (
        [T(12, 8), T(12, 4), T(12, 4)],
        lambda q, k, v: [wse.AttentionOp(q, k, v, 6, 4, 2, True, 0.5).result],
    ),
    "wse.attention_grad": ([T(12, 8), T(12, 4), T(12, 4), T(12, 8), T(12, 8)], _attention_grad),
    "wse.rotary": (
        [T(12, 8), T(6, 2), T(6, 2)],
        lambda x, c, s: [wse.RotaryOp(x, c, s, 4, inverse=True).result],
    ),
    "wse.kv_cache": ([], lambda: [wse.KvCacheOp("h.0.attn.key_cache", 6, T(12, 4)).result]),
    "wse.cached_attention": (
        [T(2, 8), T(2, 4), T(2, 4), T(12, 4), T(12, 4), T(2, 1, el=i32)],
        lambda q, k, v, kc, vc, p: [
            wse.CachedAttentionOp(q, k, v, (kc, vc), p, 4, 2, 0.5).result
        ],
    ),
    "wse.layer": ([T(2, 3)], _layer),
    "wse.fused_matmul": ([T(2, 3), T(3, 4), T(4), T(4)], _fused_matmul),
    "wse.yield": ([T(2, 3)], _empty_layer),
    "ws.stream_weight": (
        [], lambda: [ws.StreamWeightOp("fc.weight", T(3, 2), perm=[1, 0]).result,
                     ws.StreamWeightOp("fc.bias", T(2)).result]
    ),
    "ws.stream_gradient": ([T(3, 2)], _stream_gradients),
    "ws.optimizer_step": ([], _optimizer_step),
}  # fmt: skip


def test_every_op_has_a_case():
    names = {op.name for op in (*wse.WSE.operations, *ws.WS.operations)}
    covered = {key.split("/")[0] for key in CASES}
    assert names <= covered, sorted(names - covered)


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_builds_verifies_and_round_trips(case):
    arg_types, body = CASES[case]
    module = build(arg_types, body)
    module.verify()
    name = case.split("/")[0]
    assert any(op.name == name for op in module.walk())
    custom = print_module(module)
    assert name in custom
    again = parse_module(custom)
    assert print_module(again) == custom
    text = generic(module)
    assert f'"{name}"' in text
    from_generic = parse_module(text)
    assert print_module(from_generic) == custom
    assert generic(from_generic) == text


def test_inferred_result_types():
    """The typed builders infer the result types with numpy's rules."""
    expected = {
        "wse.matmul": [T(5, 2, 4)],
        "wse.conv": [T(1, 6, 4, 3)],
        "wse.max_pool": [T(1, 2, 3, 3)],
        "wse.avg_pool": [T(1, 2, 5, 3)],
        "wse.im2col": [T(2, 50, 18)],
        "wse.im2col/channels-last": [T(2, 50, 18)],
        "wse.col2im": [T(2, 4, 5, 5)],
        "wse.max_pool/channels-last": [T(1, 3, 3, 2)],
        "wse.avg_pool/channels-last": [T(1, 5, 3, 2)],
        "wse.select": [T(2, 3)],
        "wse.greater": [T(2, 3, el=i1)],
        "wse.equal": [T(2, 3, el=i1)],
        "wse.cast": [T(2, 3, el=i64)],
        "wse.reduce_sum": [T(1, 3, 1), T(2, 4)],
        "wse.broadcast_to": [T(2, 3, 5)],
        "wse.transpose": [T(4, 2, 3)],
        "wse.concat": [T(2, 11)],
        "wse.slice": [T(3, 2)],
        "wse.pad": [T(3, 5)],
        "wse.one_hot": [T(4, 5)],
        "wse.softmax_cross_entropy": [T()],
        "wse.softmax_cross_entropy/none-rank3": [T(2, 3)],
        "wse.layer": [T(2, 3), T(2, 3)],
        "wse.is_nan": [T(2, 3, el=i1)],
        "wse.is_inf": [T(2, 3, el=i1)],
        "wse.greater_equal": [T(2, 3, el=i1)],
        "wse.greater_equal/i64": [T(2, 3, el=i1)],
        "wse.mod/f64": [T(4, 4, el=f64)],
        "wse.bitwise_and": [T(2, 3, el=i64)],
        "wse.cast/f8-no-saturate": [T(2, 3, el=Float8E4M3FNType())],
        "wse.cast/bf16-saturate": [T(2, 3, el=BFloat16Type())],
        "wse.bitcast": [T(2, 3, el=i32)],
        "wse.reduce_prod": [T(1, 3, 1), T(2, 4)],
        "wse.argmax_pool": [T(1, 2, 5, 3, el=i64)],
        "wse.argmax_pool/1d": [T(2, 3, 3, el=i64)],
        "wse.pad/reflect": [T(6, 6)],
        "wse.gather": [T(2, 3, 4)],
        "wse.gather/scalar-index-i32": [T(2, 4)],
        "wse.gather_elements": [T(3, 2)],
        "wse.gather_nd": [T(5, 4)],
        "wse.gather_nd/batch-dims": [T(2, 6, 4, el=i32)],
        "wse.scatter_elements": [T(3, 4)],
        "wse.scatter_nd/max": [T(4, 3)],
        "wse.cumsum/reverse-i64": [T(4, el=i64)],
        "wse.topk": [T(3, 2), T(3, 2, el=i64)],
        "wse.topk/largest-i32": [T(6, 2, el=i32), T(6, 2, el=i64)],
        "wse.reverse": [T(2, 3, 4)],
        "wse.tile": [T(4, 3)],
        "wse.tile/i1-rank3": [T(3, 2, 4, el=i1)],
    }
    for case, types in expected.items():
        arg_types, body = CASES[case]
        fn = next(iter(build(arg_types, body).ops))
        assert list(fn.function_type.outputs) == types, case


def test_custom_syntax_examples():
    """The documented custom syntax of a few ops."""
    module = build(*CASES["wse.layer"])
    text = print_module(module)
    assert 'wse.layer "blk"(%0) {rect = #wse.rect<1, 2, 3x4>} :' in text
    assert "wse.yield %" in text
    text = print_module(build(*CASES["ws.optimizer_step"]))
    assert 'ws.optimizer_step "adam" {beta1 = 9.000000e-01 : f64, lr = 1.000000e-03 : f64}' in text
    text = print_module(build(*CASES["wse.weight/frozen-perm"]))
    assert 'wse.weight "c" {frozen, perm = array<i64: 2, 0, 1>} : tensor<4x2x3xf32>' in text
    text = print_module(build(*CASES["wse.kv_cache"]))
    assert 'wse.kv_cache "h.0.attn.key_cache" {capacity = 6 : i64} : tensor<12x4xf32>' in text


def test_locations_are_printed_and_parsed():
    module = build([T(2)], lambda x: [wse.NegOp(x).result])
    neg = body_ops(module)[0]
    neg.location = NameLoc(StringAttr("my_node"), NoneAttr())
    text = print_module(module)
    assert 'loc("my_node")' in text
    assert "loc(unknown)" not in text
    neg_again = body_ops(parse_module(text))[0]
    assert isinstance(neg_again.location, NameLoc)
    assert neg_again.location.desc.data == "my_node"


def test_rect_attr():
    rect = wse.RectAttr(1, 2, 3, 4)
    assert rect.as_tuple() == (1, 2, 3, 4)
    module = parse_module(
        "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
        '  %y = wse.layer "l"(%x) {rect = #wse.rect<5, 6, 7x8>} : (tensor<2xf32>) -> '
        "tensor<2xf32> {\n  ^bb0(%a: tensor<2xf32>):\n    wse.yield %a : tensor<2xf32>\n  }\n"
        "  func.return %y : tensor<2xf32>\n}\n"
    )
    layer = body_ops(module)[0]
    assert layer.rect.as_tuple() == (5, 6, 7, 8)
    assert layer.layer_name.data == "l"


def test_optimizer_step_settings():
    op = ws.OptimizerStepOp("sgd", {"momentum": 0.5, "lr": 0.25})
    op.verify()
    assert op.settings() == {"lr": 0.25, "momentum": 0.5}
    assert list(op.config.data) == ["lr", "momentum"]


# ---------------------------------------------------------------------------------------------
# Verifier: one broken rule per case
# ---------------------------------------------------------------------------------------------


def _fn(args: str, body: str) -> str:
    return f"func.func @main({args}) {{\n{body}\n  func.return\n}}\n"


INVALID = {
    "col2im of patches from another image": (
        _fn(
            "%p: tensor<2x50x18xf32>",
            "%r = wse.col2im %p {kernel = array<i64: 3, 3>, strides = array<i64: 1, 1>, "
            "pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 2 : i64} "
            ": tensor<2x50x18xf32> -> tensor<2x4x6x6xf32>",
        ),
        r"patches \(2, 50, 18\) do not come from an image \(2, 4, 6, 6\) "
        r"\(those would be \(2, 72, 18\)\)",
    ),
    "matmul shape mismatch": (
        _fn(
            "%a: tensor<4x3xf32>, %b: tensor<4x3xf32>",
            "%r = wse.matmul %a, %b : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>",
        ),
        r"matmul contraction mismatch: \(4, 3\) x \(4, 3\)",
    ),
    "matmul wrong result": (
        _fn(
            "%a: tensor<4x3xf32>, %b: tensor<3x2xf32>",
            "%r = wse.matmul %a, %b : (tensor<4x3xf32>, tensor<3x2xf32>) -> tensor<4x3xf32>",
        ),
        r"wse.matmul result shape \(4, 3\) does not match the inferred shape \(4, 2\)",
    ),
    "bad broadcast": (
        _fn(
            "%a: tensor<2x3xf32>, %b: tensor<4xf32>",
            "%r = wse.add %a, %b : (tensor<2x3xf32>, tensor<4xf32>) -> tensor<2x3xf32>",
        ),
        r"shapes \[\(2, 3\), \(4,\)\] do not broadcast",
    ),
    "mixed element types": (
        _fn(
            "%a: tensor<2xf32>, %b: tensor<2xf64>",
            "%r = wse.mul %a, %b : (tensor<2xf32>, tensor<2xf64>) -> tensor<2xf32>",
        ),
        r"operands have different element types",
    ),
    "reduce unsorted axes": (
        _fn(
            "%a: tensor<2x3x4xf32>",
            "%r = wse.reduce_sum %a {axes = array<i64: 2, 0>} : tensor<2x3x4xf32> -> tensor<3xf32>",
        ),
        r"axes must be sorted, got \(2, 0\)",
    ),
    "transpose non-permutation": (
        _fn(
            "%a: tensor<2x3xf32>",
            "%r = wse.transpose %a {perm = array<i64: 0, 0>} : tensor<2x3xf32> -> tensor<2x2xf32>",
        ),
        r"\(0, 0\) is not a permutation of 2 axes",
    ),
    "reshape element count": (
        _fn("%a: tensor<2x3xf32>", "%r = wse.reshape %a : tensor<2x3xf32> -> tensor<4x2xf32>"),
        r"cannot reshape \(2, 3\) into \(4, 2\)",
    ),
    "concat mismatch": (
        _fn(
            "%a: tensor<2x3xf32>, %b: tensor<3x2xf32>",
            "%r = wse.concat %a, %b {axis = 0 : i64} : (tensor<2x3xf32>, tensor<3x2xf32>) -> "
            "tensor<5x3xf32>",
        ),
        r"cannot concatenate \[\(2, 3\), \(3, 2\)\] on axis 0",
    ),
    "slice out of range": (
        _fn(
            "%a: tensor<4xf32>",
            "%r = wse.slice %a {starts = array<i64: 1>, limits = array<i64: 6>, "
            "strides = array<i64: 1>} : tensor<4xf32> -> tensor<5xf32>",
        ),
        r"bad slice \[1:6:1\] of an axis of size 4",
    ),
    "pad negative": (
        _fn(
            "%a: tensor<4xf32>",
            "%r = wse.pad %a {low = array<i64: -1>, high = array<i64: 2>} : "
            "tensor<4xf32> -> tensor<5xf32>",
        ),
        r"pad amounts must be non-negative",
    ),
    "one_hot float indices": (
        _fn("%a: tensor<4xf32>", "%r = wse.one_hot %a : tensor<4xf32> -> tensor<4x3xf32>"),
        r"indices must be integers",
    ),
    "conv channel mismatch": (
        _fn(
            "%x: tensor<1x3x5x5xf32>, %w: tensor<2x4x3x3xf32>",
            "%r = wse.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, "
            "dilations = array<i64: 1, 1>} : (tensor<1x3x5x5xf32>, tensor<2x4x3x3xf32>) -> "
            "tensor<1x2x3x3xf32>",
        ),
        r"conv channels do not match: input 3, filter \(2, 4, 3, 3\), group 1",
    ),
    "layer block args": (
        _fn(
            "%x: tensor<2xf32>",
            '%r = wse.layer "bad"(%x) : (tensor<2xf32>) -> tensor<3xf32> {\n'
            "  ^bb0(%a: tensor<3xf32>):\n    wse.yield %a : tensor<3xf32>\n  }",
        ),
        r"layer 'bad': block arguments do not match its inputs",
    ),
    "layer yield types": (
        _fn(
            "%x: tensor<2xf32>",
            '%r = wse.layer "bad"(%x) : (tensor<2xf32>) -> tensor<3xf32> {\n'
            "  ^bb0(%a: tensor<2xf32>):\n    wse.yield %a : tensor<2xf32>\n  }",
        ),
        r"layer 'bad': the body must end with a wse.yield of its results",
    ),
    "yield outside a layer": (
        "func.func @main(%x: tensor<2xf32>) {\n  wse.yield %x : tensor<2xf32>\n}\n",
        r"'wse.yield' expects parent op to be one of 'wse.layer', 'wse.fused_matmul'",
    ),
    "optimizer_step unknown optimizer": (
        _fn("", 'ws.optimizer_step "rmsprop" {lr = 1.000000e-01 : f64}'),
        r"unknown optimizer 'rmsprop' \(expected one of \('sgd', 'adam', 'adamw'\)\)",
    ),
    "optimizer_step non-float setting": (
        _fn("", 'ws.optimizer_step "sgd" {lr = 1 : i64}'),
        r"optimizer setting 'lr' must be a float",
    ),
    "weight perm of the wrong rank": (
        _fn("", '%w = wse.weight "w" {perm = array<i64: 1, 0, 2>} : tensor<2x3xf32>'),
        r"\(1, 0, 2\) is not a permutation of 2 axes",
    ),
    "stream_weight untyped perm": (
        _fn("", '%w = ws.stream_weight "w" {perm = array<i32: 1, 0>} : tensor<2x3xf32>'),
        r"perm",
    ),
    "softmax axis out of range": (
        _fn("%a: tensor<2x3xf32>", "%r = wse.softmax %a {axis = 2 : i64} : tensor<2x3xf32>"),
        r"axis 2 is out of range for rank 2",
    ),
    "cross-entropy labels": (
        _fn(
            "%s: tensor<3x5xf32>, %l: tensor<4xi64>",
            '%r = wse.softmax_cross_entropy %s, %l {reduction = "mean"} : '
            "(tensor<3x5xf32>, tensor<4xi64>) -> tensor<f32>",
        ),
        r"labels \(4,\) do not match scores \(3, 5\) without the class axis",
    ),
    "cross-entropy reduction": (
        _fn(
            "%s: tensor<3x5xf32>, %l: tensor<3xi64>",
            '%r = wse.softmax_cross_entropy %s, %l {reduction = "max"} : '
            "(tensor<3x5xf32>, tensor<3xi64>) -> tensor<f32>",
        ),
        r"unknown reduction 'max'",
    ),
    "batch_norm parameters": (
        _fn(
            "%x: tensor<2x3xf32>, %p: tensor<4xf32>",
            "%r = wse.batch_norm %x, %p, %p, %p, %p {epsilon = 1.0e-05 : f64} : (tensor<2x3xf32>,"
            " tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x3xf32>",
        ),
        r"parameters must have shape \(3,\)",
    ),
    "select condition": (
        _fn(
            "%c: tensor<2xf32>, %a: tensor<2xf32>",
            "%r = wse.select %c, %a, %a : (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> "
            "tensor<2xf32>",
        ),
        r"the condition must be a tensor of i1",
    ),
    "gather axis out of range": (
        _fn(
            "%d: tensor<3x4xf32>, %i: tensor<2xi64>",
            "%r = wse.gather %d, %i {axis = 2 : i64} : (tensor<3x4xf32>, tensor<2xi64>) -> "
            "tensor<3x2xf32>",
        ),
        r"gather axis 2 is out of range for rank 2",
    ),
    "gather non-integer indices": (
        _fn(
            "%d: tensor<3x4xf32>, %i: tensor<2xf32>",
            "%r = wse.gather %d, %i {axis = 1 : i64} : (tensor<3x4xf32>, tensor<2xf32>) -> "
            "tensor<3x2xf32>",
        ),
        r"indices must be integers",
    ),
    "gather_elements rank mismatch": (
        _fn(
            "%d: tensor<3x4xf32>, %i: tensor<2xi64>",
            "%r = wse.gather_elements %d, %i {axis = 0 : i64} : (tensor<3x4xf32>, tensor<2xi64>)"
            " -> tensor<2xf32>",
        ),
        r"indices must have the data's rank",
    ),
    "gather_nd indices too deep": (
        _fn(
            "%d: tensor<3x4xf32>, %i: tensor<2x3xi64>",
            "%r = wse.gather_nd %d, %i : (tensor<3x4xf32>, tensor<2x3xi64>) -> tensor<2xf32>",
        ),
        r"indices \(2, 3\) are too deep for data \(3, 4\)",
    ),
    "scatter_nd non-integer indices": (
        _fn(
            "%d: tensor<4x3xf32>, %i: tensor<2x1xf32>, %u: tensor<2x3xf32>",
            "%r = wse.scatter_nd %d, %i, %u : (tensor<4x3xf32>, tensor<2x1xf32>, tensor<2x3xf32>)"
            " -> tensor<4x3xf32>",
        ),
        r"indices must be integers",
    ),
    "scatter_elements unknown reduction": (
        _fn(
            "%d: tensor<3x4xf32>, %i: tensor<2x4xi64>, %u: tensor<2x4xf32>",
            '%r = wse.scatter_elements %d, %i, %u {axis = 0 : i64, reduction = "sub"} : '
            "(tensor<3x4xf32>, tensor<2x4xi64>, tensor<2x4xf32>) -> tensor<3x4xf32>",
        ),
        r"unknown reduction 'sub'",
    ),
    "cumsum axis out of range": (
        _fn("%a: tensor<2x3xf32>", "%r = wse.cumsum %a {axis = 2 : i64} : tensor<2x3xf32>"),
        r"axis 2 is out of range for rank 2",
    ),
    "topk k larger than the axis": (
        _fn(
            "%a: tensor<3x4xf32>",
            "%v, %i = wse.topk %a {axis = 1 : i64} : tensor<3x4xf32> -> tensor<3x5xf32>, "
            "tensor<3x5xi64>",
        ),
        r"cannot take 5 of \(3, 4\) along axis 1",
    ),
    "reverse axis out of range": (
        _fn(
            "%a: tensor<2x3xf32>",
            "%r = wse.reverse %a {axes = array<i64: 0, 2>} : tensor<2x3xf32>",
        ),
        r"axes \(0, 2\) out of range for rank 2",
    ),
    "tile repeats of the wrong rank": (
        _fn(
            "%a: tensor<2x3xf32>",
            "%r = wse.tile %a {repeats = array<i64: 2>} : tensor<2x3xf32> -> tensor<4x3xf32>",
        ),
        r"repeats \(2,\) do not fit a shape of rank 2",
    ),
    "pad unknown mode": (
        _fn(
            "%a: tensor<3x4xf32>",
            '%r = wse.pad %a {low = array<i64: 1, 0>, high = array<i64: 0, 1>, mode = "mirror"} '
            ": tensor<3x4xf32> -> tensor<4x5xf32>",
        ),
        r"unknown pad mode 'mirror'",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_verifier_rejects(case):
    text, message = INVALID[case]
    module = parse(text)
    with pytest.raises(VerifyException, match=message):
        module.verify()
    with pytest.raises(CgcError) as info:
        parse_module(text, "bad.mlir")
    assert str(info.value).startswith("bad.mlir: ")
    assert "\n" not in str(info.value)


def test_valid_variants_of_the_invalid_cases_verify():
    """The invalid cases differ from valid IR only in the broken rule."""
    parse_module(
        _fn(
            "%a: tensor<4x3xf32>, %b: tensor<3x2xf32>",
            "%r = wse.matmul %a, %b : (tensor<4x3xf32>, tensor<3x2xf32>) -> tensor<4x2xf32>\n"
            "%s = wse.reduce_sum %a {axes = array<i64: 0, 1>} : tensor<4x3xf32> -> tensor<f32>\n"
            "%t = wse.transpose %a {perm = array<i64: 1, 0>} : tensor<4x3xf32> -> tensor<3x4xf32>\n"
            "%p = wse.pad %a {low = array<i64: 0, 1>, high = array<i64: 2, 0>} : "
            "tensor<4x3xf32> -> tensor<6x4xf32>\n"
            '%w = wse.weight "w" {perm = array<i64: 1, 0>} : tensor<2x3xf32>\n'
            'ws.optimizer_step "adamw" {lr = 1.000000e-01 : f64}',
        )
    )


def test_valid_variants_of_the_new_invalid_cases_verify():
    """The invalid cases of the indexed, scan, sort and movement ops fixed: they verify."""
    parse_module(
        _fn(
            "%a: tensor<3x4xf32>, %i: tensor<2xi64>, %j: tensor<2x4xi64>, %u: tensor<2x4xf32>, "
            "%n: tensor<2x2xi64>",
            "%g = wse.gather %a, %i {axis = 1 : i64} : (tensor<3x4xf32>, tensor<2xi64>) -> "
            "tensor<3x2xf32>\n"
            "%e = wse.gather_elements %a, %j {axis = 0 : i64} : (tensor<3x4xf32>, "
            "tensor<2x4xi64>) -> tensor<2x4xf32>\n"
            "%d = wse.gather_nd %a, %n : (tensor<3x4xf32>, tensor<2x2xi64>) -> tensor<2xf32>\n"
            '%s = wse.scatter_elements %a, %j, %u {axis = 0 : i64, reduction = "mul"} : '
            "(tensor<3x4xf32>, tensor<2x4xi64>, tensor<2x4xf32>) -> tensor<3x4xf32>\n"
            "%c = wse.cumsum %a {axis = 1 : i64} : tensor<3x4xf32>\n"
            "%v, %k = wse.topk %a {axis = 1 : i64} : tensor<3x4xf32> -> tensor<3x4xf32>, "
            "tensor<3x4xi64>\n"
            "%r = wse.reverse %a {axes = array<i64: 0, 1>} : tensor<3x4xf32>\n"
            "%t = wse.tile %a {repeats = array<i64: 2, 1>} : tensor<3x4xf32> -> tensor<6x4xf32>\n"
            '%p = wse.pad %a {low = array<i64: 1, 0>, high = array<i64: 0, 1>, mode = "reflect"} '
            ": tensor<3x4xf32> -> tensor<4x5xf32>",
        )
    )


BAD_OPS = {
    # case: (arguments, body, the error)
    "bitcast of a different width": (
        "%x: tensor<3xf32>",
        "%r = wse.bitcast %x : tensor<3xf32> -> tensor<3xi64>",
        "cannot reinterpret float32 as int64: the widths differ",
    ),
    "bitcast of a sub-byte type": (
        "%x: tensor<3xi4>",
        "%r = wse.bitcast %x : tensor<3xi4> -> tensor<3xui4>",
        "cannot reinterpret int4: its values are narrower than a byte",
    ),
    "scatter_elements axis out of range": (
        "%d: tensor<3x4xf32>, %i: tensor<2x4xi64>, %u: tensor<2x4xf32>",
        "%r = wse.scatter_elements %d, %i, %u {axis = 2 : i64} : "
        "(tensor<3x4xf32>, tensor<2x4xi64>, tensor<2x4xf32>) -> tensor<3x4xf32>",
        "axis 2 is out of range for rank 2",
    ),
    "scatter_elements updates unlike indices": (
        "%d: tensor<3x4xf32>, %i: tensor<2x4xi64>, %u: tensor<2x3xf32>",
        "%r = wse.scatter_elements %d, %i, %u {axis = 0 : i64} : "
        "(tensor<3x4xf32>, tensor<2x4xi64>, tensor<2x3xf32>) -> tensor<3x4xf32>",
        r"updates must have shape \(2, 4\)",
    ),
    "scatter_nd updates of the wrong shape": (
        "%d: tensor<4x3xf32>, %i: tensor<2x1xi64>, %u: tensor<2x4xf32>",
        "%r = wse.scatter_nd %d, %i, %u : "
        "(tensor<4x3xf32>, tensor<2x1xi64>, tensor<2x4xf32>) -> tensor<4x3xf32>",
        r"updates must have shape \(2, 3\)",
    ),
    "topk float indices": (
        "%x: tensor<3x5xf32>",
        "%v, %i = wse.topk %x {axis = 1 : i64} : tensor<3x5xf32> -> tensor<3x2xf32>, "
        "tensor<3x2xf32>",
        "the indices must have element type i64",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_OPS))
def test_verifier_rejects_bad_ops(case):
    args, body, error = BAD_OPS[case]
    with pytest.raises(VerifyException, match=error):
        parse(_fn(args, body)).verify()


def test_rect_attr_rejects_empty_and_negative():
    with pytest.raises(VerifyException, match=r"rectangle size must be positive, got 0x4"):
        wse.RectAttr(0, 0, 0, 4)
    with pytest.raises(VerifyException, match=r"rectangle size must be positive, got 3x0"):
        wse.RectAttr(1, 1, 3, 0)
    with pytest.raises(VerifyException, match=r"rectangle origin must be non-negative"):
        wse.RectAttr(-1, 0, 2, 2)


def test_rect_attr_zero_size_in_text_is_an_error():
    text = (
        "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
        '  %y = wse.layer "l"(%x) {rect = #wse.rect<0, 0, 0x4>} : (tensor<2xf32>) -> '
        "tensor<2xf32> {\n  ^bb0(%a: tensor<2xf32>):\n    wse.yield %a : tensor<2xf32>\n  }\n"
        "  func.return %y : tensor<2xf32>\n}\n"
    )
    with pytest.raises(CgcError, match=r"rect\.mlir: .*rectangle size must be positive"):
        parse_module(text, "rect.mlir")


@pytest.mark.parametrize(
    ("build_op", "message"),
    [
        (lambda a, b: wse.MatmulOp(a, a), r"matmul contraction mismatch"),
        (lambda a, b: wse.AddOp(a, b), r"do not broadcast"),
        (lambda a, b: wse.TransposeOp(a, [1, 1]), r"is not a permutation"),
        (lambda a, b: wse.ReduceSumOp(a, [0, 0], False), r"bad reduction axes"),
        (lambda a, b: wse.ConcatOp([a, b], 0), r"cannot concatenate"),
        (lambda a, b: wse.SliceOp(a, [0, 0], [3, 9], [1, 1]), r"bad slice"),
    ],
)
def test_typed_builders_reject_bad_shapes(build_op, message):
    """The builders infer shapes with the verifier's rules, so they fail the same way."""
    block = Block(arg_types=[T(2, 3), T(4)])
    with pytest.raises(VerifyException, match=message):
        build_op(*block.args)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def test_properties_as_python():
    block = Block(arg_types=[T(2, 3, 4)])
    x = block.args[0]
    assert wse.properties_as_python(wse.ReduceMeanOp(x, [0, 2], True)) == {
        "axes": [0, 2],
        "keepdims": True,
    }
    assert wse.properties_as_python(wse.ReduceMeanOp(x, [1], False))["keepdims"] is False
    pad = wse.properties_as_python(wse.PadOp(x, [0, 1, 2], [3, 0, 0], -2.5))
    assert pad == {"high": [3, 0, 0], "low": [0, 1, 2], "mode": "constant", "value": -2.5}
    assert isinstance(pad["value"], float)
    weight = wse.properties_as_python(wse.WeightOp("w", T(4, 2), frozen=True, perm=[1, 0]))
    assert weight == {"frozen": True, "name": "w", "perm": [1, 0]}
    assert wse.properties_as_python(wse.WeightOp("v", T(2))) == {"name": "v"}
    conv = wse.properties_as_python(
        wse.ConvOp(block.args[0], wse.WeightOp("f", T(6, 1, 2)).result, [1], [0, 1], [1], 3)
    )
    assert conv == {"dilations": [1], "group": 3, "pads": [0, 1], "strides": [1]}
    assert isinstance(conv["group"], int) and not isinstance(conv["group"], bool)
    ce = wse.properties_as_python(
        wse.SoftmaxCrossEntropyOp(
            Block(arg_types=[T(3, 5)]).args[0],
            Block(arg_types=[T(3, el=i64)]).args[0],
            None,
            "sum",
            -100,
        )
    )
    assert ce == {"ignore_index": -100, "reduction": "sum"}
    assert list(wse.properties_as_python(wse.ReduceSumOp(x, [0], False))) == ["axes", "keepdims"]


def test_properties_as_python_of_the_new_ops():
    """The kernels read these attributes as plain Python values, defaults included."""
    x = Block(arg_types=[T(2, 3, 4)]).args[0]
    props = wse.properties_as_python
    assert props(wse.CastOp(x, f16)) == {"saturate": True}
    assert props(wse.CastOp(x, f16, saturate=False)) == {"saturate": False}
    assert props(wse.TopKOp(x, 2, 3, True)) == {"axis": 2, "largest": True}
    assert props(wse.CumSumOp(x, 1, True, False)) == {
        "axis": 1, "exclusive": True, "reverse": False,
    }  # fmt: skip
    assert props(wse.ReverseOp(x, [2, 0])) == {"axes": [2, 0]}
    assert props(wse.TileOp(x, [1, 2, 3])) == {"repeats": [1, 2, 3]}
    assert props(wse.PadOp(x, [0, 1, 0], [1, 0, 0], mode="wrap"))["mode"] == "wrap"
    image = Block(arg_types=[T(1, 1, 4, 4)]).args[0]
    pool = props(wse.ArgMaxPoolOp(image, [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], 1))
    assert pool["storage_order"] == 1 and not isinstance(pool["storage_order"], bool)
    indices = Block(arg_types=[T(2, 3, 4, el=i64)]).args[0]
    scatter = props(wse.ScatterElementsOp(x, indices, x, 1, "max"))
    assert scatter == {"axis": 1, "reduction": "max"}
    assert props(wse.GatherNDOp(x, Block(arg_types=[T(2, 1, el=i64)]).args[0], 0)) == {
        "batch_dims": 0
    }
    # parsed without the properties that have defaults: the defaults are filled in
    module = parse_module(
        _fn(
            "%a: tensor<2x3xf32>",
            "%c = wse.cast %a : tensor<2x3xf32> -> tensor<2x3xf16>\n"
            "%v, %i = wse.topk %a {axis = 1 : i64} : tensor<2x3xf32> -> tensor<2x2xf32>, "
            "tensor<2x2xi64>\n"
            "%s = wse.cumsum %a {axis = 0 : i64} : tensor<2x3xf32>",
        )
    )
    cast, topk, cumsum = body_ops(module)
    assert props(cast) == {"saturate": True}
    assert props(topk) == {"axis": 1, "largest": True}
    assert props(cumsum) == {"axis": 0, "exclusive": False, "reverse": False}


@pytest.mark.parametrize(
    "array",
    [
        np.array([[1.5, -2.0, 3.25], [0.0, 1e-30, 3e38]], dtype=np.float32),
        np.array(2.5, dtype=np.float32),
        np.array([1, -2, 2**62, -(2**63)], dtype=np.int64),
        np.array([[True, False, True], [False, False, True]]),
        np.array(True),
        np.array([0.1, 1 / 3], dtype=np.float64),
        np.array([1.5, -2.0], dtype=">f4"),
        np.arange(6, dtype=np.int32).reshape(3, 2).T,
    ],
)
def test_dense_attr_round_trip(array):
    attr = wse.dense_attr(array)
    assert wse.tensor_shape(attr.type) == array.shape
    back = dense_to_numpy(attr)
    assert back.dtype == np.dtype(array.dtype.name)
    np.testing.assert_array_equal(back, array)
    # and through the IR text
    module = build([], lambda: [wse.ConstantOp(attr).result])
    reparsed = body_ops(parse_module(print_module(module)))[0]
    again = dense_to_numpy(reparsed.value)
    assert again.dtype == back.dtype
    np.testing.assert_array_equal(again, array)


def test_numpy_dtype_and_element_of_numpy():
    pairs = {
        f64: "float64",
        f32: "float32",
        f16: "float16",
        i64: "int64",
        i32: "int32",
        i16: "int16",
        i8: "int8",
        IntegerType(8, Signedness.UNSIGNED): "uint8",
        i1: "bool",
    }
    for element, name in pairs.items():
        assert wse.numpy_dtype(element) == name
        assert wse.element_of_numpy(name) == element
        assert wse.element_of_numpy(np.dtype(name)) == element
    assert wse.element_of_numpy(">f4") == f32
    assert wse.numpy_dtype(BFloat16Type()) == "bfloat16"
    assert wse.element_of_numpy("uint16") == IntegerType(16, Signedness.UNSIGNED)
    assert wse.element_of_numpy(ml_dtypes.float8_e4m3fn) == Float8E4M3FNType()
    with pytest.raises(ValueError, match="not supported"):
        wse.numpy_dtype(ComplexType(f32))
    with pytest.raises(ValueError, match="dtype complex64 is not supported"):
        wse.element_of_numpy(np.complex64)


def test_mnemonic_and_shape_helpers():
    block = Block(arg_types=[T(2, 3, el=i64)])
    op = wse.ReduceMaxOp(block.args[0], [1], False)
    assert wse.mnemonic(op) == "reduce_max"
    assert wse.tensor_shape(op.result) == (2,)
    assert wse.tensor_shape(T(4, 5)) == (4, 5)
    assert wse.element_type(op.result) == i64
    assert op.axis_list == (1,) and op.keeps_dims is False


BOGUS = "func.func @main() {\n  %x = wse.bogus : tensor<2xf32>\n}\n"


def test_parse_module_turns_a_parse_error_into_one_line():
    with pytest.raises(CgcError) as info:
        parse_module(BOGUS, "model.mlir")
    message = str(info.value)
    assert message.startswith("model.mlir")
    assert "\n" not in message


def test_parse_error_message_says_what_is_wrong():
    with pytest.raises(CgcError) as info:
        parse_module(BOGUS, "model.mlir")
    message = str(info.value)
    assert "Operation wse.bogus is not registered" in message
    assert message.count("model.mlir") == 1
    assert "2:18" in message


def test_parse_module_turns_a_verify_error_into_one_line():
    text, _ = INVALID["matmul shape mismatch"]
    with pytest.raises(CgcError) as info:
        parse_module(text, "net.mlir")
    message = str(info.value)
    assert (
        message == "net.mlir: invalid IR: wse.matmul: matmul contraction mismatch: (4, 3) x (4, 3)"
    )


def test_parse_module_default_source_and_success():
    with pytest.raises(CgcError, match=r"^<text>:1:17: Expected argument or type$"):
        parse_module("func.func @main(")
    module = parse_module(
        'func.func @main() -> tensor<2xf32> {\n  %w = wse.weight "w" : tensor<2xf32>\n'
        "  func.return %w : tensor<2xf32>\n}\n"
    )
    assert isinstance(module, ModuleOp)
    assert print_module(module).endswith("}\n")


def test_verify_error_names_the_op_or_its_location():
    text = _fn(
        "%a: tensor<2x3xf32>",
        '%r = wse.reshape %a : tensor<2x3xf32> -> tensor<4x2xf32> loc("flatten")',
    )
    with pytest.raises(CgcError) as info:
        parse_module(text, "net.mlir")
    message = str(info.value)
    assert "wse.reshape" in message or "flatten" in message, message
