"""The fast paths of data movement: ``flows.map_traffic`` remembers the traffic of an index
map by its structure (the same movement elsewhere on the mesh), and must give exactly what
counting it afresh gives, and what the per-element oracle ``traffic.gather_traffic`` gives;
``ref_movement.im2col`` and ``col2im`` (one copy; one strided add per kernel position) equal
the index-array definitions element for element."""

from __future__ import annotations

import dataclasses
from math import prod

import numpy as np
import pytest

from cgc.machine.movement import flows
from cgc.machine.movement.index_maps import Structure, movement_map
from cgc.machine.movement.layout import Layout, grid_extent, matrix_dims
from cgc.machine.movement.traffic import Traffic, gather_traffic
from cgc.machine.reference import data_movement as ref_movement

SEEDS = range(30)


def fields(t: Traffic) -> tuple:
    return dataclasses.astuple(t)


def fresh(name: str, attrs: dict, src: Layout, out: Layout) -> Traffic:
    """The traffic counted afresh, past the cache."""
    found = flows._exact_traffic.__wrapped__(Structure(movement_map(name, attrs, [src], out)))
    assert found is not None
    return found


def layout(rng, shape, dtype, row0, col0, tiles=None) -> Layout:
    """A layout of ``shape`` at ``(row0, col0)`` on a random grid (or ``tiles`` rows x
    columns of PEs: 1-row tiles, uneven tiles)."""
    _, rows, cols = matrix_dims(shape)
    h, w = tiles or (int(rng.integers(1, 7)), int(rng.integers(1, 7)))
    return Layout(shape, dtype, row0, col0, grid_extent(rows, h), grid_extent(cols, w))


def window_attrs(rng, spatial: int, edge: str | None = None) -> dict:
    """Random window attributes; ``edge`` forces a 1x1 kernel, a stride beyond the kernel or
    padding beyond half the kernel."""
    kernel = [int(rng.integers(1, 4)) for _ in range(spatial)]
    strides = [int(rng.integers(1, 3)) for _ in range(spatial)]
    pads = [int(rng.integers(0, 2)) for _ in range(2 * spatial)]
    dilations = [int(rng.integers(1, 3)) for _ in range(spatial)]
    if edge == "1x1":
        kernel, pads = [1] * spatial, [0] * (2 * spatial)
    elif edge == "stride":
        strides = [k + int(rng.integers(1, 3)) for k in kernel]
    elif edge == "pad":
        pads = [k // 2 + 1 for k in kernel] * 2
    return {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations}


def image_case(rng, edge: str | None = None) -> tuple[dict, tuple[int, ...]]:
    """Attributes and an image shape (channels first or last, grouped or not) with windows."""
    spatial = int(rng.integers(1, 3))
    attrs = window_attrs(rng, spatial, edge)
    group = int(rng.choice([1, 1, 2, 3]))
    attrs |= {"group": group, "channels_last": bool(rng.integers(2))}
    sizes = []
    for i in range(spatial):
        span = attrs["dilations"][i] * (attrs["kernel"][i] - 1) + 1
        least = max(1, span - attrs["pads"][i] - attrs["pads"][spatial + i])
        sizes.append(least + int(rng.integers(0, 5)))
    n, c = int(rng.integers(1, 3)), group * int(rng.integers(1, 3))
    image = (n, *sizes, c) if attrs["channels_last"] else (n, c, *sizes)
    return attrs, image


def patches_shape(image: tuple[int, ...], attrs: dict) -> tuple[int, ...]:
    last = attrs["channels_last"]
    sizes = image[1:-1] if last else image[2:]
    channels = image[-1] if last else image[1]
    outs = ref_movement.window_counts(
        sizes, attrs["kernel"], attrs["strides"], attrs["pads"], attrs["dilations"]
    )
    group = attrs["group"]
    return (group, image[0] * prod(outs), channels // group * prod(attrs["kernel"]))


EDGES = (None, None, "1x1", "stride", "pad")


@pytest.mark.parametrize("seed", SEEDS)
def test_remembered_traffic_equals_counting_afresh_and_the_oracle(seed):
    """im2col and col2im at random origins, grids and element sizes: the remembered traffic
    (asked first elsewhere on the mesh) is the fresh count and the per-element oracle's."""
    rng = np.random.default_rng(seed)
    attrs, image = image_case(rng, EDGES[seed % len(EDGES)])
    patches = patches_shape(image, attrs)
    dtype = str(rng.choice(["float32", "float16"]))
    tiles = [None, (1, int(rng.integers(1, 4))), (max(1, patches[1] // 2 + 1), 2)][seed % 3]
    origin = [int(x) for x in rng.integers(0, 4, 4)]
    src = layout(rng, image, dtype, origin[0], origin[1])
    out = layout(rng, patches, dtype, origin[2], origin[3], tiles)
    moved = [dataclasses.replace(g, row0=g.row0 + 7, col0=g.col0 + 3) for g in (src, out)]
    flows.movement_traffic("im2col", attrs, moved, moved[1])  # first asked elsewhere
    got = flows.movement_traffic("im2col", attrs, [src], out)
    ids = np.arange(prod(image)).reshape(image)
    index = ref_movement.movement("im2col", {**attrs, "fill": -1}, [ids], ())
    want = gather_traffic(out, [(src, np.asarray(index))])
    assert fields(got) == fields(fresh("im2col", attrs, src, out))
    assert fields(got) == pytest.approx(fields(want)), (attrs, src, out)
    back = flows.movement_traffic("col2im", attrs, [out], src)
    assert fields(back) == fields(fresh("col2im", attrs, out, src))


def test_the_structure_tells_layouts_and_maps_apart():
    """Moved together the layouts share a key; moved apart, resized or of another element
    size they do not."""
    attrs = {**window_attrs(np.random.default_rng(0), 2, "pad"), "group": 1}
    src = Layout((1, 2, 6, 6), "float32", 0, 0, 3, 2)
    out = Layout((1, 36, 2 * prod(attrs["kernel"])), "float32", 1, 0, 4, 2)

    def key(s: Layout, o: Layout, a: dict = attrs) -> Structure:
        return Structure(movement_map("im2col", a, [s], o))

    shifted = [dataclasses.replace(g, row0=g.row0 + 5, col0=g.col0 + 9) for g in (src, out)]
    assert key(src, out) == key(*shifted)
    assert hash(key(src, out)) == hash(key(*shifted))
    assert key(src, out) != key(dataclasses.replace(src, row0=2), out)
    assert key(src, out) != key(dataclasses.replace(src, h=2), out)
    assert key(src, out) != key(dataclasses.replace(src, dtype="float16"), out)
    assert key(src, out) != key(src, out, {**attrs, "strides": [3, 3]})


def index_im2col(x: np.ndarray, attrs: dict) -> np.ndarray:
    """im2col by the index array of the elements each patch element reads."""
    image = x.shape
    sources = ref_movement.im2col_sources(image, attrs)
    flat = np.append(x.reshape(-1), np.zeros(1, x.dtype))
    return flat[np.where(sources >= 0, sources, x.size)]


def index_col2im(patches: np.ndarray, image: tuple[int, ...], attrs: dict) -> np.ndarray:
    """col2im by adding up in float64 where the index array says, as ``np.bincount``."""
    sources = ref_movement.im2col_sources(image, attrs).ravel()
    inside = sources >= 0
    weights = patches.ravel()[inside].astype(np.float64)
    summed = np.bincount(sources[inside], weights=weights, minlength=prod(image))
    return summed.astype(patches.dtype).reshape(image)


@pytest.mark.parametrize("seed", range(60))
def test_im2col_and_col2im_equal_their_index_definitions(seed):
    rng = np.random.default_rng(seed)
    attrs, image = image_case(rng, EDGES[seed % len(EDGES)])
    dtype = np.float32 if seed % 4 else np.float16
    x = rng.standard_normal(image).astype(dtype)
    got = ref_movement.movement("im2col", attrs, [x], ())
    want = index_im2col(x, attrs)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    patches = rng.standard_normal(got.shape).astype(dtype)
    summed = ref_movement.col2im(patches, image, attrs)
    expected = index_col2im(patches, image, attrs)
    assert summed.dtype == expected.dtype
    np.testing.assert_array_equal(summed, expected)


@pytest.mark.parametrize("fill", [0.0, -1.0])
def test_im2col_fills_the_padding(fill):
    x = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    attrs = {"kernel": [3, 3], "strides": [4, 4], "pads": [2, 2, 2, 2], "dilations": [1, 1]}
    patches = ref_movement.im2col(x, *attrs.values(), group=1, fill=fill)
    assert patches.shape == (1, 4, 9)
    assert patches[0, 0].tolist() == [fill] * 8 + [1.0]
