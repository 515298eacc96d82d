"""Params files: the built-in models, reading and defaults, the closed-form parameter count,
and every check with its one-line message."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from cgc.cli import main
from cgc.errors import CgcError, CgcWarning
from cgc.frontends.params import (
    INTEGER_LIMITS,
    ModelConfig,
    ModelParams,
    OptimizerConfig,
    RunConfig,
    TrainInput,
    is_params_source,
    load_params,
    parameter_count,
    zoo_names,
)
from cgc.frontends.params.keys import ZOO_BIAS_KEYS

ZOO = [
    "cerebras-gpt-1.3b",
    "cerebras-gpt-111m",
    "cerebras-gpt-13b",
    "cerebras-gpt-2.7b",
    "cerebras-gpt-256m",
    "cerebras-gpt-590m",
    "cerebras-gpt-6.7b",
    "gpt-neox-20b",
    "gpt3-175b",
    "gptj-6b",
    "llama-3.1-405b",
    "llama-3.1-70b",
    "llama-3.1-8b",
    "llama-70b",
    "llama-7b",
    "qwen2-72b",
]

# The size each name gives, and how close the count must come to it.
NAMED_SIZES = {
    "cerebras-gpt-111m": (111e6, 0.03),
    "cerebras-gpt-256m": (256e6, 0.03),
    "cerebras-gpt-590m": (590e6, 0.03),
    "cerebras-gpt-1.3b": (1.3e9, 0.03),
    "cerebras-gpt-2.7b": (2.7e9, 0.03),
    "cerebras-gpt-6.7b": (6.7e9, 0.03),
    "cerebras-gpt-13b": (13e9, 0.03),
    "gptj-6b": (6e9, 0.03),
    "gpt-neox-20b": (20e9, 0.03),
    # Llama 2 "7B" has 6.74B parameters: 3.7 % below its name, so the published 6.74B.
    "llama-7b": (6.74e9, 0.03),
    "llama-70b": (68.98e9, 0.01),
    "gpt3-175b": (174.6e9, 0.01),
    "llama-3.1-8b": (8.03e9, 0.01),
    "llama-3.1-70b": (70.6e9, 0.01),
    "llama-3.1-405b": (405.9e9, 0.01),
    "qwen2-72b": (72.7e9, 0.01),
}

# Exact counts the model cards and the Hugging Face implementations publish.
EXACT_COUNTS = {
    "llama-7b": 6_738_415_616,
    "llama-70b": 68_976_648_192,
    "gpt-neox-20b": 20_554_567_680,
    # Hugging Face's GPT-J has 6,050,882,784; use_bias adds its 28 blocks' four attention
    # biases (see the file's header).
    "gptj-6b": 6_050_882_784 + 28 * 4 * 4096,
    # Hugging Face's LlamaForCausalLM and Qwen2ForCausalLM of each config.json, counted with
    # num_parameters()
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "qwen2-72b": 72_706_203_648,
}

LLAMA3 = {"position_embedding_type": "rotary", "pos_scaling_type": "llama3",
          "pos_scaling_factor": 8.0}  # fmt: skip

# A valid file with every required key, as a dict to mutate and dump.
MINIMAL: dict[str, dict[str, Any]] = {
    "model": {"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 4, "vocab_size": 100},
    "train_input": {"batch_size": 8, "max_sequence_length": 16},
}


def write(tmp_path: Path, document: object, name: str = "gpt.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document) if not isinstance(document, str) else document)
    return path


def error(tmp_path: Path, document: object, name: str = "gpt.yaml") -> str:
    """The message of loading ``document``, which must fail."""
    with pytest.raises(CgcError) as raised:
        load_params(write(tmp_path, document, name))
    message = str(raised.value)
    assert "\n" not in message
    return message


def mutated(**sections: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """MINIMAL with some keys set (``None`` deletes one), section by section."""
    document = copy.deepcopy(MINIMAL)
    for section, changes in sections.items():
        values = document.setdefault(section, {})
        for key, value in changes.items():
            if value is None:
                del values[key]
            else:
                values[key] = value
    return document


# ---- the built-in models


def test_zoo_names():
    assert zoo_names() == ZOO


def test_configs_ship_as_package_data():
    directory = resources.files("cgc.frontends").joinpath("configs")
    assert sorted(entry.name for entry in directory.iterdir()) == [f"{n}.yaml" for n in ZOO]
    text = directory.joinpath("llama-70b.yaml").read_text()
    assert "num_kv_groups: 8" in text


@pytest.mark.parametrize("name", ZOO)
def test_builtin_loads(name: str):
    params = load_params(f"zoo:{name}")
    assert (params.name, params.source) == (name, f"zoo:{name}")
    size, tolerance = NAMED_SIZES[name]
    assert parameter_count(params.model) == pytest.approx(size, rel=tolerance)
    if name in EXACT_COUNTS:
        assert parameter_count(params.model) == EXACT_COUNTS[name]
    assert params.train_input.batch_size % params.runconfig.num_csx == 0


def test_builtin_details():
    llama = load_params("zoo:llama-70b").model
    assert (llama.num_heads, llama.num_kv_heads, llama.head_dim) == (64, 8, 128)
    assert (llama.norm_type, llama.nonlinearity, llama.rotary_dim) == ("rmsnorm", "swiglu", 128)
    neox = load_params("zoo:gpt-neox-20b").model
    assert (neox.rotary_dim, neox.parallel_attention, neox.use_untied_layer_norm) == (
        24,
        True,
        True,
    )
    gptj = load_params("zoo:gptj-6b").model
    assert (gptj.rotary_dim, gptj.use_untied_layer_norm, gptj.use_bias_in_output) == (
        64,
        False,
        True,
    )
    gpt3 = load_params("zoo:gpt3-175b")
    assert gpt3.optimizer == OptimizerConfig("adamw", 6e-5, (0.9, 0.95), 1e-8, 0.1, 0.0, 1.0)
    assert gpt3.runconfig == RunConfig(num_csx=16, precision="float16")
    small = load_params("zoo:cerebras-gpt-111m").model
    assert small.share_embedding_weights and small.position_embedding_type == "learned"
    assert small.rotary_dim == 0


def test_unknown_zoo_name_lists_the_known_ones():
    with pytest.raises(CgcError) as raised:
        load_params("zoo:gpt5")
    assert str(raised.value) == (
        f"zoo:gpt5: no built-in model of that name (known: {', '.join(ZOO)})"
    )


def as_yaml_text(params: ModelParams) -> str:
    """``params`` written back in params-file keys."""
    model = dataclasses.asdict(params.model)
    model["extra_attention_params"] = {"num_kv_groups": model.pop("num_kv_heads")}
    optimizer = dataclasses.asdict(params.optimizer)
    optimizer["betas"] = list(optimizer["betas"])
    if optimizer["optimizer_type"] == "sgd":
        del optimizer["betas"], optimizer["eps"]
    else:
        del optimizer["momentum"]
    if model["position_embedding_type"] == "learned":
        del model["rotary_dim"], model["rope_theta"]
    scaling = model.pop("rotary_scaling")
    if scaling is not None:
        model["pos_scaling_type"] = scaling.pop("type")
        model["pos_scaling_factor"] = scaling.pop("factor")
        if model["pos_scaling_type"] == "llama3":
            model["pos_scaling_extra_args"] = scaling
    document = {
        "model": model,
        "train_input": dataclasses.asdict(params.train_input),
        "optimizer": optimizer,
        "runconfig": dataclasses.asdict(params.runconfig),
    }
    return yaml.safe_dump(document)


@pytest.mark.parametrize("name", ZOO)
def test_round_trip(tmp_path: Path, name: str):
    params = load_params(f"zoo:{name}")
    again = load_params(write(tmp_path, as_yaml_text(params), f"{name}.yaml"))
    assert again == dataclasses.replace(params, source=f"{name}.yaml")


def test_round_trip_of_written_text(tmp_path: Path):
    text = """\
model:
  hidden_size: 128
  num_hidden_layers: 3
  num_heads: 8
  extra_attention_params: {num_kv_groups: 2}
  filter_size: 344
  vocab_size: 1000
  position_embedding_type: Rotary
  rotary_dim: 8
  norm_type: RMSNorm
  nonlinearity: swiglu
  share_embedding_weights: false
  use_projection_bias_in_attention: false
  use_ffn_bias_in_attention: false
  use_ffn_bias: false
train_input: {batch_size: 32, max_sequence_length: 64}
optimizer:
  optimizer_type: SGD
  learning_rate: 0.05
  momentum: 0.9
  weight_decay_rate: 1.0e-4
runconfig: {num_csx: 4, precision: bfloat16}
"""
    params = load_params(write(tmp_path, text, "small.yml"))
    assert params == ModelParams(
        name="small",
        source="small.yml",
        model=ModelConfig(
            hidden_size=128,
            num_hidden_layers=3,
            num_heads=8,
            num_kv_heads=2,
            filter_size=344,
            vocab_size=1000,
            max_position_embeddings=64,
            position_embedding_type="rotary",
            rotary_dim=8,
            norm_type="rmsnorm",
            layer_norm_epsilon=1e-5,
            nonlinearity="swiglu",
            share_embedding_weights=False,
            use_projection_bias_in_attention=False,
            use_ffn_bias_in_attention=False,
            use_ffn_bias=False,
            use_bias_in_output=False,
            parallel_attention=False,
            use_untied_layer_norm=False,
            embedding_dropout_rate=0.0,
            attention_dropout_rate=0.0,
            dropout_rate=0.0,
        ),
        train_input=TrainInput(batch_size=32, max_sequence_length=64),
        optimizer=OptimizerConfig("sgd", 0.05, (0.9, 0.999), 1e-8, 1e-4, 0.9, None),
        runconfig=RunConfig(num_csx=4, precision="bfloat16"),
    )
    assert load_params(write(tmp_path, as_yaml_text(params), "again.yaml")).model == params.model


def test_defaults(tmp_path: Path):
    params = load_params(write(tmp_path, MINIMAL))
    model = params.model
    assert (model.num_kv_heads, model.filter_size, model.max_position_embeddings) == (4, 256, 16)
    assert (model.position_embedding_type, model.rotary_dim, model.norm_type) == (
        "learned",
        0,
        "layernorm",
    )
    assert (model.layer_norm_epsilon, model.nonlinearity) == (1e-5, "gelu")
    assert model.share_embedding_weights and not model.use_bias_in_output
    assert model.use_projection_bias_in_attention and model.use_ffn_bias_in_attention
    assert model.use_ffn_bias and model.rope_theta == 10000.0 and model.rotary_scaling is None
    assert not model.parallel_attention and not model.use_untied_layer_norm
    assert model.attention_sliding_window_length is None
    assert model.embedding_dropout_rate == model.attention_dropout_rate == model.dropout_rate == 0
    assert params.optimizer == OptimizerConfig("adamw", 1e-3, (0.9, 0.999), 1e-8, 0.01, 0.0, None)
    assert params.runconfig == RunConfig(num_csx=1, precision="float32")
    adam = load_params(write(tmp_path, mutated(optimizer={"optimizer_type": "adam"})))
    assert adam.optimizer.weight_decay == 0.0
    rotary = load_params(write(tmp_path, mutated(model={"position_embedding_type": "rotary"})))
    assert rotary.model.rotary_dim == 16


def test_spellings(tmp_path: Path):
    document = mutated(
        optimizer={"beta1": 0.8, "beta2": 0.9, "weight_decay_rate": 0.2, "max_gradient_norm": 2},
        model={"use_bias": True, "use_ffn_bias": True, "share_embedding_weights": False},
    )
    params = load_params(write(tmp_path, document))
    assert params.optimizer.betas == (0.8, 0.9)
    assert params.optimizer.weight_decay == 0.2
    assert params.optimizer.max_gradient_norm == 2.0
    assert params.model.use_ffn_bias and not params.model.share_embedding_weights
    assert load_params(write(tmp_path, mutated(optimizer={"eps": 1})))  # an int is a float


def test_is_params_source():
    assert is_params_source("zoo:llama-7b")
    assert is_params_source("gpt.yaml") and is_params_source(Path("dir/GPT.YML"))
    assert not is_params_source("model.onnx")
    assert not is_params_source("yaml")


# ---- the closed form against the parameters listed one by one


def tensor_shapes(m: ModelConfig) -> Iterator[tuple[int, ...]]:
    """Every trainable tensor of the model, as a Hugging Face-style implementation has them."""
    d, kv = m.hidden_size, m.num_kv_heads * m.head_dim
    norm: list[tuple[int, ...]] = [(d,), (d,)] if m.norm_type == "layernorm" else [(d,)]
    yield (m.vocab_size, d)
    if m.position_embedding_type == "learned":
        yield (m.max_position_embeddings, d)
    for _ in range(m.num_hidden_layers):
        shared_norm = m.parallel_attention and not m.use_untied_layer_norm
        yield from norm * (1 if shared_norm else 2)
        projections = [(d, d), (kv, d), (kv, d), (d, d)]  # q, k, v, output: (out, in)
        ups = 2 if m.nonlinearity == "swiglu" else 1
        projections += [(m.filter_size, d)] * ups + [(d, m.filter_size)]
        biases = [m.use_projection_bias_in_attention] * 3 + [m.use_ffn_bias_in_attention]
        biases += [m.use_ffn_bias] * (ups + 1)
        for (out_features, in_features), bias in zip(projections, biases, strict=True):
            yield (out_features, in_features)
            if bias:
                yield (out_features,)
    yield from norm
    if not m.share_embedding_weights:
        yield (m.vocab_size, d)
    if m.use_bias_in_output:
        yield (m.vocab_size,)


VARIANTS: list[dict[str, Any]] = [
    {},
    {"norm_type": "rmsnorm", "nonlinearity": "swiglu", **dict.fromkeys(ZOO_BIAS_KEYS, False)},
    {"nonlinearity": "swiglu", "use_ffn_bias_in_attention": False, "use_ffn_bias": False},
    {"use_projection_bias_in_attention": False, "use_ffn_bias": False},
    {"num_kv_heads": 2, "position_embedding_type": "rotary", "rotary_dim": 8},
    {"parallel_attention": True, "share_embedding_weights": False, "use_bias_in_output": True},
    {"parallel_attention": True, "use_untied_layer_norm": True, "nonlinearity": "relu"},
]


@pytest.mark.parametrize("changes", VARIANTS)
def test_parameter_count_matches_the_tensors(tmp_path: Path, changes: dict[str, Any]):
    model = dataclasses.replace(load_params(write(tmp_path, MINIMAL)).model, **changes)
    expected = sum(dims[0] * (dims[1] if len(dims) > 1 else 1) for dims in tensor_shapes(model))
    assert parameter_count(model) == expected


# ---- every check, with its message


def test_no_such_file(tmp_path: Path):
    with pytest.raises(CgcError, match=r"^gpt\.yaml: no such file$"):
        load_params(tmp_path / "gpt.yaml")


def test_not_a_params_file(tmp_path: Path):
    with pytest.raises(CgcError, match=r"^gpt\.txt: not a params file"):
        load_params(tmp_path / "gpt.txt")


def test_invalid_yaml(tmp_path: Path):
    text = "model:\n  hidden_size: 768\n num_heads: 12\n"
    assert error(tmp_path, text) == (
        "gpt.yaml: line 3: not valid YAML (expected <block end>, but found '<block mapping start>')"
    )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("", "got an empty file"),
        ("[1, 2]\n", "got [1, 2]"),
        ("just text\n", "got the string 'just text'"),
    ],
)
def test_top_level_not_a_mapping(tmp_path: Path, document: str, message: str):
    assert error(tmp_path, document) == (
        "gpt.yaml: expected a mapping of sections (model, train_input, optimizer, runconfig, "
        f"sparsity) at the top level, {message}"
    )


def test_unknown_section(tmp_path: Path):
    document = {**MINIMAL, "modle": {}}
    assert error(tmp_path, document) == (
        "gpt.yaml: unknown key: modle (a section; did you mean model?)"
    )
    document = {**MINIMAL, "data": {}}
    assert error(tmp_path, document) == "gpt.yaml: unknown key: data (a section)"


def test_every_unknown_key_at_once_and_the_zoos_housekeeping_ignored_with_a_warning(
    tmp_path: Path,
):
    document = {
        **MINIMAL,
        "model": {**MINIMAL["model"], "hiden_size": 64, "mixed_precision": True},
        "train_input": {**MINIMAL["train_input"], "data_processor": "GptHDF5DataProcessor"},
        "runconfig": {"max_steps": 10, "colour": "red"},
        "eval_input": {"batch_size": 4},
        "data": {},
    }
    assert error(tmp_path, document) == (
        "gpt.yaml: 3 unknown keys: data (a section), model.hiden_size (did you mean "
        "hidden_size?), runconfig.colour"
    )
    del document["model"]["hiden_size"], document["runconfig"]["colour"], document["data"]
    path = tmp_path / "gpt.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.warns(CgcWarning) as warned:
        params = load_params(str(path))
    assert [str(w.message) for w in warned] == [
        "gpt.yaml: ignoring the Model Zoo's housekeeping: eval_input, model.mixed_precision, "
        "runconfig.max_steps, train_input.data_processor"
    ]
    assert params.model.hidden_size == MINIMAL["model"]["hidden_size"]


def test_missing_section(tmp_path: Path):
    document = {"model": MINIMAL["model"]}
    assert error(tmp_path, document) == "gpt.yaml: missing required section train_input"


def test_section_not_a_mapping(tmp_path: Path):
    assert error(tmp_path, {**MINIMAL, "model": [1]}) == (
        "gpt.yaml: model: expected a mapping, got [1]"
    )
    assert error(tmp_path, {**MINIMAL, "optimizer": None}) == (
        "gpt.yaml: optimizer: expected a mapping, got null"
    )


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        # keys
        (
            {"model": {"hiden_size": 64}},
            "unknown key: model.hiden_size (did you mean hidden_size?)",
        ),
        ({"runconfig": {"moda": "x"}}, "unknown key: runconfig.moda"),
        (
            {"model": {"extra_attention_params": {"num_kv_group": 2}}},
            "model.extra_attention_params.num_kv_group: unknown key (did you mean num_kv_groups?)",
        ),
        (
            {"train_input": {"max_sequence_length": None}},
            "train_input: missing required key max_sequence_length",
        ),
        ({"model": {"vocab_size": None}}, "model: missing required key vocab_size"),
        # integers
        ({"model": {"hidden_size": -3}}, "model.hidden_size: expected a positive integer, got -3"),
        (
            {"model": {"num_hidden_layers": 0}},
            "model.num_hidden_layers: expected a positive integer, got 0",
        ),
        ({"model": {"num_heads": True}}, "model.num_heads: expected a positive integer, got true"),
        ({"model": {"vocab_size": 1.5}}, "model.vocab_size: expected a positive integer, got 1.5"),
        (
            {"train_input": {"batch_size": 8.0}},
            "train_input.batch_size: expected a positive integer, got 8.0",
        ),
        (
            {"train_input": {"batch_size": "8"}},
            "train_input.batch_size: expected a positive integer, got the string '8'",
        ),
        ({"model": {"filter_size": -1}}, "model.filter_size: expected a positive integer, got -1"),
        (
            {"model": {"attention_sliding_window_length": 0}},
            "model.attention_sliding_window_length: expected a positive integer, got 0",
        ),
        # shapes
        (
            {"model": {"hidden_size": 1000, "num_heads": 12}},
            "model.num_heads: 12 does not divide hidden_size 1000",
        ),
        (
            {"model": {"extra_attention_params": {"num_kv_groups": 3}}},
            "model.extra_attention_params.num_kv_groups: 3 does not divide num_heads 4",
        ),
        (
            {"model": {"position_embedding_type": "rotary", "rotary_dim": 7}},
            "model.rotary_dim: expected an even number, got 7",
        ),
        (
            {"model": {"position_embedding_type": "rotary", "rotary_dim": 32}},
            "model.rotary_dim: 32 exceeds the head dimension 16 (hidden_size / num_heads)",
        ),
        (
            {"model": {"rotary_dim": 8}},
            "model.rotary_dim: only with position_embedding_type: rotary",
        ),
        (
            {"model": {"max_position_embeddings": 8}},
            "model.max_position_embeddings: 8 is less than train_input.max_sequence_length 16 "
            "(learned positions)",
        ),
        (
            {"model": {"use_untied_layer_norm": True}},
            "model.use_untied_layer_norm: only with parallel_attention: true",
        ),
        # booleans
        (
            {"model": {"share_embedding_weights": "true"}},
            "model.share_embedding_weights: expected true or false, got the string 'true'",
        ),
        ({"model": {"use_bias": 1}}, "model.use_bias: expected true or false, got 1"),
        (
            {"model": {"use_bias": True, "use_ffn_bias": False}},
            "model.use_ffn_bias: false disagrees with use_bias: true "
            "(use_bias sets all three biases; give the finer keys alone)",
        ),
        # rotary settings
        (
            {"model": {"rope_theta": 500000.0}},
            "model.rope_theta: only with position_embedding_type: rotary",
        ),
        (
            {"model": {"position_embedding_type": "rotary", "rope_theta": 0}},
            "model.rope_theta: expected a positive number, got 0",
        ),
        (
            {"model": {"position_embedding_type": "rotary", "pos_scaling_type": "yarn"}},
            "model.pos_scaling_type: expected one of linear, llama3, got the string 'yarn'",
        ),
        (
            {"model": {"position_embedding_type": "rotary", "pos_scaling_type": "llama3"}},
            "model: missing required key pos_scaling_factor",
        ),
        (
            {"model": {**LLAMA3, "pos_scaling_factor": 1.0}},
            "model.pos_scaling_factor: expected a number above 1, got 1.0",
        ),
        (
            {"model": {**LLAMA3, "pos_scaling_extra_args": {"low_freq_factor": 1.0}}},
            "model.pos_scaling_extra_args: missing required key high_freq_factor",
        ),
        (
            {
                "model": {
                    **LLAMA3,
                    "pos_scaling_extra_args": {
                        "low_freq_factor": 4.0,
                        "high_freq_factor": 1.0,
                        "original_max_position_embeddings": 8192,
                    },
                }
            },
            "model.pos_scaling_extra_args.high_freq_factor: 1 is not above low_freq_factor 4",
        ),
        (
            {
                "model": {
                    "position_embedding_type": "rotary",
                    "pos_scaling_extra_args": {"low_freq_factor": 1.0},
                }
            },
            "model.pos_scaling_extra_args: only with pos_scaling_type: llama3",
        ),
        # names
        (
            {"model": {"position_embedding_type": "alibi"}},
            "model.position_embedding_type: expected one of learned, rotary, "
            "got the string 'alibi'",
        ),
        (
            {"model": {"norm_type": "batchnorm"}},
            "model.norm_type: expected one of layernorm, rmsnorm, got the string 'batchnorm'",
        ),
        (
            {"model": {"nonlinearity": "gelu_tanh"}},
            "model.nonlinearity: expected one of gelu, gelu_new, relu, swiglu, got the string "
            "'gelu_tanh'",
        ),
        (
            {"optimizer": {"optimizer_type": "lamb"}},
            "optimizer.optimizer_type: expected one of sgd, adam, adamw, got the string 'lamb'",
        ),
        (
            {"runconfig": {"precision": "fp16"}},
            "runconfig.precision: expected one of float32, float16, bfloat16, "
            "got the string 'fp16'",
        ),
        # floats
        (
            {"model": {"dropout_rate": 1.0}},
            "model.dropout_rate: expected a number in [0, 1), got 1.0",
        ),
        (
            {"model": {"attention_dropout_rate": -0.1}},
            "model.attention_dropout_rate: expected a number in [0, 1), got -0.1",
        ),
        (
            {"model": {"embedding_dropout_rate": False}},
            "model.embedding_dropout_rate: expected a number in [0, 1), got false",
        ),
        (
            {"model": {"layer_norm_epsilon": 0}},
            "model.layer_norm_epsilon: expected a positive number, got 0",
        ),
        (
            {"optimizer": {"learning_rate": 0.0}},
            "optimizer.learning_rate: expected a positive number, got 0.0",
        ),
        (
            {"optimizer": {"learning_rate": float("inf")}},
            "optimizer.learning_rate: expected a positive number, got inf",
        ),
        ({"optimizer": {"eps": -1.0e-8}}, "optimizer.eps: expected a positive number, got -1e-08"),
        (
            {"optimizer": {"weight_decay": -0.1}},
            "optimizer.weight_decay: expected a non-negative number, got -0.1",
        ),
        (
            {"optimizer": {"max_gradient_norm": 0}},
            "optimizer.max_gradient_norm: expected a positive number, got 0",
        ),
        (
            {"optimizer": {"betas": [0.9, 1.0]}},
            "optimizer.betas: expected a number in [0, 1), got 1.0",
        ),
        (
            {"optimizer": {"betas": [0.9]}},
            "optimizer.betas: expected a list of two numbers, got [0.9]",
        ),
        ({"optimizer": {"beta2": 1}}, "optimizer.beta2: expected a number in [0, 1), got 1"),
        (
            {"optimizer": {"optimizer_type": "sgd", "momentum": 1.5}},
            "optimizer.momentum: expected a number in [0, 1), got 1.5",
        ),
        # optimizer options
        (
            {"optimizer": {"betas": [0.9, 0.95], "beta1": 0.9}},
            "optimizer.beta1: give either betas or beta1 and beta2, not both",
        ),
        (
            {"optimizer": {"weight_decay": 0.1, "weight_decay_rate": 0.1}},
            "optimizer.weight_decay_rate: give either weight_decay or it, not both",
        ),
        ({"optimizer": {"momentum": 0.9}}, "optimizer.momentum: not an option of adamw"),
        (
            {"optimizer": {"optimizer_type": "SGD", "betas": [0.9, 0.95]}},
            "optimizer.betas: not an option of sgd",
        ),
        # the cluster
        (
            {"runconfig": {"num_csx": 3}},
            "runconfig.num_csx: 3 systems do not split train_input.batch_size 8 evenly",
        ),
    ],
)
def test_check(tmp_path: Path, sections: dict[str, dict[str, Any]], message: str):
    assert error(tmp_path, mutated(**sections)) == f"gpt.yaml: {message}"


def test_float_without_decimal_point(tmp_path: Path):
    text = yaml.safe_dump(MINIMAL) + "optimizer:\n  learning_rate: 6e-4\n"
    assert error(tmp_path, text) == (
        "gpt.yaml: optimizer.learning_rate: expected a positive number, got the string '6e-4' "
        "(YAML needs a decimal point: write 6.0e-4)"
    )


# ---- limits: a value far beyond any real model is an error, not a hang or a blow-up

# What a key at its limit needs of the other keys to be valid.
COMPANIONS: dict[str, dict[str, dict[str, Any]]] = {
    "model.num_heads": {"model": {"hidden_size": 1 << 18}},
    "model.extra_attention_params.num_kv_groups": {
        "model": {"hidden_size": 1 << 18, "num_heads": 1 << 18}
    },
    "model.rotary_dim": {
        "model": {"hidden_size": 1 << 18, "num_heads": 1, "position_embedding_type": "rotary"}
    },
    "model.pos_scaling_extra_args.original_max_position_embeddings": {
        "model": {
            **LLAMA3,
            "pos_scaling_extra_args": {"low_freq_factor": 1.0, "high_freq_factor": 4.0},
        }
    },
    "runconfig.num_csx": {"train_input": {"batch_size": 4096}},
}


def with_value(path: str, value: int) -> dict[str, dict[str, Any]]:
    """MINIMAL with the integer at ``path`` set to ``value``, and its COMPANIONS."""
    document = mutated(**COMPANIONS.get(path, {}))
    *sections, key = path.split(".")
    values = document
    for section in sections:
        values = values.setdefault(section, {})
    values[key] = value
    return document


@pytest.mark.parametrize("path", sorted(INTEGER_LIMITS))
def test_an_integer_at_its_limit_loads(tmp_path: Path, path: str):
    # and so do the defaults that follow from it: filter_size (4 * hidden_size),
    # max_position_embeddings (max_sequence_length)
    most = INTEGER_LIMITS[path].most
    params = load_params(write(tmp_path, with_value(path, most)))
    section, *_, key = path.split(".")
    config = {"model": params.model, "train_input": params.train_input}.get(
        section, params.runconfig
    )
    if section == "model" and "pos_scaling" in path:
        config = params.model.rotary_scaling
    assert getattr(config, "num_kv_heads" if key == "num_kv_groups" else key) == most


@pytest.mark.parametrize(
    ("path", "value", "most"),
    [
        ("model.hidden_size", 1 << 62, 1 << 18),
        ("model.num_hidden_layers", 10**9, 512),
        ("model.num_heads", (1 << 18) + 1, 1 << 18),
        ("model.extra_attention_params.num_kv_groups", 1 << 19, 1 << 18),
        ("model.filter_size", 1 << 30, 1 << 20),
        ("model.vocab_size", 10**11, 1 << 22),
        ("model.max_position_embeddings", 10**9, 1 << 20),
        ("model.rotary_dim", 1 << 20, 1 << 18),
        ("train_input.batch_size", 10**12, 1 << 24),
        ("train_input.max_sequence_length", 10**9, 1 << 20),
        ("runconfig.num_csx", 8192, 4096),
    ],
)
def test_an_integer_beyond_its_limit(tmp_path: Path, path: str, value: int, most: int):
    message = error(tmp_path, with_value(path, value))
    assert message.startswith(f"gpt.yaml: {path}: {value} exceeds the limit {most} (")


def test_integers_beyond_the_floats(tmp_path: Path):
    # 10**40 is a float (1e40); 10**400 is not, and is shown abbreviated
    assert load_params(write(tmp_path, mutated(optimizer={"learning_rate": 10**40})))
    assert error(tmp_path, mutated(optimizer={"learning_rate": 10**400})) == (
        "gpt.yaml: optimizer.learning_rate: expected a positive number, "
        "got 100000000000000000...0000000000000000000"
    )
    assert error(tmp_path, mutated(optimizer={"betas": [0.9, -(10**400)]})).startswith(
        "gpt.yaml: optimizer.betas: expected a number in [0, 1), got -10000000000000000"
    )


def test_a_limit_through_the_command_line(tmp_path: Path):
    path = write(tmp_path, mutated(model={"num_hidden_layers": 10**9}))
    result = CliRunner().invoke(main, ["compile", str(path), "-o", str(tmp_path / "x.cgc")])
    assert result.exit_code == 2, result.output
    assert result.output == (
        "error: gpt.yaml: model.num_hidden_layers: 1000000000 exceeds the limit 512 "
        "(4 times the deepest published model's 126, Llama 3.1 405B's)\n"
    )


# ---- YAML that PyYAML accepts but a params file must not


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "model:\n  hidden_size: 64\n  hidden_size: 128\n",
            "model.hidden_size: given twice, on lines 2 and 3",
        ),
        (
            "model:\n  extra_attention_params:\n    num_kv_groups: 2\n    num_kv_groups: 4\n",
            "model.extra_attention_params.num_kv_groups: given twice, on lines 3 and 4",
        ),
        ("model: {}\ntrain_input: {}\nmodel: {}\n", "model: given twice, on lines 1 and 3"),
        (
            "runconfig: {num_csx: 1, num_csx: 2}\n",
            "runconfig.num_csx: given twice, on lines 1 and 1",
        ),
    ],
)
def test_a_key_given_twice(tmp_path: Path, text: str, message: str):
    assert error(tmp_path, text) == f"gpt.yaml: {message}"


def test_a_merged_key_may_be_given_again(tmp_path: Path):
    text = yaml.safe_dump(MINIMAL) + (
        "optimizer:\n  <<: &adam {optimizer_type: adam, learning_rate: 0.5}\n  learning_rate: 0.1\n"
    )
    assert load_params(write(tmp_path, text)).optimizer.learning_rate == 0.1


def test_a_duplicate_key_through_the_command_line(tmp_path: Path):
    text = """\
model:
  hidden_size: 64
  num_hidden_layers: 2
  num_heads: 4
  vocab_size: 100
  vocab_size: 50
train_input: {batch_size: 8, max_sequence_length: 16}
"""
    result = CliRunner().invoke(
        main, ["train", str(write(tmp_path, text)), "--timing-only", "--steps", "1"]
    )
    assert result.exit_code == 2, result.output
    assert result.output == "error: gpt.yaml: model.vocab_size: given twice, on lines 5 and 6\n"


def test_an_integer_of_thousands_of_digits(tmp_path: Path):
    text = yaml.safe_dump(MINIMAL) + "optimizer:\n  learning_rate: 1" + "0" * 5000 + "\n"
    assert error(tmp_path, text) == (
        "gpt.yaml: line 10: not valid YAML (Exceeds the limit (4300 digits) for integer string "
        "conversion: value has 5001 digits)"
    )


def test_an_impossible_date(tmp_path: Path):
    text = yaml.safe_dump(MINIMAL) + "optimizer:\n  learning_rate: 2024-13-01\n"
    assert error(tmp_path, text) == ("gpt.yaml: line 10: not valid YAML (month must be in 1..12)")


def test_nesting_too_deep(tmp_path: Path):
    text = yaml.safe_dump(MINIMAL) + "optimizer:\n  betas: " + "[" * 5000 + "]" * 5000 + "\n"
    assert error(tmp_path, text) == "gpt.yaml: not valid YAML (nested too deeply)"


def test_a_billion_items_in_a_few_lines(tmp_path: Path):
    # each list holds nine of the one before: the last has 9**10 ones, shared, not copied
    lists = ["&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lists += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    text = yaml.safe_dump(MINIMAL) + f"optimizer:\n  betas: [{', '.join(lists)}]\n"
    message = error(tmp_path, text)
    assert message.startswith("gpt.yaml: optimizer.betas: expected a list of two numbers, got [[")
    assert len(message) < 200


def test_sparsity_section(tmp_path: Path):
    document = {**MINIMAL, "sparsity": {"density": 0.25, "param_name_patterns": [".*attn.*"]}}
    params = load_params(write(tmp_path, document))
    assert params.sparsity is not None
    assert (params.sparsity.density, params.sparsity.param_name_patterns) == (0.25, (".*attn.*",))
    assert params.sparsity.init == "random"
    assert (params.sparsity.schedule, params.sparsity.dynamic) == ("static", ())
    assert load_params(write(tmp_path, MINIMAL)).sparsity is None
    dynamic = {"density": 0.25, "schedule": "Dynamic", "update_every": 50, "drop_fraction": 0.1,
               "regrow": "random", "decay": "cosine", "end_step": 500}  # fmt: skip
    params = load_params(write(tmp_path, {**MINIMAL, "sparsity": dynamic}))
    assert params.sparsity is not None and params.sparsity.schedule == "dynamic"
    assert dict(params.sparsity.dynamic) == {"update_every": 50, "drop_fraction": 0.1,
                                             "regrow": "random", "decay": "cosine",
                                             "end_step": 500}  # fmt: skip


DYNAMIC = {"density": 0.5, "schedule": "dynamic"}


@pytest.mark.parametrize(
    ("sparsity", "message"),
    [
        ({}, "sparsity: missing required key density"),
        ({"density": 0}, "sparsity.density: expected a number in (0, 1], got 0"),
        ({"density": 0.5, "init": "lottery"}, "sparsity.init: expected one of random, magnitude"),
        ({"density": 0.5, "schedule": "sometimes"}, "sparsity.schedule: expected one of static"),
        ({"density": 0.5, "update_every": 10}, "sparsity.update_every: needs schedule: dynamic"),
        ({"density": 0.5, "param_name_patterns": "w"}, "expected a list of regular expressions"),
        ({"density": 0.5, "param_name_patterns": ["("]}, "sparsity.param_name_patterns: '('"),
        ({"density": 0.5, "rewind": 10}, "unknown key: sparsity.rewind"),
        ({**DYNAMIC, "update_every": 0}, "sparsity.update_every: expected a positive integer"),
        ({**DYNAMIC, "drop_fraction": 1}, "sparsity.drop_fraction: expected a number in (0, 1)"),
        ({**DYNAMIC, "regrow": "lottery"}, "sparsity.regrow: expected one of gradient, random"),
        ({**DYNAMIC, "decay": "cosine"}, "sparsity.decay: cosine needs end_step"),
        ({**DYNAMIC, "end_step": 1.5}, "sparsity.end_step: expected a positive integer"),
    ],
)
def test_bad_sparsity_sections(tmp_path: Path, sparsity: dict, message: str):
    assert message in error(tmp_path, {**MINIMAL, "sparsity": sparsity})


def test_biases_per_part(tmp_path: Path):
    """Qwen2's: biases on the q, k and v projections only."""
    model = {"use_projection_bias_in_attention": True, "use_ffn_bias_in_attention": False,
             "use_ffn_bias": False}  # fmt: skip
    config = load_params(write(tmp_path, mutated(model=model))).model
    assert config.use_projection_bias_in_attention
    assert not config.use_ffn_bias_in_attention and not config.use_ffn_bias


def test_a_sliding_window(tmp_path: Path):
    """Mistral's: each token sees its latest tokens; null (the Model Zoo's default), all."""
    window = mutated(model={"attention_sliding_window_length": 4})
    assert load_params(write(tmp_path, window)).model.attention_sliding_window_length == 4
    document = copy.deepcopy(MINIMAL)
    document["model"]["attention_sliding_window_length"] = None
    assert load_params(write(tmp_path, document)).model.attention_sliding_window_length is None
