"""MOON (Li, He & Song 2021, "Model-Contrastive Federated Learning"): FedAvg plus a
contrastive term that pulls a sample's representation towards the global model's and away
from the client's previous local model's.

With ``r = g(features(x))`` the projection-head output (fedrift's ``mode="features"`` on a
model built with ``projection_dim``), ``r_glob`` the same for the round's global model
``w_t`` and ``r_prev`` for the client's previous local model, ``s_g = cos(r, r_glob)``,
``s_p = cos(r, r_prev)``:

    ``l_con = -log( e^{s_g/T} / (e^{s_g/T} + e^{s_p/T}) )``  (per sample)
    loss ``sum_i w_i CE(z_i, y_i) + mu sum_i w_i l_con_i``

computed as ``logsumexp(s_g/T, s_p/T) - s_g/T``, which is the same value without overflow.
``r_glob`` and ``r_prev`` are constants for the gradient (only ``r`` is trained). Defaults
``mu = 1``, ``T = 0.5``; ``mu = 0`` builds FedAvg's loss (no teacher, no client state), so the
result is FedAvg's bit for bit. Parameters are averaged as in FedAvg; the downlink is
FedAvg's (the previous model never travels).

The model must have a projection head (``model.projection_dim``; 256 in the paper): the
factory refuses one without it with a ConfigError before anything runs.

Where things come from:

- ``r_glob`` is the ``teacher`` hook (``w_t`` is fixed for the round: the engine computes it
  once a round per sample and hands it as ``batch["teacher"]["features"]``).
- The previous model is the client's state ``{"prev": params, "seen": bool}``. A client
  never seen gets ``init_client(initial global params)`` with ``seen = False``;
  ``client_start`` (eager, once per client and round) then uses the round's global model
  ``w_t`` instead, as the spec says for a first participation (the initial parameters
  would be wrong for a client first sampled in a later round). It hands the model to the
  steps as ``ctx["prev"]`` and replaces ``ctx["state"]`` by ``{}``, so the batched executor
  stacks one copy of the previous models, not two.
- ``r_prev`` is computed in ``local_loss`` from ``ctx["prev"]`` on every step (a client's
  own model cannot go in the round's shared teacher table) and detached.
- ``client_result`` stores the client's end parameters as its new previous model.

Cost: 3 forward passes per local step (student, global model, previous model) and one
backward; 2 forward passes with the engine's teacher cache (the global model's runs once a
round per sample instead). Memory: every client that has taken part keeps a full model as
state, ``N x`` the model's bytes (10,000 clients of a 1M-parameter model: 40 GB). With
``engine.client_state: disk`` (or ``auto``, which picks disk above 1 GiB) those models live
in a file and only the sampled clients' rows are in memory: this is the algorithm for which
that store's saving matters most.

Decisions: the contrastive term actually added (``mu`` included) is reported per round as
``moon_con``; cosine similarity is torch's (norms clamped at ``eps = 1e-8``), so a zero
representation gives similarity 0 rather than NaN.
"""

from __future__ import annotations

from typing import Annotated

import torch
import torch.nn.functional as F
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Setup, require_projection, term_off
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.terms import weighted_ce
from fedrift.params import params


@params
class MOONParams(AlgorithmParams):
    """MOON's options (Li et al. 2021).

    mu: weight of the model-contrastive term (0 gives FedAvg exactly; the paper tunes it per
        dataset, 5 for CIFAR-10).
    T: temperature of the contrastive softmax over the two cosine similarities.
    """

    mu: Annotated[float, Field(ge=0)] = 1.0
    T: Annotated[float, Field(gt=0)] = 0.5


def model_contrastive(r: torch.Tensor, r_glob: torch.Tensor, r_prev: torch.Tensor, w: torch.Tensor,
                      T: float) -> torch.Tensor:
    """``sum_i w_i l_con_i``, ``l_con = -log(e^{cos(r, r_glob)/T} / (e^{cos(r, r_glob)/T} + e^{cos(r, r_prev)/T}))``;
    ``r_glob`` and ``r_prev`` must already be constants."""
    sims = torch.stack([F.cosine_similarity(r, r_glob, dim=-1), F.cosine_similarity(r, r_prev, dim=-1)], dim=-1) / T
    return ((torch.logsumexp(sims, dim=-1) - sims[..., 0]) * w).sum()


@ALGORITHMS.register(
    "moon", "MOON: CE + mu model-contrastive loss (needs model.projection_dim)", MOONParams,
    space={"mu": "log:0.1:10"},
)
def moon(hp: MOONParams, setup: Setup) -> Algorithm:
    require_projection("moon", setup)
    if term_off(hp.mu):  # FedAvg, exactly: no term, no teacher, no state
        return Algorithm(name="moon", hparams=hp, local_loss=ce_loss)
    mu, T = hp.mu, hp.T

    def init_client(global_params):
        device = next(iter(global_params.values())).device
        return {"prev": global_params, "seen": torch.zeros((), dtype=torch.bool, device=device)}

    def client_start(payload, ctx, data, apply):  # eager: a Python branch is fine here
        state = ctx["state"]
        prev = state["prev"] if bool(state["seen"]) else payload["params"]
        return {"prev": prev, "state": {}}

    def teacher(payload, x, apply):  # the round's global model w_t, fixed all round: cacheable
        return {"features": apply(payload["params"], x, mode="features")}

    def local_loss(params, batch, payload, ctx, apply):
        x, y, w = batch["x"], batch["y"], batch["w"]
        r, z = apply(params, x, mode="both")
        r_prev = apply(ctx["prev"], x, mode="features").detach()
        con = mu * model_contrastive(r, batch["teacher"]["features"].detach(), r_prev, w, T)
        return weighted_ce(z, y, w) + con, {"moon_con": con}

    def client_result(payload, end_params, ctx):
        seen = torch.ones((), dtype=torch.bool, device=next(iter(end_params.values())).device)
        return {"params": end_params}, {"prev": end_params, "seen": seen}

    return Algorithm(
        name="moon",
        hparams=hp,
        local_loss=local_loss,
        init_client=init_client,
        client_start=client_start,
        teacher=teacher,
        client_result=client_result,
    )
