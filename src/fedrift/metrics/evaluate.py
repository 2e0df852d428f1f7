"""Evaluation of a model on held-out tensors, in large batches, without gradients."""

from __future__ import annotations

from itertools import repeat
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F

from fedrift import stopping

# extra predictors: (params, x) -> {name: predicted classes}, e.g. FedProto's nearest prototype
Predict = Callable[[dict[str, torch.Tensor], torch.Tensor], dict[str, torch.Tensor]]


@torch.no_grad()
def outcomes(
    apply: Callable[..., Any], params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
    batch_size: int, predict: Predict | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Per sample: whether each predictor is right (``""``: the logits' argmax, else
    ``predict``'s names) and the cross-entropy of the logits (float64).

    The per-sample results are written into tensors made once, not kept as one small tensor
    per batch: small blocks kept between the batches' large, freed activations split the
    allocator's free space, and the heap then grows by most of a batch's activations each
    batch (measured: +570 MB over the 461 batches of S4's test set)."""
    n = len(y)
    right: dict[str, torch.Tensor] = {"": torch.empty(n, dtype=torch.bool, device=y.device)}
    losses = torch.empty(n, dtype=torch.float64, device=y.device)
    for i in range(0, n, batch_size):
        stopping.check()  # a stacked run's Ctrl-C lands here too, not after the whole set
        xb, target = x[i : i + batch_size], y[i : i + batch_size]
        logits = apply(params, xb)
        torch.eq(logits.argmax(1), target, out=right[""][i : i + len(target)])
        losses[i : i + len(target)] = F.cross_entropy(logits.double(), target, reduction="none")
        for name, pred in (predict(params, xb) if predict else {}).items():
            if name not in right:
                right[name] = torch.empty(n, dtype=torch.bool, device=y.device)
            torch.eq(pred, target, out=right[name][i : i + len(target)])
    return right, losses


def _rates(right: dict[str, torch.Tensor], prefix: str, select: torch.Tensor | None = None) -> dict[str, float]:
    out = {}
    for name, r in right.items():
        r = r if select is None else r[select]
        out[prefix + (f"_{name}" if name else "")] = r.double().mean().item() if len(r) else 0.0
    return out


class LocalParts:
    """Clients' own parts of an evaluated set, flattened once: the positions of all parts in
    one tensor, the part (client) each belongs to, and the parts' sizes. Per-client accuracies
    are then two tensor ops whatever the number of clients, instead of one op per client."""

    def __init__(self, parts: list[torch.Tensor]) -> None:
        device = parts[0].device if parts else None
        self.sizes = torch.tensor([len(p) for p in parts], dtype=torch.long, device=device)
        self.positions = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
        self.owner = torch.repeat_interleave(torch.arange(len(parts), device=device), self.sizes)

    def mean_rate(self, right: torch.Tensor) -> float | None:
        """The mean over the parts that have samples of the share of ``right`` in each; None
        when none has (a client with no own sample has no accuracy there, not a zero one)."""
        keep = self.sizes > 0
        if not bool(keep.any()):
            return None
        hits = torch.zeros(len(self.sizes), dtype=torch.float64, device=right.device)
        hits.index_add_(0, self.owner, right[self.positions].double())
        return (hits[keep] / self.sizes[keep]).mean().item()


def evaluate(
    apply: Callable[..., Any], params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
    batch_size: int, predict: Predict | None = None, prefix: str = "test", local: LocalParts | None = None,
) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``params`` on (x, y) as ``<prefix>_accuracy`` and
    ``<prefix>_loss`` (``val`` on the validation split); ``<prefix>_accuracy_<name>`` for
    each extra predictor. With ``local`` (the clients' own parts of (x, y)), also the mean
    over clients of the model's accuracy on each one's part, named as
    :func:`evaluate_personal` names it (``local_accuracy`` on the test set): the number a
    global model sets beside a personal model's, from the same predictions."""
    right, loss = outcomes(apply, params, x, y, batch_size, predict)
    row = {**_rates(right, f"{prefix}_accuracy"), f"{prefix}_loss": loss.mean().item() if len(loss) else 0.0}
    if local is not None:
        base = "local_accuracy" if prefix == "test" else f"{prefix}_local_accuracy"
        for name, r in right.items():
            rate = local.mean_rate(r)
            if rate is not None:
                row[base + (f"_{name}" if name else "")] = rate
    return row


def evaluate_personal(
    apply: Callable[..., Any], models: Iterable[dict[str, torch.Tensor]], local: list[torch.Tensor] | None,
    x: torch.Tensor, y: torch.Tensor, batch_size: int, predict: Predict | None = None, prefix: str = "test",
) -> dict[str, float]:
    """Personal models (FedProto): the mean over clients of each client's own model's
    accuracy on the whole of (x, y) (``test_accuracy``; ``prefix`` as in :func:`evaluate`)
    and on its own part of it (``local[k]`` indexes (x, y); none when ``local`` is None):
    ``local_accuracy`` on the test set (its local split), ``<prefix>_local_accuracy``
    otherwise (``val_local_accuracy``: its own validation samples, what tunes such a method),
    and of each extra predictor. A client whose own part is empty is left out of the local
    means (it has no accuracy there, not a zero one)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    local_name = "local_accuracy" if prefix == "test" else f"{prefix}_local_accuracy"
    for params, ix in zip(models, local if local is not None else repeat(None)):  # models may be a generator
        right, loss = outcomes(apply, params, x, y, batch_size, predict)
        local_rates = _rates(right, local_name, ix) if ix is not None and len(ix) else {}
        row = {**_rates(right, f"{prefix}_accuracy"), **local_rates, f"{prefix}_loss": loss.mean().item()}
        for k, v in row.items():
            sums[k] = sums.get(k, 0.0) + v
            counts[k] = counts.get(k, 0) + 1
    return {k: v / counts[k] for k, v in sums.items()}
