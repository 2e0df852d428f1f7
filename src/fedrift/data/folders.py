"""Image folder trees: ``imagefolder`` (root/<class>/<images>), Tiny-ImageNet and
Office-Caltech-10 (root/<domain>/<class>/<images>).

Images are decoded with Pillow (declared, and already required by matplotlib), converted to
RGB or grey and resized bilinearly to a fixed square size, then kept as uint8. ``data.root``
may be the folder, a ``.zip`` of it, or a folder holding that one ``.zip``; the decoded pixels
are cached by the files' content (:mod:`fedrift.data.image_cache`), so only a run's first load
decodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from fedrift.data import DATASETS, image_cache
from fedrift.data.base import Dataset, image_dataset, with_domains
from fedrift.data.embedded import stratified_split
from fedrift.data.files import DataError, malformed, need_dir, need_file, need_root, read_bounded
from fedrift.data.image_cache import Tree, image_files, open_root, read_images
from fedrift.params import params

Side = Annotated[int, Field(ge=1, le=1024)]


@params
class ImageFolderParams:
    """``size``: images resized to ``size`` x ``size``; ``channels``: 3 (RGB) or 1 (grey).
    Without ``train/`` and ``test/`` subfolders, ``test_fraction`` of each class goes to the
    test split, drawn from ``split_seed``."""

    size: Side = 32
    channels: Literal[1, 3] = 3
    test_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.2
    split_seed: int = 0


@params
class TinyImageNetParams:
    """``size``: images resized to ``size`` x ``size`` (64: as published, no resize; 32: the
    downsampled variant of the papers' 32x32 rows, resized bilinearly from the 64x64 files)."""

    size: Side = 64


def _tree(folder: Tree, classes: list[str]) -> tuple[list[Tree], np.ndarray]:
    paths: list[Tree] = []
    labels: list[int] = []
    for c, name in enumerate(classes):
        found = image_files(folder / name) if (folder / name).is_dir() else []
        paths += found
        labels += [c] * len(found)
    return paths, np.asarray(labels, dtype=np.int64)


@DATASETS.register(
    "imagefolder",
    "your images: data.root/<class>/<image files> (or train/ and test/ trees), resized to data.size",
    params=ImageFolderParams,
)
def load_imagefolder(root: Path | None, options: ImageFolderParams) -> Dataset:
    """Classes are the sub-folder names, sorted; class ``k`` is the k-th."""
    holds = "one folder of images per class"
    root = open_root(need_root(root, "imagefolder", holds, file_ok=True), holds)
    split = (root / "train").is_dir() and (root / "test").is_dir()
    top = root / "train" if split else root
    classes = sorted(p.name for p in top.iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"data: {top} has no class folders; expected {top}/<class>/<image files>")
    for name in classes:
        if not image_files(top / name):
            raise DataError(f"data: {top / name} has no image files; expected images (.jpg, .png, ...) of class {name}")
    size, ch = options.size, options.channels
    if split:
        extra = sorted(p.name for p in (root / "test").iterdir() if p.is_dir() and p.name not in classes)
        if extra:
            raise DataError(f"data: {root / 'test' / extra[0]} is a class not in {top}; expected the classes {', '.join(classes)}")
        train_paths, y_train = _tree(top, classes)
        test_paths, y_test = _tree(root / "test", classes)
        x_train, x_test = read_images(train_paths, size, ch, "train"), read_images(test_paths, size, ch, "test")
    else:
        paths, y = _tree(top, classes)
        train, test = stratified_split(y, options.test_fraction, options.split_seed)
        x = read_images(paths, size, ch)
        x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
    return image_dataset("imagefolder", x_train, y_train, x_test, y_test, len(classes))


def _tiny_root(root: Tree) -> Tree:
    for folder in (root / "tiny-imagenet-200", root):
        if (folder / "wnids.txt").is_file():
            return folder
    return need_file(root / "tiny-imagenet-200" / "wnids.txt", "the tiny-imagenet-200 tree's list of 200 class ids").parent


def _lines(path: Tree, expected: str) -> list[str]:
    try:
        text = read_bounded(need_file(path, expected), image_cache.TEXT_BYTES, "text files").decode()
        return [line.rstrip("\r\n") for line in text.splitlines() if line.strip()]
    except UnicodeDecodeError as err:
        raise malformed(path, expected, str(err)) from None


@DATASETS.register(
    "tinyimagenet",
    "Tiny-ImageNet from data.root/tiny-imagenet-200 (wnids.txt, train/, val/; 3x64x64, 200 classes)",
    params=TinyImageNetParams,
)
def load_tinyimagenet(root: Path | None, options: TinyImageNetParams) -> Dataset:
    """Train: ``train/<wnid>/images/*.JPEG``; test: the labelled ``val`` split
    (``val/val_annotations.txt``: file, wnid, box; images in ``val/images/``), as in the
    papers (the published test split has no labels). Class k is line k of ``wnids.txt``."""
    base = _tiny_root(open_root(need_root(root, "tinyimagenet", "tiny-imagenet-200/", file_ok=True), "tiny-imagenet-200/"))
    wnids = [w.strip() for w in _lines(base / "wnids.txt", "one WordNet id per line")]
    if not wnids or len(set(wnids)) != len(wnids):
        raise malformed(base / "wnids.txt", "one distinct WordNet id per line", "empty or repeated ids")
    index = {w: k for k, w in enumerate(wnids)}
    train_paths: list[Tree] = []
    y_train: list[int] = []
    for w in wnids:
        folder = need_dir(base / "train" / w / "images", f"the training images of class {w} (*.JPEG)")
        found = image_files(folder)
        if not found:
            raise DataError(f"data: {folder} has no image files; expected the .JPEG training images of class {w}")
        train_paths += found
        y_train += [index[w]] * len(found)
    notes = base / "val" / "val_annotations.txt"
    expected = "lines 'file<TAB>wnid<TAB>x0<TAB>y0<TAB>x1<TAB>y1' naming images in val/images and ids of wnids.txt"
    test_paths: list[Tree] = []
    y_test: list[int] = []
    for n, line in enumerate(_lines(notes, expected), 1):
        cols = line.split("\t")
        if len(cols) < 2 or cols[1] not in index:
            raise malformed(notes, expected, f"line {n}: {line[:60]!r}")
        test_paths.append(need_file(base / "val" / "images" / cols[0], f"the image named on line {n} of {notes}"))
        y_test.append(index[cols[1]])
    if not test_paths:
        raise malformed(notes, expected, "no lines")
    size = options.size
    return image_dataset(
        "tinyimagenet", read_images(train_paths, size, 3, "train"), np.asarray(y_train), read_images(test_paths, size, 3, "val"),
        np.asarray(y_test), len(wnids),
    )


OFFICE_DOMAINS = ("amazon", "caltech", "dslr", "webcam")


@params
class OfficeCaltechParams:
    """``size``: images resized to ``size`` x ``size`` (RGB); ``test_fraction`` of each class of
    each domain goes to the test split (the set has no published split), drawn from ``split_seed``."""

    size: Side = 64
    test_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.2
    split_seed: int = 0


@DATASETS.register(
    "office_caltech10",
    "Office-Caltech-10: data.root/<amazon|caltech|dslr|webcam>/<class>/<images>, 4 domains (3xSxS, 10 classes)",
    params=OfficeCaltechParams,
)
def load_office_caltech10(root: Path | None, options: OfficeCaltechParams) -> Dataset:
    """Domain d is ``OFFICE_DOMAINS[d]``; classes are the sorted class folders, the same in
    every domain. Each domain is split per class into train and test; the test set is all
    domains' test samples, each marked with its domain (for the ``domain`` partition)."""
    holds = "the folders amazon, caltech, dslr, webcam, each with one folder of images per class"
    root = open_root(need_root(root, "office_caltech10", holds, file_ok=True), holds)
    folders = [need_dir(root / d, f"the {d} domain: one folder of images per class") for d in OFFICE_DOMAINS]
    classes = sorted(p.name for p in folders[0].iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"data: {folders[0]} has no class folders; expected {folders[0]}/<class>/<image files>")
    parts = []
    for d, folder in enumerate(folders):
        found = sorted(p.name for p in folder.iterdir() if p.is_dir())
        if found != classes:
            raise DataError(
                f"data: {folder} has the class folders {', '.join(found) or 'none'}; expected those of "
                f"{folders[0]} in every domain: {', '.join(classes)}"
            )
        empty = next((c for c in classes if not image_files(folder / c)), None)
        if empty is not None:
            raise DataError(f"data: {folder / empty} has no image files; expected images (.jpg, .png, ...) of class {empty}")
        paths, y = _tree(folder, classes)
        train, test = stratified_split(y, options.test_fraction, options.split_seed + d)
        x = read_images(paths, options.size, 3)
        parts.append((x[train], y[train], x[test], y[test]))
    x_tr, y_tr, x_te, y_te = (np.concatenate([p[i] for p in parts]) for i in range(4))
    ds = image_dataset("office_caltech10", x_tr, y_tr, x_te, y_te, len(classes))
    domains = np.arange(len(OFFICE_DOMAINS))
    d_tr = np.repeat(domains, [len(p[1]) for p in parts])
    return with_domains(ds, OFFICE_DOMAINS, d_tr, np.repeat(domains, [len(p[3]) for p in parts]))
