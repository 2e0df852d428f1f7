"""``mlp`` (fully connected ReLU network) and ``logreg`` (multinomial logistic regression).

Both flatten the input, so they take any input shape. ``mlp``'s representation is its last
hidden activation; ``logreg``'s is the flattened input itself, its only layer being the
classifier ``fc``. ``mlp``'s option ``projection_dim`` adds a projection head before ``fc``
(see ``models/base.py``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from fedrift.models import register_model
from fedrift.models.base import FedModel, batched_linear
from fedrift.params import params


@params
class MLPParams:
    """``hidden``: the widths of the hidden layers, input side first (empty: logreg).

    ``projection_dim``: when set, a projection head ``proj`` (``Linear(feat, feat) -> ReLU ->
    Linear(feat, projection_dim)``, MOON's) sits between the representation and ``fc``;
    ``features`` then returns its output (MOON, FedGKD+; 256 in their papers). None: no head.
    """

    hidden: list[Annotated[int, Field(ge=1)]] = dataclasses.field(default_factory=lambda: [200, 200])
    projection_dim: Annotated[int, Field(ge=1)] | None = None


class _Flat(FedModel):
    """Flattens the trailing ``len(input_shape)`` dimensions; any leading ones are batch."""

    def _setup(self, input_shape: tuple[int, ...], num_classes: int) -> int:
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        return math.prod(self.input_shape)

    def _flatten(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(-len(self.input_shape)) if self.input_shape else x.unsqueeze(-1)


class MLP(_Flat):
    head_prefixes = ("fc",)

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, hidden: list[int], projection_dim: int | None = None
    ) -> None:
        super().__init__()
        width = self._setup(input_shape, num_classes)
        layers = []
        for h in hidden:
            layers.append(nn.Linear(width, h))
            width = h
        # Not named fc*: parameter names starting with "fc" are the classifier's.
        self.layers = nn.ModuleList(layers)
        self._classifier(width, num_classes, projection_dim)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = self._flatten(x)
        for layer in self.layers:
            h = F.relu(layer(h))
        return self.proj(h)

    def stacked_features(self, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        h = self._flatten(x)
        for i in range(len(self.layers)):
            h = F.relu(batched_linear(h, p, f"layers.{i}"))
        return h


class LogReg(_Flat):
    head_prefixes = ("fc",)

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        width = self._setup(input_shape, num_classes)
        self._classifier(width, num_classes, None)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self._flatten(x)

    def stacked_features(self, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return self._flatten(x)


@register_model("mlp", "fully connected ReLU network (hidden widths option); any input shape", MLPParams)
def build_mlp(options: MLPParams, input_shape: tuple[int, ...], num_classes: int) -> MLP:
    return MLP(tuple(input_shape), num_classes, list(options.hidden), options.projection_dim)


@register_model("logreg", "multinomial logistic regression on the flattened input; any input shape")
def build_logreg(options: None, input_shape: tuple[int, ...], num_classes: int) -> LogReg:
    return LogReg(tuple(input_shape), num_classes)
