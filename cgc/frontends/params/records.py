"""The records a params file is read into, and what they say of the model and its training.

``ModelParams`` holds one file's sections: the model (``ModelConfig``), its training data
(``TrainInput``), optimizer (``OptimizerConfig``), systems (``RunConfig``) and sparsity
(``SparsityConfig``). ``INTEGER_LIMITS`` bounds every integer key; ``parameter_count`` gives the
exact number of trainable parameters of a ``ModelConfig``, and ``optimizer_settings`` the
optimizer's settings by torch.optim's keywords.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cgc.machine.hardware.target import MAX_SYSTEMS
from cgc.machine.sparse.sparsity import Sparsity

POSITION_EMBEDDING_TYPES = ("learned", "rotary")
POSITION_SCALING_TYPES = ("linear", "llama3")
NORM_TYPES = ("layernorm", "rmsnorm")
NONLINEARITIES = ("gelu", "gelu_new", "relu", "swiglu")
OPTIMIZER_TYPES = ("sgd", "adam", "adamw")
PRECISIONS = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class IntegerLimit:
    """The largest value an integer key accepts, and why (messages give both)."""

    most: int
    reason: str


INTEGER_LIMITS = {
    "model.hidden_size": IntegerLimit(1 << 18, "over 20 times GPT-3's 12288"),
    "model.num_hidden_layers": IntegerLimit(
        512, "4 times the deepest published model's 126, Llama 3.1 405B's"
    ),
    "model.num_heads": IntegerLimit(1 << 18, "that of hidden_size, which it divides"),
    "model.extra_attention_params.num_kv_groups": IntegerLimit(
        1 << 18, "that of num_heads, which it divides"
    ),
    "model.attention_sliding_window_length": IntegerLimit(
        1 << 20, "that of max_position_embeddings"
    ),
    "model.filter_size": IntegerLimit(1 << 20, "4 times that of hidden_size, as the default"),
    "model.vocab_size": IntegerLimit(1 << 22, "over 16 times the largest real vocabulary"),
    "model.max_position_embeddings": IntegerLimit(
        1 << 20, "that of train_input.max_sequence_length"
    ),
    "model.rotary_dim": IntegerLimit(1 << 18, "that of hidden_size, as the head dimension"),
    "model.pos_scaling_extra_args.original_max_position_embeddings": IntegerLimit(
        1 << 20, "that of max_position_embeddings"
    ),
    "train_input.batch_size": IntegerLimit(1 << 24, "over 10,000 times GPT-3's 1536"),
    "train_input.max_sequence_length": IntegerLimit(1 << 20, "8 times a 128K context"),
    "runconfig.num_csx": IntegerLimit(MAX_SYSTEMS, "that of --num-csx"),
}
"""The limit of every integer key, by key path. Beyond these a model is no real one, and
compiling it must still take seconds to a minute and well under a GiB: compiling costs time and
memory by the layers (about 0.1 s and 1 MiB a transformer block)."""


@dataclass(frozen=True)
class RotaryScaling:
    """How the rotary frequencies are stretched past the context a model was first trained
    on: the Model Zoo's ``pos_scaling_type``, ``pos_scaling_factor`` and
    ``pos_scaling_extra_args``, as Hugging Face's ``rope_scaling`` computes them."""

    type: str
    """``"linear"`` (position interpolation, arXiv 2306.15595: every frequency divided by
    ``factor``) or ``"llama3"`` (Llama 3.1: the frequencies whose wavelength exceeds
    ``original_max_position_embeddings / low_freq_factor`` divided by ``factor``, those under
    ``original_max_position_embeddings / high_freq_factor`` kept, those between
    interpolated)."""
    factor: float
    """How much longer the context is than the original one; above 1."""
    low_freq_factor: float = 0.0
    """llama3 only: the low-frequency bound (Llama 3.1: 1)."""
    high_freq_factor: float = 0.0
    """llama3 only: the high-frequency bound, above ``low_freq_factor`` (Llama 3.1: 4)."""
    original_max_position_embeddings: int = 0
    """llama3 only: the context of the first training (Llama 3.1: 8192)."""


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer language model (GPT-2/3, GPT-J, GPT-NeoX, Llama)."""

    hidden_size: int
    """Width of the residual stream (d_model). Required."""
    num_hidden_layers: int
    """Number of transformer blocks. Required."""
    num_heads: int
    """Attention (query) heads; divides ``hidden_size``. Required."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention, ``extra_attention_params.num_kv_groups`` in
    the file); divides ``num_heads``. Default: ``num_heads`` (plain multi-head attention)."""
    filter_size: int
    """Inner width of the MLP; for swiglu, the width of each of the two up projections.
    Default: ``4 * hidden_size``."""
    vocab_size: int
    """Rows of the token embedding (and of the LM head). Required."""
    max_position_embeddings: int
    """Longest sequence the position embedding covers. Default: ``max_sequence_length``."""
    position_embedding_type: str
    """``"learned"`` (a table of ``max_position_embeddings`` rows) or ``"rotary"``.
    Default: ``"learned"``."""
    rotary_dim: int
    """Rotary: how many of each head's dimensions rotate (GPT-J 64 of 256, GPT-NeoX 25 %);
    even and at most the head dimension. 0 for learned positions. Default: the whole head
    dimension for rotary, 0 for learned."""
    norm_type: str
    """``"layernorm"`` (weight and bias) or ``"rmsnorm"`` (weight only). Default:
    ``"layernorm"``."""
    layer_norm_epsilon: float
    """Epsilon of every norm; positive. Default: 1e-5."""
    nonlinearity: str
    """MLP activation: ``"gelu"`` (the erf form), ``"gelu_new"`` (its tanh approximation,
    GPT-2's), ``"relu"`` or ``"swiglu"`` (a gated MLP with two up projections). Default:
    ``"gelu"``."""
    share_embedding_weights: bool
    """The LM head is the token embedding's transpose (tied). Default: true."""
    use_projection_bias_in_attention: bool
    """Biases on the q, k and v projections (Qwen2 has these only). ``use_bias`` in the file
    sets this and the next two at once. Default: true."""
    use_ffn_bias_in_attention: bool
    """A bias on the attention's output projection. Default: true."""
    use_ffn_bias: bool
    """Biases on the MLP's projections. Default: true."""
    use_bias_in_output: bool
    """A bias on the LM head. Default: false."""
    parallel_attention: bool
    """GPT-J / GPT-NeoX blocks, ``x + attn(norm(x)) + mlp(norm(x))``, instead of sequential
    ones. Default: false."""
    use_untied_layer_norm: bool
    """With ``parallel_attention``: separate norms for attention and MLP (GPT-NeoX) rather
    than one shared norm (GPT-J). Default: false."""
    embedding_dropout_rate: float
    """Dropout after the embeddings, in [0, 1). Default: 0."""
    attention_dropout_rate: float
    """Dropout on the attention probabilities, in [0, 1). Default: 0."""
    dropout_rate: float
    """Dropout on the attention and MLP outputs, in [0, 1). Default: 0."""
    rope_theta: float = 10000.0
    """Rotary: the base of the frequencies (Llama 2 10,000, Llama 3 500,000, Qwen2
    1,000,000); positive. Default: 10000.0."""
    rotary_scaling: RotaryScaling | None = None
    """Rotary: how the frequencies are stretched for long contexts, or ``None`` for not at
    all. Default: ``None``."""
    attention_sliding_window_length: int | None = None
    """Sliding-window attention (Mistral): each token attends to this many latest tokens, its
    own included; ``None`` (or ``null`` in the file) for all the tokens up to its own.
    Default: ``None``."""

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class TrainInput:
    """The shape of the training data."""

    batch_size: int
    """The global batch, in sequences; split evenly over ``num_csx`` systems. Required."""
    max_sequence_length: int
    """Tokens per sequence. Required."""


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer MemoryX runs, with torch.optim's meaning of every number."""

    optimizer_type: str
    """``"sgd"``, ``"adam"`` or ``"adamw"``, read case-insensitively (the Model Zoo writes
    ``AdamW``). Default: ``"adamw"``."""
    learning_rate: float
    """The peak learning rate; positive. Default: 1e-3 (torch.optim's)."""
    betas: tuple[float, float]
    """Adam's decay rates, each in [0, 1); ``betas: [b1, b2]`` or ``beta1``/``beta2`` in the
    file. Default: (0.9, 0.999)."""
    eps: float
    """Adam's epsilon; positive. Default: 1e-8."""
    weight_decay: float
    """Non-negative; ``weight_decay`` or the Model Zoo's ``weight_decay_rate`` in the file.
    Default: 0.01 for adamw, 0 for adam and sgd (torch.optim's)."""
    momentum: float
    """SGD's momentum, in [0, 1). Default: 0."""
    max_gradient_norm: float | None
    """Clip the gradients' global norm to this (positive), or ``None`` for no clipping.
    Default: ``None``."""


@dataclass(frozen=True)
class RunConfig:
    """Where and how the model trains."""

    num_csx: int
    """Data-parallel systems; divides ``batch_size``. Default: 1."""
    precision: str
    """``"float32"``, or ``"float16"``/``"bfloat16"``: 16-bit weights and activations on the
    wafer, float32 master weights and optimizer state in MemoryX. Default: ``"float32"``."""


@dataclass(frozen=True)
class ModelParams:
    """One params file, read and checked."""

    name: str
    """The file's stem, NAME of ``zoo:NAME``, or what a document built in code is called."""
    source: str
    """What to print in messages: the file name, ``"zoo:NAME"``, or a document's source."""
    model: ModelConfig
    train_input: TrainInput
    optimizer: OptimizerConfig
    runconfig: RunConfig
    sparsity: SparsityConfig | None = None
    """The sparsity of the trained weights, when the file has a ``sparsity`` section."""


@dataclass(frozen=True)
class SparsityConfig:
    """A params file's ``sparsity`` section (``cgc.machine.sparse.sparsity``)."""

    density: float
    param_name_patterns: tuple[str, ...]
    init: str
    schedule: str = "static"
    dynamic: tuple[tuple[str, Any], ...] = ()
    """The dynamic settings the file gives (``cgc.machine.sparse.sparsity.DYNAMIC``), as (name,
    value) pairs."""

    def sparsity(self, seed: int) -> Sparsity:
        """The sparsity the section says, its masks drawn from ``seed``."""
        return Sparsity(self.density, self.param_name_patterns, self.init, seed, self.schedule,
                        **dict(self.dynamic))  # fmt: skip


def parameter_count(model: ModelConfig) -> int:
    """The number of trainable parameters of ``model``, exactly, counted as the standard
    implementations (Hugging Face's GPT-2, GPT-J, GPT-NeoX and Llama) define them:

    * the token embedding, ``vocab_size * hidden_size``, and for learned positions the
      position table, ``max_position_embeddings * hidden_size`` (rotary has no parameters);
    * per block: each norm's weight (``hidden_size``) and, for layernorm, its bias; two norms
      per block, or one when ``parallel_attention`` shares it (``use_untied_layer_norm``
      false); the q and output projections (``hidden_size**2`` each), the k and v projections
      (``hidden_size * num_kv_heads * head_dim`` each); the MLP's two matrices, or three for
      swiglu (``hidden_size * filter_size`` each); a bias (of each one's output width) on the
      q, k and v projections with ``use_projection_bias_in_attention``, on the output
      projection with ``use_ffn_bias_in_attention``, on the MLP's with ``use_ffn_bias``;
    * the final norm;
    * the LM head, ``vocab_size * hidden_size``, unless tied to the token embedding, and its
      bias, ``vocab_size``, if ``use_bias_in_output``.

    Buffers (causal masks, rotary frequency tables) are not parameters.
    """
    d, f = model.hidden_size, model.filter_size
    kv_width = model.num_kv_heads * model.head_dim
    norm = d * (2 if model.norm_type == "layernorm" else 1)
    up_projections = 2 if model.nonlinearity == "swiglu" else 1
    attention = 2 * d * d + 2 * d * kv_width
    mlp = (up_projections + 1) * d * f
    if model.use_projection_bias_in_attention:
        attention += d + 2 * kv_width
    if model.use_ffn_bias_in_attention:
        attention += d
    if model.use_ffn_bias:
        mlp += up_projections * f + d
    norms_per_block = 1 if model.parallel_attention and not model.use_untied_layer_norm else 2
    block = norms_per_block * norm + attention + mlp
    embeddings = model.vocab_size * d
    if model.position_embedding_type == "learned":
        embeddings += model.max_position_embeddings * d
    head = 0 if model.share_embedding_weights else model.vocab_size * d
    if model.use_bias_in_output:
        head += model.vocab_size
    return embeddings + model.num_hidden_layers * block + norm + head


def optimizer_settings(params: ModelParams) -> tuple[str, dict[str, float | tuple[float, float]]]:
    """The optimizer of the file and its settings by torch.optim's keywords (``lr``,
    ``betas``, ``eps``, ``weight_decay``, ``momentum``: those the optimizer has)."""
    o = params.optimizer
    settings: dict[str, float | tuple[float, float]] = {
        "lr": o.learning_rate,
        "weight_decay": o.weight_decay,
    }
    if o.optimizer_type == "sgd":
        settings["momentum"] = o.momentum
    else:
        settings["betas"] = o.betas
        settings["eps"] = o.eps
    return o.optimizer_type, settings
