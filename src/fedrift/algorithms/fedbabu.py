"""FedBABU (Oh, Kim, Yun, ICLR 2022): only the body is trained and averaged; the head (the top
``head_layers``, the classifier) stays at its random initialisation, the same for every client,
through all of federated training. Personalisation is fine-tuning at evaluation
(``eval.personalize``). ``head_layers: 0`` is FedAvg. Maths, defaults and departures:
docs/reference/algorithms/personalisation.md.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Params, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.fedper import top_split
from fedrift.algorithms.fedrep import masked_sgd
from fedrift.params import params


@params
class FedBABUParams(AlgorithmParams):
    """head_layers: how many top layers make the head that stays at its initialisation (1: the
    classifier, the paper's; 0: FedAvg)."""

    head_layers: Annotated[int, Field(ge=0)] = 1


@ALGORITHMS.register(
    "fedbabu", "FedBABU: the head stays at its random initialisation, only the body is trained and averaged; "
    "fine-tune with eval.personalize", FedBABUParams, space={},
)
def fedbabu(hp: FedBABUParams, setup: Setup) -> Algorithm:
    if hp.head_layers == 0:
        return Algorithm(name="fedbabu", hparams=hp, local_loss=ce_loss)  # no frozen head: FedAvg
    head_of, check = top_split("fedbabu", "head_layers", hp.head_layers, setup)

    def init_server(global_params: Params) -> Tree:
        check(global_params)
        return {"params": global_params}

    def aggregate_sums(state: Tree, sums: Tree, info: RoundInfo) -> Tree:
        """FedAvg's p-weighted sum over the body; the head stays the initial one, bit for bit."""
        head = head_of(state["params"])
        return {**state, "params": {k: v if k in head else sums["params"][k] for k, v in state["params"].items()}}

    # the train section's SGD with the head frozen at every step (FedRep's optimiser, its body phase
    # throughout): the head keeps its bits, so the upload carries the broadcast head unchanged
    optimizer = masked_sgd(setup.lr, setup.momentum, setup.weight_decay, setup.clip_grad_norm,
                           lambda grads, state, p: {k: k not in head_of(p) for k in p})
    return Algorithm(
        name="fedbabu", hparams=hp, local_loss=ce_loss, init_server=init_server, optimizer=optimizer,
        sums={"params": "weights"}, aggregate_sums=aggregate_sums,
    )
