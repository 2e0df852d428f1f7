"""FedExP (Jhunjhunwala, Wang and Joshi, "FedExP: Speeding up Federated Averaging via
Extrapolation", ICLR 2023, Algorithm 1, experiments in Section 6; code github.com/Divyansh03/FedExP).

Clients run FedAvg's local training from ``w_t``. The server treats the averaged model change
as a pseudo-gradient and picks its step size from the round's updates, extrapolating past the
average when the clients' updates disagree (the POCS extrapolation the paper derives it from)::

    Delta_k = w_t - w_k,    Delta = sum_k p_k Delta_k
    eta_g   = max(1, sum_k p_k ||Delta_k||^2 / (2 (||Delta||^2 + epsilon)))
    w_{t+1} = w_t - eta_g Delta

The paper writes ``(1/M) sum_k ||Delta_k||^2 / (2 (||Delta||^2 + epsilon))`` over the round's
``M`` clients; fedrift weighs by ``p_k = n_k / sum_j n_j`` like every method, as the authors'
code does (main.py: ``p[i]`` by sample counts, renormalised over the round), and
``aggregation: uniform`` gives the paper's ``1/M``. ``epsilon`` is the paper's: the authors'
code adds ``M epsilon`` to ``||Delta||^2`` instead, so its ``epsilon = 1e-3`` with ``M``
clients a round is ``epsilon = M * 1e-3`` here; it also shrinks ``epsilon`` by the square of
its per-round lr decay, which fedrift does not (``epsilon`` is fixed under ``train.lr_schedule``).

Streamed: each client uploads its ``||Delta_k||^2`` (one number, a scalar beside the model:
``sq_norm``), and the server reads the uploads only through the two p-weighted sums
``sum_k p_k w_k`` and ``sum_k p_k ||Delta_k||^2``, so a round holds one client's upload.
The norms are over the parameters; BatchNorm's running statistics (``model.norm: batch``) are
neither counted nor extrapolated: they take the clients' weighted average, as for every method.

The reported model: FedExP's iterates oscillate, and the paper's experiments report the average
of the last two, ``(w_{t+1} + w_t) / 2`` (after round 1, ``w_1`` itself, as the authors' code).
That average is what fedrift evaluates, checkpoints as ``params`` and writes as the final
model; the next round's clients start from the iterate ``w_{t+1}`` (the server state's
``iterate``, what ``broadcast`` sends), not from the average: the averaging never enters
training. ``average_last: false`` reports ``w_{t+1}`` instead.

FedAvg exactly: ``eta_g`` is ``max(1, .)``, so where the extrapolation is not triggered the step
is FedAvg's. By Jensen ``sum_k p_k ||Delta_k||^2 >= ||Delta||^2``, so the ratio is at least
about 1/2 and reaches 1 only when the updates disagree; with one client a round it is below 1
(``||Delta_1||^2 / (2 (||Delta_1||^2 + epsilon))``) and so is it under a huge ``epsilon``. The
model is computed as ``avg + (1 - eta_g)(w_t - avg)`` (``avg = sum_k p_k w_k``), the same value
rearranged, so ``eta_g = 1`` is FedAvg's average bit for bit; with ``average_last: false`` such
a run is FedAvg's.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.models.norm import STATS
from fedrift.params import params


@params
class FedExPParams(AlgorithmParams):
    """FedExP's options (ICLR 2023, Algorithm 1).

    epsilon: added to ``||Delta||^2`` in ``eta_g``'s denominator (the authors' code: 1e-3 on
        CIFAR-10/100 and CINIC-10, 0.1 on EMNIST, which it adds as ``M epsilon``: M times those here):
        larger, less extrapolation; 0 would divide by zero when the clients do not move.
    average_last: report (evaluate, save) the mean of the last two iterates, Section 6.
    """

    epsilon: Annotated[float, Field(gt=0)] = 1e-3
    average_last: bool = True


def is_stat(key: str) -> bool:
    """Whether a model-state key is a BatchNorm running statistic (models/norm.py)."""
    return key.rsplit(".", 1)[-1] in STATS


def squared_change(new: dict, old: dict) -> torch.Tensor:
    """``||new - old||^2`` over the parameters (running statistics left out), one 0-d tensor.
    The clients' ``||Delta_k||^2`` and the server's ``||Delta||^2`` are both this function."""
    return torch.stack([(new[k] - old[k]).pow(2).sum() for k in new if not is_stat(k)]).sum()


def extrapolation(sq_norm_mean: torch.Tensor, sq_norm_of_mean: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``eta_g = max(1, sum_k p_k ||Delta_k||^2 / (2 (||Delta||^2 + epsilon)))``, a 0-d tensor."""
    return torch.clamp(sq_norm_mean / (2.0 * (sq_norm_of_mean + epsilon)), min=1.0)


def fedexp_step(state: Tree, avg: dict, sq_norm_mean: torch.Tensor, round_: int, epsilon: float,
                average_last: bool) -> Tree:
    """One server step from ``avg = sum_k p_k w_k`` and ``sum_k p_k ||Delta_k||^2``: the new
    ``iterate`` ``w_{t+1} = avg + (1 - eta_g)(w_t - avg)`` and the reported ``params``."""
    w_t = state["iterate"]
    eta = extrapolation(sq_norm_mean, squared_change(avg, w_t), epsilon)
    keep = 1.0 - eta  # exactly 0 when eta_g clamps at 1
    iterate = {k: a if is_stat(k) else a + keep.to(a.dtype) * (w_t[k] - a) for k, a in avg.items()}
    if average_last and round_ > 1:
        report = {k: w if is_stat(k) else 0.5 * (w + w_t[k]) for k, w in iterate.items()}
    else:
        report = iterate
    return {**state, "params": report, "iterate": iterate}


@ALGORITHMS.register(
    "fedexp", "FedExP: FedAvg's clients, server step max(1, extrapolation) from the updates' norms", FedExPParams,
    space={"epsilon": "log:1e-4:1"},
)
def fedexp(hp: FedExPParams, setup: Setup) -> Algorithm:
    def init_server(global_params: dict) -> Tree:
        return {"params": global_params, "iterate": global_params}

    def broadcast(state: Tree, info: RoundInfo) -> Tree:
        return {"params": state["iterate"]}

    def client_result(payload: Tree, end_params: dict, ctx: Tree) -> tuple[Tree, Tree]:
        return {"params": end_params, "sq_norm": {"delta": squared_change(end_params, payload["params"])}}, ctx.get("state", {})

    def aggregate_sums(state: Tree, sums: Tree, info: RoundInfo) -> Tree:
        return fedexp_step(state, sums["params"], sums["sq_norm"]["delta"], info.round, hp.epsilon, hp.average_last)

    return Algorithm(name="fedexp", hparams=hp, local_loss=ce_loss, init_server=init_server, broadcast=broadcast,
                     client_result=client_result, sums={"params": "weights", "sq_norm": "weights"},
                     aggregate_sums=aggregate_sums)
