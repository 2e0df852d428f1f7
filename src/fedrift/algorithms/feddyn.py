"""FedDyn (Acar et al. 2021): a dynamic regulariser that aligns local and global stationary points.

Client ``k`` keeps ``gr_k`` (client state, model-shaped, zero for a client never sampled: the
gradient of its local loss at its last local model). Local loss::

    CE(w) - <gr_k, w> + (alpha/2) ||w - w_t||^2

and after training ``gr_k <- gr_k - alpha (w_k - w_t)``. Clients upload ``w_k`` only. The server
keeps ``h`` (zero-initialised)::

    h       <- h - alpha (1/N) sum_{k in S_t} (w_k - w_t)
    w_{t+1} =  sum_k p_k w_k - h / alpha

Decisions. ``h``'s update is the paper's sum over the sampled clients divided by ``N`` (all
clients): a plain sum, as ``h`` tracks the mean of all clients' ``gr_k``. The model average uses
``p_k`` like every method (ALGORITHMS.md, Notation; the paper writes ``mean_k`` for its
equal-size clients; ``aggregation: uniform`` gives it). ``alpha = 0`` has no correction at all
(``h`` stays 0 and ``h / alpha`` is not formed), so it is FedAvg bit for bit: the linear and
proximal terms then add exact zeros to the gradient. The local optimiser is the train section's
(``train.momentum``, ``train.weight_decay``, as FedAvg, so that identity holds; the authors' code
uses momentum 0: set ``train.momentum: 0`` to reproduce it). The linear term uses ``gr_k`` as a
constant. The local loss's value (``train_loss``) includes both terms; the plain
cross-entropy is reported as ``ce_loss``.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.terms import squared_distance
from fedrift.functional.tree import leaves, tree_map, weighted_sum
from fedrift.params import params


@params
class FedDynParams(AlgorithmParams):
    """FedDyn's options (Acar et al. 2021).

    alpha: weight of the dynamic regulariser (linear and proximal terms) and of the server
        correction ``h``; 0 gives FedAvg exactly.
    """

    alpha: Annotated[float, Field(ge=0)] = 0.01


@ALGORITHMS.register(
    "feddyn", "FedDyn: dynamic regulariser -<gr_k, w> + (alpha/2)||w - w_t||^2", FedDynParams,
    space={"alpha": "log:1e-3:1"},
)
def feddyn(hp: FedDynParams, setup: Setup) -> Algorithm:
    alpha = hp.alpha

    def zeros(global_params: dict) -> Tree:
        return {"grad": tree_map(torch.zeros_like, global_params)}

    def init_server(global_params: dict) -> Tree:
        return {"params": global_params, "h": tree_map(torch.zeros_like, global_params)}

    def local_loss(params, batch, payload, ctx, apply):
        ce, _ = ce_loss(params, batch, payload, ctx, apply)
        linear = torch.stack([(g * w).sum() for g, w in zip(leaves(ctx["state"]["grad"]), leaves(params))]).sum()
        return ce - linear + 0.5 * alpha * squared_distance(params, payload["params"]), {"ce_loss": ce}

    def client_result(payload: Tree, end_params: dict, ctx: Tree) -> tuple[Tree, Tree]:
        gr = tree_map(lambda g, wk, w: g - alpha * (wk - w), ctx["state"]["grad"], end_params, payload["params"])
        return {"params": end_params}, {"grad": gr}

    def aggregate(state: Tree, uploads: Tree, weights: torch.Tensor, info: RoundInfo) -> Tree:
        avg = weighted_sum(uploads["params"], weights)
        if alpha == 0:
            return {**state, "params": avg}
        w_t, n = state["params"], info.num_clients
        h = tree_map(lambda h, wk, w: h - (alpha / n) * (wk - w).sum(0), state["h"], uploads["params"], w_t)
        return {**state, "params": tree_map(lambda a, h: a - h / alpha, avg, h), "h": h}

    return Algorithm(
        name="feddyn",
        hparams=hp,
        local_loss=local_loss,
        init_server=init_server,
        init_client=zeros,
        client_result=client_result,
        aggregate=aggregate,
    )
