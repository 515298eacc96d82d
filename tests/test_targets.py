"""Targets: the named machines, test meshes, resizing, the module's target attribute, and the
plausible range of every figure and of the number of systems."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
from test_cli import invoke, one_line_error
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, i64

from cgc.dialects import parse_module, print_module
from cgc.dialects.ir import TARGET_ATTR, module_target, set_module_target
from cgc.dialects.wse import TargetAttr
from cgc.errors import CgcError
from cgc.machine.hardware.target import (
    FIGURES,
    MAX_SYSTEMS,
    RANGES,
    TARGETS,
    Target,
    checked,
    checked_systems,
    get_target,
    with_figures,
    with_swarmx_fanout,
)

KIB = 1024
WSE2 = get_target("wse2")


def test_wse2():
    t = get_target("wse2")
    assert isinstance(t, Target)
    assert t.name == "wse2"
    assert (t.rows, t.cols) == (994, 750)  # the SDK's largest user rectangle
    assert t.pes == 745_500
    assert t.sram_bytes_per_pe == 48 * KIB
    assert t.sram_bytes == 745_500 * 48 * KIB
    assert t.clock_hz == 850e6
    assert (t.fmacs_32bit, t.fmacs_16bit) == (1, 4)
    assert t.fmacs("float32") == 1 and t.fmacs("float16") == 4
    assert t.colors == 24
    assert t.io_bytes_per_s == 150e9  # 12 x 100 GbE
    assert t.seconds(850e6) == pytest.approx(1.0)


def test_wse3():
    t = get_target("wse3")
    assert t.name == "wse3"
    assert (t.rows, t.cols) == (1170, 755)
    assert t.sram_bytes_per_pe == 48 * KIB
    assert t.clock_hz == 850e6
    assert t.fmacs_16bit == 8
    assert t.io_bytes_per_s == pytest.approx(1.3 * get_target("wse2").io_bytes_per_s)


@pytest.mark.parametrize(
    ("name", "rows", "cols"), [("mesh8x8", 8, 8), ("mesh3x17", 3, 17), ("mesh1x1", 1, 1)]
)
def test_test_meshes_are_wse2_pes(name, rows, cols):
    t = get_target(name)
    assert (t.name, t.rows, t.cols) == (name, rows, cols)
    wse2 = get_target("wse2")
    assert t.sram_bytes_per_pe == wse2.sram_bytes_per_pe
    assert t.clock_hz == wse2.clock_hz
    assert t.fmacs_16bit == wse2.fmacs_16bit
    assert t.sram_bytes == rows * cols * 48 * KIB


def test_resized_targets():
    t = get_target("wse3@16x32")
    assert (t.name, t.rows, t.cols) == ("wse3@16x32", 16, 32)
    assert t.fmacs_16bit == 8  # still a WSE-3
    t = get_target("mesh8x8@2x3")
    assert (t.rows, t.cols) == (2, 3)
    assert t.name == "mesh8x8@2x3"


def test_mesh_override():
    t = get_target("wse2", (4, 6))
    assert (t.name, t.rows, t.cols) == ("wse2@4x6", 4, 6)
    assert t.sram_bytes_per_pe == 48 * KIB
    # a resized target's name names the same target again
    again = get_target(t.name)
    assert again == t


def test_targets_round_trip_through_json():
    for name in ("wse2", "wse3", "mesh4x4", "wse3@2x2"):
        t = get_target(name)
        assert Target.from_json(t.to_json()) == t


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("wse9", r"unknown target 'wse9'; known targets: wse2, wse3, meshRxC \(e\.g\. mesh8x8\)"),
        ("mesh8", r"unknown target 'mesh8'"),
        ("Mesh8x8", r"unknown target 'Mesh8x8'"),
        ("", r"unknown target ''"),
        ("mesh0x8", r"target 'mesh0x8': rows must be positive, got 0"),
        ("mesh8x0", r"target 'mesh8x0': cols must be positive, got 0"),
        ("mesh2049x8", r"target 'mesh2049x8': rows 2049 is outside its plausible range 1\.\.2048"),
        ("wse2@8", r"bad mesh size '8' in target 'wse2@8'; expected ROWSxCOLS"),
        ("wse2@axb", r"bad mesh size 'axb'"),
        ("wse2@-1x4", r"bad mesh size '-1x4'"),
        ("wse2@0x4", r"--mesh 0x4: target 'wse2@0x4': rows must be positive, got 0"),
        ("wse2@4x99999", r"--mesh 4x99999: target 'wse2@4x99999': cols 99999 is outside"),
        ("wse4@2x2", r"unknown target 'wse4'"),
    ],
)
def test_bad_targets(name, message):
    with pytest.raises(CgcError, match=message):
        get_target(name)


@pytest.mark.parametrize(
    ("mesh", "message"),
    [
        ((3, 0), "--mesh 3x0: target 'wse2@3x0': cols must be positive, got 0"),
        (
            (2049, 4),
            "--mesh 2049x4: target 'wse2@2049x4': rows 2049 is outside its plausible range 1..2048",
        ),
        (
            (10**12, 10**12),
            "--mesh 1000000000000x1000000000000: target "
            "'wse2@1000000000000x1000000000000': rows 1000000000000 is outside",
        ),
    ],
)
def test_bad_mesh_override(mesh, message):
    with pytest.raises(CgcError, match=re.escape(message)):
        get_target("wse2", mesh)


def test_module_target_carries_the_whole_target():
    module = ModuleOp([])
    custom = dataclasses.replace(get_target("wse2"), name="lab", rows=3, clock_hz=1e9)
    set_module_target(module, custom)
    assert TARGET_ATTR == "wse.target"
    assert module_target(module) == custom
    text = print_module(module)
    assert '#wse.target<"lab", rows = 3, cols = 750,' in text and "clock_hz = 1000000000.0" in text
    assert module_target(parse_module(text)) == custom


def test_module_target_errors():
    module = ModuleOp([])
    with pytest.raises(CgcError, match=r"the module has no 'wse.target' attribute"):
        module_target(module)
    module.attributes[TARGET_ATTR] = IntegerAttr(3, i64)
    with pytest.raises(CgcError, match=r"no 'wse.target' attribute"):
        module_target(module)
    module.attributes[TARGET_ATTR] = StringAttr("mesh4x6")
    with pytest.raises(
        CgcError, match=r'must carry the whole target: write #wse.target<"mesh4x6">'
    ):
        module_target(module)


def _attr(text: str) -> Target:
    module = parse_module(f"builtin.module attributes {{wse.target = {text}}} {{}}")
    return module_target(module)


def test_target_attribute_text():
    assert _attr('#wse.target<"mesh4x6">') == get_target("mesh4x6")
    assert _attr('#wse.target<"wse2@2x2">') == get_target("wse2", (2, 2))
    changed = _attr('#wse.target<"wse3", clock_hz = 1.1e9, colors = 16>')
    assert changed == dataclasses.replace(get_target("wse3"), clock_hz=1.1e9, colors=16)
    written = str(TargetAttr(get_target("wse2"))).replace('"wse2"', '"mine"')
    assert _attr(written) == dataclasses.replace(get_target("wse2"), name="mine")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '#wse.target<"mine", rows = 4>',
            r"target 'mine' is not a named target, so it needs every",
        ),
        ('#wse.target<"wse2", lanes = 4>', r"target 'wse2': no figure lanes"),
        ('#wse.target<"wse2", rows = 0>', r"target 'wse2': rows must be positive, got 0"),
        ('#wse.target<"wse2", cols = 2.5>', r"target 'wse2': cols must be a whole number, got 2.5"),
        ('#wse.target<"wse2", swarmx_fanout = 1>', r"swarmx_fanout 1 is outside .* 2\.\.4096"),
        ('#wse.target<"wse2", colors = 64>', r"target 'wse2': colors 64 is outside .* 1\.\.63"),
    ],
)
def test_target_attribute_errors(text, message):
    with pytest.raises(CgcError, match=message):
        _attr(text)


def test_checked_normalizes_kinds_and_refuses_nonsense():
    wse2 = get_target("wse2")
    assert checked(dataclasses.replace(wse2, clock_hz=10**9)).clock_hz == 1e9
    assert isinstance(checked(dataclasses.replace(wse2, rows=np.int64(5))).rows, int)
    for bad in ({"rows": -1}, {"clock_hz": float("inf")}, {"colors": "24"}, {"name": ""}):
        with pytest.raises(CgcError):
            checked(dataclasses.replace(wse2, **bad))


def test_every_figure_has_a_range_that_holds_the_named_targets():
    assert set(RANGES) == set(FIGURES)
    for target in TARGETS.values():
        assert checked(target) == target


def _beyond(figure: str) -> tuple[int | float, int | float]:
    """The nearest values outside a figure's range, of its kind."""
    low, high = RANGES[figure]
    return (low - 1, high + 1) if isinstance(low, int) else (low / 2, high * 2)


@pytest.mark.parametrize("figure", FIGURES)
def test_every_figure_is_taken_at_its_bounds_and_refused_beyond(figure):
    for value in RANGES[figure]:
        assert getattr(checked(dataclasses.replace(WSE2, **{figure: value})), figure) == value
    for value in _beyond(figure):
        with pytest.raises(CgcError, match=rf"^target 'wse2': {figure} "):
            checked(dataclasses.replace(WSE2, **{figure: value}))


@pytest.mark.parametrize(
    ("figure", "value", "message"),
    [
        ("rows", 100_000, "rows 100000 is outside its plausible range 1..2048"),
        ("rows", 10**400, "rows 1" + "0" * 400 + " is outside its plausible range 1..2048"),
        ("rows", 12.5, "rows must be a whole number, got 12.5"),
        ("cols", 0, "cols must be positive, got 0"),
        (
            "sram_bytes_per_pe",
            1023,
            "sram_bytes_per_pe 1023 is outside its plausible range 1024..1.07374e+09",
        ),
        ("clock_hz", 1e-320, "clock_hz 1e-320 is outside its plausible range 1e+06..1e+11"),
        ("clock_hz", math.nan, "clock_hz must be finite, got nan"),
        (
            "io_bytes_per_s",
            1e-310,
            "io_bytes_per_s 1e-310 is outside its plausible range 1000..1e+15",
        ),
        ("io_bytes_per_s", math.inf, "io_bytes_per_s must be finite, got inf"),
        ("memoryx_bytes_per_s", -math.inf, "memoryx_bytes_per_s must be finite, got -inf"),
        (
            "memoryx_capacity_bytes",
            10**19,
            "memoryx_capacity_bytes 10000000000000000000 is "
            "outside its plausible range 1024..1e+18",
        ),
        ("colors", 64, "colors 64 is outside its plausible range 1..63"),
        ("swarmx_fanout", 1, "swarmx_fanout 1 is outside its plausible range 2..4096"),
        (
            "swarmx_hop_seconds",
            2.0,
            "swarmx_hop_seconds 2.0 is outside its plausible range 1e-12..1",
        ),
        ("fmacs_16bit", "4", "fmacs_16bit must be a number, got '4'"),
    ],
)
def test_checked_names_the_figure_its_value_and_its_range(figure, value, message):
    with pytest.raises(CgcError, match="^" + re.escape(f"target 'wse2': {message}") + "$"):
        checked(dataclasses.replace(WSE2, **{figure: value}))


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("io_bytes_per_s=1e-310", "io_bytes_per_s 1e-310 is outside its plausible range"),
        ("clock_hz=1e-320", "clock_hz 1e-320 is outside its plausible range 1e+06..1e+11"),
        ("clock_hz=nan", "clock_hz must be finite, got nan"),
        ("rows=1e12", "rows 1000000000000 is outside its plausible range 1..2048"),
        ("rows=100000", "rows 100000 is outside its plausible range 1..2048"),
        ("rows=12.5", "rows must be a whole number, got 12.5"),
        ("cols=1e400", "cols must be finite, got inf"),
    ],
)
def test_with_figures_names_the_assignment(assignment, message):
    with pytest.raises(CgcError, match="^" + re.escape(f"--set {assignment}: target 'wse2': ")):
        with_figures(WSE2, ["clock_hz=1e9", assignment])
    with pytest.raises(CgcError, match=re.escape(message)):
        with_figures(WSE2, [assignment])


def test_with_swarmx_fanout_names_the_option():
    assert with_swarmx_fanout(WSE2, MAX_SYSTEMS).swarmx_fanout == MAX_SYSTEMS
    with pytest.raises(CgcError, match=r"^--swarmx-fanout 5000: target 'wse2': swarmx_fanout"):
        with_swarmx_fanout(WSE2, 5000)


@pytest.mark.parametrize(
    ("systems", "message"),
    [
        (0, "num_csx must be at least 1, got 0"),
        (MAX_SYSTEMS + 1, f"num_csx must be at most {MAX_SYSTEMS}, got {MAX_SYSTEMS + 1}"),
        (100_000_000, f"num_csx must be at most {MAX_SYSTEMS}, got 100000000"),
        (2.5, "num_csx must be a whole number, got 2.5"),
    ],
)
def test_checked_systems(systems, message):
    assert checked_systems(1) == 1 and checked_systems(np.int64(MAX_SYSTEMS)) == MAX_SYSTEMS
    with pytest.raises(CgcError, match="^" + re.escape(message) + "$"):
        checked_systems(systems)


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ["--set", "io_bytes_per_s=1e-310"],
            ["--set io_bytes_per_s=1e-310: target 'wse2': io_bytes_per_s 1e-310 is outside"],
        ),
        (
            ["--set", "clock_hz=1e-320"],
            ["--set clock_hz=1e-320", "clock_hz 1e-320", "1e+06..1e+11"],
        ),
        (["--set", "clock_hz=inf"], ["--set clock_hz=inf", "clock_hz must be finite, got inf"]),
        (["--set", "rows=1e12"], ["--set rows=1e12", "rows 1000000000000", "1..2048"]),
        (["--set", "rows=12.5"], ["--set rows=12.5", "rows must be a whole number, got 12.5"]),
        (["--set", "colors=100"], ["--set colors=100", "colors 100", "1..63"]),
        (
            ["--mesh", "100000x100000"],
            [
                "--mesh 100000x100000: target 'wse2@100000x100000': "
                "rows 100000 is outside its plausible range 1..2048"
            ],
        ),
        (["--mesh", "8x0"], ["--mesh 8x0", "cols must be positive, got 0"]),
        (["--target", "mesh8x9999"], ["target 'mesh8x9999': cols 9999 is outside", "1..2048"]),
        (
            ["--num-csx", "1,100000000", "--per-system-batch", "12"],
            [f"--num-csx must be at most {MAX_SYSTEMS}, got 100000000"],
        ),
        (
            ["--num-csx", f"{MAX_SYSTEMS + 1}", "--global-batch", f"{MAX_SYSTEMS + 1}"],
            [f"--num-csx must be at most {MAX_SYSTEMS}, got {MAX_SYSTEMS + 1}"],
        ),
    ],
)
def test_cli_scale_refuses_implausible_targets_and_clusters(tiny, args, fragments):
    one_line_error(invoke("scale", tiny, *args), *fragments)


@pytest.fixture(scope="module")
def streamed(tiny, tmp_path_factory):
    """The tiny model compiled for weight streaming on an 8 x 8 mesh."""
    path = tmp_path_factory.mktemp("streamed") / "tiny.cgc"
    result = invoke(
        "compile", tiny, "-o", path, "--target", "mesh8x8", "--mode", "weight_streaming"
    )
    assert result.exit_code == 0, result.output
    return path


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["compile", "--set", "clock_hz=0.5"], "--set clock_hz=0.5: target 'wse2': clock_hz 0.5"),
        (["compile", "--mesh", "4096x4096"], "--mesh 4096x4096: target 'wse2@4096x4096': rows"),
        (["compile", "--num-csx", "8192", "--batch-size", "8192"], "--num-csx must be at most"),
        (["train", "--timing-only", "--set", "swarmx_hop_seconds=1e9"], "1000000000.0 is outside"),
        (["train", "--timing-only", "--swarmx-fanout", "5000"], "--swarmx-fanout 5000: target"),
        (["train", "--timing-only", "--num-csx", "5000"], "--num-csx must be at most 4096"),
    ],
)
def test_cli_compile_and_train_refuse_implausible_targets_and_clusters(
    tiny, tmp_path, command, message
):
    name, *args = command
    extra = ["-o", tmp_path / "unused.cgc"] if name == "compile" else ["--steps", "1"]
    one_line_error(invoke(name, tiny, *extra, *args), message)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "memoryx_bytes_per_s=1e-310"], "--set memoryx_bytes_per_s=1e-310: target"),
        (["--set", "memoryx_update_params_per_s=nan"], "must be finite, got nan"),
        (["--num-csx", "100000000"], f"--num-csx must be at most {MAX_SYSTEMS}, got 100000000"),
    ],
)
def test_cli_run_refuses_implausible_targets_and_clusters(streamed, args, message):
    one_line_error(invoke("run", streamed, "--timing-only", *args), message)
