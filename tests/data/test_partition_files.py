"""Partitions as offsets + indices: the binary file, the earlier JSON format, the devices partition."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedrift.data import DATASETS, load_dataset
from fedrift.data.partition import partition_dataset
from fedrift.data.partition_base import Partition, PartitionFileError, Ragged
from fedrift.errors import ConfigError


def _ragged(rng: np.random.Generator, clients: int, high: int, most: int = 20) -> Ragged:
    sizes = rng.integers(0, most, size=clients)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return Ragged(offsets, rng.integers(0, high, size=int(offsets[-1])))


def test_a_100k_client_partition_round_trips_through_its_binary_file_exactly(tmp_path):
    rng = np.random.default_rng(0)
    n = 100_000
    p = Partition("devices", _ragged(rng, n, 60_000), _ragged(rng, n, 10_000), {"num_clients": n, "samples": 8},
                  holdout=np.array([3, 5, 2**31 + 7]), val=_ragged(rng, n, 60_000, most=3))
    p.save(tmp_path / "partition.json")
    header = json.loads((tmp_path / "partition.json").read_text())
    assert (tmp_path / "partition.json").stat().st_size < 2000  # a header; the indices are in the .bin
    assert header["arrays"]["train"]["dtype"] == "<i4" and header["arrays"]["holdout"]["dtype"] == "<i8"
    q = Partition.load(tmp_path / "partition.json")
    for name in ("train", "test", "val"):
        a, b = getattr(p, name), getattr(q, name)
        assert isinstance(b, Ragged) and np.array_equal(a.offsets, b.offsets) and np.array_equal(a.values, b.values)
        assert b.values.dtype == np.int64
    assert np.array_equal(q.holdout, p.holdout) and q.name == p.name and q.options == p.options
    assert np.array_equal(q.train[99_999], p.train[99_999]) and q.num_clients == n
    assert not list(tmp_path.glob(".*.tmp"))  # written beside, then renamed


def test_the_earlier_all_json_format_is_still_read(tmp_path):
    old = {"name": "dirichlet", "options": {"alpha": 0.5}, "num_clients": 3,
           "train": [[0, 4], [1, 2, 3], []], "test": [[0], [1], [2, 2]], "holdout": [9], "val": [[5], [], [6]]}
    (tmp_path / "partition.json").write_text(json.dumps(old))
    p = Partition.load(tmp_path / "partition.json")
    assert p.num_clients == 3 and [ix.tolist() for ix in p.train] == old["train"]
    assert [ix.tolist() for ix in p.test] == old["test"] and [ix.tolist() for ix in p.val] == old["val"]
    assert p.holdout.tolist() == [9] and p.options == {"alpha": 0.5}
    p.save(tmp_path / "new.json")  # and written in the new one, the same partition
    assert Partition.load(tmp_path / "new.json").train == p.train


@pytest.mark.parametrize("damage", ["truncate", "missing", "version", "garbage"])
def test_damaged_or_unknown_partition_files_are_refused_in_one_line(tmp_path, damage):
    p = Partition("iid", [np.arange(3), np.arange(3, 5)], [np.arange(2), np.arange(2)])
    p.save(tmp_path / "partition.json")
    head, data = tmp_path / "partition.json", tmp_path / "partition.bin"
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:-4])
    elif damage == "missing":
        data.unlink()
    elif damage == "version":
        head.write_text(json.dumps({**json.loads(head.read_text()), "version": 99}))
    else:
        head.write_text('{"format": "fedrift-partition", "version": 2, "arrays": 7}')
    with pytest.raises(PartitionFileError) as err:
        Partition.load(head)
    assert "\n" not in str(err.value) and "partition" in str(err.value)


def test_counts_are_the_per_client_bincounts():
    rng = np.random.default_rng(1)
    train = _ragged(rng, 500, 1000)
    labels = rng.integers(0, 7, size=1000)
    p = Partition("x", train, [np.zeros(0, np.int64)] * 500)
    expect = np.stack([np.bincount(labels[ix], minlength=7) for ix in train])
    assert np.array_equal(p.counts(labels, 7), expect)


def test_devices_partition_gives_many_tiny_clients_their_classes():
    ds = load_dataset("digits", None, DATASETS.get("digits").params())
    opts = {"num_clients": 70_000, "samples": 6, "classes_per_client": 3, "min_local_test": 4}
    p = partition_dataset(ds, "devices", opts, seed=0)
    assert p.num_clients == 70_000 and np.all(p.sizes() == 6) and np.all(p.test.sizes() == 4)
    y, y_test = ds.y_train.numpy(), ds.y_test.numpy()
    train_classes = p.counts(y, 10) > 0
    assert np.all(train_classes.sum(1) == 3)  # two from each of its three classes
    assert np.all(p.counts(y, 10)[train_classes] == 2)
    for k in (0, 1, 69_999):
        assert set(y_test[p.test[k]]) <= set(np.flatnonzero(train_classes[k]))
        assert len(set(p.train[k].tolist())) == 6  # distinct within a client
    assert len(np.unique(p.train.values)) > 0.9 * ds.num_train  # samples shared out over all of the data
    again = partition_dataset(ds, "devices", opts, seed=0)
    other = partition_dataset(ds, "devices", opts, seed=1)
    assert again.train == p.train and again.test == p.test and not np.array_equal(other.train.values, p.train.values)
    with pytest.raises(ConfigError, match=r"^partition\.classes_per_client: 11 .*allowed: at most 10"):
        partition_dataset(ds, "devices", {**opts, "classes_per_client": 11}, seed=0)
    with pytest.raises(ConfigError, match=r"^partition\.samples: "):
        partition_dataset(ds, "devices", {**opts, "samples": 10_000}, seed=0)
