"""FedAvgM (Hsu et al. 2019): FedAvg's clients, server momentum on the averaged model change.

The server keeps a velocity ``v`` (zero-initialised) over rounds::

    d_t     = w_t - sum_k p_k w_k
    v       = beta v + d_t
    w_{t+1} = w_t - eta_s v

Clients run FedAvg's local SGD (the train section's optimiser, ``train.momentum`` included:
the paper's server momentum is in addition to whatever the clients do). One model goes down
and one up per client, as FedAvg.

This is SlowMo's server step with a local learning rate of 1 (``d_t`` is not divided by
``eta``): :func:`fedrift.algorithms.slowmo.server_momentum_step` with ``lr = 1``,
``alpha = eta_s``. It computes the model as ``avg + (1 - eta_s) d_t - eta_s beta v_t``, which
is the formula rearranged, so that ``beta = 0, eta_s = 1`` gives ``avg`` (FedAvg) bit for
bit; the stored velocity is ``beta v_t + d_t`` as written (``d_t / 1.0`` is ``d_t`` exactly).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import FEDAVG_SUMS, Algorithm, AlgorithmParams, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.slowmo import momentum_server, server_momentum_step
from fedrift.params import params


@params
class FedAvgMParams(AlgorithmParams):
    """FedAvgM's options (Hsu et al. 2019).

    beta: server momentum coefficient; 0 with ``eta_s = 1`` is FedAvg exactly.
    eta_s: server learning rate applied to the velocity, ``w_{t+1} = w_t - eta_s v``.
    """

    beta: Annotated[float, Field(ge=0, lt=1)] = 0.9
    eta_s: Annotated[float, Field(gt=0)] = 1.0


@ALGORITHMS.register(
    "fedavgm", "FedAvgM: FedAvg with server momentum on the averaged model change", FedAvgMParams,
    space={"beta": "float:0:0.99", "eta_s": "log:0.05:1"},
)
def fedavgm(hp: FedAvgMParams, setup: Setup) -> Algorithm:
    def aggregate_sums(state: Tree, sums: Tree, info: RoundInfo) -> Tree:
        return server_momentum_step(state, sums["params"], 1.0, hp.eta_s, hp.beta)  # sums: FedAvg's average

    return Algorithm(name="fedavgm", hparams=hp, local_loss=ce_loss, init_server=momentum_server,
                     sums=FEDAVG_SUMS, aggregate_sums=aggregate_sums)
