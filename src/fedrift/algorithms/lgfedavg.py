"""LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency 2020): FedPer's
split turned over: each client keeps its lower layers (a local representation) and only the
top ``global_layers`` layers are averaged. With every layer global it is FedAvg. Maths,
defaults and departures: docs/reference/algorithms/personalisation.md.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Params, Setup
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.fedper import count_layers, kept_part, top_keys
from fedrift.params import params


@params
class LGFedAvgParams(AlgorithmParams):
    """global_layers: how many top layers are shared and averaged (the authors' code's
    ``num_layers_keep``, default 1: the classifier); every layer below stays on each client.
    As many as the model has (or more): FedAvg."""

    global_layers: Annotated[int, Field(ge=1)] = 1


@ALGORITHMS.register(
    "lgfedavg", "LG-FedAvg: each client keeps its lower layers, the top layers (the classifier) are averaged; "
    "scored per client", LGFedAvgParams, space={},
)
def lgfedavg(hp: LGFedAvgParams, setup: Setup) -> Algorithm:
    total = count_layers(setup)
    if total is not None and hp.global_layers >= total:
        return Algorithm(name="lgfedavg", hparams=hp, local_loss=ce_loss)  # nothing local: FedAvg

    def own(state: Params) -> frozenset[str]:
        return frozenset(state) - top_keys(state, hp.global_layers)

    return kept_part("lgfedavg", hp, own, lambda state: None)
