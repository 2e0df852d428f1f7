"""FEMNIST from LEAF's JSON shards, with each writer as a natural client.

``data.root`` holds LEAF's ``train/`` and ``test/`` folders (``leaf/data/femnist/data``),
each of ``*.json`` shards ``{"users": [...], "num_samples": [...], "user_data": {user:
{"x": [[784 floats]], "y": [ints]}}}``. Pixels are LEAF's floats in [0, 1]; being multiples
of 1/255 they are kept as uint8 (``x * 255``, exact), else as float32 inputs. Writers are the
``natural`` partition's groups (``partition.name=natural``), numbered by sorted writer id.

LEAF splits by sample within each writer (``--tf``) or by writer (``-t user``); in the
second, and in samples cut from either, test writers may have no training data: the
natural partition gives them no client, and the global test set measures writers no client
trained on. A load where the train and test writers differ says so in one line (counts, and
the share of test samples whose writer has no training data); ``data.writers=both`` keeps
only the test samples of writers present in train.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from fedrift.data import DATASETS
from fedrift.data.base import Dataset, image_dataset
from fedrift.data.files import DataError, malformed, need_dir, need_root
from fedrift.data.notices import say_once
from fedrift.params import params

CLASSES = 62  # digits, upper and lower case letters
EXPECTED = 'a LEAF JSON shard: {"users": [...], "num_samples": [...], "user_data": {user: {"x": [[784 floats]], "y": [ints]}}}'


def _shard(path: Path) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    try:
        doc: Any = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as err:
        raise malformed(path, EXPECTED, f"{type(err).__name__}: {err}") from None
    if not isinstance(doc, dict) or not all(k in doc for k in ("users", "num_samples", "user_data")):
        raise malformed(path, EXPECTED, "missing users, num_samples or user_data")
    users, counts, data = doc["users"], doc["num_samples"], doc["user_data"]
    if not isinstance(users, list) or not isinstance(counts, list) or len(users) != len(counts) or not isinstance(data, dict):
        raise malformed(path, EXPECTED, "users and num_samples differ in length")
    xs, ys = [], []
    for user, n in zip(users, counts):
        d = data.get(user)
        if not isinstance(d, dict) or "x" not in d or "y" not in d:
            raise malformed(path, EXPECTED, f"user_data has no x and y for user {user!r}")
        try:
            x = np.asarray(d["x"], dtype=np.float32)
            y = np.asarray(d["y"], dtype=np.int64)
        except (ValueError, TypeError) as err:
            raise malformed(path, EXPECTED, f"user {user!r}: {err}") from None
        if x.shape != (n, 784) or y.shape != (n,):
            raise malformed(path, EXPECTED, f"user {user!r}: num_samples {n}, x {x.shape}, y {y.shape}")
        if n and not (0 <= y.min() and y.max() < CLASSES and 0 <= x.min() and x.max() <= 1):  # NaN fails too
            raise malformed(path, EXPECTED, f"user {user!r}: labels outside 0..{CLASSES - 1} or pixels outside [0, 1] (or NaN)")
        xs.append(_grey_levels(x))
        ys.append(y)
    return [str(u) for u in users], xs, ys


def _grey_levels(x: np.ndarray) -> np.ndarray:
    """uint8 grey levels when the pixels are multiples of 1/255 (as LEAF writes them), else
    the floats: converted per writer, so the set is never held whole as float32 (2.6 GB for the 817,851 images)."""
    scaled = x * 255.0
    levels = np.rint(scaled)
    return levels.astype(np.uint8) if np.abs(scaled - levels).max(initial=0) < 1e-3 else x


def _split(folder: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    shards = sorted(need_dir(folder, "LEAF's JSON shards (*.json)").glob("*.json"))
    if not shards:
        raise DataError(f"data: {folder} has no .json shards; expected {EXPECTED}")
    users, xs, ys = [], [], []
    for path in shards:
        u, x, y = _shard(path)
        users += [name for name, part in zip(u, y) for _ in range(len(part))]
        xs += x
        ys += y
    return _stack(xs), np.concatenate(ys), users


def _stack(xs: list[np.ndarray]) -> np.ndarray:
    """One array: uint8 if every writer's is, else float32 pixels in [0, 1]."""
    if all(x.dtype == np.uint8 for x in xs):
        return np.concatenate(xs)
    return np.concatenate([_floats(x) for x in xs])


def _floats(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) / np.float32(255.0) if x.dtype == np.uint8 else x


@params
class FemnistParams:
    """``writers``: which test samples are read. ``all`` (the default): every test shard's
    samples, as the shards give them, so that a test accuracy is the one LEAF's split defines
    (a split by writer measures writers no client trained on, on purpose); ``both``: only those
    of writers who also have training data, the test set a per-writer (natural) evaluation
    means. A load whose train and test writers differ says how many samples that is."""

    writers: Literal["all", "both"] = "all"


def writers_line(train: list[str], test: list[str], writers: str) -> str | None:
    """The one line about train and test writers that differ (None when they are the same):
    writers in each and in both; test samples whose writer has no training data, and their share."""
    a, b = set(train), set(test)
    if a == b:
        return None
    known = a & b
    orphans = sum(1 for u in test if u not in a)
    if not orphans:  # train writers without test samples only: every test sample's writer trained
        lone = len(a - b)
        return (f"femnist: {len(a):,} writers in train, {len(b):,} in test, {len(known):,} in both; every test "
                f"writer has training data ({lone:,} train {'writer has' if lone == 1 else 'writers have'} no test samples)")
    share = orphans / len(test) if test else 0.0
    line = (f"femnist: {len(a):,} writers in train, {len(b):,} in test, {len(known):,} in both; {orphans:,} of "
            f"{len(test):,} test samples ({share:.1%}) are from the {len(b - a):,} test writers with no training data")
    if writers == "both":
        return line + f"; data.writers=both leaves them out ({len(test) - orphans:,} test samples kept)"
    return line + "; data.writers=both keeps only the test writers present in train"


@DATASETS.register(
    "femnist", "FEMNIST from LEAF's JSON shards in data.root/train, test (1x28x28, 62 classes, writers: natural)",
    FemnistParams,
)
def load_femnist(root: Path | None, options: FemnistParams | None) -> Dataset:
    root = need_root(root, "femnist", "LEAF's train/ and test/ folders of JSON shards")
    writers = (options or FemnistParams()).writers
    x_train, y_train, u_train = _split(root / "train")
    x_test, y_test, u_test = _split(root / "test")
    line = writers_line(u_train, u_test, writers)
    if line:
        say_once(line)
    if writers == "both":
        trained = set(u_train)
        keep = np.asarray([u in trained for u in u_test], dtype=bool)
        x_test, y_test, u_test = x_test[keep], y_test[keep], [u for u, k in zip(u_test, keep) if k]
    # train writers first, so that client k is the k-th writer; writers seen only in test
    # get ids after them (no client's local test set takes their samples)
    names = sorted(set(u_train)) + sorted(set(u_test) - set(u_train))
    ids = {u: k for k, u in enumerate(names)}
    g_train = np.asarray([ids[u] for u in u_train], dtype=np.int64)
    g_test = np.asarray([ids[u] for u in u_test], dtype=np.int64)
    shape = (-1, 1, 28, 28)
    if x_train.dtype == np.uint8 and x_test.dtype == np.uint8:
        return image_dataset(
            "femnist", x_train.reshape(shape), y_train, x_test.reshape(shape), y_test, CLASSES, g_train, g_test
        )
    x_train, x_test = _floats(x_train), _floats(x_test)  # floats both, if one is
    return Dataset(
        "femnist", torch.from_numpy(x_train.reshape(shape)), torch.from_numpy(y_train),
        torch.from_numpy(x_test.reshape(shape)), torch.from_numpy(y_test), CLASSES, g_train, g_test,
    )
