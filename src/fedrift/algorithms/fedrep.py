"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, ICML 2021): a shared representation, a head
per client, trained in turn.

Each round a client first trains its head (the top ``head_layers``, kept on the client as
FedPer keeps its) with the body frozen, then the body with its head frozen; only the body is
averaged. Of the client's ``H_k`` local steps the first ``floor(H_k tau_h / (tau_h + tau_phi))``
train the head: with ``train.local_epochs = head_epochs + body_epochs`` (the authors' CIFAR-10
runs: 10 + 1 = 11) that is exactly ``head_epochs`` epochs, then ``body_epochs``. Frozen means the
part does not move at all (no decay, no momentum), as torch's SGD skips a parameter without a
gradient. Maths, defaults and departures: docs/reference/algorithms/personalisation.md.

The head phase's length depends on the client (its ``H_k``): ``optimizer_start`` writes it into
the optimiser's state from the client's context, and the optimiser counts its steps.
"""

from __future__ import annotations

from typing import Annotated, Any, Callable

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Params, Setup, Tree
from fedrift.algorithms.fedper import kept_part, top_keys, top_split
from fedrift.functional.optim import Transform, decay
from fedrift.params import params

@params
class FedRepParams(AlgorithmParams):
    """head_layers: how many top layers make the head each client keeps (1: the classifier, as
    the authors' code).

    head_epochs: tau_h, the head's share of each round's local steps, which come first (exactly
    that many epochs when ``train.local_epochs`` is head_epochs + body_epochs; the authors'
    runs: 10, their code's ``--local_ep`` less ``--local_rep_ep``). 0: only the body trains,
    under the initial head, FedBABU's training exactly.

    body_epochs: tau_phi, the body's share, after the head's (the authors' runs: 1 on CIFAR-10,
    their code's default; 5 on CIFAR-100 and FEMNIST).
    """

    head_layers: Annotated[int, Field(ge=1)] = 1
    head_epochs: Annotated[int, Field(ge=0)] = 10
    body_epochs: Annotated[int, Field(ge=1)] = 1


def head_steps(num_steps: torch.Tensor, head_epochs: int, body_epochs: int) -> torch.Tensor:
    """How many of a client's ``num_steps`` local steps train its head: ``floor(H tau_h / (tau_h + tau_phi))``
    (exact: the quotient of two small integers, correctly rounded, is never within a rounding of
    the next integer below it)."""
    return torch.div(num_steps * head_epochs, head_epochs + body_epochs, rounding_mode="floor")


Trains = Callable[[Params, Tree, Params], dict[str, Any]]  # (grads, state, params) -> name -> bool or 0-d bool tensor


def masked_sgd(lr: Any, momentum: float, weight_decay: float, clip: float | None, trains_of: Trains) -> Transform:
    """The train section's SGD (``functional.optim.sgd``'s very operations, so a trained
    tensor moves by the same bits) on the tensors ``trains_of`` says train at this step; a
    frozen one gets an update of ``-0.0`` (it keeps its bits) and keeps its momentum buffer, as
    torch's SGD skips a parameter without a gradient. Gradient clipping (torch's rule) measures
    the trained tensors only, as torch's ``clip_grad_norm_`` over parameters with a gradient.
    The state counts the steps (``count``) for ``trains_of``."""

    def init(params: Params) -> Tree:
        first = next(iter(params.values()))
        return {"count": first.new_zeros(()), "buf": {k: torch.zeros_like(v) for k, v in params.items()} if momentum else {}}

    def pick(train: Any, yes: torch.Tensor, no: Any) -> Any:
        if isinstance(train, bool):
            return yes if train else no
        return torch.where(train, yes, no)

    def update(grads: Params, state: Tree, params: Params) -> tuple[Params, Tree]:
        trains = trains_of(grads, state, params)
        g = {k: grads[k] for k in params}
        if clip is not None:
            sq = torch.stack([pick(trains[k], v.pow(2).sum(), v.new_zeros(())) for k, v in g.items()]).sum()
            factor = torch.clamp(clip / (sq.sqrt() + 1e-6), max=1.0)
            g = {k: v * factor for k, v in g.items()}
        d = {k: decay(v, params[k], weight_decay) for k, v in g.items()}
        buf = state["buf"]
        if momentum:
            moved = {k: v.add(buf[k], alpha=momentum) for k, v in d.items()}
            buf = {k: pick(trains[k], moved[k], buf[k]) for k in d}
            d = moved
        updates = {k: pick(trains[k], v.mul(-lr), torch.full_like(v, -0.0)) for k, v in d.items()}
        return updates, {**state, "count": state["count"] + 1, "buf": buf}

    return Transform(init, update)


def phased_sgd(lr: Any, momentum: float, weight_decay: float, clip: float | None,
               head_of: Callable[[Params], frozenset[str]]) -> Transform:
    """:func:`masked_sgd` on the head while the step count is below the phase length its state
    carries (``head_steps``, set by FedRep's ``optimizer_start`` from the client's context), on
    the rest after."""

    def trains(grads: Params, state: Tree, params: Params) -> dict[str, Any]:
        head, in_head = head_of(params), state["count"] < state["head_steps"]
        return {k: in_head if k in head else ~in_head for k in params}

    return masked_sgd(lr, momentum, weight_decay, clip, trains)


@ALGORITHMS.register(
    "fedrep", "FedRep: each client trains its own head (body frozen), then the body (head frozen); the body is "
    "averaged; scored per client", FedRepParams, space={"head_epochs": "int:1:10"},
)
def fedrep(hp: FedRepParams, setup: Setup) -> Algorithm:
    own, check = top_split("fedrep", "head_layers", hp.head_layers, setup, low=1)
    tau_h, tau_phi = hp.head_epochs, hp.body_epochs

    def optimizer_start(state: Tree, ctx: Tree) -> Tree:
        return {**state, "head_steps": head_steps(ctx["num_steps"], tau_h, tau_phi)}

    optimizer = phased_sgd(setup.lr, setup.momentum, setup.weight_decay, setup.clip_grad_norm,
                           lambda p: top_keys(p, hp.head_layers))
    return kept_part("fedrep", hp, own, check, optimizer=optimizer, optimizer_start=optimizer_start)
