"""FedACG (Kim, Kim and Han, "Communication-Efficient Federated Learning with Accelerated Client
Gradient", CVPR 2024, Algorithm 1; code github.com/geehokim/FedACG).

The server keeps a momentum ``m`` (zero-initialised) and broadcasts the look-ahead model
``w~_t = w_t + lam m_{t-1}`` instead of ``w_t``: one model down per client, as FedAvg, and the
clients store nothing. Each client starts from ``w~_t`` and minimises its loss plus a
proximal pull to the look-ahead, ``(beta/2) ||w - w~_t||^2``. The server::

    Delta_t = sum_k p_k (w_k - w~_t)
    m_t     = lam m_{t-1} + Delta_t
    w_{t+1} = w_t + m_t

Expanding, ``w_{t+1} = w~_t + Delta_t = sum_k p_k w_k`` (``sum_k p_k = 1``): the new model is
the clients' average, as the authors' code computes it (servers/base.py, ``ServerM`` with
``FedACG``), and the momentum is stored as ``m_t = w_{t+1} - w_t``, the same quantity. So with
``lam = 0`` (the broadcast is ``w_t + 0 m = w_t``) and ``beta = 0`` (no pull) every step is
FedAvg's, bit for bit.

``beta``: the paper's term is ``(beta/2) ||w - w~||^2``; the authors' config
(configs/client/ACG.yaml) weighs the unhalved ``||w - w~||^2`` by 1e-3, which is ``beta =
2e-3`` here. The default 1e-3 is the paper's stated coefficient; ``lam = 0.85`` is the
momentum of both (configs/server/FedACG.yaml). Clients use the train section's optimiser.

Relation to FedADC (``fedadc``): both put the server momentum into the local steps. FedADC
sends ``m`` beside ``w_t`` (two models down) and adds ``beta_local m / H`` to every local
step; FedACG folds the momentum into the starting point once, sends one model, and anchors
the clients there. Read their rows side by side with FedAvgM/SlowMo (server momentum after
aggregation only).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import FEDAVG_SUMS, Algorithm, AlgorithmParams, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.slowmo import momentum_server
from fedrift.algorithms.terms import squared_distance
from fedrift.functional.tree import tree_map
from fedrift.models.norm import STATS
from fedrift.params import params


@params
class FedACGParams(AlgorithmParams):
    """FedACG's options (CVPR 2024, Algorithm 1).

    lam: server momentum ``lambda``; the clients start from ``w_t + lam m_{t-1}``.
    beta: weight of the local pull ``(beta/2) ||w - w~_t||^2`` to the look-ahead.
    ``lam = 0, beta = 0`` is FedAvg exactly.
    """

    lam: Annotated[float, Field(ge=0, lt=1)] = 0.85
    beta: Annotated[float, Field(ge=0)] = 1e-3


def lookahead(state: Tree, lam: float) -> dict:
    """``w~_t = w_t + lam m_{t-1}``, the model FedACG sends. BatchNorm's running statistics
    (``model.norm: batch``) go down as they are: a rule meant for parameters is never applied
    to them (models/norm.py; an extrapolated variance could turn negative)."""
    w, m = state["params"], state["momentum"]
    return {k: v if k.rsplit(".", 1)[-1] in STATS else v + lam * m[k] for k, v in w.items()}


def fedacg_step(state: Tree, avg: dict) -> Tree:
    """The server step from ``avg = sum_k p_k w_k``: ``w_{t+1} = avg``, ``m_t = avg - w_t``
    (equal to ``lam m_{t-1} + Delta_t``; module docstring)."""
    momentum = tree_map(lambda a, w: a - w, avg, state["params"])
    return {**state, "params": avg, "momentum": momentum}


@ALGORITHMS.register(
    "fedacg", "FedACG: broadcast a look-ahead w + lam m, local pull (beta/2)||w - look-ahead||^2", FedACGParams,
    space={"lam": "float:0.5:0.95", "beta": "log:1e-4:1e-1"},
)
def fedacg(hp: FedACGParams, setup: Setup) -> Algorithm:
    def broadcast(state: Tree, info: RoundInfo) -> Tree:
        return {"params": lookahead(state, hp.lam)}

    def local_loss(params, batch, payload, ctx, apply):
        ce, aux = ce_loss(params, batch, payload, ctx, apply)
        return ce + 0.5 * hp.beta * squared_distance(params, payload["params"]), aux

    def aggregate_sums(state: Tree, sums: Tree, info: RoundInfo) -> Tree:
        return fedacg_step(state, sums["params"])  # sums: FedAvg's average

    return Algorithm(name="fedacg", hparams=hp, local_loss=local_loss, init_server=momentum_server,
                     broadcast=broadcast, sums=FEDAVG_SUMS, aggregate_sums=aggregate_sums)
