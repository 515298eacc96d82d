"""Writes ``docs/fidelity.md``: every published measurement of the wafer that can be set up
from its description (``reference/wse-hardware.md``, source ids of its §15), reproduced on
cgc's timing-only simulator beside the figure.

Each set-up is what a user would build: an ONNX model made with ``onnx.helper``, compiled with
``cgc.compile`` for a mesh of the paper's size, its kernels' cycles read back as the timing
engine plans them (``cgc.machine.timing.utilization``). The planner picks the GEMM algorithm
alone, so SUMMA and MeshGEMM are also timed through their plan functions (``Matmul._plan_summa``,
``plan_meshgemm``). A band passes when cgc lands in it, a number when cgc is within 15 %;
each disagreement says which term of cgc's cost binds. The last section lists the figures cgc
assumes and how a training step moves when each is halved or doubled.

    python benchmarks/fidelity.py      # timing only, full-wafer sizes, under a minute

``tests/test_fidelity.py`` checks the set-ups measure what they claim and the page's rows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from fidelity_parameters import sensitivity, sensitivity_lines
from onnx import TensorProto, helper, numpy_helper

import cgc
from cgc.machine.hardware.target import Target, get_target
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import route
from cgc.machine.plans.gemv import turn_traffic
from cgc.machine.plans.kernel import WAFER, Operand, Plan, PlanRequest
from cgc.machine.plans.matmul import Matmul
from cgc.machine.plans.meshgemm import plan_meshgemm
from cgc.machine.timing.utilization import KernelPlan, layer_kernels, program_kernels

DOC = Path(__file__).resolve().parent.parent / "docs" / "fidelity.md"
TOLERANCE = 0.15
"""A predicted number within this share of the published one agrees with it."""
GEMM = (4096, 4096, 4096)
LARGE_GEMM = (8192, 8192, 8192)
"""A GEMM twice as large each way, at which Cannon's wrap-around weighs as the paper finds."""
"""M, K, N of the GEMMs: the issue's check (WaferLLM's figure names PE counts, not sizes)."""
SIDES = (90, 180, 360, 540, 720)
ALGORITHMS = ("summa", "cannon", "meshgemm")
"""The GEMM algorithms WaferLLM measures, each forced (``forced_gemm``)."""
"""Square meshes of the GEMM efficiency curve; 720 x 720 is where WaferLLM gives its bands."""
GEMV_SIDE = 720
"""The square of the GEMV set-up: the reference gives no PE count for WaferLLM's GEMV times;
its largest square mesh is assumed."""
STENCIL = (1536, 600, 595)
"""Rocki et al.'s grid: a 1536-point z-column on each of 600 x 595 PEs."""


# --------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class Row:
    """One published figure beside cgc's prediction of it."""

    figure: str
    source: str
    published: str
    """The figure as the source states it."""
    predicted: float | None
    """cgc's prediction, in the unit of ``reference`` and ``band``; None: not modelled."""
    unit: str
    why: str
    """What the set-up is and, where cgc disagrees, which of its cost terms binds."""
    reference: float | None = None
    """The published number, where the source gives one."""
    band: tuple[float, float] | None = None
    """The published band, both ends included, where the source gives one."""

    @property
    def ratio(self) -> float | None:
        """cgc's prediction over the published number (None without both)."""
        if self.predicted is None or not self.reference:
            return None
        return self.predicted / self.reference

    @property
    def agrees(self) -> bool | None:
        """In the band, or within ``TOLERANCE`` of the number; None if cgc does not model it."""
        if self.predicted is None:
            return None
        if self.band is not None:
            return self.band[0] <= self.predicted <= self.band[1]
        ratio = self.ratio
        return ratio is not None and abs(ratio - 1.0) <= TOLERANCE


def efficiency(flops: float, cycles: float, pes: int, target: Target, dtype: str) -> float:
    """Useful FLOPs over ``pes`` PEs at their peak for ``dtype`` during ``cycles``."""
    return flops / (cycles * pes * target.peak_flops_per_pe_per_cycle(dtype))


def kernels_cycles(kernels: Sequence[KernelPlan]) -> float:
    """The kernels' cycles one after another: the on-wafer time of a layer without its
    inputs entering and its results leaving through the edge."""
    return sum(k.cycles for k in kernels)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits=()) -> Any:
    graph = helper.make_graph(nodes, "fidelity", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _value(name: str, shape: Sequence[int], dtype: str) -> Any:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, elem, list(shape))


def _const(name: str, array: np.ndarray) -> Any:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array))


def _all_kernels(artifact: cgc.Artifact) -> list[KernelPlan]:
    """Every kernel of an artifact's program, as the timing engine plans them."""
    target = Target.from_json(artifact.manifest["target"])
    if artifact.manifest["mode"] == "pipelined":
        layers = range(len(artifact.manifest["layers"]))
        return [k for i in layers for k in layer_kernels(artifact.program, target, i)]
    return [k for _, kernels in program_kernels(artifact.program, target) for k in kernels]


# --------------------------------------------------------------------------- GEMM (S20)


def matmul_model(m: int, k: int, n: int, dtype: str, weight: bool = False) -> Any:
    """``[m, k] @ [k, n]``; with ``weight`` B is an initializer declared without data (its
    external file absent: compile with ``no_weights``), else a graph input."""
    inputs = [_value("a", (m, k), dtype)]
    inits = []
    if weight:
        b = onnx.TensorProto(name="b", dims=[k, n])
        b.data_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        b.data_location = TensorProto.EXTERNAL
        b.external_data.add(key="location", value="absent.bin")
        inits.append(b)
    else:
        inputs.append(_value("b", (k, n), dtype))
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    return _model([node], inputs, [_value("y", (m, n), dtype)], inits)


def _request(target: Target, shapes: tuple[int, int, int], dtype: str, at=(None, None)):
    """A GEMM on the whole of ``target``, A and B on the wafer in layouts ``at`` (default:
    their default layouts)."""
    m, k, n = shapes
    rect = target.whole
    a = Operand((m, k), dtype, WAFER, at[0] or Layout.on((m, k), dtype, rect))
    b = Operand((k, n), dtype, WAFER, at[1] or Layout.on((k, n), dtype, rect))
    return PlanRequest(target, rect, (a, b), {}, (((m, n), dtype),)), a, b


def forced_gemm(algorithm: str, side: int, shapes: tuple[int, int, int], dtype: str) -> Plan:
    """SUMMA, Cannon or MeshGEMM of ``shapes`` on a ``side x side`` mesh, its operands already where
    the kernel wants them (WaferLLM times the kernel on loaded tiles): planned once to learn
    those layouts, then again from them."""
    target = get_target(f"mesh{side}x{side}")
    m, k, n = shapes
    flops = 2.0 * m * k * n
    out = Layout.on((m, n), dtype, target.whole)

    def planned(at: tuple[Any, Any]) -> Plan:
        q, a, b = _request(target, shapes, dtype, at)
        if algorithm == "summa":
            return Matmul._plan_summa(q, a, b, out, flops)
        return plan_meshgemm(q, a, b, False, flops, interleaved=algorithm == "meshgemm")

    first = planned((None, None))
    return planned((first.inputs[0], first.inputs[1]))


def chosen_gemm(
    side: int,
    dtype: str,
    mode: str = "pipelined",
    shapes: tuple[int, int, int] = GEMM,
    weight: bool = False,
) -> tuple[str, float, float]:
    """The algorithm cgc's planner picks for the compiled GEMM of ``shapes`` (B a ``weight``
    or a graph input) on a ``side x side`` mesh, the compiled kernel's cycles and its
    efficiency."""
    m, k, n = shapes
    artifact = cgc.compile(
        matmul_model(m, k, n, dtype, weight),
        mode=mode,
        target=f"mesh{side}x{side}",
        no_weights=weight,
    )
    (kernel,) = _all_kernels(artifact)
    target = get_target(f"mesh{side}x{side}")
    eff = efficiency(kernel.flops, kernel.cycles, side * side, target, dtype)
    return kernel.detail["algorithm"], kernel.cycles, eff


def gemm_rows() -> tuple[list[Row], list[dict[str, Any]]]:
    """WaferLLM's GEMM bands at 720 x 720 (float16, ``@fmach``), and the efficiency curve."""
    curve: list[dict[str, Any]] = []
    for side in SIDES:
        target = get_target(f"mesh{side}x{side}")
        point: dict[str, Any] = {"side": side}
        for algorithm in ALGORITHMS:
            plan = forced_gemm(algorithm, side, GEMM, "float16")
            cost = plan.cost
            point[f"{algorithm}_binds"] = plan.detail["binds"]
            point[algorithm] = efficiency(cost.flops, cost.cycles, side * side, target, "float16")
            point[f"{algorithm}_cost"] = cost
        point["chosen"], _, point["compiled"] = chosen_gemm(side, "float16")
        curve.append(point)
    last = curve[-1]
    summa, cannon, mesh = (last[f"{a}_cost"] for a in ALGORITHMS)
    large = {a: forced_gemm(a, SIDES[-1], LARGE_GEMM, "float16").cost for a in ALGORITHMS}
    at_large = (
        f"At {'x'.join(map(str, LARGE_GEMM))}, blocks of 12 x 12: SUMMA "
        f"{large['summa'].compute_cycles / large['summa'].cycles:.0%}, Cannon "
        f"{large['cannon'].compute_cycles / large['cannon'].cycles:.0%}, MeshGEMM "
        f"{large['meshgemm'].compute_cycles / large['meshgemm'].cycles:.0%} of peak, "
        f"MeshGEMM {large['cannon'].cycles / large['meshgemm'].cycles:.1f}x Cannon and "
        f"{large['summa'].cycles / large['meshgemm'].cycles:.1f}x SUMMA: no one size "
        "meets every band, because cgc's SUMMA pays its broadcasts' flight once a panel of "
        "six steps (a color pair a root) where WaferLLM's analysis has SUMMA, like Cannon, "
        "wait for it every step"
    )
    setup = f"{'x'.join(map(str, GEMM))} float16 on 720 x 720 PEs"
    why = (
        f"{setup}; arithmetic {summa.compute_cycles:,.0f} of {summa.cycles:,.0f} cycles: the "
        "rest is each panel's broadcast flight across the 720-PE grid (`_Panels.cycles`: "
        "ceil(steps / panel) x (side - 1)) and the blocks through the ramp"
    )
    rows = [
        Row(
            "SUMMA efficiency at 720 x 720",
            "S20",
            "< 50 %",
            last["summa"],
            "of FP16 peak",
            why,
            band=(0.0, 0.5),
        ),
        Row(
            "Cannon efficiency at 720 x 720",
            "S20",
            "< 50 %",
            last["cannon"],
            "of FP16 peak",
            f"{setup}; arithmetic {cannon.compute_cycles:,.0f} of {cannon.cycles:,.0f} "
            "cycles: each of the 719 shifts waits for the plain ring's wrap-around, 719 hops "
            "(`plan_meshgemm(interleaved=False)`; the planner never picks it)",
            band=(0.0, 0.5),
        ),
        Row(
            "MeshGEMM efficiency near full wafer (720 x 720)",
            "S20",
            "> 70 %",
            last["meshgemm"],
            "of FP16 peak",
            f"{setup}; a step is max(arithmetic, shift) + 2 hops (`plan_meshgemm`)",
            band=(0.7, 1.0),
        ),
        Row(
            "MeshGEMM speed-up over SUMMA at 720 x 720",
            "S20",
            "2-3x",
            summa.cycles / mesh.cycles,
            "x",
            f"{setup}: SUMMA {summa.cycles:,.0f} cycles, MeshGEMM {mesh.cycles:,.0f}",
            band=(2.0, 3.0),
        ),
        Row(
            "MeshGEMM speed-up over Cannon at 720 x 720",
            "S20",
            "2-3x",
            cannon.cycles / mesh.cycles,
            "x",
            f"{setup}: Cannon {cannon.cycles:,.0f} cycles, MeshGEMM {mesh.cycles:,.0f}. Every "
            "Cannon step pays the wrap-around's flight, 719 hops against 54 cycles of "
            "arithmetic: blocks of 6 x 6 on 720 x 720 PEs leave nothing to hide it behind (the "
            f"paper's matrix sizes are not in the reference). {at_large}",
            band=(2.0, 3.0),
        ),
    ]
    return rows, curve


def issue_check() -> list[dict[str, Any]]:
    """The issue's check: the float32 GEMM compiled for 256 x 256 and 720 x 720, in both modes,
    B a graph input (neither mode streams it) or a weight (resident in pipelined mode,
    streamed from MemoryX in weight streaming)."""
    out = []
    for weight in (False, True):
        for side in (256, 720):
            algorithm, cycles, eff = chosen_gemm(side, "float32", weight=weight)
            streamed = chosen_gemm(side, "float32", "weight_streaming", weight=weight)
            out.append(
                {
                    "b": "weight" if weight else "input",
                    "side": side,
                    "algorithm": algorithm,
                    "efficiency": eff,
                    "pipelined": cycles,
                    "weight_streaming": streamed[1],
                    "streamed_algorithm": streamed[0],
                }
            )
    return out


# --------------------------------------------------------------------------- GEMV (S20)


GEMV_PUBLISHED = {16384: 0.0012e-3, 32768: 0.00203e-3}
"""WaferLLM's MeshGEMV times of ``[1, K] x [K, K]``, seconds."""


def gemv_seconds(k: int, side: int = GEMV_SIDE) -> tuple[float, KernelPlan]:
    """The compiled ``[1, k] x [k, k]`` float16 GEMV's kernel time on a ``side x side``
    mesh, its matrix resident (pipelined mode), at cgc's clock, from the vector where the
    kernel takes it (WaferLLM times its GEMV from a vector in place; the one-layer set-up's
    vector comes from the host onto the rectangle's top row); and the kernel."""
    artifact = cgc.compile(
        matmul_model(1, k, k, "float16", weight=True),
        mode="pipelined",
        target=f"mesh{side}x{side}",
        no_weights=True,
    )
    (kernel,) = _all_kernels(artifact)
    cycles = kernel.cycles - kernel.plan.cost.arrival_cycles
    return get_target(f"mesh{side}x{side}").seconds(cycles), kernel


def gemv_rows() -> list[Row]:
    """WaferLLM's two GEMV times."""
    rows = []
    clock = get_target("wse2").clock_hz
    for k, published in GEMV_PUBLISHED.items():
        seconds, kernel = gemv_seconds(k)
        rows.append(
            Row(
                f"MeshGEMV [1,{k // 1024}K] x [{k // 1024}K,{k // 1024}K]",
                "S20",
                f"{published * 1e3:g} ms",
                seconds,
                "s",
                _gemv_reason(k, kernel, published * clock),
                reference=published,
            )
        )
    return rows


def _gemv_reason(k: int, kernel: KernelPlan, published: float) -> str:
    """What cgc's GEMV kernel is made of, against WaferLLM's published cycles."""
    cost, detail = kernel.plan.cost, kernel.detail
    a_at, b_at = kernel.plan.inputs
    assert a_at is not None and b_at is not None
    turn = turn_traffic(a_at, b_at).max_hops
    total = kernel.cycles - cost.arrival_cycles
    reduction = total - cost.compute_cycles - turn
    return (
        f"[1,{k}] x [{k},{k}] float16, the matrix resident on {b_at.h} x {b_at.w} PEs of "
        f"{GEMV_SIDE} x {GEMV_SIDE} (the rows the placement gives it; the reference gives no "
        f"PE count); cgc picks {detail['algorithm']}: "
        f"{total:,.0f} cycles from the vector on the middle "
        f"row, of which arithmetic {cost.compute_cycles:,.0f}, the vector's turn onto the "
        f"mesh rows {turn:,} hops of flight, and the reduction down the columns and the rest "
        f"{reduction:,.0f}. Published: {published:,.0f} cycles at the same clock. WaferLLM "
        "keeps the vector replicated on every PE between GEMVs, so an AllReduce (half a "
        "column each way from the middle) is all its movement; cgc's layouts hold each "
        "element once, so its vector turns from one row onto every row, about one side of "
        "the grid of flight, where the AllReduce's broadcast back is half of one. The "
        f"arithmetic ({b_at.rt} x {b_at.ct} blocks a PE) is {cost.compute_cycles / total:.0%} "
        "of cgc's time"
    )


# --------------------------------------------------------------------------- fabric (S10-S13)


def transfer_cycles(words: int, hops: int) -> float:
    """One flow of ``words`` wavelets from a PE to the one ``hops`` columns east, as cgc's
    router counts it (``cgc.machine.movement.traffic.route``)."""
    zero = np.zeros(1, dtype=np.int64)
    traffic = route(zero, zero, zero, zero + hops, np.array([words]), 1.0)
    return traffic.cycles


def fabric_rows() -> list[Row]:
    """The SDK's link, hop, ramp, color and clock figures."""
    wse2 = get_target("wse2")
    per_wavelet = transfer_cycles(2000, 10) - transfer_cycles(1000, 10)
    per_hop = (transfer_cycles(1000, 20) - transfer_cycles(1000, 10)) / 10
    ramp = transfer_cycles(1, 1) - 1 - 1  # a wavelet's cycle on the link and its one hop
    return [
        Row(
            "Link bandwidth: one 32-bit wavelet per cycle per direction",
            "S12",
            "4 B/cycle",
            4.0 * 1000 / per_wavelet,
            "B/cycle",
            "a flow of 1000 more wavelets over 10 hops (`traffic.route`): its cycles grow by "
            f"{per_wavelet:.0f}; {4.0 * wse2.clock_hz / 1e9:.1f} GB/s a link at 850 MHz",
            reference=4.0,
        ),
        Row(
            "Latency: 1 cycle per hop",
            "S12",
            "1 cycle/hop",
            per_hop,
            "cycles/hop",
            "the same flow over 10 more hops",
            reference=1.0,
        ),
        Row(
            "CE-router turnaround T_R",
            "S22",
            "about 2 cycles",
            ramp,
            "cycles",
            "a one-wavelet, one-hop flow costs 2 cycles, one on the link and one for the hop: "
            "`Traffic.cycles` counts ramps as bandwidth (a wavelet a cycle each way), with no "
            "latency of their own, so the 2 T_R + 1 a dependent step of a reduction pays "
            "(Luczynski's model) is absent. Left out on purpose: the figure is a secondary "
            "summary's, and a chain reduction paying 2 T_R + 1 a hop would take about 2.5 "
            "diameters for the AllReduce below, against Rocki's measured 1.1",
            reference=2.0,
        ),
        Row(
            "Routable colors",
            "S13",
            "24",
            float(wse2.colors),
            "colors",
            "`Target.colors`; SUMMA's panels take four a root (`_panels`)",
            reference=24.0,
        ),
        Row(
            "Clock of the SDK's figures",
            "S10",
            "850 MHz",
            wse2.clock_hz / 1e6,
            "MHz",
            "`Target.clock_hz` of wse2 (an assumption: the shipping clock is not published)",
            reference=850.0,
        ),
        io_row(),
    ]


def io_row() -> Row:
    """The off-wafer ingress rate a compiled program sees: a large input summed on the whole
    wse2 (its result a scalar, so that egress takes nothing), its bytes over its simulated
    time less the kernel's."""
    wse2 = get_target("wse2")
    shape = (wse2.rows, wse2.cols * 64)
    model = _model(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)],
        [_value("x", shape, "float32")],
        [_value("y", (), "float32")],
    )
    artifact = cgc.compile(model, mode="weight_streaming", target="wse2")
    stats = cgc.simulate(artifact, training=False).stats
    kernel = wse2.seconds(kernels_cycles(_all_kernels(artifact)))
    ingress = 4.0 * shape[0] * shape[1]
    return Row(
        "Off-wafer I/O: 1.2 Tb/s (12 x 100 GbE) per CS-2",
        "S6",
        "150 GB/s",
        ingress / (stats.simulated_seconds - kernel) / 1e9,
        "GB/s",
        f"{ingress / 1e6:.0f} MB into a ReduceSum on the whole wse2: its bytes over its "
        "simulated time less the kernel's (`Target.io_bytes_per_s`)",
        reference=150.0,
    )


# --------------------------------------------------------------------------- CS-1 (S17)


def allreduce_model(rows: int, cols: int) -> Any:
    """A sum of one float32 per PE, broadcast back to every PE (ReduceSum, then Add)."""
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=1),
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    shape = (rows, cols)
    return _model(nodes, [_value("x", shape, "float32")], [_value("y", shape, "float32")])


def allreduce_cycles(rows: int, cols: int) -> tuple[float, list[KernelPlan]]:
    """The AllReduce's kernels' cycles on a ``rows x cols`` mesh."""
    artifact = cgc.compile(
        allreduce_model(rows, cols), mode="weight_streaming", target=f"mesh{rows}x{cols}"
    )
    kernels = _all_kernels(artifact)
    return kernels_cycles(kernels), kernels


def allreduce_rows() -> tuple[list[Row], list[dict[str, Any]]]:
    """Rocki et al.'s AllReduce in about 1.1 diameters, and cgc's against the diameter."""
    curve: list[dict[str, Any]] = []
    for rows, cols in ((150, 150), (300, 300), (600, 595)):
        cycles, kernels = allreduce_cycles(rows, cols)
        parts = ", ".join(f"{k.name} {k.cycles:,.0f}" for k in kernels)
        curve.append({"mesh": f"{rows} x {cols}", "cycles": cycles, "parts": parts,
                      "diameters": cycles / (rows + cols)})  # fmt: skip
    last = curve[-1]
    row = Row(
        "AllReduce on CS-1: about 10 % above the diameter",
        "S17",
        "1.1 diameters",
        last["diameters"],
        "x (W + H) cycles",
        f"one float32 per PE of {last['mesh']} (ReduceSum, then Add): {last['parts']} "
        "cycles. cgc's reduction runs two chains along each row that meet at the middle "
        "column, then two down that column that meet at the middle PE "
        "(`plan_elementwise.centre_chain`), and the sum returns by a multicast from there "
        "(`kernel.multicast`): half the diameter each way, one cycle a hop; the ramps' "
        "latency is not counted, which is most of what the published 10 % leaves",
        reference=1.1,
    )
    return [row], curve


def _stencil_nodes(src: str, out: str, dims: Sequence[int], tag: str) -> list[Any]:
    """``out = 6 src - (its six neighbours)``, zero beyond the grid: each neighbour is a
    Slice shifted by one along an axis, padded with zeros on the other side."""
    nodes, shifts = [], []
    for axis in range(3):
        for ahead in (True, False):
            starts, ends = [0, 0, 0], list(dims)
            pads = [0] * 6
            if ahead:
                starts[axis], pads[3 + axis] = 1, 1
            else:
                ends[axis], pads[axis] = ends[axis] - 1, 1
            name = f"{tag}n{axis}{int(ahead)}"
            nodes += [
                _const(f"{name}b", np.array(starts, np.int64)),
                _const(f"{name}e", np.array(ends, np.int64)),
                _const(f"{name}p", np.array(pads, np.int64)),
                helper.make_node("Slice", [src, f"{name}b", f"{name}e"], [f"{name}s"]),
                helper.make_node("Pad", [f"{name}s", f"{name}p"], [name]),
            ]
            shifts.append(name)
    total = shifts[0]
    for i, name in enumerate(shifts[1:]):
        nodes.append(helper.make_node("Add", [total, name], [f"{tag}sum{i}"]))
        total = f"{tag}sum{i}"
    return [
        *nodes,
        _const(f"{tag}six", np.array(6.0, np.float16)),
        helper.make_node("Mul", [src, f"{tag}six"], [f"{tag}centre"]),
        helper.make_node("Sub", [f"{tag}centre", total], [out]),
    ]


def _dot(a: str, b: str, out: str) -> list[Any]:
    """``out = sum(a * b)``, kept as a 1 x 1 x 1 tensor."""
    return [
        helper.make_node("Mul", [a, b], [f"{out}p"]),
        helper.make_node("ReduceSum", [f"{out}p"], [out], keepdims=1),
    ]


def _axpy(x: str, alpha: str, y: str, out: str, sign: str = "Add") -> list[Any]:
    """``out = x + alpha y`` (or ``x - alpha y``)."""
    return [
        helper.make_node("Mul", [alpha, y], [f"{out}m"]),
        helper.make_node(sign, [x, f"{out}m"], [out]),
    ]


def bicgstab_model(dims: Sequence[int]) -> Any:
    """One BiCGStab iteration on a 7-point stencil, in float16, a z-column per PE (the
    tensors are ``[z, x, y]``: x over the mesh rows, y over its columns)."""
    fields = ("x", "r", "rhat", "p", "v")
    scalars = ("rho_old", "alpha", "omega")
    nodes = [
        *_dot("rhat", "r", "rho"),
        helper.make_node("Div", ["rho", "rho_old"], ["ratio"]),
        helper.make_node("Div", ["alpha", "omega"], ["ao"]),
        helper.make_node("Mul", ["ratio", "ao"], ["beta"]),
        *_axpy("p", "omega", "v", "pv", "Sub"),
        *_axpy("r", "beta", "pv", "p1"),
        *_stencil_nodes("p1", "v1", dims, "a"),
        *_dot("rhat", "v1", "rv"),
        helper.make_node("Div", ["rho", "rv"], ["alpha1"]),
        *_axpy("r", "alpha1", "v1", "s", "Sub"),
        *_stencil_nodes("s", "t", dims, "b"),
        *_dot("t", "s", "ts"),
        *_dot("t", "t", "tt"),
        helper.make_node("Div", ["ts", "tt"], ["omega1"]),
        *_axpy("x", "alpha1", "p1", "xa"),
        *_axpy("xa", "omega1", "s", "x1"),
        *_axpy("s", "omega1", "t", "r1", "Sub"),
    ]
    inputs = [_value(f, dims, "float16") for f in fields]
    inputs += [_value(s, (1, 1, 1), "float16") for s in scalars]
    outputs = [_value(f, dims, "float16") for f in ("x1", "r1", "p1", "v1")]
    outputs.append(_value("rho", (1, 1, 1), "float16"))
    return _model(nodes, inputs, outputs)


def bicgstab_rows() -> list[Row]:
    """Rocki et al.'s BiCGStab at about a third of peak."""
    _, rows, cols = STENCIL
    artifact = cgc.compile(
        bicgstab_model(STENCIL), mode="weight_streaming", target=f"mesh{rows}x{cols}"
    )
    kernels = _all_kernels(artifact)
    cycles = kernels_cycles(kernels)
    flops = sum(k.flops for k in kernels)
    target = get_target(f"mesh{rows}x{cols}")
    eff = efficiency(flops, cycles, rows * cols, target, "float16")
    worst = sorted(kernels, key=lambda k: -k.cycles)[:3]
    arithmetic = sum(k.plan.cost.compute_cycles for k in kernels)
    return [
        Row(
            "BiCGStab, 7-point stencil, 600 x 595 x 1536 on CS-1: 0.86 PF",
            "S17",
            "about 1/3 of peak",
            eff,
            "of FP16 peak",
            f"one iteration (two stencils as shifted Slices, four dot products, six AXPYs) in "
            f"float16 on 600 x 595 PEs of a WSE-2: {flops:.3g} FLOPs in {cycles:,.0f} "
            f"kernel cycles, arithmetic {arithmetic:,.0f}; the dearest kernels: "
            + ", ".join(f"{k.name} {k.cycles:,.0f}" for k in worst)
            + f" cycles. The arithmetic is {arithmetic / cycles:.0%} of the time: cgc runs the "
            "stencil and the AXPYs as separate elementwise ops of one FLOP an element, at most "
            "half the FMAC peak, where a hand-written kernel fuses them into FMACs; the rest "
            "is the dot products' AllReduces, the scalars' multicasts and the one-hop shifts",
            reference=1 / 3,
        )
    ]


# --------------------------------------------------------------------------- the page


def _verdict(row: Row) -> str:
    agrees = row.agrees
    if agrees is None:
        return "n/a"
    if row.band is not None:
        return "in band" if agrees else "**out of band**"
    return "within 15 %" if agrees else "**outside 15 %**"


def row_line(row: Row) -> str:
    """A table line: figure, source, published, cgc, ratio, verdict, why."""
    ratio = "" if row.ratio is None else f"{row.ratio:.2f}"
    predicted = "not modelled" if row.predicted is None else f"{row.predicted:.3g} {row.unit}"
    cells = [row.figure, row.source, row.published, predicted,
             ratio, _verdict(row), row.why]  # fmt: skip
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def _curve_lines(gemm: list[dict[str, Any]], reduce: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## GEMM efficiency against PE count (WaferLLM's figure, float16)",
        "",
        f"{'x'.join(map(str, GEMM))} on P x P PEs: the efficiency of each algorithm forced, "
        "and of the kernel cgc's planner picks for the compiled MatMul (pipelined mode, "
        "operands delivered by the program).",
        "",
        "| P | SUMMA | Cannon | MeshGEMM | cgc picks | compiled | what binds (SUMMA / Cannon / "
        "MeshGEMM, `Plan.detail['binds']`) |",
        "|---:|---:|---:|---:|---|---:|---|",
    ]
    lines += [
        f"| {p['side']} | {p['summa']:.1%} | {p['cannon']:.1%} | {p['meshgemm']:.1%} | "
        f"{p['chosen']} | {p['compiled']:.1%} | "
        + " / ".join(p[f"{a}_binds"] for a in ALGORITHMS)
        + " |"
        for p in gemm
    ]
    lines += [
        "",
        "## AllReduce against the mesh diameter (Rocki et al.)",
        "",
        "| mesh | kernel cycles | diameters (W + H) | kernels |",
        "|---|---:|---:|---|",
    ]
    lines += [
        f"| {p['mesh']} | {p['cycles']:,.0f} | {p['diameters']:.2f} | {p['parts']} |"
        for p in reduce
    ]
    return lines


def _issue_lines(check: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## The issue's check: the float32 GEMM in both modes",
        "",
        f"{'x'.join(map(str, GEMM))} float32 compiled for meshPxP, B a graph input or a "
        "weight: the kernels (pipelined / weight streaming), the pipelined one's efficiency of "
        "FP32 peak, and the cycles in each mode.",
        "",
        "| B | P | kernels | efficiency | pipelined cycles | weight-streaming cycles |",
        "|---|---:|---|---:|---:|---:|",
    ]
    lines += [
        f"| {c['b']} | {c['side']} | {c['algorithm']} / {c['streamed_algorithm']} | "
        f"{c['efficiency']:.1%} | {c['pipelined']:,.0f} | {c['weight_streaming']:,.0f} |"
        for c in check
    ]
    same = (
        "B an input: both modes plan one kernel on the whole mesh, equal cycles expected. B a "
        "weight: the weight-streaming kernel and the pipelined stream-resident one share their "
        "dataflow (B's chunks multicast down the PE columns, partial sums along the rows, "
        "`plan_matmul._Chunks`); they differ in where the chunks come from, MemoryX through the "
        "wafer's edge or the PEs that hold them, and where neither source binds (the stream "
        "from MemoryX keeps ahead of the arithmetic) their cycles agree."
    )
    return [*lines, "", same]


MODEL_NOTES = [
    "",
    "## What the model counts, and what it leaves out",
    "",
    "- **SRAM ports**: a PE reads two 32-bit words and writes one a cycle (S11). A float32 "
    "FMAC or elementwise op takes two reads and a write, so the FP32 rate (one a cycle) is "
    "the port limit. Float16 runs at SIMD-4 (four FMACs a cycle), which needs the 64-bit "
    "ports of the Hot Chips description (S18); with the SDK's 32-bit ports it would run "
    "at half that. The reference's advice, followed here, is SIMD-4 as the peak.",
    "- **Ramps and routers**: a link moves a wavelet a cycle and a hop costs a cycle; a "
    "ramp moves a wavelet a cycle each way (counted as bandwidth), with no latency of its "
    "own (the T_R row above).",
    "- **Contention**: every kernel's flows are routed link by link (``traffic.Routes``) "
    "and the busiest link, ramp in and ramp out set a transfer's time; in pipelined mode "
    "the tensors between layers add up on the links they share (``traffic.busiest_links``).",
    "- **Synchronisation**: SUMMA's steps run in panels of up to six roots, each with its "
    "own colors, and pay the broadcast's flight once a panel; MeshGEMM and Cannon pay "
    "their shift's flight every step; a reduction's two chains meet at the middle PE of "
    "each line.",
]
"""The page's notes on the terms the model counts."""


def render(rows: list[Row], extra: list[str]) -> str:
    """The page: the figures' table, then the sections of ``extra``."""
    misses = [row.figure for row in rows if row.agrees is False]
    absent = sum(row.agrees is None for row in rows)
    unmodelled = f", {absent} not modelled" if absent else ""
    lines = [
        "# Fidelity: cgc's simulator against published wafer measurements",
        "",
        "Generated by `python benchmarks/fidelity.py` (timing only, under a minute on 2 cores);",
        "`tests/test_fidelity.py` checks its set-ups. Sources: the project's",
        "`reference/wse-hardware.md`, ids of its §15 (S6 Cerebras SwarmX, S10 csl-examples,",
        "S12/S13 SDK docs, S17 Rocki et al. SC'20, S20 WaferLLM OSDI'25, S22 Luczynski et al.",
        "HPDC'24). A band passes when cgc lands in it; a number, when cgc is within 15 % of it.",
        "Times are the kernels' cycles on the wafer (without host I/O), at cgc's 850 MHz.",
        "",
        f"{sum(row.agrees is True for row in rows)} of {len(rows)} figures agree"
        f"{unmodelled}; disagreeing: {'; '.join(misses) or 'none'}.",
        "",
        "| figure | source | published | cgc | ratio | verdict | set-up and reason |",
        "|---|---|---|---:|---:|---|---|",
        *(row_line(row) for row in rows),
        *extra,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    start = time.perf_counter()
    gemm, curve = gemm_rows()
    reduce, reduce_curve = allreduce_rows()
    rows = [*gemm, *gemv_rows(), *fabric_rows(), *reduce, *bicgstab_rows()]
    extra = [
        *MODEL_NOTES,
        *_curve_lines(curve, reduce_curve),
        *_issue_lines(issue_check()),
        *sensitivity_lines(sensitivity()),
    ]
    page = render(rows, extra)
    DOC.write_text(page)
    print(page)
    print(f"fidelity: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
