"""``npz``: the user's own arrays, one ``.npz`` file with ``x_train, y_train, x_test, y_test``.

``x`` is either uint8 images, ``(N, H, W)`` (one channel) or ``(N, H, W, C)`` (numpy's and
Keras' layout; ``layout: nchw`` for ``(N, C, H, W)``), kept as uint8 and normalised per
channel with the training split's statistics; or float features of any shape ``(N, ...)``,
used as model input as they are. ``y`` holds integer class ids from 0. The archive's members
are bounded before they are read (:func:`fedrift.data.files.check_expansion`), the class ids
against the sample count (:func:`fedrift.data.base.class_count`).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from fedrift.data import DATASETS
from fedrift.data.base import Dataset, arrays_dataset
from fedrift.data.files import DataError, check_expansion, malformed, need_file, need_root
from fedrift.params import params

KEYS = ("x_train", "y_train", "x_test", "y_test")
EXPECTED = "an .npz with x_train, y_train, x_test, y_test (x: uint8 images or float features; y: int class ids)"


@params
class NpzParams:
    """``file``: the .npz in data.root (None: the only one there); ``layout`` of 4-D uint8
    images; ``num_classes`` (None: the largest label + 1)."""

    file: str | None = None
    layout: Literal["nhwc", "nchw"] = "nhwc"
    num_classes: Annotated[int, Field(ge=1)] | None = None


def _find(root: Path, file: str | None) -> Path:
    if root.is_file():  # data.root=the .npz itself
        if root.suffix.lower() != ".npz" or file is not None:
            raise DataError(f"data.root: {root} is a file; expected a folder holding one .npz, or the .npz itself (without data.file)")
        return root
    if file is not None:
        return need_file(root / file, EXPECTED)
    found = sorted(root.glob("*.npz"))
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise DataError(f"data.file: {root} holds {len(found)} .npz files ({names}); expected one, or set data.file")
    return found[0]


def _read(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in KEYS if k not in npz.files]
            if missing:
                raise malformed(path, EXPECTED, f"no {', '.join(missing)}")
            if isinstance(getattr(npz, "zip", None), zipfile.ZipFile):  # sizes from its directory, before reading
                members = [npz.zip.getinfo(f"{k}.npy") for k in KEYS if f"{k}.npy" in npz.zip.NameToInfo]
                check_expansion(path, members, "arrays", ", or arrays saved uncompressed (np.savez)")
            return {k: npz[k] for k in KEYS}
    except DataError:
        raise
    except (OSError, ValueError, EOFError, MemoryError, zipfile.BadZipFile) as err:
        raise malformed(path, EXPECTED, f"{type(err).__name__}: {err}") from None


def _images(x: np.ndarray, layout: str) -> np.ndarray:
    if x.ndim == 3:
        return x[:, None]
    return x if layout == "nchw" else x.transpose(0, 3, 1, 2)


@DATASETS.register("npz", "your arrays: data.root/<file>.npz with x_train, y_train, x_test, y_test", params=NpzParams)
def load_npz(root: Path | None, options: NpzParams) -> Dataset:
    path = _find(need_root(root, "npz", "one .npz file", file_ok=True), options.file)
    a = _read(path)
    for split in ("train", "test"):
        x, y = a[f"x_{split}"], a[f"y_{split}"]
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer) or len(y) != len(x):
            raise malformed(path, EXPECTED, f"y_{split} is {y.dtype} {y.shape} beside x_{split} {x.shape}")
    x_train, x_test = a["x_train"], a["x_test"]
    if x_train.shape[1:] != x_test.shape[1:] or x_train.dtype != x_test.dtype:
        raise malformed(path, EXPECTED, f"x_train {x_train.dtype} {x_train.shape}, x_test {x_test.dtype} {x_test.shape}")
    if x_train.dtype == np.uint8:
        if x_train.ndim not in (3, 4):
            raise malformed(path, EXPECTED, f"uint8 x_train {x_train.shape} is not (N, H, W) or (N, H, W, C)")
        x_train, x_test = _images(x_train, options.layout), _images(x_test, options.layout)
    elif not np.issubdtype(x_train.dtype, np.floating):
        raise malformed(path, EXPECTED, f"x_train is {x_train.dtype}")
    return arrays_dataset("npz", x_train, a["y_train"], x_test, a["y_test"], options.num_classes, source=str(path))
