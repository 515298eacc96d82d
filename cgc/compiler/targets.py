"""The named targets, with the published numbers (``reference/wse-hardware.md``).

* ``wse2``: a CS-2. The largest user rectangle of the SDK (750 x 994 PEs), 48 KiB per PE,
  the SDK's 850 MHz clock, one FP32 FMAC per cycle and four FP16, 24 routable colors, 1.2 Tb/s
  of off-wafer I/O (150 GB/s).
* ``wse3``: a CS-3. About 755 x 1170 PEs, 48 KiB, eight-wide FP16 SIMD, I/O 30 % above the
  CS-2's. Cerebras does not publish its clock; cgc assumes the CS-2's 850 MHz.
* ``meshRxC`` (e.g. ``mesh8x8``): R rows and C columns of WSE-2 PEs, for tests and studies.

MemoryX and SwarmX performance is not published. cgc assumes MemoryX streams at the system's
I/O rate ("can match or exceed the I/O bandwidth of a CS-2"), SwarmX links carry a system's
12 x 100 GbE (150 GB/s) with a fan-out of 4 and 1 us per hop, and MemoryX updates 20 billion
parameters per second.
"""

from __future__ import annotations

import re
from dataclasses import replace

from xdsl.dialects.builtin import ModuleOp, StringAttr

from cgc.errors import CgcError
from cgc.runtime.machine import Target

KIB = 1024

WSE2 = Target(
    name="wse2",
    rows=994,
    cols=750,
    sram_bytes_per_pe=48 * KIB,
    clock_hz=850e6,
    fmacs_32bit=1,
    fmacs_16bit=4,
    colors=24,
    io_bytes_per_s=150e9,
    memoryx_bytes_per_s=150e9,
    memoryx_capacity_bytes=12 * 10**12,
    memoryx_update_params_per_s=20e9,
    swarmx_fanout=4,
    swarmx_link_bytes_per_s=150e9,
    swarmx_hop_seconds=1e-6,
)

WSE3 = replace(
    WSE2,
    name="wse3",
    rows=1170,
    cols=755,
    fmacs_16bit=8,
    io_bytes_per_s=195e9,
    memoryx_bytes_per_s=195e9,
    swarmx_link_bytes_per_s=195e9,
)

TARGETS = {"wse2": WSE2, "wse3": WSE3}
_MESH = re.compile(r"mesh(\d+)x(\d+)")


def get_target(name: str, mesh: tuple[int, int] | None = None) -> Target:
    """The target called ``name``, optionally with its mesh resized to ``(rows, cols)``.

    ``NAME@RxC`` names target NAME with an R x C mesh, so a module attribute can carry a
    resized target.
    """
    base, _, size = name.partition("@")
    if size:
        dims = _MESH.fullmatch(f"mesh{size}")
        if dims is None:
            raise CgcError(f"bad mesh size '{size}' in target '{name}'; expected ROWSxCOLS")
        return get_target(base, mesh or (int(dims[1]), int(dims[2])))
    if name in TARGETS:
        target = TARGETS[name]
    elif match := _MESH.fullmatch(name):
        rows, cols = int(match[1]), int(match[2])
        target = replace(WSE2, name=name, rows=rows, cols=cols)
    else:
        known = ", ".join([*TARGETS, "meshRxC (e.g. mesh8x8)"])
        raise CgcError(f"unknown target '{name}'; known targets: {known}")
    if target.rows < 1 or target.cols < 1:
        raise CgcError(f"target '{name}' has an empty mesh")
    if mesh is not None:
        if min(mesh) < 1:
            raise CgcError(f"--mesh {mesh[0]}x{mesh[1]}: a mesh needs at least one PE")
        target = replace(target, name=f"{name}@{mesh[0]}x{mesh[1]}", rows=mesh[0], cols=mesh[1])
    return target


TARGET_ATTR = "wse.target"
"""Module attribute naming the target a module is compiled for."""


def module_target(module: ModuleOp, override: str = "") -> Target:
    """The target named by ``override``, else by the module's ``wse.target`` attribute."""
    if override:
        return get_target(override)
    attr = module.attributes.get(TARGET_ATTR)
    if not isinstance(attr, StringAttr):
        raise CgcError(
            f"the module has no '{TARGET_ATTR}' attribute; pass the pass option target=NAME"
        )
    return get_target(attr.data)


def with_swarmx_fanout(target: Target, fanout: int | None) -> Target:
    """``target`` with SwarmX nodes of ``fanout`` children (unchanged for None)."""
    if fanout is None:
        return target
    if fanout < 2:
        raise CgcError(f"--swarmx-fanout {fanout}: a tree node needs at least 2 children")
    return replace(target, swarmx_fanout=fanout)
