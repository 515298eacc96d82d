"""Figures for people: sizes in the units they read."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """``n`` bytes in KiB, MiB, GiB or TiB."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"
