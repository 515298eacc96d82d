"""Epilogues fused into the matmuls (``fuse-epilogues``, ``wse.fused_matmul``): the numbers
equal onnxruntime's on convolutions with batch norms and residuals and on MLPs with every
activation form, timing-only runs time them alike, the kernel's plan counts the epilogue in
its arithmetic (a bias or residual starting the accumulator costs nothing), and the fused
layers cost less than the ops they replace."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from conftest import parse_module, runs_exactly_and_times_alike
from onnx import TensorProto, helper, numpy_helper
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import VerifyException

import cgc
from cgc.compiler.pipelines import pipeline
from cgc.dialects import parse_module as parse_ir
from cgc.dialects import wse
from cgc.dialects.interpreter import Interpreter
from cgc.dialects.ir import main_function
from cgc.dialects.lowering import lower
from cgc.frontends.imported import ImportedModel
from cgc.frontends.onnx import import_model
from cgc.machine import plans
from cgc.machine.hardware.target import get_target
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import NO_TRAFFIC
from cgc.machine.plans import RESIDENT, WAFER, Operand, vector_cycles
from cgc.machine.timing.cost import layer_cost
from cgc.passes.fuse_epilogues import FuseEpiloguesPass

C = 8


def _weights(rng: np.random.Generator, **shapes: tuple[int, ...]) -> list[onnx.TensorProto]:
    return [
        numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), name)
        for name, s in shapes.items()
    ]


def _batch_norm(rng: np.random.Generator, name: str, source: str) -> tuple[list, onnx.NodeProto]:
    """A BatchNormalization of ``C`` channels with random statistics, and its initializers."""
    values = {
        f"{name}.g": rng.uniform(0.5, 1.5, C),
        f"{name}.b": rng.standard_normal(C) * 0.1,
        f"{name}.m": rng.standard_normal(C) * 0.1,
        f"{name}.v": rng.uniform(0.5, 1.5, C),
    }
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in values.items()]
    node = helper.make_node("BatchNormalization", [source, *values], [name], name=name)
    return inits, node


def residual_cnn() -> onnx.ModelProto:
    """A ResNet basic block and a 1x1 convolution: conv-BN-ReLU, conv-BN, the residual add and
    the ReLU, then a convolution with a bias."""
    rng = np.random.default_rng(0)
    inits = _weights(rng, w1=(C, C, 3, 3), w2=(C, C, 3, 3), w3=(C, C, 1, 1), b3=(C,))
    bn1, norm1 = _batch_norm(rng, "bn1", "c1")
    bn2, norm2 = _batch_norm(rng, "bn2", "c2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        norm1,
        helper.make_node("Relu", ["bn1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        norm2,
        helper.make_node("Add", ["bn2", "r1"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["y"], name="conv3"),
    ]
    shape = [2, C, 6, 6]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [*inits, *bn1, *bn2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def activations_mlp() -> onnx.ModelProto:
    """Linear layers ending in GELU's erf form, GELU's tanh form, SwiGLU, and a bias and a
    residual add."""
    rng = np.random.default_rng(1)
    d = 16
    inits = _weights(
        rng, w1=(d, d), b1=(d,), w2=(d, d), b2=(d,), wg=(d, d), wu=(d, d), w4=(d, d), b4=(d,)
    )
    consts = {"half": 0.5, "one": 1.0, "root": np.sqrt(2.0), "k": 0.044715, "three": 3.0}
    consts["c"] = np.sqrt(2 / np.pi)
    inits += [numpy_helper.from_array(np.float32(v), name) for name, v in consts.items()]
    op = helper.make_node
    nodes = [
        op("MatMul", ["x", "w1"], ["m1"], name="fc1"),
        op("Add", ["m1", "b1"], ["h1"], name="fc1.bias"),
        op("Div", ["h1", "root"], ["d1"], name="gelu.div"),
        op("Erf", ["d1"], ["e1"], name="gelu.erf"),
        op("Add", ["e1", "one"], ["p1"], name="gelu.add"),
        op("Mul", ["h1", "p1"], ["q1"], name="gelu.mul"),
        op("Mul", ["q1", "half"], ["g1"], name="gelu.half"),
        op("MatMul", ["g1", "w2"], ["m2"], name="fc2"),
        op("Add", ["m2", "b2"], ["h2"], name="fc2.bias"),
        op("Pow", ["h2", "three"], ["cube"], name="tanh.pow"),
        op("Mul", ["cube", "k"], ["kc"], name="tanh.k"),
        op("Add", ["h2", "kc"], ["inner"], name="tanh.inner"),
        op("Mul", ["inner", "c"], ["arg"], name="tanh.c"),
        op("Tanh", ["arg"], ["t"], name="tanh.tanh"),
        op("Add", ["t", "one"], ["tp"], name="tanh.one"),
        op("Mul", ["h2", "tp"], ["ht"], name="tanh.mul"),
        op("Mul", ["ht", "half"], ["g2"], name="tanh.half"),
        op("MatMul", ["g2", "wu"], ["up"], name="up"),
        op("MatMul", ["g2", "wg"], ["gate"], name="gate"),
        op("Sigmoid", ["gate"], ["sg"], name="silu.sigmoid"),
        op("Mul", ["gate", "sg"], ["silu"], name="silu"),
        op("Mul", ["silu", "up"], ["glu"], name="swiglu"),
        op("MatMul", ["glu", "w4"], ["m4"], name="fc4"),
        op("Add", ["m4", "b4"], ["h4"], name="fc4.bias"),
        op("Add", ["h4", "g2"], ["y"], name="residual"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, d])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _fused(artifact) -> list[wse.FusedMatmulOp]:
    return [op for op in parse_ir(artifact.ir).walk() if isinstance(op, wse.FusedMatmulOp)]


@pytest.mark.parametrize("mode", ["pipelined", "weight_streaming"])
def test_batch_norms_fold_into_the_filters_and_the_residual_joins_the_epilogue(mode):
    model = residual_cnn()
    artifact = cgc.compile(model, mode=mode, target="mesh16x16")
    fused = _fused(artifact)
    # the last convolution's product goes back to the graph's channels-first order before
    # its bias: its epilogue is only the view of its rows as an image
    assert [op.location.desc.data for op in fused] == ["conv1", "conv2", "conv3"]
    assert fused[2].steps() == [] and not fused[2].scales
    body = [op for layer in parse_ir(artifact.ir).walk() if isinstance(layer, wse.LayerOp)
            for op in layer.body.block.ops]  # fmt: skip
    assert not any(isinstance(op, wse.ReluOp | wse.BatchNormOp) for op in body)
    # each norm's gain scales its filter (a weight and one constant), its shift starts the
    # accumulator; the second's epilogue adds the residual and applies the ReLU
    assert [len(op.scales) for op in fused[:2]] == [2, 2]
    assert [[name for name, _ in op.steps()] for op in fused[:2]] == [
        ["add", "relu"],
        ["add", "add", "relu"],
    ]
    runs_exactly_and_times_alike(model, artifact)


def test_a_weight_given_as_a_view_is_copied_once_and_kept():
    """A run freezes the weights it reads: a view of memory another array may write is
    copied once and becomes the artifact's, so later runs neither see writes through the
    other array nor serve what they made of the old values."""
    model = residual_cnn()
    artifact = cgc.compile(model, mode="pipelined", target="mesh16x16")
    base = np.array(artifact.weights["w1"])  # writable, owned by the test
    artifact.weights["w1"] = base[...]  # a view of it
    x = np.random.default_rng(4).standard_normal((2, C, 6, 6)).astype(np.float32)
    first = cgc.run(artifact, {"x": x})
    kept = artifact.weights["w1"]
    assert kept.base is None and not kept.flags.writeable
    base[...] = 0
    assert np.array_equal(cgc.run(artifact, {"x": x})["y"], first["y"])
    artifact.weights["w1"] = np.zeros_like(base)  # a new array: seen, and laid out anew
    assert not np.array_equal(cgc.run(artifact, {"x": x})["y"], first["y"])


@pytest.mark.parametrize("mode", ["pipelined", "weight_streaming"])
def test_every_activation_form_runs_in_the_epilogues(mode):
    model = activations_mlp()
    artifact = cgc.compile(model, mode=mode, target="mesh16x16")
    steps = {op.location.desc.data: [n for n, _ in op.steps()] for op in _fused(artifact)}
    assert steps["fc1"] == ["add", "div", "erf", "add", "mul", "mul"]
    # the cube is two products (fold-constants)
    assert steps["fc2"] == ["add", "mul", "mul", "mul", "add", "mul", "tanh", "add", "mul", "mul"]
    # the gate's SiLU times the up projection, an extra of its shape
    assert steps["gate"] == ["sigmoid", "mul", "mul"] and "up" not in steps
    assert steps["fc4"] == ["add", "add"]
    runs_exactly_and_times_alike(model, artifact)


def _layers_unfused_and_fused(imported: ImportedModel) -> tuple[ModuleOp, ModuleOp]:
    """``imported``'s module through the front passes (layers formed), and a copy of it
    through ``fuse-epilogues`` too."""
    module = imported.module.clone()
    pipeline("fuse-rotary,fuse-attention,decompose,fold-constants,channels-last,form-layers").apply(
        None, module
    )
    fused = module.clone()
    FuseEpiloguesPass().apply(None, fused)  # type: ignore[arg-type]
    return module, fused


def test_the_interpreter_gives_the_fused_module_the_numbers_of_the_unfused():
    imported = import_model(residual_cnn())
    module, fused = _layers_unfused_and_fused(imported)
    x = np.random.default_rng(2).standard_normal((2, C, 6, 6)).astype(np.float32)
    want = Interpreter(imported.weights).run_function(main_function(module), [x])
    got = Interpreter(imported.weights).run_function(main_function(fused), [x])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


CORNER_CASES = {
    # a division by a constant, then a multiplication by a weight: both scale the weights
    "two scalings in a row": (
        r"""
func.func @main(%x: tensor<4x16xf32>) -> tensor<4x32xf32> {
  %y = wse.layer "fc" (%x) : (tensor<4x16xf32>) -> tensor<4x32xf32> {
  ^bb0(%a: tensor<4x16xf32>):
    %w = wse.weight "w" : tensor<16x32xf32> loc("fc")
    %g = wse.weight "g" : tensor<32xf32> loc("bn")
    %std = wse.constant dense<2.0> : tensor<32xf32> loc("bn")
    %m = wse.matmul %a, %w : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32> loc("fc")
    %d = wse.div %m, %std : (tensor<4x32xf32>, tensor<32xf32>) -> tensor<4x32xf32> loc("bn")
    %s = wse.mul %d, %g : (tensor<4x32xf32>, tensor<32xf32>) -> tensor<4x32xf32> loc("bn")
    %o = wse.relu %s : tensor<4x32xf32> loc("relu")
    wse.yield %o : tensor<4x32xf32>
  } loc("fc")
  func.return %y : tensor<4x32xf32>
}
""",
        2,
    ),
    # a product of one row is a vector of the columns: read again, it stays in the epilogue
    "one row read again": (
        r"""
func.func @main(%x: tensor<1x16xf32>) -> tensor<1x32xf32> {
  %y = wse.layer "fc" (%x) : (tensor<1x16xf32>) -> tensor<1x32xf32> {
  ^bb0(%a: tensor<1x16xf32>):
    %w = wse.weight "w" : tensor<16x32xf32> loc("fc")
    %b = wse.weight "b" : tensor<32xf32> loc("fc")
    %m = wse.matmul %a, %w : (tensor<1x16xf32>, tensor<16x32xf32>) -> tensor<1x32xf32> loc("fc")
    %h = wse.add %m, %b : (tensor<1x32xf32>, tensor<32xf32>) -> tensor<1x32xf32> loc("bias")
    %o = wse.add %h, %m : (tensor<1x32xf32>, tensor<1x32xf32>) -> tensor<1x32xf32> loc("twice")
    wse.yield %o : tensor<1x32xf32>
  } loc("fc")
  func.return %y : tensor<1x32xf32>
}
""",
        0,
    ),
    "one row read again after a scale": (
        r"""
func.func @main(%x: tensor<1x16xf32>) -> tensor<1x32xf32> {
  %y = wse.layer "fc" (%x) : (tensor<1x16xf32>) -> tensor<1x32xf32> {
  ^bb0(%a: tensor<1x16xf32>):
    %w = wse.weight "w" : tensor<16x32xf32> loc("fc")
    %c = wse.constant dense<3.0> : tensor<f32> loc("c")
    %m = wse.matmul %a, %w : (tensor<1x16xf32>, tensor<16x32xf32>) -> tensor<1x32xf32> loc("fc")
    %h = wse.mul %m, %c : (tensor<1x32xf32>, tensor<f32>) -> tensor<1x32xf32> loc("scale")
    %o = wse.sub %h, %m : (tensor<1x32xf32>, tensor<1x32xf32>) -> tensor<1x32xf32> loc("twice")
    wse.yield %o : tensor<1x32xf32>
  } loc("fc")
  func.return %y : tensor<1x32xf32>
}
""",
        0,
    ),
    # an op no one reads is left to dead-code elimination, not computed in the epilogue
    "a dead op": (
        r"""
func.func @main(%x: tensor<4x16xf32>) -> tensor<2x2x32xf32> {
  %y = wse.layer "fc" (%x) : (tensor<4x16xf32>) -> tensor<2x2x32xf32> {
  ^bb0(%a: tensor<4x16xf32>):
    %w = wse.weight "w" : tensor<16x32xf32> loc("fc")
    %m = wse.matmul %a, %w : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32> loc("fc")
    %h = wse.relu %m : tensor<4x32xf32> loc("relu")
    %e = wse.exp %h : tensor<4x32xf32> loc("dead")
    %r = wse.reshape %h : tensor<4x32xf32> -> tensor<2x2x32xf32> loc("split")
    wse.yield %r : tensor<2x2x32xf32>
  } loc("fc")
  func.return %y : tensor<2x2x32xf32>
}
""",
        0,
    ),
    # a product of two activations: its scale is an epilogue step, not folded into a matrix
    # computed on every run
    "activations times activations": (
        r"""
func.func @main(%q: tensor<1x4x8xf32>, %k: tensor<1x8x4xf32>) -> tensor<1x4x4xf32> {
  %y = wse.layer "scores" (%q, %k) : (tensor<1x4x8xf32>, tensor<1x8x4xf32>) -> tensor<1x4x4xf32> {
  ^bb0(%a: tensor<1x4x8xf32>, %b: tensor<1x8x4xf32>):
    %c = wse.constant dense<0.35> : tensor<f32> loc("scale")
    %m = wse.matmul %a, %b : (tensor<1x4x8xf32>, tensor<1x8x4xf32>) -> tensor<1x4x4xf32> loc("qk")
    %s = wse.mul %m, %c : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4x4xf32> loc("scale")
    wse.yield %s : tensor<1x4x4xf32>
  } loc("scores")
  func.return %y : tensor<1x4x4xf32>
}
""",
        0,
    ),
    # a division by a constant holding a zero keeps its infinities: no reciprocal folds
    "a zero divisor": (
        r"""
func.func @main(%x: tensor<4x16xf32>) -> tensor<4x4xf32> {
  %y = wse.layer "fc" (%x) : (tensor<4x16xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x16xf32>):
    %w = wse.weight "w" : tensor<16x4xf32> loc("fc")
    %d = wse.constant dense<[1.0, 0.0, 2.0, 4.0]> : tensor<4xf32> loc("d")
    %m = wse.matmul %a, %w : (tensor<4x16xf32>, tensor<16x4xf32>) -> tensor<4x4xf32> loc("fc")
    %q = wse.div %m, %d : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4x4xf32> loc("div")
    wse.yield %q : tensor<4x4xf32>
  } loc("fc")
  func.return %y : tensor<4x4xf32>
}
""",
        0,
    ),
}
"""Modules and the scales their fused op should have."""


@pytest.mark.parametrize("case", sorted(CORNER_CASES))
def test_corner_cases_keep_the_unfused_numbers(case):
    text, scales = CORNER_CASES[case]
    module = parse_ir(text)
    rng = np.random.default_rng(3)
    weights = {
        op.weight_name.data: rng.standard_normal(wse.tensor_shape(op.result)).astype(np.float32)
        for op in module.walk()
        if isinstance(op, wse.WeightOp)
    }
    args = [
        rng.standard_normal(wse.tensor_shape(a)).astype(np.float32)
        for a in main_function(module).body.block.args
    ]
    fused = module.clone()
    FuseEpiloguesPass().apply(None, fused)  # type: ignore[arg-type]
    fused.verify()
    (op,) = [o for o in fused.walk() if isinstance(o, wse.FusedMatmulOp)]
    assert len(op.scales) == scales
    assert not any(isinstance(o, wse.ExpOp) for o in fused.walk())  # the dead op's
    want = Interpreter(weights).run_function(main_function(module), args)
    got = Interpreter(weights).run_function(main_function(fused), args)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


TARGET = get_target("wse2")
RECT = (0, 0, 16, 8)


def _operands(extras: int) -> list[Operand]:
    a = Operand((64, 128), "float32", WAFER, Layout.on((64, 128), "float32", RECT, fold=True))
    b = Operand((128, 256), "float32", RESIDENT)
    return [a, b, *[Operand((256,), "float32", RESIDENT)] * extras]


def test_a_bias_starts_the_accumulator_and_an_activation_costs_its_vector_cycles():
    result = [((64, 256), "float32")]
    alone = plans.plan("matmul", TARGET, RECT, _operands(0), {}, result)
    epilogue = [["add", [0, 1]], ["relu", [2]]]
    attrs = {"scales": 0, "epilogue": epilogue}
    fused = plans.plan("fused_matmul", TARGET, RECT, _operands(1), attrs, result)
    (out,) = fused.outputs
    relu = vector_cycles(out.tile_elements, 1.0, "float32", TARGET)
    assert relu > 0
    assert fused.cost.compute_cycles == alone.cost.compute_cycles + relu
    assert fused.cost.cycles == alone.cost.cycles + relu
    # the bias is kept on every PE of the product, beside the weights: no run moves it
    assert fused.cost.traffic == alone.cost.traffic
    assert fused.inputs[2] is not None and fused.inputs[2].h == out.h
    assert fused.detail["epilogue"] == ["add", "relu"]
    # as ops of their own, the bias is multicast down the rows and both pass over the tile
    add = plans.plan("add", TARGET, RECT, [Operand((64, 256), "float32", WAFER, out),
                                           _operands(1)[2]], {}, result)  # fmt: skip
    assert add.cost.traffic != NO_TRAFFIC
    assert fused.cost.cycles < alone.cost.cycles + add.cost.cycles + relu


def test_scales_are_free_and_a_second_addend_costs_a_pass():
    result = [((64, 256), "float32")]
    alone = plans.plan("matmul", TARGET, RECT, _operands(0), {}, result)
    epilogue = [["add", [0, 1]], ["add", [2, 1]]]
    fused = plans.plan(
        "fused_matmul", TARGET, RECT, _operands(2), {"scales": 1, "epilogue": epilogue}, result
    )
    (out,) = fused.outputs
    one_pass = vector_cycles(out.tile_elements, 1.0, "float32", TARGET)
    assert fused.cost.compute_cycles == alone.cost.compute_cycles + one_pass


def test_fused_layers_cost_less_than_the_ops_they_replace():
    module, fused = _layers_unfused_and_fused(import_model(residual_cnn()))
    before, after = lower(module, TARGET.whole), lower(fused, TARGET.whole)
    rect = (0, 0, 32, 16)
    for index in range(2):
        unfused_cost = layer_cost(before, index, rect, TARGET)
        fused_cost = layer_cost(after, index, rect, TARGET)
        assert fused_cost.cycles < unfused_cost.cycles, index
        assert fused_cost.flops <= unfused_cost.flops


def test_no_fused_layer_of_a_decoder_costs_more_than_its_ops_did():
    """A batch of sequences: the products fold their rows, and their operands arrive as the
    matmuls alone take them."""
    from cgc.frontends import zoo

    imported = import_model(zoo.decoder(blocks=1, seq=16, width=64, heads=4), batch_size=2)
    module, fused = _layers_unfused_and_fused(imported)
    before, after = lower(module, TARGET.whole), lower(fused, TARGET.whole)
    for index in range(len(before.layers)):
        for rect in [(0, 0, 64, 32), (0, 0, 24, 16), (0, 0, 128, 8)]:
            unfused_cost = layer_cost(before, index, rect, TARGET)
            assert layer_cost(after, index, rect, TARGET).cycles <= unfused_cost.cycles


def test_a_decode_steps_fused_layers_cost_what_their_ops_did():
    """Llama 3.1 8B's decode step (one token, declared weights) on the whole wafer: MeshGEMV
    leaves its product as a vector elsewhere, and the fused result moves where the add after
    it would have put it, so the norm after it finds it in place. The one extra given in
    another view of the product (the up projection's gate) is reshaped by a kernel of its
    own, a few cycles."""
    from cgc.frontends.params import load_params
    from cgc.frontends.transformer import Generation, build_generation

    params = load_params("zoo:llama-3.1-8b")
    module, fused = _layers_unfused_and_fused(
        build_generation(params, 1, Generation(1, 2048, False), blocks=1)
    )
    before, after = lower(module, TARGET.whole), lower(fused, TARGET.whole)
    for index in range(len(before.layers)):
        unfused_cost = layer_cost(before, index, TARGET.whole, TARGET)
        assert layer_cost(after, index, TARGET.whole, TARGET).cycles <= 1.01 * unfused_cost.cycles


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("scaled(%s : tensor<8xf32>)", "a scale must have shape (4,)"),
        ("with(%s : tensor<8xf32>)", "the epilogue takes the product and extras"),
    ],
)
def test_the_verifier_names_what_is_wrong(change, message):
    types = "(tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>"
    text = f"""
    func.func @f(%a: tensor<2x3xf32>, %w: tensor<3x4xf32>, %s: tensor<8xf32>) -> tensor<2x4xf32> {{
      %y = wse.fused_matmul %a, %w {change % "%s"} : {types} {{
      ^bb0(%acc: tensor<2x4xf32>):
        %r = wse.relu %acc : tensor<2x4xf32>
        wse.yield %r : tensor<2x4xf32>
      }}
      func.return %y : tensor<2x4xf32>
    }}
    """
    with pytest.raises(VerifyException, match=re.escape(message)):
        parse_module(text).verify()


def test_an_epilogue_reads_only_its_arguments_and_yields_its_last_op():
    outside = """
    func.func @f(%a: tensor<2x3xf32>, %w: tensor<3x4xf32>, %b: tensor<4xf32>) -> tensor<2x4xf32> {
      %y = wse.fused_matmul %a, %w : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32> {
      ^bb0(%acc: tensor<2x4xf32>):
        %r = wse.add %acc, %b : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
        wse.yield %r : tensor<2x4xf32>
      }
      func.return %y : tensor<2x4xf32>
    }
    """
    with pytest.raises(VerifyException, match="IsolatedFromAbove"):
        parse_module(outside).verify()
    not_last = """
    func.func @f(%a: tensor<2x3xf32>, %w: tensor<3x4xf32>) -> tensor<2x4xf32> {
      %y = wse.fused_matmul %a, %w : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32> {
      ^bb0(%acc: tensor<2x4xf32>):
        %r = wse.relu %acc : tensor<2x4xf32>
        %e = wse.exp %acc : tensor<2x4xf32>
        wse.yield %r : tensor<2x4xf32>
      }
      func.return %y : tensor<2x4xf32>
    }
    """
    with pytest.raises(VerifyException, match="must yield its last op's result"):
        parse_module(not_last).verify()


def test_an_epilogue_holds_only_elementwise_arithmetic():
    text = """
    func.func @f(%a: tensor<2x3xf32>, %w: tensor<3x4xf32>) -> tensor<2x4xf32> {
      %y = wse.fused_matmul %a, %w : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32> {
      ^bb0(%acc: tensor<2x4xf32>):
        %r = wse.reduce_sum %acc {axes = array<i64: 1>, keepdims = true}
               : tensor<2x4xf32> -> tensor<2x1xf32>
        %s = wse.sub %acc, %r : (tensor<2x4xf32>, tensor<2x1xf32>) -> tensor<2x4xf32>
        wse.yield %s : tensor<2x4xf32>
      }
      func.return %y : tensor<2x4xf32>
    }
    """
    with pytest.raises(VerifyException, match=r"wse\.reduce_sum cannot be part of an epilogue"):
        parse_module(text).verify()
