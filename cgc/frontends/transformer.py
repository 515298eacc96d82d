"""The params-file frontend: a GPT-class language model built directly in the WSE dialect.

``build(params, batch)`` turns a ``ModelParams`` (``cgc.frontends.params``) into the same
``ImportedModel`` the ONNX importer returns: ``@main`` takes ``input_ids`` [B, S] (and, for
training, ``labels`` [B, S]) and returns the mean next-token cross-entropy (training) or the
logits [B, S, V]. No ONNX file is written on the way and no weight is allocated: the weights
are declared by name, shape and type, and the artifact runs timing-only. With
``materialize=True`` the weights are drawn instead (normal, std 0.02; norms at one, biases at
zero; the rotary tables computed), for tests on small configs.

The residual stream is [B*S, H]: tokens along the wafer's rows, the hidden dimension along
its columns, as the Cerebras weight-streaming layout keeps activations; attention is one fused
causal op on those token-major tensors (``wse.attention``), so no head is ever transposed into
a layout of its own. The blocks follow the config: pre-norm sequential blocks
(GPT-2/3) or parallel attention and MLP (GPT-J with one shared norm, GPT-NeoX with two);
LayerNorm or RMSNorm; learned positions or rotary embeddings (``wse.rotary``: ``rotate_half``
on the first ``rotary_dim`` dimensions of each head, frequencies of base ``rope_theta``,
stretched linearly or as Llama 3.1 does); GELU, ReLU or SwiGLU MLPs; grouped-query
attention (each key and value head shared by a group of query heads), each token seeing all the
tokens up to its own or a sliding window of them (Mistral); biases on the q/k/v, the attention
output and the MLP projections each as the config says; a tied or separate LM head.
``cgc.frontends.hf_weights`` renames a Hugging Face checkpoint's tensors to this model's
weights, and ``cgc.frontends.hf_config`` reads a ``transformers`` config as a params file.

Mixed precision (``runconfig.precision`` float16 or bfloat16): weights and activations on the
wafer are 16-bit, the declared (master) weights float32 in MemoryX, the loss float32.

Every op carries a location named like the module's ``state_dict``: ``h.3.attn.q_proj``,
``h.3.mlp.fc_in``; the weights are ``h.3.attn.q_proj.weight`` and so on, and the blocks are
the segments (``h.N.``) whose activations the compiler may compute again in the backward pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from xdsl.builder import Builder
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    FunctionType,
    ModuleOp,
    NameLoc,
    NoneAttr,
    StringAttr,
    TensorType,
    UnitAttr,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.rewriter import InsertPoint

from cgc.dialects import wse
from cgc.dialects.lowering import EVERY_LAYER
from cgc.errors import CgcError
from cgc.frontends.imported import ImportedModel, TensorSpec
from cgc.frontends.params import ModelConfig, ModelParams
from cgc.machine.hardware import dtypes
from cgc.machine.program.artifact import WeightSpec

TOKEN_DTYPE = "int32"
"""The element type of token ids and labels."""
MASTER_DTYPE = "float32"
"""MemoryX's copies of the trained weights."""
INIT_STD = 0.02
SEGMENTS = r"h\.\d+\."
"""Layer names that start with this belong to a transformer block (see the module's doc)."""


def check_supported(params: ModelParams) -> None:
    """Raises a CgcError naming the key of a config this frontend cannot build."""
    model = params.model
    for key in ("embedding_dropout_rate", "attention_dropout_rate", "dropout_rate"):
        if getattr(model, key):
            raise CgcError(
                f"{params.source}: model.{key}: dropout {getattr(model, key):g} is not "
                "supported (cgc generates no random numbers on the wafer); set it to 0.0"
            )


@dataclass(frozen=True)
class Generation:
    """One program of autoregressive generation: ``tokens`` new tokens per sequence, their
    keys and values written into caches of ``capacity`` tokens at their positions (a graph
    input, ``positions`` [B, tokens]). The prompt's prefill gives the logits of each
    sequence's last prompt token (``last`` [B], its row among the program's ``B x tokens``
    rows) and the decode the
    logits of its one token: ``logits`` [B, V]."""

    tokens: int
    capacity: int
    prefill: bool
    """Whether this is the prompt's program (else a decode step's)."""


@dataclass
class _Model:
    """A model under construction: its ops, weights and the names it used."""

    params: ModelParams
    batch: int
    materialize: bool
    rng: np.random.Generator
    builder: Builder
    act: str
    """The activations' numpy dtype."""
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    declared: dict[str, WeightSpec] = field(default_factory=dict)
    trainable: list[str] = field(default_factory=list)
    location: NameLoc = field(default_factory=lambda: _loc("main"))
    cache: dict[str, SSAValue] = field(default_factory=dict)
    """Frozen tables built once (the rotary tables)."""
    buffers: bool = False
    """Whether the frozen tables are computed even where the weights are declared (the
    weights then come from a checkpoint)."""
    generation: Generation | None = None
    positions: SSAValue | None = None
    """Generating: every token's position, [B, tokens]."""

    @property
    def config(self) -> ModelConfig:
        return self.params.model

    @property
    def seq(self) -> int:
        if self.generation is not None:
            return self.generation.tokens
        return self.params.train_input.max_sequence_length

    def token_positions(self, where: str) -> SSAValue:
        """Generating: every token's position, flat [T] (once for ``where``: each layer
        that reads them reads its own, as pipelined mode places layers apart)."""
        assert self.positions is not None
        key = f"{where}.positions"
        if key not in self.cache:
            self.cache[key] = self.op(wse.ReshapeOp(self.positions, (self.tokens,)))
        return self.cache[key]

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    # -- building ops ---------------------------------------------------------------------

    def at(self, name: str) -> None:
        """Ops from now on carry location ``name``."""
        self.location = _loc(name)

    def op(self, operation: Operation) -> SSAValue:
        """Inserts ``operation`` at the current location; its first result."""
        operation.location = self.location
        self.builder.insert(operation)
        return operation.results[0]

    def scalar(self, value: float, like: SSAValue) -> SSAValue:
        """A rank-0 constant of ``like``'s element type."""
        array = np.asarray(value, dtype=wse.numpy_dtype(wse.element_type(like)))
        return self.op(wse.ConstantOp(wse.dense_attr(array)))

    def weight(
        self, name: str, shape: tuple[int, ...], init: Callable[[tuple[int, ...]], np.ndarray]
    ) -> SSAValue:
        """A trained parameter: 16-bit on the wafer under mixed precision, float32 in
        MemoryX."""
        if name not in self.weights and name not in self.declared:
            self.trainable.append(name)
            # a generation keeps no master copies: MemoryX holds what the wafer does
            master = MASTER_DTYPE if self.generation is None else self.act
            self._store(name, shape, master, init)
        return self.op(wse.WeightOp(name, _tensor(shape, self.act)))

    def frozen(
        self,
        name: str,
        shape: tuple[int, ...],
        table: Callable[[], np.ndarray],
        dtype: str | None = None,
    ) -> SSAValue:
        """A buffer computed from the config (not trained), in the activations' type or
        ``dtype``."""
        kind = dtype or self.act
        if name not in self.cache:
            if self.buffers and not self.materialize:
                self.weights[name] = np.asarray(table()).astype(dtypes.dtype(kind))
            else:
                self._store(name, shape, kind, lambda _: table())
            self.cache[name] = self.op(wse.WeightOp(name, _tensor(shape, kind), frozen=True))
        return self.cache[name]

    def _store(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: str,
        init: Callable[[tuple[int, ...]], np.ndarray],
    ) -> None:
        if self.materialize:
            self.weights[name] = np.asarray(init(shape)).astype(dtypes.dtype(dtype))
        else:
            self.declared[name] = WeightSpec(shape, dtype)

    def normal(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.rng.normal(0.0, INIT_STD, shape)

    # -- layers ---------------------------------------------------------------------------

    def linear(self, x: SSAValue, name: str, width: int, bias: bool) -> SSAValue:
        """``x @ W (+ b)`` with ``W`` [in, out] named ``name.weight``."""
        self.at(name)
        inner = wse.tensor_shape(x)[-1]
        w = self.weight(f"{name}.weight", (inner, width), self.normal)
        y = self.op(wse.MatmulOp(x, w))
        if bias:
            b = self.weight(f"{name}.bias", (width,), np.zeros)
            y = self.op(wse.AddOp(y, b))
        return y

    def norm(self, x: SSAValue, name: str) -> SSAValue:
        """LayerNorm (weight and bias) or RMSNorm (weight) over the hidden dimension."""
        self.at(name)
        width = wse.tensor_shape(x)[-1]
        eps = self.config.layer_norm_epsilon
        gamma = self.weight(f"{name}.weight", (width,), np.ones)
        if self.config.norm_type == "layernorm":
            beta = self.weight(f"{name}.bias", (width,), np.zeros)
            return self.op(wse.LayerNormOp(x, gamma, beta, 1, eps))
        square = self.op(wse.MulOp(x, x))
        mean = self.op(wse.ReduceMeanOp(square, [1], True))
        rms = self.op(wse.SqrtOp(self.op(wse.AddOp(mean, self.scalar(eps, x)))))
        return self.op(wse.MulOp(self.op(wse.DivOp(x, rms)), gamma))

    def activation(self, x: SSAValue, name: str) -> SSAValue:
        """GELU (the erf form, or with ``gelu_new`` GPT-2's tanh approximation
        ``tanh(sqrt(2 / pi) * (x + 0.044715 x^3))``) or ReLU."""
        self.at(name)
        if self.config.nonlinearity == "relu":
            return self.op(wse.ReluOp(x))
        if self.config.nonlinearity == "gelu_new":
            cube = self.op(wse.MulOp(self.op(wse.MulOp(x, x)), x))
            inner = self.op(wse.AddOp(x, self.op(wse.MulOp(cube, self.scalar(0.044715, x)))))
            scaled = self.op(wse.MulOp(inner, self.scalar(np.sqrt(2.0 / np.pi), x)))
            curve = self.op(wse.TanhOp(scaled))
        else:
            scaled = self.op(wse.MulOp(x, self.scalar(1 / np.sqrt(2.0), x)))
            curve = self.op(wse.ErfOp(scaled))
        half = self.op(wse.MulOp(x, self.scalar(0.5, x)))
        return self.op(wse.MulOp(half, self.op(wse.AddOp(curve, self.scalar(1.0, x)))))

    def mlp(self, x: SSAValue, prefix: str) -> SSAValue:
        """The block's MLP on the normalized stream ``x`` [T, H]."""
        c = self.config
        if c.nonlinearity == "swiglu":
            gate = self.linear(x, f"{prefix}.gate_proj", c.filter_size, c.use_ffn_bias)
            up = self.linear(x, f"{prefix}.up_proj", c.filter_size, c.use_ffn_bias)
            self.at(f"{prefix}.act")
            silu = self.op(wse.MulOp(gate, self.op(wse.SigmoidOp(gate))))
            hidden = self.op(wse.MulOp(silu, up))
            return self.linear(hidden, f"{prefix}.down_proj", c.hidden_size, c.use_ffn_bias)
        inner = self.linear(x, f"{prefix}.fc_in", c.filter_size, c.use_ffn_bias)
        hidden = self.activation(inner, f"{prefix}.act")
        return self.linear(hidden, f"{prefix}.fc_out", c.hidden_size, c.use_ffn_bias)

    def rotate(self, x: SSAValue, heads: int, name: str) -> SSAValue:
        """Rotary position embedding of the first ``rotary_dim`` dimensions of every head of
        ``x`` [T, heads * d] (``rotate_half`` layout)."""
        self.at(name)
        if self.generation is not None:
            cos, sin = self.token_angles(name.rsplit(".", 1)[0])
            return self.op(wse.RotaryOp(x, cos, sin, heads))
        s, r = self.seq, self.config.rotary_dim
        cos = self.frozen("rotary.cos", (s, r), lambda: _rotary(self.config, s)[0])
        sin = self.frozen("rotary.sin", (s, r), lambda: _rotary(self.config, s)[1])
        return self.op(wse.RotaryOp(x, cos, sin, heads))

    def token_angles(self, block: str) -> tuple[SSAValue, SSAValue]:
        """Generating: the cosines and sines of every token's rotary angles [T, r] (once a
        block), computed from its position as ``transformers`` computes them: the position
        times each frequency in float32."""
        if f"{block}.cos" not in self.cache:
            r = self.config.rotary_dim
            frequencies = np.tile(rotary_inverse_frequencies(self.config), 2)
            table = self.frozen("rotary.inverse_frequencies", (r,), lambda: frequencies, "float32")
            f32 = wse.element_of_numpy("float32")
            where = self.op(wse.ReshapeOp(self.token_positions(block), (self.tokens, 1)))
            angles = self.op(wse.MulOp(self.op(wse.CastOp(where, f32)), table))
            act = wse.element_of_numpy(self.act)
            for kind, op in (("cos", wse.CosOp), ("sin", wse.SinOp)):
                value = self.op(op(angles))
                if self.act != "float32":
                    value = self.op(wse.CastOp(value, act))
                self.cache[f"{block}.{kind}"] = value
        return self.cache[f"{block}.cos"], self.cache[f"{block}.sin"]

    def attention(self, x: SSAValue, prefix: str) -> SSAValue:
        """Causal multi-head (or grouped-query) self-attention on the normalized stream, as
        one fused op on token-major tensors."""
        c = self.config
        kv_width = c.num_kv_heads * c.head_dim
        q = self.linear(x, f"{prefix}.q_proj", c.hidden_size, c.use_projection_bias_in_attention)
        k = self.linear(x, f"{prefix}.k_proj", kv_width, c.use_projection_bias_in_attention)
        v = self.linear(x, f"{prefix}.v_proj", kv_width, c.use_projection_bias_in_attention)
        if c.position_embedding_type == "rotary":
            q = self.rotate(q, c.num_heads, f"{prefix}.q_rotary")
            k = self.rotate(k, c.num_kv_heads, f"{prefix}.k_rotary")
        self.at(f"{prefix}.attention")
        scale = 1 / np.sqrt(c.head_dim)
        window = c.attention_sliding_window_length or 0
        if self.generation is not None:
            context = self.cached_attention((q, k, v), prefix, scale, window)
        else:
            # a window as long as the sequence masks nothing the causal mask does not
            window = window if window < self.seq else 0
            context = self.op(
                wse.AttentionOp(q, k, v, self.seq, c.num_heads, c.num_kv_heads, True, scale, window)
            )
        return self.linear(
            context, f"{prefix}.out_proj", c.hidden_size, c.use_ffn_bias_in_attention
        )

    def cached_attention(
        self, qkv: tuple[SSAValue, SSAValue, SSAValue], prefix: str, scale: float, window: int
    ) -> SSAValue:
        """Generation's attention: the new keys and values written into the layer's caches,
        each query attending to its sequence's cache up to its position (the ``window``
        latest keys of them, if a window is given)."""
        c, generation = self.config, self.generation
        assert generation is not None and self.positions is not None
        rows = (self.batch * generation.capacity, c.num_kv_heads * c.head_dim)
        caches = tuple(
            self.op(
                wse.KvCacheOp(
                    f"{prefix}.{kind}_cache", generation.capacity, _tensor(rows, self.act)
                )
            )
            for kind in ("key", "value")
        )
        q, k, v = qkv
        return self.op(
            wse.CachedAttentionOp(
                q,
                k,
                v,
                (caches[0], caches[1]),
                self.positions,
                c.num_heads,
                c.num_kv_heads,
                scale,
                window if window < generation.capacity else 0,
            )
        )

    def block(self, x: SSAValue, index: int) -> SSAValue:
        """Transformer block ``index`` on the residual stream ``x`` [T, H]."""
        c, p = self.config, f"h.{index}"
        if c.parallel_attention:
            first = self.norm(x, f"{p}.ln_1")
            second = self.norm(x, f"{p}.ln_2") if c.use_untied_layer_norm else first
            attended = self.attention(first, f"{p}.attn")
            transformed = self.mlp(second, f"{p}.mlp")
            self.at(f"{p}.residual")
            return self.op(wse.AddOp(self.op(wse.AddOp(x, attended)), transformed))
        attended = self.attention(self.norm(x, f"{p}.ln_1"), f"{p}.attn")
        self.at(f"{p}.residual_1")
        x = self.op(wse.AddOp(x, attended))
        transformed = self.mlp(self.norm(x, f"{p}.ln_2"), f"{p}.mlp")
        self.at(f"{p}.residual_2")
        return self.op(wse.AddOp(x, transformed))

    def embed(self, ids: SSAValue) -> SSAValue:
        """Token (and learned position) embeddings of ``ids`` [B, S]: [T, H]."""
        c = self.config
        self.at("wte")
        table = self.weight("wte.weight", (c.vocab_size, c.hidden_size), self.normal)
        flat = self.op(wse.ReshapeOp(ids, (self.tokens,)))
        x = self.op(wse.GatherOp(table, flat, 0))
        if c.position_embedding_type != "learned":
            return x
        self.at("wpe")
        positions = self.weight("wpe.weight", (c.max_position_embeddings, c.hidden_size),
                                self.normal)  # fmt: skip
        if self.generation is not None:
            rows = self.op(wse.GatherOp(positions, self.token_positions("wpe"), 0))
            return self.op(wse.AddOp(x, rows))
        used = self.op(wse.SliceOp(positions, (0, 0), (self.seq, c.hidden_size), (1, 1)))
        grid = self.op(wse.ReshapeOp(x, (self.batch, self.seq, c.hidden_size)))
        placed = self.op(wse.AddOp(grid, used))
        return self.op(wse.ReshapeOp(placed, (self.tokens, c.hidden_size)))

    def head(self, x: SSAValue) -> SSAValue:
        """The final norm and the LM head: logits [T, V]."""
        c = self.config
        x = self.norm(x, "ln_f")
        self.at("lm_head")
        shape = (c.hidden_size, c.vocab_size)
        if c.share_embedding_weights:
            w = self.op(wse.WeightOp("wte.weight", _tensor(shape, self.act), perm=(1, 0)))
        else:
            w = self.weight("lm_head.weight", shape, self.normal)
        logits = self.op(wse.MatmulOp(x, w))
        if c.use_bias_in_output:
            logits = self.op(wse.AddOp(logits, self.weight("lm_head.bias", (c.vocab_size,),
                                                           np.zeros)))  # fmt: skip
        return logits

    def loss(self, logits: SSAValue, labels: SSAValue) -> SSAValue:
        """Mean next-token cross-entropy, in float32."""
        self.at("loss")
        scores = logits
        if self.act != "float32":
            scores = self.op(wse.CastOp(logits, wse.element_of_numpy("float32")))
        flat = self.op(wse.ReshapeOp(labels, (self.tokens,)))
        return self.op(wse.SoftmaxCrossEntropyOp(scores, flat, None, "mean", None))


def build(
    params: ModelParams,
    batch: int,
    training: bool,
    blocks: int | None = None,
    materialize: bool = False,
    seed: int = 0,
    buffers: bool = False,
) -> ImportedModel:
    """The model of ``params`` for a per-system batch of ``batch`` sequences, with the loss
    for ``training`` (else the logits), ``blocks`` transformer blocks (default: the config's),
    its weights declared or, with ``materialize``, drawn from ``seed``; with ``buffers``, the
    tables computed from the config (rotary) are computed even where the weights are
    declared."""
    seq = params.train_input.max_sequence_length
    inputs = [TensorSpec("input_ids", (batch, seq), TOKEN_DTYPE, 0)]
    if training:
        inputs.append(TensorSpec("labels", (batch, seq), TOKEN_DTYPE, 0))
    m, args = _started(params, batch, inputs, materialize, seed, buffers)
    logits = m.head(_blocks(m, m.embed(args[0]), blocks))
    if training:
        result = m.loss(logits, args[1])
        outputs = [TensorSpec("loss", (), "float32", None)]
    else:
        m.at("logits")
        result = m.op(wse.ReshapeOp(logits, (batch, seq, params.model.vocab_size)))
        outputs = [TensorSpec("logits", (batch, seq, params.model.vocab_size), m.act, 0)]
    return _finished(m, result, inputs, outputs)


def build_generation(
    params: ModelParams,
    batch: int,
    generation: Generation,
    blocks: int | None = None,
    materialize: bool = False,
    seed: int = 0,
    buffers: bool = False,
) -> ImportedModel:
    """A program of generation (``Generation``) of the model of ``params`` for ``batch``
    sequences: ``input_ids`` and ``positions`` [B, tokens] (and, for the prefill, ``last``
    [B]) in, ``logits`` [B, V] out; the other arguments as ``build``'s."""
    tokens = generation.tokens
    inputs = [
        TensorSpec("input_ids", (batch, tokens), TOKEN_DTYPE, 0),
        TensorSpec("positions", (batch, tokens), TOKEN_DTYPE, 0),
    ]
    if generation.prefill:
        inputs.append(TensorSpec("last", (batch,), TOKEN_DTYPE, 0))
    m, args = _started(params, batch, inputs, materialize, seed, buffers, generation)
    m.positions = args[1]
    x = _blocks(m, m.embed(args[0]), blocks)
    if generation.prefill:  # only each sequence's last prompt token goes on to the head
        m.at("last")
        x = m.op(wse.GatherOp(x, args[2], 0))
    logits = m.head(x)
    outputs = [TensorSpec("logits", (batch, params.model.vocab_size), m.act, 0)]
    return _finished(m, logits, inputs, outputs)


def _started(
    params: ModelParams,
    batch: int,
    inputs: list[TensorSpec],
    materialize: bool,
    seed: int,
    buffers: bool,
    generation: Generation | None = None,
) -> tuple[_Model, tuple[SSAValue, ...]]:
    """A model under construction in a new ``@main`` of ``inputs``, and its arguments."""
    check_supported(params)
    if batch < 1:
        raise CgcError(f"{params.source}: the batch must be at least 1, got {batch}")
    # generation's positions load at every layer that reads them (``EVERY_LAYER``)
    marks = [
        DictionaryAttr({EVERY_LAYER: UnitAttr()} if spec.name == "positions" else {})
        for spec in inputs
    ]
    fn = func.FuncOp(
        "main",
        ([_tensor(spec.shape, spec.dtype) for spec in inputs], []),
        arg_attrs=ArrayAttr(marks) if generation is not None else None,
    )
    ModuleOp([fn])
    for spec, arg in zip(inputs, fn.body.block.args, strict=True):
        arg.name_hint = spec.name.replace("_", "")
    m = _Model(params, batch, materialize, np.random.default_rng(seed),
               Builder(InsertPoint.at_end(fn.body.block)), params.runconfig.precision,
               buffers=buffers, generation=generation)  # fmt: skip
    return m, tuple(fn.body.block.args)


def _blocks(m: _Model, x: SSAValue, blocks: int | None) -> SSAValue:
    """The residual stream after ``blocks`` transformer blocks (default: the config's)."""
    for index in range(m.config.num_hidden_layers if blocks is None else blocks):
        x = m.block(x, index)
    return x


def _finished(
    m: _Model, result: SSAValue, inputs: list[TensorSpec], outputs: list[TensorSpec]
) -> ImportedModel:
    """The model returning ``result``."""
    m.builder.insert(func.ReturnOp(result))
    block = m.builder.insertion_point.block
    fn = block.parent_op()
    assert isinstance(fn, func.FuncOp)
    fn.function_type = FunctionType.from_lists([a.type for a in block.args], [result.type])
    module = fn.parent_op()
    assert isinstance(module, ModuleOp)
    return ImportedModel(
        module=module,
        weights=m.weights,
        inputs=inputs,
        outputs=outputs,
        initializers=m.trainable,
        opset=0,
        source=m.params.source,
        declared=m.declared,
        tokens_per_sample=m.seq,
        recompute_segments=SEGMENTS,
    )


def _loc(name: str) -> NameLoc:
    return NameLoc(StringAttr(name), NoneAttr())


def _tensor(shape: tuple[int, ...], dtype: str) -> TensorType[Attribute]:
    return TensorType(wse.element_of_numpy(dtype), shape)


def rotary_inverse_frequencies(config: ModelConfig) -> np.ndarray:
    """The ``rotary_dim / 2`` angular frequencies of the rotary embedding: ``rope_theta **
    (-2i / rotary_dim)``, stretched as ``rotary_scaling`` says (as Hugging Face's
    ``_compute_linear_scaling_rope_parameters`` and ``_compute_llama3_parameters`` do)."""
    dims = config.rotary_dim
    inverse = config.rope_theta ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
    scaling = config.rotary_scaling
    if scaling is None:
        return inverse
    if scaling.type == "linear":
        return inverse / scaling.factor
    wavelength = 2 * np.pi / inverse
    original = scaling.original_max_position_embeddings
    # between the two bounds the frequency moves smoothly from divided to kept
    smooth = (original / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    interpolated = (1 - smooth) * inverse / scaling.factor + smooth * inverse
    kept = wavelength < original / scaling.high_freq_factor
    divided = wavelength > original / scaling.low_freq_factor
    return np.where(kept, inverse, np.where(divided, inverse / scaling.factor, interpolated))


def _rotary(config: ModelConfig, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """``cos`` and ``sin`` [S, rotary_dim] of the rotary embedding (``rotate_half`` layout:
    the frequencies of the first half repeated for the second)."""
    angles = np.outer(np.arange(seq, dtype=np.float64), rotary_inverse_frequencies(config))
    both = np.concatenate([angles, angles], axis=1)
    return np.cos(both), np.sin(both)
