"""fedrift's file cache: work that is a pure function of input files (decoded images, frozen
text embeddings) is kept under ``$FEDRIFT_CACHE`` (default ``~/.cache/fedrift``), named by a
hash of what it was computed from, so a second run reads it instead of computing it again.

A cache entry is only ever a copy of a result: an unreadable or read-only cache folder costs
time, never a different result.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """The cache folder (not created here)."""
    return Path(os.environ.get("FEDRIFT_CACHE") or Path.home() / ".cache" / "fedrift")


def save_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` then rename ``tmp`` to ``path``: a reader never sees half a file, and two
    runs filling the same entry at once both leave a whole one. OSError (a read-only or full
    disk) is swallowed: the caller already has its result."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


__all__ = ["cache_dir", "save_atomic"]
