"""A dataset is tensors in memory plus the little metadata the engine needs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Dataset:
    """Train and test tensors, held whole in memory; clients are index arrays into them.

    ``train_groups``/``test_groups`` carry a natural client id per sample (the writer, the
    generator's device) for datasets that have one, else None.
    """

    name: str
    x_train: torch.Tensor  # float32, shape (n_train, *input_shape)
    y_train: torch.Tensor  # int64, shape (n_train,)
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    train_groups: np.ndarray | None = None  # int64 (n_train,)
    test_groups: np.ndarray | None = None  # int64 (n_test,)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])
