"""The hardware: what a target is (mesh, SRAM, clock, links, MemoryX and SwarmX rates;
the named targets ``wse2``, ``wse3`` and ``meshRxC``), the element types it computes in, and
the units its figures are shown in. Every other room stands on this one."""
