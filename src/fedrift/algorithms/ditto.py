"""Ditto (Li, Hu, Beirami, Smith, ICML 2021): FedAvg's global model, and beside it on each
client a personal model held near it by a proximal term.

Each round a sampled client k trains two models on the same batches (Algorithm 1, as the
authors' code ``flearn/trainers_MTL/ditto.py`` interleaves them: one personal step, one global
step, per batch): the global model ``w`` from the broadcast ``w_t`` by local SGD on ``f_k``,
uploaded and averaged as FedAvg's; its own ``v_k`` by SGD on
``h_k(v) = f_k(v) + lam/2 ||v - w_t||^2``, kept on the client. Scored: each client's ``v_k``.

The two models a client: one tree (``Algorithm.train_params``), the global model under its
own names and ``v_k`` under ``@ditto/<name>``; the local loss is
``f_k(w) + f_k(v) + lam/2 ||v - w_t||^2``, whose gradient is ``grad f_k(w)`` in ``w`` and
``grad h_k(v)`` in ``v``: one step on the tree is the two models' steps, each by its own SGD
(:func:`per_part`: the train section's SGD on each model alone, its own clipping norm), so the
global model is FedAvg's bit for bit whatever ``lam``. This module also gives APFL and FedRoD
those pieces. Maths, defaults and departures: docs/reference/algorithms/personalisation.md.
"""

from __future__ import annotations

from typing import Annotated, Any, Sequence

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Params, Setup, Tree
from fedrift.algorithms.terms import weighted_ce
from fedrift.errors import ConfigError
from fedrift.functional.optim import Transform, sgd
from fedrift.functional.tree import detach_clone
from fedrift.params import params

OWN = "@ditto/"  # v_k's names in the trained tree: no module has an @


def tag(prefix: str, tree: Params) -> Params:
    """``tree`` under ``prefix + name``: a second model's entries in a client's trained tree."""
    return {prefix + k: v for k, v in tree.items()}


def untag(prefix: str, tree: Params) -> Params:
    """The entries of ``tree`` under ``prefix``, by their own names."""
    n = len(prefix)
    return {k[n:]: v for k, v in tree.items() if k.startswith(prefix)}


def untagged(tree: Params) -> Params:
    """The model's own entries of a trained tree (no ``@`` in their names)."""
    return {k: v for k, v in tree.items() if "@" not in k}


def part_sgd(setup: Setup) -> Transform:
    """The train section's SGD (``functional.optim.sgd``: decay, momentum, clipping), for one model."""
    return sgd(setup.lr, setup.momentum, setup.weight_decay, setup.clip_grad_norm)


def per_part(parts: Sequence[tuple[str, Transform]]) -> Transform:
    """One optimiser for a tree of several models: each entry goes to the first part whose
    prefix its name starts with (``""``, last: the rest), and each part's transform sees its
    entries alone (its own clipping norm and state), so each model moves as it would under its
    own optimiser, bit for bit. In place where every part's transform can be."""

    def split(tree: Params, like: Params) -> list[Params]:
        out: list[Params] = [{} for _ in parts]
        for k in like:
            out[next(i for i, (p, _) in enumerate(parts) if k.startswith(p))][k] = tree[k]
        return out

    def init(params_: Params) -> Any:
        return tuple(t.init(p) for (_, t), p in zip(parts, split(params_, params_)))

    def update(grads: Params, state: Any, params_: Params) -> tuple[Params, Any]:
        updates: Params = {}
        new = []
        for (_, t), g, s, p in zip(parts, split(grads, params_), state, split(params_, params_)):
            if p:
                u, s = t.update(g, s, p)
                updates.update(u)
            new.append(s)
        return {k: updates[k] for k in params_}, tuple(new)

    def apply_inplace(grads: Params, state: Any, params_: Params) -> Any:
        return tuple(t.apply_inplace(g, s, p) if p else s
                     for (_, t), g, s, p in zip(parts, split(grads, params_), state, split(params_, params_)))

    inplace = all(t.apply_inplace is not None for _, t in parts)
    return Transform(init, update, apply_inplace if inplace else None)


def refuse_batchnorm(name: str, setup: Setup, state: Params | None = None) -> None:
    """Refuse, in one line, a model with BatchNorm: the local step threads one set of running
    statistics, the global model's, and a second model beside it would need its own."""
    stats = getattr(setup.apply, "stat_keys", ()) if state is None else [k for k in state if k.endswith(".running_mean")]
    if stats:
        raise ConfigError(f"model.norm: {name} trains two models on each client in one step, and the step keeps "
                          "one model's BatchNorm statistics; allowed: group (or none)")


@params
class DittoParams(AlgorithmParams):
    """lam: lambda, the weight of ``lam/2 ||v - w_t||^2`` that holds each personal model near the
    round's global model (1: the authors' released runs; 0: each client trains its own alone;
    towards infinity the personal model is the global one)."""

    lam: Annotated[float, Field(ge=0)] = 1.0


@ALGORITHMS.register(
    "ditto", "Ditto: FedAvg's global model, and on each client a personal model trained with lam/2 ||v - w_t||^2 "
    "towards it; scored per client", DittoParams, space={"lam": "log:0.01:2"},
)
def ditto(hp: DittoParams, setup: Setup) -> Algorithm:
    refuse_batchnorm("ditto", setup)
    lam = hp.lam

    def init_client(global_params: Params) -> Tree:
        refuse_batchnorm("ditto", setup, global_params)
        return {"v": detach_clone(global_params)}

    def train_params(payload: Tree, client_state: Tree) -> Params:
        return {**payload["params"], **tag(OWN, client_state["v"])}

    def client_model(shared: Tree, client_state: Tree) -> Params:
        return client_state["v"]

    def local_loss(params_: Params, batch: Tree, payload: Tree, ctx: Tree, apply: Any) -> tuple[torch.Tensor, Tree]:
        x, y, w = batch["x"], batch["y"], batch["w"]
        w_t = payload["params"]
        own = untag(OWN, params_)
        global_loss = weighted_ce(apply({k: params_[k] for k in w_t}, x), y, w)
        personal = weighted_ce(apply(own, x), y, w)
        prox = torch.stack([(own[k] - w_t[k]).pow(2).sum() for k in w_t]).sum()
        return global_loss + (personal + 0.5 * lam * prox), {"personal_loss": personal}

    def client_result(payload: Tree, end: Params, ctx: Tree) -> tuple[Tree, Tree]:
        return {"params": {k: end[k] for k in payload["params"]}}, {"v": untag(OWN, end)}

    return Algorithm(
        name="ditto", hparams=hp, local_loss=local_loss, init_client=init_client, client_model=client_model,
        train_params=train_params, client_result=client_result,
        optimizer=per_part([(OWN, part_sgd(setup)), ("", part_sgd(setup))]),
    )
