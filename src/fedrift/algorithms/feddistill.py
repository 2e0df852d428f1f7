"""FedDistill+ (Seo et al. 2020, with parameter averaging as in the FedGKD paper).

After local training each client computes, with its trained model, the mean logit vector of
its training samples of each class it holds, and uploads them with its class counts beside
its parameters. The server averages each class's row over the clients holding it, weighted
by their counts of that class, into the global table ``Z`` (a class no sampled client holds
keeps last round's row). Next round the local loss is::

    CE + lam T^2 sum_i w_i [Z_{y_i} exists] KL( softmax(Z_{y_i} / T) || softmax(z_i / T) )

so samples of classes without a global entry (all of them in round 1) get plain CE.
Parameters are averaged as in FedAvg. ``lam = 0`` is FedAvg exactly.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, ClientData, Setup, fedavg_aggregate, term_off
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.terms import (
    combine_class_means, kl_to_target, model_class_means, rows_for_labels, weighted_ce,
)
from fedrift.params import params


@params
class FedDistillParams(AlgorithmParams):
    """lam: weight of the distillation to the global per-class logits (0 gives FedAvg exactly).
    T: distillation temperature (the loss carries T^2)."""

    lam: Annotated[float, Field(ge=0)] = 0.1
    T: Annotated[float, Field(gt=0)] = 1.0


@ALGORITHMS.register(
    "feddistill_plus", "FedDistill+: FedAvg + distillation to globally averaged per-class logits", FedDistillParams,
    space={"lam": "log:0.01:1"},
)
def feddistill_plus(hp: FedDistillParams, setup: Setup) -> Algorithm:
    C = setup.num_classes

    def init_server(global_params):
        z = next(iter(global_params.values()))
        return {"params": global_params, "class_logits": z.new_zeros(C, C), "has": torch.zeros(C, dtype=torch.bool, device=z.device)}

    def broadcast(state, info):
        return {"params": state["params"], "class_logits": state["class_logits"], "has": state["has"]}

    def local_loss(params, batch, payload, ctx, apply):
        if term_off(hp.lam):
            return ce_loss(params, batch, payload, ctx, apply)
        x, y, w = batch["x"], batch["y"], batch["w"]
        z = apply(params, x)
        target = torch.softmax(rows_for_labels(payload["class_logits"], y) / hp.T, dim=-1)
        known = rows_for_labels(payload["has"].to(z.dtype).unsqueeze(-1), y).squeeze(-1)
        kd = kl_to_target(target, z, w * known, hp.T)
        return weighted_ce(z, y, w) + hp.lam * hp.T**2 * kd, {}

    def client_end(payload, params, ctx, data: ClientData, apply):
        means, _ = model_class_means(apply, params, data.x, data.y, C, "logits")
        return {"class_logits": means}

    def client_result(payload, params, ctx):
        return {"params": params, "class_logits": ctx["class_logits"], "counts": ctx["label_counts"]}, {}

    def aggregate(state, uploads, weights, info):
        new = fedavg_aggregate(state, uploads, weights, info)
        table, has = combine_class_means(uploads["class_logits"], uploads["counts"], state["class_logits"], state["has"])
        return {**new, "class_logits": table, "has": has}

    return Algorithm(
        name="feddistill_plus", hparams=hp, local_loss=local_loss, init_server=init_server, broadcast=broadcast,
        client_end=client_end, client_result=client_result, aggregate=aggregate,
    )
