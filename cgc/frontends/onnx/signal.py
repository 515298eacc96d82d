"""ONNX signal-processing ops: DFT, STFT, the window generators and MelWeightMatrix; also
TfIdfVectorizer (n-gram counting against a pool fixed by attributes) and ImageDecoder (refused).

A DFT is one matmul with a constant matrix of cosines and sines: the input's real and
imaginary parts along the transformed axis become one row ``[re..., im...]``, and the matrix
maps it to ``[re..., im...]`` of the result. Zero padding and truncation to ``dft_length``,
the one-sided spectrum (RFFT) and the real inverse of a one-sided spectrum (IRFFT) are all
properties of that matrix. STFT gathers its frames with constant indices and transforms them
the same way. Windows and mel filter banks depend only on their (static) sizes: they become
constants.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    cast,
    dtype_of,
    require_float,
    reshape,
    shape_of,
    transpose,
)
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.model import dtype_attribute
from cgc.frontends.onnx.nodes import Node, bad_attr
from cgc.machine.hardware import dtypes

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def static_int(im: Importer, node: Node, index: int, name: str) -> int:
    """A scalar integer input that must be known at compile time (one element)."""
    array = np.asarray(im.static(node, index))
    if array.size != 1 or not dtypes.is_integer(array.dtype):
        raise NodeError(
            f"input '{name}' must be one integer, got {array.dtype} of shape {array.shape}"
        )
    return int(array.reshape(()))


def static_float(im: Importer, node: Node, index: int, name: str) -> float:
    """A scalar number input that must be known at compile time."""
    array = np.asarray(im.static(node, index))
    if array.size != 1:
        raise NodeError(f"input '{name}' must be a scalar, got shape {array.shape}")
    return float(array.reshape(()).astype(np.float64))


def output_dtype(node: Node, allowed: Sequence[str]) -> np.dtype:
    """The numpy dtype that the ``output_datatype`` attribute (default FLOAT) names."""
    return dtype_attribute("output_datatype", node.attr("output_datatype", 1), allowed)


def unit_circle(turns: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``cos`` and ``sin`` of ``2 pi turns / n`` for integer ``turns``; exact at the quarter
    turns, where floating-point pi would leave tiny non-zero values."""
    turns = np.mod(turns, n)
    angle = 2.0 * np.pi * turns / n
    cos, sin = np.cos(angle), np.sin(angle)
    quarter = (4 * turns) % n == 0
    quadrant = (4 * turns) // n
    cos = np.where(quarter, np.array([1.0, 0.0, -1.0, 0.0])[quadrant % 4], cos)
    sin = np.where(quarter, np.array([0.0, 1.0, 0.0, -1.0])[quadrant % 4], sin)
    return cos, sin


# ---------------------------------------------------------------------------------------------
# DFT
# ---------------------------------------------------------------------------------------------


def fourier_matrix(
    length: int, n: int, channels: int, inverse: bool, onesided: bool
) -> tuple[np.ndarray, int, int]:
    """The matrix of a DFT of size ``n`` over ``length`` input samples with ``channels`` (1
    real, 2 complex) parts, as ``(matrix, output channels, output bins)``.

    Rows are the input's parts (all real values, then all imaginary ones); columns the output's
    parts likewise. Input samples at or beyond ``n`` get zero rows (truncation); missing
    samples are zeros (padding). An inverse transform still needs the division by ``n``.
    """
    if inverse and onesided:
        return _irfft_matrix(length, n, channels), 1, n
    bins = n // 2 + 1 if onesided else n
    used = min(length, n)
    cos, sin = unit_circle(np.outer(np.arange(used), np.arange(bins)), n)
    sign = 1.0 if inverse else -1.0
    matrix = np.zeros((channels * length, 2 * bins))
    # (re + i im)(cos + i sign sin) = re cos - sign im sin + i (sign re sin + im cos)
    matrix[:used, :bins] = cos
    matrix[:used, bins:] = sign * sin
    if channels == 2:
        matrix[length : length + used, :bins] = -sign * sin
        matrix[length : length + used, bins:] = cos
    return matrix, 2, bins


def _irfft_matrix(length: int, n: int, channels: int) -> np.ndarray:
    """The real inverse of a one-sided spectrum: ``x[t] = sum_k w_k Re(X_k e^{2 pi i k t/n})``
    with ``w_k = 2`` for the bins that stand for a conjugate pair as well, else 1 (still to
    be divided by ``n``). Bins beyond ``n // 2`` are ignored, as numpy's irfft does."""
    used = min(length, n // 2 + 1)
    k = np.arange(used)
    weight = np.where((k == 0) | (2 * k == n), 1.0, 2.0)
    cos, sin = unit_circle(np.outer(k, np.arange(n)), n)
    matrix = np.zeros((channels * length, n))
    matrix[:used] = weight[:, None] * cos
    if channels == 2:
        matrix[length : length + used] = -weight[:, None] * sin
    return matrix


def dft(im: Importer, x: SSAValue, axis: int, n: int, inverse: bool, onesided: bool) -> SSAValue:
    """The DFT of ``x`` (``[..., parts]``, parts 1 or 2) along ``axis`` with size ``n``."""
    shape = shape_of(x)
    rank, channels, length = len(shape), shape[-1], shape[axis]
    matrix, channels_out, bins = fourier_matrix(length, n, channels, inverse, onesided)
    others = [i for i in range(rank - 1) if i != axis]
    order = [*others, rank - 1, axis]
    lead = [shape[i] for i in others]
    rows = reshape(im, transpose(im, x, order), (prod(lead), channels * length))
    y = im.emit(wse.MatmulOp(rows, im.const(matrix.astype(dtype_of(x)))))
    if inverse:
        y = im.emit(wse.DivOp(y, im.scalar(n, y)))
    y = reshape(im, y, (*lead, channels_out, bins))
    return transpose(im, y, np.argsort(order).tolist())


def dft_axis(axis: int, rank: int) -> int:
    """A DFT axis normalized: ``[-r, -2]`` or ``[0, r-2]``, the last axis holds the parts."""
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise NodeError(f"axis {axis} is out of range for an input of rank {rank}")
    return axis % rank


def default_dft_length(size: int, inverse: bool, onesided: bool) -> int:
    """The DFT size without ``dft_length``: the axis size, or ``2 (size - 1)`` for IRFFT."""
    return 2 * (size - 1) if inverse and onesided else size


def dft_output_shape(shape: Sequence[int], axis: int, n: int, inverse: bool, onesided: bool):
    """The shape of the DFT of an input of ``shape`` along ``axis`` with size ``n``."""
    out = list(shape)
    if inverse and onesided:
        out[axis], out[-1] = n, 1
    else:
        out[axis], out[-1] = (n // 2 + 1 if onesided else n), 2
    return tuple(out)


@register("DFT")
def _dft(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    rank = len(shape)
    if rank < 2 or shape[-1] not in (1, 2):
        raise NodeError(f"the input {shape} needs rank >= 2 and a last axis of 1 or 2")
    require_float(x)
    inverse = bool(node.attr("inverse", 0))
    onesided = bool(node.attr("onesided", 0))
    length = static_int(im, node, 1, "dft_length") if node.has_input(1) else None
    if length is not None and length < 1:
        raise NodeError(f"input dft_length={length} must be positive")
    axes, axis_value = dft_axes(im, node, rank)
    sizes = {a: length or default_dft_length(shape[a], inverse, onesided) for a in axes}
    if axis_value is None:
        (axis,) = axes
        if sizes[axis] < 1:
            raise NodeError(f"the DFT size along axis {axis} would be {sizes[axis]}")
        return [dft(im, x, axis, sizes[axis], inverse, onesided)]
    sizes = {a: n for a, n in sizes.items() if n >= 1}
    shapes = {dft_output_shape(shape, a, n, inverse, onesided) for a, n in sizes.items()}
    if len(shapes) != 1:
        candidates = " or ".join(str(s) for s in sorted(shapes))
        raise im.not_constant(node, 2, f": the output shape depends on it ({candidates})")
    results = {a: dft(im, x, a, n, inverse, onesided) for a, n in sizes.items()}
    return [select_axis(im, axis_value, results, rank)]


def dft_axes(im: Importer, node: Node, rank: int) -> tuple[list[int], SSAValue | None]:
    """The DFT axis (the ``axis`` attribute before opset 20, an input from 20 on) as ``([axis],
    None)``; an axis known only at run time gives every candidate axis and its value."""
    if im.opset < 20:
        return [dft_axis(int(node.attr("axis", 1)), rank)], None
    if not node.has_input(2):
        return [dft_axis(-2, rank)], None
    known = im.known_value(node, 2)
    if known is not None:
        return [dft_axis(int(np.ravel(known)[0]), rank)], None
    return list(range(rank - 1)), im.value(node, 2)


def select_axis(im: Importer, axis: SSAValue, results: dict[int, SSAValue], rank: int):
    """The result for the axis that ``axis`` (a run-time scalar) names, among the DFTs along
    every candidate axis (of one shape)."""
    axis = reshape(im, axis, ())
    negative = im.emit(wse.GreaterOp(im.scalar(0, axis), axis))
    axis = im.emit(wse.SelectOp(negative, im.emit(wse.AddOp(axis, im.scalar(rank, axis))), axis))
    candidates = sorted(results)
    chosen = results[candidates[-1]]
    for candidate in reversed(candidates[:-1]):
        hit = im.emit(wse.EqualOp(axis, im.scalar(candidate, axis)))
        chosen = im.emit(wse.SelectOp(hit, results[candidate], chosen))
    return chosen


# ---------------------------------------------------------------------------------------------
# STFT
# ---------------------------------------------------------------------------------------------


@register("STFT")
def _stft(im: Importer, node: Node) -> list:
    signal = im.value(node, 0)
    shape = shape_of(signal)
    if len(shape) != 3 or shape[-1] not in (1, 2):
        raise NodeError(f"the signal {shape} must be [batch, length, 1 or 2]")
    require_float(signal)
    step = static_int(im, node, 1, "frame_step")
    window = im.optional(node, 2)
    frame_length = static_int(im, node, 3, "frame_length") if node.has_input(3) else None
    if window is not None:
        window_shape = shape_of(window)
        if len(window_shape) != 1:
            raise NodeError(f"the window {window_shape} must be 1-D")
        if frame_length is not None and frame_length != window_shape[0]:
            raise NodeError(
                f"the window has {window_shape[0]} values but frame_length is {frame_length}"
            )
        frame_length = window_shape[0]
    signal_length = shape[1]
    frame_length = signal_length if frame_length is None else frame_length
    if step < 1:
        raise NodeError(f"input frame_step={step} must be positive")
    if not 1 <= frame_length <= signal_length:
        raise NodeError(f"frame_length {frame_length} does not fit a signal of {signal_length}")
    frames = (signal_length - frame_length) // step + 1
    starts = np.arange(frames, dtype=np.int64)[:, None] * step
    indices = starts + np.arange(frame_length, dtype=np.int64)[None, :]
    framed = im.emit(wse.GatherOp(signal, im.const(indices), 1))
    if window is not None:
        framed = im.emit(wse.MulOp(framed, reshape(im, window, (1, 1, frame_length, 1))))
    onesided = bool(node.attr("onesided", 1))
    return [dft(im, framed, 2, frame_length, False, onesided)]


# ---------------------------------------------------------------------------------------------
# Windows and the mel filter bank
# ---------------------------------------------------------------------------------------------

GENERATED_DTYPES = (
    "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
    "float16", "float32", "float64", "bfloat16",
)  # fmt: skip
"""The output types the window ops and MelWeightMatrix may produce."""

WINDOWS = {
    "HannWindow": (0.5, 0.5, 0.0),
    "HammingWindow": (25.0 / 46.0, 21.0 / 46.0, 0.0),
    "BlackmanWindow": (0.42, 0.5, 0.08),
}
"""``(a0, a1, a2)`` of each window ``a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N)``."""


def cosine_window(size: int, periodic: bool, coefficients: tuple[float, float, float]):
    """A generalized cosine window of ``size`` points in float64; ``N`` is ``size`` for a
    periodic window and ``size - 1`` for a symmetric one (one point gives ``[1]``)."""
    a0, a1, a2 = coefficients
    period = size if periodic else size - 1
    if period == 0:
        return np.ones(1)
    angle = 2.0 * np.pi * np.arange(size) / period
    return a0 - a1 * np.cos(angle) + a2 * np.cos(2.0 * angle)


def window_importer(coefficients: tuple[float, float, float]):
    """The importer of one window op: a constant of the static ``size``."""

    def run(im: Importer, node: Node) -> list:
        size = static_int(im, node, 0, "size")
        if size < 1:
            raise NodeError(f"input size={size} must be positive")
        periodic = bool(node.attr("periodic", 1))
        dtype = output_dtype(node, GENERATED_DTYPES)
        return [im.const(cosine_window(size, periodic, coefficients).astype(dtype))]

    return run


for _op_type, _coefficients in WINDOWS.items():
    register(_op_type)(window_importer(_coefficients))


def hertz_to_mel(hertz: float | np.ndarray):
    """The mel scale: ``2595 log10(1 + f / 700)``."""
    return 2595.0 * np.log10(1.0 + np.asarray(hertz, dtype=np.float64) / 700.0)


def mel_to_hertz(mel: float | np.ndarray):
    """The inverse of ``hertz_to_mel``."""
    return 700.0 * (np.power(10.0, np.asarray(mel, dtype=np.float64) / 2595.0) - 1.0)


def mel_weight_matrix(bands: int, dft_length: int, rate: float, low: float, high: float):
    """``[dft_length // 2 + 1, bands]`` triangular filters of peak 1 (the ONNX definition:
    ``bands + 2`` edges evenly spaced in mels, mapped to the spectrogram bins
    ``floor((dft_length + 1) f / rate)``)."""
    spectrum_bins = dft_length // 2 + 1
    edges_mel = np.arange(bands + 2) * ((hertz_to_mel(high) - hertz_to_mel(low)) / (bands + 2))
    edges = np.floor((dft_length + 1) * mel_to_hertz(edges_mel + hertz_to_mel(low)) / rate)
    edges = edges.astype(np.int64)
    matrix = np.zeros((spectrum_bins, bands))
    for band in range(bands):
        left, center, right = (int(e) for e in edges[band : band + 3])
        if center > left:
            rising = np.arange(left, center + 1)
            _put(matrix, rising, band, (rising - left) / (center - left))
        else:
            _put(matrix, np.array([center]), band, np.ones(1))
        if right > center:
            falling = np.arange(center, right)
            _put(matrix, falling, band, (right - falling) / (right - center))
    return matrix


def _put(matrix: np.ndarray, rows: np.ndarray, column: int, values: np.ndarray) -> None:
    """``matrix[rows, column] = values`` for the rows inside the matrix."""
    inside = (rows >= 0) & (rows < matrix.shape[0])
    matrix[rows[inside], column] = values[inside]


@register("MelWeightMatrix")
def _mel_weight_matrix(im: Importer, node: Node) -> list:
    bands = static_int(im, node, 0, "num_mel_bins")
    dft_length = static_int(im, node, 1, "dft_length")
    rate = static_float(im, node, 2, "sample_rate")
    low = static_float(im, node, 3, "lower_edge_hertz")
    high = static_float(im, node, 4, "upper_edge_hertz")
    if bands < 1 or dft_length < 1 or rate <= 0:
        raise NodeError(
            f"num_mel_bins={bands}, dft_length={dft_length} and sample_rate={rate} must be positive"
        )
    dtype = output_dtype(node, GENERATED_DTYPES)
    return [im.const(mel_weight_matrix(bands, dft_length, rate, low, high).astype(dtype))]


# ---------------------------------------------------------------------------------------------
# TfIdfVectorizer
# ---------------------------------------------------------------------------------------------


def pool_levels(node: Node, low: int, high: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The pool's n-grams of the lengths ``low..high`` as ``(n, grams [K, n], ordinals [K])``,
    an ordinal being the n-gram's position in the whole pool; a repeated n-gram is counted
    once, for its last position."""
    pool = np.asarray(node.attr("pool_int64s", []), dtype=np.int64)
    starts = [int(c) for c in node.attr("ngram_counts", [])]
    levels, ordinal = [], 0
    for level, start in enumerate(starts):
        n = level + 1
        end = starts[level + 1] if level + 1 < len(starts) else len(pool)
        if end < start or (end - start) % n:
            raise bad_attr("ngram_counts", starts, f" ({end - start} items for {n}-grams)")
        grams = pool[start:end].reshape(-1, n)
        if low <= n <= high and len(grams):
            last = {tuple(g): i for i, g in enumerate(grams.tolist())}
            keep = sorted(last.values())
            levels.append((n, grams[keep], ordinal + np.asarray(keep, dtype=np.int64)))
        ordinal += len(grams)
    return levels


def count_ngrams(
    im: Importer, rows: SSAValue, n: int, grams: np.ndarray, distances: Sequence[int]
) -> SSAValue | None:
    """How often each of ``grams`` ``[K, n]`` occurs in every row of ``rows`` ``[R, C]``
    with each of ``distances`` between its items, as ``[R, K]`` float32; None if no n-gram
    fits in a row."""
    num_rows, width = shape_of(rows)
    total = None
    for distance in distances:
        positions = width - (n - 1) * distance
        if positions <= 0:
            continue
        match = None
        for item in range(n):
            begin = item * distance
            column = im.emit(wse.SliceOp(rows, [0, begin], [num_rows, begin + positions], [1, 1]))
            column = reshape(im, column, (num_rows, positions, 1))
            wanted = im.const(grams[:, item].astype(dtype_of(rows)).reshape(1, 1, -1))
            equal = im.emit(wse.EqualOp(column, wanted))
            match = equal if match is None else im.emit(wse.AndOp(match, equal))
        assert match is not None  # n >= 1 (pool_levels)
        hits = cast(im, match, "float32")
        hits = im.emit(wse.ReduceSumOp(hits, [1], False))
        total = hits if total is None else im.emit(wse.AddOp(total, hits))
    return total


def representable(grams: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Which n-grams (rows) the token type can hold; the others never match."""
    info = np.iinfo(dtype)
    return np.all((grams >= info.min) & (grams <= info.max), axis=1)


def weigh_counts(im: Importer, node: Node, counts: SSAValue, ordinals: np.ndarray) -> SSAValue:
    """The TF, IDF (count capped at 1) or TFIDF values of the counts ``[R, K]`` of the pool's
    n-grams ``ordinals``, scaled by their ``weights`` (per pool n-gram)."""
    mode = node.attr("mode", None)
    weights = node.attr("weights", None)
    if mode == "TF":
        return counts
    if mode == "IDF":
        present = im.emit(wse.GreaterOp(counts, im.scalar(0.0, counts)))
        counts = cast(im, present, "float32")
    if weights is None:
        return counts
    if len(weights) <= int(ordinals.max()):
        raise bad_attr("weights", weights, " (fewer than the pool's n-grams)")
    scale = np.asarray(weights, dtype=np.float32)[ordinals].reshape(1, -1)
    return im.emit(wse.MulOp(counts, im.const(scale)))


def pool_counts(im: Importer, node: Node, rows: SSAValue) -> tuple[SSAValue, np.ndarray] | None:
    """``[R, K]`` counts of the pool's n-grams in the rows with their ordinals; None when no
    n-gram of the pool can occur."""
    low, high = int(node.attr("min_gram_length", 1)), int(node.attr("max_gram_length", 1))
    skips = int(node.attr("max_skip_count", 0))
    if low < 1 or high < low or skips < 0:
        raise NodeError(f"bad gram lengths {low}..{high} or max_skip_count {skips}")
    pieces, ordinals = [], []
    for n, grams, numbers in pool_levels(node, low, high):
        fits = representable(grams, dtype_of(rows))
        distances = [1] if n == 1 else range(1, skips + 2)
        counts = count_ngrams(im, rows, n, grams[fits], distances) if fits.any() else None
        if counts is not None:
            pieces.append(counts)
            ordinals.extend(numbers[fits].tolist())
    if not pieces:
        return None
    joined = pieces[0] if len(pieces) == 1 else im.emit(wse.ConcatOp(pieces, 1))
    return joined, np.asarray(ordinals, dtype=np.int64)


@register("TfIdfVectorizer")
def _tfidf_vectorizer(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    if len(shape) > 2:
        raise NodeError(f"the input {shape} must be [C] or [N, C]")
    if dtype_of(x).name not in ("int32", "int64"):
        raise NodeError(f"dtype {dtype_of(x)} is not supported (int32 or int64 tokens)")
    if node.attr("pool_strings", None) is not None:
        raise NodeError("attribute pool_strings is not supported (string tensors)")
    mode = node.attr("mode", None)
    if mode not in ("TF", "IDF", "TFIDF"):
        raise bad_attr("mode", mode, " (TF, IDF or TFIDF)")
    indexes = np.asarray(node.attr("ngram_indexes", []), dtype=np.int64)
    if not len(indexes) or indexes.min() < 0:
        raise bad_attr("ngram_indexes", indexes.tolist(), " (non-negative indices required)")
    size = int(indexes.max()) + 1
    num_rows = shape[0] if len(shape) == 2 else 1
    rows = reshape(im, x, (num_rows, prod(shape) // num_rows))
    found = pool_counts(im, node, rows)
    if found is None:
        y = im.const(np.zeros((num_rows, size), dtype=np.float32))
    else:
        counts, ordinals = found
        if int(ordinals.max()) >= len(indexes):
            raise bad_attr("ngram_indexes", indexes.tolist(), " (fewer than the pool's n-grams)")
        values = weigh_counts(im, node, counts, ordinals)
        placement = np.zeros((len(ordinals), size), dtype=np.float32)
        placement[np.arange(len(ordinals)), indexes[ordinals]] = 1.0
        y = im.emit(wse.MatmulOp(values, im.const(placement)))
    return [y if len(shape) == 2 else reshape(im, y, (size,))]


# ---------------------------------------------------------------------------------------------
# ImageDecoder
# ---------------------------------------------------------------------------------------------


@register("ImageDecoder")
def _image_decoder(im: Importer, node: Node) -> list:
    raise NodeError(
        "decoded images have data-dependent shapes (they depend on the encoded bytes); cgc "
        "compiles static shapes only"
    )
