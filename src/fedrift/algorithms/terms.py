"""Loss terms shared by algorithms; each is a pure tensor function (vmap-safe)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedrift.functional.tree import leaves

Params = dict[str, torch.Tensor]

# rows per no-grad forward pass: the convolutional models are fastest at 64-128 on the CPU
# (BENCHMARKS.md); also ``eval.batch_size``'s default for them (engine/local.py)
CHUNK = 128


def weighted_ce(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Cross-entropy as ``sum_i w_i CE_i``: the batch mean when w = 1/len, padding weighs 0.

    Written as log-softmax and a gather rather than ``F.cross_entropy``: the same values, and
    under ``vmap`` the gather is one batched op where ``nll_loss``'s batching rule takes
    about two dozen (measured on S1: a sixth of the vectorised step's kernels)."""
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) * w).sum()


def ce_loss(params, batch, payload, ctx, apply):
    """The plain supervised local loss (FedAvg's, and the base of every other): a
    ``local_loss`` hook, returning ``(loss, aux)`` with no aux."""
    return weighted_ce(apply(params, batch["x"]), batch["y"], batch["w"]), {}


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


def class_means(values: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(means, counts)``: row ``c`` of ``means`` is the mean of the rows of ``values`` whose
    label is ``c`` (zero where there are none); ``counts[c]`` how many there are."""
    onehot = F.one_hot(y, num_classes).to(values.dtype)  # (n, C)
    counts = onehot.sum(0)
    return (onehot.T @ values) / counts.clamp(min=1).unsqueeze(-1), counts


def combine_class_means(means: torch.Tensor, counts: torch.Tensor, old: torch.Tensor, old_has: torch.Tensor):
    """Per class, the count-weighted mean of the clients' rows ``means`` (K, C, D) with
    ``counts`` (K, C); a class no client holds keeps its ``old`` row. Returns (table, has)."""
    c = counts.to(means.dtype)
    total = c.sum(0)
    held = total > 0
    new = (means * c.unsqueeze(-1)).sum(0) / total.clamp(min=1).unsqueeze(-1)
    return torch.where(held.unsqueeze(-1), new, old), old_has | held


def rows_for_labels(table: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``table[y]`` as a one-hot product (vmap-safe for labels batched per client)."""
    onehot = (y.unsqueeze(-1) == torch.arange(table.shape[0], device=y.device)).to(table.dtype)
    return onehot @ table


def model_class_means(apply, params: Params, x: torch.Tensor, y: torch.Tensor, num_classes: int, mode: str):
    """``class_means`` of the model's outputs (``mode``: logits or features) on a client's
    data, in chunks of ``CHUNK`` samples (no gradient: called after training)."""
    outs = torch.cat([apply(params, x[i : i + CHUNK], mode=mode) for i in range(0, len(y), CHUNK)])
    return class_means(outs, y, num_classes)
