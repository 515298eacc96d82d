"""Built-in example models, built with ``onnx.helper`` (no PyTorch needed).

Every builder is deterministic: the weights come from ``np.random.default_rng(seed)`` with
He (layers followed by a ReLU) or Xavier scaling, so the same arguments give the same bytes.
The models use IR version 10 and default-domain opset 18, name every node (``fc1``,
``fc1_relu``) and every initializer (``fc1.weight``, ``fc1.bias``), and keep the batch
dimension symbolic as ``N``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import partial
from itertools import pairwise

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10
OPSET = 18
BATCH = "N"


class _Graph:
    """Collects the nodes and initializers of a model under construction."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []

    def node(self, op_type: str, inputs: Sequence[str], name: str, **attrs) -> str:
        """Adds a node named ``name`` whose single output is also called ``name``."""
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], name=name, **attrs))
        return name

    def tensor(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def weight(self, name: str, shape: Sequence[int], fan_in: int, fan_out: int, relu: bool):
        """He-scaled (before a ReLU) or Xavier-scaled normal weights."""
        std = np.sqrt(2.0 / fan_in) if relu else np.sqrt(2.0 / (fan_in + fan_out))
        return self.tensor(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def bias(self, name: str, size: int, fan_in: int) -> str:
        bound = 1.0 / np.sqrt(fan_in)
        return self.tensor(name, self.rng.uniform(-bound, bound, size).astype(np.float32))

    def constant(self, name: str, array: np.ndarray | np.generic) -> str:
        """A Constant node (for shapes and scalars that are not trainable)."""
        value = numpy_helper.from_array(np.asarray(array), name)
        self.nodes.append(helper.make_node("Constant", [], [name], name=name, value=value))
        return name

    def model(self, name: str, inputs, outputs) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            ir_version=IR_VERSION,
            producer_name="cgc.zoo",
        )
        onnx.checker.check_model(model, full_check=True)
        return model


def _float(name: str, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def mlp(
    in_features: int = 64,
    hidden: Sequence[int] = (32, 32),
    classes: int = 10,
    seed: int = 0,
    with_loss: bool = False,
) -> onnx.ModelProto:
    """Gemm + ReLU layers on ``x`` [N, in_features]; the last Gemm gives ``logits``.

    With ``with_loss`` the model also takes ``labels`` [N] (int64) and its outputs are
    ``loss`` (mean SoftmaxCrossEntropyLoss, a scalar) and then ``logits``.
    """
    g = _Graph(seed)
    widths = [in_features, *hidden, classes]
    x = "x"
    for i, (fan_in, fan_out) in enumerate(pairwise(widths), start=1):
        last = i == len(widths) - 1
        layer = f"fc{i}"
        w = g.weight(f"{layer}.weight", (fan_out, fan_in), fan_in, fan_out, relu=not last)
        b = g.bias(f"{layer}.bias", fan_out, fan_in)
        if last:
            g.nodes.append(helper.make_node("Gemm", [x, w, b], ["logits"], name=layer, transB=1))
        else:
            x = g.node("Relu", [g.node("Gemm", [x, w, b], layer, transB=1)], f"{layer}_relu")
    inputs = [_float("x", [BATCH, in_features])]
    outputs = [_float("logits", [BATCH, classes])]
    if with_loss:
        _add_loss(g, inputs, outputs)
    return g.model("mlp_train" if with_loss else "mlp", inputs, outputs)


def _add_loss(g: _Graph, inputs: list, outputs: list) -> None:
    """Makes the model also take ``labels`` [N] (int64) and put the mean cross-entropy of
    ``logits`` first among its outputs, as ``loss``."""
    g.nodes.append(
        helper.make_node(
            "SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"], name="loss", reduction="mean"
        )
    )
    inputs.append(helper.make_tensor_value_info("labels", TensorProto.INT64, [BATCH]))
    outputs.insert(0, _float("loss", []))


def cnn(
    channels: int = 3, size: int = 16, classes: int = 10, seed: int = 0, with_loss: bool = False
) -> onnx.ModelProto:
    """A small convolutional classifier on ``x`` [N, channels, size, size] -> ``logits``
    (conv, batch norm with running statistics, max pool, conv, average pool, global average
    pool, Gemm); ``with_loss`` adds ``labels`` and ``loss`` as for ``mlp``."""
    g = _Graph(seed)
    fan1 = channels * 9
    w1 = g.weight("conv1.weight", (8, channels, 3, 3), fan1, 8 * 9, relu=True)
    b1 = g.bias("conv1.bias", 8, fan1)
    x = g.node("Conv", ["x", w1, b1], "conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    bn = [
        g.tensor("bn1.weight", g.rng.uniform(0.5, 1.5, 8).astype(np.float32)),
        g.tensor("bn1.bias", g.rng.uniform(-0.1, 0.1, 8).astype(np.float32)),
        g.tensor("bn1.running_mean", g.rng.uniform(-0.1, 0.1, 8).astype(np.float32)),
        g.tensor("bn1.running_var", g.rng.uniform(0.5, 1.5, 8).astype(np.float32)),
    ]
    x = g.node("BatchNormalization", [x, *bn], "bn1", epsilon=1e-5)
    x = g.node("Relu", [x], "bn1_relu")
    x = g.node("MaxPool", [x], "pool1", kernel_shape=[2, 2], strides=[2, 2])
    fan2 = 8 * 9
    w2 = g.weight("conv2.weight", (16, 8, 3, 3), fan2, 16 * 9, relu=True)
    b2 = g.bias("conv2.bias", 16, fan2)
    x = g.node("Conv", [x, w2, b2], "conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    x = g.node("Relu", [x], "conv2_relu")
    x = g.node("AveragePool", [x], "pool2", kernel_shape=[2, 2], strides=[2, 2])
    x = g.node("GlobalAveragePool", [x], "gap")
    x = g.node("Flatten", [x], "flatten", axis=1)
    w = g.weight("fc.weight", (classes, 16), 16, classes, relu=False)
    b = g.bias("fc.bias", classes, 16)
    g.nodes.append(helper.make_node("Gemm", [x, w, b], ["logits"], name="fc", transB=1))
    inputs = [_float("x", [BATCH, channels, size, size])]
    outputs = [_float("logits", [BATCH, classes])]
    if with_loss:
        _add_loss(g, inputs, outputs)
    return g.model("cnn_train" if with_loss else "cnn", inputs, outputs)


def _conv_bn(
    g: _Graph, x: str, name: str, cin: int, cout: int, kernel: int, group: int = 1, relu=True
) -> str:
    """Conv (no bias, same padding) -> BatchNormalization [-> Relu]."""
    fan = cin // group * kernel * kernel
    w = g.weight(f"{name}.weight", (cout, cin // group, kernel, kernel), fan, cout, relu=relu)
    pad = kernel // 2
    x = g.node("Conv", [x, w], name, kernel_shape=[kernel] * 2, pads=[pad] * 4, group=group)
    bn = [
        g.tensor(f"{name}_bn.weight", g.rng.uniform(0.5, 1.5, cout).astype(np.float32)),
        g.tensor(f"{name}_bn.bias", g.rng.uniform(-0.1, 0.1, cout).astype(np.float32)),
        g.tensor(f"{name}_bn.running_mean", g.rng.uniform(-0.1, 0.1, cout).astype(np.float32)),
        g.tensor(f"{name}_bn.running_var", g.rng.uniform(0.5, 1.5, cout).astype(np.float32)),
    ]
    x = g.node("BatchNormalization", [x, *bn], f"{name}_bn", epsilon=1e-5)
    return g.node("Relu", [x], f"{name}_relu") if relu else x


def resnet(channels: int = 3, size: int = 16, width: int = 16, classes: int = 10, seed: int = 0):
    """A small residual network on ``x`` [N, channels, size, size] -> ``logits``: a stem, a
    residual block, an inception-style block (a grouped 3x3 branch beside a pooled 1x1
    branch, concatenated), a squeeze-and-excitation gate, global pooling and a classifier."""
    g = _Graph(seed)
    x = _conv_bn(g, "x", "stem", channels, width, 3)
    x = g.node("MaxPool", [x], "stem_pool", kernel_shape=[2, 2], strides=[2, 2])
    h = _conv_bn(g, x, "res_a", width, width, 3)
    h = _conv_bn(g, h, "res_b", width, width, 3, relu=False)
    x = g.node("Relu", [g.node("Add", [x, h], "res_add")], "res_relu")
    grouped = _conv_bn(g, x, "mix_grouped", width, width, 3, group=2)
    pooled = g.node("AveragePool", [x], "mix_pool", kernel_shape=[3, 3], pads=[1] * 4)
    pooled = _conv_bn(g, pooled, "mix_point", width, width, 1)
    x = g.node("Concat", [grouped, pooled], "mix", axis=1)
    squeezed = g.node("GlobalAveragePool", [x], "se_pool")
    w = g.weight("se.weight", (2 * width, 2 * width, 1, 1), 2 * width, 2 * width, relu=False)
    gate = g.node("Sigmoid", [g.node("Conv", [squeezed, w], "se", kernel_shape=[1, 1])], "se_gate")
    x = g.node("Mul", [x, gate], "se_scale")
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x], "gap")], "flatten", axis=1)
    w = g.weight("fc.weight", (classes, 2 * width), 2 * width, classes, relu=False)
    b = g.bias("fc.bias", classes, 2 * width)
    g.nodes.append(helper.make_node("Gemm", [x, w, b], ["logits"], name="fc", transB=1))
    return g.model(
        "resnet",
        [_float("x", [BATCH, channels, size, size])],
        [_float("logits", [BATCH, classes])],
    )


def transformer_block(
    seq: int = 8, dim: int = 32, heads: int = 4, ffn: int = 64, seed: int = 0
) -> onnx.ModelProto:
    """A post-LN transformer encoder block on ``x`` [N, seq, dim] -> ``y`` [N, seq, dim]."""
    if dim % heads:
        raise ValueError(f"dim {dim} does not split into {heads} heads")
    head = dim // heads
    g = _Graph(seed)

    def linear(x: str, name: str, fan_in: int, fan_out: int) -> str:
        w = g.weight(f"{name}.weight", (fan_in, fan_out), fan_in, fan_out, relu=False)
        b = g.bias(f"{name}.bias", fan_out, fan_in)
        return g.node("Add", [g.node("MatMul", [x, w], name), b], f"{name}_bias")

    split = g.constant("attn_split_shape", np.array([0, 0, heads, head], dtype=np.int64))
    merge = g.constant("attn_merge_shape", np.array([0, 0, -1], dtype=np.int64))
    scale = g.constant("attn_scale", np.array(np.sqrt(head), dtype=np.float32))

    def heads_of(name: str) -> str:
        """[N, seq, dim] -> [N, heads, seq, head]."""
        x = linear("x", f"{name}_proj", dim, dim)
        x = g.node("Reshape", [x, split], f"{name}_split")
        return g.node("Transpose", [x], f"{name}_heads", perm=[0, 2, 1, 3])

    q, k, v = heads_of("q"), heads_of("k"), heads_of("v")
    k_t = g.node("Transpose", [k], "k_transpose", perm=[0, 1, 3, 2])
    scores = g.node("MatMul", [q, k_t], "attn_scores")
    scores = g.node("Div", [scores, scale], "attn_scores_scaled")
    probs = g.node("Softmax", [scores], "attn_softmax", axis=-1)
    ctx = g.node("MatMul", [probs, v], "attn_context")
    ctx = g.node("Transpose", [ctx], "attn_context_t", perm=[0, 2, 1, 3])
    ctx = g.node("Reshape", [ctx, merge], "attn_merge")
    attn = linear(ctx, "out_proj", dim, dim)
    x = g.node("Add", ["x", attn], "attn_residual")
    x = _layer_norm(g, x, "ln1", dim)
    h = linear(x, "ffn1", dim, ffn)
    h = _gelu(g, h, "ffn1_gelu")
    h = linear(h, "ffn2", ffn, dim)
    y = g.node("Add", [x, h], "ffn_residual")
    _layer_norm(g, y, "ln2", dim, output="y")
    return g.model(
        "transformer_block", [_float("x", [BATCH, seq, dim])], [_float("y", [BATCH, seq, dim])]
    )


def decoder(
    blocks: int = 2, seq: int = 8, width: int = 32, heads: int = 4, seed: int = 0
) -> onnx.ModelProto:
    """A GPT-2-style stack of ``blocks`` pre-norm decoder blocks on embeddings ``x`` [N, seq,
    width]: causal multi-head attention and a GELU MLP of four times the width, each added
    back to its input (28 nodes per block)."""
    if width % heads:
        raise ValueError(f"width {width} does not split into {heads} heads")
    g = _Graph(seed)
    heads_shape = g.constant("heads_shape", np.array([0, seq, heads, width // heads], np.int64))
    merged_shape = g.constant("merged_shape", np.array([0, seq, width], np.int64))
    scale = g.constant("scale", np.array(np.sqrt(width // heads), np.float32))
    mask = g.constant("causal_mask", np.triu(np.full((seq, seq), -1e9, np.float32), 1))
    half, one = g.constant("half", np.float32(0.5)), g.constant("one", np.float32(1.0))
    root2 = g.constant("root2", np.float32(np.sqrt(2.0)))
    x = "x"
    for b in range(blocks):
        p = f"b{b}."
        gamma = g.tensor(p + "ln.weight", np.ones(width, np.float32))
        h = g.node("LayerNormalization", [x, gamma], p + "ln", axis=-1)
        qkv = []
        for part in "qkv":
            w = g.weight(p + part + ".weight", (width, width), width, width, relu=False)
            split = g.node("Reshape", [g.node("MatMul", [h, w], p + part), heads_shape],
                           p + part + ".heads")  # fmt: skip
            qkv.append(g.node("Transpose", [split], p + part + ".t", perm=[0, 2, 1, 3]))
        keys = g.node("Transpose", [qkv[1]], p + "kt", perm=[0, 1, 3, 2])
        scores = g.node("Div", [g.node("MatMul", [qkv[0], keys], p + "qk"), scale], p + "scaled")
        scores = g.node("Add", [scores, mask], p + "masked")
        probs = g.node("Softmax", [scores], p + "softmax", axis=-1)
        merged = g.node("Transpose", [g.node("MatMul", [probs, qkv[2]], p + "av")], p + "merge.t",
                        perm=[0, 2, 1, 3])  # fmt: skip
        merged = g.node("Reshape", [merged, merged_shape], p + "merge")
        w = g.weight(p + "o.weight", (width, width), width, width, relu=False)
        x = g.node("Add", [x, g.node("MatMul", [merged, w], p + "o")], p + "res1")
        w = g.weight(p + "up.weight", (width, 4 * width), width, 4 * width, relu=False)
        up = g.node("MatMul", [x, w], p + "up")
        erf = g.node("Erf", [g.node("Div", [up, root2], p + "gelu.div")], p + "gelu.erf")
        gelu = g.node("Mul", [g.node("Mul", [up, half], p + "gelu.half"),
                              g.node("Add", [erf, one], p + "gelu.add")], p + "gelu")  # fmt: skip
        w = g.weight(p + "down.weight", (4 * width, width), 4 * width, width, relu=False)
        x = g.node("Add", [x, g.node("MatMul", [gelu, w], p + "down")], p + "res2")
    graph_out = g.node("Identity", [x], "y")
    return g.model(
        "decoder", [_float("x", [BATCH, seq, width])], [_float(graph_out, [BATCH, seq, width])]
    )


def _layer_norm(g: _Graph, x: str, name: str, dim: int, output: str | None = None) -> str:
    scale = g.tensor(f"{name}.weight", g.rng.uniform(0.8, 1.2, dim).astype(np.float32))
    bias = g.tensor(f"{name}.bias", g.rng.uniform(-0.1, 0.1, dim).astype(np.float32))
    out = output or name
    g.nodes.append(
        helper.make_node(
            "LayerNormalization", [x, scale, bias], [out], name=name, axis=-1, epsilon=1e-5
        )
    )
    return out


def _gelu(g: _Graph, x: str, name: str) -> str:
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` as five elementwise nodes."""
    sqrt2 = g.constant(f"{name}_sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))
    one = g.constant(f"{name}_one", np.array(1.0, dtype=np.float32))
    half = g.constant(f"{name}_half", np.array(0.5, dtype=np.float32))
    t = g.node("Div", [x, sqrt2], f"{name}_div")
    t = g.node("Erf", [t], f"{name}_erf")
    t = g.node("Add", [t, one], f"{name}_add")
    t = g.node("Mul", [x, t], f"{name}_mul")
    return g.node("Mul", [t, half], f"{name}_scale")


MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "mlp": mlp,
    "mlp_train": partial(mlp, with_loss=True),
    "cnn": cnn,
    "cnn_train": partial(cnn, with_loss=True),
    "resnet": resnet,
    "transformer": transformer_block,
    "decoder": decoder,
}
"""The built-in models by name; each builder takes keyword overrides of its defaults."""


def save(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Writes ``model`` to ``path`` (the same model always gives the same bytes)."""
    onnx.save(model, os.fspath(path))


def sample_inputs(model: onnx.ModelProto, samples: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for ``model`` with ``samples`` along its symbolic batch dimension:
    standard normal floats, and integers in [0, 10) (class labels) for int64 inputs."""
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    arrays = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value or samples for d in tensor.shape.dim]
        if tensor.elem_type == TensorProto.INT64:
            arrays[value.name] = rng.integers(0, 10, shape)
        else:
            arrays[value.name] = rng.standard_normal(shape).astype(np.float32)
    return arrays
