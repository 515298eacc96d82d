"""Targets: the named machines, test meshes, resizing, and the module's target attribute."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, i64

from cgc.dialects import parse_module, print_module
from cgc.dialects.ir import TARGET_ATTR, module_target, set_module_target
from cgc.dialects.wse import TargetAttr
from cgc.errors import CgcError
from cgc.machine.target import Target, checked, get_target

KIB = 1024


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
        ("mesh0x8", r"target 'mesh0x8' has an empty mesh"),
        ("mesh8x0", r"target 'mesh8x0' has an empty mesh"),
        ("wse2@8", r"bad mesh size '8' in target 'wse2@8'; expected ROWSxCOLS"),
        ("wse2@axb", r"bad mesh size 'axb'"),
        ("wse2@-1x4", r"bad mesh size '-1x4'"),
        ("wse2@0x4", r"--mesh 0x4: a mesh needs at least one PE"),
        ("wse4@2x2", r"unknown target 'wse4'"),
    ],
)
def test_bad_targets(name, message):
    with pytest.raises(CgcError, match=message):
        get_target(name)


def test_bad_mesh_override():
    with pytest.raises(CgcError, match=r"--mesh 3x0: a mesh needs at least one PE"):
        get_target("wse2", (3, 0))


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
        ('#wse.target<"wse2", swarmx_fanout = 1>', r"a SwarmX node needs at least 2 children"),
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
