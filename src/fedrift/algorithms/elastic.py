"""Elastic aggregation (Chen, Hu, Tan, Wei and Wu, "Elastic Aggregation for Federated
Optimization", CVPR 2023).

Clients run FedAvg's local training from ``w_t``. Each then measures how sensitive the
function its model computes is to each parameter, without labels ("how much the overall
prediction function output changes when each parameter is changed ... in an unsupervised and
online manner", the abstract: the Memory Aware Synapses measure, Aljundi et al. 2018): for an
output ``F(x; w)`` the change under a small perturbation ``delta`` is ``sum_j g_j(x) delta_j``,
with ``g_j(x) = d ||F(x; w)||^2 / d w_j`` the gradient of the output's squared l2 norm, and a
parameter's sensitivity is ``Omega_j = (1/n) sum_i |g_j(x_i)|`` over the client's samples.
The server averages the clients' sensitivities and scales each parameter's update by them::

    Omega   = sum_k p_k Omega_k
    zeta_j  = 1 + tau - Omega_j / max(Omega)            (max over every parameter of the model)
    w_{t+1} = w_t - zeta (.) sum_k p_k (w_t - w_k)

so the most sensitive parameters move by ``tau`` times FedAvg's step (held back: they would
drag the model towards one client) and the least sensitive by up to ``1 + tau`` times (pushed:
they explore); ``zeta`` lies in ``[tau, 1 + tau]``.

Decisions. The paper measures ``Omega_k`` online, during local training (FL-bench: a moving
average ``Omega <- mu Omega + (1 - mu) |g|`` over batches, ``mu = 0.95``); fedrift's hooks see
the client's data once, after training (``client_end``), so it computes the quantity such an
average estimates, the mean over the client's samples, at the trained model ``w_k``, in
batches of ``train.batch_size``:
``Omega_k = sum_b (|b| / n) |grad (1/|b|) sum_{i in b} ||F(x_i; w_k)||^2|`` (one sample per
batch would be that mean exactly; MAS implementations also take the gradient of a batch). That costs one
more forward and backward pass over the client's data a round, without updating anything.
``F`` is the model's output, the logits. FL-bench's version (src/server/elastic.py) differs:
one number per tensor from the loss gradient (labels) on a 30% subset, and the max taken over
clients; fedrift follows the paper's per-parameter, unsupervised form.

The upload is the model and ``Omega_k``, one model-sized tensor more per client (counted in
``bytes_up``); the server reads them only through the p-weighted sums ``sum_k p_k w_k`` and
``sum_k p_k Omega_k`` (streamed). BatchNorm's running statistics (``model.norm: batch``) carry
no sensitivity and take the clients' weighted average, as for every method. The model is
computed as ``avg + (Omega / max(Omega) - tau)(w_t - avg)``, the same value rearranged
(``1 - zeta = Omega / max(Omega) - tau``).

FedAvg exactly: no setting gives it in general (the most sensitive parameter always moves by
``tau`` times FedAvg's step, the others by more); a parameter takes FedAvg's step exactly
where ``Omega_j / max(Omega) = tau``, so with ``tau = 1`` and equal sensitivities everywhere
the step is FedAvg's bit for bit.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, ClientData, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.fedexp import is_stat
from fedrift.params import params


@params
class ElasticParams(AlgorithmParams):
    """Elastic aggregation's options (CVPR 2023).

    tau: the elastic margin: ``zeta = 1 + tau - Omega / max(Omega)`` in ``[tau, 1 + tau]``
        (0.5, the value FL-bench ships; the paper tunes it per task).
    """

    tau: Annotated[float, Field(ge=0)] = 0.5


def sensitivity(apply, model: dict, x: torch.Tensor, batch_size: int) -> dict:
    """``Omega_k``: per parameter, ``sum_b (|b| / n) |grad_w (1/|b|) sum_{i in b} ||F(x_i; w)||^2|``
    over ``x`` in batches of ``batch_size`` rows, at ``model`` (running statistics fixed, eval
    mode). The gradient is ``torch.func.grad``'s, so it runs under the engine's ``no_grad``."""
    stats = {k: v for k, v in model.items() if is_stat(k)}
    trainable = {k: v for k, v in model.items() if not is_stat(k)}

    def output_norm(p: dict, xb: torch.Tensor) -> torch.Tensor:
        return apply({**p, **stats}, xb).pow(2).sum(-1).mean()

    n = len(x)
    omega = {k: torch.zeros_like(v) for k, v in trainable.items()}
    grad = torch.func.grad(output_norm)
    for i in range(0, n, batch_size):
        xb = x[i : i + batch_size]
        g = grad(trainable, xb)
        for k, o in omega.items():
            o.add_(g[k].abs(), alpha=len(xb) / n)
    return omega


def elastic_step(state: Tree, avg: dict, omega: dict, tau: float) -> Tree:
    """The server step from ``avg = sum_k p_k w_k`` and ``omega = sum_k p_k Omega_k``:
    ``w_{t+1} = avg + (Omega / max(Omega) - tau)(w_t - avg)`` (running statistics: ``avg``)."""
    w_t = state["params"]
    top = torch.stack([o.max() for o in omega.values()]).max()
    top = torch.where(top > 0, top, torch.ones_like(top))  # no sensitivity anywhere: Omega / max = 0
    new = {k: a if is_stat(k) else a + (omega[k] / top - tau) * (w_t[k] - a) for k, a in avg.items()}
    return {**state, "params": new}


@ALGORITHMS.register(
    "elastic", "Elastic aggregation: each parameter's update scaled by 1 + tau - its output sensitivity / the max", ElasticParams,
    space={"tau": "float:0:1"},
)
def elastic(hp: ElasticParams, setup: Setup) -> Algorithm:
    def client_end(payload: Tree, params: dict, ctx: Tree, data: ClientData, apply) -> Tree:
        return {"sensitivity": sensitivity(apply, params, data.x, setup.batch_size)}

    def client_result(payload: Tree, end_params: dict, ctx: Tree) -> tuple[Tree, Tree]:
        return {"params": end_params, "sensitivity": ctx["sensitivity"]}, ctx.get("state", {})

    def aggregate_sums(state: Tree, sums: Tree, info: RoundInfo) -> Tree:
        return elastic_step(state, sums["params"], sums["sensitivity"], hp.tau)

    return Algorithm(name="elastic", hparams=hp, local_loss=ce_loss, client_end=client_end, client_result=client_result,
                     sums={"params": "weights", "sensitivity": "weights"}, aggregate_sums=aggregate_sums)
