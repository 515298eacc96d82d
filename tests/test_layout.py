"""Unit tests of cgc.runtime.layout: grid choice, scatter/gather, and traffic counting."""

from __future__ import annotations

import dataclasses
from collections import Counter
from math import ceil, prod

import numpy as np
import pytest

import cgc.machine.movement.traffic as traffic_module
from cgc.machine.movement.flows import regrid_traffic
from cgc.machine.movement.layout import Layout, grid_extent, matrix_dims
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic, edge_traffic, gather_traffic, route
from cgc.runtime.tiles import DistTensor


def fields(t: Traffic) -> tuple:
    return dataclasses.astuple(t)


# --------------------------------------------------------------------------- grid choice


@pytest.mark.parametrize("available", [1, 2, 3, 5, 8, 13])
def test_grid_extent_never_exceeds_and_leaves_no_pe_empty(available):
    for n in range(1, 70):
        k = grid_extent(n, available)
        assert 1 <= k <= min(n, available), (n, available, k)
        per = ceil(n / k)
        # the last PE of the split holds at least one item
        assert (k - 1) * per < n, (n, available, k)


def test_grid_extent_uses_as_many_pes_as_useful():
    # Whenever more PEs could be used without leaving one empty, grid_extent uses them.
    for n in range(1, 70):
        for available in range(1, 20):
            k = grid_extent(n, available)
            for more in range(k + 1, min(n, available) + 1):
                assert (more - 1) * ceil(n / more) >= n, (n, available, k, more)


@pytest.mark.parametrize(
    ("n", "available", "expected"),
    [(0, 4, 1), (1, 8, 1), (8, 8, 8), (10, 4, 4), (10, 6, 5), (10, 7, 5), (7, 3, 3), (100, 8, 8)],
)
def test_grid_extent_hand_values(n, available, expected):
    assert grid_extent(n, available) == expected


@pytest.mark.parametrize(
    ("shape", "rect", "hw"),
    [
        ((), (2, 3, 4, 4), (1, 1)),
        ((7,), (0, 0, 4, 4), (1, 4)),
        ((3,), (0, 0, 8, 8), (1, 3)),
        ((10, 6), (1, 2, 4, 6), (5, 3)),
        ((2, 9, 3), (0, 0, 8, 2), (2, 3)),
        ((2, 2, 5, 1), (0, 0, 3, 3), (3, 1)),
    ],
)
def test_layout_on_grid(shape, rect, hw):
    lay = Layout.on(shape, "float32", rect)
    x, y, width, height = rect
    assert (lay.row0, lay.col0) == (y, x)
    assert (lay.h, lay.w) == hw
    assert lay.h <= height and lay.w <= width
    # no empty PE row or column
    assert (lay.h - 1) * lay.rt < lay.rows
    assert (lay.w - 1) * lay.ct < lay.cols
    assert lay.rect == (x, y, lay.w, lay.h)


# --------------------------------------------------------------------------- scatter / gather

SHAPES = [(), (1,), (7,), (5, 3), (1, 13), (3, 7, 5), (2, 3, 5, 9), (2, 1, 4, 1)]
RECTS = [(0, 0, 1, 1), (1, 2, 3, 2), (0, 0, 4, 4), (3, 1, 5, 7)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rect", RECTS)
@pytest.mark.parametrize("dtype", ["float32", "int64", "float16"])
def test_scatter_gather_round_trip(shape, rect, dtype):
    rng = np.random.default_rng(len(shape) + 7 * rect[2])
    array = (rng.standard_normal(shape) * 100).astype(dtype)
    lay = Layout.on(shape, dtype, rect)
    dist = DistTensor.scatter(array, lay)
    assert dist.tiles.shape == lay.tile_shape()
    assert dist.tiles.dtype == np.dtype(dtype)
    back = dist.gather()
    assert back.shape == tuple(shape)
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, array)


def test_scatter_places_blocks_on_the_right_pe():
    # A 5 x 7 matrix on a 2 x 3 grid: tiles of 3 x 3, block (i, j) = rows 3i.., cols 3j..
    a = np.arange(35, dtype=np.float32).reshape(5, 7)
    lay = Layout((5, 7), "float32", 0, 0, 2, 3)
    assert (lay.rt, lay.ct) == (3, 3)
    tiles = DistTensor.scatter(a, lay).tiles
    np.testing.assert_array_equal(tiles[1, 2, :2, :1], a[3:5, 6:7])
    np.testing.assert_array_equal(tiles[0, 1], a[0:3, 3:6])
    # padding is zero
    assert (tiles[1, 2, 2:, :] == 0).all() and (tiles[1, 2, :, 1:] == 0).all()
    assert (tiles[1, :, 2, :] == 0).all()


def test_batch_axes_are_held_whole_by_every_pe():
    a = np.arange(2 * 3 * 4 * 6, dtype=np.float32).reshape(2, 3, 4, 6)
    lay = Layout(a.shape, "float32", 0, 0, 2, 3)
    tiles = DistTensor.scatter(a, lay).tiles
    assert tiles.shape == (2, 3, 2, 3, 2, 2)
    np.testing.assert_array_equal(tiles[1, 2], a[:, :, 2:4, 4:6])
    assert lay.tile_elements == 2 * 3 * 2 * 2
    assert lay.tile_bytes == 4 * lay.tile_elements


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rect", RECTS)
def test_valid_mask_marks_exactly_the_logical_elements(shape, rect):
    lay = Layout.on(shape, "float32", rect)
    mask = np.broadcast_to(lay.valid_mask(), lay.tile_shape())
    assert mask.sum() == prod(shape)
    ones = DistTensor.scatter(np.ones(shape, np.float32), lay).tiles
    np.testing.assert_array_equal(mask, ones == 1)


@pytest.mark.parametrize("fill", [0.0, -np.inf, 7.5])
def test_masked_replaces_only_padding(fill):
    a = np.random.default_rng(0).standard_normal((2, 5, 7)).astype(np.float32)
    lay = Layout(a.shape, "float32", 1, 1, 2, 3)
    dist = DistTensor.scatter(a, lay)
    dist.tiles[~np.broadcast_to(lay.valid_mask(), lay.tile_shape())] = 123.0  # garbage padding
    masked = dist.masked(fill)
    mask = np.broadcast_to(lay.valid_mask(), lay.tile_shape())
    np.testing.assert_array_equal(masked[mask], dist.tiles[mask])
    assert (masked[~mask] == np.float32(fill)).all()
    assert (~mask).sum() > 0
    np.testing.assert_array_equal(DistTensor(lay, masked).gather(), a)


def test_masked_without_padding_is_unchanged():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    lay = Layout(a.shape, "float32", 0, 0, 2, 3)
    dist = DistTensor.scatter(a, lay)
    np.testing.assert_array_equal(dist.masked(-1.0), dist.tiles)


# --------------------------------------------------------------------------- route


def walk_links(flows) -> Counter:
    """Elements per directed link ``(row, col, next_row, next_col)`` of ``(src_r, src_c,
    dst_r, dst_c, n)`` flows walked link by link: along the source row, then down the
    destination column."""
    links: Counter = Counter()
    for sr, sc, dr, dc, n in flows:
        r, c = sr, sc
        while c != dc:
            step = 1 if dc > c else -1
            links[(r, c, r, c + step)] += n
            c += step
        while r != dr:
            step = 1 if dr > r else -1
            links[(r, c, r + step, c)] += n
            r += step
    return links


def naive_route(flows, words) -> Traffic:
    """Walks every flow link by link (``walk_links``) and counts what a transfer takes."""
    links = walk_links(flows)
    inject: Counter = Counter()
    eject: Counter = Counter()
    total = 0
    longest = 0
    for sr, sc, dr, dc, n in flows:
        if (sr, sc) == (dr, dc):
            continue
        hops = abs(dr - sr) + abs(dc - sc)
        total += n * hops
        longest = max(longest, hops)
        inject[(sr, sc)] += n
        eject[(dr, dc)] += n
    if not links:
        return NO_TRAFFIC
    return Traffic(
        total * words,
        max(links.values()) * words,
        max(inject.values()) * words,
        max(eject.values()) * words,
        longest,
    )


def call_route(flows, words):
    a = np.array(flows, dtype=np.int64).reshape(-1, 5).T
    return route(a[0], a[1], a[2], a[3], a[4], words)


def test_route_one_pe_east():
    t = call_route([(3, 3, 3, 4, 12)], 1.0)
    assert fields(t) == (12, 12, 12, 12, 1)
    assert t.cycles == 13


def test_route_flows_on_the_same_link_add_up():
    # (0,0)->(0,2) and (0,1)->(0,3) share the link (0,1)->(0,2) eastbound
    t = call_route([(0, 0, 0, 2, 3), (0, 1, 0, 3, 5)], 1.0)
    assert t.max_link == 8
    assert t.wavelet_hops == 3 * 2 + 5 * 2
    assert t.max_hops == 2


def test_route_counts_east_and_west_separately():
    t = call_route([(0, 0, 0, 2, 3), (0, 2, 0, 0, 5)], 1.0)
    assert t.max_link == 5
    assert t.wavelet_hops == 16
    assert (t.max_inject, t.max_eject) == (5, 5)


def test_route_is_row_first_then_column():
    # (0,0)->(2,2) turns at (0,2) and comes down column 2, sharing (1,2)->(2,2) with the flow
    # from (1,2). Column-first routing would keep them apart (max link 4).
    t = call_route([(0, 0, 2, 2, 3), (1, 2, 2, 2, 4)], 1.0)
    assert fields(t) == (3 * 4 + 4 * 1, 7, 4, 7, 4)


def test_route_negative_coordinates_and_no_motion():
    assert call_route([(1, 1, 1, 1, 9)], 1.0) == NO_TRAFFIC
    t = call_route([(-1, 2, 1, 2, 6), (4, 4, 4, 4, 100)], 1.0)
    assert fields(t) == (12, 6, 6, 6, 2)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("words", [1.0, 0.5])
def test_route_matches_link_by_link_walk(seed, words):
    rng = np.random.default_rng(seed)
    flows = [
        (*rng.integers(-2, 6, 4).tolist(), int(rng.integers(1, 10)))
        for _ in range(int(rng.integers(1, 25)))
    ]
    assert fields(call_route(flows, words)) == pytest.approx(fields(naive_route(flows, words)))


# --------------------------------------------------------------------------- regrid / gather


def test_regrid_one_pe_east_moves_every_element_one_hop():
    src = Layout((3, 4), "float32", 2, 2, 1, 1)
    dst = Layout((3, 4), "float32", 2, 3, 1, 1)
    t = regrid_traffic(src, dst)
    assert fields(t) == (12, 12, 12, 12, 1)


def test_regrid_one_pe_to_two_by_two_by_hand():
    # 16 elements; 4 stay, 4 go east, 4 go south, 4 go east then south.
    src = Layout((4, 4), "float32", 0, 0, 1, 1)
    dst = Layout((4, 4), "float32", 0, 0, 2, 2)
    t = regrid_traffic(src, dst)
    assert fields(t) == (16, 8, 12, 4, 2)
    assert t.cycles == 14


def test_regrid_batch_multiplies_counts():
    src = Layout((5, 3, 4), "float32", 2, 2, 1, 1)
    dst = Layout((5, 3, 4), "float32", 2, 3, 1, 1)
    assert fields(regrid_traffic(src, dst)) == (60, 60, 60, 60, 1)


def test_regrid_that_keeps_every_element_in_place_is_free():
    # a single matrix row cannot be split over grid rows: h=1 and h=3 hold it identically
    src = Layout((1, 6), "float32", 1, 0, 1, 2)
    dst = Layout((1, 6), "float32", 1, 0, 3, 2)
    assert src != dst
    assert regrid_traffic(src, dst) == NO_TRAFFIC
    assert regrid_traffic(src, src) == NO_TRAFFIC


def random_layout(rng, shape):
    _, rows, cols = matrix_dims(shape)
    return Layout(
        tuple(shape),
        "float32",
        int(rng.integers(0, 5)),
        int(rng.integers(0, 5)),
        grid_extent(rows, int(rng.integers(1, 6))),
        grid_extent(cols, int(rng.integers(1, 6))),
    )


@pytest.mark.parametrize("seed", range(12))
def test_regrid_equals_gather_with_identity_map(seed):
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(0, 5))
    shape = tuple(int(d) for d in rng.integers(1, 8, rank))
    src, dst = random_layout(rng, shape), random_layout(rng, shape)
    size = prod(shape)
    want = gather_traffic(dst, [(src, np.arange(size))])
    got = regrid_traffic(src, dst)
    assert fields(got) == pytest.approx(fields(want))


def test_gather_sends_a_value_needed_twice_on_one_pe_once():
    src = Layout((1, 1), "float32", 0, 0, 1, 1)
    one_pe = Layout((1, 4), "float32", 0, 2, 1, 1)
    t = gather_traffic(one_pe, [(src, np.zeros(4, dtype=np.int64))])
    assert fields(t) == (2, 1, 1, 1, 2)
    two_pes = Layout((1, 4), "float32", 0, 2, 1, 2)
    t = gather_traffic(two_pes, [(src, np.zeros(4, dtype=np.int64))])
    assert fields(t) == (2 + 3, 2, 2, 1, 3)


def test_gather_ignores_locally_made_elements():
    src = Layout((1, 2), "float32", 0, 0, 1, 1)
    dst = Layout((1, 4), "float32", 0, 1, 1, 1)
    t = gather_traffic(dst, [(src, np.array([-1, 0, 1, -1]))])
    assert fields(t) == (2, 2, 2, 2, 1)
    assert gather_traffic(dst, [(src, np.full(4, -1))]) == NO_TRAFFIC


# --------------------------------------------------------------------------- edge traffic


def test_edge_traffic_by_hand():
    # 4 x 6 on a 2 x 3 grid at row 2: each PE holds 2 x 2; row 2 is one hop below the edge
    lay = Layout((4, 6), "float32", 2, 1, 2, 3)
    t = edge_traffic(lay, inbound=True)
    assert fields(t) == (3 * (4 * 1 + 4 * 2), 8, 8, 4, 2)
    out = edge_traffic(lay, inbound=False)
    assert fields(out) == (36, 8, 4, 8, 2)


@pytest.mark.parametrize("seed", range(6))
def test_edge_traffic_inbound_outbound_symmetry(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in rng.integers(1, 9, int(rng.integers(0, 4))))
    lay = random_layout(rng, shape)
    inbound, outbound = edge_traffic(lay, True), edge_traffic(lay, False)
    assert inbound.wavelet_hops == outbound.wavelet_hops
    assert inbound.max_link == outbound.max_link
    assert inbound.max_hops == outbound.max_hops == lay.h
    assert (inbound.max_inject, inbound.max_eject) == (outbound.max_eject, outbound.max_inject)
    # every element travels from the edge row to its PE's row
    per_row = [min(lay.rt, lay.rows - i * lay.rt) for i in range(lay.h)]
    want_hops = sum((i + 1) * n for i, n in enumerate(per_row)) * lay.cols * prod(lay.batch)
    assert inbound.wavelet_hops == want_hops


@pytest.mark.parametrize(("narrow", "wide"), [("float16", "float32"), ("int16", "int32")])
def test_16_bit_values_are_half_a_wavelet(narrow, wide):
    def pair(dtype):
        src = Layout((6, 10), dtype, 0, 0, 2, 1)
        dst = Layout((6, 10), dtype, 1, 1, 1, 3)
        return regrid_traffic(src, dst), edge_traffic(src, True)

    for small, big in zip(pair(narrow), pair(wide), strict=True):
        assert big.wavelet_hops > 0
        assert small.wavelet_hops == big.wavelet_hops / 2
        assert small.max_link == big.max_link / 2
        assert small.max_inject == big.max_inject / 2
        assert small.max_eject == big.max_eject / 2
        assert small.max_hops == big.max_hops
    assert Layout((2,), narrow, 0, 0, 1, 1).words_per_element == 0.5


def test_traffic_cycles_and_sequencing():
    a = Traffic(10, 4, 3, 5, 2)
    b = Traffic(1, 6, 1, 1, 3)
    assert a.cycles == 5 + 2
    assert b.cycles == 6 + 3
    assert fields(a + b) == (11, 10, 4, 6, 5)
    assert NO_TRAFFIC.cycles == 0
    assert a + NO_TRAFFIC == a


@pytest.mark.parametrize("seed", range(6))
def test_gather_in_small_chunks_counts_the_same(seed, monkeypatch):
    """Chunks of whole grid rows see every PE's needs at once: the size of a chunk does not
    change the traffic, even with several sources sharing PEs."""
    rng = np.random.default_rng(seed)
    shape = (2, 9, 7)
    dst = random_layout(rng, shape)
    sources = [
        (random_layout(rng, (5, 6)), rng.integers(-1, 30, (prod(shape), 3))),
        (random_layout(rng, (4, 4)), rng.integers(-1, 16, (prod(shape), 2))),
    ]
    whole = gather_traffic(dst, sources)
    monkeypatch.setattr(traffic_module, "GATHER_CHUNK", 1)
    assert fields(gather_traffic(dst, sources)) == pytest.approx(fields(whole))
