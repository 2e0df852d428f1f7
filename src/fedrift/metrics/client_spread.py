"""How a local accuracy spreads over the clients: each client's accuracy on its own test split,
their mean (``local_accuracy``) and, beside it, what the mean hides.

Over the clients with test samples (a client without any has no accuracy there, not a zero
one; it is left out and counted), with ``a_k = correct_k / n_k``:

- ``_std``: the standard deviation of the a_k (population, ddof=0: these clients are the set
  being described);
- ``_worst``: the smallest a_k; ``_worst10`` / ``_best10``: the mean of the ``ceil(n/10)``
  smallest / largest (the worst and best 10%, at least one client);
- ``_jain``: Jain's fairness index ``(sum a_k)^2 / (n sum a_k^2)``, 1 when every client has
  the same accuracy, 1/n when one client has it all (1 when every a_k is 0: all equal).
  docs/concepts/fairness.md says why this index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SPREAD = ("std", "worst", "worst10", "best10", "jain")  # the suffixes beside a local accuracy's name


@dataclass(frozen=True)
class ClientScores:
    """Per evaluated client (the panel, in order), for one predictor: its local test samples
    and how many of them it got right (int64, on the CPU)."""

    n_test: torch.Tensor
    correct: torch.Tensor


def accuracies(scores: ClientScores) -> torch.Tensor:
    """The accuracies (float64) of the clients that have test samples, in panel order."""
    keep = scores.n_test > 0
    return scores.correct[keep].double() / scores.n_test[keep]


def client_spread(scores: ClientScores, name: str, spread: bool = True) -> dict[str, float]:
    """``name`` (the mean of the clients' accuracies) and, with ``spread``, ``name_std``,
    ``name_worst``, ``name_worst10``, ``name_best10`` and ``name_jain`` (module docstring);
    {} when no client has a test sample."""
    acc = accuracies(scores)
    n = len(acc)
    if not n:
        return {}
    row = {name: acc.mean().item()}
    if spread:
        tail = -(-n // 10)  # ceil(n / 10): at least 10% of the clients, at least one
        ordered = torch.sort(acc).values
        squares = float((acc * acc).sum())
        row.update({
            f"{name}_std": acc.std(correction=0).item(),
            f"{name}_worst": ordered[0].item(),
            f"{name}_worst10": ordered[:tail].mean().item(),
            f"{name}_best10": ordered[-tail:].mean().item(),
            f"{name}_jain": float(acc.sum()) ** 2 / (n * squares) if squares > 0 else 1.0,
        })
    return row


def client_counts(scores: ClientScores) -> dict[str, int]:
    """``local_clients`` (evaluated clients with test samples, those the local means are
    over) and ``local_clients_without_test`` (evaluated clients left out for having none)."""
    with_test = int((scores.n_test > 0).sum())
    return {"local_clients": with_test, "local_clients_without_test": len(scores.n_test) - with_test}
