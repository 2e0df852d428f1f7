"""One process at a time in a folder: ``fedrift compare``'s root, a run's ``output.dir``.

The lock is ``.fedrift.lock`` in the folder, held with ``fcntl.flock`` on an open file (taken
atomically by the kernel, released by it when the holder exits, however it dies) and holding
the holder's pid, host and start time, so a refusal can say who has the folder. A lock file
left by a killed process holds no flock, so the next process simply takes it over.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from fedrift.errors import FedriftError
from fedrift.safe_files import open_fd

LOCK_NAME = ".fedrift.lock"


class FolderInUse(FedriftError):
    """Another live process holds the folder (exit status 2)."""


class FolderLock:
    """Hold ``folder``'s lock from construction to :meth:`release` (or the process's end)."""

    def __init__(self, folder: Path, what: str) -> None:
        self.path = folder / LOCK_NAME
        while True:
            fd = open_fd(self.path, os.O_RDWR | os.O_CREAT)  # a link at its name is refused
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                raise FolderInUse(
                    f"{what}: {str(folder)!r} is in use by another fedrift process ({holder}); wait for it "
                    "to end, or choose another folder"
                ) from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # its holder removed it as we opened it: take the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode())
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)  # before the flock goes: a waiting process re-creates it
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "FolderLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(folder: Path) -> str | None:
    """The live process holding ``folder``'s lock (``pid N on HOST since ...``), else None: read
    from its file, not by taking the lock (a look would refuse a run starting at that moment)."""
    try:
        text = (folder / LOCK_NAME).read_text().strip()
    except OSError:
        return None
    parts = text.split()
    if len(parts) < 4 or parts[0] != "pid" or not parts[1].isdigit():
        return None
    if parts[3] != socket.gethostname():
        return text  # another machine's: cannot be checked from here
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return text


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _read(fd: int) -> str:
    text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    return text or "pid unknown"
