"""The element types cgc computes with, as numpy dtypes.

numpy has no bfloat16, float8, float4 or 4-bit integers; ``ml_dtypes`` adds them as numpy
dtypes (``np.dtype("bfloat16")`` works once it is imported). Their numpy ``kind`` is ``V``, so
code asks these helpers rather than ``dtype.kind``.
"""

from __future__ import annotations

from functools import cache

import ml_dtypes
import numpy as np

EXTENDED_FLOATS = (
    "bfloat16",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn",
)
"""Float types that ml_dtypes provides."""
EXTENDED_INTS = ("int4", "uint4", "int2", "uint2")
"""Sub-byte integer types that ml_dtypes provides (stored one per byte)."""


# the helpers below are remembered: the compiler's cost queries and the simulator's kernels ask
# them about a few types again and again, and numpy makes a dtype's name anew on every ask


@cache
def dtype(name: str | np.dtype | type) -> np.dtype:
    """The numpy dtype of a name, including the ml_dtypes ones."""
    if isinstance(name, str) and name in (*EXTENDED_FLOATS, *EXTENDED_INTS):
        name = getattr(ml_dtypes, name)
    return np.dtype(name)


@cache
def name(dt: np.dtype | str) -> str:
    """The name of ``dt`` (``float32``, ``bfloat16``)."""
    return dtype(dt).name


@cache
def is_float(dt: np.dtype | str) -> bool:
    """Whether ``dt`` holds floating-point values."""
    dt = dtype(dt)
    return dt.kind == "f" or dt.name in EXTENDED_FLOATS


@cache
def is_integer(dt: np.dtype | str) -> bool:
    """Whether ``dt`` holds integers (bool excluded)."""
    dt = dtype(dt)
    return dt.kind in "iu" or dt.name in EXTENDED_INTS


@cache
def is_extended(dt: np.dtype | str) -> bool:
    """Whether ``dt`` is one of ml_dtypes' types, which some libraries cannot store."""
    return dtype(dt).name in (*EXTENDED_FLOATS, *EXTENDED_INTS)


def storage(dt: np.dtype | str) -> np.dtype:
    """The plain unsigned integer type of the same width, to store ``dt``'s bits."""
    return np.dtype(f"uint{8 * dtype(dt).itemsize}")


def finite_range(dt: np.dtype | str) -> tuple[float, float]:
    """The smallest and largest finite values of a float type."""
    info = ml_dtypes.finfo(dtype(dt))
    return float(info.min), float(info.max)


def integer_range(dt: np.dtype | str) -> tuple[int, int]:
    """The smallest and largest values of an integer type (the 4- and 2-bit ones included)."""
    info = ml_dtypes.iinfo(dtype(dt))
    return int(info.min), int(info.max)


def bits(dt: np.dtype | str) -> int:
    """How many bits a value of ``dt`` has (a bool has a byte's)."""
    dt = dtype(dt)
    if is_float(dt):
        return int(ml_dtypes.finfo(dt).bits)
    if is_integer(dt):
        return int(ml_dtypes.iinfo(dt).bits)
    return 8 * dt.itemsize
