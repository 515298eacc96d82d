"""The IR in the machine's terms (cgc.dialects.lowering) and the machine's cost API on it.

A layer's work, asked about alone, costs exactly what the same layer costs in the joined
program the artifact holds; the layer graph of the works is the joined program's; the cost
splits into compute, data movement and arrival, which add up.
"""

from __future__ import annotations

import dataclasses

import pytest

from cgc.compiler.driver import compile_model
from cgc.compiler.training import Training
from cgc.dialects import parse_module
from cgc.dialects.ir import main_function, module_target
from cgc.dialects.lowering import layer_graph, layer_works, lower
from cgc.frontends import zoo
from cgc.machine import LayerCosts, get_target, layer_cost, program_costs
from cgc.machine.program.bytecode import Opcode

CASES = {
    "mlp-pipelined": lambda: compile_model(
        zoo.MODELS["mlp"](), mode="pipelined", target="mesh8x8", batch_size=4
    ),
    "transformer-pipelined": lambda: compile_model(
        zoo.MODELS["transformer"](), mode="pipelined", target="mesh16x16", batch_size=2
    ),
    "cnn-streaming": lambda: compile_model(
        zoo.MODELS["cnn"](), mode="weight_streaming", target="mesh8x8", batch_size=2
    ),
    "training": lambda: compile_model(
        zoo.MODELS["mlp_train"](),
        mode="weight_streaming",
        target="mesh8x8",
        batch_size=4,
        num_csx=2,
        training=Training(optimizer="adam", lr=0.01),
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def compiled(request):
    artifact = CASES[request.param]()
    module = parse_module(artifact.ir)
    target = module_target(module)
    works = layer_works(main_function(module), target.whole)
    return artifact, module, target, works


def test_the_joined_works_are_the_artifacts_program(compiled):
    artifact, module, target, works = compiled
    assert lower(module, target.whole).encode() == artifact.program.encode()
    assert [w.layer.layer_name.data for w in works] == [i.name for i in artifact.program.layers]


def test_a_work_costs_what_its_layer_costs_in_the_program(compiled):
    artifact, _, target, works = compiled
    program = artifact.program
    for index, work in enumerate(works):
        rect = program.layers[index].rect
        alone = layer_cost(work.program, 0, rect, target)
        joined = layer_cost(program, index, rect, target)
        # what other layers read of a layer's results is known only in the whole program
        assert alone == dataclasses.replace(joined, activation_out_bytes=0), work.layer


def test_works_read_from_other_layers_what_the_program_routes(compiled):
    artifact, _, _, works = compiled
    edges = sorted(layer_graph(works).edges(keys=True))
    program = artifact.program
    want = sorted(
        (source, consumer, register)
        for consumer, inputs in enumerate(program.layer_inputs)
        for register, source in inputs.items()
    )
    assert edges == want
    for work in works:  # a work defines every register it frees
        freed = {
            r for i in work.program.instructions if i.opcode == Opcode.FREE for r in i.operands
        }
        assert freed <= set(range(len(work.program.registers)))


def test_cost_parts_add_up(compiled):
    artifact, _, target, _ = compiled
    for cost in program_costs(artifact.program, target):
        parts = (cost.compute_cycles, cost.movement_cycles, cost.arrival_cycles)
        assert all(p >= -1e-9 * cost.cycles for p in parts), cost
        assert sum(parts) == pytest.approx(cost.cycles, rel=1e-12)
        assert cost.compute_cycles > 0 or cost.flops == 0
        assert 0 <= cost.link_wavelets <= cost.wavelet_hops


def test_the_parts_say_where_time_goes():
    """A matmul that streams its weights: the weights' arrival through the edge is counted
    as arrival, its arithmetic as compute; the same matmul with more columns computes for
    fewer cycles."""
    model = zoo.mlp(in_features=256, hidden=(256,), classes=8)
    artifact = compile_model(model, mode="weight_streaming", target="mesh8x8", batch_size=8)
    target = get_target("mesh8x8")
    first = program_costs(artifact.program, target)[0]
    assert first.stream_in_bytes > 0 and first.arrival_cycles > 0 and first.compute_cycles > 0
    costs = LayerCosts(target)
    narrow = costs(artifact.program, 0, (0, 0, 2, 8))
    wide = costs(artifact.program, 0, (0, 0, 8, 8))
    assert wide.compute_cycles < narrow.compute_cycles
    assert costs(artifact.program, 0, (0, 0, 8, 8)) is wide  # remembered
