"""FedNova (Wang et al. 2020): normalised averaging, so clients with more local steps do not
pull the global model towards their own objective.

Client ``k`` runs ``tau_k`` local steps (its ``H_k``, the engine's ``ctx["num_steps"]``) of
FedAvg's local SGD with momentum ``rho`` (``train.momentum``; the train section's optimiser is
used as is). Its model change is a sum of gradients with total weight (the l1 norm of the
paper's vector ``a_k``)::

    a_k = (tau_k - rho (1 - rho^tau_k) / (1 - rho)) / (1 - rho)        (a_k = tau_k when rho = 0)

It uploads ``w_k`` and ``a_k`` (one more number up). The server normalises and rescales::

    d_k     = (w_t - w_k) / a_k
    tau_eff = sum_k p_k a_k
    w_{t+1} = w_t - eta_s tau_eff sum_k p_k d_k

computed as ``w_t - sum_k c_k (w_t - w_k)`` with ``c_k = eta_s tau_eff p_k / a_k`` (the
coefficients in float64). With equal ``tau_k`` and ``eta_s = 1``, ``c_k = p_k`` up to rounding,
so the result equals FedAvg's ``sum_k p_k w_k`` within float tolerance (not bit for bit:
``w_t - sum p_k (w_t - w_k)`` rounds differently from ``sum p_k w_k``).

Decisions: ``a_k`` counts the momentum only; weight decay (``train.weight_decay``, added to the
gradient) and gradient clipping are treated as part of the gradient, as in the authors' code.
``a_k`` is computed from the closed form in float64; ``tau_k`` counts the steps the engine
actually ran (``local_epochs`` x batches, or ``local_steps``). A client with no step
(``a_k = 0``) has ``w_k = w_t`` and contributes ``d_k = 0``.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.functional.tree import tree_map, weighted_sum
from fedrift.params import params


@params
class FedNovaParams(AlgorithmParams):
    """FedNova's options (Wang et al. 2020). The local momentum ``rho`` is ``train.momentum``.

    eta_s: server learning rate, ``w_{t+1} = w_t - eta_s tau_eff sum_k p_k d_k``; 1 with equal
        local step counts is FedAvg. Tuned: when the step counts differ the coefficients
        ``c_k`` sum to more than 1 (``tau_eff sum_k p_k / a_k >= 1``, Jensen), so with
        ``eta_s = 1`` the server step extrapolates past the clients' average.
    """

    eta_s: Annotated[float, Field(gt=0)] = 1.0


def normalizer(num_steps: torch.Tensor, rho: float) -> torch.Tensor:
    """``a_k = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho)`` in float64; ``tau`` when rho = 0."""
    tau = num_steps.to(torch.float64)
    if rho == 0:
        return tau
    return (tau - rho * (1.0 - torch.pow(rho, tau)) / (1.0 - rho)) / (1.0 - rho)


@ALGORITHMS.register(
    "fednova", "FedNova: local updates normalised by their step count, then rescaled", FedNovaParams,
    space={"eta_s": "log:0.1:1"},
)
def fednova(hp: FedNovaParams, setup: Setup) -> Algorithm:
    rho = setup.momentum

    def client_result(payload: Tree, end_params: dict, ctx: Tree) -> tuple[Tree, Tree]:
        return {"params": end_params, "a": normalizer(ctx["num_steps"], rho)}, ctx.get("state", {})

    def aggregate(state: Tree, uploads: Tree, weights: torch.Tensor, info: RoundInfo) -> Tree:
        w_t = state["params"]
        p = weights.to(torch.float64)
        a = uploads["a"].to(device=p.device, dtype=torch.float64)
        tau_eff = (p * a).sum()
        coef = hp.eta_s * tau_eff * p / torch.where(a > 0, a, torch.ones_like(a))
        diffs = tree_map(lambda w_k, w: w - w_k, uploads["params"], w_t)  # (K, ...) rows w_t - w_k
        step = weighted_sum(diffs, coef)
        return {**state, "params": tree_map(lambda w, s: w - s, w_t, step)}

    return Algorithm(name="fednova", hparams=hp, local_loss=ce_loss, client_result=client_result, aggregate=aggregate,
                     local_sgd=True)
