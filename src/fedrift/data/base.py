"""A dataset is tensors in memory plus the little metadata the engine needs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from fedrift.errors import DataError

FEATURE_LIMIT = 1e6
"""The largest magnitude of a float feature (after the loader's own scaling). The models take
inputs of order 1 (standardised, or pixels / 255) and start from weights of order
1/sqrt(fan-in): a feature a million times that is a unit slip or a corrupt row (raw
timestamps, an unscaled counter, 1e300), and its first step sends the loss to inf, where the
run would blame ``train.lr``. float32 stays exact to 1 in 2**24 well past it."""


@dataclass(frozen=True)
class PixelNorm:
    """How uint8 images become model inputs: ``(x / 255 - mean[c]) / std[c]`` per channel.

    Image datasets keep their pixels as uint8 (CIFAR-10's train set: 150 MB, not 600 MB as
    float32) and every batch is turned into float32 on the device when a model reads it
    (``engine.local.make_apply``): one multiply-add per element, where the batch already is.
    """

    mean: tuple[float, ...]  # per channel, of x / 255
    std: tuple[float, ...]
    _consts: dict = field(default_factory=dict, compare=False, repr=False)  # device -> (scale, shift)

    @classmethod
    def of(cls, x: torch.Tensor) -> "PixelNorm":
        """Per-channel mean and std of uint8 images ``(n, C, H, W)`` (a training split), from
        each channel's exact histogram of the 256 grey levels: no float copy of the set, and
        on CIFAR-10's train set 0.45 s where float64 sums over chunks took 4.4 s."""
        levels = torch.arange(256, dtype=torch.float64) / 255.0
        means, stds = [], []
        for c in range(x.shape[1]):
            counts = torch.bincount(x[:, c].reshape(-1), minlength=256).to(torch.float64)
            total = counts.sum().clamp(min=1)
            mean = (counts * levels).sum() / total
            var = (counts * (levels - mean) ** 2).sum() / total
            std = float(var.sqrt())
            means.append(float(mean))
            stds.append(std if std > 1e-6 else 1.0)  # a constant channel (std: rounding noise): shift only
        return cls(tuple(means), tuple(stds))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """float32 inputs from uint8 images ``(..., C, H, W)``, on ``x``'s device."""
        consts = self._consts.get(x.device)
        if consts is None:
            std = torch.tensor(self.std, dtype=torch.float64)
            scale = (1.0 / (255.0 * std)).float().view(-1, 1, 1)
            shift = (-torch.tensor(self.mean, dtype=torch.float64) / std).float().view(-1, 1, 1)
            consts = self._consts[x.device] = (scale.to(x.device), shift.to(x.device))
        scale, shift = consts
        return x.to(torch.float32) * scale + shift


@dataclass(frozen=True)
class TokenCut:
    """Dynamic padding: a batch of token ids ``(..., L)`` cut to its longest sentence.

    Text datasets keep int token ids padded with ``pad_id`` on the right to one width;
    ``cut(x)`` drops the columns where every row of ``x`` (every leading dimension: the
    batched executor's stacked clients too) is padding. The attention mask is ``ids !=
    pad_id``, so the cut changes no output beyond float rounding. Reads the batch (one sync),
    so never under ``vmap``: the batched executor cuts the stacked batch before its call.
    """

    pad_id: int = 0
    vmappable = False  # see engine.local.make_tools

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_floating_point() or x.numel() == 0:
            return x
        width = max(1, int((x != self.pad_id).sum(-1).max()))
        return x[..., :width] if width < x.shape[-1] else x


@dataclass(frozen=True)
class Dataset:
    """Train and test tensors, held whole in memory; clients are index arrays into them.

    ``x`` is float32 model input, or uint8 images ``(n, C, H, W)`` with ``pixel_norm`` saying
    how a batch becomes model input (:meth:`inputs`), or int token ids ``(n, L)`` padded with
    0 (text; ``token_cut`` set when each batch is cut to its longest sentence). ``train_groups``/``test_groups`` carry
    a natural client id per sample (the writer, the generator's device) for datasets that
    have one, else None.

    Multi-domain datasets (feature skew: the same classes seen through different sources,
    as Office-Caltech-10's four) name their domains in ``domain_names`` and give each
    training sample its domain's index in ``train_domains`` (and, optionally, each test
    sample in ``test_domains``); the ``domain`` partition reads them. The global test set
    is every domain's test samples. Others leave them empty / None (:func:`with_domains`).
    """

    name: str
    x_train: torch.Tensor  # float32 or uint8, shape (n_train, *input_shape)
    y_train: torch.Tensor  # int64, shape (n_train,)
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    train_groups: np.ndarray | None = None  # int64 (n_train,)
    test_groups: np.ndarray | None = None  # int64 (n_test,)
    pixel_norm: PixelNorm | None = None  # set exactly when x is uint8
    token_cut: TokenCut | None = None  # text with dynamic padding
    text: str | None = None  # "tokens": int token ids; "pooled": a frozen encoder's sentence embeddings
    train_domains: np.ndarray | None = None  # int64 (n_train,): index into domain_names
    test_domains: np.ndarray | None = None  # int64 (n_test,), or None
    domain_names: tuple[str, ...] = ()
    source: str = ""  # the file or folder the samples were read from, named by refusals ("": none)

    def __post_init__(self) -> None:
        if (self.x_train.dtype == torch.uint8) != (self.pixel_norm is not None):
            raise ValueError("Dataset: uint8 images need a pixel_norm, float inputs take none")
        if (self.train_domains is None) != (not self.domain_names) or (
            self.test_domains is not None and self.train_domains is None
        ):
            raise ValueError("Dataset: train_domains and domain_names go together (test_domains only with them)")
        for ids, n in ((self.train_domains, self.y_train.shape[0]), (self.test_domains, self.y_test.shape[0])):
            if ids is not None and (ids.shape != (n,) or (n and (ids.min() < 0 or ids.max() >= len(self.domain_names)))):
                raise ValueError(f"Dataset: domain ids need shape ({n},) and values in 0..{len(self.domain_names) - 1}")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def prepare(self) -> "PixelNorm | TokenCut | None":
        """What turns raw integer rows into model input (``engine.local.make_apply``)."""
        return self.pixel_norm if self.pixel_norm is not None else self.token_cut

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Model input for rows ``x`` of this dataset (uint8 images normalised, floats as they are)."""
        return self.pixel_norm(x) if self.pixel_norm is not None and x.dtype == torch.uint8 else x


def with_domains(
    dataset: Dataset, names: "list[str] | tuple[str, ...]", train: np.ndarray, test: np.ndarray | None = None
) -> Dataset:
    """``dataset`` with domains: ``names[d]`` is domain d; ``train``/``test``: each sample's d."""
    test_ids = None if test is None else np.asarray(test, dtype=np.int64)
    return replace(dataset, train_domains=np.asarray(train, dtype=np.int64), test_domains=test_ids, domain_names=tuple(names))


def image_dataset(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
    train_groups: np.ndarray | None = None,
    test_groups: np.ndarray | None = None,
) -> Dataset:
    """A Dataset of uint8 images ``(n, C, H, W)``, normalised with its training split's
    per-channel statistics (no test statistic leaks into training)."""
    xt = torch.from_numpy(np.ascontiguousarray(x_train, dtype=np.uint8))
    return Dataset(
        name,
        xt,
        torch.from_numpy(np.asarray(y_train, dtype=np.int64)),
        torch.from_numpy(np.ascontiguousarray(x_test, dtype=np.uint8)),
        torch.from_numpy(np.asarray(y_test, dtype=np.int64)),
        num_classes,
        train_groups,
        test_groups,
        pixel_norm=PixelNorm.of(xt),
    )


def arrays_dataset(
    name: str,
    x_train: "np.ndarray | torch.Tensor",
    y_train: "np.ndarray | torch.Tensor",
    x_test: "np.ndarray | torch.Tensor",
    y_test: "np.ndarray | torch.Tensor",
    num_classes: int | None = None,
    source: str = "",
) -> Dataset:
    """A Dataset from arrays in memory (numpy or CPU torch): uint8 ``x`` is images, ``(n, C, H, W)``
    or ``(n, H, W)`` (one channel), normalised per channel with the training split's statistics;
    any other ``x`` is float features used as they are (as float32). ``y`` holds class ids from
    0; ``num_classes`` None: the largest id + 1 (:func:`class_count` checks both against the
    sample count). ``source``: the file the arrays came from, named by refusals."""
    xtr, xte = np.asarray(x_train), np.asarray(x_test)
    ytr, yte = np.asarray(y_train), np.asarray(y_test)
    num_classes = class_count(ytr, yte, num_classes, _where(source, name))
    ytr, yte = ytr.astype(np.int64), yte.astype(np.int64)
    if xtr.dtype == np.uint8:
        if xtr.ndim == 3:
            xtr, xte = xtr[:, None], xte[:, None]
        return replace(image_dataset(name, xtr, ytr, xte, yte, num_classes), source=source)
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32: inf, refused by check_dataset
        xtr, xte = np.ascontiguousarray(xtr, dtype=np.float32), np.ascontiguousarray(xte, dtype=np.float32)
    return Dataset(name, torch.from_numpy(xtr), torch.from_numpy(ytr), torch.from_numpy(xte), torch.from_numpy(yte),
                   num_classes, source=source)


def _where(source: str | None, name: str) -> str:
    """How a refusal names the data: ``data.root: FILE``, or the dataset when it has no file."""
    return f"data.root: {source}" if source else f"data: {name}"


def _need_samples(n_train: int, n_test: int, where: str) -> None:
    for split, n in (("train", n_train), ("test", n_test)):
        if not n:
            raise DataError(f"{where}: the {split} split is empty (x_{split}, y_{split} hold 0 samples); "
                            f"allowed: at least one training and one test sample")


def class_count(y_train: np.ndarray, y_test: np.ndarray, num_classes: int | None, where: str) -> int:
    """The number of classes C, checked before anything (one-hot rows, the model's head, the
    partition's counts) is sized from it: ``y`` holds integer class ids from 0 (integral floats
    pass); C is ``num_classes`` (the config's: every id below it) or, None, the largest id + 1;
    either way at most the number of training samples (a class no sample can show is a label
    gone wrong: 10**9 would size gigabytes). ``where`` opens the refusal (:func:`_where`)."""
    _need_samples(len(y_train), len(y_test), where)
    top, top_split = -1, "y_train"
    for split, y in (("y_train", y_train), ("y_test", y_test)):
        if y.ndim != 1:
            raise DataError(f"{where}: {split} has shape {y.shape}; allowed: one class id per sample, shape (N,)")
        if not (np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_):
            if not np.issubdtype(y.dtype, np.floating):
                raise DataError(f"{where}: {split} is {y.dtype}; allowed: integer class ids")
            odd = ~np.isfinite(y) | (y != np.floor(y))
            if odd.any():
                raise DataError(f"{where}: {split} holds {y[np.argmax(odd)]:g}; allowed: integer class ids")
        low, high = y.min(), y.max()
        if low < 0:
            raise DataError(f"{where}: {split} holds class id {int(low)}; allowed: class ids from 0")
        if high > top:
            top, top_split = int(high), split
    n = len(y_train)
    if num_classes is None:
        if top >= n:
            raise DataError(f"{where}: {top_split} holds class id {top} but only {n} training samples; allowed: "
                            f"class ids 0..C-1 with C at most the number of training samples")
        return top + 1
    file = where.split(": ", 1)[-1]
    if top >= num_classes:
        raise DataError(f"data.num_classes: {num_classes}, but {file} has class id {top}; allowed: {top + 1} or more")
    if num_classes > n:
        raise DataError(f"data.num_classes: {num_classes} is more classes than the {n} training samples of {file}; "
                        f"allowed: {top + 1}..{n} (or null: the largest class id + 1)")
    return int(num_classes)


def check_dataset(ds: Dataset, source: "str | Path | None" = None) -> Dataset:
    """``ds``, or a :class:`~fedrift.errors.DataError` naming the file read (``ds.source``; else
    ``source``, e.g. ``data.root``; else the dataset's name) and what no run can use: an empty train or test
    split, labels that are not ids ``0..num_classes-1`` one per sample (the model's head has
    ``num_classes`` outputs), float features that are not finite or exceed
    :data:`FEATURE_LIMIT` in magnitude (uint8 images and token ids are in range by their type).
    A few reductions over each tensor, no loop over samples: called once, as a dataset loads."""
    where = _where(ds.source or (str(source) if source else None), ds.name)
    _need_samples(ds.x_train.shape[0], ds.x_test.shape[0], where)
    for split, x, y in (("train", ds.x_train, ds.y_train), ("test", ds.x_test, ds.y_test)):
        if y.dtype != torch.int64 or y.shape != (x.shape[0],):
            raise DataError(f"{where}: y_{split} is {y.dtype} {tuple(y.shape)} beside x_{split} {tuple(x.shape)}; "
                            f"allowed: one int64 class id per sample")
        low, high = (int(v) for v in torch.aminmax(y))
        if low < 0 or high >= ds.num_classes:
            bad = low if low < 0 else high
            raise DataError(f"{where}: y_{split} holds class id {bad}; allowed: 0..{ds.num_classes - 1} "
                            f"({ds.num_classes} classes)")
        if x.is_floating_point():
            low, high = (float(v) for v in torch.aminmax(x))
            if not (-FEATURE_LIMIT <= low and high <= FEATURE_LIMIT):  # NaN fails both
                raise DataError(f"{where}: {_bad_feature(x, split)}; allowed: finite features of magnitude at most "
                                f"{_num(FEATURE_LIMIT)} (scale or standardise them)")
    return ds


def _bad_feature(x: torch.Tensor, split: str) -> str:
    """``x_train[17] holds nan``: the first sample with a value out of bounds (a refusal's path only)."""
    bad = ~((x >= -FEATURE_LIMIT) & (x <= FEATURE_LIMIT)).reshape(x.shape[0], -1)
    row = int(bad.any(1).to(torch.uint8).argmax())
    value = float(x[row].reshape(-1)[bad[row]][0])
    note = " (or a value beyond float32's 3.4e38)" if value in (float("inf"), float("-inf")) else ""
    return f"x_{split}[{row}] holds {_num(value)}{note}"


def _num(v: float) -> str:
    """``1e6``, ``3e7``, ``0.5``, ``nan``: a number in a refusal."""
    return f"{v:g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")
