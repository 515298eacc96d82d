"""The autodiff pass: gradients against central finite differences (float64) and against
torch.autograd, and the structure of the backward layers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from ir_builders import T as tensor_type
from ir_builders import apply, build, loc
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, NameLoc, f64, i1, i64
from xdsl.ir import Attribute, SSAValue

from cgc.dialects import context, parse_module, print_module, ws, wse
from cgc.dialects.interpreter import Interpreter
from cgc.dialects.ir import main_function
from cgc.errors import CgcError
from cgc.frontends import zoo
from cgc.frontends.onnx import import_model
from cgc.passes.autodiff import AutodiffPass
from cgc.passes.decompose import DecomposePass
from cgc.passes.fold_constants import FoldConstantsPass
from cgc.passes.form_layers import FormLayersPass

T = partial(tensor_type, el=f64)


def top_ops(module: ModuleOp) -> list:
    return list(main_function(module).body.block.ops)


def layers(module: ModuleOp) -> list[wse.LayerOp]:
    return [op for op in top_ops(module) if isinstance(op, wse.LayerOp)]


def run(module, inputs, weights) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    interpreter = Interpreter(weights)
    outputs = interpreter.run_function(main_function(module), list(inputs))
    return outputs, interpreter.gradients


def weight(name: str, shape: Sequence[int], frozen: bool = False) -> SSAValue:
    return wse.WeightOp(name, T(*shape), frozen=frozen).result


def probe_loss(y: SSAValue) -> SSAValue:
    """``sum(y * probe)`` with a fixed random ``probe``: every element of y matters."""
    shape = wse.tensor_shape(y)
    prod = wse.MulOp(y, weight("probe", shape, frozen=True)).result
    return wse.ReduceSumOp(prod, list(range(len(shape))), False).result


def finite_differences(module, inputs, weights, name, h=1e-6) -> np.ndarray:
    grad = np.zeros_like(weights[name])
    for index in np.ndindex(grad.shape):
        values = []
        for step in (h, -h):
            shifted = dict(weights)
            shifted[name] = weights[name].copy()
            shifted[name][index] += step
            values.append(run(module, inputs, shifted)[0][0])
        grad[index] = (values[0] - values[1]) / (2 * h)
    return grad


def check_gradients(
    body: Callable[..., SSAValue],
    params: dict[str, np.ndarray],
    arg_types: Sequence[Attribute] = (),
    inputs: Sequence[np.ndarray] = (),
    seed: int = 0,
    rtol: float = 1e-6,
) -> dict[str, np.ndarray]:
    """Differentiates ``sum(body(*args) * probe)`` with respect to ``params`` and compares
    the streamed gradients with central differences."""

    def main(*args):
        y = body(*args)
        return [probe_loss(y), y]

    module = build(arg_types, main)
    rng = np.random.default_rng(seed)
    out_shape = wse.tensor_shape(top_ops(module)[-1].operands[1])
    weights = dict(params)
    weights["probe"] = rng.standard_normal(out_shape)
    apply(module, DecomposePass())
    reference = module.clone()
    (loss, y), _ = run(reference, inputs, weights)
    apply(module, FormLayersPass(), AutodiffPass())
    (loss_after, y_after), grads = run(module, inputs, weights)
    assert loss_after == loss and np.array_equal(y_after, y)
    assert sorted(grads) == sorted(params)
    for name in params:
        assert grads[name].shape == params[name].shape
        assert grads[name].dtype == np.float64
        want = finite_differences(reference, inputs, weights, name)
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(grads[name], want, rtol=rtol, atol=rtol * scale, err_msg=name)
    return grads


def rnd(*shape, seed=0, low=None, high=None) -> np.ndarray:
    rng = np.random.default_rng(seed + 17 * len(shape) + sum(shape))
    if low is not None:
        return rng.uniform(low, high, shape)
    return rng.standard_normal(shape)


def away_from_zero(*shape, seed=0) -> np.ndarray:
    x = rnd(*shape, seed=seed)
    return np.where(np.abs(x) < 0.1, 0.1 * np.sign(x) + x, x)


# ---------------------------------------------------------------------------------------------
# One model per differentiable op family, against finite differences
# ---------------------------------------------------------------------------------------------

BINARY = {
    "add": (wse.AddOp, (3, 4), (4,), None),
    "sub": (wse.SubOp, (3, 1), (1, 4), None),
    "mul": (wse.MulOp, (2, 3, 4), (3, 1), None),
    "div": (wse.DivOp, (3, 4), (4,), (0.5, 2.0)),
    "pow": (wse.PowOp, (3, 4), (4,), (0.5, 2.0)),
    "max": (wse.MaxOp, (3, 4), (3, 1), None),
    "min": (wse.MinOp, (2, 4), (3, 1, 4), None),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcasting(name):
    cls, a_shape, b_shape, positive = BINARY[name]
    params = {"a": rnd(*a_shape, seed=1), "b": rnd(*b_shape, seed=2)}
    if positive:
        params["b"] = rnd(*b_shape, seed=2, low=positive[0], high=positive[1])
        params["a"] = rnd(*a_shape, seed=1, low=positive[0], high=positive[1])
    check_gradients(lambda: cls(weight("a", a_shape), weight("b", b_shape)).result, params)


def test_binary_with_a_graph_input():
    """Only the weight gets a gradient; the input's contribution is not streamed."""
    x = rnd(3, 4, seed=5)
    params = {"w": rnd(4, seed=6)}
    check_gradients(
        lambda x: wse.MulOp(wse.AddOp(x, weight("w", (4,))).result, x).result,
        params,
        [T(3, 4)],
        [x],
    )


UNARY = {
    "neg": (wse.NegOp, None),
    "exp": (wse.ExpOp, None),
    "log": (wse.LogOp, (0.5, 3.0)),
    "sqrt": (wse.SqrtOp, (0.5, 3.0)),
    "reciprocal": (wse.ReciprocalOp, (0.5, 3.0)),
    "abs": (wse.AbsOp, "signed"),
    "relu": (wse.ReluOp, "signed"),
    "sigmoid": (wse.SigmoidOp, None),
    "tanh": (wse.TanhOp, None),
    "erf": (wse.ErfOp, None),
    "sin": (wse.SinOp, None),
    "cos": (wse.CosOp, None),
    "tan": (wse.TanOp, (-1.2, 1.2)),
    "asin": (wse.AsinOp, (-0.9, 0.9)),
    "acos": (wse.AcosOp, (-0.9, 0.9)),
    "atan": (wse.AtanOp, None),
    "sinh": (wse.SinhOp, None),
    "cosh": (wse.CoshOp, None),
    "asinh": (wse.AsinhOp, None),
    "acosh": (wse.AcoshOp, (1.2, 3.0)),
    "atanh": (wse.AtanhOp, (-0.9, 0.9)),
    "sign": (wse.SignOp, "signed"),
    "floor": (wse.FloorOp, (0.1, 0.9)),  # away from the jumps
    "ceil": (wse.CeilOp, (0.1, 0.9)),
    "round": (wse.RoundOp, (0.1, 0.4)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name):
    cls, domain = UNARY[name]
    if domain is None:
        w = rnd(3, 4, seed=3)
    elif domain == "signed":
        w = away_from_zero(3, 4, seed=3)
    else:
        w = rnd(3, 4, seed=3, low=domain[0], high=domain[1])
    assert (w > 0).any() and ((w < 0).any() or domain not in (None, "signed"))
    check_gradients(lambda: cls(weight("w", (3, 4))).result, {"w": w})


@pytest.mark.parametrize(
    "cls",
    [wse.ReduceSumOp, wse.ReduceMeanOp, wse.ReduceMaxOp, wse.ReduceMinOp],
    ids=lambda c: c.name,
)
@pytest.mark.parametrize(("axes", "keepdims"), [([1], False), ([0, 2], True), ([0, 1, 2], False)])
def test_reductions(cls, axes, keepdims):
    w = rnd(2, 3, 4, seed=4)
    check_gradients(lambda: cls(weight("w", (2, 3, 4)), axes, keepdims).result, {"w": w})


def test_reduce_max_shares_ties():
    """Ties share the gradient evenly (torch.amax's rule)."""
    w = np.array([[1.0, 3.0, 3.0, -1.0], [2.0, 2.0, 2.0, 0.5]])

    def main():
        m = wse.ReduceMaxOp(weight("w", (2, 4)), [1], False).result
        return [wse.ReduceSumOp(m, [0], False).result]

    module = apply(build([], main), FormLayersPass(), AutodiffPass())
    _, grads = run(module, [], {"w": w})
    t = torch.tensor(w, requires_grad=True)
    torch.amax(t, 1).sum().backward()
    np.testing.assert_allclose(grads["w"], t.grad.numpy(), rtol=1e-15)
    np.testing.assert_allclose(grads["w"][0], [0, 0.5, 0.5, 0])


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((1, 3, 4), (2, 4, 5)), ((3, 4), (2, 4, 2)),
     ((2, 1, 3, 4), (3, 4, 2))],
)  # fmt: skip
def test_matmul_batch_broadcasting(a_shape, b_shape):
    params = {"a": rnd(*a_shape, seed=7), "b": rnd(*b_shape, seed=8)}
    check_gradients(lambda: wse.MatmulOp(weight("a", a_shape), weight("b", b_shape)).result, params)


SHAPE_OPS = {
    "reshape": ((2, 6), lambda w: wse.ReshapeOp(w, (3, 4)).result),
    "transpose": ((2, 3, 4), lambda w: wse.TransposeOp(w, [2, 0, 1]).result),
    "broadcast_to": ((3, 1), lambda w: wse.BroadcastToOp(w, (2, 3, 4)).result),
    "concat": ((2, 3), lambda w: wse.ConcatOp([w, wse.NegOp(w).result, w], 1).result),
    "slice": ((4, 5), lambda w: wse.SliceOp(w, [1, 0], [3, 4], [1, 1]).result),
    "pad": ((2, 3), lambda w: wse.PadOp(w, [1, 0], [0, 2], 0.5).result),
    "strided slice": ((7, 9), lambda w: wse.SliceOp(w, [1, 0], [7, 8], [3, 2]).result),
    "strided slice to the end": ((6, 5), lambda w: wse.SliceOp(w, [0, 2], [6, 5], [2, 4]).result),
    "pad reflect": ((3, 4), lambda w: wse.PadOp(w, [2, 1], [1, 3], 0.0, "reflect").result),
    "pad edge": ((3, 4), lambda w: wse.PadOp(w, [2, 0], [3, 1], 0.0, "edge").result),
    "pad wrap": ((3, 4), lambda w: wse.PadOp(w, [3, 1], [2, 4], 0.0, "wrap").result),
    "reverse": ((3, 4), lambda w: wse.ReverseOp(w, [0, 1]).result),
    "tile": ((2, 3), lambda w: wse.TileOp(w, [2, 1]).result),
    "cumsum": ((3, 4), lambda w: wse.CumSumOp(w, 1, False, False).result),
    "cumsum exclusive reverse": ((3, 4), lambda w: wse.CumSumOp(w, 0, True, True).result),
    "reduce_prod": ((3, 4, 2), lambda w: wse.ReduceProdOp(w, [0, 2], False).result),
    "topk": ((3, 5), lambda w: wse.TopKOp(w, 1, 2, True).results[0]),
    "col2im": ((2, 50, 18), lambda w: wse.Col2ImOp(
        w, (2, 4, 5, 5), [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 2).result),
    "chain": ((2, 3, 2), lambda w: wse.SliceOp(
        wse.TransposeOp(wse.ReshapeOp(w, (3, 4)).result, [1, 0]).result,
        [1, 0], [4, 2], [1, 1]).result),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
def test_shape_ops(name):
    shape, make = SHAPE_OPS[name]
    check_gradients(lambda: make(weight("w", shape)), {"w": rnd(*shape, seed=9)})


def test_reduce_prod_with_a_zero():
    """The product of the others, exact where an element is zero (torch's rule)."""
    w = np.array([[2.0, 0.0, 3.0], [1.5, -2.0, 4.0]])

    def main():
        return [wse.ReduceSumOp(wse.ReduceProdOp(weight("w", (2, 3)), [1], False).result, [0],
                                False).result]  # fmt: skip

    _, grads = run(apply(build([], main), FormLayersPass(), AutodiffPass()), [], {"w": w})
    np.testing.assert_array_equal(grads["w"], [[0, 6, 0], [-8, 6, -3]])


def test_stop_gradient():
    def main():
        w = weight("w", (3,))
        h = wse.MulOp(w, wse.StopGradientOp(w).result).result
        return [wse.ReduceSumOp(h, [0], False).result]

    w = np.array([1.0, -2.0, 3.0])
    _, grads = run(apply(build([], main), FormLayersPass(), AutodiffPass()), [], {"w": w})
    np.testing.assert_array_equal(grads["w"], w)  # d(w * c)/dw with c = w held constant


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_gradients(reduction):
    """Both the data (where not overwritten) and the updates."""
    rows = np.array([[0, 2, 1], [2, 2, 0]], dtype=np.int64) if reduction == "add" else None
    rows = rows if rows is not None else np.array([[0, 2, 1], [1, 0, 2]], dtype=np.int64)
    params = {"d": rnd(3, 3, seed=1), "u": rnd(2, 3, seed=2)}
    check_gradients(
        lambda i: wse.ScatterElementsOp(weight("d", (3, 3)), i, weight("u", (2, 3)), 0,
                                        reduction).result,
        params, [T(2, 3, el=i64)], [rows],
    )  # fmt: skip
    points = np.array([[1], [3]], dtype=np.int64)
    params = {"d": rnd(4, 2, seed=3), "u": rnd(2, 2, seed=4)}
    check_gradients(
        lambda i: wse.ScatterNDOp(weight("d", (4, 2)), i, weight("u", (2, 2)), reduction).result,
        params, [T(2, 1, el=i64)], [points],
    )  # fmt: skip


def test_gather_nd_gradient():
    points = np.array([[0, 1], [2, 0], [0, 1]], dtype=np.int64)  # a repeated point sums
    check_gradients(
        lambda i: wse.GatherNDOp(weight("t", (3, 2, 4)), i, 0).result,
        {"t": rnd(3, 2, 4, seed=7)},
        [T(3, 2, el=i64)],
        [points],
    )


def test_concat_of_two_weights():
    params = {"a": rnd(2, 3, seed=1), "b": rnd(2, 2, seed=2)}
    check_gradients(
        lambda: wse.ConcatOp([weight("a", (2, 3)), weight("b", (2, 2))], 1).result, params
    )


def test_select():
    cond = np.array([[True, False, True, False], [False, False, True, True], [True] * 4])
    params = {"a": rnd(3, 4, seed=1), "b": rnd(4, seed=2)}
    grads = check_gradients(
        lambda c: wse.SelectOp(c, weight("a", (3, 4)), weight("b", (4,))).result,
        params,
        [T(3, 4, el=i1)],
        [cond],
    )
    assert (grads["a"][~cond] == 0).all()


def test_composites_through_decompose():
    """softmax, layer norm and a weighted cross-entropy with ignore_index, decomposed."""
    labels = np.array([0, 2, 1, 2], dtype=np.int64)
    params = {
        "w": rnd(3, 3, seed=1),
        "scale": rnd(3, seed=2, low=0.5, high=1.5),
        "bias": rnd(3, seed=3),
        "class_w": rnd(3, seed=4, low=0.5, high=2.0),
    }
    x = rnd(4, 3, seed=5)

    def body(x, labels):
        h = wse.MatmulOp(x, weight("w", (3, 3))).result
        h = wse.SoftmaxOp(h, 1).result
        h = wse.LayerNormOp(h, weight("scale", (3,)), weight("bias", (3,)), 1, 1e-5).result
        ce = wse.SoftmaxCrossEntropyOp(h, labels, weight("class_w", (3,)), "none", 1).result
        return wse.AddOp(ce, wse.ReduceSumOp(h, [1], False).result).result

    check_gradients(body, params, [T(4, 3), T(4, el=i64)], [x, labels])


def test_conv_filter_gradient():
    """A convolution of a graph input: the filter's gradient flows through the decomposed
    im2col/matmul."""
    x = rnd(2, 2, 5, 5, seed=1)
    params = {"k": rnd(4, 1, 3, 2, seed=2)}
    check_gradients(
        lambda x: wse.ConvOp(x, weight("k", (4, 1, 3, 2)), [2, 1], [1, 0, 1, 1], [1, 2], 2).result,
        params,
        [T(2, 2, 5, 5)],
        [x],
    )


def test_conv_input_and_filter_gradients():
    """Both operands of a grouped, strided, padded, dilated convolution: the input's gradient
    is col2im of the patches' gradient."""
    params = {"x": rnd(2, 4, 6, 5, seed=1), "k": rnd(6, 2, 3, 2, seed=2)}
    check_gradients(
        lambda: (
            wse.ConvOp(
                weight("x", (2, 4, 6, 5)),
                weight("k", (6, 2, 3, 2)),
                [2, 1],
                [1, 0, 2, 1],
                [1, 2],
                2,
            ).result
        ),
        params,
    )


@pytest.mark.parametrize("channels_last", [False, True])
def test_im2col_gradient(channels_last):
    shape = (1, 5, 4, 3) if channels_last else (1, 3, 5, 4)
    check_gradients(
        lambda: (
            wse.Im2ColOp(
                weight("x", shape), [2, 3], [2, 1], [1, 1, 0, 1], [1, 1], 3, channels_last
            ).result
        ),
        {"x": rnd(*shape, seed=3)},
    )


POOLS = {
    "max": lambda x, last: wse.MaxPoolOp(x, [3, 2], [2, 1], [1, 0, 1, 1], [1, 1], last),
    "max-dilated": lambda x, last: wse.MaxPoolOp(x, [2, 2], [1, 2], [0, 0, 1, 1], [2, 1], last),
    "avg": lambda x, last: wse.AvgPoolOp(x, [3, 2], [2, 1], [1, 0, 1, 1], [1, 1], False, last),
    "avg-pad-counted": lambda x, last: wse.AvgPoolOp(
        x, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], True, last
    ),
}


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("name", sorted(POOLS))
def test_pool_gradients(name, channels_last):
    shape = (2, 5, 4, 3) if channels_last else (2, 3, 5, 4)
    check_gradients(
        lambda: POOLS[name](weight("x", shape), channels_last).result, {"x": rnd(*shape, seed=4)}
    )


def test_max_pool_gradient_goes_to_the_first_maximum():
    """Equal values in a window: torch routes the gradient to the first one."""
    x = np.array([[[[1.0, 3.0, 3.0], [3.0, 0.0, 2.0]]]])

    def main():
        return [wse.ReduceSumOp(
            wse.MaxPoolOp(weight("x", (1, 1, 2, 3)), [2, 2], [1, 1], [0] * 4, [1, 1]).result,
            [0, 1, 2, 3], False,
        ).result]  # fmt: skip

    module = apply(build([], main), FormLayersPass(), AutodiffPass())
    _, grads = run(module, [], {"x": x})
    want = torch.tensor(x, requires_grad=True)
    F.max_pool2d(want, 2, 1).sum().backward()
    np.testing.assert_array_equal(grads["x"], want.grad.numpy())
    np.testing.assert_array_equal(grads["x"], [[[[0, 2, 0], [0, 0, 0]]]])


@pytest.mark.parametrize(
    ("table", "axis", "indices"),
    [
        ((5, 3), 0, [[0, 4, -1], [4, 4, 2]]),  # an embedding: repeated and negative tokens
        ((2, 6, 3), 1, [5, 0, 5]),
        ((4, 3), 1, 2),  # a scalar index drops the axis
    ],
)
def test_gather_gradient(table, axis, indices):
    index_array = np.array(indices, dtype=np.int64)
    check_gradients(
        lambda i: wse.GatherOp(weight("t", table), i, axis).result,
        {"t": rnd(*table, seed=5)},
        [T(*index_array.shape, el=i64)],
        [index_array],
    )


def test_gather_elements_gradient():
    indices = np.array([[0, 2, 2, -1], [1, 1, 0, 0]], dtype=np.int64)
    check_gradients(
        lambda i: wse.GatherElementsOp(weight("t", (2, 3)), i, 1).result,
        {"t": rnd(2, 3, seed=6)},
        [T(2, 4, el=i64)],
        [indices],
    )


# ---------------------------------------------------------------------------------------------
# Against torch.autograd
# ---------------------------------------------------------------------------------------------


def _mlp_train_module(batch: int = 4, **options):
    imported = import_model(zoo.MODELS["mlp_train"](), batch_size=batch)
    apply(
        imported.module,
        DecomposePass(),
        FoldConstantsPass(),
        FormLayersPass(),
        AutodiffPass(**options),
        FoldConstantsPass(),
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 64)).astype(np.float32)
    labels = np.array([3, 9, 0, 3, 5, 1, 7, 2][:batch], dtype=np.int64)
    return imported, [x, labels]


def test_mlp_train_against_torch():
    imported, (x, labels) = _mlp_train_module()
    (loss, logits), grads = run(imported.module, [x, labels], imported.weights)
    params = {k: torch.tensor(v, requires_grad=True) for k, v in imported.weights.items()}
    h = torch.relu(torch.from_numpy(x) @ params["fc1.weight"].T + params["fc1.bias"])
    h = torch.relu(h @ params["fc2.weight"].T + params["fc2.bias"])
    out = h @ params["fc3.weight"].T + params["fc3.bias"]
    want = F.cross_entropy(out, torch.from_numpy(labels))
    want.backward()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5)
    np.testing.assert_allclose(logits, out.detach().numpy(), rtol=1e-4, atol=1e-5)
    assert sorted(grads) == sorted(params) and len(grads) == 6
    for name, p in params.items():
        assert grads[name].dtype == np.float32 and grads[name].shape == p.shape
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_loss_scale_scales_every_gradient():
    imported, inputs = _mlp_train_module()
    _, full = run(imported.module, inputs, imported.weights)
    scaled_model, _ = _mlp_train_module(loss_scale=0.25)
    _, scaled = run(scaled_model.module, inputs, scaled_model.weights)
    assert sorted(scaled) == sorted(full)
    for name in full:
        np.testing.assert_allclose(scaled[name], 0.25 * full[name], rtol=1e-6, atol=1e-9)


def test_trainable_patterns_select_a_subset():
    imported, inputs = _mlp_train_module()
    _, full = run(imported.module, inputs, imported.weights)
    subset_model, _ = _mlp_train_module(trainable=(r"fc1\..*", "fc3.bias"))
    _, subset = run(subset_model.module, inputs, subset_model.weights)
    assert sorted(subset) == ["fc1.bias", "fc1.weight", "fc3.bias"]
    for name in subset:
        np.testing.assert_allclose(subset[name], full[name], rtol=1e-6, atol=1e-9)
    streamed = {
        op.weight_name.data
        for op in subset_model.module.walk()
        if isinstance(op, ws.StreamGradientOp)
    }
    assert streamed == {"fc1.bias", "fc1.weight", "fc3.bias"}


def test_trainable_patterns_match_in_full():
    with pytest.raises(CgcError, match=r"no trainable parameter reaches the loss.*\['fc'\]"):
        _mlp_train_module(trainable=("fc",))
    with pytest.raises(CgcError, match=r"no trainable parameter reaches the loss"):
        _mlp_train_module(trainable=("nothing.*",))


# ---------------------------------------------------------------------------------------------
# Gradient flow rules
# ---------------------------------------------------------------------------------------------


def test_weight_used_twice_gets_the_sum():
    """``w`` in two layers (tied) and twice in one op: every use contributes."""
    w = rnd(3, 3, seed=1)
    x = rnd(2, 3, seed=2)

    def body(x):
        tied = weight("w", (3, 3))
        h = wse.MatmulOp(x, tied).result  # layer 1
        h = wse.MatmulOp(h, weight("w", (3, 3))).result  # layer 2, same weight
        return wse.MulOp(h, wse.ReduceSumOp(wse.MulOp(tied, tied).result, [0], False).result).result

    grads = check_gradients(body, {"w": w}, [T(2, 3)], [x])
    assert grads["w"].shape == (3, 3)


def test_tied_weight_streams_one_gradient_per_use():
    w = rnd(3, 3, seed=1)

    def main(x):
        h = wse.MatmulOp(x, weight("w", (3, 3))).result
        h = wse.MatmulOp(h, weight("w", (3, 3))).result
        return [wse.ReduceSumOp(h, [0, 1], False).result]

    module = apply(build([T(2, 3)], main), FormLayersPass(), AutodiffPass())
    streamed = [op.weight_name.data for op in module.walk() if isinstance(op, ws.StreamGradientOp)]
    assert streamed == ["w", "w"]
    x = rnd(2, 3, seed=2)
    _, grads = run(module, [x], {"w": w})
    t = torch.tensor(w, requires_grad=True)
    (torch.from_numpy(x) @ t @ t).sum().backward()
    np.testing.assert_allclose(grads["w"], t.grad.numpy(), rtol=1e-12)


def test_integer_paths_stop_gradients():
    """``cast(cast(w, i64), f64)`` carries no gradient; the float path does."""
    w = np.array([[1.7, -2.2], [0.4, 3.9]])
    x = rnd(2, 2, seed=3)

    def main(x):
        v = weight("w", (2, 2))
        rounded = wse.CastOp(wse.CastOp(v, i64).result, f64).result
        total = wse.AddOp(wse.MulOp(v, x).result, rounded).result
        return [wse.ReduceSumOp(total, [0, 1], False).result]

    module = apply(build([T(2, 2)], main), FormLayersPass(), AutodiffPass())
    _, grads = run(module, [x], {"w": w})
    np.testing.assert_array_equal(grads["w"], x)


def test_only_integer_paths_means_no_gradient():
    def main():
        v = wse.CastOp(wse.CastOp(weight("w", (2,)), i64).result, f64).result
        return [wse.ReduceSumOp(v, [0], False).result]

    module = apply(build([], main), FormLayersPass())
    with pytest.raises(CgcError, match="no trainable parameter reaches the loss"):
        AutodiffPass().apply(context(), module)


def test_frozen_weights_get_no_gradient():
    def main():
        v = wse.MulOp(weight("w", (2,)), weight("c", (2,), frozen=True)).result
        return [wse.ReduceSumOp(v, [0], False).result]

    module = apply(build([], main), FormLayersPass(), AutodiffPass())
    _, grads = run(module, [], {"w": np.array([1.0, 2.0]), "c": np.array([3.0, 4.0])})
    assert sorted(grads) == ["w"]
    np.testing.assert_array_equal(grads["w"], [3.0, 4.0])


def test_op_without_a_rule_on_the_gradient_path():
    def main(x):
        h = wse.MulOp(x, weight("w", (1, 4))).result
        scan = wse.CumProdOp(h, 1, False, False)
        scan.location = loc("running")
        return [wse.ReduceSumOp(scan.result, [0, 1], False).result]

    module = apply(build([T(1, 4)], main), FormLayersPass())
    with pytest.raises(CgcError, match=r"autodiff: wse.cumprod \(node running\) has no gradient"):
        AutodiffPass().apply(context(), module)


def test_op_without_a_rule_off_the_gradient_path_is_fine():
    def main(x):
        scan = wse.CumProdOp(x, 1, False, False).result
        h = wse.MulOp(scan, weight("w", (1, 4))).result
        return [wse.ReduceSumOp(h, [0, 1], False).result]

    module = apply(build([T(1, 4)], main), FormLayersPass(), AutodiffPass())
    x = rnd(1, 4, seed=1)
    _, grads = run(module, [x], {"w": rnd(1, 4, seed=2)})
    np.testing.assert_array_equal(grads["w"], np.cumprod(x, axis=1))


def test_reflect_padding_wider_than_the_axis_has_no_gradient():
    def main():
        p = wse.PadOp(weight("w", (3,)), [3], [0], 0.0, "reflect")
        p.location = loc("mirror")
        return [wse.ReduceSumOp(p.result, [0], False).result]

    module = apply(build([], main), FormLayersPass())
    with pytest.raises(CgcError, match=r"wse.pad \(node mirror\).*reflect padding of 3, 0"):
        AutodiffPass().apply(context(), module)


def test_loss_must_be_a_scalar_float():
    imported = import_model(zoo.MODELS["mlp"](), batch_size=2)  # first output: logits
    apply(imported.module, DecomposePass(), FoldConstantsPass(), FormLayersPass())
    with pytest.raises(CgcError, match=r"first output must be a scalar float loss, not \(2, 10\)"):
        AutodiffPass().apply(context(), imported.module)

    def main(x):
        return [wse.ReduceSumOp(x, [0], False).result]

    module = apply(build([T(3, el=i64)], main), FormLayersPass())
    with pytest.raises(CgcError, match=r"scalar float loss"):
        AutodiffPass().apply(context(), module)


def test_main_must_return_the_loss():
    module = build([T(2)], lambda x: [])
    with pytest.raises(CgcError, match=r"@main returns nothing"):
        AutodiffPass().apply(context(), module)


# ---------------------------------------------------------------------------------------------
# Structure of the result
# ---------------------------------------------------------------------------------------------


def test_backward_layers_and_saved_activations():
    imported = import_model(zoo.MODELS["mlp_train"](), batch_size=2)
    module = apply(imported.module, DecomposePass(), FoldConstantsPass(), FormLayersPass())
    forward_results = {layer.layer_name.data: len(layer.results) for layer in layers(module)}
    apply(module, AutodiffPass())
    found = layers(module)
    assert [layer.layer_name.data for layer in found] == [
        "fc1", "fc2", "fc3", "fc3.grad", "fc2.grad", "fc1.grad"
    ]  # fmt: skip
    assert isinstance(top_ops(module)[-1], func.ReturnOp)
    forward = {layer.layer_name.data: layer for layer in found[:3]}
    backward = found[3:]
    for name, layer in forward.items():
        # the forward layer also yields the activations its backward layer needs
        assert len(layer.results) > forward_results[name], name
        saved = layer.results[forward_results[name] :]
        grad_layer = next(g for g in backward if g.layer_name.data == f"{name}.grad")
        for value in saved:
            assert {use.operation for use in value.uses} == {grad_layer}, name
        assert grad_layer.location == layer.location
        assert not any(isinstance(op, ws.StreamGradientOp) for op in layer.body.block.ops)
    for layer in backward:
        body = layer.body.block
        defined = set(body.args)
        for op in body.ops:
            assert all(v in defined for v in op.operands), op.name
            defined.update(op.results)
        # weights are created again inside the backward layer
        streamed = [op.weight_name.data for op in body.ops if isinstance(op, ws.StreamGradientOp)]
        prefix = layer.layer_name.data.removesuffix(".grad")
        assert sorted(streamed) == [f"{prefix}.bias", f"{prefix}.weight"]
    # fc1.grad yields nothing (the graph input needs no gradient), the others feed the next
    assert [len(layer.results) for layer in backward] == [1, 1, 0]
    assert backward[1].inputs[0] is backward[0].results[0]
    assert backward[2].inputs[0] is backward[1].results[0]
    text = print_module(module)
    assert print_module(parse_module(text)) == text


def test_every_backward_op_has_a_location():
    imported = import_model(zoo.MODELS["mlp_train"](), batch_size=2)
    module = apply(
        imported.module, DecomposePass(), FoldConstantsPass(), FormLayersPass(), AutodiffPass()
    )
    for layer in layers(module):
        for op in layer.body.block.ops:
            if not isinstance(op, wse.YieldOp):
                assert isinstance(op.location, NameLoc), f"{layer.layer_name.data}: {op}"


def test_skip_connection_sums_the_partials_of_a_layer_result():
    """``h`` feeds the next layer and, through a residual add, the one after: the backward
    layer of ``h`` sums both contributions."""
    params = {"w1": rnd(3, 3, seed=1), "w2": rnd(3, 3, seed=2), "w3": rnd(3, 2, seed=3)}
    x = rnd(2, 3, seed=4)

    def body(x):
        h = wse.TanhOp(wse.MatmulOp(x, weight("w1", (3, 3))).result).result
        a = wse.MatmulOp(h, weight("w2", (3, 3))).result
        return wse.MatmulOp(wse.AddOp(h, a).result, weight("w3", (3, 2))).result

    check_gradients(body, params, [T(2, 3)], [x])


def test_matmul_of_a_weight_with_itself_and_scalar_weights():
    params = {"w": rnd(3, 3, seed=1), "s": np.array(0.7)}

    def body():
        w = weight("w", (3, 3))
        return wse.MulOp(wse.MatmulOp(w, w).result, weight("s", ())).result

    check_gradients(body, params)


def test_autodiff_twice_is_refused():
    """A module that already streams gradients is refused, and left as it was."""
    imported, _ = _mlp_train_module()
    before = print_module(imported.module)
    with pytest.raises(CgcError, match="already streams gradients; differentiate once"):
        apply(imported.module, AutodiffPass())
    assert print_module(imported.module) == before
