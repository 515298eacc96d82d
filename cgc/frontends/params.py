"""Params files: a GPT-class language model and its training run, in Cerebras Model Zoo style.

A params file is YAML with four sections, keyed as the Cerebras Model Zoo keys them::

    model:          # the network: hidden_size, num_hidden_layers, num_heads, vocab_size, ...
    train_input:    # batch_size (the global batch, in sequences), max_sequence_length
    optimizer:      # optimizer_type, learning_rate, betas, eps, weight_decay, ...
    runconfig:      # num_csx, precision
    sparsity:       # density, param_name_patterns, init, schedule (static or dynamic) and
                    # update_every, drop_fraction, regrow, decay, end_step (optional)

``load_params`` reads one (a path, or ``zoo:NAME`` for a built-in one from
``cgc/frontends/configs``) into a ``ModelParams``; any problem is a ``CgcError`` whose one line
names the file and the key path (``gpt.yaml: model.num_heads: 12 does not divide hidden_size
1000``). Values are checked strictly: ``true`` is not an integer, ``1.5`` is not an integer,
an integer is an acceptable float, a key given twice is an error, and every integer has an
upper limit (``INTEGER_LIMITS``) far above any real model. ``parameter_count`` gives the exact
number of trainable parameters of the model a ``ModelConfig`` describes.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import reprlib
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

from cgc.errors import CgcError, CgcWarning
from cgc.files import special_kind
from cgc.machine.hardware.target import MAX_SYSTEMS
from cgc.machine.sparse.sparsity import CHOSEN_INITS, DECAYS, DYNAMIC, REGROWS, SCHEDULES, Sparsity

ZOO_PREFIX = "zoo:"
"""A command-line MODEL of the form ``zoo:NAME`` names a built-in params file."""

PARAMS_SUFFIXES = (".yaml", ".yml")

POSITION_EMBEDDING_TYPES = ("learned", "rotary")
NORM_TYPES = ("layernorm", "rmsnorm")
NONLINEARITIES = ("gelu", "relu", "swiglu")
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
    "model.filter_size": IntegerLimit(1 << 20, "4 times that of hidden_size, as the default"),
    "model.vocab_size": IntegerLimit(1 << 22, "over 16 times the largest real vocabulary"),
    "model.max_position_embeddings": IntegerLimit(
        1 << 20, "that of train_input.max_sequence_length"
    ),
    "model.rotary_dim": IntegerLimit(1 << 18, "that of hidden_size, as the head dimension"),
    "train_input.batch_size": IntegerLimit(1 << 24, "over 10,000 times GPT-3's 1536"),
    "train_input.max_sequence_length": IntegerLimit(1 << 20, "8 times a 128K context"),
    "runconfig.num_csx": IntegerLimit(MAX_SYSTEMS, "that of --num-csx"),
}
"""The limit of every integer key, by key path. Beyond these a model is no real one, and
compiling it must still take seconds to a minute and well under a GiB: compiling costs time and
memory by the layers (about 0.1 s and 1 MiB a transformer block)."""


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
    """MLP activation: ``"gelu"``, ``"relu"`` or ``"swiglu"`` (a gated MLP with two up
    projections). Default: ``"gelu"``."""
    share_embedding_weights: bool
    """The LM head is the token embedding's transpose (tied). Default: true."""
    use_bias: bool
    """Biases on the attention (q, k, v, output) and MLP projections. Read from ``use_bias``
    or from the Model Zoo's ``use_projection_bias_in_attention``, ``use_ffn_bias_in_attention``
    and ``use_ffn_bias``, which must then agree. Default: true."""
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
    """The file's stem, or NAME of ``zoo:NAME``."""
    source: str
    """What to print in messages: the file name, or ``"zoo:NAME"``."""
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


_SECTIONS = ("model", "train_input", "optimizer", "runconfig", "sparsity")
_REQUIRED_SECTIONS = ("model", "train_input")
_ZOO_BIAS_KEYS = ("use_projection_bias_in_attention", "use_ffn_bias_in_attention", "use_ffn_bias")
_MODEL_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_heads",
    "extra_attention_params",
    "filter_size",
    "vocab_size",
    "max_position_embeddings",
    "position_embedding_type",
    "rotary_dim",
    "norm_type",
    "layer_norm_epsilon",
    "nonlinearity",
    "share_embedding_weights",
    "use_bias",
    *_ZOO_BIAS_KEYS,
    "use_bias_in_output",
    "parallel_attention",
    "use_untied_layer_norm",
    "embedding_dropout_rate",
    "attention_dropout_rate",
    "dropout_rate",
)
_EXTRA_ATTENTION_KEYS = ("num_kv_groups",)
_TRAIN_INPUT_KEYS = ("batch_size", "max_sequence_length")
_OPTIMIZER_KEYS = (
    "optimizer_type",
    "learning_rate",
    "betas",
    "beta1",
    "beta2",
    "eps",
    "weight_decay",
    "weight_decay_rate",
    "momentum",
    "max_gradient_norm",
)
_ADAM_KEYS = ("betas", "beta1", "beta2", "eps")
_RUNCONFIG_KEYS = ("num_csx", "precision")
_SPARSITY_KEYS = ("density", "param_name_patterns", "init", "schedule", *DYNAMIC)
_KNOWN_KEYS = {
    "model": _MODEL_KEYS,
    "train_input": _TRAIN_INPUT_KEYS,
    "optimizer": _OPTIMIZER_KEYS,
    "runconfig": _RUNCONFIG_KEYS,
    "sparsity": _SPARSITY_KEYS,
}
IGNORED_SECTIONS = ("eval_input",)
"""Model Zoo sections that say nothing of a training step's model or numbers."""
IGNORED_KEYS = {
    "train_input": ("data_processor", "data_dir", "shuffle", "shuffle_seed", "shuffle_buffer",
                    "repeat", "num_workers", "prefetch_factor", "persistent_workers",
                    "use_worker_cache", "drop_last", "n_parallel_reads"),
    "model": ("mixed_precision", "fp16_type", "boundary_casting", "tf_summary", "loss_scaling",
              "embedding_initializer", "initializer", "output_layer_initializer",
              "initializer_range"),
    "optimizer": ("loss_scaling_factor", "initial_loss_scale", "steps_per_increase",
                  "min_loss_scale", "max_loss_scale", "log_summaries",
                  "disable_lr_steps_reset"),
    "runconfig": ("max_steps", "num_steps", "num_epochs", "log_steps", "checkpoint_steps",
                  "save_initial_checkpoint", "seed", "eval_frequency", "eval_steps",
                  "num_wgt_servers", "num_workers_per_csx", "mode", "model_dir",
                  "checkpoint_path", "precision_opt_level", "use_cs_grad_accum", "save_losses",
                  "log_input_summaries", "compile_only", "validate_only", "target_device"),
}  # fmt: skip
"""Model Zoo housekeeping keys, by section: where the data comes from, how a run logs and
checkpoints, how its loss is scaled and its weights are first drawn. cgc reads none of them
(its data, steps, checkpoints and ``--init-seed`` are the command's) and names them in one
warning; any other key it does not know is an error."""


@dataclass(frozen=True)
class _Range:
    """The floats a key accepts, and how a message describes them."""

    description: str
    accepts: Callable[[float], bool]


_POSITIVE = _Range("a positive number", lambda x: x > 0)
_NON_NEGATIVE = _Range("a non-negative number", lambda x: x >= 0)
_FRACTION = _Range("a number in [0, 1)", lambda x: 0 <= x < 1)
_DENSITY = _Range("a number in (0, 1]", lambda x: 0 < x <= 1)
_DROP_FRACTION = _Range("a number in (0, 1)", lambda x: 0 < x < 1)

# YAML 1.1 (PyYAML) reads 6e-4 as a string: its floats need a decimal point.
_FLOAT_WITHOUT_POINT = re.compile(r"^([-+]?[0-9]+)[eE]([-+]?[0-9]+)$")


_BRIEF = reprlib.Repr()
"""Spells values in messages within a line: YAML aliases can nest a list of a billion items
in a few lines, and a number can have thousands of digits."""
_BRIEF.maxlevel, _BRIEF.maxlist = 2, 4


def _show(value: object) -> str:
    """A value as a message shows it: YAML's spelling for scalars, strings marked as such,
    long ones abbreviated."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the string {_BRIEF.repr(value)}"
    if isinstance(value, dict):
        return "a mapping"
    return _BRIEF.repr(value)


def _as_float(value: object) -> float | None:
    """A YAML number as a float (an integer beyond the floats is infinite); ``None`` for
    anything else, ``true`` included."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


class _Section:
    """One mapping of a params file, read key by key; its errors name the key's path."""

    def __init__(self, source: str, path: str, value: object, known: Sequence[str]):
        self.source = source
        self.path = path
        if not isinstance(value, dict):
            raise CgcError(f"{source}: {path}: expected a mapping, got {_show(value)}")
        for key in value:
            if key not in known:
                hint = _did_you_mean(key, known) if isinstance(key, str) else ""
                raise self.error(str(key), f"unknown key{hint}")
        self.values: dict[str, object] = value

    def error(self, key: str, message: str) -> CgcError:
        """The error for ``key`` of this section."""
        return CgcError(f"{self.source}: {self.path}.{key}: {message}")

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def _get(self, key: str) -> object:
        if key not in self.values:
            raise CgcError(f"{self.source}: {self.path}: missing required key {key}")
        return self.values[key]

    def integer(self, key: str, default: int | None = None) -> int:
        """A positive integer up to its ``INTEGER_LIMITS``; required when ``default`` is
        ``None``."""
        value = self._get(key) if default is None or key in self else default
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.error(key, f"expected a positive integer, got {_show(value)}")
        limit = INTEGER_LIMITS[f"{self.path}.{key}"]
        if value > limit.most:
            raise self.error(key, f"{_show(value)} exceeds the limit {limit.most} ({limit.reason})")
        return value

    def number(self, key: str, default: float, accepted: _Range) -> float:
        """A finite float (an integer will do) that ``accepted`` accepts."""
        return self.check_number(key, self.values.get(key, default), accepted)

    def check_number(self, key: str, value: object, accepted: _Range) -> float:
        """``value``, read at ``key``, as a float that ``accepted`` accepts."""
        number = _as_float(value)
        if number is None or not math.isfinite(number) or not accepted.accepts(number):
            message = f"expected {accepted.description}, got {_show(value)}"
            match = _FLOAT_WITHOUT_POINT.match(value) if isinstance(value, str) else None
            if match:
                message += f" (YAML needs a decimal point: write {match[1]}.0e{match[2]})"
            raise self.error(key, message)
        return number

    def boolean(self, key: str, default: bool) -> bool:
        """``true`` or ``false``."""
        value = self.values.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {_show(value)}")
        return value

    def choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        """One of ``choices``, read case-insensitively."""
        value = self.values.get(key, default)
        if not isinstance(value, str) or value.lower() not in choices:
            raise self.error(key, f"expected one of {', '.join(choices)}, got {_show(value)}")
        return value.lower()

    def section(self, key: str, known: Sequence[str]) -> _Section:
        """The mapping at ``key`` (empty when absent)."""
        return _Section(self.source, f"{self.path}.{key}", self.values.get(key, {}), known)


def _read_model(section: _Section, max_sequence_length: int) -> ModelConfig:
    hidden_size = section.integer("hidden_size")
    num_heads = section.integer("num_heads")
    if hidden_size % num_heads:
        raise section.error("num_heads", f"{num_heads} does not divide hidden_size {hidden_size}")
    num_kv_heads = _read_kv_heads(section, num_heads)
    position_embedding_type = section.choice(
        "position_embedding_type", "learned", POSITION_EMBEDDING_TYPES
    )
    parallel_attention = section.boolean("parallel_attention", False)
    use_untied_layer_norm = section.boolean("use_untied_layer_norm", False)
    if use_untied_layer_norm and not parallel_attention:
        raise section.error("use_untied_layer_norm", "only with parallel_attention: true")
    return ModelConfig(
        hidden_size=hidden_size,
        num_hidden_layers=section.integer("num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        filter_size=section.integer("filter_size", 4 * hidden_size),
        vocab_size=section.integer("vocab_size"),
        max_position_embeddings=_read_max_positions(
            section, position_embedding_type, max_sequence_length
        ),
        position_embedding_type=position_embedding_type,
        rotary_dim=_read_rotary_dim(section, position_embedding_type, hidden_size // num_heads),
        norm_type=section.choice("norm_type", "layernorm", NORM_TYPES),
        layer_norm_epsilon=section.number("layer_norm_epsilon", 1e-5, _POSITIVE),
        nonlinearity=section.choice("nonlinearity", "gelu", NONLINEARITIES),
        share_embedding_weights=section.boolean("share_embedding_weights", True),
        use_bias=_read_use_bias(section),
        use_bias_in_output=section.boolean("use_bias_in_output", False),
        parallel_attention=parallel_attention,
        use_untied_layer_norm=use_untied_layer_norm,
        embedding_dropout_rate=section.number("embedding_dropout_rate", 0.0, _FRACTION),
        attention_dropout_rate=section.number("attention_dropout_rate", 0.0, _FRACTION),
        dropout_rate=section.number("dropout_rate", 0.0, _FRACTION),
    )


def _read_kv_heads(section: _Section, num_heads: int) -> int:
    attention = section.section("extra_attention_params", _EXTRA_ATTENTION_KEYS)
    num_kv_heads = attention.integer("num_kv_groups", num_heads)
    if num_heads % num_kv_heads:
        raise attention.error(
            "num_kv_groups", f"{num_kv_heads} does not divide num_heads {num_heads}"
        )
    return num_kv_heads


def _read_max_positions(section: _Section, position_type: str, max_sequence_length: int) -> int:
    max_positions = section.integer("max_position_embeddings", max_sequence_length)
    if position_type == "learned" and max_sequence_length > max_positions:
        raise section.error(
            "max_position_embeddings",
            f"{max_positions} is less than train_input.max_sequence_length "
            f"{max_sequence_length} (learned positions)",
        )
    return max_positions


def _read_rotary_dim(section: _Section, position_type: str, head_dim: int) -> int:
    if position_type == "learned":
        if "rotary_dim" in section:
            raise section.error("rotary_dim", "only with position_embedding_type: rotary")
        return 0
    rotary_dim = section.integer("rotary_dim", head_dim)
    if rotary_dim % 2:
        raise section.error("rotary_dim", f"expected an even number, got {rotary_dim}")
    if rotary_dim > head_dim:
        raise section.error(
            "rotary_dim",
            f"{rotary_dim} exceeds the head dimension {head_dim} (hidden_size / num_heads)",
        )
    return rotary_dim


def _read_use_bias(section: _Section) -> bool:
    """``use_bias``, or the Model Zoo's finer bias switches, which must then all agree."""
    given = [
        (key, section.boolean(key, True)) for key in ("use_bias", *_ZOO_BIAS_KEYS) if key in section
    ]
    if not given:
        return True
    first_key, first_value = given[0]
    for key, value in given[1:]:
        if value != first_value:
            raise section.error(
                key,
                f"{_show(value)} disagrees with {first_key}: {_show(first_value)} "
                "(cgc has one switch for the attention and MLP biases)",
            )
    return first_value


def _read_sparsity(section: _Section) -> SparsityConfig:
    schedule = section.choice("schedule", "static", SCHEDULES)
    dynamic: dict[str, Any] = {}
    for key in DYNAMIC:
        if key not in section:
            continue
        if schedule != "dynamic":
            raise section.error(key, "needs schedule: dynamic")
        value = section.values[key]
        if key in ("update_every", "end_step"):  # steps: no limit, they cost no compiling
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise section.error(key, f"expected a positive integer, got {_show(value)}")
            dynamic[key] = value
        elif key == "drop_fraction":
            dynamic[key] = section.number(key, 0.0, _DROP_FRACTION)
        else:
            dynamic[key] = section.choice(key, "", REGROWS if key == "regrow" else DECAYS)
    if dynamic.get("decay") == "cosine" and "end_step" not in dynamic:
        raise section.error("decay", "cosine needs end_step")
    patterns = section.values.get("param_name_patterns", [])
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise section.error(
            "param_name_patterns", f"expected a list of regular expressions, got {_show(patterns)}"
        )
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as e:
            raise section.error("param_name_patterns", f"{pattern!r}: {e}") from None
    return SparsityConfig(
        density=section.check_number("density", section._get("density"), _DENSITY),
        param_name_patterns=tuple(patterns),
        init=section.choice("init", "random", CHOSEN_INITS),
        schedule=schedule,
        dynamic=tuple(dynamic.items()),
    )


def _read_train_input(section: _Section) -> TrainInput:
    return TrainInput(
        batch_size=section.integer("batch_size"),
        max_sequence_length=section.integer("max_sequence_length"),
    )


def _read_optimizer(section: _Section) -> OptimizerConfig:
    optimizer_type = section.choice("optimizer_type", "adamw", OPTIMIZER_TYPES)
    wrong_keys = ("momentum",) if optimizer_type != "sgd" else _ADAM_KEYS
    for key in wrong_keys:
        if key in section:
            raise section.error(key, f"not an option of {optimizer_type}")
    return OptimizerConfig(
        optimizer_type=optimizer_type,
        learning_rate=section.number("learning_rate", 1e-3, _POSITIVE),
        betas=_read_betas(section),
        eps=section.number("eps", 1e-8, _POSITIVE),
        weight_decay=_read_weight_decay(section, optimizer_type),
        momentum=section.number("momentum", 0.0, _FRACTION),
        max_gradient_norm=_read_max_gradient_norm(section),
    )


def _read_betas(section: _Section) -> tuple[float, float]:
    if "betas" not in section:
        return (
            section.number("beta1", 0.9, _FRACTION),
            section.number("beta2", 0.999, _FRACTION),
        )
    for key in ("beta1", "beta2"):
        if key in section:
            raise section.error(key, "give either betas or beta1 and beta2, not both")
    betas = section.values["betas"]
    if not isinstance(betas, list) or len(betas) != 2:
        raise section.error("betas", f"expected a list of two numbers, got {_show(betas)}")
    beta1, beta2 = (section.check_number("betas", beta, _FRACTION) for beta in betas)
    return beta1, beta2


def _read_weight_decay(section: _Section, optimizer_type: str) -> float:
    if "weight_decay" in section and "weight_decay_rate" in section:
        raise section.error("weight_decay_rate", "give either weight_decay or it, not both")
    key = "weight_decay_rate" if "weight_decay_rate" in section else "weight_decay"
    return section.number(key, 0.01 if optimizer_type == "adamw" else 0.0, _NON_NEGATIVE)


def _read_max_gradient_norm(section: _Section) -> float | None:
    value = section.values.get("max_gradient_norm")
    return None if value is None else section.check_number("max_gradient_norm", value, _POSITIVE)


def _read_runconfig(section: _Section, batch_size: int) -> RunConfig:
    num_csx = section.integer("num_csx", 1)
    if batch_size % num_csx:
        raise section.error(
            "num_csx", f"{num_csx} systems do not split train_input.batch_size {batch_size} evenly"
        )
    return RunConfig(num_csx=num_csx, precision=section.choice("precision", "float32", PRECISIONS))


_YAML_TAG = "tag:yaml.org,2002:"
"""What YAML's standard tags (``!!int``, ``!!merge``) begin with, spelled out."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, stricter: a key given twice in one mapping is an error (PyYAML
    keeps the last silently), and so is a value PyYAML cannot build."""

    def __init__(self, text: bytes, source: str):
        super().__init__(text)
        self.source = source
        self.paths: dict[int, str] = {}
        """The key path of every node met as a mapping's value, by ``id``: a mapping is
        constructed after its parent, which records its path."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """PyYAML's, but a scalar it cannot build is a YAML error at its line: an integer of
        thousands of digits (past Python's conversion limit), a 13th month, or a value unfit
        for its explicit tag (``!!bool maybe``), on which PyYAML fails with a Python error."""
        try:
            return super().construct_object(node, deep=deep)
        except ValueError as error:
            problem = str(error).split(";")[0]  # what follows ";" is advice to programmers
        except (AttributeError, IndexError, KeyError, TypeError):
            problem = f"not a valid {node.tag.replace(_YAML_TAG, '!!')}"
        raise yaml.constructor.ConstructorError(problem=problem, problem_mark=node.start_mark)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        """PyYAML's, after checking that the node is a mapping (``!!map [1]`` is not) and that
        no key comes twice (merged keys ``<<`` may)."""
        if not isinstance(node, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(
                problem=f"expected a mapping, found a {node.id}", problem_mark=node.start_mark
            )
        path = self.paths.get(id(node))
        lines: dict[Hashable, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _YAML_TAG + "merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # PyYAML's own check reports it
            key_path = f"{path}.{key}" if path else str(key)
            line = key_node.start_mark.line + 1
            if key in lines:
                raise CgcError(
                    f"{self.source}: {key_path}: given twice, on lines {lines[key]} and {line}"
                )
            lines[key] = line
            self.paths.setdefault(id(value_node), key_path)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(text: bytes, source: str) -> object:
    """The YAML document ``text``; any problem is a one-line error naming ``source``."""
    try:
        loader = _Loader(text, source)  # which decodes and checks the first part of the text
    except yaml.reader.ReaderError as error:
        raise _unreadable(error, source) from None
    try:
        return loader.get_single_data()
    except yaml.reader.ReaderError as error:
        raise _unreadable(error, source) from None
    except yaml.MarkedYAMLError as error:
        line = f"line {error.problem_mark.line + 1}: " if error.problem_mark else ""
        raise CgcError(f"{source}: {line}not valid YAML ({error.problem})") from None
    except yaml.YAMLError as error:
        reason = str(error).splitlines()[0]
        raise CgcError(f"{source}: not valid YAML ({reason})") from None
    except RecursionError:
        raise CgcError(f"{source}: not valid YAML (nested too deeply)") from None
    finally:
        loader.dispose()


def _unreadable(error: yaml.reader.ReaderError, source: str) -> CgcError:
    """PyYAML's complaint about a byte that is not UTF-8 or a character YAML does not allow
    (a control character), as one line naming ``source`` and where it is (0-based)."""
    if error.encoding != "unicode":  # a byte that does not decode
        return CgcError(
            f"{source}: not valid {error.encoding.upper()} text (byte {error.position} is "
            f"{error.character:#04x})"
        )
    return CgcError(
        f"{source}: not valid YAML (character {error.position} is U+{error.character:04X}, "
        "which YAML does not allow)"
    )


def _without_housekeeping(document: dict, source: str) -> dict:
    """``document`` without the Model Zoo's housekeeping (``IGNORED_SECTIONS``,
    ``IGNORED_KEYS``), which one ``CgcWarning`` lists; every section or key it does not know
    is one error that lists them all."""
    unknown, ignored = [], []
    kept: dict = {}
    for key, value in document.items():
        if key in IGNORED_SECTIONS:
            ignored.append(str(key))
        elif key not in _SECTIONS:
            hint = _did_you_mean(key, _SECTIONS) if isinstance(key, str) else ""
            unknown.append(f"{key} (a section{hint.replace(' (', '; ').rstrip(')')})")
        elif isinstance(value, dict):
            skipped = IGNORED_KEYS.get(key, ())
            for inner in value:
                if inner in skipped:
                    ignored.append(f"{key}.{inner}")
                elif inner not in _KNOWN_KEYS[key]:
                    hint = _did_you_mean(inner, _KNOWN_KEYS[key]) if isinstance(inner, str) else ""
                    unknown.append(f"{key}.{inner}{hint}")
            kept[key] = {k: v for k, v in value.items() if k not in skipped}
        else:
            kept[key] = value
    if unknown:
        count = f"{len(unknown)} unknown keys" if len(unknown) > 1 else "unknown key"
        raise CgcError(f"{source}: {count}: {', '.join(unknown)}")
    if ignored:
        warnings.warn(
            f"{source}: ignoring the Model Zoo's housekeeping: {', '.join(ignored)}",
            CgcWarning,
            stacklevel=2,
        )
    return kept


def _parse(text: bytes, name: str, source: str) -> ModelParams:
    """Reads and checks the YAML ``text`` of a params file."""
    document = _load_yaml(text, source)
    if not isinstance(document, dict):
        raise CgcError(
            f"{source}: expected a mapping of sections ({', '.join(_SECTIONS)}) at the top "
            f"level, got {'an empty file' if document is None else _show(document)}"
        )
    document = _without_housekeeping(document, source)
    for key in _REQUIRED_SECTIONS:
        if key not in document:
            raise CgcError(f"{source}: missing required section {key}")

    def section(key: str, known: Sequence[str]) -> _Section:
        return _Section(source, key, document.get(key, {}), known)

    train_input = _read_train_input(section("train_input", _TRAIN_INPUT_KEYS))
    return ModelParams(
        name=name,
        source=source,
        model=_read_model(section("model", _MODEL_KEYS), train_input.max_sequence_length),
        train_input=train_input,
        optimizer=_read_optimizer(section("optimizer", _OPTIMIZER_KEYS)),
        runconfig=_read_runconfig(section("runconfig", _RUNCONFIG_KEYS), train_input.batch_size),
        sparsity=(
            _read_sparsity(section("sparsity", _SPARSITY_KEYS)) if "sparsity" in document else None
        ),
    )


def _zoo_directory() -> Traversable:
    return resources.files("cgc.frontends").joinpath("configs")


def zoo_names() -> list[str]:
    """The names of the built-in params files, sorted."""
    suffix = PARAMS_SUFFIXES[0]
    return sorted(
        entry.name.removesuffix(suffix)
        for entry in _zoo_directory().iterdir()
        if entry.name.endswith(suffix)
    )


def is_params_source(spec: str | os.PathLike[str]) -> bool:
    """Whether a command-line MODEL names a params file (``.yaml``/``.yml``) or ``zoo:NAME``."""
    text = os.fspath(spec)
    return text.startswith(ZOO_PREFIX) or Path(text).suffix.lower() in PARAMS_SUFFIXES


def load_params(spec: str | os.PathLike[str]) -> ModelParams:
    """Reads and checks ``zoo:NAME`` or the params file at the path ``spec``."""
    text = os.fspath(spec)
    if text.startswith(ZOO_PREFIX):
        name = text.removeprefix(ZOO_PREFIX)
        names = zoo_names()
        if name not in names:
            raise CgcError(f"{text}: no built-in model of that name (known: {', '.join(names)})")
        data = _zoo_directory().joinpath(name + PARAMS_SUFFIXES[0]).read_bytes()
        return _parse(data, name, text)
    path = Path(text)
    if path.suffix.lower() not in PARAMS_SUFFIXES:
        raise CgcError(f"{path.name}: not a params file (expected a .yaml or .yml file)")
    kind = special_kind(path)
    if kind is not None:
        raise CgcError(f"{path}: is {kind}, not a params file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CgcError(f"{path.name}: no such file") from None
    except OSError as error:
        raise CgcError(f"{path.name}: cannot read ({error.strerror})") from None
    return _parse(data, path.stem, path.name)


def parameter_count(model: ModelConfig) -> int:
    """The number of trainable parameters of ``model``, exactly, counted as the standard
    implementations (Hugging Face's GPT-2, GPT-J, GPT-NeoX and Llama) define them:

    * the token embedding, ``vocab_size * hidden_size``, and for learned positions the
      position table, ``max_position_embeddings * hidden_size`` (rotary has no parameters);
    * per block: each norm's weight (``hidden_size``) and, for layernorm, its bias; two norms
      per block, or one when ``parallel_attention`` shares it (``use_untied_layer_norm``
      false); the q and output projections (``hidden_size**2`` each), the k and v projections
      (``hidden_size * num_kv_heads * head_dim`` each); the MLP's two matrices, or three for
      swiglu (``hidden_size * filter_size`` each); with ``use_bias``, a bias on each of these
      projections (the output width of each);
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
    if model.use_bias:
        attention += 2 * d + 2 * kv_width
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
