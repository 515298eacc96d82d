"""The compiler passes: semantics preserved (checked with the IR interpreter and, for the
composite ops, with PyTorch), and the structure each pass promises."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Sequence

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from ir_builders import T, apply, build, loc
from onnx import TensorProto, helper, numpy_helper
from xdsl.builder import ImplicitBuilder
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ModuleOp,
    NameLoc,
    TensorType,
    f32,
    f64,
    i1,
    i64,
)
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.rewriter import Rewriter

from cgc.cli import main as cli
from cgc.compiler.driver import compile_model
from cgc.compiler.pipelines import pass_spec, pipeline
from cgc.compiler.training import Training
from cgc.dialects import context, parse_module, print_module, ws, wse
from cgc.dialects.interpreter import Interpreter
from cgc.dialects.ir import dense_to_numpy, main_function, module_target, set_module_target
from cgc.dialects.lowering import layer_works, lower
from cgc.errors import CgcError, DoesNotFitError
from cgc.frontends import zoo
from cgc.frontends.onnx import ImportedModel, import_model
from cgc.machine.hardware.target import Target, get_target
from cgc.machine.movement.traffic import overlap
from cgc.machine.timing.cost import program_costs
from cgc.passes import all_passes
from cgc.passes.autodiff import AutodiffPass
from cgc.passes.channels_last import ChannelsLastPass, channels_to_front
from cgc.passes.decompose import DecomposePass
from cgc.passes.fold_constants import INLINE_LIMIT, FoldConstantsPass
from cgc.passes.form_layers import FormLayersPass
from cgc.passes.place_layers import PlaceLayersPass
from cgc.passes.place_layers.placer import Placer
from cgc.passes.schedule_streams import ScheduleStreamsPass
from cgc.runtime.cluster import Cluster

COMPOSITES = {
    "wse.softmax",
    "wse.log_softmax",
    "wse.layer_norm",
    "wse.batch_norm",
    "wse.softmax_cross_entropy",
    "wse.conv",
}


def run(module: ModuleOp, inputs: Sequence[np.ndarray], weights=None) -> list[np.ndarray]:
    return Interpreter(weights or {}).run_function(main_function(module), list(inputs))


def top_ops(module: ModuleOp) -> list[Operation]:
    return list(main_function(module).body.block.ops)


def layers(module: ModuleOp) -> list[wse.LayerOp]:
    return [op for op in top_ops(module) if isinstance(op, wse.LayerOp)]


def names(ops) -> list[str]:
    return [op.name for op in ops]


def random_inputs(module: ModuleOp, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for arg in main_function(module).body.block.args:
        dtype = wse.numpy_dtype(wse.element_type(arg))
        shape = wse.tensor_shape(arg)
        if dtype == "bool":
            out.append(rng.random(shape) < 0.5)
        elif np.dtype(dtype).kind == "i":
            out.append(rng.integers(0, 3, shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def feeds_for(imported: ImportedModel, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for spec in imported.inputs:
        if np.dtype(spec.dtype).kind == "i":
            out.append(rng.integers(0, 10, spec.shape).astype(spec.dtype))
        else:
            out.append(rng.standard_normal(spec.shape).astype(spec.dtype))
    return out


def with_target(module: ModuleOp, target: str) -> ModuleOp:
    set_module_target(module, get_target(target))
    return module


def imported_zoo(name: str, batch: int = 2, **kwargs) -> ImportedModel:
    return import_model(zoo.MODELS[name](**kwargs), batch_size=batch)


def assert_same(got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol=1e-5, atol=1e-6):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# decompose
# ---------------------------------------------------------------------------------------------


def t64(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def _ce_ref(scores, labels, weights=None, reduction="mean", ignore_index=None):
    kwargs = {} if ignore_index is None else {"ignore_index": ignore_index}
    w = None if weights is None else t64(weights)
    out = F.cross_entropy(t64(scores), torch.from_numpy(labels), w, reduction=reduction, **kwargs)
    return out.numpy()


def _ln_ref(x, scale, bias, axis, eps):
    y = F.layer_norm(t64(x), x.shape[axis:], eps=eps) * t64(scale)
    return (y if bias is None else y + t64(bias)).numpy()


def _bn_ref(x, scale, bias, mean, var, eps):
    return F.batch_norm(
        t64(x), t64(mean), t64(var), t64(scale), t64(bias), training=False, eps=eps
    ).numpy()


def _conv_ref(x, w, strides, pads, dilations, group):
    s = x.ndim - 2
    pad = []
    for i in reversed(range(s)):  # F.pad takes the last axis first
        pad += [pads[i], pads[s + i]]
    xp = F.pad(t64(x), pad)
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[s]
    return conv(xp, t64(w), stride=strides, dilation=dilations, groups=group).numpy()


LABELS = np.array([0, 2, 3, 2, 1], dtype=np.int64)
LABELS3 = np.array([[0, 2, 3], [2, 2, 1]], dtype=np.int64)


def _decompose_cases():
    cases = {}
    for axis in range(3):
        cases[f"softmax-axis{axis}"] = (
            [T(2, 3, 4)],
            lambda x, a=axis: [wse.SoftmaxOp(x, a).result],
            lambda x, a=axis: torch.softmax(t64(x), a).numpy(),
        )
        cases[f"log_softmax-axis{axis}"] = (
            [T(2, 3, 4)],
            lambda x, a=axis: [wse.LogSoftmaxOp(x, a).result],
            lambda x, a=axis: torch.log_softmax(t64(x), a).numpy(),
        )
    cases["layer_norm-bias"] = (
        [T(2, 3, 4), T(3, 4), T(4)],
        lambda x, s, b: [wse.LayerNormOp(x, s, b, 1, 1e-5).result],
        lambda x, s, b: _ln_ref(x, s, b, 1, 1e-5),
    )
    cases["layer_norm-no-bias"] = (
        [T(2, 3, 4), T(4)],
        lambda x, s: [wse.LayerNormOp(x, s, None, 2, 1e-3).result],
        lambda x, s: _ln_ref(x, s, None, 2, 1e-3),
    )
    cases["layer_norm-axis0"] = (
        [T(2, 3, 4), T(1, 4), T(3, 1)],
        lambda x, s, b: [wse.LayerNormOp(x, s, b, 0, 1e-5).result],
        lambda x, s, b: _ln_ref(x, s, b, 0, 1e-5),
    )
    cases["batch_norm-rank4"] = (
        [T(2, 3, 4, 5), T(3), T(3), T(3), T(3)],
        lambda x, s, b, m, v: [wse.BatchNormOp(x, s, b, m, v, 1e-5).result],
        lambda x, s, b, m, v: _bn_ref(x, s, b, m, v, 1e-5),
    )
    cases["batch_norm-rank2"] = (
        [T(4, 3), T(3), T(3), T(3), T(3)],
        lambda x, s, b, m, v: [wse.BatchNormOp(x, s, b, m, v, 1e-2).result],
        lambda x, s, b, m, v: _bn_ref(x, s, b, m, v, 1e-2),
    )
    for reduction in ("mean", "sum", "none"):
        for ignore in (None, 2):
            for weighted in (False, True):
                key = f"cross_entropy-{reduction}-ignore{ignore}-w{int(weighted)}"
                args = [T(5, 4), T(5, el=i64)] + ([T(4)] if weighted else [])
                cases[key] = (
                    args,
                    lambda s, lab, *w, r=reduction, ii=ignore: [
                        wse.SoftmaxCrossEntropyOp(s, lab, w[0] if w else None, r, ii).result
                    ],
                    lambda s, lab, *w, r=reduction, ii=ignore: _ce_ref(
                        s, lab, w[0] if w else None, r, ii
                    ),
                )
    for reduction in ("mean", "none", "sum"):
        cases[f"cross_entropy-rank3-{reduction}"] = (
            [T(2, 4, 3), T(2, 3, el=i64), T(4)],
            lambda s, lab, w, r=reduction: [wse.SoftmaxCrossEntropyOp(s, lab, w, r, 2).result],
            lambda s, lab, w, r=reduction: _ce_ref(s, lab, w, r, 2),
        )
    cases["cross_entropy-rank3-plain"] = (
        [T(2, 4, 3), T(2, 3, el=i64)],
        lambda s, lab: [wse.SoftmaxCrossEntropyOp(s, lab, None, "mean", None).result],
        lambda s, lab: _ce_ref(s, lab),
    )
    conv_cases = {
        "conv2d-groups-strides-dilations-pads": ((2, 4, 7, 6), (6, 2, 3, 2), [2, 1],
                                                 [1, 0, 2, 1], [1, 2], 2),
        "conv2d-plain": ((1, 3, 5, 5), (4, 3, 3, 3), [1, 1], [0, 0, 0, 0], [1, 1], 1),
        "conv2d-depthwise": ((2, 4, 5, 5), (4, 1, 3, 3), [1, 2], [1, 1, 1, 1], [1, 1], 4),
        "conv1d": ((2, 3, 9), (4, 3, 3), [2], [1, 1], [2], 1),
        "conv3d": ((1, 2, 4, 4, 3), (2, 2, 2, 2, 2), [1, 1, 1], [0, 1, 0, 1, 0, 1],
                   [1, 1, 1], 1),
    }  # fmt: skip
    for key, (xs, ws_, st, pd, dl, g) in conv_cases.items():
        cases[key] = (
            [T(*xs), T(*ws_)],
            lambda x, w, st=st, pd=pd, dl=dl, g=g: [wse.ConvOp(x, w, st, pd, dl, g).result],
            lambda x, w, st=st, pd=pd, dl=dl, g=g: _conv_ref(x, w, st, pd, dl, g),
        )
    return cases


DECOMPOSE_CASES = _decompose_cases()


def _composite_inputs(case: str, module: ModuleOp) -> list[np.ndarray]:
    inputs = random_inputs(module, seed=len(case))
    if case.startswith("batch_norm"):
        inputs[4] = np.abs(inputs[4]) + 0.5  # a variance
    if case.startswith("cross_entropy"):
        inputs[1] = LABELS3 if "rank3" in case else LABELS
        if len(inputs) > 2:
            inputs[2] = np.abs(inputs[2]) + 0.1  # class weights
    return inputs


@pytest.mark.parametrize("case", sorted(DECOMPOSE_CASES))
def test_decompose_preserves_semantics(case):
    arg_types, body, reference = DECOMPOSE_CASES[case]
    module = build(arg_types, body)
    composite = top_ops(module)[-2]
    composite.location = loc("node7")
    inputs = _composite_inputs(case, module)
    (before,) = run(module, inputs)
    want = reference(*inputs)
    # the interpreter's own formula for the composite agrees with PyTorch ...
    np.testing.assert_allclose(before, want, rtol=1e-5, atol=1e-5)
    apply(module, DecomposePass())
    ops = top_ops(module)
    assert not COMPOSITES & set(names(ops))
    # ... and so do the primitives decompose produces
    (after,) = run(module, inputs)
    assert after.shape == before.shape and after.dtype == before.dtype == np.float32
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(after, want, rtol=1e-5, atol=1e-5)
    # every new op keeps the composite's location
    for op in ops[:-1]:
        assert isinstance(op.location, NameLoc) and op.location.desc.data == "node7", op.name
    # and the result still prints and parses
    assert print_module(parse_module(print_module(module))) == print_module(module)


def test_decompose_float64():
    module = build([T(3, 5, el=f64)], lambda x: [wse.LogSoftmaxOp(x, 1).result])
    x = np.random.default_rng(0).standard_normal((3, 5)) * 30
    apply(module, DecomposePass())
    (got,) = run(module, [x])
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, torch.log_softmax(t64(x), 1).numpy(), rtol=1e-13)


def test_decompose_is_stable_for_large_scores():
    """Softmax subtracts the maximum, so large scores do not overflow."""
    module = build([T(2, 3)], lambda x: [wse.SoftmaxOp(x, 1).result])
    apply(module, DecomposePass())
    x = np.array([[1000.0, 999.0, -1000.0], [88.0, 89.0, 90.0]], dtype=np.float32)
    (got,) = run(module, [x])
    np.testing.assert_allclose(got, torch.softmax(t64(x), 1).numpy(), rtol=1e-5, atol=1e-7)


def test_decompose_primitive_sequences():
    module = build([T(2, 3)], lambda x: [wse.SoftmaxOp(x, 1).result])
    apply(module, DecomposePass())
    assert names(top_ops(module)) == [
        "wse.reduce_max", "wse.stop_gradient", "wse.sub", "wse.exp", "wse.reduce_sum", "wse.div",
        "func.return",
    ]  # fmt: skip
    module = build([T(2, 3)], lambda x: [wse.LogSoftmaxOp(x, 1).result])
    apply(module, DecomposePass())
    assert names(top_ops(module)) == [
        "wse.reduce_max", "wse.stop_gradient", "wse.sub", "wse.exp", "wse.reduce_sum", "wse.log",
        "wse.sub", "func.return",
    ]  # fmt: skip
    module = build(*DECOMPOSE_CASES["conv2d-plain"][:2])
    apply(module, DecomposePass())
    assert names(top_ops(module)) == [
        "wse.im2col", "wse.reshape", "wse.transpose", "wse.matmul", "wse.reshape",
        "wse.transpose", "func.return",
    ]  # fmt: skip


def test_decompose_leaves_primitives_alone():
    module = build([T(2, 3)], lambda x: [wse.ReluOp(wse.ExpOp(x).result).result])
    text = print_module(module)
    apply(module, DecomposePass())
    assert print_module(module) == text


def test_decompose_inside_layers_and_nested_composites():
    """A softmax feeding a layer norm: both lowered, in one run."""

    def body(x, s):
        return [wse.LayerNormOp(wse.SoftmaxOp(x, 0).result, s, None, 1, 1e-5).result]

    module = build([T(3, 4), T(4)], body)
    inputs = random_inputs(module)
    (before,) = run(module, inputs)
    apply(module, DecomposePass())
    assert not COMPOSITES & set(names(top_ops(module)))
    (after,) = run(module, inputs)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# fold-constants
# ---------------------------------------------------------------------------------------------


def const(array) -> SSAValue:
    return wse.ConstantOp(wse.dense_attr(np.asarray(array))).result


def constant_value(op: Operation) -> np.ndarray:
    assert isinstance(op, wse.ConstantOp)
    return dense_to_numpy(op.value)


def test_fold_constant_chain():
    a = np.array([1.0, 2.0, -4.0], dtype=np.float32)

    def body():
        c = wse.MulOp(const(a), const(np.float32(0.5))).result
        e = wse.ExpOp(c)
        e.location = loc("e")
        s = wse.ReduceSumOp(e.result, [0], False)
        s.location = loc("total")
        return [s.result]

    module = apply(build([], body), FoldConstantsPass())
    ops = top_ops(module)
    assert names(ops) == ["wse.constant", "func.return"]
    value = constant_value(ops[0])
    assert value.dtype == np.float32 and value.shape == ()
    np.testing.assert_allclose(value, np.exp(a * 0.5).sum(), rtol=1e-6)
    assert ops[0].location.desc.data == "total"


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: wse.AddOp(const(np.array([1, 2], np.int64)), const(np.int64(5))),
         np.array([6, 7], np.int64)),
        (lambda: wse.GreaterOp(const(np.array([1.0, 3.0], np.float32)),
                               const(np.float32(2.0))),
         np.array([False, True])),
        (lambda: wse.SelectOp(const(np.array([True, False])), const(np.float32(1.5)),
                              const(np.array([7.0, 8.0], np.float32))),
         np.array([1.5, 8.0], np.float32)),
        (lambda: wse.CastOp(const(np.array([1.7, -2.2], np.float32)), i64),
         np.array([1, -2], np.int64)),
        (lambda: wse.TransposeOp(const(np.arange(6, dtype=np.float32).reshape(2, 3)), [1, 0]),
         np.arange(6, dtype=np.float32).reshape(2, 3).T),
        (lambda: wse.OneHotOp(const(np.array([2, 0, 5], np.int64)), 3, f32),
         np.array([[0, 0, 1], [1, 0, 0], [0, 0, 0]], np.float32)),
        (lambda: wse.ConcatOp([const(np.array([1.0], np.float32)),
                               const(np.array([2.0, 3.0], np.float32))], 0),
         np.array([1.0, 2.0, 3.0], np.float32)),
        (lambda: wse.MatmulOp(const(np.eye(2, dtype=np.float64) * 2),
                              const(np.array([[1.0], [3.0]]))),
         np.array([[2.0], [6.0]])),
    ],
)  # fmt: skip
def test_fold_constant_primitives(make, expected):
    module = apply(build([], lambda: [make().results[0]]), FoldConstantsPass())
    ops = top_ops(module)
    assert names(ops) == ["wse.constant", "func.return"]
    value = constant_value(ops[0])
    assert value.dtype == expected.dtype
    np.testing.assert_array_equal(value, expected)
    again = parse_module(print_module(module))
    np.testing.assert_array_equal(constant_value(top_ops(again)[0]), expected)


def test_fold_needs_every_operand_constant():
    module = build([T(3)], lambda x: [wse.AddOp(x, const(np.float32(1.0))).result])
    apply(module, FoldConstantsPass())
    assert names(top_ops(module)) == ["wse.constant", "wse.add", "func.return"]


@pytest.mark.parametrize(("shape", "folds"), [((8, 8), True), ((5, 13), False)])
def test_fold_inline_limit(shape, folds):
    assert INLINE_LIMIT == 64
    module = build([], lambda: [wse.BroadcastToOp(const(np.float32(2.0)), shape).result])
    apply(module, FoldConstantsPass())
    ops = top_ops(module)
    if folds:
        assert names(ops) == ["wse.constant", "func.return"]
        np.testing.assert_array_equal(constant_value(ops[0]), np.full(shape, 2.0, np.float32))
    else:
        assert names(ops) == ["wse.constant", "wse.broadcast_to", "func.return"]


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda: wse.LogOp(const(np.array([0.0, 1.0], np.float32))), "log(0)"),
        (lambda: wse.DivOp(const(np.float32(1.0)), const(np.float32(0.0))), "1/0"),
        (lambda: wse.SqrtOp(const(np.array([-1.0], np.float32))), "sqrt(-1)"),
        (lambda: wse.ExpOp(const(np.float32(100.0))), "exp overflow"),
    ],
)
def test_fold_never_makes_non_finite_values(make, kind):
    module = apply(build([], lambda: [make().results[0]]), FoldConstantsPass())
    ops = top_ops(module)
    assert len(ops) > 2, kind
    for op in ops:
        if isinstance(op, wse.ConstantOp):
            assert np.isfinite(constant_value(op)).all(), kind
    text = print_module(module)
    assert print_module(parse_module(text)) == text


def test_fold_reshape_and_transpose_of_weights_into_views():
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((6, 4)).astype(np.float32)}

    def body():
        w = wse.WeightOp("w", T(6, 4)).result
        r = wse.ReshapeOp(w, (2, 3, 4)).result
        t = wse.TransposeOp(r, [2, 0, 1]).result  # (4, 2, 3)
        return [r, t, wse.TransposeOp(t, [0, 2, 1]).result]  # (4, 3, 2)

    module = build([], body)
    before = run(module, [], weights)
    np.testing.assert_array_equal(before[2], weights["w"].reshape(2, 3, 4).transpose(2, 1, 0))
    apply(module, FoldConstantsPass())
    ops = top_ops(module)
    assert names(ops) == ["wse.weight"] * 3 + ["func.return"]
    views = [
        (
            op.weight_name.data,
            wse.tensor_shape(op.result),
            None if op.perm is None else list(op.perm.get_values()),
        )
        for op in ops[:-1]
    ]
    assert views == [
        ("w", (2, 3, 4), None),
        ("w", (4, 2, 3), [2, 0, 1]),
        ("w", (4, 3, 2), [2, 1, 0]),  # perm composition: [2, 0, 1] then [0, 2, 1]
    ]  # fmt: skip
    assert_same(run(module, [], weights), before, rtol=0, atol=0)


def test_fold_transpose_of_transposed_weight():
    weights = {"w": np.arange(24, dtype=np.float32).reshape(2, 3, 4)}

    def body():
        w = wse.WeightOp("w", T(2, 3, 4), frozen=True).result
        t = wse.TransposeOp(w, [1, 2, 0]).result
        return [wse.TransposeOp(t, [2, 0, 1]).result, wse.TransposeOp(t, [1, 0, 2]).result]

    module = build([], body)
    before = run(module, [], weights)
    apply(module, FoldConstantsPass())
    ops = top_ops(module)
    assert names(ops) == ["wse.weight", "wse.weight", "func.return"]
    assert [list(op.perm.get_values()) for op in ops[:2]] == [[0, 1, 2], [2, 1, 0]]
    assert all(op.frozen is not None for op in ops[:2])
    assert_same(run(module, [], weights), before, rtol=0, atol=0)


def test_fold_keeps_reshape_of_a_permuted_weight():
    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}

    def body():
        t = wse.TransposeOp(wse.WeightOp("w", T(2, 3)).result, [1, 0]).result
        return [wse.ReshapeOp(t, (6,)).result]

    module = build([], body)
    before = run(module, [], weights)
    apply(module, FoldConstantsPass())
    assert names(top_ops(module)) == ["wse.weight", "wse.reshape", "func.return"]
    assert list(top_ops(module)[0].perm.get_values()) == [1, 0]
    assert_same(run(module, [], weights), before, rtol=0, atol=0)


def test_fold_removes_identity_ops_only():
    def body(x, sq):
        a = wse.ReshapeOp(x, (2, 3)).result
        b = wse.BroadcastToOp(a, (2, 3)).result
        c = wse.CastOp(b, f32).result
        d = wse.TransposeOp(c, [0, 1]).result
        e = wse.TransposeOp(sq, [1, 0]).result  # same type, not the identity
        return [d, e]

    module = build([T(2, 3), T(3, 3)], body)
    inputs = random_inputs(module)
    before = run(module, inputs)
    apply(module, FoldConstantsPass())
    assert names(top_ops(module)) == ["wse.transpose", "func.return"]
    ret = top_ops(module)[-1]
    assert ret.operands[0] is main_function(module).body.block.args[0]
    assert_same(run(module, inputs), before, rtol=0, atol=0)


def test_fold_erases_dead_pure_ops_only():
    def body(x):
        wse.ExpOp(x)
        wse.WeightOp("unused", T(2))
        wse.MatmulOp(wse.ReshapeOp(x, (1, 2)).result, wse.ReshapeOp(x, (2, 1)).result)
        ws.StreamGradientOp("g", x)
        ws.OptimizerStepOp("sgd", {"lr": 0.1})
        return [wse.NegOp(x).result]

    module = apply(build([T(2)], body), FoldConstantsPass())
    assert names(top_ops(module)) == [
        "ws.stream_gradient", "ws.optimizer_step", "wse.neg", "func.return"
    ]  # fmt: skip


def test_fold_inside_layers():
    def body(x):
        block = Block(arg_types=[x.type])
        with ImplicitBuilder(block):
            one = wse.AddOp(const(np.float32(0.5)), const(np.float32(0.5))).result
            wse.YieldOp(wse.MulOp(block.args[0], one).result)
        return list(wse.LayerOp("l", [x], [x.type], Region(block)).results)

    module = apply(build([T(3)], body), FoldConstantsPass())
    inner = list(layers(module)[0].body.block.ops)
    assert names(inner) == ["wse.constant", "wse.mul", "wse.yield"]
    assert constant_value(inner[0]) == np.float32(1.0)


# ---------------------------------------------------------------------------------------------
# channels-last
# ---------------------------------------------------------------------------------------------


def _transposes_to_channels_first(module: ModuleOp) -> int:
    return sum(
        isinstance(op, wse.TransposeOp)
        and list(op.perm.get_values()) == channels_to_front(len(op.perm.get_values()))
        for op in top_ops(module)
    )


@pytest.mark.parametrize("name", ["cnn", "resnet"])
def test_channels_last_keeps_results_and_removes_the_transposes(name):
    imported = imported_zoo(name)
    module = apply(imported.module, DecomposePass(), FoldConstantsPass())
    inputs = random_inputs(module, seed=4)
    before = run(module, inputs, imported.weights)
    convs = sum(isinstance(op, wse.Im2ColOp) for op in top_ops(module))
    assert _transposes_to_channels_first(module) == convs
    apply(module, ChannelsLastPass(), FoldConstantsPass())
    assert_same(run(module, inputs, imported.weights), before)
    # every convolution but the first reads channels-last data; no activation goes back
    patches = [op for op in top_ops(module) if isinstance(op, wse.Im2ColOp)]
    assert [op.is_channels_last for op in patches] == [False] + [True] * (convs - 1)
    pools = [op for op in top_ops(module) if isinstance(op, wse.MaxPoolOp | wse.AvgPoolOp)]
    assert pools and all(op.is_channels_last for op in pools)
    assert _transposes_to_channels_first(module) == 0


def test_channels_last_serves_other_consumers_from_one_transpose():
    def body(y, a):
        t = wse.TransposeOp(y, [0, 3, 1, 2]).result
        r = wse.ReluOp(t).result
        patches = wse.Im2ColOp(r, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1).result
        return [wse.SigmoidOp(r).result, wse.AddOp(r, a).result, patches]

    module = build([T(1, 2, 2, 12), T(1, 12, 2, 2)], body)
    inputs = random_inputs(module, seed=5)
    before = run(module, inputs)
    apply(module, ChannelsLastPass())
    assert_same(run(module, inputs), before)
    # relu runs channels-last for the im2col; the sigmoid (whose twin would only move the
    # transpose below it) and the add (whose other operand is an (N, C, H, W) activation)
    # share one transpose of relu's twin
    assert names(top_ops(module)) == [
        "wse.relu", "wse.im2col", "wse.transpose", "wse.sigmoid", "wse.add", "func.return",
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# form-layers
# ---------------------------------------------------------------------------------------------

FRONT = (DecomposePass(), FoldConstantsPass())

EXPECTED_LAYERS = {
    "mlp": ["fc1", "fc2", "fc3"],
    "mlp_train": ["fc1", "fc2", "fc3"],
    "cnn": ["conv1", "pool1", "conv2", "pool2", "fc"],
    "transformer": ["q_proj", "k_proj", "v_proj", "attn_scores", "attn_context",
                    "out_proj", "ffn1", "ffn2"],
}  # fmt: skip


def assert_isolated(layer: wse.LayerOp) -> None:
    block = layer.body.block
    defined = set(block.args)
    for op in block.ops:
        for operand in op.operands:
            assert operand in defined, f"{layer.layer_name.data}: {op.name} uses an outer value"
        for region in op.regions:
            assert not region.blocks, "layers hold no nested regions"
        defined.update(op.results)
    assert isinstance(block.last_op, wse.YieldOp)


@pytest.mark.parametrize("name", sorted(EXPECTED_LAYERS))
def test_form_layers_on_zoo_models(name):
    imported = imported_zoo(name)
    module = apply(imported.module, *FRONT)
    inputs = feeds_for(imported)
    before = run(module, inputs, imported.weights)
    apply(module, FormLayersPass())
    assert [layer.layer_name.data for layer in layers(module)] == EXPECTED_LAYERS[name]
    assert all(isinstance(op, wse.LayerOp | func.ReturnOp) for op in top_ops(module))
    for layer in layers(module):
        assert_isolated(layer)
        assert isinstance(layer.location, NameLoc)
        assert layer.location.desc.data == layer.layer_name.data
        heavy = [op for op in layer.body.block.ops if isinstance(op, wse.MatmulOp | wse.PoolOp)]
        assert len(heavy) == 1  # one matmul or pooling window per layer
    after = run(module, inputs, imported.weights)
    assert_same(after, before, rtol=1e-6, atol=1e-6)
    text = print_module(module)
    assert print_module(parse_module(text)) == text


def test_form_layers_weights_live_in_the_layers_that_use_them():
    imported = imported_zoo("mlp")
    module = apply(imported.module, *FRONT, FormLayersPass())
    used = {
        layer.layer_name.data: sorted(
            op.weight_name.data for op in layer.body.block.ops if isinstance(op, wse.WeightOp)
        )
        for layer in layers(module)
    }
    assert used == {
        "fc1": ["fc1.bias", "fc1.weight"],
        "fc2": ["fc2.bias", "fc2.weight"],
        "fc3": ["fc3.bias", "fc3.weight"],
    }


def _tied_model():
    """Two MatMuls share one initializer ``w``; a constant is shared too."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="act"),
        helper.make_node("MatMul", ["r", "w"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return import_model(model)


def test_form_layers_clones_shared_weights_into_every_layer():
    imported = _tied_model()
    module = apply(imported.module, *FRONT)
    inputs = feeds_for(imported)
    before = run(module, inputs, imported.weights)
    apply(module, FormLayersPass())
    assert [layer.layer_name.data for layer in layers(module)] == ["mm1", "mm2"]
    for layer in layers(module):
        weights = [op for op in layer.body.block.ops if isinstance(op, wse.WeightOp)]
        assert [op.weight_name.data for op in weights] == ["w"]
        assert_isolated(layer)
    assert names(top_ops(module)) == ["wse.layer", "wse.layer", "func.return"]
    assert_same(run(module, inputs, imported.weights), before, rtol=0, atol=0)


def test_form_layers_unique_names_and_outputs():
    """Layers named after the same node get suffixes; a value used by two later layers and
    by the return is yielded once."""

    def body(x):
        a = wse.MatmulOp(x, x)
        a.location = loc("mm")
        b = wse.MatmulOp(a.result, x)
        b.location = loc("mm")
        c = wse.MatmulOp(a.result, b.result)
        c.location = loc("mm")
        return [c.result, a.result]

    module = build([T(3, 3)], body)
    inputs = random_inputs(module)
    before = run(module, inputs)
    apply(module, FormLayersPass())
    found = layers(module)
    assert [layer.layer_name.data for layer in found] == ["mm", "mm.2", "mm.3"]
    assert [len(layer.results) for layer in found] == [1, 1, 1]
    assert [len(layer.inputs) for layer in found] == [1, 2, 2]
    assert_same(run(module, inputs), before, rtol=0, atol=0)


def test_form_layers_names_without_locations_and_is_idempotent():
    module = build([T(2, 3)], lambda x: [wse.ReluOp(x).result])
    apply(module, FormLayersPass())
    assert [layer.layer_name.data for layer in layers(module)] == ["relu"]
    text = print_module(module)
    apply(module, FormLayersPass())
    assert print_module(module) == text


@pytest.mark.parametrize(("kernel", "layer_count"), [([2, 2], 1), ([1, 2], 2)])
def test_form_layers_a_global_pool_joins_the_layer_before(kernel, layer_count):
    # a max pool opens a layer; an average pool over the whole 2 x 2 image after it is a
    # reduction and joins that layer, where one over part of the image opens its own
    def body(x):
        pooled = wse.MaxPoolOp(x, [2, 2], [2, 2], [0] * 4, [1, 1]).result
        mean = wse.AvgPoolOp(pooled, kernel, [1, 1], [0] * 4, [1, 1], False).result
        return [wse.ReluOp(mean).result]

    module = build([T(1, 2, 4, 4)], body)
    inputs = random_inputs(module)
    before = run(module, inputs, {})
    apply(module, FormLayersPass())
    assert len(layers(module)) == layer_count
    assert layers(module)[0].layer_name.data == "max_pool"
    assert_same(run(module, inputs, {}), before, rtol=0, atol=0)


def test_form_layers_puts_returned_sources_in_a_layer():
    def body(x):
        w = wse.WeightOp("w", T(3)).result
        c = const(np.array([1.0, 2.0], np.float32))
        return [wse.AddOp(x, w).result, w, c]

    module = build([T(2, 3)], body)
    inputs = random_inputs(module)
    weights = {"w": np.arange(3, dtype=np.float32)}
    before = run(module, inputs, weights)
    apply(module, FormLayersPass())
    assert all(isinstance(op, wse.LayerOp | func.ReturnOp) for op in top_ops(module))
    assert_same(run(module, inputs, weights), before, rtol=0, atol=0)


def _embedded_model():
    """Token ids looked up in ``wte`` (node ``embed_tokens``), positions added from a table
    by ids the model computes, a norm, a projection and a head."""
    rng = np.random.default_rng(5)

    def table(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    positions = numpy_helper.from_array(np.arange(4, dtype=np.int64), "positions")
    nodes = [
        helper.make_node("Gather", ["wte", "ids"], ["tokens"], name="embed_tokens"),
        helper.make_node("Gather", ["wpe", "positions"], ["placed"], name="embed_positions"),
        helper.make_node("Add", ["tokens", "placed"], ["x"], name="add_positions"),
        helper.make_node("LayerNormalization", ["x", "gamma"], ["h"], name="ln", axis=-1),
        helper.make_node("MatMul", ["h", "q.weight"], ["q"], name="q_proj"),
        helper.make_node("Relu", ["q"], ["r"], name="act"),
        helper.make_node("MatMul", ["r", "head.weight"], ["logits"], name="lm_head"),
    ]
    gamma = numpy_helper.from_array(np.ones(8, np.float32), "gamma")
    weights = [table("wte", 10, 8), table("wpe", 4, 8), table("q.weight", 8, 8)]
    graph = helper.make_graph(
        nodes,
        "embedded",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4, 10])],
        initializer=[*weights, table("head.weight", 8, 10), gamma, positions],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("mode", ["pipelined", "weight_streaming"])
def test_form_layers_a_token_embedding_is_a_layer_of_its_own(mode):
    """The lookup of the token ids opens a layer named after its node, holding the tables
    (the position table's lookup by computed ids joins it, as does the norm), and the first
    projection's layer holds its own weight alone; the numbers do not change."""
    model = _embedded_model()
    art = compile_model(model, mode=mode, target="mesh8x8", batch_size=2)
    found = {layer.name: sorted(layer.weights) for layer in art.program.layers}
    assert found == {
        "embed_tokens": ["gamma", "wpe", "wte"],
        "q_proj": ["q.weight"],
        "lm_head": ["head.weight"],
    }
    assert [entry["name"] for entry in art.manifest["layers"]] == list(found)
    ids = np.array([[1, 9, 0, 3], [4, 4, 2, 7]], np.int64)
    imported = import_model(model, batch_size=2)
    want = run(apply(imported.module, *FRONT), [ids], imported.weights)
    outputs, _ = Cluster(art).infer({"ids": ids})
    assert_same([outputs["logits"]], want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# place-layers
# ---------------------------------------------------------------------------------------------


def placed(name: str, target: str, **kwargs) -> tuple[ModuleOp, ImportedModel]:
    imported = imported_zoo(name, **kwargs)
    module = with_target(imported.module, target)
    apply(module, *FRONT, FormLayersPass(), PlaceLayersPass())
    return module, imported


@pytest.mark.parametrize(
    ("name", "target"),
    [("mlp", "mesh8x8"), ("cnn", "mesh6x8"), ("transformer", "mesh4x16"),
     ("transformer", "mesh4x4"), ("mlp", "mesh2x2")],
)  # fmt: skip
def test_place_layers(name, target):
    module, imported = placed(name, target)
    tgt = get_target(target)
    rects = [layer.rect.as_tuple() for layer in layers(module)]
    assert len(rects) == len(EXPECTED_LAYERS[name])
    for i, (x, y, w, h) in enumerate(rects):
        assert x >= 0 and x + w <= tgt.cols and y >= 0 and y + h <= tgt.rows
        for other in rects[i + 1 :]:
            assert not overlap(rects[i], other), (rects[i], other)
    assert_strips(rects, tgt.rows)
    # the SRAM of every layer fits on its rectangle, by the simulator's own accounting
    costs = program_costs(lower(module, tgt.whole), tgt)
    assert [c.rect for c in costs] == rects
    for cost in costs:
        assert 0 < cost.sram_bytes_per_pe <= tgt.sram_bytes_per_pe, cost
    # semantics untouched
    inputs = feeds_for(imported)
    reference = import_model(zoo.MODELS[name](), batch_size=2)
    assert_same(
        run(module, inputs, imported.weights),
        run(reference.module, inputs, reference.weights),
        rtol=1e-5,
        atol=1e-5,
    )


def assert_strips(rects, rows: int) -> None:
    """Program order runs down the first strip of columns, up the next, and so on: a layer
    sits right below (or, in an upward strip, above) the one before it, or starts the next
    strip to the right."""
    strips = sorted({x for x, _, _, _ in rects})
    for (px, py, _, ph), (x, y, _, h) in itertools.pairwise(rects):
        if x == px:
            down = strips.index(x) % 2 == 0
            assert (y == py + ph) if down else (y + h == py), (rects, rows)
        else:
            assert strips.index(x) == strips.index(px) + 1, rects
    for x in strips:
        members = [r for r in rects if r[0] == x]
        assert sum(h for _, _, _, h in members) <= rows


def test_place_layers_stacks_short_layers_and_is_deterministic():
    first, _ = placed("mlp", "mesh8x8")
    second, _ = placed("mlp", "mesh8x8")
    assert print_module(first) == print_module(second)
    rects = [layer.rect.as_tuple() for layer in layers(first)]
    # batch 2: every tensor has 2 matrix rows, so the layers are about 2 rows high and stack
    # in one strip of the whole width: fc1, the slowest, splits its contraction over twice its
    # rows, the head, the fastest, keeps its stage time on one
    assert rects == [(0, 0, 8, 4), (0, 4, 8, 2), (0, 6, 8, 1)]


def test_place_layers_balances_the_stages():
    # the transformer's layers on a mesh with room to spare: the slowest stage is much faster
    # than with every layer on its narrowest rectangle, and the layers take most of the mesh
    module, _ = placed("transformer", "mesh16x16")
    tgt = get_target("mesh16x16")
    costs = program_costs(lower(module, tgt.whole), tgt)
    placer = Placer(layer_works(main_function(module), tgt.whole), tgt)
    placer.heights = [r[3] for r in (c.rect for c in costs)]
    narrowest = [placer.cycles(i, placer.narrowest_width(i)) for i in range(len(costs))]
    slowest = max(c.cycles for c in costs)
    assert slowest < 0.6 * max(narrowest)
    assert sum(c.rect[2] * c.rect[3] for c in costs) > 0.5 * tgt.pes


def test_place_layers_reads_the_whole_target_from_the_module():
    imported = imported_zoo("mlp")
    custom = dataclasses.replace(get_target("wse2"), name="lab", rows=4, cols=4)
    set_module_target(imported.module, custom)
    apply(imported.module, *FRONT, FormLayersPass(), PlaceLayersPass())
    rects = [layer.rect.as_tuple() for layer in layers(imported.module)]
    assert max(x + w for x, _, w, _ in rects) <= 4 and max(y + h for _, y, _, h in rects) <= 4


def test_place_layers_needs_a_target():
    imported = imported_zoo("mlp")
    module = apply(imported.module, *FRONT, FormLayersPass())
    with pytest.raises(CgcError, match=r"no 'wse.target' attribute: give one"):
        PlaceLayersPass().apply(context(), module)


def placement_error(imported: ImportedModel, target: str) -> str:
    """The message of the DoesNotFitError that placing ``imported`` on ``target`` raises."""
    module = with_target(imported.module, target)
    apply(module, *FRONT, FormLayersPass())
    with pytest.raises(DoesNotFitError) as info:
        PlaceLayersPass().apply(context(), module)
    return str(info.value)


def test_place_layers_too_big():
    imported = import_model(zoo.mlp(in_features=512, hidden=(512,), classes=10), batch_size=2)
    message = placement_error(imported, "mesh2x2")
    assert "\n" not in message
    match = re.search(r"layer 'fc1' needs ([\d.]+) KiB per PE even on all 2x2 PEs, "
                      r"48.0 KiB available", message)  # fmt: skip
    assert match, message
    assert float(match[1]) > 48
    assert message.endswith("use --mode weight_streaming")


def test_place_layers_shortfall_names_more_bytes_than_available():
    imported = import_model(zoo.mlp(in_features=160, hidden=(160, 160), classes=160), batch_size=1)
    message = placement_error(imported, "mesh2x4")
    match = re.search(r"its 3 layers, each on its narrowest rectangle, do not pack onto the 2x4 "
                      r"mesh: as strips of all 2 rows they need (\d+) columns \(([\d.]+) KiB of "
                      r"SRAM\), the mesh has 4 \(384.0 KiB\)", message)  # fmt: skip
    assert match, message
    assert int(match[1]) > 4 and float(match[2]) > 384, message


def test_place_layers_too_many_layers():
    message = placement_error(imported_zoo("transformer"), "mesh2x3")
    assert re.search(
        r"its 8 layers, each on its narrowest rectangle, do not pack onto the 2x3 mesh: as "
        r"strips of all 2 rows they need 8 columns",
        message,
    ), message


# ---------------------------------------------------------------------------------------------
# schedule-streams
# ---------------------------------------------------------------------------------------------


def weight_views(module: ModuleOp, kind) -> list[tuple]:
    return [
        (op.weight_name.data, wse.tensor_shape(op.result),
         None if op.perm is None else list(op.perm.get_values()))
        for op in module.walk() if isinstance(op, kind)
    ]  # fmt: skip


def _training_module() -> tuple[ModuleOp, ImportedModel]:
    imported = imported_zoo("mlp_train")
    module = with_target(imported.module, "mesh4x4")
    apply(module, *FRONT, FormLayersPass(), AutodiffPass(), FoldConstantsPass())
    return module, imported


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_schedule_streams_inference(name):
    imported = imported_zoo(name)
    module = with_target(imported.module, "mesh4x5")
    apply(module, *FRONT, FormLayersPass())
    inputs = feeds_for(imported)
    before = run(module, inputs, imported.weights)
    weights = weight_views(module, wse.WeightOp)
    assert weights
    apply(module, ScheduleStreamsPass(optimizer="sgd"))
    assert weight_views(module, wse.WeightOp) == []
    assert weight_views(module, ws.StreamWeightOp) == weights
    for layer in layers(module):
        assert layer.rect.as_tuple() == (0, 0, 5, 4)
    assert not any(isinstance(op, ws.OptimizerStepOp) for op in module.walk())
    assert_same(run(module, inputs, imported.weights), before, rtol=0, atol=0)


def test_schedule_streams_keeps_locations():
    imported = imported_zoo("mlp")
    module = with_target(imported.module, "mesh4x4")
    apply(module, *FRONT, FormLayersPass(), ScheduleStreamsPass())
    streams = [op for op in module.walk() if isinstance(op, ws.StreamWeightOp)]
    assert [op.location.desc.data for op in streams] == ["fc1", "fc1", "fc2", "fc2", "fc3", "fc3"]


def test_schedule_streams_training_appends_the_optimizer_step():
    module, _ = _training_module()
    weights = weight_views(module, wse.WeightOp)
    apply(module, ScheduleStreamsPass(optimizer="sgd", lr=0.5, momentum=0.9, nesterov=True))
    assert weight_views(module, ws.StreamWeightOp) == weights
    ops = top_ops(module)
    assert isinstance(ops[-2], ws.OptimizerStepOp) and isinstance(ops[-1], func.ReturnOp)
    assert sum(isinstance(op, ws.OptimizerStepOp) for op in module.walk()) == 1
    step = ops[-2]
    assert step.optimizer.data == "sgd"
    assert step.settings() == {
        "dampening": 0.0, "lr": 0.5, "momentum": 0.9, "nesterov": 1.0, "weight_decay": 0.0
    }  # fmt: skip
    assert all(layer.rect.as_tuple() == (0, 0, 4, 4) for layer in layers(module))
    # the gradient streams are untouched, perms included
    grads = [(op.weight_name.data, None if op.perm is None else list(op.perm.get_values()))
             for op in module.walk() if isinstance(op, ws.StreamGradientOp)]  # fmt: skip
    assert sorted(grads) == [
        ("fc1.bias", None), ("fc1.weight", [1, 0]), ("fc2.bias", None),
        ("fc2.weight", [1, 0]), ("fc3.bias", None), ("fc3.weight", [1, 0]),
    ]  # fmt: skip


def test_schedule_streams_without_optimizer_adds_no_step():
    module, _ = _training_module()
    apply(module, ScheduleStreamsPass())
    assert not any(isinstance(op, ws.OptimizerStepOp) for op in module.walk())
    assert any(isinstance(op, ws.StreamGradientOp) for op in module.walk())


def test_schedule_streams_unknown_optimizer():
    module, _ = _training_module()
    with pytest.raises(CgcError, match=r"unknown optimizer 'lamb'"):
        ScheduleStreamsPass(optimizer="lamb").apply(context(), module)


def test_schedule_streams_whole_mesh_and_frozen_weights():
    """Frozen weights stream too; every layer gets the whole mesh of the module's target."""

    def body(x):
        block = Block(arg_types=[x.type])
        with ImplicitBuilder(block):
            c = wse.WeightOp("table", T(3, 3), frozen=True).result
            wse.YieldOp(wse.MatmulOp(block.args[0], c).result)
        return list(wse.LayerOp("l", [x], [x.type], Region(block)).results)

    module = with_target(build([T(3, 3)], body), "wse2@5x7")
    apply(module, ScheduleStreamsPass())
    assert weight_views(module, ws.StreamWeightOp) == [("table", (3, 3), None)]
    assert layers(module)[0].rect.as_tuple() == (0, 0, 7, 5)


# ---------------------------------------------------------------------------------------------
# The driver's pipelines and `cgc opt`
# ---------------------------------------------------------------------------------------------

FRONT_STEPS = [
    "import", "fuse-rotary", "fuse-attention", "decompose", "fold-constants", "channels-last",
    "fold-constants", "form-layers",
]  # fmt: skip
PIPELINES = {
    "pipelined": [*FRONT_STEPS, "fuse-epilogues", "place-layers", "route-tensors"],
    "weight_streaming": [*FRONT_STEPS, "fuse-epilogues", "schedule-streams"],
    "training": [*FRONT_STEPS, "autodiff", "fold-constants", "schedule-streams"],
}


LAB = dataclasses.replace(get_target("wse2"), name="lab", rows=8, cols=6, clock_hz=1e9)
"""A target of the user's own: no name cgc knows, a mesh and a clock of its own."""


def _compile(kind: str, directory):
    if kind == "training":
        return compile_model(
            zoo.MODELS["mlp_train"](),
            mode="weight_streaming",
            target="mesh4x4",
            batch_size=4,
            num_csx=2,
            dump_ir=directory,
            training=Training(lr=0.1, trainable=(r"fc[12]\..*", r"fc3\.bias")),
        )
    return compile_model(
        zoo.MODELS["cnn"](), mode=kind, target=LAB, batch_size=2, dump_ir=directory
    )


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_driver_dumps_parse_back_and_replay_with_cgc_opt(kind, tmp_path):
    artifact = _compile(kind, tmp_path)
    expected = [f"{i:02d}-{step}.mlir" for i, step in enumerate(PIPELINES[kind])]
    dumps = sorted(p.name for p in tmp_path.iterdir())
    assert dumps == expected
    runner = CliRunner()
    for name in dumps:
        text = (tmp_path / name).read_text()
        assert print_module(parse_module(text, name)) == text
        result = runner.invoke(cli, ["opt", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        assert result.output == text
    # the manifest's pipeline, given to `cgc opt`, turns the import into the final IR
    pipeline = artifact.manifest["pipeline"]
    assert [p.split("{")[0] for p in re.split(r",(?=[a-z-]+(?:\{|,|$))", pipeline)] == (
        PIPELINES[kind][1:]
    )
    if kind == "training":
        assert 'autodiff{trainable="fc[12]\\\\..*","fc3\\\\.bias" loss_scale=0.5}' in pipeline
    result = runner.invoke(cli, ["opt", str(tmp_path / expected[0]), "-p", pipeline])
    assert result.exit_code == 0, result.output
    assert result.output == (tmp_path / expected[-1]).read_text()
    assert artifact.ir == (tmp_path / expected[-1]).read_text()
    assert Target.from_json(artifact.manifest["target"]) == module_target(parse_module(artifact.ir))


def test_any_target_value_compiles_and_runs():
    """A target built in Python, resized and renamed, travels whole: every rectangle lies on
    its mesh, and the run simulates its clock."""
    small = dataclasses.replace(get_target("wse2"), rows=16, cols=16)
    model = zoo.MODELS["mlp"]()
    artifact = compile_model(model, mode="pipelined", target=small, batch_size=4)
    rects = [layer.rect for layer in artifact.program.layers]
    assert all(x + w <= 16 and y + h <= 16 for x, y, w, h in rects)
    assert artifact.manifest["target"] == small.to_json()
    slow = dataclasses.replace(small, name="slow", clock_hz=small.clock_hz / 2)
    again = compile_model(model, mode="pipelined", target=slow, batch_size=4)
    cycles = [layer["cycles"] for layer in artifact.manifest["layers"]]
    assert [layer["cycles"] for layer in again.manifest["layers"]] == cycles
    inputs = zoo.sample_inputs(model, 4)
    fast = Cluster(artifact).infer(inputs)[1].simulated_seconds
    slow = Cluster(again).infer(inputs)[1].simulated_seconds
    assert fast < slow < 2 * fast  # the kernels take twice as long, the host I/O as long
    with pytest.raises(CgcError, match=r"target 'bad': rows must be positive, got 0"):
        compile_model(model, target=dataclasses.replace(small, name="bad", rows=0))


def test_driver_auto_mode_falls_back_to_weight_streaming(tmp_path):
    model = zoo.mlp(in_features=512, hidden=(512,), classes=10)
    artifact = compile_model(model, mode="auto", target="mesh2x2", batch_size=2, dump_ir=tmp_path)
    assert artifact.manifest["mode"] == "weight_streaming"
    assert "exceed the SRAM of mesh2x2" in artifact.manifest["mode_reason"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{i:02d}-{s}.mlir" for i, s in enumerate(PIPELINES["weight_streaming"])
    ]


def test_cgc_opt_pass_options_and_errors(tmp_path):
    imported = imported_zoo("mlp")
    module = apply(imported.module, *FRONT, FormLayersPass())
    path = tmp_path / "in.mlir"
    path.write_text(print_module(module))
    runner = CliRunner()
    result = runner.invoke(cli, ["opt", str(path), "--target", "mesh3x5", "-p", "schedule-streams"])
    assert result.exit_code == 0, result.output
    out = parse_module(result.output)
    assert {layer.rect.as_tuple() for layer in layers(out)} == {(0, 0, 5, 3)}
    result = runner.invoke(cli, ["opt", str(path), "-p", "no-such-pass"])
    assert result.exit_code == 2
    assert "no-such-pass" in result.output and "decompose" in result.output
    result = runner.invoke(cli, ["opt", str(path), "-p", "place-layers"])
    assert result.exit_code == 2
    assert "wse.target" in result.output


def test_cgc_opt_invalid_ir_is_a_user_error(tmp_path):
    path = tmp_path / "bad.mlir"
    path.write_text(
        "func.func @main(%a: tensor<2x3xf32>) {\n"
        "  %r = wse.reshape %a : tensor<2x3xf32> -> tensor<4x2xf32>\n  func.return\n}\n"
    )
    result = CliRunner().invoke(cli, ["opt", str(path)])
    assert result.exit_code == 2
    assert result.output == (
        f"error: {path}: invalid IR: wse.reshape: cannot reshape (2, 3) into (4, 2)\n"
    )


def test_a_pass_spec_parses_back_to_the_pass():
    """A manifest's specs replay: strings escaped, and floats with an exponent written as
    xDSL's parser reads them (it takes ``5e-05`` for a name)."""
    passes = (
        AutodiffPass(('a\\.b"c',), 2.0**-17),
        ScheduleStreamsPass(optimizer="adamw", lr=5e-05, eps=1e-08, amsgrad=True),
    )
    spec = ",".join(pass_spec(p) for p in passes)
    assert "loss_scale=7.62939453125e-06" in spec and "lr=5.0e-05 " in spec
    assert pipeline(spec).passes == passes


def test_a_sparse_pipelined_compile_replays_its_sparse_weights(tmp_path):
    """The sparse weights a pipelined compile places are in its manifest's pipeline, so that
    ``cgc opt -p`` places the import as the compile did."""
    artifact = compile_model(
        zoo.MODELS["mlp"](), mode="pipelined", target="mesh16x16", batch_size=8,
        sparsity=0.75, dump_ir=tmp_path,
    )  # fmt: skip
    spec = artifact.manifest["pipeline"]
    assert ",form-layers,select-sparse-weights{density=0.25},fuse-epilogues," in spec
    assert "wse.sparse_weights = {" in artifact.ir
    result = CliRunner().invoke(cli, ["opt", str(tmp_path / "00-import.mlir"), "-p", spec])
    assert result.exit_code == 0, result.output
    assert result.output == artifact.ir


def test_cgc_opt_bad_pipeline_says_why(tmp_path):
    path = tmp_path / "in.mlir"
    path.write_text("func.func @main() {\n  func.return\n}\n")
    result = CliRunner().invoke(cli, ["opt", str(path), "-p", 'autodiff{trainable="a\\.b"}'])
    assert result.exit_code == 2
    assert "Unknown token" in result.output


def test_cgc_opt_split_input_file(tmp_path):
    good = "func.func @main() {\n  func.return\n}\n"
    bad = "func.func @main(%a: tensor<2xf32>) {\n  %r = wse.relu %a\n}\n"
    path = tmp_path / "cases.mlir"
    path.write_text(f"{good}// -----\n{bad}// -----\n{good}")
    runner = CliRunner()
    result = runner.invoke(cli, ["opt", str(path), "--split-input-file", "--verify-diagnostics"])
    assert result.exit_code == 0, result.output
    first, second, third = result.output.split("// -----\n")
    assert first == third == print_module(parse_module(good))
    assert second.startswith(f"error: {path}:7:1:") and second.count("\n") == 1
    # without --verify-diagnostics the first error ends the run, as one line, status 2
    result = runner.invoke(cli, ["opt", str(path), "--split-input-file"])
    assert result.exit_code == 2 and result.output.startswith(f"error: {path}:7:1:")
    result = runner.invoke(cli, ["opt", str(path), "--mesh", "2x2"])
    assert result.exit_code == 2 and "--mesh needs --target" in result.output


def test_all_passes_are_registered_by_module_name():
    passes = all_passes()
    assert sorted(passes) == [
        "autodiff", "cache-keys-values", "channels-last", "decompose", "fold-constants",
        "form-layers", "fuse-attention", "fuse-epilogues", "fuse-rotary", "place-layers",
        "recompute-activations",
        "route-tensors", "schedule-streams", "select-sparse-weights",
    ]  # fmt: skip
    for name, cls in passes.items():
        assert cls.name == name
        assert cls.__module__ == "cgc.passes." + name.replace("-", "_")


def test_boolean_inputs_survive_the_pipeline():
    """A select on a boolean graph input goes through every pass."""

    def body(c, x):
        return [wse.SelectOp(c, x, wse.NegOp(x).result).result]

    module = with_target(build([T(2, 3, el=i1), T(2, 3)], body), "mesh2x2")
    inputs = random_inputs(module)
    before = run(module, inputs)
    apply(module, DecomposePass(), FoldConstantsPass(), FormLayersPass(), PlaceLayersPass())
    assert_same(run(module, inputs), before, rtol=0, atol=0)


def test_invalid_ir_from_a_pass_names_the_pipeline_or_the_pass(monkeypatch):
    """Without dumps the IR is verified once, at the end, so the error names every pass and
    how to find the one that broke it; with dumps it names that pass."""

    def break_a_type(self, ctx, module):
        relu = next(op for op in module.walk() if isinstance(op, wse.ReluOp))
        wrong = wse.ReluOp.create(operands=relu.operands, result_types=[TensorType(f32, [99])])
        Rewriter.replace_op(relu, wrong)

    monkeypatch.setattr(ChannelsLastPass, "apply", break_a_type)
    model = zoo.mlp(in_features=8, hidden=(8,), classes=4)
    with pytest.raises(CgcError) as info:
        compile_model(model, mode="weight_streaming", target="mesh4x4", batch_size=2)
    message = str(info.value)
    assert "fuse-rotary, fuse-attention, decompose, fold-constants, channels-last" in message
    assert "(--print-ir-after-all verifies after each pass)" in message
    with pytest.raises(CgcError) as info:
        compile_model(
            model,
            mode="weight_streaming",
            target="mesh4x4",
            batch_size=2,
            print_ir_after_all=lambda text: None,
        )
    assert "after channels-last: invalid IR: " in str(info.value)


def test_place_layers_names_every_layer_that_does_not_fit():
    imported = import_model(zoo.mlp(in_features=512, hidden=(512, 512), classes=10), batch_size=2)
    assert placement_error(imported, "mesh2x2") == (
        "model does not fit on mesh2x2 in pipelined mode: 2 layers need more SRAM per PE than "
        "48.0 KiB even on all 2x2 PEs: 'fc1' 260.0 KiB, 'fc2' 260.0 KiB; use --mode "
        "weight_streaming"
    )
