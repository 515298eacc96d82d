"""The folded layout: leading axes flattened into the matrix rows, distributed over the PEs.

Its traffic, counted by ``flows`` on digits, equals the per-element oracle
(``traffic.gather_traffic``) for every regular movement between folded and unfolded layouts;
kernels keep a folded operand's layout where that is free, and a run gives the same numbers.
"""

from __future__ import annotations

import dataclasses
import tracemalloc
from math import prod

import numpy as np
import pytest
from conftest import runs_exactly_and_times_alike
from test_flows import (
    IM2COL,
    oracle,
    patches_shape,
    random_factorization,
    random_layout,
    random_shape,
)
from test_flows import check as check_layouts
from test_kernels import OTHER, close, execute

import cgc
from cgc.frontends import zoo
from cgc.machine import plans, reference
from cgc.machine.hardware.target import Target, get_target
from cgc.machine.movement import flows, index_maps
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import NO_TRAFFIC, gather_traffic, scattered_traffic
from cgc.machine.plans import STREAM, WAFER, Operand, Plan
from cgc.machine.timing.cost import Sram, Timing

SEEDS = range(30)


@pytest.fixture(autouse=True)
def count_afresh():
    flows._exact_traffic.cache_clear()
    yield
    flows._exact_traffic.cache_clear()


def fields(t):
    return dataclasses.astuple(t)


def check(rng, name, attrs, shapes, result):
    """The engine equals the oracle on random folded and unfolded layouts."""
    check_layouts(rng, name, attrs, shapes, result, fold=None)


# --------------------------------------------------------------------------- the layout


def test_a_fold_that_changes_nothing_is_no_fold():
    rect = (0, 0, 8, 8)
    for shape in [(6, 4), (4,), (), (1, 6, 4), (1, 1, 6, 4)]:
        assert Layout.on(shape, "float32", rect, fold=True) == Layout.on(shape, "float32", rect)
    folded = Layout.on((2, 3, 4), "float32", rect, fold=True)
    assert folded.fold and folded != Layout.on((2, 3, 4), "float32", rect)
    assert (folded.batch, folded.rows, folded.cols) == ((), 6, 4)
    assert folded.tile_shape() == (6, 4, 1, 1)


@pytest.mark.parametrize("seed", range(10))
def test_folded_tiles_hold_the_flattened_rows(seed):
    """Every property the runtime reads follows the folded matrix: the PE of an element, the
    padding mask, the bytes a PE holds."""
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(2, 4)), *random_shape(rng, 1, 3, 5))
    lay = random_layout(rng, shape, "float32", True)
    flat = np.arange(prod(shape))
    rows = flat // shape[-1]
    assert np.array_equal(lay.row_pe(rows), lay.row0 + rows // lay.rt)
    mask = np.broadcast_to(lay.valid_mask(), lay.tile_shape())
    assert int(mask.sum()) == lay.size
    assert lay.tile_bytes == lay.rt * lay.ct * lay.itemsize


# --------------------------------------------------------------------------- the oracle


@pytest.mark.parametrize("seed", SEEDS)
def test_reshape(seed):
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, 2, 5, 4)
    result = random_factorization(rng, prod(shape), int(rng.integers(1, 5)))
    check(rng, "reshape", {}, [shape], result)


@pytest.mark.parametrize(
    ("shape", "result"),
    [
        ((1, 24, 5), (2, 3, 4, 5)),
        ((2, 3, 4, 5), (1, 24, 5)),
        ((6, 4, 8), (24, 8)),
        ((4, 6), (2, 3, 4)),
    ],
)
@pytest.mark.parametrize("seed", range(4))
def test_matmul_and_convolution_reshapes(shape, result, seed):
    check(np.random.default_rng(seed), "reshape", {}, [shape], result)


@pytest.mark.parametrize("seed", SEEDS)
def test_relayouts_between_folded_and_unfolded(seed):
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, 3, 5, 4)
    src = random_layout(rng, shape, "float32", None)
    dst = random_layout(rng, shape, "float32", not src.fold)
    want = gather_traffic(dst, [(src, np.arange(src.size))])
    assert fields(flows.regrid_traffic(src, dst)) == pytest.approx(fields(want))


@pytest.mark.parametrize("seed", SEEDS)
def test_transpose(seed):
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, 3, 5, 4)
    perm = rng.permutation(len(shape)).tolist()
    check(rng, "transpose", {"perm": perm}, [shape], tuple(shape[p] for p in perm))


@pytest.mark.parametrize("seed", SEEDS)
def test_slice(seed):
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, 3, 4, 6)
    starts = [int(rng.integers(-n, n + 1)) for n in shape]
    limits = [int(rng.integers(-n - 1, n + 2)) for n in shape]
    strides = [int(rng.choice([-2, -1, 1, 2, 3])) for _ in shape]
    attrs = {"starts": starts, "limits": limits, "strides": strides}
    result = reference.slice_array(np.zeros(shape), starts, limits, strides).shape
    check(rng, "slice", attrs, [shape], result)


@pytest.mark.parametrize("seed", SEEDS)
def test_concat(seed):
    rng = np.random.default_rng(seed)
    base = random_shape(rng, 3, 4, 4)
    axis = int(rng.integers(len(base)))
    shapes = [
        (*base[:axis], int(rng.integers(1, 4)), *base[axis + 1 :])
        for _ in range(int(rng.integers(2, 4)))
    ]
    result = (*base[:axis], sum(s[axis] for s in shapes), *base[axis + 1 :])
    check(rng, "concat", {"axis": axis}, shapes, result)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
@pytest.mark.parametrize("seed", range(8))
def test_pad(mode, seed):
    """Exact for a constant pad; a reflecting or edge pad of a folded layout's leading axes
    read from a folded layout is not one coordinate of digits: its traffic is estimated."""
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, 3, 4, 4)
    low = [int(rng.integers(0, 3)) for _ in shape]
    high = [int(rng.integers(0, 3)) for _ in shape]
    attrs = {"low": low, "high": high, "value": 0.0, "mode": mode}
    result = tuple(n + a + b for n, a, b in zip(shape, low, high, strict=True))
    src = random_layout(rng, shape, "float32", None)
    out = random_layout(rng, result, "float32", None)
    got = flows.movement_traffic("pad", attrs, [src], out)
    if mode != "constant" and any(low[:-1] + high[:-1]) and src.fold:
        assert got == scattered_traffic(src, out, src.size)
    else:
        assert fields(got) == pytest.approx(fields(oracle("pad", attrs, [src], out)))


@pytest.mark.parametrize("seed", SEEDS)
def test_reverse(seed):
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, 3, 4, 5)
    chosen = [a for a in range(len(shape)) if rng.random() < 0.5]
    check(rng, "reverse", {"axes": chosen}, [shape], shape)


@pytest.mark.parametrize("table", [[2, 3, 4], [4, 2, 0], [-1, -1, 0, 1, 2, -1], [-1, 5, 3, 1, -1]])
def test_tables_of_progressions_are_affine(table):
    """A slice's, a reversal's or a constant pad's table is an ``Affine``, -1s and all."""
    lookup = index_maps.Lookup(0, np.array(table))
    affine = index_maps.as_affine(lookup)
    assert affine is not None
    values = {0: np.arange(len(table))}
    assert np.array_equal(affine(values), lookup(values))


@pytest.mark.parametrize("table", [[1, 0, 1], [0, 0, 1], [-1, 1, 2, -1], [0, -1, 1]])
def test_other_tables_are_not(table):
    assert index_maps.as_affine(index_maps.Lookup(0, np.array(table))) is None


# --------------------------------------------------------------------------- the kernels

RECT = (0, 0, 6, 6)


def folded(shape, dtype="float32", rect=OTHER):
    return Layout.on(shape, dtype, rect, fold=True)


@pytest.mark.parametrize(
    ("other", "stays"),
    [((2, 3, 4), True), ((2, 3, 1), True), ((4,), True), ((1, 4), True), ((), True),
     ((3, 4), False), ((1, 3, 4), False)],
)  # fmt: skip
def test_elementwise_keeps_a_folded_operand_and_aligns_broadcasts(other, stays):
    """A folded operand of the result's shape keeps the result folded where every other
    operand's tiles line up with it; the numbers are numpy's, padding poisoned."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 3, 4)), rng.standard_normal(other)
    x, y = x.astype(np.float32), y.astype(np.float32)
    result, plan = execute(
        "add", [x, y], {}, (2, 3, 4), "float32", RECT, layouts={0: folded(x.shape)}
    )
    close(result, x + y)
    assert plan.outputs[0].fold == stays
    # a folded operand that does not stay folded is relaid, and that costs its arrival
    assert (plan.cost.arrival_cycles > 0) == (not stays or plan.inputs[0] != folded(x.shape))


def test_an_elementwise_chain_stays_folded_and_free_of_arrivals():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    on_rect = folded(x.shape, rect=RECT)
    result, plan = execute("exp", [x], {}, x.shape, "float32", RECT, layouts={0: on_rect})
    close(result, np.exp(x))
    assert plan.outputs[0] == on_rect and plan.cost.arrival_cycles == 0


@pytest.mark.parametrize("source", [WAFER, STREAM])
def test_matmul_with_unbatched_weights_folds_the_rows(source):
    """A linear layer's rows are all its samples' tokens: A and the result fold, so the rows
    of every sample spread over the mesh rows."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    b = rng.standard_normal((5, 6)).astype(np.float32)
    result, plan = execute("matmul", [a, b], {}, (3, 4, 6), "float32", RECT, sources={1: source})
    close(result, a @ b)
    out = plan.outputs[0]
    assert out.fold and out.rows == 12 and out.h == 6
    assert plan.inputs[0].fold and plan.inputs[0].h == out.h


def test_batched_matmul_stays_unfolded_and_relays_a_folded_operand():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    layouts = {0: folded(a.shape, rect=RECT)}
    result, plan = execute("matmul", [a, b], {}, (2, 3, 4, 4), "float32", RECT, layouts=layouts)
    close(result, a @ b)
    assert not plan.outputs[0].fold and not plan.inputs[0].fold
    unfolded = Layout.on(a.shape, "float32", RECT)
    relaid = flows.regrid_traffic(layouts[0], unfolded)
    assert relaid.cycles > 0
    _, stays = execute("matmul", [a, b], {}, (2, 3, 4, 4), "float32", RECT, layouts={0: unfolded})
    assert plan.cost.arrival_cycles > stays.cost.arrival_cycles


@pytest.mark.parametrize(("axes", "stays"), [([2], True), ([1], False), ([1, 2], False)])
def test_last_axis_reductions_keep_a_folded_operand(axes, stays):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    attrs = {"axes": axes, "keepdims": True}
    on_rect = folded(x.shape, rect=RECT)
    result, plan = execute("reduce_sum", [x], attrs, shape, "float32", RECT, layouts={0: on_rect})
    close(result, x.sum(axis=tuple(axes), keepdims=True))
    assert plan.outputs[0].fold == stays and (plan.inputs[0] == on_rect) == stays


@pytest.mark.parametrize(("axis", "stays"), [(2, True), (1, False)])
def test_topk_keeps_a_folded_operand_for_the_last_axis(axis, stays):
    """Top-k of a decoder's logits, folded by their matmul: along the last axis every PE
    row's rows are whole rows, so nothing is relaid and no PE row is empty; along another
    axis the operand is relaid unfolded first, as for a reduction."""
    shape, rect, k = (4, 8, 16), (0, 0, 16, 16), 3
    out = tuple(k if i == axis else d for i, d in enumerate(shape))
    target = get_target("mesh16x16")

    def plan(layout: Layout) -> Plan:
        operand = Operand(shape, "float32", WAFER, layout)
        results = [(out, "float32"), (out, "int64")]
        return plans.plan("topk", target, rect, [operand], {"axis": axis}, results)

    on_rect = Layout.on(shape, "float32", rect, fold=True)
    folded_plan, plain = plan(on_rect), plan(Layout.on(shape, "float32", rect))
    assert all(layout.fold == stays for layout in folded_plan.outputs)
    assert (folded_plan.inputs[0] == on_rect) == stays
    assert (folded_plan.cost.arrival_cycles > plain.cost.arrival_cycles) == (not stays)
    if stays:
        assert folded_plan.cost.cycles < plain.cost.cycles


@pytest.mark.parametrize(
    ("src", "fold", "result"),
    [((1, 24, 5), False, (2, 3, 4, 5)), ((12, 5), False, (3, 4, 5)), ((2, 3, 4, 5), True, (24, 5))],
)
def test_reshapes_that_folding_makes_free(src, fold, result):
    """The rows of a matmul back to samples' tokens or images' pixels: folded, nothing moves."""
    x = np.arange(prod(src), dtype=np.float32).reshape(src)
    layout = Layout.on(src, "float32", RECT, fold=fold)
    got, plan = execute("reshape", [x], {}, result, "float32", RECT, layouts={0: layout})
    close(got, x.reshape(result))
    assert plan.cost.traffic == NO_TRAFFIC
    assert plan.outputs[0].fold == (len(result) > 2)


def test_folded_layouts_in_unsafe_reads_are_relaid():
    """A tile's repeats of a folded operand are not one coordinate of digits: the operand is
    relaid unfolded first, and the movement stays exact."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    layouts = {0: folded(x.shape, rect=RECT)}
    got, plan = execute(
        "tile", [x], {"repeats": [2, 1, 1]}, (4, 3, 4), "float32", RECT, layouts=layouts
    )
    close(got, np.tile(x, (2, 1, 1)))
    assert not plan.inputs[0].fold and plan.cost.arrival_cycles > 0


def test_im2col_of_a_folded_image_reads_halos():
    """Patches of a folded channels-last image follow its pixels: every PE reads its own block
    of the image and a halo, where the unfolded image spreads its rows over the mesh."""
    image = (2, 16, 16, 8)
    attrs = {"kernel": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1],
             "channels_last": True, "group": 1}  # fmt: skip
    x = np.random.default_rng(5).standard_normal(image).astype(np.float32)
    shape = patches_shape(image, attrs)
    costs = {}
    for fold in (False, True):
        layouts = {0: Layout.on(image, "float32", RECT, fold=fold)}
        got, plan = execute("im2col", [x], attrs, shape, "float32", RECT, layouts=layouts)
        close(got, reference.evaluate("im2col", attrs, [x], shape, "float32"))
        costs[fold] = plan.cost.traffic
    assert costs[True].max_link < costs[False].max_link
    assert costs[True].wavelet_hops < costs[False].wavelet_hops


WSE2 = get_target("wse2")


@pytest.mark.parametrize(
    ("name", "shape", "attrs", "result"),
    [
        ("reshape", (24, 2048, 12288), {}, (24, 2048, 96, 128)),
        ("transpose", (24, 2048, 96, 128), {"perm": [0, 2, 1, 3]}, (24, 96, 2048, 128)),
        ("im2col", (64, 56, 56, 256), IM2COL, (1, 64 * 56 * 56, 256 * 9)),
        ("reshape", (1 << 24, 2048, 768), {}, (1 << 24, 2048, 12, 64)),
        ("add", (1 << 24, 2048, 768), {}, (1 << 24, 2048, 768)),
        ("reduce_mean", (1 << 24, 2048, 768), {"axes": [1], "keepdims": True}, (1 << 24, 1, 768)),
    ],
)
def test_gpt_sized_folded_plans_cost_no_element_count(name, shape, attrs, result):
    """Planning from a folded operand (relaid or not) of billions of elements holds nothing
    of their size, and is exact or estimated without listing them."""
    layout = Layout.on(shape, "float32", WSE2.whole, fold=True)
    operand = Operand(shape, "float32", WAFER, layout)
    operands = [operand, Operand(shape, "float32", WAFER, Layout.on(shape, "float32", WSE2.whole))]
    tracemalloc.start()
    try:
        plan = plans.plan(name, WSE2, WSE2.whole, operands[: 2 if name == "add" else 1], attrs,
                          [(result, "float32")])  # fmt: skip
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200e6
    assert plan.cost.traffic.wavelet_hops > 0 and plan.cost.traffic.max_hops > 0


# --------------------------------------------------------------------------- whole models

MODELS = {
    "decoder": lambda: zoo.decoder(blocks=1, seq=8, width=16, heads=2),
    "resnet": lambda: zoo.resnet(channels=3, size=8, width=8, classes=4),
}


def folded_outputs(art) -> int:
    """How many kernel results of the placed layers' plans are folded."""
    program, target = art.program, Target.from_json(art.manifest["target"])
    count = 0
    for index, layer in enumerate(program.layers):
        timing = Timing(program, target, Sram(target, False, layer.rect), deliver=True)
        timing.enter_layer(index, layer.rect)
        for position in program.layer_spans[index][1:]:
            plan = timing.step(program.instructions[position])
            if isinstance(plan, Plan):
                count += sum(out.fold for out in plan.outputs)
    return count


@pytest.mark.parametrize("mode", ["pipelined", "weight_streaming"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_folded_models_run_exactly_and_time_alike(name, mode):
    """Folded activations give onnxruntime's numbers, and a timing-only run the same time."""
    onnx_model = MODELS[name]()
    art = cgc.compile(onnx_model, mode=mode, target="mesh8x8", batch_size=4)
    assert folded_outputs(art) > 0
    runs_exactly_and_times_alike(onnx_model, art)
