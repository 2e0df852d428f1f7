"""FedRoD (Chen, Chao, ICLR 2022, "On Bridging Generic and Personalized Federated Learning for
Image Classification"): a shared body with two heads. The generic head (the model's classifier
``fc``) is trained with the body on a class-balanced loss, balanced softmax, and averaged with
it; each client's personal head, a linear layer on the same features, stays on the client and
is trained on the plain empirical loss of the summed logits with the body and the generic head
held fixed. A client predicts with ``generic + personal`` logits.

With ``n_{k,c}`` client k's training count of class c, ``z = h(x)`` the body's features,
``g(z) = W_g z + b_g`` and ``p_k(z) = W_k z + b_k``::

    L_g = sum_i w_i CE(g(z_i) + log n_k, y_i)          (balanced softmax: body and generic head)
    L_p = sum_i w_i CE(sg(g(z_i)) + p_k(sg(z_i)), y_i)  (personal head only; sg: no gradient)

Both heads being linear on ``z``, a client's model (what is scored) is the model with ``fc``
replaced by ``W_g + W_k``, ``b_g + b_k``: the same function, one forward pass. Two models a
client as Ditto's (``algorithms/ditto.py``): one trained tree, the model under its names and
the personal head under ``@fedrod/fc.weight``, ``@fedrod/fc.bias``; the loss ``L_g + L_p``.
``generic_loss: ce`` trains the generic part with plain cross-entropy: FedAvg's model bit for
bit. Maths, defaults and departures: docs/reference/algorithms/personalisation.md.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Params, Setup, Tree
from fedrift.algorithms.ditto import part_sgd, per_part, tag, untag, untagged
from fedrift.algorithms.terms import weighted_ce
from fedrift.errors import ConfigError
from fedrift.params import params

OWN = "@fedrod/"  # the personal head's names in the trained tree
HEAD = ("fc.weight", "fc.bias")  # the generic head: every fedrift model's classifier


@params
class FedRoDParams(AlgorithmParams):
    """generic_loss: how the body and the generic head learn: ``balanced``, balanced softmax on
    the client's label counts (the paper's balanced risk); ``ce``, plain cross-entropy (the
    generic part is then FedAvg's, bit for bit)."""

    generic_loss: Literal["balanced", "ce"] = "balanced"


def balanced_ce(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor, label_counts: torch.Tensor) -> torch.Tensor:
    """Balanced softmax: ``sum_i w_i CE(z_i + log n, y_i)``; a class the client has no sample of
    gets ``log 0 = -inf`` (out of its softmax, no gradient); rows of weight 0 add exactly 0."""
    counts = label_counts.to(logits.dtype)
    log_n = torch.where(counts > 0, counts.clamp_min(1.0).log(), torch.full_like(counts, float("-inf")))
    picked = F.log_softmax(logits + log_n, dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    picked = torch.where(w > 0, picked, torch.zeros_like(picked))
    return -(picked * w).sum()


def _refuse_projection() -> ConfigError:
    return ConfigError("model.projection_dim: fedrod puts its personal head beside the classifier fc on the body's "
                       "features, and a projection head sits between them; allowed: null")


@ALGORITHMS.register(
    "fedrod", "FedRoD: a generic head (balanced softmax, averaged) and a personal head per client on a shared "
    "body; predicts with their summed logits; scored per client", FedRoDParams, space={},
)
def fedrod(hp: FedRoDParams, setup: Setup) -> Algorithm:
    if setup.apply is not None and setup.projection_dim is not None:  # a run's build, before anything is written
        raise _refuse_projection()
    balanced = hp.generic_loss == "balanced"

    def init_client(global_params: Params) -> Tree:
        if any(k.startswith("proj.") for k in global_params):
            raise _refuse_projection()
        return {"head": {k: torch.zeros_like(global_params[k]) for k in HEAD}}

    def train_params(payload: Tree, client_state: Tree) -> Params:
        return {**payload["params"], **tag(OWN, client_state["head"])}

    def client_model(shared: Tree, client_state: Tree) -> Params:
        own = client_state["head"]
        return {**shared["params"], **{k: shared["params"][k] + own[k] for k in HEAD}}

    def local_loss(params_: Params, batch: Tree, payload: Tree, ctx: Tree, apply: Any) -> tuple[torch.Tensor, Tree]:
        x, y, w = batch["x"], batch["y"], batch["w"]
        own = untag(OWN, params_)
        z, g = apply(untagged(params_), x, mode="both")
        generic = balanced_ce(g, y, w, ctx["label_counts"]) if balanced else weighted_ce(g, y, w)
        personal = weighted_ce(g.detach() + F.linear(z.detach(), own["fc.weight"], own["fc.bias"]), y, w)
        return generic + personal, {"personal_loss": personal}

    def client_result(payload: Tree, end: Params, ctx: Tree) -> tuple[Tree, Tree]:
        return {"params": untagged(end)}, {"head": untag(OWN, end)}

    return Algorithm(
        name="fedrod", hparams=hp, local_loss=local_loss, init_client=init_client, client_model=client_model,
        train_params=train_params, client_result=client_result,
        optimizer=per_part([(OWN, part_sgd(setup)), ("", part_sgd(setup))]),
    )
