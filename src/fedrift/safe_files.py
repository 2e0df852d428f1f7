"""Writing into folders fedrift does not own outright: run, compare, study, select and report
folders, which travel (tar, shared disks, a colleague's results) and may hold links.

Every file goes in without following a link at its own name: a link there is refused with one
line (:class:`LinkRefused`), never written through, never silently replaced. Whole files are
written beside their name and renamed into place (:func:`atomic_file`, :func:`write_atomic`), so
a reader, a resume or a kill never meets a torn one; appends open with ``O_NOFOLLOW``
(:func:`open_append`). A folder made inside one is refused when a link stands at its name
(:func:`make_dir`). The folder the user named is theirs to place (a link to another disk is
fine); what is *in* it is not trusted. Threat model: docs/concepts/security.md.
"""

from __future__ import annotations

import errno
import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from fedrift.errors import OutputError

FILE_MODE = 0o644
NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class LinkRefused(OutputError):
    """A symbolic link where fedrift was to write a file or make a folder (exit status 2)."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            f"{path} is a symbolic link; fedrift never writes through a link in a folder it writes "
            "(it could point anywhere); allowed: remove the link, or choose another folder"
        )


def refuse_link(path: Path) -> None:
    """:class:`LinkRefused` when ``path`` itself is a symbolic link (dangling or not)."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise LinkRefused(Path(path))
    except FileNotFoundError:
        pass


def make_dir(path: Path, parents: bool = True) -> Path:
    """``mkdir -p`` that refuses a link at ``path`` (a link at the folder's own place is
    followed by ``mkdir(exist_ok=True)`` without a word)."""
    path = Path(path)
    refuse_link(path)
    path.mkdir(parents=parents, exist_ok=True)
    refuse_link(path)  # made by someone else meanwhile
    return path


def _temp_beside(path: Path, mode: int) -> tuple[Path, int]:
    """A new file beside ``path`` (``O_EXCL``: never an existing file or a link), open for writing."""
    for n in range(100):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{n}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path))


@contextmanager
def atomic_file(path: Path, mode: int = FILE_MODE, durable: bool = False) -> Iterator[BinaryIO]:
    """A binary file that becomes ``path`` whole when the block ends, or not at all (an
    exception, a kill: the temporary file is removed, or left as ``.NAME.PID.N.tmp`` by a
    kill). ``durable``: flushed to the disk before the rename (a checkpoint, which a power
    cut must not leave empty under its final name)."""
    path = Path(path)
    refuse_link(path)
    tmp, fd = _temp_beside(path, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        refuse_link(path)
        os.replace(tmp, path)  # rename never follows a link at its target: it would replace it
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def write_atomic(path: Path, data: bytes | str, mode: int = FILE_MODE, durable: bool = False) -> None:
    """All of ``data`` (text as UTF-8) as ``path``, by :func:`atomic_file`."""
    with atomic_file(path, mode, durable) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def copy_file(source: Path, dest: Path) -> None:
    """``source``'s bytes as ``dest``, by :func:`atomic_file` (``shutil.copyfile`` writes through a link)."""
    import shutil

    with open(source, "rb") as src, atomic_file(dest) as out:
        shutil.copyfileobj(src, out)


def open_append(path: Path, buffering: int = -1) -> BinaryIO:
    """``path`` opened to append (created when missing), refusing a link at its name."""
    return _open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "ab", buffering)


def open_update(path: Path) -> BinaryIO:
    """``path`` opened to read and write in place (created when missing; a lock file, a cut
    metrics file), refusing a link at its name."""
    return _open(path, os.O_RDWR | os.O_CREAT, "r+b", 0)


def open_new(path: Path) -> BinaryIO:
    """``path`` emptied (or created) and opened to write and read back, refusing a link at its name."""
    return _open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, "r+b", 0)


def open_fd(path: Path, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open(path, flags)`` that refuses a link (:class:`LinkRefused`) or anything but a
    plain file at ``path`` (a FIFO is not waited on)."""
    try:
        fd = os.open(path, flags | NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise LinkRefused(Path(path)) from None
        if err.errno == errno.ENXIO:  # a FIFO with no reader
            raise OutputError(f"{path} is not a plain file; allowed: remove it, or choose another folder") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OutputError(f"{path} is not a plain file; allowed: remove it, or choose another folder")
    os.set_blocking(fd, True)
    return fd


def _open(path: Path, flags: int, mode: str, buffering: int) -> BinaryIO:
    return os.fdopen(open_fd(path, flags), mode, buffering=buffering)  # type: ignore[return-value]


__all__ = ["LinkRefused", "atomic_file", "copy_file", "make_dir", "open_append", "open_fd", "open_new", "open_update", "refuse_link",
           "write_atomic"]
