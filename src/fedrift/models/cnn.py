"""``cnn``: the CNN of FedAvg (McMahan et al. 2017, "Communication-Efficient Learning of
Deep Networks from Decentralized Data", section 3).

Two 5x5 convolutions (32 and 64 channels, 'same' padding), each followed by ReLU and 2x2
max pooling, then a fully connected layer of 512 units with ReLU (the representation) and
a linear classifier ``fc``. On 1x28x28 MNIST with 10 classes: 1,663,370 parameters.
Option ``projection_dim`` adds a projection head before ``fc`` (see ``models/base.py``).

Option ``norm: batch`` puts a BatchNorm (``models/norm.py``: running statistics as state the
engine carries) after each convolution, before its ReLU, as FedBN's digits model does (Li et
al., ICLR 2021, Appendix; theirs has three convolutions, and BatchNorm on its two hidden fully
connected layers too): the model for FedBN on workload D. Not after the fully connected layer:
there the batched executor's step disagreed with sequential's beyond float rounding (2.6e-3
relative after one round of the tests' tiny config, against 1e-6 for the convolutions'
BatchNorm; not yet explained). The default (``none``) is McMahan's CNN, unchanged.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from fedrift.models import needs_image, register_model
from fedrift.models.base import FedModel, batched_linear, channel_groups, clients_first, grouped_conv
from fedrift.models.norm import BatchNorm2d
from fedrift.params import params

_check = needs_image(4)  # two 2x2 poolings must leave at least one pixel


@params
class CNNParams:
    """``hidden``: width of the fully connected layer before the classifier (512 in the paper).

    ``projection_dim``: when set, a projection head ``proj`` (``Linear(feat, feat) -> ReLU ->
    Linear(feat, projection_dim)``, MOON's) sits between the representation and ``fc``;
    ``features`` then returns its output (MOON, FedGKD+; 256 in their papers). None: no head.

    ``norm``: ``none`` (McMahan's CNN) or ``batch`` (BatchNorm after both convolutions; its
    running statistics are model state).
    """

    hidden: Annotated[int, Field(ge=1)] = 512
    projection_dim: Annotated[int, Field(ge=1)] | None = None
    norm: Literal["none", "batch"] = "none"


class CNN(FedModel):
    head_prefixes = ("fc",)

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 512, projection_dim: int | None = None,
        norm: str = "none",
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
        layer = (lambda c: BatchNorm2d(c)) if norm == "batch" else (lambda c: nn.Identity())  # noqa: E731
        self.norm1, self.norm2 = layer(32), layer(64)
        self._classifier(hidden, num_classes, projection_dim)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.norm1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.norm2(self.conv2(x))), 2)
        return self.proj(F.relu(self.dense(x.flatten(-3))))

    def stacked_features(self, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor | None:
        """The K clients as K channel groups (``models.base.FedModel.stacked``): each
        convolution one call grouped by client, pooling per channel, the dense layer one
        batched product. Not with BatchNorm."""
        if not isinstance(self.norm1, nn.Identity):
            return None
        k, h = x.shape[0], channel_groups(x)
        for conv in ("conv1", "conv2"):
            h = F.max_pool2d(F.relu(grouped_conv(h, p, conv, getattr(self, conv), k)), 2)
        return F.relu(batched_linear(clients_first(h, k), p, "dense"))


@register_model(
    "cnn",
    "FedAvg CNN (McMahan et al. 2017): two 5x5 convs + fc 512, or with BatchNorm (model.norm); (C,H,W) input, H,W >= 4",
    CNNParams,
    _check,
)
def build_cnn(options: CNNParams, input_shape: tuple[int, ...], num_classes: int) -> CNN:
    return CNN(tuple(input_shape), num_classes, hidden=options.hidden, projection_dim=options.projection_dim,
               norm=options.norm)
