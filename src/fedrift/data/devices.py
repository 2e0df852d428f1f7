"""The ``devices`` partition: cross-device federations of many tiny clients.

A phone holds a handful of samples, and a million phones are more clients than a small
dataset has samples, so here the dataset's samples are shared out: every client draws its
own few samples from a few classes, and a sample may be held by many clients. Drawn in
vectorised blocks of clients (no Python object per client), so a million clients take
about a second and the partition is held as offsets + indices from the start.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import numpy as np
from pydantic import Field

from fedrift.data.base import Dataset
from fedrift.data.partition import PARTITIONS, labels_of, partition_rng
from fedrift.data.partition_base import Partition, Ragged
from fedrift.errors import ConfigError
from fedrift.params import params

BLOCK = 1 << 16  # clients drawn at a time: bounds the temporary arrays


@params
class DevicesParams:
    """num_clients: any number (samples are shared out); samples: training samples per
    client; classes_per_client: the classes they come from (the samples spread evenly over
    them); min_local_test: the size of each client's local test split, from the same classes."""

    num_clients: Annotated[int, Field(ge=1)] = 1000
    samples: Annotated[int, Field(ge=1)] = 8
    classes_per_client: Annotated[int, Field(ge=1)] = 2
    min_local_test: Annotated[int, Field(ge=1)] = 10


def _pools(labels: np.ndarray, rng: np.random.Generator, classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices grouped by class, shuffled within a class; each class's start there and size."""
    order = rng.permutation(labels.size)
    order = order[np.argsort(labels[order], kind="stable")]
    size = np.bincount(labels, minlength=classes)[:classes]
    start = np.concatenate([[0], np.cumsum(size)[:-1]])
    return order.astype(np.int64), start, size


def _draw(
    cls: np.ndarray, width: int, flat: np.ndarray, start: np.ndarray, size: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Rows of ``width`` indices: entry i of a client comes from its class ``cls[:, i % c]``,
    consecutive entries of a class from a random window of that class's shuffled pool (so
    distinct while the pool is large enough); a class with no samples gives a uniform draw
    from all of them. Each row sorted."""
    n, c = cls.shape
    col = np.arange(width)
    where = rng.integers(0, np.iinfo(np.int64).max, size=(n, c))  # window starts, reduced per class below
    k = cls[:, col % c]  # (n, width)
    sz = size[k]
    pos = (where[:, col % c] % np.maximum(sz, 1) + col // c) % np.maximum(sz, 1)
    out = np.where(sz > 0, flat[np.minimum(start[k] + pos, flat.size - 1)], where[:, col % c] % flat.size)
    return np.sort(out, axis=1)


@PARTITIONS.register(
    "devices", "cross-device: many tiny clients, each a few samples of a few classes (samples shared out)", DevicesParams
)
def devices_partition(dataset: Dataset, options: DevicesParams, seed: int) -> Partition:
    """Client k: ``samples`` training samples from ``classes_per_client`` distinct classes
    drawn uniformly, and ``min_local_test`` test samples of the same classes."""
    o = options
    y_train, y_test = labels_of(dataset.y_train), labels_of(dataset.y_test)
    classes = int(max(y_train.max(initial=0), y_test.max(initial=0))) + 1
    train_rng, test_rng = partition_rng(seed, "devices", "train"), partition_rng(seed, "devices", "test")
    flat, start, size = _pools(y_train, train_rng, classes)
    present = np.flatnonzero(size > 0)
    c = o.classes_per_client
    if c > present.size:
        raise ConfigError(
            f"partition.classes_per_client: {c} but the training set has {present.size} classes; "
            f"allowed: at most {present.size}"
        )
    each = -(-o.samples // c)
    if each > int(size[present].min()):
        raise ConfigError(
            f"partition.samples: {o.samples} samples from {c} classes take up to {each} of a class, and the "
            f"smallest class has {int(size[present].min())}; allowed: samples <= {c * int(size[present].min())}"
        )
    test_flat, test_start, test_size = _pools(y_test, test_rng, classes)
    train = np.empty((o.num_clients, o.samples), dtype=np.int64)
    test = np.empty((o.num_clients, o.min_local_test), dtype=np.int64)
    for a in range(0, o.num_clients, BLOCK):
        n = min(BLOCK, o.num_clients - a)
        keys = train_rng.random((n, present.size), dtype=np.float32)
        cls = present[np.argpartition(keys, c - 1, axis=1)[:, :c]] if c < present.size else np.tile(present, (n, 1))
        train[a : a + n] = _draw(cls, o.samples, flat, start, size, train_rng)
        if test_flat.size:
            test[a : a + n] = _draw(cls, o.min_local_test, test_flat, test_start, test_size, test_rng)
    if not test_flat.size:
        test = test[:, :0]
    return Partition(
        name="devices", options=dataclasses.asdict(o),
        train=Ragged(np.arange(o.num_clients + 1, dtype=np.int64) * o.samples, train.reshape(-1)),
        test=Ragged(np.arange(o.num_clients + 1, dtype=np.int64) * test.shape[1], test.reshape(-1)),
    )
