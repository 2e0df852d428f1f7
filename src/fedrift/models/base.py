"""What every fedrift model is: a plain nn.Module split into features and head.

KD, prototypes, MOON and FedGen reach the representation through ``features``; algorithms
call the model functionally (``torch.func.functional_call``) with the ``mode`` argument:

- ``mode="logits"`` (default): ``head(features(x))``;
- ``mode="features"``: the representation ``h``;
- ``mode="both"``: ``(h, logits)``;
- ``mode="head"``: the input already is a representation; returns ``head(x)``.

``head_prefixes`` names the parameter-name prefixes of the final classifier layer, for
personalisation that fine-tunes only the classifier.

Projection head (MOON, FedGKD+): models built with the option ``projection_dim`` put a
2-layer MLP ``proj`` (``Linear(feat, feat) -> ReLU -> Linear(feat, projection_dim)``, as in
SimCLR and MOON) between the backbone and the classifier. Then ``features(x)`` is the
projection output, ``feature_dim == projection_dim``, the classifier ``fc`` maps
``projection_dim`` to the classes, and the projection's parameters are named ``proj.*``
(``PROJECTION_PREFIX``), which is how an algorithm that only sees parameters can tell.

Models hold no FL state. They normalise with GroupNorm by default; torch's BatchNorm (its
in-place running statistics break ``torch.func.vmap``) is never used. The BatchNorm option of
the ResNets (``model.norm: batch``) is ``models/norm.py``'s, whose running statistics are
model state the engine carries beside the parameters (that module's docstring says how).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


PROJECTION_PREFIX = "proj"


def projection_head(width: int, projection_dim: int) -> nn.Sequential:
    """MOON's projection head: ``Linear(width, width) -> ReLU -> Linear(width, projection_dim)``."""
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, projection_dim))


def has_projection(params: dict[str, torch.Tensor]) -> bool:
    """Whether a model's named parameters include a projection head (``proj.*``)."""
    return any(k.split(".")[0] == PROJECTION_PREFIX for k in params)


def channel_groups(x: torch.Tensor) -> torch.Tensor:
    """K clients' images ``(K, N, C, H, W)`` as one batch of K channel groups ``(N, K*C, H, W)``:
    the layout of the convolutional stacked forms (``FedModel.stacked_features``)."""
    k, n = x.shape[:2]
    return x.transpose(0, 1).reshape(n, k * x.shape[2], *x.shape[3:])


def clients_first(h: torch.Tensor, k: int) -> torch.Tensor:
    """Channel groups ``(N, K*C, ...)`` back to each client's rows, flattened: ``(K, N, C*...)``."""
    return h.reshape(h.shape[0], k, -1).transpose(0, 1)


def grouped_conv(h: torch.Tensor, p: dict[str, torch.Tensor], name: str, module: nn.Conv2d, k: int) -> torch.Tensor:
    """``module``'s convolution for K clients' channel groups at once, each with its own kernel
    (``p[name + ".weight"]``, clients first) and bias: one call grouped by client."""
    w, b = p[f"{name}.weight"], p.get(f"{name}.bias")
    return F.conv2d(h, w.reshape(-1, *w.shape[2:]), None if b is None else b.reshape(-1), stride=module.stride,
                    padding=module.padding, groups=k)


def batched_linear(h: torch.Tensor, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """A linear layer for K clients' rows ``(K, N, in)`` at once, each with its own weight and
    bias: one batched product (``baddbmm``, as ``F.linear``'s ``addmm``: the bias in the
    product's dtype under autocast too, where ``vmap`` of ``F.linear`` returns float32)."""
    return torch.baddbmm(p[f"{name}.bias"].unsqueeze(1), h, p[f"{name}.weight"].transpose(1, 2))


class FedModel(nn.Module):
    head_prefixes: tuple[str, ...] = ("fc",)
    feature_dim: int
    projection_dim: int | None = None
    takes_tokens: bool = False  # True: input is int token ids from a text dataset (models/text.py)
    # whether the vectorised executors step through stacked_features (engine/stacked_step.py),
    # set where it was measured faster than vmap (the ResNets); a model may have the form without
    # (benchmarks/step_kernels.py --model, this CPU: the FedAvg CNN's step 0.86-0.92x vmap's
    # speed at 4-16 clients, the MLP's 0.83-0.85x, logreg's 0.67x, FedADC's CNN's 0.87-1.08x at
    # 1-16; BENCHMARKS.md G); under bf16
    # every model with the form steps through it (the sequential step's arithmetic, vmap's not)
    stacked_step: bool = False

    def features(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc(h)

    def stacked_features(self, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor | None:
        """K clients' features at once: ``p`` the model's parameters, each with the clients on
        its first axis, ``x`` their inputs ``(K, N, ...)``; ``(K, N, feature_dim)``. None: the
        model has no such form (``vmap`` then batches each of its operations)."""
        return None

    def has_stacked_form(self) -> bool:
        """Whether :meth:`stacked` can serve this model: it defines :meth:`stacked_features`
        and has the plain tail (no projection head, ``fc`` as its head)."""
        return (self.projection_dim is None and type(self).head is FedModel.head
                and type(self).stacked_features is not FedModel.stacked_features)

    def stacked(self, p: dict[str, torch.Tensor], x: torch.Tensor, mode: str = "logits") -> Any:
        """:meth:`forward`'s ``mode`` for K clients at once (see :meth:`stacked_features`),
        the clients first in every output; None where the model has no stacked form (a
        projection head, another head). Why: under ``vmap`` a convolution of K clients'
        kernels runs as one grouped call between reorderings of the activations, layer after
        layer; a model that keeps the clients in its layout (``resnet8``: as channel groups)
        runs the same arithmetic without them (``engine.stacked_step``)."""
        if not self.has_stacked_form():
            return None
        h = x if mode == "head" else self.stacked_features(p, x)
        if h is None or mode == "features":
            return h
        logits = batched_linear(h, p, "fc")
        return (h, logits) if mode == "both" else logits

    def _classifier(self, width: int, num_classes: int, projection_dim: int | None) -> None:
        """The tail every model shares: the optional projection head ``proj``, then ``fc``."""
        self.proj = nn.Identity() if projection_dim is None else projection_head(width, projection_dim)
        self.projection_dim = projection_dim
        self.feature_dim = width if projection_dim is None else projection_dim
        self.fc = nn.Linear(self.feature_dim, num_classes)

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
