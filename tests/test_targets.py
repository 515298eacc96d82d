"""Targets: the named machines, test meshes, resizing, and the module's target attribute."""

from __future__ import annotations

import pytest
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, i64

from cgc.dialects.ir import TARGET_ATTR, module_target
from cgc.errors import CgcError
from cgc.machine.target import Target, get_target

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


def test_module_target():
    module = ModuleOp([])
    module.attributes[TARGET_ATTR] = StringAttr("mesh4x6")
    assert TARGET_ATTR == "wse.target"
    t = module_target(module)
    assert (t.name, t.rows, t.cols) == ("mesh4x6", 4, 6)
    # an override wins over the attribute
    assert module_target(module, "wse3").name == "wse3"
    assert module_target(module, "").name == "mesh4x6"
    module.attributes[TARGET_ATTR] = StringAttr("wse2@2x2")
    assert (module_target(module).rows, module_target(module).cols) == (2, 2)


def test_module_target_errors():
    module = ModuleOp([])
    with pytest.raises(CgcError, match=r"the module has no 'wse.target' attribute"):
        module_target(module)
    assert module_target(module, "mesh2x2").name == "mesh2x2"
    module.attributes[TARGET_ATTR] = IntegerAttr(3, i64)
    with pytest.raises(CgcError, match=r"no 'wse.target' attribute"):
        module_target(module)
    module.attributes[TARGET_ATTR] = StringAttr("nowhere")
    with pytest.raises(CgcError, match=r"unknown target 'nowhere'"):
        module_target(module)
