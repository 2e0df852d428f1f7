"""Tiny dataset files in the exact published formats, written by the tests."""

from __future__ import annotations

import json
import pickle
import tarfile
from pathlib import Path

import numpy as np


def _pickle(path: Path, doc: dict) -> None:
    # CIFAR's files are Python 2 cPickle dumps: bytes keys, protocol 2
    path.write_bytes(pickle.dumps(doc, protocol=2))


def cifar10(root: Path, per_batch: int = 6, seed: int = 0) -> Path:
    """``root/cifar-10-batches-py`` with data_batch_1..5, test_batch, batches.meta."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    _pickle(folder / "batches.meta", {b"num_cases_per_batch": per_batch, b"label_names": names, b"num_vis": 3072})
    for i, member in enumerate([*(f"data_batch_{k}" for k in range(1, 6)), "test_batch"]):
        labels = [int(v) for v in rng.integers(0, 10, per_batch)]
        _pickle(folder / member, {
            b"batch_label": f"batch {i}".encode(),
            b"labels": labels,
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"filenames": [f"img_{i}_{j}.png".encode() for j in range(per_batch)],
        })
    return folder


def cifar100(root: Path, n: int = 12, seed: int = 0) -> Path:
    """``root/cifar-100-python`` with train, test, meta (fine and coarse labels)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    _pickle(folder / "meta", {b"fine_label_names": [f"f{k}".encode() for k in range(100)],
                              b"coarse_label_names": [f"c{k}".encode() for k in range(20)]})
    for member in ("train", "test"):
        fine = rng.integers(0, 100, n)
        _pickle(folder / member, {
            b"filenames": [f"{member}_{j}.png".encode() for j in range(n)],
            b"batch_label": member.encode(),
            b"fine_labels": [int(v) for v in fine],
            b"coarse_labels": [int(v) // 5 for v in fine],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        })
    return folder


def archive(folder: Path, path: Path) -> Path:
    """``folder`` packed as the published ``.tar.gz`` (its top folder inside)."""
    with tarfile.open(path, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return path


def jpeg(path: Path, size: int, colour: tuple[int, int, int], mode: str = "RGB") -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (size, size), colour if mode == "RGB" else colour[0]).save(path, format="JPEG")


def png(path: Path, size: int, colour: tuple[int, int, int]) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), colour).save(path, format="PNG")


def tinyimagenet(root: Path, wnids=("n01443537", "n01629819", "n01641577"), per_class: int = 3, val: int = 4) -> Path:
    """``root/tiny-imagenet-200``: wnids.txt, words.txt, train/<wnid>/images/*.JPEG with
    <wnid>_boxes.txt, val/images/*.JPEG with val/val_annotations.txt, test/images/."""
    base = root / "tiny-imagenet-200"
    base.mkdir(parents=True)
    (base / "wnids.txt").write_text("".join(f"{w}\n" for w in wnids))
    (base / "words.txt").write_text("".join(f"{w}\tthing {w}\n" for w in wnids))
    for k, w in enumerate(wnids):
        boxes = []
        for i in range(per_class):
            name = f"{w}_{i}.JPEG"
            mode = "L" if i == 0 else "RGB"  # the real set has a few greyscale JPEGs
            jpeg(base / "train" / w / "images" / name, 64, (40 * k + 10, 100, 200 - 40 * k), mode)
            boxes.append(f"{name}\t0\t0\t63\t63\n")
        (base / "train" / w / f"{w}_boxes.txt").write_text("".join(boxes))
    notes = []
    for i in range(val):
        w = wnids[i % len(wnids)]
        jpeg(base / "val" / "images" / f"val_{i}.JPEG", 64, (40 * (i % len(wnids)) + 10, 100, 90))
        notes.append(f"val_{i}.JPEG\t{w}\t1\t2\t60\t61\n")
    (base / "val" / "val_annotations.txt").write_text("".join(notes))
    jpeg(base / "test" / "images" / "test_0.JPEG", 64, (1, 2, 3))
    return base


def femnist(root: Path, writers: int = 3, per_writer: int = 5, seed: int = 0, unseen: int = 0) -> Path:
    """LEAF's ``data/femnist/data``: train/ and test/ JSON shards (users, num_samples,
    user_data), pixels as LEAF writes them (floats k/255), split by sample per writer;
    ``unseen`` more writers in test only (as a split by writer has them)."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", per_writer), ("test", 2)):
        users = [f"f{k:04d}_{k * 7 % 100:02d}" for k in range(writers + (unseen if split == "test" else 0))]
        data = {}
        for u in users:
            x = rng.integers(0, 256, (n, 784)) / 255.0
            data[u] = {"x": x.tolist(), "y": [int(v) for v in rng.integers(0, 62, n)]}
        half = writers // 2  # two shards, as LEAF writes several
        for part, chunk in enumerate((users[:half], users[half:])):
            doc = {"users": chunk, "num_samples": [n] * len(chunk), "user_data": {u: data[u] for u in chunk}}
            folder = root / split
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"all_data_{part}_niid_0_keep_0_{split}_9.json").write_text(json.dumps(doc))
    return root


OFFICE = ("amazon", "caltech", "dslr", "webcam")


def office_caltech10(root: Path, classes=("back_pack", "bike", "mug"), per_class: int = 5) -> Path:
    """``root/<domain>/<class>/`` images as the published set has them: JPEGs of several sizes
    (amazon's 300x300 product shots, larger caltech photos, a few greyscale ones), one PNG.
    Domain d's images have red level 60 d + 20, class k's green level 80 k + 10."""
    for d, domain in enumerate(OFFICE):
        for k, name in enumerate(classes):
            for i in range(per_class):
                colour = (60 * d + 20, 80 * k + 10, 128)
                folder = root / domain / name
                if i == per_class - 1:
                    png(folder / f"frame_{i:04d}.png", 40, colour)
                else:
                    jpeg(folder / f"frame_{i:04d}.jpg", 48 + 16 * d, colour)
    return root
