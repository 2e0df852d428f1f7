"""FedLC (Zhang et al., ICML 2022, "Federated Learning with Label Distribution Skew via Logits
Calibration"): FedAvg with the client's logits calibrated by its label counts.

Each class's logit is lowered by a margin that grows as the class gets rarer on the client
(Sec. 4, the calibrated cross-entropy with its pairwise label margin):

    ``z'_c = z_c - tau n_{k,c}^{-1/4}``, loss ``sum_i w_i CE(z'_i, y_i)``

with ``n_{k,c}`` client ``k``'s training count of class ``c`` (``ctx["label_counts"]``, which
the engine hands every client). Rare classes get a larger margin, so the local model is
pushed less to over-score the frequent ones. Default ``tau = 1``; ``tau = 0`` builds FedAvg's
loss, so the result is FedAvg's bit for bit. Parameters are averaged as in FedAvg;
evaluation uses the plain logits.

Decisions:

- The denominator is the full softmax over every class, as the implementations in use
  compute it (FL-bench's ``src/client/fedlc.py``).
- A class the client has no sample of has ``n^{-1/4} = inf``: its calibrated logit is
  ``-inf`` and it drops out of the client's softmax (probability 0, no gradient), which is
  the formula's limit and what those implementations compute (``pow(0, -1/4) = inf``). Written
  with ``torch.where`` on the counts (vmap-safe). A client's own labels are always held
  classes; rows of weight 0 (the batched executor's padding) are masked out before the
  weighting so an ``-inf`` there cannot make ``0 * inf``.
"""

from __future__ import annotations

from typing import Annotated

import torch
import torch.nn.functional as F
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Setup, term_off
from fedrift.algorithms.fedavg import ce_loss
from fedrift.params import params


@params
class FedLCParams(AlgorithmParams):
    """FedLC's options (Zhang et al. 2022).

    tau: calibration strength in ``z_c - tau n_c^{-1/4}`` (0 gives FedAvg exactly; 1 in the
        paper's default setting).
    """

    tau: Annotated[float, Field(ge=0)] = 1.0


def calibration(label_counts: torch.Tensor, tau: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``tau n_c^{-1/4}`` per class (C), ``inf`` for a class with count 0, in ``dtype``."""
    counts = label_counts.to(dtype)
    held = counts > 0
    margin = tau * counts.clamp_min(1.0).pow(-0.25)
    return torch.where(held, margin, torch.full_like(margin, float("inf")))


def calibrated_ce(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor, label_counts: torch.Tensor,
                  tau: float) -> torch.Tensor:
    """``sum_i w_i CE(z_i - tau n^{-1/4}, y_i)``; rows with ``w = 0`` add exactly 0."""
    z = logits - calibration(label_counts, tau, logits.dtype)
    picked = F.log_softmax(z, dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    picked = torch.where(w > 0, picked, torch.zeros_like(picked))
    return -(picked * w).sum()


@ALGORITHMS.register(
    "fedlc", "FedLC: CE on logits calibrated by the client's label counts, z_c - tau n_c^(-1/4)", FedLCParams,
    space={"tau": "float:0:2"},
)
def fedlc(hp: FedLCParams, setup: Setup) -> Algorithm:
    if term_off(hp.tau):  # FedAvg, exactly
        return Algorithm(name="fedlc", hparams=hp, local_loss=ce_loss)
    tau = hp.tau

    def local_loss(params, batch, payload, ctx, apply):
        return calibrated_ce(apply(params, batch["x"]), batch["y"], batch["w"], ctx["label_counts"], tau), {}

    return Algorithm(name="fedlc", hparams=hp, local_loss=local_loss)
