"""cgc.machine.movement.flows: the traffic of every regular data movement, counted by digits, equals
the per-element oracle (traffic.gather_traffic on index arrays), and costs nothing like the
element count on GPT-3-sized tensors."""

from __future__ import annotations

import dataclasses
import tracemalloc
from math import prod

import numpy as np
import pytest

from cgc.machine import plans, reference
from cgc.machine.hardware.target import get_target
from cgc.machine.movement import flow_counts, flow_factors, flows, index_maps
from cgc.machine.movement.layout import Layout, grid_extent, matrix_dims
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic, gather_traffic, scattered_traffic
from cgc.machine.plans import WAFER, Operand
from cgc.machine.plans.movement import most_taps, patch_taps

SEEDS = range(40)
DTYPES = ("float32", "float16", "int32")
PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


@pytest.fixture(autouse=True)
def count_afresh():
    """Some tests change the engine's limits or watch it work: every test counts afresh, and
    leaves nothing remembered."""
    flows._exact_traffic.cache_clear()
    yield
    flows._exact_traffic.cache_clear()


def fields(t: Traffic) -> tuple:
    return dataclasses.astuple(t)


def oracle(name, attrs, sources, out) -> Traffic:
    """The traffic the old way: the op applied to arrays of element indices, every flow
    routed by ``gather_traffic``."""
    if name == "reshape":
        return gather_traffic(out, [(sources[0], np.arange(sources[0].size))])
    if name in index_maps.POOLS:
        src = sources[0]
        taps = reference.pool_windows(np.arange(src.size).reshape(src.shape), attrs, -1)
        return gather_traffic(out, [(src, taps)])
    if name == "col2im":
        return gather_traffic(out, [(sources[0], patch_taps(out.shape, attrs))])
    index_attrs = {**attrs, "fill": -1, "value": -1}
    maps = []
    for k, src in enumerate(sources):
        ids = [
            np.arange(s.size).reshape(s.shape) if i == k else np.full(s.shape, -1)
            for i, s in enumerate(sources)
        ]
        if name == "one_hot":
            index = np.broadcast_to(ids[0][..., None], out.shape)
        else:
            index = reference.movement(name, index_attrs, ids, out.shape)
        maps.append((src, np.asarray(index)))
    return gather_traffic(out, maps)


def random_layout(rng, shape, dtype, fold: bool | None = False):
    """A random grid for ``shape``, folded as ``fold`` says, or at random where it is None."""
    fold = bool(rng.random() < 0.6) if fold is None else fold
    _, rows, cols = matrix_dims(shape, fold)
    return Layout(
        tuple(int(d) for d in shape),
        dtype,
        int(rng.integers(0, 5)),
        int(rng.integers(0, 5)),
        grid_extent(rows, int(rng.integers(1, 6))),
        grid_extent(cols, int(rng.integers(1, 6))),
        fold,
    )


def random_shape(rng, low_rank, high_rank, high=5):
    return tuple(
        int(d) for d in rng.integers(1, high + 1, int(rng.integers(low_rank, high_rank + 1)))
    )


def check(rng, name, attrs, shapes, result, fold: bool | None = False):
    """The engine equals the oracle with random layouts of ``shapes`` and ``result`` (folded
    at random where ``fold`` is None)."""
    dtype = DTYPES[int(rng.integers(len(DTYPES)))]
    sources = [random_layout(rng, s, dtype, fold) for s in shapes]
    out = random_layout(rng, result, dtype, fold)
    want = oracle(name, attrs, sources, out)
    got = flows.movement_traffic(name, attrs, sources, out)
    assert fields(got) == pytest.approx(fields(want)), (name, attrs, sources, out)


# --------------------------------------------------------------------------- movement


def prime_factors(n):
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors


def random_factorization(rng, size, rank):
    """A random shape of ``rank`` axes holding ``size`` elements: the prime factors of
    ``size`` dealt out at random (the two shapes of a reshape then often have no common
    refinement)."""
    shape = [1] * rank
    for f in rng.permutation(prime_factors(size)).tolist() if rank else []:
        shape[int(rng.integers(rank))] *= f
    return tuple(shape)


@pytest.mark.parametrize("seed", SEEDS)
def test_reshape(seed):
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, 0, 5, 4)
    rank = int(rng.integers(0 if prod(shape) == 1 else 1, 6))
    check(rng, "reshape", {}, [shape], random_factorization(rng, prod(shape), rank))


@pytest.mark.parametrize(
    ("shape", "result"),
    [
        ((2, 6, 12), (2, 6, 3, 4)),
        ((2, 6, 3, 4), (2, 6, 12)),
        ((2, 6, 12), (12, 12)),
        ((12, 12), (2, 6, 12)),
        ((3, 4, 5), (4, 3, 5)),
        ((2, 3), (3, 2)),
        ((6, 10), (4, 15)),
    ],
)
@pytest.mark.parametrize("seed", range(3))
def test_transformer_and_irregular_reshapes(shape, result, seed):
    check(np.random.default_rng(seed), "reshape", {}, [shape], result)


@pytest.mark.parametrize("seed", SEEDS)
def test_transpose(seed):
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, 0, 5, 4)
    perm = rng.permutation(len(shape)).tolist()
    check(rng, "transpose", {"perm": perm}, [shape], tuple(shape[p] for p in perm))


@pytest.mark.parametrize("seed", SEEDS)
def test_broadcast_to(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) if rng.random() < 0.6 else 1 for d in random_shape(rng, 0, 3, 4))
    grown = tuple(int(rng.integers(1, 4)) if d == 1 else d for d in shape)
    result = random_shape(rng, 0, 2, 3) + grown
    check(rng, "broadcast_to", {}, [shape], result)


@pytest.mark.parametrize("seed", SEEDS)
def test_concat(seed):
    rng = np.random.default_rng(seed)
    base = random_shape(rng, 1, 4, 4)
    axis = int(rng.integers(len(base)))
    shapes = [
        (*base[:axis], int(rng.integers(1, 4)), *base[axis + 1 :])
        for _ in range(int(rng.integers(2, 4)))
    ]
    result = (*base[:axis], sum(s[axis] for s in shapes), *base[axis + 1 :])
    given_axis = axis - len(base) if rng.random() < 0.5 else axis
    check(rng, "concat", {"axis": given_axis}, shapes, result)


@pytest.mark.parametrize("seed", SEEDS)
def test_slice(seed):
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, 1, 4, 6)
    starts = [int(rng.integers(-n, n + 1)) for n in shape]
    limits = [int(rng.integers(-n - 1, n + 2)) for n in shape]
    strides = [int(rng.choice([-2, -1, 1, 2, 3])) for _ in shape]
    attrs = {"starts": starts, "limits": limits, "strides": strides}
    result = reference.slice_array(np.zeros(shape), starts, limits, strides).shape
    check(rng, "slice", attrs, [shape], result)


@pytest.mark.parametrize("mode", PAD_MODES)
@pytest.mark.parametrize("seed", range(5))
def test_pad(mode, seed):
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, 1, 4, 4)
    low = [int(rng.integers(0, 3)) for _ in shape]
    high = [int(rng.integers(0, 3)) for _ in shape]
    attrs = {"low": low, "high": high, "value": 0.0, "mode": mode}
    result = tuple(n + a + b for n, a, b in zip(shape, low, high, strict=True))
    check(rng, "pad", attrs, [shape], result)


@pytest.mark.parametrize("seed", SEEDS)
def test_reverse(seed):
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, 1, 4, 5)
    axes = [a - len(shape) if rng.random() < 0.5 else a for a in range(len(shape))]
    chosen = [a for a in axes if rng.random() < 0.5]
    check(rng, "reverse", {"axes": chosen}, [shape], shape)


@pytest.mark.parametrize("seed", SEEDS)
def test_tile(seed):
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, 0, 3, 4)
    repeats = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(0, len(shape) + 2)))]
    result = np.tile(np.zeros(shape), repeats).shape
    check(rng, "tile", {"repeats": repeats}, [shape], result)


@pytest.mark.parametrize("seed", SEEDS)
def test_one_hot(seed):
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, 0, 3, 5)
    check(rng, "one_hot", {}, [shape], (*shape, int(rng.integers(1, 5))))


# --------------------------------------------------------------------------- windows


def random_window(rng, group=False):
    """``(image shape, attrs)`` of a random window op (in its own axis order)."""
    spatial = random_shape(rng, 1, 3, 6)
    rank = len(spatial)
    kernel = [int(rng.integers(1, min(3, n) + 1)) for n in spatial]
    pads = [int(rng.integers(0, 3)) for _ in range(2 * rank)]
    dilations = [
        int(rng.integers(1, 3)) if n > 2 * k else 1 for n, k in zip(spatial, kernel, strict=True)
    ]
    groups = int(rng.integers(1, 3)) if group else 1
    channels = groups * int(rng.integers(1, 3))
    last = bool(rng.random() < 0.5)
    attrs = {
        "kernel": kernel,
        "strides": [int(rng.integers(1, 3)) for _ in range(rank)],
        "pads": pads,
        "dilations": dilations,
        "channels_last": last,
        **({"group": groups} if group else {}),
    }
    n = int(rng.integers(1, 3))
    image = (n, *spatial, channels) if last else (n, channels, *spatial)
    return image, attrs


def patches_shape(image, attrs):
    return reference.im2col_sources(image, attrs).shape


@pytest.mark.parametrize("fold", [False, None])
@pytest.mark.parametrize("seed", SEEDS)
def test_im2col(seed, fold):
    rng = np.random.default_rng(seed)
    image, attrs = random_window(rng, group=True)
    check(rng, "im2col", attrs, [image], patches_shape(image, attrs), fold)


@pytest.mark.parametrize("fold", [False, None])
@pytest.mark.parametrize("seed", SEEDS)
def test_col2im(seed, fold):
    rng = np.random.default_rng(seed)
    image, attrs = random_window(rng, group=True)
    check(rng, "col2im", attrs, [patches_shape(image, attrs)], image, fold)


@pytest.mark.parametrize("fold", [False, None])
@pytest.mark.parametrize("seed", SEEDS)
def test_pooling_windows(seed, fold):
    rng = np.random.default_rng(seed)
    image, attrs = random_window(rng)
    result = reference.pool_windows(np.zeros(image), attrs, 0).shape[: len(image)]
    check(rng, index_maps.POOLS[seed % 3], attrs, [image], result, fold)


@pytest.mark.parametrize("apart", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_peeled_windows_stay_exact(seed, apart, monkeypatch):
    """With a limit of one sample's window structure, im2col and col2im are counted by
    peeling samples and channels: still exact, whether the shifts of a class fold into a
    factor or stay apart as a sum of terms."""
    rng = np.random.default_rng(seed)
    image, attrs = random_window(rng, group=True)
    image = (image[0] + 2, *image[1:])
    patches = patches_shape(image, attrs)
    window = patches[1] // image[0] * prod(attrs["kernel"])
    monkeypatch.setattr(flows, "ENUMERATION_LIMIT", window)
    if apart:
        monkeypatch.setattr(flows, "CONVOLUTION_LIMIT", 0)
        monkeypatch.setattr(flows, "TERM_LIMIT", 1 << 20)
    check(rng, "im2col", attrs, [image], patches)
    check(rng, "col2im", attrs, [patches], image)


def test_beyond_the_limits_the_traffic_is_estimated(monkeypatch):
    monkeypatch.setattr(flows, "ENUMERATION_LIMIT", 4)
    src = Layout((6, 35), "float32", 0, 0, 2, 3)
    dst = Layout((35, 6), "float32", 1, 1, 3, 2)
    got = flows.movement_traffic("reshape", {}, [src], dst)
    assert got == scattered_traffic(src, dst, src.size)


@pytest.mark.parametrize("seed", range(20))
def test_peeling_wherever_it_is_no_dearer_stays_exact(seed, monkeypatch):
    monkeypatch.setattr(flows, "PEEL_OVERHEAD", 0)
    rng = np.random.default_rng(seed)
    image, attrs = random_window(rng, group=True)
    patches = patches_shape(image, attrs)
    check(rng, "im2col", attrs, [image], patches)
    check(rng, "col2im", attrs, [patches], image)
    shape = random_shape(rng, 1, 5, 4)
    check(rng, "reshape", {}, [shape], random_factorization(rng, prod(shape), 3))
    perm = rng.permutation(len(shape)).tolist()
    check(rng, "transpose", {"perm": perm}, [shape], tuple(shape[p] for p in perm))


@pytest.mark.parametrize("seed", range(20))
def test_phase_classes_are_counted_without_listing_them(seed, monkeypatch):
    """``phase_count``, from the steps, spans and tiles alone, bounds the number of classes
    that ``phase_classes`` finds (the bound that the cost of peeling is judged by), and the
    classes hold every value of the digit."""
    found = index_maps.phase_classes
    counted = []

    def classes(blocks, digit, sizes):
        phases = found(blocks, digit, sizes)
        assert index_maps.phase_count(blocks, digit, sizes) >= len(phases)
        assert sum(p.counts.sum() for p in phases) == sizes[digit]
        counted.append(len(phases))
        return phases

    monkeypatch.setattr(flows, "phase_classes", classes)
    monkeypatch.setattr(flows, "PEEL_OVERHEAD", 0)
    rng = np.random.default_rng(seed)
    image, attrs = random_window(rng, group=True)
    check(rng, "im2col", attrs, [image], patches_shape(image, attrs))
    shape = random_shape(rng, 1, 5, 4)
    check(rng, "reshape", {}, [shape], random_factorization(rng, prod(shape), 3))
    assert counted


def test_nothing_moves_without_elements():
    src = Layout((3, 0), "float32", 0, 0, 2, 1)
    out = Layout.on((0, 3), "float32", (0, 0, 2, 2))
    assert flows.movement_traffic("transpose", {"perm": [1, 0]}, [src], out) == NO_TRAFFIC


@pytest.mark.parametrize("seed", range(6))
def test_most_taps_is_the_widest_patch_taps_row(seed):
    image, attrs = random_window(np.random.default_rng(seed), group=True)
    assert most_taps(image, attrs) == patch_taps(image, attrs).shape[-1]


# --------------------------------------------------------------------------- cost


WSE2 = get_target("wse2")
IM2COL = {"kernel": [3, 3], "strides": [1, 1], "pads": [1] * 4, "dilations": [1, 1], "group": 1,
          "channels_last": True}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "shape", "attrs", "result"),
    [
        ("reshape", (24, 2048, 12288), {}, (24, 2048, 96, 128)),
        ("transpose", (24, 2048, 96, 128), {"perm": [0, 2, 1, 3]}, (24, 96, 2048, 128)),
        ("transpose", (24, 96, 2048, 128), {"perm": [0, 1, 3, 2]}, (24, 96, 128, 2048)),
        ("im2col", (64, 56, 56, 256), IM2COL, (1, 64 * 56 * 56, 256 * 9)),
        # a batch of 16M sequences: a digit of 2**35 values, never listed
        ("reshape", (1 << 24, 2048, 768), {}, (1 << 24, 2048, 12, 64)),
        ("transpose", (1 << 24, 2048, 12, 64), {"perm": [0, 2, 1, 3]}, (1 << 24, 12, 2048, 64)),
    ],
)
def test_gpt_sized_movement_plans_cost_no_element_count(name, shape, attrs, result):
    """Planning a movement of hundreds of millions of elements on the whole wafer holds
    nothing of their size."""
    operand = Operand(shape, "float32", WAFER, Layout.on(shape, "float32", WSE2.whole))
    tracemalloc.start()
    try:
        plan = plans.plan(name, WSE2, WSE2.whole, [operand], attrs, [(result, "float32")])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200e6
    traffic = plan.cost.traffic
    assert traffic.wavelet_hops > 0 and traffic.max_link > 0 and traffic.max_hops > 0


# --------------------------------------------------------------------------- phases


def listed_phases(blocks, digit, sizes):
    """The phase classes of ``digit`` by listing its every value: its pattern key and PE
    shift in each block (``index_maps._Line``), grouped by key."""
    values = np.arange(sizes[digit])
    keys, shifts = [], []
    for b in blocks:
        others = [(s, sizes[d] - 1) for d, s in b.coord.terms if d != digit]
        low = b.coord.offset + sum(min(0, s * top) for s, top in others)
        span = sum(abs(s) * top for s, top in others)
        least = values * dict(b.coord.terms)[digit] + low
        keys.append(np.maximum(least % b.tile, b.tile - 1 - span))
        shifts.append(least // b.tile)
    keys, shifts = np.array(keys), np.array(shifts)
    _, first = np.unique(keys, axis=1, return_index=True)
    classes = []
    for value in first.tolist():
        mine = (keys == keys[:, [value]]).all(axis=0)
        distances, counts = np.unique(
            shifts[:, mine] - shifts[:, [value]], axis=1, return_counts=True
        )
        classes.append((value, distances.tolist(), counts.tolist()))
    return classes


@pytest.mark.parametrize("seed", range(60))
def test_phase_classes_in_closed_form_are_those_of_every_value(seed):
    """``phase_classes`` never lists the values of the digit, yet finds the classes, first
    values and shifts of listing them all, in one or two blocks, rising or falling."""
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(1, 60)), *(int(n) for n in rng.integers(1, 6, 3))]
    blocks = []
    for _ in range(int(rng.integers(1, 3))):
        others = [(d, int(rng.integers(-4, 5))) for d in (1, 2, 3) if rng.random() < 0.5]
        stride = int(rng.choice([-7, -3, -1, 1, 2, 5, 16, 25]))
        coord = index_maps.Affine(((0, stride), *others), int(rng.integers(0, 400)))
        blocks.append(index_maps.Block(coord, int(rng.integers(1, 40)), 0))
    got = index_maps.phase_classes(blocks, 0, sizes)
    assert [(p.value, p.shifts.tolist(), p.counts.tolist()) for p in got] == listed_phases(
        blocks, 0, sizes
    )
    assert index_maps.phase_count(blocks, 0, sizes) >= len(got)


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 7, 10, 13, 16])
@pytest.mark.parametrize("apart", [False, True])
def test_im2col_peeled_by_samples_matches_the_oracle_at_any_batch(batch, apart, monkeypatch):
    """Samples peeled by the patterns in which tile ends cut them (whether or not the tile
    holds whole samples) count exactly the oracle's flows, at every batch."""
    attrs = {**IM2COL, "channels_last": False}
    image = Layout.on((batch, 3, 6, 6), "float32", (0, 0, 5, 5))
    for rows in (3, 4, 7, 9):
        out = Layout((1, batch * 36, 27), "float32", 0, 1, grid_extent(batch * 36, rows), 4)
        monkeypatch.setattr(flows, "ENUMERATION_LIMIT", 3 * 36 * 9)
        monkeypatch.setattr(flows, "CONVOLUTION_LIMIT", 0 if apart else 1 << 20)
        got = flows.movement_traffic("im2col", attrs, [image], out)
        assert fields(got) == fields(oracle("im2col", attrs, [image], out)), (batch, rows)


@pytest.mark.parametrize(
    ("batch", "hops"), [(10_000, 23_843_089_312.0), (100_000_000, 238_477_451_343_712.0)]
)
def test_cnn_im2col_is_exact_at_a_cost_independent_of_the_batch(batch, hops):
    """The zoo cnn's first im2col on the whole wafer: counted exactly (the numbers of listing
    every sample's phase, which equal the oracle's wherever it runs) in a few tens of MB,
    whatever the batch. Its time is a benchmark's (benchmarks/bench_movement.py)."""
    attrs = {**IM2COL, "channels_last": False}
    image = Layout.on((batch, 3, 16, 16), "float32", (0, 0, 994, 750))
    out = Layout.on((1, batch * 256, 27), "float32", (0, 0, 994, 750))
    tracemalloc.start()
    try:
        got = flows.movement_traffic("im2col", attrs, [image], out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.wavelet_hops == hops and got.max_eject == out.rt
    assert peak < 60e6  # about 50 MB


# --------------------------------------------------------------------------- factors


def unique_factor(vars_, at, counts) -> flow_factors.Factor:
    """``flow_factors.make_factor`` as it was: ``np.unique`` over the mixed-radix codes of the
    columns."""
    order = np.argsort(vars_, kind="stable")
    at = np.asarray(at)[order]
    low = at.min(axis=1, keepdims=True)
    span = tuple(int(s) for s in at.max(axis=1) - low[:, 0] + 1)
    code = np.ravel_multi_index(tuple(at - low), span)
    unique, inverse = np.unique(code, return_inverse=True)
    weights = np.bincount(inverse.reshape(-1), weights=counts, minlength=len(unique))
    columns = np.array(np.unravel_index(unique, span)).reshape(len(span), -1) + low
    return flow_factors.Factor(
        tuple(int(vars_[i]) for i in order), columns.astype(flow_counts.MESH), weights
    )


def random_entries(rng, runs: bool):
    """Columns over a few PE coordinates, with repeats; with ``runs``, as the shifted copies
    of one sorted factor that peeling makes (each copy a sorted run)."""
    vars_ = [int(v) for v in rng.permutation(4)[: int(rng.integers(1, 5))]]
    highs = rng.integers(1, 300, len(vars_))
    n = int(rng.integers(1, 400))
    at = np.array([rng.integers(0, h, n) for h in highs], dtype=flow_counts.MESH)
    counts = rng.integers(1, 5, n).astype(np.float64)
    if runs:
        base = unique_factor(vars_, at, counts)
        copies = int(rng.integers(1, 6))
        shifts = rng.integers(-3, 4, (copies, len(vars_), 1))
        at = np.concatenate([base.at + s for s in shifts], axis=1).astype(flow_counts.MESH)
        at = at[np.argsort(np.argsort(vars_, kind="stable"))]  # back in the order of vars_
        counts = np.tile(base.counts, copies)
    return vars_, at, counts


@pytest.mark.parametrize("runs", [False, True])
@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("seed", range(30))
def test_factor_equals_the_unique_of_its_codes(seed, dense, runs, monkeypatch):
    """The sorted runs (a stable sort and sums over runs) and the dense counts give the
    factor that ``np.unique`` gave, entry for entry and bit for bit."""
    if not dense:
        monkeypatch.setattr(flow_factors, "DENSE_LIMIT", 0)
    rng = np.random.default_rng(seed)
    vars_, at, counts = random_entries(rng, runs)
    got, want = flow_factors.make_factor(vars_, at, counts), unique_factor(vars_, at, counts)
    assert got.vars == want.vars
    assert got.at.dtype == want.at.dtype and np.array_equal(got.at, want.at)
    assert got.counts.dtype == want.counts.dtype and np.array_equal(got.counts, want.counts)


@pytest.mark.parametrize("seed", range(20))
def test_slices_equal_those_of_masks(seed):
    rng = np.random.default_rng(seed)
    f = unique_factor(*random_entries(rng, False))
    vars_ = [v for v in f.vars if rng.random() < 0.6] or [f.vars[0]]
    rows = [f.vars.index(v) for v in vars_]
    others = [i for i in range(len(f.vars)) if i not in rows]
    keys = sorted({tuple(c) for c in f.at[rows].T.tolist()})
    got = flows._slices(f, vars_)
    assert [list(where.values()) for where, _ in got] == [list(k) for k in keys]
    for (_, part), key in zip(got, keys, strict=True):
        pick = np.all(f.at[rows] == np.array(key)[:, None], axis=0)
        assert np.array_equal(part.counts, [f.counts[pick].sum()] if not others else f.counts[pick])
        assert np.array_equal(part.at, f.at[others][:, pick] if others else np.zeros((0, 1)))


@pytest.mark.parametrize("seed", range(20))
def test_peeled_windows_counted_by_sorting_stay_exact(seed, monkeypatch):
    """With no dense counting, every factor of peeled im2col and col2im is summed over sorted
    runs: still the oracle's traffic."""
    monkeypatch.setattr(flow_factors, "DENSE_LIMIT", 0)
    rng = np.random.default_rng(seed)
    image, attrs = random_window(rng, group=True)
    image = (image[0] + 2, *image[1:])
    patches = patches_shape(image, attrs)
    monkeypatch.setattr(flows, "ENUMERATION_LIMIT", patches[1] // image[0] * prod(attrs["kernel"]))
    if seed % 2:
        monkeypatch.setattr(flows, "CONVOLUTION_LIMIT", 0)
        monkeypatch.setattr(flows, "TERM_LIMIT", 1 << 20)
    check(rng, "im2col", attrs, [image], patches)
    check(rng, "col2im", attrs, [patches], image)
