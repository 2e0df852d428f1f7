"""FedDecorr (Shi et al., ICLR 2023, "Towards Understanding and Mitigating Dimensional
Collapse in Heterogeneous Federated Learning"): FedAvg plus a penalty on the correlation
between the dimensions of the batch's representations.

Heterogeneous clients collapse their representations onto few dimensions (the paper's
Sec. 3); FedDecorr keeps them spread by pushing the correlation matrix of the local batch's
representations towards a diagonal one (Sec. 4, ``L_FedDecorr = ||K||_F^2 / d^2`` with
``K`` the correlation matrix). Computed as in the authors' released code
(its ``FedDecorrLoss``), for which ``beta`` was tuned: with ``h`` the
``N x d`` representations of the batch (``mode="features"``, the input of the classifier),

    ``z = (h - mean) / sqrt(eps + var)`` per dimension (``var`` unbiased, ``eps = 1e-8``),
    ``G = z^T z`` (``d x d``, ``(N - 1)`` times the correlation matrix),
    ``L_decorr = mean over the d(d - 1) off-diagonal entries of G^2, divided by N``,

and the local loss is ``CE + beta L_decorr``. The diagonal is left out (a standardised
dimension's self-correlation is constant). A batch of one sample gives 0, as in that code.
Default ``beta = 0.1`` (the paper's CIFAR-10 setting); ``beta = 0`` builds FedAvg's loss, so
the result is FedAvg's bit for bit. Parameters are averaged as in FedAvg.

Decision: the statistics are over the batch's real rows only, those with ``batch["w"] > 0``:
the batched executor pads a shorter client's batch with zero-weight rows, which must not
move the mean, the variance or ``N``, so batched equals sequential. Masking is arithmetic
(no boolean indexing), vmap-safe. The term actually added (``beta`` included) is reported
per round as ``decorr``.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Setup, term_off
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.terms import weighted_ce
from fedrift.params import params

EPS = 1e-8  # the released code's, under the square root of the variance


@params
class FedDecorrParams(AlgorithmParams):
    """FedDecorr's options (Shi et al. 2023).

    beta: weight of the decorrelation term (0 gives FedAvg exactly; 0.1 in the paper's
        CIFAR-10 setting).
    """

    beta: Annotated[float, Field(ge=0)] = 0.1


def decorrelation(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """FedDecorr's penalty on representations ``h`` (N x d) over the rows with ``w > 0``:
    mean squared off-diagonal entry of ``z^T z`` divided by the real row count, ``z`` the
    standardised rows (module docstring). Pure and vmap-safe; 0 for fewer than 2 rows."""
    m = (w > 0).to(h.dtype).unsqueeze(-1)  # N x 1
    n = m.sum()
    mean = (h * m).sum(0, keepdim=True) / n.clamp_min(1.0)
    c = (h - mean) * m
    var = c.pow(2).sum(0, keepdim=True) / (n - 1.0).clamp_min(1.0)
    z = c / torch.sqrt(EPS + var)
    g = z.transpose(-1, -2) @ z
    d = g.shape[-1]
    off = 1.0 - torch.eye(d, dtype=g.dtype, device=g.device)
    return (g.pow(2) * off).sum() / max(d * (d - 1), 1) / n.clamp_min(1.0)


@ALGORITHMS.register(
    "feddecorr", "FedDecorr: CE + beta decorrelation of the batch's representations", FedDecorrParams,
    space={"beta": "log:0.01:1"},
)
def feddecorr(hp: FedDecorrParams, setup: Setup) -> Algorithm:
    if term_off(hp.beta):  # FedAvg, exactly
        return Algorithm(name="feddecorr", hparams=hp, local_loss=ce_loss)
    beta = hp.beta

    def local_loss(params, batch, payload, ctx, apply):
        w = batch["w"]
        h, z = apply(params, batch["x"], mode="both")
        dec = beta * decorrelation(h, w)
        return weighted_ce(z, batch["y"], w) + dec, {"decorr": dec}

    return Algorithm(name="feddecorr", hparams=hp, local_loss=local_loss)
