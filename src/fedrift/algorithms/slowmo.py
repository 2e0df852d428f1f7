"""SlowMo (Wang et al. 2020), in the federated form of FedADC's Algorithm 2 (papers/004_...).

Clients run plain local SGD from ``w_t`` (as FedAvg). The server treats the averaged model
change as a pseudo-gradient and keeps a momentum ``m`` (zero-initialised) over rounds::

    g       = (1/eta) sum_k p_k (w_t - w_k)
    m       = beta m + g
    w_{t+1} = w_t - alpha eta m

``eta`` is the local learning rate (``train.lr``; under ``train.lr_schedule`` the round's, in
the clients' steps and in both server lines alike: SlowMo's Algorithm 1 writes ``gamma_t``, the
lr the clients trained with that round, so ``g`` stays a gradient-sized quantity as the lr
decays and the server step shrinks with it). Aggregation weights: the paper writes a
plain mean (its clients hold equal shares); fedrift uses ``p_k = n_k / sum_j n_j`` like every
method (ALGORITHMS.md, Notation), and ``aggregation: uniform`` gives the paper's mean.

Local momentum is off by default (the paper's remark: it worsens non-iid drift): the
algorithm brings its own local optimiser, SGD with ``train.weight_decay`` and
``train.clip_grad_norm`` and momentum ``local_momentum`` (torch.optim.SGD's rule, reset each
round), so ``train.momentum`` is not used.

The server update is computed in the algebraically equal form
``w_{t+1} = avg + (1 - alpha) (w_t - avg) - alpha eta beta m_t`` with ``avg = sum_k p_k w_k``,
so that ``beta = 0, alpha = 1`` is FedAvg bit for bit (``w_t - eta (1/eta)(w_t - avg)`` is not
``avg`` in floating point); the stored momentum is ``beta m_t + (w_t - avg) / eta`` as written.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import FEDAVG_SUMS, Algorithm, AlgorithmParams, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.functional.optim import sgd
from fedrift.functional.tree import tree_map
from fedrift.params import params


@params
class SlowMoParams(AlgorithmParams):
    """SlowMo's options (FedADC paper, Algorithm 2; Wang et al. 2020).

    beta: server (slow) momentum coefficient; 0 with ``alpha = 1`` is FedAvg exactly.
    alpha: server (slow) learning rate, a multiple of the local ``eta``.
    local_momentum: momentum of the clients' local SGD (0: off, the paper's setting).
    """

    beta: Annotated[float, Field(ge=0, lt=1)] = 0.9
    alpha: Annotated[float, Field(gt=0)] = 1.0
    local_momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0


def momentum_server(global_params: dict) -> Tree:
    """The server state of a server-momentum method: the model and a zero momentum."""
    return {"params": global_params, "momentum": tree_map(torch.zeros_like, global_params)}


def server_momentum_step(state: Tree, avg: dict, lr: float, alpha: float, beta: float) -> Tree:
    """One server step shared by SlowMo and FedADC, from the weighted average ``avg`` of w_k.

    ``delta = w_t - avg``; ``m_{t+1} = beta m_t + delta / lr``; ``w_{t+1} = w_t - alpha lr m_{t+1}``
    (SlowMo: ``beta``; FedADC: ``beta_global - beta_local``, or 0 with double momentum).
    The model is computed as ``avg + (1 - alpha) delta - alpha lr beta m_t`` (see module doc).
    """
    w_t, m_t = state["params"], state["momentum"]
    delta = tree_map(lambda w, a: w - a, w_t, avg)
    momentum = tree_map(lambda m, d: beta * m + d / lr, m_t, delta)
    new = tree_map(lambda a, d, m: a + (1.0 - alpha) * d - (alpha * lr * beta) * m, avg, delta, m_t)
    return {**state, "params": new, "momentum": momentum}


@ALGORITHMS.register(
    "slowmo", "SlowMo: FedAvg's clients, server momentum on the pseudo-gradient", SlowMoParams,
    space={"beta": "float:0.5:0.99"},
)
def slowmo(hp: SlowMoParams, setup: Setup) -> Algorithm:
    lr = setup.lr

    def aggregate_sums(state: Tree, sums: Tree, info: RoundInfo) -> Tree:
        return server_momentum_step(state, sums["params"], lr, hp.alpha, hp.beta)  # sums: FedAvg's average

    return Algorithm(
        name="slowmo",
        hparams=hp,
        local_loss=ce_loss,
        init_server=momentum_server,
        optimizer=sgd(lr, hp.local_momentum, setup.weight_decay, setup.clip_grad_norm),
        sums=FEDAVG_SUMS,
        aggregate_sums=aggregate_sums,
    )
