"""A params file's sections read key by key, each value checked, each error naming its key.

``Section`` reads one mapping's integers, numbers, switches and choices strictly (``true`` is not
an integer, ``1.5`` is not an integer, an integer is an acceptable float); the ``read_*``
functions build each section's record and check the keys against each other.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cgc.errors import CgcError
from cgc.frontends.params.keys import (
    ADAM_KEYS,
    EXTRA_ATTENTION_KEYS,
    LLAMA3_SCALING_KEYS,
    ZOO_BIAS_KEYS,
    did_you_mean,
)
from cgc.frontends.params.records import (
    INTEGER_LIMITS,
    NONLINEARITIES,
    NORM_TYPES,
    OPTIMIZER_TYPES,
    POSITION_EMBEDDING_TYPES,
    POSITION_SCALING_TYPES,
    PRECISIONS,
    ModelConfig,
    OptimizerConfig,
    RotaryScaling,
    RunConfig,
    SparsityConfig,
    TrainInput,
)
from cgc.machine.sparse.sparsity import CHOSEN_INITS, DECAYS, DYNAMIC, REGROWS, SCHEDULES


@dataclass(frozen=True)
class _Range:
    """The floats a key accepts, and how a message describes them."""

    description: str
    accepts: Callable[[float], bool]


_POSITIVE = _Range("a positive number", lambda x: x > 0)
_ABOVE_ONE = _Range("a number above 1", lambda x: x > 1)
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


def show(value: object) -> str:
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


class Section:
    """One mapping of a params file, read key by key; its errors name the key's path."""

    def __init__(self, source: str, path: str, value: object, known: Sequence[str]):
        self.source = source
        self.path = path
        if not isinstance(value, dict):
            raise CgcError(f"{source}: {path}: expected a mapping, got {show(value)}")
        for key in value:
            if key not in known:
                hint = did_you_mean(key, known) if isinstance(key, str) else ""
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
            raise self.error(key, f"expected a positive integer, got {show(value)}")
        limit = INTEGER_LIMITS[f"{self.path}.{key}"]
        if value > limit.most:
            raise self.error(key, f"{show(value)} exceeds the limit {limit.most} ({limit.reason})")
        return value

    def number(self, key: str, default: float, accepted: _Range) -> float:
        """A finite float (an integer will do) that ``accepted`` accepts."""
        return self.check_number(key, self.values.get(key, default), accepted)

    def check_number(self, key: str, value: object, accepted: _Range) -> float:
        """``value``, read at ``key``, as a float that ``accepted`` accepts."""
        number = _as_float(value)
        if number is None or not math.isfinite(number) or not accepted.accepts(number):
            message = f"expected {accepted.description}, got {show(value)}"
            match = _FLOAT_WITHOUT_POINT.match(value) if isinstance(value, str) else None
            if match:
                message += f" (YAML needs a decimal point: write {match[1]}.0e{match[2]})"
            raise self.error(key, message)
        return number

    def boolean(self, key: str, default: bool) -> bool:
        """``true`` or ``false``."""
        value = self.values.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {show(value)}")
        return value

    def choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        """One of ``choices``, read case-insensitively."""
        value = self.values.get(key, default)
        if not isinstance(value, str) or value.lower() not in choices:
            raise self.error(key, f"expected one of {', '.join(choices)}, got {show(value)}")
        return value.lower()

    def section(self, key: str, known: Sequence[str]) -> Section:
        """The mapping at ``key`` (empty when absent)."""
        return Section(self.source, f"{self.path}.{key}", self.values.get(key, {}), known)


def read_model(section: Section, max_sequence_length: int) -> ModelConfig:
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
    attention_qkv_bias, attention_output_bias, mlp_bias = _read_biases(section)
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
        use_projection_bias_in_attention=attention_qkv_bias,
        use_ffn_bias_in_attention=attention_output_bias,
        use_ffn_bias=mlp_bias,
        use_bias_in_output=section.boolean("use_bias_in_output", False),
        parallel_attention=parallel_attention,
        use_untied_layer_norm=use_untied_layer_norm,
        embedding_dropout_rate=section.number("embedding_dropout_rate", 0.0, _FRACTION),
        attention_dropout_rate=section.number("attention_dropout_rate", 0.0, _FRACTION),
        dropout_rate=section.number("dropout_rate", 0.0, _FRACTION),
        rope_theta=_read_rope_theta(section, position_embedding_type),
        rotary_scaling=_read_rotary_scaling(section, position_embedding_type),
        attention_sliding_window_length=_read_window(section),
    )


def _read_window(section: Section) -> int | None:
    """The Model Zoo's ``attention_sliding_window_length``, which it writes ``null`` when
    attention sees every token up to its own."""
    key = "attention_sliding_window_length"
    return None if section.values.get(key) is None else section.integer(key)


def _read_kv_heads(section: Section, num_heads: int) -> int:
    attention = section.section("extra_attention_params", EXTRA_ATTENTION_KEYS)
    num_kv_heads = attention.integer("num_kv_groups", num_heads)
    if num_heads % num_kv_heads:
        raise attention.error(
            "num_kv_groups", f"{num_kv_heads} does not divide num_heads {num_heads}"
        )
    return num_kv_heads


def _read_max_positions(section: Section, position_type: str, max_sequence_length: int) -> int:
    max_positions = section.integer("max_position_embeddings", max_sequence_length)
    if position_type == "learned" and max_sequence_length > max_positions:
        raise section.error(
            "max_position_embeddings",
            f"{max_positions} is less than train_input.max_sequence_length "
            f"{max_sequence_length} (learned positions)",
        )
    return max_positions


def _read_rotary_dim(section: Section, position_type: str, head_dim: int) -> int:
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


def _only_with_rotary(section: Section, position_type: str, keys: Sequence[str]) -> bool:
    """Whether the rotary settings ``keys`` apply; an error if one is given for learned
    positions."""
    if position_type == "rotary":
        return True
    for key in keys:
        if key in section:
            raise section.error(key, "only with position_embedding_type: rotary")
    return False


def _read_rope_theta(section: Section, position_type: str) -> float:
    if not _only_with_rotary(section, position_type, ("rope_theta",)):
        return 10000.0
    return section.number("rope_theta", 10000.0, _POSITIVE)


_SCALING_KEYS = ("pos_scaling_type", "pos_scaling_factor", "pos_scaling_extra_args")


def _read_rotary_scaling(section: Section, position_type: str) -> RotaryScaling | None:
    """The Model Zoo's ``pos_scaling_*`` keys; ``None`` when the frequencies stay as they are
    (no key, or linear scaling by 1)."""
    if not _only_with_rotary(section, position_type, _SCALING_KEYS):
        return None
    scaling_type = section.choice("pos_scaling_type", "linear", POSITION_SCALING_TYPES)
    if scaling_type == "linear":
        if "pos_scaling_extra_args" in section:
            raise section.error("pos_scaling_extra_args", "only with pos_scaling_type: llama3")
        factor = section.number("pos_scaling_factor", 1.0, _POSITIVE)
        return None if factor == 1.0 else RotaryScaling("linear", factor)
    factor = section.check_number(
        "pos_scaling_factor", section._get("pos_scaling_factor"), _ABOVE_ONE
    )
    extra = section.section("pos_scaling_extra_args", LLAMA3_SCALING_KEYS)
    low, high = (extra.check_number(key, extra._get(key), _POSITIVE)
                 for key in LLAMA3_SCALING_KEYS[:2])  # fmt: skip
    if high <= low:
        raise extra.error("high_freq_factor", f"{high:g} is not above low_freq_factor {low:g}")
    original = extra.integer("original_max_position_embeddings")
    return RotaryScaling("llama3", factor, low, high, original)


def _read_biases(section: Section) -> tuple[bool, bool, bool]:
    """The q/k/v, attention output and MLP biases: the Model Zoo's
    ``use_projection_bias_in_attention``, ``use_ffn_bias_in_attention`` and ``use_ffn_bias``,
    each true by default, or ``use_bias`` for all three at once (a finer key given with it
    must agree)."""
    if "use_bias" not in section:
        qkv, output, mlp = (section.boolean(key, True) for key in ZOO_BIAS_KEYS)
        return qkv, output, mlp
    every = section.boolean("use_bias", True)
    for key in ZOO_BIAS_KEYS:
        if key in section and section.boolean(key, every) != every:
            raise section.error(
                key,
                f"{show(not every)} disagrees with use_bias: {show(every)} "
                "(use_bias sets all three biases; give the finer keys alone)",
            )
    return every, every, every


def read_sparsity(section: Section) -> SparsityConfig:
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
                raise section.error(key, f"expected a positive integer, got {show(value)}")
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
            "param_name_patterns", f"expected a list of regular expressions, got {show(patterns)}"
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


def read_train_input(section: Section) -> TrainInput:
    return TrainInput(
        batch_size=section.integer("batch_size"),
        max_sequence_length=section.integer("max_sequence_length"),
    )


def read_optimizer(section: Section) -> OptimizerConfig:
    optimizer_type = section.choice("optimizer_type", "adamw", OPTIMIZER_TYPES)
    wrong_keys = ("momentum",) if optimizer_type != "sgd" else ADAM_KEYS
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


def _read_betas(section: Section) -> tuple[float, float]:
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
        raise section.error("betas", f"expected a list of two numbers, got {show(betas)}")
    beta1, beta2 = (section.check_number("betas", beta, _FRACTION) for beta in betas)
    return beta1, beta2


def _read_weight_decay(section: Section, optimizer_type: str) -> float:
    if "weight_decay" in section and "weight_decay_rate" in section:
        raise section.error("weight_decay_rate", "give either weight_decay or it, not both")
    key = "weight_decay_rate" if "weight_decay_rate" in section else "weight_decay"
    return section.number(key, 0.01 if optimizer_type == "adamw" else 0.0, _NON_NEGATIVE)


def _read_max_gradient_norm(section: Section) -> float | None:
    value = section.values.get("max_gradient_norm")
    return None if value is None else section.check_number("max_gradient_norm", value, _POSITIVE)


def read_runconfig(section: Section, batch_size: int) -> RunConfig:
    num_csx = section.integer("num_csx", 1)
    if batch_size % num_csx:
        raise section.error(
            "num_csx", f"{num_csx} systems do not split train_input.batch_size {batch_size} evenly"
        )
    return RunConfig(num_csx=num_csx, precision=section.choice("precision", "float32", PRECISIONS))
