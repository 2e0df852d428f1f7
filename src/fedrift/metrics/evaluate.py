"""Evaluation of a model on held-out tensors, in large batches, without gradients."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F


@torch.no_grad()
def evaluate(
    apply: Callable[..., Any], params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``params`` on (x, y)."""
    correct = torch.zeros((), dtype=torch.int64, device=y.device)
    loss = torch.zeros((), dtype=torch.float64, device=y.device)
    for i in range(0, len(y), batch_size):
        logits = apply(params, x[i : i + batch_size])
        target = y[i : i + batch_size]
        correct += (logits.argmax(1) == target).sum()
        loss += F.cross_entropy(logits.double(), target, reduction="sum")
    n = max(len(y), 1)
    return {"test_accuracy": correct.item() / n, "test_loss": loss.item() / n}
