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


def kl_to_target(target: torch.Tensor, logits: torch.Tensor, w: torch.Tensor, T: float = 1.0) -> torch.Tensor:
    """``sum_i w_i KL(target_i || softmax(logits_i / T))``; ``target`` rows are probabilities.

    The target is a constant (detach it first if it was computed from trainable tensors);
    0 log 0 counts as 0, so one-hot and masked targets are fine.
    """
    log_q = F.log_softmax(logits / T, dim=-1)
    per_sample = (torch.xlogy(target, target) - target * log_q).sum(-1)
    return (per_sample * w).sum()


def logit_mse(student: torch.Tensor, teacher: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``sum_i w_i mean_c (student_ic - teacher_ic)^2``: the MSE form of logit distillation."""
    return ((student - teacher).pow(2).mean(-1) * w).sum()
