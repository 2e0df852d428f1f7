"""Evaluation of a model on held-out tensors, in large batches, without gradients."""

from __future__ import annotations

from itertools import repeat
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F

from fedrift import stopping
from fedrift.metrics.client_spread import ClientScores, client_counts, client_spread

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


def _rates(right: dict[str, torch.Tensor], prefix: str) -> dict[str, float]:
    return {prefix + (f"_{name}" if name else ""): r.double().mean().item() if len(r) else 0.0
            for name, r in right.items()}


class LocalParts:
    """Clients' own parts of an evaluated set, flattened once: the positions of all parts in
    one tensor, the part (client) each belongs to, and the parts' sizes. Per-client counts
    are then two tensor ops whatever the number of clients, instead of one op per client."""

    def __init__(self, parts: list[torch.Tensor]) -> None:
        device = parts[0].device if parts else None
        self.sizes = torch.tensor([len(p) for p in parts], dtype=torch.long, device=device)
        self.positions = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
        self.owner = torch.repeat_interleave(torch.arange(len(parts), device=device), self.sizes)
        self.n_test = self.sizes.cpu()

    def scores(self, right: torch.Tensor) -> ClientScores:
        """Each part's size and how many of its samples ``right`` says are right."""
        hits = torch.zeros(len(self.sizes), dtype=torch.long, device=right.device)
        hits.index_add_(0, self.owner, right[self.positions].long())
        return ClientScores(self.n_test, hits.cpu())


def _local_name(prefix: str) -> str:
    return "local_accuracy" if prefix == "test" else f"{prefix}_local_accuracy"


def _local_metrics(own: dict[str, ClientScores], prefix: str) -> dict[str, float]:
    """The local means (and, except on the validation split, their spread over the clients:
    ``fedrift.metrics.client_spread``) of each predictor, and on the test split how many
    clients they are over and how many were left out."""
    base, row = _local_name(prefix), {}
    for name, s in own.items():
        row.update(client_spread(s, base + (f"_{name}" if name else ""), spread=prefix != "val"))
    first = own.get("")
    if prefix == "test" and first is not None and base in row:
        row.update(client_counts(first))
    return row


def evaluate(
    apply: Callable[..., Any], params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
    batch_size: int, predict: Predict | None = None, prefix: str = "test", local: LocalParts | None = None,
    scores: dict[str, ClientScores] | None = None,
) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``params`` on (x, y) as ``<prefix>_accuracy`` and
    ``<prefix>_loss`` (``val`` on the validation split); ``<prefix>_accuracy_<name>`` for
    each extra predictor. With ``local`` (the clients' own parts of (x, y)), also the mean
    over clients of the model's accuracy on each one's part, named as
    :func:`evaluate_personal` names it (``local_accuracy`` on the test set), with its spread
    over the clients: the number a global model sets beside a personal model's, from the
    same predictions. ``scores``: filled with each predictor's per-client counts (``""``:
    the logits'), from which those numbers are made."""
    right, loss = outcomes(apply, params, x, y, batch_size, predict)
    row = {**_rates(right, f"{prefix}_accuracy"), f"{prefix}_loss": loss.mean().item() if len(loss) else 0.0}
    if local is not None:
        own = {name: local.scores(r) for name, r in right.items()}
        row.update(_local_metrics(own, prefix))
        if scores is not None:
            scores.update(own)
    return row


def evaluate_personal(
    apply: Callable[..., Any], models: Iterable[dict[str, torch.Tensor]], local: list[torch.Tensor] | None,
    x: torch.Tensor, y: torch.Tensor, batch_size: int, predict: Predict | None = None, prefix: str = "test",
    scores: dict[str, ClientScores] | None = None, whole: bool = True,
) -> dict[str, float]:
    """Personal models (FedProto): the mean over clients of each client's own model's
    accuracy on the whole of (x, y) (``test_accuracy``; ``prefix`` as in :func:`evaluate`;
    ``whole=False``: not taken, each model runs on its own part alone, a pass over (x, y) in
    all instead of one a client) and on its own part of it (``local[k]`` indexes (x, y); none when ``local`` is None):
    ``local_accuracy`` on the test set (its local split, with its spread over the clients),
    ``<prefix>_local_accuracy`` otherwise (``val_local_accuracy``: its own validation samples,
    what tunes such a method), and of each extra predictor. A client whose own part is empty
    is left out of the local means (it has no accuracy there, not a zero one). ``scores``:
    as in :func:`evaluate`."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    hits: dict[str, list[torch.Tensor]] = {}
    sizes: list[int] = []
    whole = whole or local is None
    for params, ix in zip(models, local if local is not None else repeat(None)):  # models may be a generator
        if whole:
            right, loss = outcomes(apply, params, x, y, batch_size, predict)
            row = {**_rates(right, f"{prefix}_accuracy"), f"{prefix}_loss": loss.mean().item()}
            for k, v in row.items():
                sums[k] = sums.get(k, 0.0) + v
                counts[k] = counts.get(k, 0) + 1
        if ix is None:
            continue
        # its own samples' outcomes: their rows of the whole set's, or (not whole) taken on them alone
        mine = {name: r[ix] for name, r in right.items()} if whole else outcomes(
            apply, params, x[ix], y[ix], batch_size, predict)[0]
        sizes.append(len(ix))
        for name, r in mine.items():
            hits.setdefault(name, []).append(r.sum())
    out = {k: v / counts[k] for k, v in sums.items()}
    if local is not None and sizes:
        n_test = torch.tensor(sizes, dtype=torch.long)
        own = {name: ClientScores(n_test, torch.stack(h).long().cpu()) for name, h in hits.items()}
        out.update(_local_metrics(own, prefix))
        if scores is not None:
            scores.update(own)
    return out
