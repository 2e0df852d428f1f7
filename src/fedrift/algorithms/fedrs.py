"""FedRS (Li & Zhan 2021, "FedRS: Federated Learning with Restricted Softmax for Label
Distribution Non-IID Data"): FedAvg with a restricted softmax in the local loss.

During local training the logits of the classes absent from the client's data are
multiplied by ``alpha`` before the cross-entropy:

    ``z'_c = s_c z_c`` with ``s_c = 1`` if the client holds class ``c`` and ``alpha`` if not;
    loss ``sum_i w_i CE(z'_i, y_i)``.

So the missing classes' scores are damped and their classifier vectors get smaller updates
pushing them away from the local features. Defaults ``alpha = 0.5``; ``alpha = 1`` builds
FedAvg's loss, so the result is FedAvg's bit for bit. Parameters are averaged as in FedAvg;
evaluation uses the unrestricted logits.

Decisions:

- "Absent" is ``ctx["label_counts"] == 0`` (the client's per-class training counts, which
  the engine hands every client); the scaling is a ``torch.where`` on them, vmap-safe.
- The whole logit is scaled, bias included, as the spec says. The paper writes the
  classifier without a bias and scales ``w_c^T h``; fedrift's classifiers have a bias, and
  scaling only the weight part would leave a missing class's bias free to grow.
- ``s_c`` is binary (held or not), as in the spec: a class with one sample is not damped.
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


@params
class FedRSParams(AlgorithmParams):
    """FedRS's options (Li & Zhan 2021).

    alpha: factor on the logits of classes the client has no sample of, in [0, 1] (1 gives
        FedAvg exactly; 0.5 in the paper's default setting).
    """

    alpha: Annotated[float, Field(ge=0, le=1)] = 0.5


def restricted_logits(logits: torch.Tensor, label_counts: torch.Tensor, alpha: float) -> torch.Tensor:
    """``logits`` (B x C) with the columns of classes whose count is 0 multiplied by ``alpha``."""
    ones = torch.ones_like(label_counts)
    scale = torch.where(label_counts > 0, ones, ones * alpha)  # alpha may be a stacked run's tensor (engine.step_values)
    return logits * scale.to(logits.dtype)


@ALGORITHMS.register(
    "fedrs", "FedRS: CE on logits with the client's absent classes scaled by alpha", FedRSParams,
    space={"alpha": "float:0:1"},
)
def fedrs(hp: FedRSParams, setup: Setup) -> Algorithm:
    if term_off(hp.alpha, 1.0):  # FedAvg, exactly
        return Algorithm(name="fedrs", hparams=hp, local_loss=ce_loss)
    alpha = hp.alpha

    def local_loss(params, batch, payload, ctx, apply):
        z = restricted_logits(apply(params, batch["x"]), ctx["label_counts"], alpha)
        return weighted_ce(z, batch["y"], batch["w"]), {}

    return Algorithm(name="fedrs", hparams=hp, local_loss=local_loss)
