"""The files and directories a user hands the command line, checked before any work starts:
an error found after a long compile or training would throw the work away.

Every check ends in a one-line ``CgcError`` that names the option (or argument) and the
path. Outputs are probed by creating a temporary file where the output will go, since
``os.access`` says yes to root even in ``/proc`` or on a read-only mount. An input is read
only if it is a regular file: a FIFO would wait for a writer, and a device such as
``/dev/zero`` never ends. ``distinct_files`` refuses an output that is one of the command's
inputs (or another output) before anything is written over it.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
import tempfile
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from cgc.errors import CgcError
from cgc.files import LOCK, file_kind, open_pipe


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
    """``path`` if it names a readable regular file (or a symlink to one)."""
    source = Path(given(path, option))
    try:
        mode = source.stat().st_mode
    except FileNotFoundError:
        raise CgcError(f"{option} {path}: no such file") from None
    except OSError as e:
        raise CgcError(f"{option} {path}: {_one_line(e).lower()}") from None
    if stat.S_ISDIR(mode):
        raise CgcError(f"{option} {path}: is a directory, not a file")
    if not stat.S_ISREG(mode):
        raise CgcError(f"{option} {path}: is {file_kind(mode)}, not a regular file")
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
    """``path``, if a file can be written there: its directory exists and takes new files, its
    name is not too long, and it is not a directory. A symlink counts as what it points to. A
    character device (``/dev/null``, written to directly, never replaced) must be writable; a
    FIFO must have a reader, and is opened now (``open_pipe``) so that the write cannot wait
    for one for ever; a block device or a socket is refused."""
    target = Path(given(path, option))
    try:
        _check_output(target, option, path)
    except OSError as e:
        raise CgcError(f"{option} {path}: {_one_line(e).lower()}") from None
    return target


def _check_output(target: Path, option: str, path: str) -> None:
    """``output_file``'s checks; an OSError where the system refuses the path itself (a name
    too long)."""
    try:
        mode = target.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        _check_parent(Path(os.path.realpath(target)), path)
        return
    if stat.S_ISDIR(mode):
        raise CgcError(f"{path}: is a directory; {option} names a file")
    if stat.S_ISREG(mode):
        _check_parent(Path(os.path.realpath(target)), path)
    elif not os.access(target, os.W_OK):
        raise CgcError(f"{path}: not writable (permission denied)")
    elif stat.S_ISFIFO(mode):
        try:
            open_pipe(target)
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
            raise CgcError(f"{option} {path}: a named pipe that no process reads") from None
    elif not stat.S_ISCHR(mode):
        raise CgcError(f"{option} {path}: is {file_kind(mode)}; {option} names a file")


def output_directory(path: str, option: str) -> Path:
    """``path``, if it is a directory that takes new files, or can be made one (its names not
    too long)."""
    target = Path(given(path, option))
    shown = f"{option} {path}"
    try:
        _check_directory(target, shown)
    except OSError as e:
        raise CgcError(f"{shown}: {_one_line(e).lower()}") from None
    return target


def _check_directory(target: Path, shown: str) -> None:
    """``output_directory``'s checks; an OSError where the system refuses the path itself."""
    if target.exists():
        if not target.is_dir():
            raise CgcError(f"{shown}: exists and is not a directory")
        _probe(target, shown)
        return
    if os.path.lexists(target):  # a symlink to nothing
        raise CgcError(f"{shown}: a broken symbolic link, not a directory")
    ancestor = _existing_ancestor(target)
    if not ancestor.is_dir():
        raise CgcError(f"{shown}: {ancestor} is not a directory")
    _probe(ancestor, shown)
    _check_lengths(target, ancestor)


def _check_lengths(path: Path, ancestor: Path) -> None:
    """ENAMETOOLONG, as making ``path`` would raise it later, if one of its names or the
    whole path is longer than the file system of ``ancestor`` (its existing part) takes."""
    longest = os.pathconf(ancestor, "PC_NAME_MAX")
    whole = os.fsencode(os.path.abspath(path))
    if len(whole) >= os.pathconf(ancestor, "PC_PATH_MAX") or any(
        len(os.fsencode(name)) > longest for name in path.parts
    ):
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), str(path))


Named = tuple[str, str | os.PathLike[str] | None]
"""An option (or argument) and the path it names, None where it is not given."""


def distinct_files(
    inputs: Iterable[Named], outputs: Iterable[Named], trees: Iterable[Named] = ()
) -> None:
    """A one-line CgcError, naming both options and the path, if an output is one of the
    command's inputs or two outputs are one file: writing it would destroy the input (or
    the other output). Files are compared as the system sees them, by device and inode, so
    that a symlink or a hard link counts; an output that does not exist yet by its real path.
    Any number of outputs may go to one character device (``/dev/null``). ``trees`` are
    directories the command replaces whole: an input inside one is lost as well. Inputs that
    do not exist are left to their readers to name."""
    read = [(_identity(path), option, path) for option, path in inputs if path is not None]
    read = [entry for entry in read if entry[0][0] == "file"]
    written: list[tuple[tuple, str, str | os.PathLike[str]]] = []
    for option, path in outputs:
        if path is None or (key := _identity(path))[0] == "device":
            continue
        for others, advice in ((read, ", an input it would destroy"),
                               (written, "; give each output its own file")):  # fmt: skip
            clash = next((entry for entry in others if entry[0] == key), None)
            if clash is not None:
                raise CgcError(f"{option} {path}: the same file as {clash[1]} {clash[2]}{advice}")
        written.append((key, option, path))
    for option, path in trees:
        if path is None:
            continue
        root = os.path.join(os.path.realpath(path), "")
        for _, other, other_path in read:
            if os.path.realpath(other_path).startswith(root):
                raise CgcError(
                    f"{other} {other_path}: inside {option} {path}, which this command "
                    "replaces; copy it elsewhere first"
                )


def _identity(path: str | os.PathLike[str]) -> tuple:
    """What tells files apart: an existing file's device and inode (what a symlink or a
    hard link shares), a character device as such, else the real path."""
    try:
        info = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    if stat.S_ISCHR(info.st_mode):
        return ("device",)
    return ("file", info.st_dev, info.st_ino)


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
            _check_sizes(archive.zip, os.fstat(file.fileno()).st_size, option, path)
            for name in archive.files:
                arrays[name] = _member(archive, name, option, path)
    except CgcError:
        raise
    except MemoryError as e:
        raise CgcError(f"{option} {path}: too large to load ({_one_line(e)})") from None
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise CgcError(
                f"{option} {path}: holds Python objects, which need pickle (never loaded)"
            ) from None
        raise CgcError(f"{option} {path}: not a readable .npz file ({_one_line(e)})") from None
    except (OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise CgcError(f"{option} {path}: not a readable .npz file ({_one_line(e)})") from None
    return arrays


_MOST_EXPANSION = {zipfile.ZIP_STORED: 1, zipfile.ZIP_DEFLATED: 1032}
"""How many times its compressed size a member of a zip file can hold at most, by
compression (deflate's limit is 1032 to 1)."""


def _check_sizes(archive: zipfile.ZipFile, size: int, option: str, path: str) -> None:
    """A CgcError for a ``.npy`` member whose header claims more bytes than the member holds
    (a truncated or forged header; the zip directory's sizes bounded by the ``size`` bytes
    of the archive): numpy allocates the claimed array before it reads a byte of it, 233 TiB
    for a forged shape. A member that is no ``.npy`` array is left to ``_member``."""
    for info in archive.infolist():
        if not info.filename.endswith(".npy"):
            continue
        with archive.open(info) as stream:
            try:
                version = np.lib.format.read_magic(stream)
            except ValueError:
                continue
            # version 3.0 differs from 2.0 in the encoding of field names alone
            header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = header(stream)
            start = stream.tell()
        if dtype.hasobject:  # pickled: refused by np.load
            continue
        claimed = math.prod(shape) * dtype.itemsize
        expansion = _MOST_EXPANSION.get(info.compress_type)
        most = info.file_size if expansion is None else min(info.compress_size, size) * expansion
        held = max(min(info.file_size, most) - start, 0)
        if claimed > held:
            raise CgcError(
                f"{option} {path}: member '{info.filename}' claims a {dtype} array of shape "
                f"{tuple(shape)} ({claimed} bytes) but holds {held} bytes (a truncated or "
                "forged header)"
            )


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


_FACTORY = re.compile(r"(?P<file>.+\.py):[^/\\]*")
"""A MODEL that names a PyTorch module's factory, ``file.py:factory``."""


def model_file(spec: str) -> str | None:
    """The file a MODEL (or ARTIFACT) argument reads: itself, the file of
    ``file.py:factory``, or None for ``zoo:NAME``, a built-in model."""
    if ":" not in spec:  # a plain path: reading an artifact imports no frontend
        return spec
    from cgc.frontends.params import ZOO_PREFIX

    if spec.startswith(ZOO_PREFIX):
        return None
    factory = _FACTORY.fullmatch(spec)
    return factory["file"] if factory else spec


def model_argument(spec: str, argument: str) -> str:
    """A MODEL or ARTIFACT argument, unless it is empty or names something that exists but
    is no readable regular file (a missing file is its reader's to name)."""
    if not spec:
        raise CgcError(f"{argument}: empty path")
    file = model_file(spec)
    if file is not None and _exists(file, argument):
        input_file(file, argument)
    return spec


def _exists(path: str, option: str) -> bool:
    """Whether ``path`` exists; a CgcError where the system refuses the path itself."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise CgcError(f"{option} {path}: {_one_line(e).lower()}") from None
    return True


DUMPED = re.compile(r"\d{2}-.+\.mlir")
"""The names ``--dump-ir`` writes in its directory: ``NN-<pass>.mlir``."""


def not_dumped_over(inputs: dict[str, str | None], directory: str) -> None:
    """A CgcError if an input is a file ``--dump-ir`` may write over: named as a dump, in
    ``directory`` (also through a symlink)."""
    where = os.path.realpath(directory)
    for option, path in inputs.items():
        if path is None:
            continue
        real = os.path.realpath(path)
        if os.path.dirname(real) == where and DUMPED.fullmatch(os.path.basename(real)):
            raise CgcError(
                f"{option} {path}: --dump-ir {directory} writes files of that name there, an "
                "input it would destroy; copy it elsewhere first"
            )


def model_dir_files(
    model_dir: str | None, timing_only: bool, options: dict
) -> tuple[list[Named], list[Named]]:
    """What ``cgc train`` writes in ``model_dir``: the files, and the checkpoints' directory
    where the run replaces it (a new run deletes the old checkpoints, a checkpointing one
    replaces a step saved again)."""
    if model_dir is None:
        return [], []
    names = ["timing.jsonl"] if timing_only else ["metrics.jsonl", "weights.safetensors"]
    files: list[Named] = [("--model-dir", str(Path(model_dir, n))) for n in [*names, LOCK]]
    replaced = not timing_only and (not options["resume"] or options["checkpoint_every"])
    trees: list[Named] = [("--model-dir", str(Path(model_dir, "checkpoints")))] if replaced else []
    return files, trees
