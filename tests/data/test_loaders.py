"""Loaders of published formats, on tiny files written in those exact formats: the data as
written come back, and a missing, truncated or malformed file is refused naming the file."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch

import formats
from fedrift.data import DATASETS, load_dataset
from fedrift.data import cifar
from fedrift.errors import DataError


def load(name, root, **options):
    entry = DATASETS.get(name)
    return load_dataset(name, root, entry.params(**options) if entry.params else None)


def _pickled(path):
    return pickle.loads(path.read_bytes(), encoding="bytes")


# ---------------------------------------------------------------------------------------
# CIFAR


def test_cifar10_reads_the_batches_in_order(tmp_path):
    folder = formats.cifar10(tmp_path)
    ds = load("cifar10", tmp_path)
    assert ds.x_train.dtype == torch.uint8 and ds.x_train.shape == (30, 3, 32, 32)
    assert ds.x_test.shape == (6, 3, 32, 32) and ds.num_classes == 10 and ds.pixel_norm is not None
    first, test = _pickled(folder / "data_batch_1"), _pickled(folder / "test_batch")
    # row = 1024 red, 1024 green, 1024 blue values, row-major 32x32
    assert np.array_equal(ds.x_train[:6].numpy(), first[b"data"].reshape(6, 3, 32, 32))
    assert ds.x_train[0, 1, 2, 3].item() == first[b"data"][0, 1024 + 2 * 32 + 3]
    assert ds.y_train[:6].tolist() == first[b"labels"] and ds.y_test.tolist() == test[b"labels"]
    # data.root may also be the extracted folder itself
    again = load("cifar10", folder)
    assert torch.equal(again.x_train, ds.x_train) and torch.equal(again.y_test, ds.y_test)


@pytest.mark.parametrize("label, classes", [("fine", 100), ("coarse", 20)])
def test_cifar100_fine_or_coarse(tmp_path, label, classes):
    folder = formats.cifar100(tmp_path)
    ds = load("cifar100", tmp_path, label=label)
    train = _pickled(folder / "train")
    assert ds.num_classes == classes and ds.x_train.shape == (12, 3, 32, 32)
    assert ds.y_train.tolist() == train[f"{label}_labels".encode()]


def test_cifar_archive_is_checked_against_its_md5_then_read(tmp_path, monkeypatch):
    folder = formats.cifar10(tmp_path / "src")
    packed = formats.archive(folder, tmp_path / "cifar-10-python.tar.gz")
    with pytest.raises(DataError, match=r"cifar-10-python.tar.gz has md5 .*expected the published c58f30108f718f92721af3b95e74349a"):
        load("cifar10", tmp_path)
    from fedrift.data.files import md5sum

    monkeypatch.setattr(cifar, "CIFAR10", dataclasses.replace(cifar.CIFAR10, md5=md5sum(packed)))
    from_archive, extracted = load("cifar10", tmp_path), load("cifar10", folder)
    assert torch.equal(from_archive.x_train, extracted.x_train) and torch.equal(from_archive.y_train, extracted.y_train)


def test_cifar_without_files_names_what_it_looked_for(tmp_path):
    with pytest.raises(DataError, match="cifar-10-batches-py.*cifar-10-python.tar.gz"):
        load("cifar10", tmp_path)
    with pytest.raises(DataError, match="data.root.*cifar-10-batches-py"):
        load("cifar10", None)


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _wide(path):
    doc = _pickled(path)
    doc[b"data"] = doc[b"data"][:, :3000]
    path.write_bytes(pickle.dumps(doc, protocol=2))


def _labels_short(path):
    doc = _pickled(path)
    doc[b"labels"] = doc[b"labels"][:-1]
    path.write_bytes(pickle.dumps(doc, protocol=2))


def _code(path):
    import os

    path.write_bytes(pickle.dumps({b"data": os.getcwd, b"labels": []}, protocol=2))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.unlink(), "data_batch_3 is missing; expected a cifar10 batch"),
        (_truncate, "data_batch_3 is truncated or malformed"),
        (lambda p: p.write_text("not a pickle"), "data_batch_3 is truncated or malformed"),
        (_wide, r"data is ndarray uint8 \(6, 3000\)"),
        (_labels_short, "6 images but labels holds"),
        (_code, "refused global"),  # a pickle that would call code is never run
    ],
)
def test_damaged_cifar_batch_is_refused_naming_the_file(tmp_path, damage, message):
    folder = formats.cifar10(tmp_path)
    damage(folder / "data_batch_3")
    with pytest.raises(DataError, match=message) as err:
        load("cifar10", tmp_path)
    assert str(folder / "data_batch_3") in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------
# npz


def test_npz_uint8_channels_last_becomes_nchw(tmp_path):
    rng = np.random.default_rng(0)
    x, t = rng.integers(0, 256, (10, 5, 4, 3), dtype=np.uint8), rng.integers(0, 256, (4, 5, 4, 3), dtype=np.uint8)
    np.savez(tmp_path / "mine.npz", x_train=x, y_train=np.arange(10) % 3, x_test=t, y_test=np.array([0, 1, 2, 2]))
    ds = load("npz", tmp_path)
    assert ds.x_train.dtype == torch.uint8 and ds.x_train.shape == (10, 3, 5, 4) and ds.num_classes == 3
    assert np.array_equal(ds.x_train.numpy(), x.transpose(0, 3, 1, 2))
    nchw = load("npz", tmp_path, layout="nchw", num_classes=7)
    assert nchw.x_train.shape == (10, 5, 4, 3) and nchw.num_classes == 7


def test_npz_float_features_are_used_as_they_are(tmp_path):
    x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float64)
    np.savez(tmp_path / "f.npz", x_train=x, y_train=np.arange(8) % 2, x_test=x[:3], y_test=np.array([1, 0, 1]))
    ds = load("npz", tmp_path, file="f.npz")
    assert ds.pixel_norm is None and ds.x_train.dtype == torch.float32
    assert torch.equal(ds.x_train, torch.from_numpy(x.astype(np.float32)))


def _npz(path, **drop):
    arrays = dict(x_train=np.zeros((4, 2, 2), np.uint8), y_train=np.arange(4), x_test=np.zeros((2, 2, 2), np.uint8),
                  y_test=np.arange(2))
    arrays.update(drop)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda d: _npz(d / "a.npz", y_test=None), "no y_test"),
        (lambda d: _npz(d / "a.npz", y_train=np.arange(3)), "y_train is int64 \\(3,\\) beside x_train"),
        (lambda d: _npz(d / "a.npz", x_test=np.zeros((2, 3, 3), np.uint8)), "x_test uint8 \\(2, 3, 3\\)"),
        (lambda d: (_npz(d / "a.npz"), (d / "a.npz").write_bytes((d / "a.npz").read_bytes()[:100])), "truncated or malformed"),
        (lambda d: (_npz(d / "a.npz"), _npz(d / "b.npz")), "holds 2 .npz files"),
        (lambda d: None, "holds 0 .npz files"),
    ],
)
def test_npz_problems_are_refused(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(DataError, match=message):
        load("npz", tmp_path)


# ---------------------------------------------------------------------------------------
# image folders


def test_imagefolder_single_tree_is_split_per_class_and_resized(tmp_path):
    for c, colour in enumerate([(255, 0, 0), (0, 255, 0)]):
        for i in range(5):
            formats.png(tmp_path / f"class_{c}" / f"{i}.png", 12, colour)
    ds = load("imagefolder", tmp_path, size=8, test_fraction=0.2)
    assert ds.x_train.shape == (8, 3, 8, 8) and ds.x_test.shape == (2, 3, 8, 8) and ds.num_classes == 2
    assert sorted(ds.y_test.tolist()) == [0, 1]
    # class 0 is red, class 1 green: the label of each image is its folder's
    red = ds.x_train[:, 0].float().mean((1, 2)) > 127
    assert torch.equal(red, ds.y_train == 0)
    grey = load("imagefolder", tmp_path, size=8, channels=1)
    assert grey.x_train.shape[1] == 1


def test_imagefolder_train_and_test_trees(tmp_path):
    for split, n in (("train", 3), ("test", 1)):
        for c in ("cat", "dog"):
            for i in range(n):
                formats.jpeg(tmp_path / split / c / f"{i}.jpg", 8, (10, 20, 30))
    ds = load("imagefolder", tmp_path, size=8)
    assert len(ds.y_train) == 6 and ds.y_test.tolist() == [0, 1]


def test_imagefolder_damaged_image_or_empty_class_is_refused(tmp_path):
    formats.png(tmp_path / "a" / "0.png", 8, (1, 2, 3))
    (tmp_path / "b").mkdir()
    with pytest.raises(DataError, match=r"/b has no image files"):
        load("imagefolder", tmp_path)
    bad = tmp_path / "b" / "0.png"
    formats.png(bad, 8, (1, 2, 3))
    bad.write_bytes(bad.read_bytes()[:30])
    with pytest.raises(DataError, match=rf"{bad} is truncated or malformed.*Pillow can decode"):
        load("imagefolder", tmp_path)


def test_tinyimagenet_tree(tmp_path):
    formats.tinyimagenet(tmp_path)
    ds = load("tinyimagenet", tmp_path)
    assert ds.x_train.shape == (9, 3, 64, 64) and ds.x_test.shape == (4, 3, 64, 64) and ds.num_classes == 3
    assert ds.y_train.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and ds.y_test.tolist() == [0, 1, 2, 0]
    # the greyscale JPEG comes back as three equal channels
    assert torch.equal(ds.x_train[0, 0], ds.x_train[0, 1]) and torch.equal(ds.x_train[0, 1], ds.x_train[0, 2])
    small = load("tinyimagenet", tmp_path / "tiny-imagenet-200", size=32)
    assert small.x_train.shape == (9, 3, 32, 32)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: (b / "val" / "val_annotations.txt").unlink(), "val_annotations.txt is missing"),
        (lambda b: (b / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn99999999\t0\t0\t1\t1\n"),
         "val_annotations.txt is truncated or malformed \\(line 1"),
        (lambda b: (b / "val" / "images" / "val_2.JPEG").unlink(), "val_2.JPEG is missing"),
        (lambda b: __import__("shutil").rmtree(b / "train" / "n01629819"), "n01629819/images is missing"),
        (lambda b: (b / "train" / "n01443537" / "images" / "n01443537_1.JPEG").write_bytes(b"\xff\xd8\xff"),
         "n01443537_1.JPEG is truncated or malformed"),
    ],
)
def test_tinyimagenet_damage_is_refused(tmp_path, damage, message):
    damage(formats.tinyimagenet(tmp_path))
    with pytest.raises(DataError, match=message):
        load("tinyimagenet", tmp_path)


# ---------------------------------------------------------------------------------------
# FEMNIST


def test_femnist_writers_are_the_natural_clients(tmp_path):
    import json

    formats.femnist(tmp_path)
    ds = load("femnist", tmp_path)
    assert ds.x_train.dtype == torch.uint8 and ds.x_train.shape == (15, 1, 28, 28) and ds.num_classes == 62
    assert ds.x_test.shape == (6, 1, 28, 28)
    shard = json.loads(sorted((tmp_path / "train").glob("*.json"))[0].read_text())
    user = shard["users"][0]
    rows = np.flatnonzero(ds.train_groups == 0)  # writers numbered by sorted id: f0000_00 first
    assert user == "f0000_00" and len(rows) == 5
    want = np.round(np.asarray(shard["user_data"][user]["x"]) * 255).reshape(5, 1, 28, 28)
    assert np.array_equal(ds.x_train[rows].numpy(), want)
    assert ds.y_train[rows].tolist() == shard["user_data"][user]["y"]

    from fedrift.data.partition import PARTITIONS, partition_dataset

    part = partition_dataset(ds, "natural", PARTITIONS.get("natural").params(), 0, 0.0)
    assert part.num_clients == 3 and [len(t) for t in part.train] == [5, 5, 5] and [len(t) for t in part.test] == [2, 2, 2]


def _fedrift_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fedrift"]


def test_femnist_test_writers_without_training_data_are_counted_once_and_can_be_left_out(tmp_path, caplog, monkeypatch):
    """A split by writer (LEAF's ``-t user``) leaves test writers no client trained on: one
    line counts them and their samples' share, once per command; ``data.writers=both`` drops them."""
    from fedrift.data.notices import SAID

    monkeypatch.delenv(SAID, raising=False)
    writers, unseen, per_test = 3, 2, 2  # formats.femnist: 2 test samples per writer
    formats.femnist(tmp_path, writers=writers, unseen=unseen)
    everything = load("femnist", tmp_path)
    again = load("femnist", tmp_path)  # a compare's second setting: said already
    lines = _fedrift_lines(caplog)
    orphans, total = unseen * per_test, (writers + unseen) * per_test
    assert lines == [f"femnist: {writers} writers in train, {writers + unseen} in test, {writers} in both; {orphans} of "
                     f"{total} test samples ({orphans / total:.1%}) are from the {unseen} test writers with no "
                     "training data; data.writers=both keeps only the test writers present in train"], lines
    assert everything.x_test.shape[0] == again.x_test.shape[0] == total  # the default reads every test sample

    both = load("femnist", tmp_path, writers="both")
    assert both.x_test.shape[0] == total - orphans and set(both.test_groups.tolist()) == set(range(writers))
    assert "data.writers=both leaves them out" in _fedrift_lines(caplog)[-1]
    # the samples kept are the same rows, in the same order
    known = np.flatnonzero(everything.test_groups < writers)
    assert torch.equal(both.x_test, everything.x_test[known]) and torch.equal(both.y_test, everything.y_test[known])

    from fedrift.data.partition import PARTITIONS, partition_dataset

    natural = PARTITIONS.get("natural").params()
    for ds in (everything, both):  # the per-writer test sets do not change: unseen writers had no client anyway
        assert [len(t) for t in partition_dataset(ds, "natural", natural, 0, 0.0).test] == [per_test] * writers


def test_femnist_with_the_same_writers_in_train_and_test_says_nothing(tmp_path, caplog, monkeypatch):
    from fedrift.data.notices import SAID

    monkeypatch.delenv(SAID, raising=False)
    formats.femnist(tmp_path)
    assert load("femnist", tmp_path, writers="both").x_test.shape[0] == load("femnist", tmp_path).x_test.shape[0]
    assert _fedrift_lines(caplog) == []


def test_femnist_train_writers_without_test_samples_are_counted_without_blame():
    from fedrift.data.femnist import writers_line

    assert writers_line(["a", "a", "b", "c"], ["a", "b"], "all") == (
        "femnist: 3 writers in train, 2 in test, 2 in both; every test writer has training data "
        "(1 train writer has no test samples)")
    assert writers_line(["a", "b"], ["b", "a", "a"], "both") is None


def test_femnist_writers_option_is_refused_with_what_is_allowed(tmp_path):
    from fedrift.api import prepare
    from fedrift.errors import ConfigError

    formats.femnist(tmp_path)
    with pytest.raises(ConfigError, match="data.writers.*'all' or 'both'"):
        prepare({"data": {"name": "femnist", "root": str(tmp_path), "writers": "some"}})


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.write_text(p.read_text()[:-20]), "truncated or malformed \\(JSONDecodeError"),
        (lambda p: p.write_text(p.read_text().replace('"num_samples": [5]', '"num_samples": [4]')), "num_samples 4, x \\(5, 784\\)"),
        (lambda p: p.write_text('{"users": []}'), "missing users, num_samples or user_data"),
    ],
)
def test_femnist_damage_is_refused(tmp_path, damage, message):
    formats.femnist(tmp_path)
    shard = sorted((tmp_path / "train").glob("*.json"))[0]
    damage(shard)
    with pytest.raises(DataError, match=message) as err:
        load("femnist", tmp_path)
    assert shard.name in str(err.value)


def test_femnist_missing_split_folder(tmp_path):
    formats.femnist(tmp_path)
    __import__("shutil").rmtree(tmp_path / "test")
    with pytest.raises(DataError, match="folder .*test is missing"):
        load("femnist", tmp_path)


def test_femnist_pixels_that_are_not_grey_levels_stay_floats(tmp_path):
    import json

    formats.femnist(tmp_path)
    for shard in (tmp_path / "train").glob("*.json"):
        doc = json.loads(shard.read_text())
        for d in doc["user_data"].values():
            d["x"] = [[0.5] * 784 for _ in d["x"]]  # 127.5 / 255: no grey level
        shard.write_text(json.dumps(doc))
    ds = load("femnist", tmp_path)
    assert ds.pixel_norm is None and ds.x_train.dtype == torch.float32
    assert torch.all(ds.x_train == 0.5)
    # the test split (grey levels) comes back as floats too, k / 255
    test_doc = json.loads(sorted((tmp_path / "test").glob("*.json"))[0].read_text())
    first = np.asarray(test_doc["user_data"][test_doc["users"][0]]["x"][0], dtype=np.float32)
    assert np.allclose(ds.x_test[0].numpy().ravel(), first, atol=1e-7)


def test_cifar_archive_without_a_batch_is_refused(tmp_path, monkeypatch):
    folder = formats.cifar10(tmp_path / "src")
    (folder / "data_batch_5").unlink()
    packed = formats.archive(folder, tmp_path / "cifar-10-python.tar.gz")
    from fedrift.data.files import md5sum

    monkeypatch.setattr(cifar, "CIFAR10", dataclasses.replace(cifar.CIFAR10, md5=md5sum(packed)))
    with pytest.raises(DataError, match=r"cifar-10-python.tar.gz:cifar-10-batches-py/data_batch_5 is missing from the archive"):
        load("cifar10", tmp_path)


def test_office_caltech10_domains_classes_and_sizes(tmp_path):
    from fedrift.data.folders import OfficeCaltechParams, load_office_caltech10

    formats.office_caltech10(tmp_path, per_class=5)
    ds = load_office_caltech10(tmp_path, OfficeCaltechParams(size=20))
    assert ds.domain_names == formats.OFFICE and ds.num_classes == 3
    assert ds.x_train.shape == (48, 3, 20, 20) and ds.x_test.shape == (12, 3, 20, 20) and ds.x_train.dtype == torch.uint8
    for x, y, d in ((ds.x_train, ds.y_train, ds.train_domains), (ds.x_test, ds.y_test, ds.test_domains)):
        red, green = x[:, 0].float().mean(dim=(1, 2)), x[:, 1].float().mean(dim=(1, 2))
        assert torch.allclose(red, torch.as_tensor(60.0 * d + 20, dtype=torch.float32), atol=3)  # each image in its own domain
        assert torch.allclose(green, (80 * y + 10).float(), atol=3)  # and class
    assert np.bincount(ds.test_domains).tolist() == [3, 3, 3, 3]  # 1 of 5 per class per domain


def test_office_caltech10_needs_the_same_classes_in_every_domain(tmp_path):
    from fedrift.data.folders import OfficeCaltechParams, load_office_caltech10

    formats.office_caltech10(tmp_path, per_class=2)
    (tmp_path / "webcam" / "mug").rename(tmp_path / "webcam" / "cup")
    with pytest.raises(DataError, match=r"webcam has the class folders back_pack, bike, cup; expected those of .*amazon"):
        load_office_caltech10(tmp_path, OfficeCaltechParams())
