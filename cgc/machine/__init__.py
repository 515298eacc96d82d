"""The machine floor: what a target is and what work costs on it, on shapes alone.

Everything else in cgc stands on this package, and it imports nothing of cgc above it (only
``cgc.errors`` and ``cgc.files``). Its rooms, each standing only on those listed before it:

* ``hardware``: the target description and the named targets, element types, units;
* ``training``: the optimizers MemoryX runs, their settings and defaults;
* ``reference``: the numpy semantics of every primitive (``arithmetic``, ``movement``,
  ``indexing``, ``attention``);
* ``movement``: how a tensor lies on the mesh (``layout``) and what moving it costs
  (``traffic``, ``index_maps``, ``flows``, ``window_flows``);
* ``sparse``: sparse weights' patterns and their tile encoding;
* ``plans``: every kernel's plan on a rectangle (layouts, work, traffic, scratch): the shared
  vocabulary in ``kernel``, the families in ``elementwise``, ``matmul``, ``movement``, ...;
* ``program``: the bytecode, the artifact file and its manifest;
* ``timing``: the timing engine over a program and the questions a compiler asks of it
  (``cost``), the weight-streaming step and the pipelined timeline (``streaming``,
  ``pipeline``), a run's statistics on K systems (``run_stats``) and where its time goes
  (``utilization``, ``pipeline_bound``): the models both the simulator and ``cgc inspect`` ask.

The public questions::

    from cgc.machine import get_target, layer_cost, program_costs
    cost = layer_cost(program, index, rect, get_target("wse2"))
    cost.cycles, cost.compute_cycles, cost.movement_cycles, cost.arrival_cycles
    cost.sram_bytes_per_pe, cost.link_wavelets
    program_peak(program, get_target("wse2")).bytes_per_pe   # the whole program's SRAM
"""

from cgc.machine.hardware.target import Target, get_target
from cgc.machine.timing.cost import (
    LayerCost,
    LayerCosts,
    Peak,
    Profile,
    layer_cost,
    profile,
    program_costs,
    program_peak,
)

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
