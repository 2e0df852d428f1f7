"""FedAvg (McMahan et al. 2017): local SGD from w_t, then ``w_{t+1} = sum_k p_k w_k``."""

from __future__ import annotations

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Setup
from fedrift.algorithms.terms import weighted_ce


def ce_loss(params, batch, payload, ctx, apply):
    """Plain supervised loss: the local objective of FedAvg and the base of every other."""
    return weighted_ce(apply(params, batch["x"]), batch["y"], batch["w"]), {}


@ALGORITHMS.register("fedavg", "FedAvg: local SGD, sample-weighted parameter average", AlgorithmParams)
def fedavg(hp: AlgorithmParams, setup: Setup) -> Algorithm:
    return Algorithm(name="fedavg", hparams=hp, local_loss=ce_loss)
