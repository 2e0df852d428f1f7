"""SCAFFOLD (Karimireddy et al. 2019), option II: control variates correct the client drift.

The server keeps a control ``c`` and each client a control ``c_k`` (client state, zero for a
client never sampled); both are model-shaped. The server sends ``w_t`` and ``c`` (two models
down per client). Client ``k`` steps ``H_k`` times with the corrected gradient::

    w <- w - eta (g(w) - c_k + c)

and, option II, sets its new control from its model change::

    c_k+ = c_k - c + (w_t - w_k) / (H_k eta)

It uploads ``w_k`` and ``Delta c_k = c_k+ - c_k`` (two models up) and keeps ``c_k+``. Server::

    w_{t+1} = w_t + eta_g sum_k p_k (w_k - w_t)
    c       = c + (|S_t| / N) mean_k Delta c_k

The model is computed as ``avg + (1 - eta_g)(w_t - avg)`` with ``avg = sum_k p_k w_k``, the
same value rearranged, so that ``eta_g = 1`` is FedAvg's weighted average bit for bit.

Decisions. ``c``'s update is the paper's ``(1/N) sum_{k in S_t} Delta c_k``: a plain mean,
whatever ``aggregation`` says (``c`` estimates the mean gradient of all N clients, and each
client's control is its own, not weighted by its size); ``aggregation`` applies to the model.
Under ``train.lr_schedule`` ``eta`` is the round's lr in the local steps and in ``c_k+``
alike: ``(w_t - w_k) / (H_k eta)`` is the mean corrected gradient only with the lr the client
trained with. ``Delta c_k`` is computed as ``(w_t - w_k) / (H_k eta) - c`` and ``c_k+ = c_k + Delta c_k`` (the
spec's formula rearranged, so that the server's ``c`` moves by exactly what the clients stored).
The local optimiser is the algorithm's own: SGD with momentum ``local_momentum`` (0, off, as
the paper and the spec), ``train.momentum`` unused. ``train.clip_grad_norm`` clips the data
gradient and ``train.weight_decay`` is added to it (``g = clip(grad f) + wd w``) before the
correction, so neither touches ``c - c_k``. With ``local_momentum > 0`` the control update still
uses ``(w_t - w_k) / (H_k eta)``, which is then the momentum-weighted mean step, not the mean
corrected gradient.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.functional.optim import add_decay, clip_by_global_norm, sgd
from fedrift.functional.tree import tree_map
from fedrift.params import params


@params
class ScaffoldParams(AlgorithmParams):
    """SCAFFOLD's options (Karimireddy et al. 2019, option II).

    eta_g: global (server) learning rate, ``w_{t+1} = w_t + eta_g sum_k p_k (w_k - w_t)``; 1 is
        FedAvg's average.
    local_momentum: momentum of the clients' local SGD (0: off, the paper's setting).
    """

    eta_g: Annotated[float, Field(gt=0)] = 1.0
    local_momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0


@ALGORITHMS.register("scaffold", "SCAFFOLD: local steps corrected by control variates (option II)", ScaffoldParams)
def scaffold(hp: ScaffoldParams, setup: Setup) -> Algorithm:
    lr, wd = setup.lr, setup.weight_decay
    clip = clip_by_global_norm(setup.clip_grad_norm) if setup.clip_grad_norm is not None else None

    def zeros(global_params: dict) -> Tree:
        return {"control": tree_map(torch.zeros_like, global_params)}

    def init_server(global_params: dict) -> Tree:
        return {"params": global_params, **zeros(global_params)}

    def broadcast(state: Tree, info: RoundInfo) -> Tree:
        return {"params": state["params"], "control": state["control"]}

    def grad_correction(grads, params, payload, ctx):
        if clip is not None:
            grads, _ = clip.update(grads, (), params)
        grads = add_decay(grads, params, wd)
        return tree_map(lambda g, ck, c: g - ck + c, grads, ctx["state"]["control"], payload["control"])

    def client_result(payload: Tree, end_params: dict, ctx: Tree) -> tuple[Tree, Tree]:
        scale = ctx["num_steps"] * lr  # H_k eta
        delta = tree_map(lambda w, wk, c: (w - wk) / scale - c, payload["params"], end_params, payload["control"])
        new = tree_map(lambda ck, d: ck + d, ctx["state"]["control"], delta)
        return {"params": end_params, "delta_control": delta}, {"control": new}

    def aggregate_sums(state: Tree, sums: Tree, info: RoundInfo) -> Tree:
        """``sums``: the p-weighted model and the mean control change (streamed, see base)."""
        w_t = state["params"]
        model = tree_map(lambda a, w: a + (1.0 - hp.eta_g) * (w - a), sums["params"], w_t)
        share = len(info.sampled) / info.num_clients  # |S_t| / N
        control = tree_map(lambda c, d: c + share * d, state["control"], sums["delta_control"])
        return {**state, "params": model, "control": control}

    return Algorithm(
        name="scaffold",
        hparams=hp,
        local_loss=ce_loss,
        init_server=init_server,
        broadcast=broadcast,
        init_client=zeros,
        grad_correction=grad_correction,
        optimizer=sgd(lr, hp.local_momentum),
        client_result=client_result,
        sums={"params": "weights", "delta_control": "uniform"},
        aggregate_sums=aggregate_sums,
    )
