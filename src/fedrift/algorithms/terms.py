"""Loss terms shared by algorithms; each is a pure tensor function (vmap-safe)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedrift.engine.tree import leaves

Params = dict[str, torch.Tensor]


def weighted_ce(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Cross-entropy as ``sum_i w_i CE_i``: the batch mean when w = 1/len, padding weighs 0."""
    return (F.cross_entropy(logits, y, reduction="none") * w).sum()


def squared_distance(params: Params, anchor: Params) -> torch.Tensor:
    """``||w - anchor||^2`` over every parameter tensor."""
    return torch.stack([(p - a).pow(2).sum() for p, a in zip(leaves(params), leaves(anchor))]).sum()
