"""Reading dataset files from ``data.root``: one refusal per problem, naming the file.

Every loader that reads user files goes through these helpers, so a missing, truncated or
malformed file is a :class:`~fedrift.errors.DataError` (one line, exit 2) raised while the
dataset loads, before the run folder exists.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import numpy as np

from fedrift.errors import DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff", ".webp")

MiB = 1 << 20
ZIP_RATIO = 100  # bytes out per byte of archive: images and arrays of real data expand 1-10x
ZIP_FLOOR = 64 * MiB  # below this the members are read whatever their ratio (a blank image deflates 1000x)


def need_root(root: Path | None, name: str, holds: str, file_ok: bool = False) -> Path:
    """``root``, or a refusal saying what the folder must hold; a file where a folder is
    read (``file_ok=False``) is called a file, not a folder that misses what it should hold."""
    if root is None:
        raise DataError(f"data.root: data.name {name} reads its files from a folder; set data.root=DIR holding {holds}")
    if not file_ok and root.is_file():
        raise DataError(f"data.root: {root} is a file; data.name {name} reads a folder; allowed: a folder holding {holds}")
    return root


def need_file(path: Path, expected: str) -> Path:
    if not path.is_file():
        raise DataError(f"data: {path} is missing; expected {expected}")
    return path


def need_dir(path: Path, expected: str) -> Path:
    if not path.is_dir():
        raise DataError(f"data: folder {path} is missing; expected {expected}")
    return path


def malformed(path: Path | str, expected: str, why: str = "") -> DataError:
    detail = f" ({why})" if why else ""
    return DataError(f"data: {path} is truncated or malformed{detail}; expected {expected}")


def size_text(n: int) -> str:
    """``5000 bytes``, ``65 MiB``, ``1.5 MiB``: a size in a refusal."""
    return f"{n} bytes" if n < MiB else f"{n / MiB:,.1f}".rstrip("0").rstrip(".") + " MiB"


def check_expansion(archive: Path | str, members: Iterable[zipfile.ZipInfo], what: str, hint: str = "") -> None:
    """Refuse a zip bomb from the archive's directory, before a member is read: ``members``
    (those to be read) expanding past :data:`ZIP_FLOOR` in all at more than :data:`ZIP_RATIO`
    bytes per byte of the archive. ``what`` names them (``image files``); ``hint`` adds to what
    is allowed."""
    total = sum(info.file_size for info in members)
    size = max(Path(archive).stat().st_size, 1)
    if total > max(ZIP_FLOOR, ZIP_RATIO * size):
        raise DataError(
            f"data.root: {archive}: its {what} expand to {size_text(total)} from {size_text(size)} "
            f"({total // size:,}:1); allowed: at most {ZIP_RATIO}:1 beyond {size_text(ZIP_FLOOR)}{hint} (a zip bomb?)"
        )


def read_bounded(path: Any, limit: int, what: str) -> bytes:
    """The bytes of ``path`` (a file, or a zip member: ``image_cache.ZipTree``), refused unread when it
    holds more than ``limit`` bytes: ``what`` names the kind (``image files``). A folder's
    file is read at most ``limit + 1`` bytes, so one that grows meanwhile is caught too."""
    if not isinstance(path, (str, os.PathLike)):  # a zip member: its size from the archive's directory (zipfile reads no more)
        size = path.info().file_size
        if size > limit:
            raise too_big(path, size, limit, what)
        return path.read_bytes()
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        size = max(Path(path).stat().st_size, len(data))
        raise too_big(path, size, limit, what)
    return data


def too_big(path: Any, size: int, limit: int, what: str) -> DataError:
    return DataError(f"data.root: {path} is {size_text(size)}; allowed: {what} of at most {size_text(limit)}")


def md5sum(path: Path) -> str:
    h = hashlib.md5()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_md5(path: Path, published: str) -> None:
    """Refuse a file whose md5 is not the published one (a partial or altered download)."""
    got = md5sum(path)
    if got != published:
        raise DataError(f"data: {path} has md5 {got}; expected the published {published} (a partial or altered download?)")


class _ArraysOnly(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only: a dataset file cannot run code."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),  # bytes in a protocol-2 pickle written by Python 3
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        return super().find_class(module, name)


def load_pickle(f: IO[bytes], path: Path | str, expected: str) -> Any:
    """A Python-2 era pickle (CIFAR's), keys as bytes; containers and numpy arrays only."""
    try:
        return _ArraysOnly(f, encoding="bytes").load()
    except Exception as err:  # truncated, not a pickle, or a refused global
        raise malformed(path, expected, f"{type(err).__name__}: {err}") from None


def read_pickle(path: Path, expected: str) -> Any:
    with need_file(path, expected).open("rb") as f:
        return load_pickle(f, path, expected)


def field(doc: Any, key: str, path: Path | str, expected: str) -> Any:
    """``doc[key]`` of a dict whose keys may be bytes (Python 2 pickles) or str."""
    if isinstance(doc, dict):
        for k in (key.encode(), key):
            if k in doc:
                return doc[k]
    raise malformed(path, expected, f"no key {key!r}")


def fit(img: Any, size: int) -> Any:
    """A Pillow image resized bilinearly to ``size`` x ``size`` (as it is if already that size)."""
    from PIL import Image

    return img if img.size == (size, size) else img.resize((size, size), Image.Resampling.BILINEAR)


def resize_grey(x: np.ndarray, size: int) -> np.ndarray:
    """uint8 grey images ``(n, H, W)`` resized as ``image_cache.read_image`` resizes a file: ``(n, size, size)``."""
    from PIL import Image

    out = np.empty((len(x), size, size), dtype=np.uint8)
    for i, img in enumerate(x):
        out[i] = np.asarray(fit(Image.fromarray(np.ascontiguousarray(img, dtype=np.uint8), mode="L"), size))
    return out


__all__ = ["DataError", "IMAGE_SUFFIXES", "ZIP_FLOOR", "ZIP_RATIO", "check_expansion", "check_md5", "field", "fit",
           "load_pickle", "malformed", "md5sum", "need_dir", "need_file", "need_root", "read_bounded", "read_pickle",
           "resize_grey", "size_text", "too_big"]
