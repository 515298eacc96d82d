"""Writing files so that nothing is ever left half-written."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import io
import os
import re
import shutil
import stat
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO, ClassVar

import numpy as np

from cgc.errors import CgcError

USER_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.ENAMETOOLONG, errno.EACCES,
     errno.EPERM, errno.EPIPE}
)  # fmt: skip
"""Why a write fails for a reason of the user's system, not of cgc: a full disk or quota, a
file past the file system's largest, a read-only file system, a name too long, no
permission, a pipe whose reader went away."""


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turns an OSError of ``USER_ERRNOS`` raised while writing ``path`` into a one-line
    CgcError naming the path and the reason: the user can act on it (free space, choose
    another place), and it is no bug of cgc. The OSError of a low-level write names no file."""
    try:
        yield
    except OSError as error:
        if error.errno not in USER_ERRNOS:
            raise
        raise CgcError(f"{path}: cannot write ({os.strerror(error.errno)})") from None


def write_atomically(path: str | os.PathLike[str], data: bytes | Iterable[bytes]) -> None:
    """Writes ``data`` (bytes, or pieces of them) to ``path`` through a temporary file in the
    same directory, renamed into place: a reader sees the old file or the whole new one, never
    a part. A symlink is written through: the file it points to is replaced. A character
    device or FIFO (``/dev/null``, a pipe) is written to directly: renaming over it would
    replace it (a command's door opens a FIFO with ``open_pipe``, which does not wait for a
    reader). A write that fails (``writing``: a full disk is a CgcError) leaves the old file
    as it was and no temporary."""
    with writing(path):
        try:
            info: os.stat_result | None = os.stat(path)
        except FileNotFoundError:
            info = None
        if info is not None and stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if info is not None and not stat.S_ISREG(info.st_mode):
            with os.fdopen(_special_writer(path, info), "wb") as f:
                _write(f, data)
            return
        target = Path(os.path.realpath(path))
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_temporary_prefix(target))
        try:
            with os.fdopen(fd, "wb") as f:
                _write(f, data)
            os.chmod(tmp, permissions(directory=False))  # mkstemp's are owner-only
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _temporary_prefix(target: Path) -> str:
    """``.NAME.`` for ``mkstemp``, which adds 8 characters: NAME cut where the temporary's
    name would be longer than the file system takes, though ``target``'s own is not."""
    room = os.pathconf(target.parent, "PC_NAME_MAX") - 10  # two dots, 8 random characters
    name = target.name
    while len(os.fsencode(name)) > room:
        name = name[:-1]
    return f".{name}."


_PIPES: dict[tuple[int, int], int] = {}
"""Write ends of FIFOs that ``open_pipe`` opened at a command's door, by device and inode,
kept open until ``write_atomically`` writes into them."""


def open_pipe(path: str | os.PathLike[str]) -> None:
    """Opens the FIFO at ``path`` for writing now and keeps it open for ``write_atomically``:
    a FIFO with no reader is an OSError (ENXIO) at once, where a plain open would wait for a
    reader for ever; and the end is kept, since closing it would end the reader's input."""
    info = os.stat(path)
    if (info.st_dev, info.st_ino) not in _PIPES:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.set_blocking(fd, True)  # for the write: only the open must not wait
        _PIPES[info.st_dev, info.st_ino] = fd


def close_pipes() -> None:
    """Closes the FIFOs ``open_pipe`` opened and nothing wrote into (a command failed after
    its door): their readers see the end of their input instead of waiting."""
    while _PIPES:
        os.close(_PIPES.popitem()[1])


def _special_writer(path: str | os.PathLike[str], info: os.stat_result) -> int:
    """A descriptor that writes into the FIFO or character device at ``path``: the end
    ``open_pipe`` holds, or else a FIFO opened as ``open`` does, waiting for a reader; a
    CgcError for a file that is neither (a block device: an output is never meant to go
    over a disk)."""
    if stat.S_ISFIFO(info.st_mode):
        held = _PIPES.pop((info.st_dev, info.st_ino), None)
        return held if held is not None else os.open(path, os.O_WRONLY)
    if not stat.S_ISCHR(info.st_mode):
        raise CgcError(f"{path}: is {file_kind(info.st_mode)}, not a file to write")
    return os.open(path, os.O_WRONLY)


KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISREG, "a regular file"),
)
"""``stat``'s tests of what a file is, and what messages call it."""


def file_kind(mode: int) -> str:
    """What ``stat``'s ``mode`` says a file is, as a message names it ("a named pipe")."""
    return next((name for test, name in KINDS if test(mode)), "a file of an unknown kind")


def special_kind(path: str | os.PathLike[str]) -> str | None:
    """What the file at ``path`` is ("a named pipe") if it exists and is neither a regular
    file nor a directory: a reader must not read it, since a FIFO waits for a writer and a
    device such as ``/dev/zero`` never ends."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else file_kind(mode)


def append_whole(fd: int, path: str | os.PathLike[str], data: bytes, sync: bool = False) -> None:
    """Appends ``data`` to the file open as ``fd`` (with ``O_APPEND``), synced if ``sync``,
    whole or not at all: a write that fails part-way (a full disk) is cut off again, so that
    a journal keeps whole lines only; the failure is then ``writing``'s."""
    with writing(path):
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
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


LOCK = ".cgc.lock"
"""The file in a directory that a writing run holds locked (``DirectoryLock``)."""


class DirectoryLock:
    """An exclusive lock on a directory that a run writes (a training's model directory, a
    sweep's): a second run into it is refused at once instead of mixing its files with the
    first's. The lock is the kernel's (``flock`` on ``DIR/.cgc.lock``, removed when released),
    so a killed run's lock goes with its process and never blocks a ``--resume``. Within one
    process the lock nests (the command line takes it at its door, the trainer again); a
    directory the lock made is removed again if nothing was written into it."""

    _held: ClassVar[dict[str, int]] = {}
    """The directories this process holds locked (by real path), and how many times."""

    def __init__(self, directory: str | os.PathLike[str], shown: str):
        self.directory = Path(directory)
        self.shown = shown
        """How messages name the directory (its option and path)."""
        self.fd: int | None = None
        self.made = False
        """Whether ``acquire`` made the directory."""
        self.key: str | None = None

    def acquire(self) -> None:
        """Takes the lock, making the directory if need be; a CgcError if another process
        holds it."""
        self.made = not self.directory.exists()
        with writing(self.directory):  # a full disk or a read-only one: one line
            self.directory.mkdir(parents=True, exist_ok=True, mode=permissions(directory=True))
            key = os.path.realpath(self.directory)
            if key not in self._held:
                self.fd = self._locked(self.directory / LOCK)
        self.key = key
        self._held[key] = self._held.get(key, 0) + 1

    def _locked(self, path: Path) -> int:
        """A descriptor of ``path`` holding its flock."""
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, permissions(directory=False))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise CgcError(
                    f"{self.shown}: another cgc run (process {holder}) is writing there; wait "
                    "for it to end or choose another directory"
                ) from None
            if _same_file(fd, path):
                os.ftruncate(fd, 0)
                os.write(fd, str(os.getpid()).encode())
                return fd
            os.close(fd)  # its holder removed the file as we opened it: lock the next one

    def release(self) -> None:
        """Drops the lock and its file (removed while still held, so a run waiting on the
        old file sees that it is gone and locks a new one)."""
        if self.key is None:
            return
        self._held[self.key] -= 1
        if not self._held[self.key]:
            del self._held[self.key]
            (self.directory / LOCK).unlink(missing_ok=True)
            if self.fd is not None:
                os.close(self.fd)  # closing the last descriptor drops the flock
        if self.made:
            with contextlib.suppress(OSError):  # not empty: the run wrote there
                self.directory.rmdir()
        self.fd, self.key = None, None

    def __enter__(self) -> DirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is the one at ``path`` now."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (opened.st_dev, opened.st_ino)


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
