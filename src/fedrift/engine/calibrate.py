"""Calibration at evaluation (``Algorithm.calibration``, CCVR): the clients' statistics of the
global model's features, folded by the server into a calibrated model that is evaluated
beside the global one.

It runs in the server's process for every executor, as the pre-phase's summaries do: each
panel client's features come from the global model alone, one client at a time (a round
holds one client's statistics), so every executor computes the same numbers from the same
global model. A Flower deployment refuses it (``deploy/project.py``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from fedrift.algorithms.base import Algorithm
from fedrift.engine.federation import Federation
from fedrift.functional.tree import tree_bytes
from fedrift.metrics.client_spread import ClientScores
from fedrift.metrics.evaluate import LocalParts, evaluate

Params = dict[str, torch.Tensor]


@torch.no_grad()
def features(apply: Callable[..., Any], params: Params, x: torch.Tensor, chunk: int) -> torch.Tensor:
    """``apply(params, x, mode="features")`` in chunks of ``chunk`` rows."""
    return torch.cat([apply(params, x[i : i + chunk], mode="features") for i in range(0, len(x), chunk)])


def calibrated_model(algorithm: Algorithm, params: Params, fed: Federation, clients: list[int],
                     apply: Callable[..., Any], head: set[str], round_: int, chunk: int,
                     step_apply: Callable[..., Any] | None = None) -> tuple[Params, int]:
    """The calibrated model from ``clients``' statistics of ``params``, and the bytes they upload.
    ``step_apply`` (None: ``apply``) runs the calibration's many small steps: an ``apply`` that
    does not copy the convolution kernels into channels-last on every call, as the run's
    ``apply`` does on a CPU (``RoundTools.vmap_apply``)."""
    cal = algorithm.calibration
    assert cal is not None
    acc, up = None, 0
    for k in clients:
        ix = fed.indices(k)
        if not len(ix):
            continue
        y = fed.y[ix]
        with torch.no_grad():
            stats = cal.stats(features(apply, params, fed.x[ix], chunk), y)
        up += tree_bytes(stats)
        acc = cal.merge(acc, stats)
    if acc is None:  # no panel client holds a sample: nothing to calibrate on
        return params, up
    return cal.calibrate(params, acc, round_, step_apply or apply, head), up


def calibration_metrics(algorithm: Algorithm, params: Params, fed: Federation, clients: list[int],
                        apply: Callable[..., Any], head: set[str], round_: int, chunk: int,
                        evaluated: list[tuple[str, torch.Tensor, torch.Tensor]],
                        local: LocalParts | None, step_apply: Callable[..., Any] | None = None,
                        scores: dict[str, ClientScores] | None = None,
                        ) -> tuple[dict[str, float], Params]:
    """The calibrated model's metrics, named as the global model's with ``calibrated_`` in
    front (``calibrated_accuracy``, ``calibrated_loss``, ``calibrated_local_accuracy`` and its
    spread over the clients, ``calibrated_val_accuracy``), the bytes its statistics took up
    and down, and the model. ``scores``: filled with the per-client counts on the local test
    splits (``fedrift.metrics.evaluate.evaluate``)."""
    calibrated, up = calibrated_model(algorithm, params, fed, clients, apply, head, round_, chunk, step_apply)
    row: dict[str, float] = {}
    for prefix, x, y in evaluated:
        name = "calibrated" if prefix == "test" else f"calibrated_{prefix}"
        test = prefix == "test"
        row.update(evaluate(apply, calibrated, x, y, chunk, None, name, local if test else None,
                            scores if test else None))
    row["calibration_bytes_up"] = up
    row["calibration_bytes_down"] = len(clients) * tree_bytes(params)  # the global model, to each panel client
    return row, calibrated
