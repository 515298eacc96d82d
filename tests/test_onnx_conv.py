"""Convolution, pooling and resampling ops through the whole compiler and simulator.

Every model runs through ``cgc.backend`` (import, passes, weight-streaming compile, simulated
run) and is compared with onnxruntime, or with a numpy reference where onnxruntime lacks the op
or follows another reading of the specification.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from conftest import run_onnxruntime
from onnx import TensorProto, helper, numpy_helper

import cgc.tools.backend
from cgc.errors import CgcError
from cgc.frontends.onnx import import_model

F = TensorProto.FLOAT


def rand(*shape, seed=0, low=-1.0, high=1.0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(dtype)


def build(op, feeds, attrs=None, inits=None, opset=19, outputs=("y",), ir_version=10, shape=None):
    """A one-node model: ``feeds`` become graph inputs, ``inits`` initializers (a name that
    starts with ``_`` leaves that input out); ``shape`` declares the (float) output's shape
    where ONNX shape inference cannot."""
    inits = inits or {}
    out_type = (F, shape) if shape is not None else (TensorProto.UNDEFINED, None)
    names = [*feeds, *inits]
    node = helper.make_node(op, [n if not n.startswith("_") else "" for n in names], list(outputs))
    node.attribute.extend(helper.make_attribute(k, v) for k, v in (attrs or {}).items())
    graph = helper.make_graph(
        [node],
        op,
        [
            helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape
            )
            for name, value in feeds.items()
        ],
        [helper.make_tensor_value_info(o, *out_type) for o in outputs],
        [numpy_helper.from_array(v, n) for n, v in inits.items() if not n.startswith("_")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version
    )
    return onnx.shape_inference.infer_shapes(model)


def run_cgc(model, feeds):
    return list(cgc.tools.backend.run_model(model, list(feeds.values())))


def check(model, feeds, expected=None, rtol=1e-5, atol=1e-5):
    """cgc's outputs equal ``expected`` (default: onnxruntime's) in dtype, shape and value."""
    got = run_cgc(model, feeds)
    expected = run_onnxruntime(model, feeds) if expected is None else expected
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol, atol)
    return got


def import_error(model) -> str:
    with pytest.raises(CgcError) as info:
        import_model(model)
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# Conv and ConvTranspose
# ---------------------------------------------------------------------------------------------

CONV_CASES = {
    "2d_group_dilation_stride_bias": (
        (2, 4, 7, 6),
        (6, 2, 3, 2),
        dict(group=2, dilations=[2, 1], strides=[1, 2], pads=[1, 0, 2, 1]),
    ),
    "1d_same_lower": ((1, 3, 9), (2, 3, 4), dict(auto_pad="SAME_LOWER", strides=[2])),
    "3d_same_upper": ((1, 2, 5, 4, 4), (3, 2, 2, 3, 2), dict(auto_pad="SAME_UPPER")),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv(case):
    xs, ws, attrs = CONV_CASES[case]
    feeds = {"x": rand(*xs)}
    inits = {"w": rand(*ws, seed=1), "b": rand(ws[0], seed=2)}
    check(build("Conv", feeds, attrs, inits, opset=11), feeds)


def conv_transpose_reference(x, w, strides, pads, dilations, group, output_padding):
    """ConvTranspose by its definition: every input element scatters its filter into the
    output; then ``pads`` (negative: zeros added) are cropped from the full output."""
    n, c, *sizes = x.shape
    _, per_group, *kernel = w.shape
    nd = len(sizes)
    full = [
        s * (i - 1) + (k - 1) * d + 1 + e
        for i, s, k, d, e in zip(sizes, strides, kernel, dilations, output_padding, strict=True)
    ]
    y = np.zeros((n, per_group * group, *full))
    cg = c // group
    for g, tap in itertools.product(range(group), itertools.product(*map(range, kernel))):
        xg = x[:, g * cg : (g + 1) * cg].astype(np.float64)
        contribution = np.einsum("nc...,cm->nm...", xg, w[g * cg : (g + 1) * cg, :, *tap])
        where = tuple(
            slice(t * d, t * d + s * (i - 1) + 1, s)
            for t, d, s, i in zip(tap, dilations, strides, sizes, strict=True)
        )
        y[:, g * per_group : (g + 1) * per_group][(Ellipsis, *where)] += contribution
    grow = [(max(0, -pads[i]), max(0, -pads[nd + i])) for i in range(nd)]
    y = np.pad(y, [(0, 0), (0, 0), *grow])
    crop = tuple(slice(max(0, pads[i]), y.shape[2 + i] - max(0, pads[nd + i])) for i in range(nd))
    return y[(Ellipsis, *crop)].astype(x.dtype)


CONV_TRANSPOSE_CASES = {
    "stride_output_padding": (
        (1, 2, 3, 4),
        (2, 3, 3, 3),
        dict(strides=[2, 3], output_padding=[1, 2]),
    ),
    "group_dilation_pads": (
        (2, 4, 4, 3),
        (4, 1, 2, 3),
        dict(group=2, dilations=[2, 1], pads=[1, 0, 0, 2], strides=[1, 2]),
    ),
    "1d_large_pads": ((1, 2, 5), (2, 2, 3), dict(strides=[2], pads=[3, 3])),
    "3d": ((1, 1, 2, 3, 2), (1, 2, 2, 2, 3), dict(strides=[2, 1, 2])),
    "output_shape_even": ((1, 1, 3, 3), (1, 2, 3, 3), dict(strides=[3, 2], output_shape=[7, 5])),
}


@pytest.mark.parametrize("case", sorted(CONV_TRANSPOSE_CASES))
def test_conv_transpose(case):
    xs, ws, attrs = CONV_TRANSPOSE_CASES[case]
    feeds = {"x": rand(*xs)}
    check(build("ConvTranspose", feeds, attrs, {"w": rand(*ws, seed=1)}, opset=11), feeds)


@pytest.mark.parametrize(
    ("opset", "auto_pad", "begin"),
    [(11, "SAME_UPPER", 0), (11, "SAME_LOWER", 1), (11, "NOTSET", 1), (10, "SAME_UPPER", 1)],
)
def test_conv_transpose_odd_padding_split(opset, auto_pad, begin):
    """With an odd total padding the smaller half goes first for SAME_UPPER from opset 11 on,
    and for every other mode before."""
    x, w, b = rand(1, 2, 3), rand(2, 1, 3, seed=1), rand(1, seed=2)
    attrs = dict(strides=[2], auto_pad=auto_pad)
    if auto_pad == "NOTSET":
        attrs["output_shape"] = [6]
    feeds = {"x": x}
    model = build("ConvTranspose", feeds, attrs, {"w": w, "b": b}, opset=opset)
    expected = conv_transpose_reference(x, w, [2], [begin, 1 - begin], [1], 1, [0]) + b
    check(model, feeds, [expected.astype(np.float32)])


# ---------------------------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------------------------

POOL_CASES = {
    "max_indices_pads": ("MaxPool", (2, 3, 6, 5), 12, dict(pads=[1, 1, 1, 0])),
    "max_indices_column_major": (
        "MaxPool", (1, 2, 5, 5), 12, dict(strides=[2, 2], storage_order=1)
    ),
    "max_indices_ceil_dilated": (
        "MaxPool", (1, 2, 7, 6), 12, dict(dilations=[2, 1], strides=[2, 2], ceil_mode=1)
    ),
    "max_opset8": ("MaxPool", (1, 2, 5, 5), 8, dict(strides=[2, 2])),
    "max_3d_separable": (
        "MaxPool", (1, 2, 6, 5, 7), 12, dict(pads=[1, 0, 1, 1, 1, 0], dilations=[1, 2, 1])
    ),
    "avg_ceil_overhang_include_pad": (
        "AveragePool", (1, 2, 6, 6), 19,
        dict(strides=[2, 2], pads=[1, 1, 0, 0], ceil_mode=1, count_include_pad=1),
    ),
    "avg_3d_include_pad": (
        "AveragePool", (1, 2, 5, 6, 4), 19,
        dict(strides=[2, 1, 2], pads=[1, 1, 0, 0, 1, 1], count_include_pad=1),
    ),
    "avg_3d_exclude_pad_ceil": (
        "AveragePool", (1, 1, 6, 5, 5), 19,
        dict(strides=[2, 2, 2], pads=[1, 0, 1, 0, 0, 0], ceil_mode=1),
    ),
    "lp_p3_pads": ("LpPool", (1, 2, 6, 5), 18, dict(p=3, pads=[1, 0, 1, 1])),
    "lp_p1_3d_ceil": ("LpPool", (1, 2, 5, 4, 5), 18, dict(p=1, strides=[2, 2, 2], ceil_mode=1)),
    "lp_p2_same_upper": ("LpPool", (1, 2, 5, 5), 11, dict(auto_pad="SAME_UPPER")),
}  # fmt: skip
KERNELS = {
    "max_indices_pads": [3, 2],
    "max_indices_column_major": [2, 2],
    "max_indices_ceil_dilated": [2, 2],
    "max_opset8": [3, 3],
    "max_3d_separable": [3, 2, 3],
    "avg_ceil_overhang_include_pad": [3, 3],
    "avg_3d_include_pad": [2, 3, 2],
    "avg_3d_exclude_pad_ceil": [3, 2, 2],
    "lp_p3_pads": [3, 2],
    "lp_p1_3d_ceil": [2, 2, 2],
    "lp_p2_same_upper": [2, 3],
}


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pool(case):
    op, shape, opset, attrs = POOL_CASES[case]
    attrs = dict(attrs, kernel_shape=KERNELS[case])
    outputs = ("y", "i") if op == "MaxPool" and opset >= 12 else ("y",)
    feeds = {"x": rand(*shape)}
    check(build(op, feeds, attrs, opset=opset, outputs=outputs), feeds)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_max_pool_integers_with_padding(dtype):
    feeds = {"x": np.random.default_rng(0).integers(0, 100, (1, 2, 5, 5)).astype(dtype)}
    if dtype == np.int8:
        feeds["x"] -= 120
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    check(build("MaxPool", feeds, attrs, opset=12, outputs=("y", "i")), feeds)


@pytest.mark.parametrize(("op", "opset"), [("GlobalMaxPool", 1), ("GlobalLpPool", 2)])
def test_global_pools(op, opset):
    feeds = {"x": rand(2, 3, 4, 5)}
    attrs = {"p": 3} if op == "GlobalLpPool" else {}
    check(build(op, feeds, attrs, opset=opset), feeds)


def test_lp_pool_float_exponent_before_opset_2():
    x = rand(1, 1, 4, 4)
    model = build("LpPool", {"x": x}, dict(kernel_shape=[2, 2], p=3.0), opset=1, shape=[1, 1, 3, 3])
    windows = np.lib.stride_tricks.sliding_window_view(np.abs(x[0, 0]) ** 3, (2, 2))
    expected = windows.sum(axis=(-1, -2)) ** (1 / 3)
    check(model, {"x": x}, [expected[None, None].astype(np.float32)])


def test_max_unpool_inverts_max_pool():
    x = rand(1, 2, 4, 6)
    nodes = [
        helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("MaxUnpool", ["p", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "unpool",
        [helper.make_tensor_value_info("x", F, x.shape)],
        [helper.make_tensor_value_info("y", F, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=10)
    model = onnx.shape_inference.infer_shapes(model)
    (y,) = check(model, {"x": x})
    assert np.count_nonzero(y) == 12


def test_max_unpool_output_shape_pads_after_the_inferred_shape():
    """Indices address the shape the attributes infer; output_shape adds zeros after it (as
    the ONNX reference and the node suite do)."""
    x = np.array([[[[5, 6], [7, 8]]]], dtype=np.float32)
    where = np.array([[[[5, 7], [13, 15]]]], dtype=np.int64)
    feeds = {"x": x, "i": where}
    inits = {"shape": np.array([1, 1, 5, 5], dtype=np.int64)}
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    model = build("MaxUnpool", feeds, attrs, inits, opset=11, shape=[1, 1, 5, 5])
    expected = np.zeros((1, 1, 5, 5), dtype=np.float32)
    expected[0, 0, 1:4:2, 1:4:2] = x[0, 0]
    check(model, feeds, [expected])


@pytest.mark.parametrize(
    ("image", "block", "attrs"),
    [
        ([5, 6], [2, 3], dict(strides=[2, 1], pads=[1, 0, 0, 1], dilations=[1, 2])),
        ([3, 4, 3], [2, 2, 2], {}),
    ],
)
def test_col2im(image, block, attrs):
    nd = len(image)
    strides, dilations = attrs.get("strides", [1] * nd), attrs.get("dilations", [1] * nd)
    pads = attrs.get("pads", [0] * 2 * nd)
    blocks = [
        (image[i] + pads[i] + pads[nd + i] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
        for i in range(nd)
    ]
    feeds = {"x": rand(2, 3 * int(np.prod(block)), int(np.prod(blocks)))}
    inits = {"image": np.array(image), "block": np.array(block)}
    check(build("Col2Im", feeds, attrs, inits, opset=18), feeds)


# ---------------------------------------------------------------------------------------------
# Resize and Upsample
# ---------------------------------------------------------------------------------------------

T = "coordinate_transformation_mode"
RESIZE_CASES = {
    "nearest_round_prefer_floor_half_pixel": ([1, 1, 1.7, 2.5], None, dict(mode="nearest")),
    "nearest_round_prefer_ceil_asymmetric": (
        [1, 1, 0.6, 1.8], None,
        {"mode": "nearest", "nearest_mode": "round_prefer_ceil", T: "asymmetric"},
    ),
    "nearest_floor_align_corners_sizes": (
        None, [1, 3, 7, 3], {"mode": "nearest", "nearest_mode": "floor", T: "align_corners"}
    ),
    "nearest_ceil_tf_half_pixel_for_nn": (
        [1, 1, 1.5, 0.5], None,
        {"mode": "nearest", "nearest_mode": "ceil", T: "tf_half_pixel_for_nn"},
    ),
    "linear_half_pixel_down_up": ([1, 1, 0.6, 1.7], None, dict(mode="linear")),
    "linear_align_corners": ([1, 1, 2.0, 0.5], None, {"mode": "linear", T: "align_corners"}),
    "linear_pytorch_half_pixel_sizes": (
        None, [1, 3, 1, 9], {"mode": "linear", T: "pytorch_half_pixel"}
    ),
    "linear_half_pixel_symmetric": (
        [1, 1, 1.7, 0.7], None, {"mode": "linear", T: "half_pixel_symmetric"}
    ),
    "cubic_asymmetric": ([1, 1, 1.5, 2.0], None, {"mode": "cubic", T: "asymmetric"}),
    "cubic_a_exclude_outside": (
        [1, 1, 0.7, 1.6], None, dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1)
    ),
    "linear_antialias_axes": ([0.45, 0.6], None, dict(mode="linear", antialias=1, axes=[2, 3])),
    "cubic_antialias_sizes": (None, [1, 3, 3, 4], dict(mode="cubic", antialias=1)),
    "keep_aspect_not_larger": (
        None, [4, 20], dict(mode="nearest", axes=[3, 2], keep_aspect_ratio_policy="not_larger")
    ),
    "keep_aspect_not_smaller": (
        None, [9, 4], dict(mode="linear", axes=[2, 3], keep_aspect_ratio_policy="not_smaller")
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(RESIZE_CASES))
def test_resize(case):
    scales, sizes, attrs = RESIZE_CASES[case]
    feeds = {"x": rand(1, 3, 5, 6)}
    inits = {"_roi": None}
    if scales is not None:
        inits["scales"] = np.array(scales, dtype=np.float32)
    else:
        inits |= {"_scales": None, "sizes": np.array(sizes, dtype=np.int64)}
    check(build("Resize", feeds, attrs, inits, opset=19), feeds)


@pytest.mark.parametrize("extrapolation", [0.0, -3.5])
def test_resize_tf_crop_and_resize(extrapolation):
    feeds = {"x": rand(2, 1, 5, 6)}
    inits = {
        "roi": np.array([0, 0, -0.2, 0.3, 1, 1, 0.9, 1.4], dtype=np.float32),
        "_scales": None,
        "sizes": np.array([2, 1, 4, 7], dtype=np.int64),
    }
    attrs = dict(
        mode="linear",
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=extrapolation,
    )
    check(build("Resize", feeds, attrs, inits, opset=13), feeds)


def test_resize_opset11_sizes_with_empty_scales():
    feeds = {"x": rand(1, 2, 4, 4)}
    inits = {
        "roi": np.array([], dtype=np.float32),
        "scales": np.array([], dtype=np.float32),
        "sizes": np.array([1, 2, 7, 3], dtype=np.int64),
    }
    check(build("Resize", feeds, dict(mode="cubic"), inits, opset=11), feeds)


@pytest.mark.parametrize(("dtype", "mode"), [(np.uint8, "linear"), (np.int32, "nearest")])
def test_resize_integers(dtype, mode):
    feeds = {"x": np.random.default_rng(0).integers(0, 255, (1, 1, 4, 5)).astype(dtype)}
    inits = {"_roi": None, "scales": np.array([1, 1, 1.75, 0.5], dtype=np.float32)}
    model = build("Resize", feeds, dict(mode=mode), inits, opset=19)
    check(model, feeds, atol=1)  # onnxruntime rounds half up, the spec half to even


@pytest.mark.parametrize(
    ("op", "opset", "mode", "scales"),
    [
        ("Resize", 10, "nearest", [1, 1, 2.5, 0.6]),
        ("Resize", 10, "linear", [1, 1, 0.6, 1.7]),
        ("Upsample", 9, "linear", [1, 1, 1.7, 2.0]),
        ("Upsample", 7, "nearest", [1, 1, 2.0, 3.0]),
    ],
)
def test_resize_before_opset_11(op, opset, mode, scales):
    feeds = {"x": rand(1, 2, 5, 6)}
    scales = np.array(scales, dtype=np.float32)
    if opset == 7:
        model = build(op, feeds, dict(mode=mode, scales=scales.tolist()), opset=opset)
    else:
        model = build(op, feeds, dict(mode=mode), {"scales": scales}, opset=opset)
    check(model, feeds)


def test_upsample_opset1_height_and_width_scales():
    x = rand(1, 1, 2, 3)
    attrs = dict(height_scale=2.0, width_scale=3.0)
    model = build("Upsample", {"x": x}, attrs, opset=1, shape=[1, 1, 4, 9])
    expected = np.repeat(np.repeat(x, 2, axis=2), 3, axis=3)
    check(model, {"x": x}, [expected])


# ---------------------------------------------------------------------------------------------
# GridSample, AffineGrid, DeformConv, RoiAlign
# ---------------------------------------------------------------------------------------------

GRID_CASES = [
    ("linear", "zeros", 0, 22),
    ("nearest", "border", 1, 22),
    ("nearest", "reflection", 0, 22),
    ("cubic", "reflection", 0, 22),
    ("cubic", "zeros", 1, 22),
    ("linear", "reflection", 1, 22),
    ("bicubic", "zeros", 0, 16),
]


@pytest.mark.parametrize(("mode", "padding", "align", "opset"), GRID_CASES)
def test_grid_sample(mode, padding, align, opset):
    feeds = {"x": rand(2, 2, 4, 5), "grid": rand(2, 3, 4, 2, seed=1, low=-1.6, high=1.6)}
    attrs = dict(mode=mode, padding_mode=padding, align_corners=align)
    check(build("GridSample", feeds, attrs, opset=opset), feeds)


def test_grid_sample_cubic_border_clamps_the_coordinate():
    """As the ONNX reference: a coordinate beyond the border moves onto the edge element, so
    cubic interpolation there gives the edge value (PyTorch and onnxruntime clamp each tap)."""
    x = rand(1, 1, 1, 4)
    grid = np.array([[[[-1.6, 0.3], [1.45, -0.8], [-1.2, 0.9]]]], dtype=np.float32)
    feeds = {"x": x, "grid": grid}
    model = build("GridSample", feeds, dict(mode="cubic", padding_mode="border"), opset=20)
    expected = x[0, 0, 0, [0, 3, 0]].reshape(1, 1, 1, 3)
    check(model, feeds, [expected])


def test_grid_sample_volumetric():
    feeds = {"x": rand(1, 2, 3, 4, 3), "grid": rand(1, 2, 3, 2, 3, seed=1, low=-1.3, high=1.3)}
    attrs = dict(mode="linear", padding_mode="border")
    check(build("GridSample", feeds, attrs, opset=20), feeds)


@pytest.mark.parametrize(("size", "align"), [([2, 3, 4, 5], 0), ([2, 1, 3, 2, 4], 1)])
def test_affine_grid(size, align):
    nd = len(size) - 2
    feeds = {"theta": rand(size[0], nd, nd + 1)}
    inits = {"size": np.array(size, dtype=np.int64)}
    check(build("AffineGrid", feeds, dict(align_corners=align), inits, opset=20), feeds)


def bilinear_zero_padded(image, y, x):
    """``image`` (H, W) at the real position (y, x); outside reads as zero."""
    h, w = image.shape
    y0, x0 = int(np.floor(y)), int(np.floor(x))
    total = 0.0
    for yy, xx in itertools.product((y0, y0 + 1), (x0, x0 + 1)):
        if 0 <= yy < h and 0 <= xx < w:
            total += (1 - abs(y - yy)) * (1 - abs(x - xx)) * image[yy, xx]
    return total


def deform_conv_reference(x, w, offset, mask, bias, pads, strides, group, offset_group):
    n, c, _, _ = x.shape
    oc, cg, kh, kw = w.shape
    oh, ow = offset.shape[2:]
    offset = offset.reshape(n, offset_group, kh, kw, 2, oh, ow)
    mask = mask.reshape(n, offset_group, kh, kw, oh, ow)
    y = np.zeros((n, oc, oh, ow))
    for b, o, i, j in itertools.product(range(n), range(oc), range(oh), range(ow)):
        g = o // (oc // group)
        for ci, p, q in itertools.product(range(cg), range(kh), range(kw)):
            channel = g * cg + ci
            og = channel // (c // offset_group)
            dy, dx = offset[b, og, p, q, :, i, j]
            pos_y, pos_x = i * strides[0] - pads[0] + p + dy, j * strides[1] - pads[1] + q + dx
            value = bilinear_zero_padded(x[b, channel], pos_y, pos_x)
            y[b, o, i, j] += w[o, ci, p, q] * value * mask[b, og, p, q, i, j]
    return (y + bias.reshape(1, -1, 1, 1)).astype(np.float32)


def test_deform_conv_groups_mask_bias():
    x, w = rand(1, 4, 4, 5), rand(2, 2, 2, 2, seed=1)
    offset = rand(1, 2 * 2 * 4, 4, 3, seed=2, low=-1.5, high=1.5)
    mask, bias = rand(1, 2 * 4, 4, 3, seed=3, low=0, high=1), rand(2, seed=4)
    feeds = {"x": x, "w": w, "offset": offset, "b": bias, "mask": mask}
    attrs = dict(group=2, offset_group=2, pads=[1, 0, 0, 1], strides=[1, 2])
    model = build("DeformConv", feeds, attrs, opset=19)
    expected = deform_conv_reference(x, w, offset, mask, bias, [1, 0], [1, 2], 2, 2)
    check(model, feeds, [expected])


def test_deform_conv_matches_onnxruntime():
    feeds = {"x": rand(2, 2, 5, 4), "w": rand(3, 2, 3, 2, seed=1)}
    feeds["offset"] = rand(2, 2 * 6, 3, 3, seed=2, low=-2, high=2)
    check(build("DeformConv", feeds, dict(dilations=[1, 1]), opset=19), feeds)


@pytest.mark.parametrize(
    ("mode", "transform", "ratio", "opset"),
    [("avg", "half_pixel", 2, 16), ("max", "output_half_pixel", 3, 16), ("avg", None, 1, 10)],
)
def test_roi_align(mode, transform, ratio, opset):
    """Before opset 16 boxes are in output-half-pixel coordinates (no attribute)."""
    feeds = {
        "x": rand(2, 3, 6, 7),
        "rois": np.array([[0.5, 1, 4.5, 5], [-1, 2, 3, 6.5], [2, 0.2, 9, 3]], np.float32),
        "batch": np.array([1, 0, 1], dtype=np.int64),
    }
    attrs = dict(mode=mode, output_height=2, output_width=3, sampling_ratio=ratio)
    attrs |= {"spatial_scale": 0.9} | ({T: transform} if transform else {})
    check(build("RoiAlign", feeds, attrs, opset=opset), feeds)


def test_roi_align_adaptive_sampling_with_constant_rois():
    feeds = {"x": rand(1, 2, 8, 8), "batch": np.array([0, 0], dtype=np.int64)}
    rois = np.array([[0.5, 1, 6.5, 3], [1, 1, 3, 7.5]], np.float32)
    model = build("RoiAlign", {"x": feeds["x"]}, dict(output_height=2), {"rois": rois})
    model.graph.input.append(helper.make_tensor_value_info("batch", TensorProto.INT64, [2]))
    model.graph.node[0].input.append("batch")
    check(model, feeds)


# ---------------------------------------------------------------------------------------------
# CausalConvWithState
# ---------------------------------------------------------------------------------------------


def causal_conv_reference(x, w, bias, past, activation):
    k = w.shape[2]
    past = np.zeros((*x.shape[:2], k - 1), x.dtype) if past is None else past
    padded = np.concatenate([past, x], axis=2).astype(np.float64)
    y = np.stack(
        [(padded[:, :, t : t + k] * w[None, :, 0, :]).sum(-1) for t in range(x.shape[2])], -1
    )
    y = y + (0 if bias is None else bias[None, :, None])
    if activation != "none":
        y = y / (1 + np.exp(-y))
    return y.astype(x.dtype), padded[:, :, x.shape[2] :].astype(x.dtype)


@pytest.mark.parametrize(
    ("dtype", "with_state", "activation"),
    [(np.float32, True, "silu"), (np.float16, False, "none"), (np.float32, False, "swish")],
)
def test_causal_conv_with_state(dtype, with_state, activation):
    feeds = {"x": rand(2, 3, 5, dtype=dtype), "w": rand(3, 1, 4, seed=1, dtype=dtype)}
    bias = rand(3, seed=2, dtype=dtype)
    past = rand(2, 3, 3, seed=3, dtype=dtype) if with_state else None
    feeds["b"] = bias
    if with_state:
        feeds["past"] = past
    model = build(
        "CausalConvWithState",
        feeds,
        dict(activation=activation),
        opset=27,
        outputs=("y", "state"),
        ir_version=onnx.IR_VERSION,
    )
    tolerance = 2e-3 if dtype == np.float16 else 1e-5
    expected = causal_conv_reference(feeds["x"], feeds["w"], bias, past, activation)
    check(model, feeds, list(expected), rtol=tolerance, atol=tolerance)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def test_conv_result_broadcast_to_more_axes():
    """A convolution's result broadcast up a rank keeps its (N, C, H, W) meaning."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c", "k"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_mul",
        [helper.make_tensor_value_info("x", F, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", F, [2, 1, 8, 4, 4])],
        [
            numpy_helper.from_array(rand(8, 3, 3, 3, seed=1), "w"),
            numpy_helper.from_array(rand(2, 1, 8, 4, 4, seed=2), "k"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    check(model, {"x": rand(1, 3, 4, 4)})


def test_errors_name_the_node_and_the_attribute():
    x = {"x": rand(1, 1, 4, 4)}
    bad_order = build("MaxPool", x, dict(kernel_shape=[2, 2], storage_order=2), outputs=("y", "i"))
    assert "(MaxPool): attribute storage_order=2 is not supported" in import_error(bad_order)
    bad_mode = build("Resize", x, dict(mode="area"), {"_roi": None, "s": np.ones(4, np.float32)})
    assert "attribute mode=area is not supported (expected one of nearest" in import_error(bad_mode)
    both = build(
        "Resize",
        x,
        {},
        {"_roi": None, "s": np.ones(4, np.float32), "sizes": np.array([1, 1, 4, 4])},
    )
    assert "exactly one of the inputs scales and sizes" in import_error(both)
    bad_grid = build("GridSample", x | {"g": rand(1, 2, 2, 2)}, dict(mode="bilinear"), opset=20)
    assert "attribute mode=bilinear is not supported" in import_error(bad_grid)
    padding = build("GridSample", x | {"g": rand(1, 2, 2, 2)}, dict(padding_mode="wrap"))
    assert "attribute padding_mode=wrap is not supported" in import_error(padding)


def test_errors_of_shapes_that_do_not_fit():
    x = {"x": rand(1, 1, 4, 4)}
    model = build("ConvTranspose", x, dict(output_shape=[5, 5, 5]), {"w": rand(1, 1, 2, 2)})
    assert "attribute output_shape=[5, 5, 5] is not supported (expected 2 values)" in (
        import_error(model)
    )
    inits = {"image": np.array([4, 4]), "block": np.array([2, 2])}
    model = build("Col2Im", {"x": rand(1, 4, 8)}, {}, inits, opset=18)
    assert "does not hold blocks [2, 2] of an image [4, 4] (9 blocks)" in import_error(model)
    feeds = x | {"rois": rand(2, 4), "batch": np.zeros(2, np.int64)}
    model = build("RoiAlign", feeds, dict(mode="sum", sampling_ratio=1), opset=16)
    assert "attribute mode=sum is not supported (expected one of avg, max)" in import_error(model)


def test_shape_inputs_must_be_constants():
    feeds = {"x": rand(1, 1, 4, 4), "scales": np.ones(4, np.float32)}
    model = build("Resize", {"x": feeds["x"]}, {}, {"_roi": None})
    model.graph.input.append(helper.make_tensor_value_info("scales", F, [4]))
    model.graph.node[0].input.append("scales")
    message = import_error(model)
    assert "node 'Resize_0' (Resize): input 'scales'" in message and "must be a constant" in message


def test_roi_align_adaptive_sampling_needs_constant_rois():
    feeds = {"x": rand(1, 1, 4, 4), "rois": rand(2, 4), "batch": np.zeros(2, np.int64)}
    model = build("RoiAlign", feeds, {}, opset=16)
    assert "input 'rois' (graph input 'rois') must be a constant for sampling_ratio=0" in (
        import_error(model)
    )
