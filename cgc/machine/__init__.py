"""The machine floor: what a target is and what work costs on it, on shapes alone.

Everything else in cgc stands on this package, and it imports nothing of cgc above it (only
``cgc.errors``). It holds:

* ``target``: the target description and the named targets (``wse2``, ``wse3``, ``meshRxC``);
* ``bytecode`` and ``artifact``: the program the compiler writes and the runtime reads;
* ``layout`` and ``traffic``: how a tensor lies on the mesh and what moving it costs;
* ``reference``: the numpy semantics of every primitive (``ref_math``, ``ref_movement``,
  ``ref_indexing``);
* ``plans``: every kernel's plan on a rectangle (layouts, work, traffic, scratch): the shared
  vocabulary in ``kernel``, the families in ``plan_elementwise``, ``plan_matmul``,
  ``plan_movement``;
* ``cost``: the timing engine over a program, and the questions a compiler asks of it;
* ``optimizers``: the optimizers MemoryX runs, their settings and defaults;
* ``dtypes``, ``files``, ``units``: element types, safe file writes, figures for people.

The public questions::

    from cgc.machine import get_target, layer_cost, program_costs
    cost = layer_cost(program, index, rect, get_target("wse2"))
    cost.cycles, cost.compute_cycles, cost.movement_cycles, cost.arrival_cycles
    cost.sram_bytes_per_pe, cost.link_wavelets
    program_peak(program, get_target("wse2")).bytes_per_pe   # the whole program's SRAM
"""

from cgc.machine.cost import (
    LayerCost,
    LayerCosts,
    Peak,
    Profile,
    layer_cost,
    profile,
    program_costs,
    program_peak,
)
from cgc.machine.target import Target, get_target

__all__ = [
    "LayerCost",
    "LayerCosts",
    "Peak",
    "Profile",
    "Target",
    "get_target",
    "layer_cost",
    "profile",
    "program_costs",
    "program_peak",
]
