"""The records of options (``cgc.options``): one place for each field, the doors' names for
them, and errors that name a field as the API does and a flag as the command line does."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

import cgc
from cgc.cli import main
from cgc.errors import CgcError, OptionError
from cgc.frontends import zoo
from cgc.options import (
    RECORDS,
    Chosen,
    CompileOptions,
    SimulationOptions,
    SparsityOptions,
    TrainingOptions,
    flag,
)


def test_fields_by_name_complete_the_records_given():
    given = CompileOptions(mode="pipelined", batch_size=4)
    chosen = Chosen("compile", (CompileOptions, SparsityOptions), (given,), {"num_csx": 2})
    assert chosen[CompileOptions] == CompileOptions(mode="pipelined", batch_size=4, num_csx=2)
    assert chosen[SparsityOptions] == SparsityOptions()
    assert given.num_csx is None, "a record is never changed"


def test_the_optimizer_settings_and_a_shared_seed_reach_their_records():
    kinds = (TrainingOptions, SparsityOptions)
    chosen = Chosen("train", kinds, (), {"lr": 0.1, "betas": (0.8, 0.9), "seed": 3})
    assert chosen[TrainingOptions].settings == {"lr": 0.1, "betas": (0.8, 0.9)}
    assert chosen[TrainingOptions].seed == chosen[SparsityOptions].seed == 3


@pytest.mark.parametrize(
    ("records", "fields", "message"),
    [
        ((), {"batch": 4}, r"^compile: batch is not one of its options \(batch_size, "),
        ((), {"lr": 0.1}, r"^compile: lr is not one of its options"),
        ((TrainingOptions(),), {}, r"TrainingOptions\(.*\) is not one of its records"),
        ((CompileOptions(), CompileOptions()), {}, r"^compile: two CompileOptions records$"),
    ],
)
def test_a_door_names_what_it_does_not_take(records, fields, message):
    with pytest.raises(CgcError, match=message):
        Chosen("compile", (CompileOptions, SparsityOptions), records, fields)


def test_records_check_their_choices_and_bounds():
    with pytest.raises(OptionError, match=r"^mode fast: expected one of pipelined, "):
        CompileOptions(mode="fast")
    with pytest.raises(OptionError, match=r"^init_seed -1: must be in \[0, "):
        CompileOptions(init_seed=-1)
    with pytest.raises(OptionError, match=r"^executor k8s: expected one of local, ray$"):
        SimulationOptions(executor="k8s")
    with pytest.raises(dataclasses.FrozenInstanceError):
        CompileOptions().mode = "pipelined"  # type: ignore[misc]


def test_every_field_has_its_help_and_a_flag():
    for kind in RECORDS:
        for name in kind.names():
            assert kind.option_of(name).help
    assert flag("batch_size") == "--batch-size" and flag("shapes") == "--shape"


def test_an_option_error_names_the_field_at_the_api_and_the_flag_on_the_command_line(tmp_path):
    model = zoo.MODELS["mlp"]()
    with pytest.raises(OptionError, match=r"^batch_size 7 does not split evenly over num_csx 2 "):
        cgc.compile(model, target="mesh8x8", batch_size=7, num_csx=2)
    error = OptionError("micro_batch_size and recompute apply", "micro_batch_size", "recompute")
    assert error.worded(flag) == "--micro-batch-size and --recompute apply"
    result = CliRunner().invoke(
        main, ["compile", "zoo:cerebras-gpt-111m", "-o", str(tmp_path / "m.cgc"), "--num-csx", "0"]
    )
    assert result.exit_code == 2
    assert result.output.strip() == "error: --num-csx must be at least 1, got 0"


def _command_options(group) -> list:
    """Every option of every command under ``group``."""
    found = []
    for command in group.commands.values():
        found += _command_options(command) if hasattr(command, "commands") else command.params
    return found


@pytest.mark.parametrize(
    ("record", "name"),
    [
        (record, f.name)
        for record in RECORDS
        for f in dataclasses.fields(record)
        if f.metadata["option"].command_line
    ],
)
def test_every_field_the_command_line_takes_is_an_option_made_from_its_record(record, name):
    """Some command takes the field as an option made from the record (its flag and help),
    not written again. (``cgc scale``'s ``--num-csx`` and ``--sparsity`` take lists, and
    ``cgc sweep``'s executor runs the sweep's points: other options of the same flags.)"""
    options = [o for o in _command_options(main) if flag(name) in getattr(o, "opts", ())]
    assert record.option_of(name).help in {o.help for o in options}, f"{flag(name)}: {options}"
