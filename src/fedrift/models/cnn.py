"""``cnn``: the CNN of FedAvg (McMahan et al. 2017, "Communication-Efficient Learning of
Deep Networks from Decentralized Data", section 3).

Two 5x5 convolutions (32 and 64 channels, 'same' padding), each followed by ReLU and 2x2
max pooling, then a fully connected layer of 512 units with ReLU (the representation) and
a linear classifier ``fc``. On 1x28x28 MNIST with 10 classes: 1,663,370 parameters.
Option ``projection_dim`` adds a projection head before ``fc`` (see ``models/base.py``).
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from fedrift.models import needs_image, register_model
from fedrift.models.base import FedModel
from fedrift.params import params

_check = needs_image(4)  # two 2x2 poolings must leave at least one pixel


@params
class CNNParams:
    """``hidden``: width of the fully connected layer before the classifier (512 in the paper).

    ``projection_dim``: when set, a projection head ``proj`` (``Linear(feat, feat) -> ReLU ->
    Linear(feat, projection_dim)``, MOON's) sits between the representation and ``fc``;
    ``features`` then returns its output (MOON, FedGKD+; 256 in their papers). None: no head.
    """

    hidden: Annotated[int, Field(ge=1)] = 512
    projection_dim: Annotated[int, Field(ge=1)] | None = None


class CNN(FedModel):
    head_prefixes = ("fc",)

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 512, projection_dim: int | None = None
    ) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.conv1 = nn.Conv2d(channels, 32, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5, padding=2)
        flat = 64 * (height // 2 // 2) * (width // 2 // 2)
        # Not named fc*: parameter names starting with "fc" are the classifier's.
        self.dense = nn.Linear(flat, hidden)
        self._classifier(hidden, num_classes, projection_dim)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.proj(F.relu(self.dense(x.flatten(-3))))


@register_model(
    "cnn",
    "FedAvg CNN (McMahan et al. 2017): two 5x5 convs + fc 512; (C,H,W) input, H,W >= 4",
    CNNParams,
    _check,
)
def build_cnn(options: CNNParams, input_shape: tuple[int, ...], num_classes: int) -> CNN:
    return CNN(tuple(input_shape), num_classes, hidden=options.hidden, projection_dim=options.projection_dim)
