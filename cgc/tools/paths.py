"""The files and directories a user hands the command line, checked before any work starts:
an error found after a long compile or training would throw the work away.

Every check ends in a one-line ``CgcError`` that names the option (or argument) and the
path. Outputs are probed by creating a temporary file where the output will go, since
``os.access`` says yes to root even in ``/proc`` or on a read-only mount.
"""

from __future__ import annotations

import os
import stat
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

from cgc.errors import CgcError


def _one_line(error: BaseException) -> str:
    """An exception's message on one line (numpy's and zipfile's can span several)."""
    text = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return " ".join(text.split())


def given(path: str, option: str) -> str:
    """``path``, unless it is empty (which would mean the current directory, or nothing)."""
    if not path:
        raise CgcError(f"{option}: empty path")
    return path


def input_file(path: str, option: str) -> Path:
    """``path`` if it names a readable file."""
    source = Path(given(path, option))
    try:
        mode = source.stat().st_mode
    except FileNotFoundError:
        raise CgcError(f"{option} {path}: no such file") from None
    except OSError as e:
        raise CgcError(f"{option} {path}: {_one_line(e).lower()}") from None
    if stat.S_ISDIR(mode):
        raise CgcError(f"{option} {path}: is a directory, not a file")
    if not os.access(source, os.R_OK):
        raise CgcError(f"{option} {path}: not readable (permission denied)")
    return source


def _probe(directory: Path, shown: str) -> None:
    """A CgcError unless a file can be created in ``directory`` (an existing directory)."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".cgc-probe.")
    except OSError as e:
        raise CgcError(f"{shown}: cannot write in {directory} ({_one_line(e).lower()})") from None
    os.close(fd)
    os.unlink(probe)


def _existing_ancestor(path: Path) -> Path:
    """The nearest of ``path``'s ancestors that exists (as anything)."""
    for parent in path.parents:
        if os.path.lexists(parent):
            return parent
    return Path(".")


def _check_parent(path: Path, shown: str) -> None:
    """A CgcError unless ``path``'s directory exists, is a directory and takes new files."""
    parent = path.parent
    if not parent.exists():
        ancestor = _existing_ancestor(parent)
        if not ancestor.is_dir():
            raise CgcError(f"{shown}: {ancestor} is not a directory")
        raise CgcError(f"{shown}: directory {parent} does not exist")
    if not parent.is_dir():
        raise CgcError(f"{shown}: {parent} is not a directory")
    _probe(parent, shown)


def output_file(path: str, option: str) -> Path:
    """``path``, if a file can be written there: its directory exists and takes new files, and
    it is not a directory. A symlink counts as what it points to; a device or FIFO (written
    to directly, never replaced) must be writable."""
    target = Path(given(path, option))
    real = Path(os.path.realpath(target))
    if real.is_dir():
        raise CgcError(f"{path}: is a directory; {option} names a file")
    if real.exists() and not real.is_file():  # a device or FIFO takes the bytes as it is
        if not os.access(real, os.W_OK):
            raise CgcError(f"{path}: not writable (permission denied)")
        return target
    _check_parent(real, path)
    return target


def output_directory(path: str, option: str) -> Path:
    """``path``, if it is a directory that takes new files, or can be made one."""
    target = Path(given(path, option))
    if target.exists():
        if not target.is_dir():
            raise CgcError(f"{option} {path}: exists and is not a directory")
        _probe(target, f"{option} {path}")
        return target
    if os.path.lexists(target):  # a symlink to nothing
        raise CgcError(f"{option} {path}: a broken symbolic link, not a directory")
    ancestor = _existing_ancestor(target)
    if not ancestor.is_dir():
        raise CgcError(f"{option} {path}: {ancestor} is not a directory")
    _probe(ancestor, f"{option} {path}")
    return target


def load_npz(path: str, option: str) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` archive at ``path``, each member a plain array (never one
    that needs pickle)."""
    source = input_file(path, option)
    if not zipfile.is_zipfile(source):
        raise CgcError(f"{option} {path}: not an .npz archive (not a zip file, or truncated)")
    arrays = {}
    try:
        # np.load leaves a file it opened open when the zip directory is broken
        with open(source, "rb") as file, np.load(file, allow_pickle=False) as archive:
            for name in archive.files:
                arrays[name] = _member(archive, name, option, path)
    except CgcError:
        raise
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise CgcError(
                f"{option} {path}: holds Python objects, which need pickle (never loaded)"
            ) from None
        raise CgcError(f"{option} {path}: not a readable .npz file ({_one_line(e)})") from None
    except (OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise CgcError(f"{option} {path}: not a readable .npz file ({_one_line(e)})") from None
    return arrays


def _member(archive, name: str, option: str, path: str) -> np.ndarray:
    """One member of an npz archive, if it is an array (numpy hands other members back as
    their raw bytes)."""
    value = archive[name]
    if not isinstance(value, np.ndarray):
        raise CgcError(f"{option} {path}: member '{name}' is not a .npy array")
    return value


def input_text(path: str, option: str) -> str:
    """The UTF-8 text of the file at ``path``."""
    source = input_file(path, option)
    try:
        return source.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise CgcError(
            f"{option} {path}: not a UTF-8 text file (byte {e.start} is {e.object[e.start]:#04x})"
        ) from None
    except OSError as e:
        raise CgcError(f"{option} {path}: {_one_line(e).lower()}") from None


def model_argument(spec: str, argument: str) -> str:
    """A MODEL or ARTIFACT argument, unless it is empty or names a directory (any other
    problem with it is its reader's to name)."""
    if not spec:
        raise CgcError(f"{argument}: empty path")
    if Path(spec).is_dir():
        raise CgcError(f"{argument} {spec}: is a directory, not a file")
    return spec
