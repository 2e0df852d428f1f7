"""Image trees at real scale: ``data.root`` as a zip (or a folder holding one), the decode
cache keyed by the files' content, damaged members refused by name, and the Tiny-ImageNet
recipe's tree read by ``tinyimagenet``."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import formats
from fedrift.cache import cache_dir
from fedrift.data import DATASETS, image_cache, load_dataset
from fedrift.errors import DataError

REPO = Path(__file__).resolve().parents[2]


def load(name, root, **options):
    entry = DATASETS.get(name)
    return load_dataset(name, root, entry.params(**options) if entry.params else None)


def cifar_like(root: Path) -> Path:
    """``root/train/<class>/*.jpg`` and ``root/test/<class>/*.jpg``, CIFAR-10 JPEG copy's layout;
    each image a different colour, so order and labels are checkable."""
    for split, n in (("train", 3), ("test", 2)):
        for c, name in enumerate(("airplane", "bird", "cat")):
            for i in range(n):
                formats.png(root / split / name / f"{i:04d}.png", 8, (80 * c, 20 * i, 100 if split == "train" else 200))
    return root


def zipped(folder: Path, path: Path, top: str | None = None) -> Path:
    """``folder``'s files in a zip, under ``top/`` when given (as zipping the folder itself)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for f in sorted(folder.rglob("*")):
            rel = f.relative_to(folder).as_posix()
            z.write(f, f"{top}/{rel}" if top else rel)
    return path


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """Each test its own cache: the trees here are alike, so a shared one would already hold them."""
    monkeypatch.setenv("FEDRIFT_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def counted(monkeypatch):
    """How many images were decoded (not read from the cache)."""
    calls = []
    real = image_cache.read_image
    monkeypatch.setattr(image_cache, "read_image", lambda *a: calls.append(a[0]) or real(*a))
    return calls


def test_a_zip_a_folder_holding_it_and_the_folder_give_the_same_dataset(tmp_path):
    tree = cifar_like(tmp_path / "tree")
    plain = load("imagefolder", tree, size=8)
    store = tmp_path / "shared" / "cifar10-jpeg"
    store.mkdir(parents=True)
    (store / "README.md").write_text("what the zip holds\n")
    archive = zipped(tree, store / "cifar10-jpeg.zip")
    nested = zipped(tree, tmp_path / "nested.zip", top="cifar")  # zip of the folder itself
    for root in (archive, store, nested):
        ds = load("imagefolder", root, size=8)
        assert torch.equal(ds.x_train, plain.x_train) and torch.equal(ds.y_train, plain.y_train)
        assert torch.equal(ds.x_test, plain.x_test) and torch.equal(ds.y_test, plain.y_test)
    assert plain.y_train.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and plain.x_test.shape == (6, 3, 8, 8)


def test_second_load_reads_the_cache_and_a_changed_file_is_decoded_again(tmp_path, counted):
    tree = cifar_like(tmp_path / "tree")
    first = load("imagefolder", tree, size=8)
    assert len(counted) == 15  # 9 train + 6 test images decoded
    assert len(list(cache_dir().glob("images-*.npy"))) >= 2
    again = load("imagefolder", tree, size=8)
    assert len(counted) == 15 and torch.equal(again.x_train, first.x_train) and torch.equal(again.x_test, first.x_test)
    # another size is another entry
    load("imagefolder", tree, size=4)
    assert len(counted) == 30
    # one train file's content changes: the train split is decoded again, the test split is not
    formats.png(tree / "train" / "bird" / "0001.png", 8, (1, 2, 3))
    changed = load("imagefolder", tree, size=8)
    assert len(counted) == 39
    assert changed.x_train[4, :, 0, 0].tolist() == [1, 2, 3] and not torch.equal(changed.x_train, first.x_train)
    assert torch.equal(changed.x_test, first.x_test)


def test_zip_members_are_keyed_without_reading_them(tmp_path, counted):
    archive = zipped(cifar_like(tmp_path / "tree"), tmp_path / "c.zip")
    load("imagefolder", archive, size=8)
    assert len(counted) == 15 and all(isinstance(p, image_cache.ZipTree) for p in counted)
    # a second load keys by the archive's CRC-32 and sizes: no member is read
    reads = []
    real = zipfile.ZipFile.read
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zipfile.ZipFile, "read", lambda self, name, pwd=None: reads.append(name) or real(self, name, pwd))
        load("imagefolder", archive, size=8)
    assert reads == [] and len(counted) == 15


def test_an_unreadable_cache_entry_is_decoded_again(tmp_path, counted):
    tree = cifar_like(tmp_path / "tree")
    first = load("imagefolder", tree, size=8)
    for entry in cache_dir().glob("images-*.npy"):
        entry.write_bytes(b"not an array")
    again = load("imagefolder", tree, size=8)
    assert len(counted) == 30 and torch.equal(again.x_train, first.x_train)


def test_a_damaged_zip_member_is_refused_naming_it(tmp_path):
    archive = zipped(cifar_like(tmp_path / "tree"), tmp_path / "c.zip")
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as z:
        info = z.getinfo("train/bird/0001.png")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)  # the member's stored bytes
    data[start + 40] ^= 0xFF
    archive.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"c\.zip:train/bird/0001\.png is truncated or malformed \(BadZipFile: Bad CRC-32"):
        load("imagefolder", archive, size=8)


def test_a_damaged_archive_or_two_archives_are_refused(tmp_path):
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(DataError, match=r"bad\.zip is truncated or malformed \(BadZipFile"):
        load("imagefolder", bad)
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.zip", "b.zip"):
        zipped(cifar_like(tmp_path / name[0]), two / name)
    with pytest.raises(DataError, match=r"holds 2 \.zip archives \(a\.zip, b\.zip\); expected one"):
        load("imagefolder", two)
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    with pytest.raises(DataError, match=r"notes\.txt is a file; expected a folder or a \.zip"):
        load("imagefolder", notes)


def test_tinyimagenet_reads_its_zip(tmp_path):
    formats.tinyimagenet(tmp_path / "t")
    plain = load("tinyimagenet", tmp_path / "t", size=32)
    archive = zipped(tmp_path / "t", tmp_path / "tiny.zip")
    ds = load("tinyimagenet", archive, size=32)
    assert ds.x_train.shape == (9, 3, 32, 32) and torch.equal(ds.x_train, plain.x_train)
    assert torch.equal(ds.y_test, plain.y_test) and torch.equal(ds.x_test, plain.x_test)


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def _repo(path: Path) -> str:
    _git(path, "init", "-q")
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "tree")
    return _git(path, "rev-parse", "HEAD").strip()


@pytest.mark.process
def test_the_recipe_rebuilds_a_tree_tinyimagenet_reads(tmp_path):
    """benchmarks/tiny_imagenet_tree.sh on two small repositories laid out as the two public
    ones: the image repository's wnids.txt edited (one line), the other's with the classes
    first and more lines after."""
    wnids = ("n01443537", "n01629819", "n01641577")
    dla = tmp_path / "dla"
    formats.tinyimagenet(dla, wnids=wnids)
    (dla / "tiny-imagenet-200" / "wnids.txt").write_text("n02124075\n")
    imagenet = tmp_path / "imagenet"
    (imagenet / "tiny-imagenet-200").mkdir(parents=True)
    (imagenet / "tiny-imagenet-200" / "wnids.txt").write_text("".join(f"{w}\n" for w in (*wnids, "n09999999")))
    env = {**os.environ, "DLA_COMMIT": _repo(dla), "IMAGENET_COMMIT": _repo(imagenet)}
    script = REPO / "benchmarks" / "tiny_imagenet_tree.sh"
    out = tmp_path / "data"
    done = subprocess.run(["bash", str(script), str(dla), str(imagenet), str(out)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "3 classes, 9 train and 4 val images" in done.stdout
    assert (out / "tiny-imagenet-200" / "wnids.txt").read_text().split() == list(wnids)
    ds = load("tinyimagenet", out)
    assert ds.num_classes == 3 and ds.x_train.shape == (9, 3, 64, 64) and ds.y_test.tolist() == [0, 1, 2, 0]
    # run again on the same folder: refused, nothing overwritten
    again = subprocess.run(["bash", str(script), str(dla), str(imagenet), str(out)], env=env, capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr
    # a class list that does not name the train folders is refused
    shutil.rmtree(out)
    (imagenet / "tiny-imagenet-200" / "wnids.txt").write_text("n09999999\nn01443537\nn01629819\n")
    env["IMAGENET_COMMIT"] = (_git(imagenet, "commit", "-q", "-am", "edit"), _git(imagenet, "rev-parse", "HEAD").strip())[1]
    bad = subprocess.run(["bash", str(script), str(dla), str(imagenet), str(out)], env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and "do not name the 3 train folders" in bad.stderr


def test_cached_pixels_equal_a_fresh_decode(tmp_path):
    """The cache returns exactly what decoding gives (uint8 arrays, same order)."""
    tree = cifar_like(tmp_path / "tree")
    paths = image_cache.image_files(tree / "train" / "cat")
    direct = np.stack([image_cache.read_image(p, 8, 3) for p in paths])
    assert np.array_equal(image_cache.read_images(paths, 8, 3), direct)
    assert np.array_equal(image_cache.read_images(paths, 8, 3), direct)


def test_an_entry_read_into_place_is_the_saved_array_and_a_torn_or_other_entry_is_not_read(tmp_path):
    """``cached_into`` (the hf loader's second load): the saved pixels exactly, read into the
    caller's array; a torn file, one with bytes after its array, another shape or type: False."""
    pixels = np.random.default_rng(0).integers(0, 256, (5, 3, 4, 4), dtype=np.uint8)
    entry = tmp_path / "images-x.npy"
    image_cache.keep(entry, pixels)
    out = np.zeros((7, 3, 4, 4), np.uint8)
    assert image_cache.cached_into(entry, out[1:6]) and np.array_equal(out[1:6], pixels)
    assert not out[0].any() and not out[6].any()
    assert not image_cache.cached_into(entry, np.zeros((4, 3, 4, 4), np.uint8))  # another shape
    image_cache.keep(entry, pixels.astype(np.int16))
    assert not image_cache.cached_into(entry, np.zeros_like(pixels))  # another type
    image_cache.keep(entry, pixels)
    whole = entry.read_bytes()
    entry.write_bytes(whole[:-7])
    assert not image_cache.cached_into(entry, np.zeros_like(pixels))  # torn
    entry.write_bytes(whole + b"x")
    assert not image_cache.cached_into(entry, np.zeros_like(pixels))  # more than its header says
    assert not image_cache.cached_into(tmp_path / "absent.npy", np.zeros_like(pixels))
