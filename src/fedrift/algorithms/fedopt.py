"""FedOpt: FedAdagrad, FedAdam, FedYogi (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2).

Clients run FedAvg's local training from ``w_t`` (the train section's optimiser, as the paper's
local SGD). The server treats the averaged model change as a pseudo-gradient (sign: the
direction the clients moved, so the server *adds* the step) and runs an adaptive optimiser
on it, with a first moment ``m`` (zero-initialised) and a second moment ``v`` initialised to
``tau^2`` (Algorithm 2: ``v_{-1} >= tau^2``)::

    Delta_t = sum_k p_k (w_k - w_t)
    m_t     = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t     = v_{t-1} + Delta_t^2                                         (fedadagrad)
    v_t     = beta2 v_{t-1} + (1 - beta2) Delta_t^2                       (fedadam)
    v_t     = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)   (fedyogi)
    w_{t+1} = w_t + eta_s m_t / (sqrt(v_t) + tau)

As in the paper there is no bias correction (Flower's FedAdam, since 1.5, scales ``eta_s`` by
Adam's bias correction; Flower's FedAdagrad and FedYogi start ``v`` at 0, not ``tau^2``).
``p_k = n_k / sum_j n_j`` like every method (the paper's ``1/|S|`` is ``aggregation: uniform``).
The server reads the uploads only through FedAvg's weighted sum ``sum_k p_k w_k`` (streamed:
one client's upload in memory at a time) and ``Delta_t`` is that sum minus ``w_t``
(``sum_k p_k = 1``). ``m`` and ``v`` live in the server state, so checkpoints carry them.
BatchNorm's running statistics (``model.norm: batch``) are set to their weighted average by
the engine after this step, as for every method: the adaptive rule moves parameters only.

``eta_s`` defaults: 0.01 for Adam and Yogi, 0.1 for Adagrad. With ``beta1 = 0.9`` the first
round moves each coordinate by about ``eta_s`` under Adam/Yogi (``|m| = 0.1 |Delta|``,
``sqrt(v) ~ 0.1 |Delta|``) but by ``eta_s / 10`` under Adagrad (``sqrt(v) ~ |Delta|``), so
Adagrad needs the larger rate for the same first step; both lie in the paper's grid
``eta_s in {10^-3, ..., 10^1}``, which the tuning space spans.

FedOpt with server SGD is not registered here: SGD with momentum on this pseudo-gradient is
FedAvgM (``w_{t+1} = w_t + eta_s v``, ``v = beta v + Delta_t``; the paper's Section 3 names it
so), and ``fedavgm`` with ``beta = 0, eta_s = 1`` is FedAvg bit for bit. The adaptive rules
have no setting that equals FedAvg (the step is divided by ``sqrt(v) + tau``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import FEDAVG_SUMS, Algorithm, AlgorithmParams, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.functional.tree import tree_map
from fedrift.params import params

Rule = Literal["adagrad", "adam", "yogi"]


@params
class FedAdagradParams(AlgorithmParams):
    """FedAdagrad's options (Reddi et al. 2021, Algorithm 2).

    eta_s: server learning rate ``eta``.
    beta1: first-moment decay, ``m_t = beta1 m_{t-1} + (1 - beta1) Delta_t``.
    tau: adaptivity: added to ``sqrt(v_t)`` and the square root of ``v``'s start (``v_{-1} = tau^2``).
    """

    eta_s: Annotated[float, Field(gt=0)] = 0.1
    beta1: Annotated[float, Field(ge=0, lt=1)] = 0.9
    tau: Annotated[float, Field(gt=0)] = 1e-3


@params
class FedAdamParams(FedAdagradParams):
    """FedAdam's and FedYogi's options: FedAdagrad's plus the second-moment decay.

    eta_s: server learning rate ``eta`` (0.01: Adam's and Yogi's first step moves each
        coordinate by about ``eta_s``, Adagrad's by ``eta_s / 10``, hence its 0.1).
    beta2: second-moment decay (Adam: ``v = beta2 v + (1 - beta2) Delta^2``; Yogi's sign rule).
    """

    eta_s: Annotated[float, Field(gt=0)] = 1e-2
    beta2: Annotated[float, Field(ge=0, lt=1)] = 0.99


def adaptive_server(tau: float):
    """``init_server``: the model, ``m = 0`` and ``v = tau^2`` (Algorithm 2's ``v_{-1}``)."""

    def init(global_params: dict) -> Tree:
        return {"params": global_params, "m": tree_map(torch.zeros_like, global_params),
                "v": tree_map(lambda w: torch.full_like(w, tau * tau), global_params)}

    return init


def second_moment(rule: Rule, v: torch.Tensor, d2: torch.Tensor, beta2: float) -> torch.Tensor:
    """``v_t`` from ``v_{t-1}`` and ``Delta_t^2`` under Algorithm 2's three rules."""
    if rule == "adagrad":
        return v + d2
    if rule == "adam":
        return beta2 * v + (1.0 - beta2) * d2
    return v - (1.0 - beta2) * d2 * torch.sign(v - d2)


def fedopt_step(state: Tree, avg: dict, rule: Rule, eta_s: float, beta1: float, beta2: float, tau: float) -> Tree:
    """One server step of Algorithm 2 from ``avg = sum_k p_k w_k``: new ``params``, ``m``, ``v``."""
    w_t = state["params"]
    delta = tree_map(lambda a, w: a - w, avg, w_t)
    m = tree_map(lambda m, d: beta1 * m + (1.0 - beta1) * d, state["m"], delta)
    v = tree_map(lambda v, d: second_moment(rule, v, d * d, beta2), state["v"], delta)
    new = tree_map(lambda w, m, v: w + eta_s * m / (v.sqrt() + tau), w_t, m, v)
    return {**state, "params": new, "m": m, "v": v}


def _fedopt(name: str, rule: Rule, hp: FedAdagradParams) -> Algorithm:
    beta2 = getattr(hp, "beta2", 0.0)  # Adagrad has none

    def aggregate_sums(state: Tree, sums: Tree, info: RoundInfo) -> Tree:
        return fedopt_step(state, sums["params"], rule, hp.eta_s, hp.beta1, beta2, hp.tau)  # sums: FedAvg's average

    return Algorithm(name=name, hparams=hp, local_loss=ce_loss, init_server=adaptive_server(hp.tau),
                     sums=FEDAVG_SUMS, aggregate_sums=aggregate_sums)


@ALGORITHMS.register(
    "fedadagrad", "FedAdagrad: FedAvg's clients, Adagrad on the server's pseudo-gradient", FedAdagradParams,
    space={"eta_s": "log:1e-2:3", "tau": "log:1e-5:1e-1"},
)
def fedadagrad(hp: FedAdagradParams, setup: Setup) -> Algorithm:
    return _fedopt("fedadagrad", "adagrad", hp)


@ALGORITHMS.register(
    "fedadam", "FedAdam: FedAvg's clients, Adam (no bias correction) on the server's pseudo-gradient", FedAdamParams,
    space={"eta_s": "log:1e-3:1", "tau": "log:1e-5:1e-1"},
)
def fedadam(hp: FedAdamParams, setup: Setup) -> Algorithm:
    return _fedopt("fedadam", "adam", hp)


@ALGORITHMS.register(
    "fedyogi", "FedYogi: FedAvg's clients, Yogi on the server's pseudo-gradient", FedAdamParams,
    space={"eta_s": "log:1e-3:1", "tau": "log:1e-5:1e-1"},
)
def fedyogi(hp: FedAdamParams, setup: Setup) -> Algorithm:
    return _fedopt("fedyogi", "yogi", hp)
