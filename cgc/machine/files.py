"""Writing files so that nothing is ever left half-written."""

from __future__ import annotations

import io
import os
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np


def write_atomically(path: str | os.PathLike[str], data: bytes | Iterable[bytes]) -> None:
    """Writes ``data`` (bytes, or pieces of them) to ``path`` through a temporary file in the
    same directory, renamed into place: a reader sees the old file or the whole new one, never
    a part."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                f.writelines(data)
        os.chmod(tmp, permissions(directory=False))  # mkstemp's are owner-only
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An ``.npz`` archive of ``arrays``, whatever their names (``np.savez`` takes its own
    keywords, ``file`` and ``allow_pickle``, out of the names)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
    return buffer.getvalue()


def permissions(directory: bool) -> int:
    """The mode a new file (or directory) gets under the process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask
