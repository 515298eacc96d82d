"""Writing files so that nothing is ever left half-written."""

from __future__ import annotations

import errno
import fnmatch
import io
import os
import re
import shutil
import stat
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np


def write_atomically(path: str | os.PathLike[str], data: bytes | Iterable[bytes]) -> None:
    """Writes ``data`` (bytes, or pieces of them) to ``path`` through a temporary file in the
    same directory, renamed into place: a reader sees the old file or the whole new one, never
    a part. A symlink is written through: the file it points to is replaced. A device or FIFO
    (``/dev/null``, a pipe) is written to directly: renaming over it would replace it."""
    target = Path(os.path.realpath(path))
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if mode is not None and not stat.S_ISREG(mode):
        with open(target, "wb") as f:
            _write(f, data)
        return
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            _write(f, data)
        os.chmod(tmp, permissions(directory=False))  # mkstemp's are owner-only
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write(file: BinaryIO, data: bytes | Iterable[bytes]) -> None:
    if isinstance(data, bytes):
        file.write(data)
    else:
        file.writelines(data)


TEMPORARY = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}")
"""The name of ``write_atomically``'s temporary file (``tempfile.mkstemp``'s 8 random
characters after ``.NAME.``), and of a checkpoint's staging directory (``mkdtemp``'s)."""


def remove_stale_temporaries(directory: str | os.PathLike[str], names: Iterable[str]) -> list[Path]:
    """Removes the temporaries (files or directories) that a killed writer of the files
    ``names`` (``fnmatch`` patterns, e.g. ``step-*``) left in ``directory``, and returns
    them. Call it only while nothing else writes those files: it cannot tell a live writer's
    temporary from a dead one's."""
    root = Path(directory)
    if not root.is_dir():
        return []
    patterns = list(names)
    removed = []
    for entry in sorted(root.iterdir()):
        match = TEMPORARY.fullmatch(entry.name)
        if match is None or not any(fnmatch.fnmatchcase(match["name"], p) for p in patterns):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


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
