"""Bad data, bounded (issue 68, findings F5, F6, F10, F11): class ids checked against the
sample count before anything is sized from them, empty splits and non-finite or absurd
feature values refused as data errors, archive members' sizes bounded before they are read.
Each refusal is one DataError line naming the file, what is wrong and what is allowed."""

from __future__ import annotations

import json
import time
import tracemalloc
import zipfile

import numpy as np
import pytest
import torch

import fedrift
import formats
from fedrift.data import DATASETS, arrays_dataset, files, image_cache, load_dataset
from fedrift.data.base import FEATURE_LIMIT, check_dataset
from fedrift.errors import DataError

MiB = 1 << 20


def load(name, root, **options):
    entry = DATASETS.get(name)
    return load_dataset(name, root, entry.params(**options) if entry.params else None)


def _arrays(n_train=60, n_test=10, dim=4, classes=3, seed=0):
    g = np.random.default_rng(seed)
    return {
        "x_train": g.normal(size=(n_train, dim)).astype(np.float32),
        "y_train": np.arange(n_train) % classes,
        "x_test": g.normal(size=(n_test, dim)).astype(np.float32),
        "y_test": np.arange(n_test) % classes,
    }


def _npz(tmp_path, **changes):
    path = tmp_path / "d.npz"
    np.savez(path, **{**_arrays(), **changes})
    return path


def _refused(path, match, **options):
    with pytest.raises(DataError, match=match) as err:
        load("npz", path, **options)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    return str(err.value)


# ---------------------------------------------------------------------------------------
# F5: class ids against the sample count, before anything is sized from them


def test_a_class_id_beyond_the_sample_count_is_refused_before_anything_is_sized(tmp_path):
    y = np.arange(60) % 3
    y[7] = 10**9
    path = _npz(tmp_path, y_train=y)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        message = _refused(path, r"y_train holds class id 1000000000 but only 60 training samples; allowed: class ids 0\.\.C-1")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message.startswith(f"data.root: {path}: ")
    assert peak < 16 * MiB and time.perf_counter() - start < 5.0  # nothing sized from 10**9


def test_the_api_refuses_it_before_the_run_starts(tmp_path):
    y = np.arange(60) % 3
    y[7] = 10**9
    path = _npz(tmp_path, y_train=y)
    out = tmp_path / "run"
    with pytest.raises(DataError, match=r"class id 1000000000 but only 60 training samples"):
        fedrift.run({"data": {"name": "npz", "root": str(path)}, "model": {"name": "logreg"},
                     "train": {"rounds": 1}, "output": {"dir": str(out), "progress": False}})
    assert not out.exists()


def test_a_test_class_id_beyond_the_sample_count_is_refused_too(tmp_path):
    _refused(_npz(tmp_path, y_test=np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 500])),
             r"y_test holds class id 500 but only 60 training samples")


def test_a_declared_class_count_bounds_the_ids_and_the_sample_count_bounds_it(tmp_path):
    path = _npz(tmp_path)
    _refused(path, r"data.num_classes: 2, but .* has class id 2; allowed: 3 or more", num_classes=2)
    _refused(path, r"data.num_classes: 1000000000 is more classes than the 60 training samples of .*; allowed: 3\.\.60",
             num_classes=10**9)
    assert load("npz", path, num_classes=60).num_classes == 60


def test_arrays_dataset_checks_the_ids_it_counts_classes_from():
    a = _arrays()
    a["y_train"][0] = 10**9
    with pytest.raises(DataError, match=r"y_train holds class id 1000000000 but only 60 training samples"):
        arrays_dataset("mine", a["x_train"], a["y_train"], a["x_test"], a["y_test"])
    with pytest.raises(DataError, match=r"y_train holds 3\.5; allowed: integer class ids"):
        arrays_dataset("mine", a["x_train"], a["y_train"] * 0 + 3.5, a["x_test"], a["y_test"])


def test_check_dataset_refuses_ids_outside_the_models_class_count():
    a = _arrays()
    ds = arrays_dataset("mine", a["x_train"], a["y_train"], a["x_test"], a["y_test"], num_classes=3)
    bad = ds.__class__(ds.name, ds.x_train, ds.y_train, ds.x_test, torch.full_like(ds.y_test, 5), 3)
    with pytest.raises(DataError, match=r"data.root: /x.npz: y_test holds class id 5; allowed: 0\.\.2 \(3 classes\)"):
        check_dataset(bad, "/x.npz")


# ---------------------------------------------------------------------------------------
# F6: empty splits


@pytest.mark.parametrize("split", ["test", "train"])
def test_an_empty_split_is_refused(tmp_path, split):
    path = _npz(tmp_path, **{f"x_{split}": np.zeros((0, 4), np.float32), f"y_{split}": np.zeros(0, np.int64)})
    _refused(path, rf"the {split} split is empty \(x_{split}, y_{split} hold 0 samples\); allowed: at least one")


def test_an_empty_test_split_is_refused_by_the_api(tmp_path):
    path = _npz(tmp_path, x_test=np.zeros((0, 4), np.float32), y_test=np.zeros(0, np.int64))
    with pytest.raises(DataError, match="the test split is empty"):
        fedrift.run({"data": {"name": "npz", "root": str(path)}, "model": {"name": "logreg"},
                     "partition": {"name": "iid", "num_clients": 2}, "train": {"rounds": 1, "clients_per_round": 2},
                     "output": {"dir": str(tmp_path / "run"), "progress": False}})


def test_an_image_folder_split_that_leaves_no_test_image_is_refused(tmp_path):
    for k, colour in enumerate([(255, 0, 0), (0, 255, 0)]):
        formats.png(tmp_path / "imgs" / f"c{k}" / "a.png", 8, colour)  # one image a class: all to train
    with pytest.raises(DataError, match=r"data.root: .*imgs: the test split is empty"):
        load("imagefolder", tmp_path / "imgs", size=8)


# ---------------------------------------------------------------------------------------
# F11: non-finite or absurd feature values


@pytest.mark.parametrize("value, shown", [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf"), (1e300, "inf"), (3e7, "3e7")])
def test_non_finite_or_absurd_features_are_refused_naming_the_sample(tmp_path, value, shown):
    a = _arrays()
    x = a["x_train"].astype(np.float64)  # 1e300: a float64 beyond float32's range
    x[17, 2] = value
    message = _refused(_npz(tmp_path, x_train=x, x_test=a["x_test"].astype(np.float64)), rf"x_train\[17\] holds {shown}.*; allowed: finite features")
    assert "allowed: finite features of magnitude at most 1e6 (scale or standardise them)" in message


def test_features_in_the_test_split_are_checked_too_and_the_bound_itself_passes(tmp_path):
    a = _arrays()
    a["x_train"][0, 0], a["x_train"][1, 1] = FEATURE_LIMIT, -FEATURE_LIMIT
    assert load("npz", _npz(tmp_path, x_train=a["x_train"])).x_train.abs().max() == FEATURE_LIMIT
    a["x_test"][3, 0] = np.nan
    _refused(_npz(tmp_path, x_test=a["x_test"]), r"x_test\[3\] holds nan")


def test_femnist_pixels_that_are_nan_are_refused_naming_the_shard(tmp_path):
    for split in ("train", "test"):
        (tmp_path / split).mkdir()
        x = [[0.5] * 784, [0.25] * 784]
        if split == "train":
            x[1][10] = float("nan")
        doc = {"users": ["w0"], "num_samples": [2], "user_data": {"w0": {"x": x, "y": [1, 2]}}}
        (tmp_path / split / "s.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"train/s.json is truncated or malformed \(user 'w0': .*pixels outside \[0, 1\]"):
        load("femnist", tmp_path)


# ---------------------------------------------------------------------------------------
# F10: archive members bounded before they are read


def _bomb(path, member, size):
    """A zip whose ``member`` is ``size`` zero bytes, deflated (about 1000:1)."""
    chunk = bytes(MiB)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z, z.open(member, "w", force_zip64=True) as f:
        for _ in range(size // MiB):
            f.write(chunk)
    return path


def test_a_zip_member_beyond_the_image_bound_is_refused_before_it_is_read(tmp_path):
    root = tmp_path / "photos.zip"
    with zipfile.ZipFile(root, "w") as z:  # a small valid class beside the bomb
        formats.png(tmp_path / "ok.png", 8, (1, 2, 3))
        z.write(tmp_path / "ok.png", "cat/ok.png")
    big = image_cache.IMAGE_BYTES + MiB
    with zipfile.ZipFile(root, "a", zipfile.ZIP_DEFLATED) as z, z.open("dog/huge.png", "w", force_zip64=True) as f:
        for _ in range(big // MiB):
            f.write(bytes(MiB))
    assert root.stat().st_size < 2 * MiB
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=r"photos.zip:dog/huge.png is 65 MiB; allowed: image files of at most 64 MiB"):
            load("imagefolder", root, size=8)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * MiB  # refused from the zip's directory, nothing of it read


def test_image_members_expanding_beyond_the_ratio_are_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "ZIP_FLOOR", MiB)  # the real floor, 64 MiB, takes a second to deflate
    root = _bomb(tmp_path / "bomb.zip", "cat/blank.bmp", 2 * MiB)
    with pytest.raises(DataError, match=r"data.root: .*bomb.zip: its image files expand to 2 MiB from \d+ bytes "
                                        r"\(\d+:1\); allowed: at most 100:1 beyond 1 MiB \(a zip bomb\?\)"):
        load("imagefolder", root, size=8)


def test_an_image_file_in_a_folder_beyond_the_bound_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(image_cache, "IMAGE_BYTES", 1000)
    formats.png(tmp_path / "imgs" / "c0" / "a.png", 8, (1, 2, 3))
    (tmp_path / "imgs" / "c1").mkdir()
    (tmp_path / "imgs" / "c1" / "b.png").write_bytes(bytes(5000))
    with pytest.raises(DataError, match=r"imgs/c1/b.png is 5000 bytes; allowed: image files of at most 1000 bytes"):
        load("imagefolder", tmp_path / "imgs", size=8)


def test_an_image_with_too_many_pixels_is_refused_before_it_is_decoded(tmp_path, monkeypatch):
    monkeypatch.setattr(image_cache, "IMAGE_PIXELS", 100)
    for k in range(2):
        formats.png(tmp_path / "imgs" / f"c{k}" / "a.png", 16, (1, 2, 3))
        formats.png(tmp_path / "imgs" / f"c{k}" / "b.png", 8, (1, 2, 3))
    monkeypatch.setenv("FEDRIFT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DataError, match=r"a.png is 16x16 pixels; allowed: images of at most 100 pixels"):
        load("imagefolder", tmp_path / "imgs", size=8)


def test_a_text_member_beyond_its_bound_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(image_cache, "TEXT_BYTES", 100)
    base = formats.tinyimagenet(tmp_path)
    (base / "wnids.txt").write_text("n01443537\n" * 20)
    with pytest.raises(DataError, match=r"wnids.txt is 200 bytes; allowed: text files of at most 100 bytes"):
        load("tinyimagenet", tmp_path)


def test_npz_arrays_expanding_beyond_the_ratio_are_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "ZIP_FLOOR", MiB)
    path, dim = tmp_path / "d.npz", 8 * MiB // 240
    flat = {**_arrays(), "x_train": np.zeros((60, dim), np.float32), "x_test": np.zeros((10, dim), np.float32)}
    np.savez_compressed(path, **flat)
    _refused(path, r"its arrays expand to 9.3 MiB from .*; allowed: at most 100:1 beyond 1 MiB, or arrays saved "
                   r"uncompressed \(np.savez\) \(a zip bomb\?\)")
    np.savez(path, **flat)
    assert load("npz", path).num_train == 60  # the same arrays uncompressed: read
