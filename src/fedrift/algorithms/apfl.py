"""APFL (Deng, Kamani, Mahdavi 2020, "Adaptive Personalized Federated Learning"): each client
keeps a local model ``v_k`` and a mixing weight ``alpha_k``; its personal model is the mixture
``alpha_k v_k + (1 - alpha_k) w`` with the global model ``w``, which is FedAvg's.

At each local step (Algorithm 1) on the same batch: ``w`` by SGD on ``f_k(w)``; ``v_k`` by SGD
on the mixed model's loss, ``grad_v f_k(vbar) = alpha grad f_k(vbar)``, ``vbar = alpha v + (1 -
alpha) w``; with ``adaptive_alpha``, ``alpha`` by a step on ``grad_alpha f_k(vbar) = <v - w,
grad f_k(vbar)>``, kept in [0, 1]. Only ``w`` travels. Scored: each client's mixture with the
server's current ``w``.

Two models a client as Ditto's (``algorithms/ditto.py``): one trained tree, ``w`` under its
names, ``v_k`` under ``@apfl/<name>`` and ``alpha_k`` as ``@apfl.alpha``; the loss is
``f_k(w) + f_k(alpha v + (1 - alpha) sg(w))`` (``sg``: no gradient into ``w``), so ``w``'s
gradient is FedAvg's and the global model is FedAvg's bit for bit, whatever alpha. Maths,
defaults and departures: docs/reference/algorithms/personalisation.md.
"""

from __future__ import annotations

from typing import Annotated, Any

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Params, Setup, Tree
from fedrift.algorithms.ditto import part_sgd, per_part, refuse_batchnorm, tag, untag
from fedrift.algorithms.terms import weighted_ce
from fedrift.functional.optim import Transform
from fedrift.functional.tree import detach_clone
from fedrift.params import params

OWN = "@apfl/"  # v_k's names in the trained tree
ALPHA = "@apfl.alpha"  # alpha_k's (adaptive_alpha)


@params
class APFLParams(AlgorithmParams):
    """alpha: the personal model's share of the local model, ``alpha v + (1 - alpha) w`` (0.5:
    the authors' code's default, ``--fed_personal_alpha``; 0: the global model; 1: the local
    model alone); with adaptive_alpha, each client's starting value.

    adaptive_alpha: learn each client's alpha by gradient steps on its mixed model's loss (the
    paper's adaptive APFL; the authors' code's default: off, ``--fed_adaptive_alpha``)."""

    alpha: Annotated[float, Field(ge=0, le=1)] = 0.5
    adaptive_alpha: bool = False


def mix(alpha: Any, v: Params, w: Params) -> Params:
    """``alpha v + (1 - alpha) w`` per entry (``w`` itself, bit for bit, at alpha 0)."""
    return {k: v[k].mul(alpha).add(w[k].mul(1 - alpha)) for k in w}


def alpha_step(lr: Any) -> Transform:
    """``alpha <- clamp(alpha - lr g, 0, 1)``: plain projected SGD (no decay, no momentum), the
    same update in place and out."""

    def step(g: Params, p: Params) -> Params:
        return {k: torch.clamp(p[k] - lr * g[k], 0.0, 1.0) - p[k] for k in p}

    def update(grads: Params, state: Any, params_: Params) -> tuple[Params, Any]:
        return step(grads, params_), state

    def apply_inplace(grads: Params, state: Any, params_: Params) -> Any:
        for k, u in step(grads, params_).items():
            params_[k].add_(u)
        return state

    return Transform(lambda p: (), update, apply_inplace)


@ALGORITHMS.register(
    "apfl", "APFL: each client keeps a local model mixed with FedAvg's global one, alpha v + (1 - alpha) w "
    "(alpha fixed or learnt); scored per client", APFLParams, space={"alpha": "float:0:1"},
)
def apfl(hp: APFLParams, setup: Setup) -> Algorithm:
    refuse_batchnorm("apfl", setup)
    adaptive = hp.adaptive_alpha

    def alpha_of(client_state: Tree) -> Any:
        return client_state["alpha"] if adaptive else hp.alpha

    def init_client(global_params: Params) -> Tree:
        refuse_batchnorm("apfl", setup, global_params)
        state = {"v": detach_clone(global_params)}
        if adaptive:
            z = next(iter(global_params.values()))
            state["alpha"] = torch.tensor(float(hp.alpha), dtype=z.dtype, device=z.device)
        return state

    def train_params(payload: Tree, client_state: Tree) -> Params:
        out = {**payload["params"], **tag(OWN, client_state["v"])}
        if adaptive:
            out[ALPHA] = client_state["alpha"]
        return out

    def client_model(shared: Tree, client_state: Tree) -> Params:
        return mix(alpha_of(client_state), client_state["v"], shared["params"])

    def local_loss(params_: Params, batch: Tree, payload: Tree, ctx: Tree, apply: Any) -> tuple[torch.Tensor, Tree]:
        x, y, w = batch["x"], batch["y"], batch["w"]
        glob = {k: params_[k] for k in payload["params"]}
        alpha = params_[ALPHA] if adaptive else hp.alpha
        global_loss = weighted_ce(apply(glob, x), y, w)
        mixed = weighted_ce(apply(mix(alpha, untag(OWN, params_), {k: v.detach() for k, v in glob.items()}), x), y, w)
        return global_loss + mixed, {"personal_loss": mixed}

    def client_result(payload: Tree, end: Params, ctx: Tree) -> tuple[Tree, Tree]:
        state = {"v": untag(OWN, end)}
        if adaptive:
            state["alpha"] = end[ALPHA]
        return {"params": {k: end[k] for k in payload["params"]}}, state

    return Algorithm(
        name="apfl", hparams=hp, local_loss=local_loss, init_client=init_client, client_model=client_model,
        train_params=train_params, client_result=client_result,
        optimizer=per_part([(ALPHA, alpha_step(setup.lr)), (OWN, part_sgd(setup)), ("", part_sgd(setup))]),
    )
