"""The key-value caches a program states: each one's name, capacity, layout over the PEs of
the layer that keeps it and bytes per token, as a manifest lists them (``caches``)."""

from __future__ import annotations

from typing import Any

from cgc.machine.hardware import dtypes
from cgc.machine.movement.layout import Layout
from cgc.machine.program.bytecode import Opcode, Program


def cache_entries(program: Program) -> list[dict[str, Any]]:
    """Per ``CACHE`` instruction of ``program``: the cache's name, the layer that keeps it,
    its tokens a sequence (``capacity``) and sequences, its bytes a token of a sequence, and
    its default layout on the layer's rectangle (where its kernel keeps it)."""
    entries = []
    for index, span in enumerate(program.layer_spans):
        info = program.layers[index]
        for position in span:
            ins = program.instructions[position]
            if ins.opcode != Opcode.CACHE:
                continue
            shape, dtype = program.registers[ins.results[0]]
            capacity = ins.attrs["capacity"]
            layout = Layout.on(shape, dtype, info.rect)
            entries.append(
                {
                    "name": ins.attrs["name"],
                    "layer": info.name,
                    "capacity": capacity,
                    "sequences": shape[0] // capacity,
                    "shape": list(shape),
                    "dtype": dtype,
                    "bytes_per_token": shape[1] * dtypes.dtype(dtype).itemsize,
                    "rect": list(info.rect),
                    "tile": [layout.rt, layout.ct],
                    "tile_bytes": layout.tile_bytes,
                }
            )
    return entries
