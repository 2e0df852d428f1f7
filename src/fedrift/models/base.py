"""What every fedrift model is: a plain nn.Module split into features and head.

KD, prototypes, MOON and FedGen reach the representation through ``features``; algorithms
call the model functionally (``torch.func.functional_call``) with the ``mode`` argument:

- ``mode="logits"`` (default): ``head(features(x))``;
- ``mode="features"``: the representation ``h``;
- ``mode="both"``: ``(h, logits)``;
- ``mode="head"``: the input already is a representation; returns ``head(x)``.

``head_prefixes`` names the parameter-name prefixes of the final classifier layer, for
personalisation that fine-tunes only the classifier. Models hold no FL state and use no
BatchNorm (its in-place running stats break ``torch.func.vmap``): GroupNorm instead.
"""

from __future__ import annotations

import torch
from torch import nn


class FedModel(nn.Module):
    head_prefixes: tuple[str, ...] = ("fc",)
    feature_dim: int

    def features(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def head(self, h: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x: torch.Tensor, mode: str = "logits"):
        if mode == "logits":
            return self.head(self.features(x))
        if mode == "features":
            return self.features(x)
        if mode == "both":
            h = self.features(x)
            return h, self.head(h)
        if mode == "head":
            return self.head(x)
        raise ValueError(f"unknown mode {mode!r}")
