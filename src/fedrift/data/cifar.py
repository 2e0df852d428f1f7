"""CIFAR-10 and CIFAR-100 from their published "python version" files.

``data.root`` holds the extracted folder (``cifar-10-batches-py`` / ``cifar-100-python``),
is that folder itself, or holds the published archive (``cifar-10-python.tar.gz`` /
``cifar-100-python.tar.gz``), which is then checked against its published md5 and read
without unpacking. Extracted files have no published checksum of their own: each is checked
for structure and sizes (a dict with ``data``: uint8 N x 3072, N labels in range).

CIFAR-10: ``data_batch_1`` .. ``data_batch_5`` (train), ``test_batch``, ``batches.meta``
(``label_names``). CIFAR-100: ``train``, ``test``, ``meta`` (``fine_label_names``,
``coarse_label_names``), with ``data.label: fine`` (100 classes) or ``coarse`` (20).
Each row is 1024 red, then 1024 green, then 1024 blue values of a 32x32 image in row-major
order, so a reshape gives (N, 3, 32, 32). Images stay uint8 (``data.base.PixelNorm``).
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np

from fedrift.data import DATASETS
from fedrift.data.base import Dataset, image_dataset
from fedrift.data.files import DataError, check_md5, field, load_pickle, malformed, need_root, read_pickle
from fedrift.params import params


@dataclass(frozen=True)
class CifarFormat:
    name: str
    folder: str  # the archive's top folder
    archive: str
    md5: str  # published beside the archive on https://www.cs.toronto.edu/~kriz/cifar.html
    train: tuple[str, ...]
    test: str
    meta: str


CIFAR10 = CifarFormat(
    "cifar10", "cifar-10-batches-py", "cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a",
    tuple(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta",
)
CIFAR100 = CifarFormat(
    "cifar100", "cifar-100-python", "cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85",
    ("train",), "test", "meta",
)


@params
class Cifar100Params:
    """``label``: ``fine`` (the 100 classes) or ``coarse`` (the 20 superclasses)."""

    label: Literal["fine", "coarse"] = "fine"


Reader = Callable[[str], tuple[Any, str]]  # member name -> (unpickled document, where it came from)


def _reader(root: Path, fmt: CifarFormat) -> Reader:
    """How to read the set's files: from the extracted folder, else from the checked archive."""
    names = (*fmt.train, fmt.test, fmt.meta)
    if (root / fmt.folder).is_dir() or any((root / n).is_file() for n in names):
        folder = root / fmt.folder if (root / fmt.folder).is_dir() else root
        return lambda member: (read_pickle(folder / member, _what(fmt, member)), str(folder / member))
    archive = root / fmt.archive
    if not archive.is_file():
        raise DataError(
            f"data: neither {root / fmt.folder}/ nor {archive} exists; expected the extracted "
            f"{fmt.folder} folder ({', '.join(names)}) or the published archive"
        )
    check_md5(archive, fmt.md5)
    wanted = {f"{fmt.folder}/{n}": n for n in names}
    files: dict[str, bytes] = {}
    try:  # one pass over the archive (gzip streams), keeping the set's files as bytes
        with tarfile.open(archive, "r:gz") as tar:
            for info in tar:
                if info.isfile() and info.name in wanted:
                    f = tar.extractfile(info)
                    files[wanted[info.name]] = f.read() if f is not None else b""
    except (tarfile.TarError, OSError, EOFError) as err:
        raise malformed(archive, f"the {fmt.archive} archive", str(err)) from None

    def read(member: str) -> tuple[Any, str]:
        where = f"{archive}:{fmt.folder}/{member}"
        if member not in files:
            raise DataError(f"data: {where} is missing from the archive; expected {_what(fmt, member)}")
        return load_pickle(io.BytesIO(files[member]), where, _what(fmt, member)), where

    return read


def _what(fmt: CifarFormat, member: str) -> str:
    if member == fmt.meta:
        names = "label_names" if fmt is CIFAR10 else "fine_label_names and coarse_label_names"
        return f"the {fmt.name} meta file: a pickled dict with {names}"
    labels = "labels" if fmt is CIFAR10 else "fine_labels and coarse_labels"
    return f"a {fmt.name} batch: a pickled dict with data (uint8, N x 3072) and {labels} (N ints)"


def _batch(read: Reader, fmt: CifarFormat, member: str, key: str, classes: int) -> tuple[np.ndarray, np.ndarray]:
    doc, where = read(member)
    what = _what(fmt, member)
    data = field(doc, "data", where, what)
    labels = np.asarray(field(doc, key, where, what))
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        got = f"{type(data).__name__} {getattr(data, 'dtype', '')} {getattr(data, 'shape', '')}".strip()
        raise malformed(where, what, f"data is {got}")
    if labels.ndim != 1 or len(labels) != len(data) or not np.issubdtype(labels.dtype, np.integer):
        raise malformed(where, what, f"{len(data)} images but {key} holds {labels.shape} {labels.dtype}")
    if len(labels) and (labels.min() < 0 or labels.max() >= classes):
        raise malformed(where, what, f"{key} outside 0..{classes - 1}")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def _names(read: Reader, fmt: CifarFormat, key: str) -> int:
    doc, where = read(fmt.meta)
    names = field(doc, key, where, _what(fmt, fmt.meta))
    if not isinstance(names, list) or not names:
        raise malformed(where, _what(fmt, fmt.meta), f"{key} is not a list of names")
    return len(names)


def load_cifar(root: Path | None, fmt: CifarFormat, label: str) -> Dataset:
    root = need_root(root, fmt.name, f"{fmt.folder}/ or {fmt.archive}")
    read = _reader(root, fmt)
    classes = _names(read, fmt, "label_names" if fmt is CIFAR10 else f"{label}_label_names")
    key = "labels" if fmt is CIFAR10 else f"{label}_labels"
    parts = [_batch(read, fmt, m, key, classes) for m in fmt.train]
    x_test, y_test = _batch(read, fmt, fmt.test, key, classes)
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    return image_dataset(fmt.name, x_train, y_train, x_test, y_test, classes)


@DATASETS.register("cifar10", "CIFAR-10 from data.root (python pickle batches or the archive; 3x32x32, 10 classes)")
def load_cifar10(root: Path | None, options: None) -> Dataset:
    return load_cifar(root, CIFAR10, "fine")


@DATASETS.register(
    "cifar100",
    "CIFAR-100 from data.root (python pickles or the archive; 3x32x32, label: fine 100 | coarse 20)",
    params=Cifar100Params,
)
def load_cifar100(root: Path | None, options: Cifar100Params) -> Dataset:
    return load_cifar(root, CIFAR100, options.label)
