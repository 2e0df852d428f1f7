"""``fedadc_cnn``: the CNN of FedADC's CIFAR-10 experiments (Ozfatura et al., papers/004_...,
section IV-B1, reused in IV-C1).

What the paper says: "4 convolutional layers and 4 fully connected layers with no batch
normalization applied to the outputs of the layers. Maxpooling is also utilized for the
scaling down the image size." Nothing more: no kernel sizes, widths, pooling positions,
padding or dropout. Decided here (VGG-style, the usual reading of such a description):

- four 3x3 convolutions with 'same' padding, 32, 32, 64 and 64 channels, each followed by
  ReLU; a 2x2 max-pool after the 2nd and after the 4th (so 32x32 becomes 8x8);
- three hidden fully connected layers ``dense1`` (flat -> 512), ``dense2`` (512 -> 256) and
  ``dense3`` (256 -> 128), each followed by ReLU; ``dense3``'s output is the representation
  (``features``), and the classifier ``fc`` is the 4th fully connected layer;
- no normalisation (as the paper says) and no dropout (the paper names none; a dropout mask
  would also have to be an engine-supplied draw for every executor to agree).

On 3x32x32 CIFAR with 10 classes: 2,328,746 parameters. Inputs of any (C, H, W) with H, W
>= 4 (the two poolings floor odd sides, as the FedAvg CNN's do). Options ``channels`` and
``hidden`` change the widths (not the number of layers, which is the paper's);
``projection_dim`` adds a projection head before ``fc`` (see ``models/base.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from fedrift.models import needs_image, register_model
from fedrift.models.base import FedModel, batched_linear, channel_groups, clients_first, grouped_conv
from fedrift.params import params

_check = needs_image(4)  # two 2x2 poolings must leave at least one pixel

Width = Annotated[int, Field(ge=1)]


@params
class FedADCCNNParams:
    """``channels``: the four convolutions' output channels (default 32, 32, 64, 64);
    ``hidden``: the three hidden fully connected layers' widths (default 512, 256, 128; the
    last is the representation's); ``projection_dim``: the optional projection head (MOON,
    FedGKD+; see ``models/base.py``). The paper gives neither width: these are fedrift's."""

    channels: Annotated[list[Width], Field(min_length=4, max_length=4)] = dataclasses.field(
        default_factory=lambda: [32, 32, 64, 64])
    hidden: Annotated[list[Width], Field(min_length=3, max_length=3)] = dataclasses.field(
        default_factory=lambda: [512, 256, 128])
    projection_dim: Annotated[int, Field(ge=1)] | None = None


class FedADCCNN(FedModel):
    head_prefixes = ("fc",)

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, channels: tuple[int, ...] = (32, 32, 64, 64),
        hidden: tuple[int, ...] = (512, 256, 128), projection_dim: int | None = None,
    ) -> None:
        super().__init__()
        cin, height, width = input_shape
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        c1, c2, c3, c4 = channels
        self.conv1 = nn.Conv2d(cin, c1, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=3, padding=1)
        self.conv3 = nn.Conv2d(c2, c3, kernel_size=3, padding=1)
        self.conv4 = nn.Conv2d(c3, c4, kernel_size=3, padding=1)
        flat = c4 * (height // 2 // 2) * (width // 2 // 2)
        h1, h2, h3 = hidden
        # Not named fc*: parameter names starting with "fc" are the classifier's.
        self.dense1 = nn.Linear(flat, h1)
        self.dense2 = nn.Linear(h1, h2)
        self.dense3 = nn.Linear(h2, h3)
        self._classifier(h3, num_classes, projection_dim)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.max_pool2d(F.relu(self.conv4(F.relu(self.conv3(x)))), 2)
        x = F.relu(self.dense1(x.flatten(-3)))
        x = F.relu(self.dense2(x))
        return self.proj(F.relu(self.dense3(x)))

    def stacked_features(self, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The K clients as K channel groups (``models.base.FedModel.stacked``): each
        convolution one call grouped by client, pooling per channel, each dense layer one
        batched product."""
        k, h = x.shape[0], channel_groups(x)
        for pair in (("conv1", "conv2"), ("conv3", "conv4")):
            for conv in pair:
                h = F.relu(grouped_conv(h, p, conv, getattr(self, conv), k))
            h = F.max_pool2d(h, 2)
        h = clients_first(h, k)
        for dense in ("dense1", "dense2", "dense3"):
            h = F.relu(batched_linear(h, p, dense))
        return h


@register_model(
    "fedadc_cnn",
    "FedADC's CIFAR CNN: four 3x3 convs (32,32,64,64), 2 max-pools, fc 512-256-128 + classifier; (C,H,W), H,W >= 4",
    FedADCCNNParams,
    _check,
)
def build_fedadc_cnn(options: FedADCCNNParams, input_shape: tuple[int, ...], num_classes: int) -> FedADCCNN:
    return FedADCCNN(tuple(input_shape), num_classes, tuple(options.channels), tuple(options.hidden),
                     options.projection_dim)
