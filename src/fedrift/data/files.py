"""Reading dataset files from ``data.root``: one refusal per problem, naming the file.

Every loader that reads user files goes through these helpers, so a missing, truncated or
malformed file is a :class:`~fedrift.errors.DataError` (one line, exit 2) raised while the
dataset loads, before the run folder exists.
"""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import IO, Any

import numpy as np

from fedrift.errors import DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff", ".webp")


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


__all__ = ["DataError", "IMAGE_SUFFIXES", "check_md5", "field", "fit", "load_pickle", "malformed", "md5sum",
           "need_dir", "need_file", "need_root", "read_pickle", "resize_grey"]
