"""FedCSD (Class prototype Similarity Distillation; papers/002, eq. 6-15, Algorithm 1).

The server keeps a teacher ``w_xi``, a temporal moving average (TMA) of global models:
``w_xi^0 = w_G^0``, ``w_xi^{t+1} = a w_xi^t + (1 - a) w_G^{t+1}`` (eq. 12). A round:

1. pre-phase: each sampled client runs the teacher on its data and uploads its class
   prototype matrix ``P_k`` (row ``c`` = mean teacher logit vector over its samples of class
   ``c``, eq. 6) and which classes it holds; the server averages row ``c`` over the clients
   holding class ``c`` into ``P_G`` (rows nobody holds stay zero) and sends it down;
2. local loss ``CE + mu L_CSD`` (eq. 15), per sample: ``delta_c = cos(z_k, P_G[c])``,
   ``delta_hat = softmax(delta)``, ``z_hat = delta_hat * z_xi``, ``q_xi = softmax(z_hat / tau)``,
   ``q_k = softmax(z_k / tau)``, mask ``M = 1[softmax(z_xi)_y > 1/C]`` (eq. 13) and
   ``L_CSD = M tau^2 sum_c -q_xi,c log q_k,c`` averaged over the batch (eq. 14);
3. parameters are averaged as in FedAvg, then the teacher moves (eq. 12).

The mask's filter rate (the share of samples it removes, paper Fig. 5) is reported per
round as ``fedcsd_mask_filtered``.

``variant: released`` is the arithmetic of the authors' released code instead
(``IAMJackYan/FedCSD`` at commit 5612114, ``train_ours.py``, ``train_epoch``), which departs
from the paper in four ways:

- each client distils towards its *own* prototypes, ``P_k`` from the teacher on its own
  samples (``get_teacher_prototype``), computed in ``client_start``: no pre-phase, nothing
  extra goes up or down, no server average;
- the mask reads the *refined* logits, ``M = 1[softmax(z_hat)_y > 1/C]``: ``z_hat`` is nearly
  flat (``delta_hat`` is about 1/C per class), so the filter is much milder;
- the loss is ``tau^2 KL(q_xi || q_k)`` (``nn.KLDivLoss``), and the gradient flows through
  ``delta_hat`` into the target, so the teacher's entropy term has a gradient too;
- ``(1 - mu) CE + mu L_CSD`` with ``mu = 0.5, tau = 4``.
The first three are what the variant is; the last is its defaults (``mu=0.5``, ``tau=4``,
``loss_form=convex``, ``detach_similarity=false``), which an explicit key overrides. The
teacher is the same TMA (its ``g_mt``, ``alf=0.9``). What it does not copy: the released data
loader drops each epoch's last partial batch and augments the images the prototypes and
teacher logits are computed on, and its teacher runs in training mode (batch statistics in
its BatchNorm ResNets); here the prototypes cover every sample of the client, as the teacher
table holds them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BeforeValidator, Field, model_validator
from pydantic_core import ArgsKwargs

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, ClientData, Setup, fedavg_aggregate
from fedrift.algorithms.terms import class_means, weighted_ce
from fedrift.functional.tree import tree_map
from fedrift.params import params



def _yaml_switch(value: Any) -> Any:
    """YAML 1.1 reads a bare ``on``/``off`` as a boolean; take it back as the word."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    return value


# train_ours.py's argparse defaults (--mu 0.5, --T 4.0) and its loss (1 - mu) CE + mu KD,
# with the gradient through the similarity (no detach): variant released's defaults
RELEASED_DEFAULTS = {"mu": 0.5, "tau": 4.0, "loss_form": "convex", "detach_similarity": False}


@params
class FedCSDParams(AlgorithmParams):
    """FedCSD's options; the symbols are the paper's (papers/002).

    mu: weight ``mu`` of the distillation loss ``L_CSD`` (eq. 15; 0 gives FedAvg exactly).
    tau: distillation temperature ``tau`` (eq. 11).
    a: TMA momentum of the teacher (the paper's alpha in eq. 12).
    similarity: ``on`` refines the teacher logits by the prototype similarity,
        ``z_hat = delta_hat * z_xi`` (eq. 10); ``off`` distils ``z_xi`` itself (Table III).
    mask: ``adaptive`` keeps a sample when the teacher gives its true class more than 1/C
        (eq. 13); ``argmax`` when the teacher's prediction is the true class (eq. 16, Table IV);
        ``off`` keeps every sample. Under ``variant: released`` both rules read the refined
        logits ``z_hat`` instead of ``z_xi``.
    teacher: ``tma`` (eq. 12) or ``last_global`` (the round's global model ``w_t``, Table III).
    detach_similarity: ``true`` treats ``delta_hat`` as a constant in the teacher target (this
        project's decision); ``false`` lets the gradient flow through it, as the authors'
        released code does.
    loss_form: ``paper`` is ``CE + mu L_CSD`` (eq. 15); ``convex`` is ``(1 - mu) CE + mu L_CSD``,
        the released code's form (needs ``mu <= 1``).
    variant: ``paper`` (eq. 6-15) or ``released``, the arithmetic of the authors' code: own
        prototypes, mask from the refined logits, KL form. ``released`` changes
        the defaults of the keys it is not given to the released code's: ``mu=0.5``, ``tau=4``,
        ``loss_form=convex``, ``detach_similarity=false``.
    """

    mu: Annotated[float, Field(ge=0)] = 0.001
    tau: Annotated[float, Field(gt=0)] = 10.0
    a: Annotated[float, Field(ge=0, le=1)] = 0.9
    similarity: Annotated[Literal["on", "off"], BeforeValidator(_yaml_switch)] = "on"
    mask: Annotated[Literal["adaptive", "argmax", "off"], BeforeValidator(_yaml_switch)] = "adaptive"
    teacher: Literal["tma", "last_global"] = "tma"
    detach_similarity: bool = True
    loss_form: Literal["paper", "convex"] = "paper"
    variant: Literal["paper", "released"] = "paper"

    @model_validator(mode="before")
    @classmethod
    def _released_defaults(cls, data: Any) -> Any:
        """``variant: released`` fills the keys it is not given with the released code's values."""
        kwargs = data.kwargs if isinstance(data, ArgsKwargs) else data
        if not isinstance(kwargs, dict) or kwargs.get("variant") != "released":
            return data
        filled = {**RELEASED_DEFAULTS, **kwargs}
        return ArgsKwargs(data.args, filled) if isinstance(data, ArgsKwargs) else filled

    @model_validator(mode="after")
    def _convex_weight(self) -> "FedCSDParams":
        if self.loss_form == "convex" and self.mu > 1:
            raise ValueError(
                f"algorithm.mu: {self.mu} with loss_form convex gives CE a negative weight 1 - mu; "
                "allowed: 0..1 (the released code uses 0.5)"
            )
        return self


def class_prototypes(teacher_logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P_k, holds)``: row ``c`` of ``P_k`` is the mean logit vector over samples of class ``c``
    (zero where the client has none, eq. 6); ``holds[c]`` says whether it has any."""
    means, counts = class_means(teacher_logits, y, num_classes)
    return means, counts > 0


def combine_prototypes(protos: torch.Tensor, holds: torch.Tensor) -> torch.Tensor:
    """``P_G``: per class, the plain mean of the rows of the clients that hold it (zero if none).

    ``protos`` is (K, C, C), ``holds`` (K, C), one row per client.
    """
    h = holds.to(protos.dtype)
    return (protos * h.unsqueeze(-1)).sum(0) / h.sum(0).clamp(min=1).unsqueeze(-1)


def csd_terms(
    z: torch.Tensor,
    z_teacher: torch.Tensor,
    y: torch.Tensor,
    prototypes: torch.Tensor | None,
    tau: float,
    similarity: bool = True,
    mask: str = "adaptive",
    detach_similarity: bool = True,
    released: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample: ``(tau^2 sum_c -q_xi,c log q_k,c, M)``, the unmasked CSD loss and the mask.

    ``z`` are the student's logits (B, C), ``z_teacher`` the teacher's (constants), ``prototypes``
    ``P_G`` (C, C). The cosine with a zero prototype row is 0 (``F.normalize`` leaves a zero
    vector zero), so classes nobody holds get zero similarity and no NaN.

    ``released``: the released code's arithmetic (module docstring): the loss as
    ``tau^2 KL(q_xi || q_k)``, written as ``train_ours.py`` writes it, and the mask from the
    refined logits ``z_hat`` instead of the teacher's.
    """
    num_classes = z.shape[-1]
    if similarity:
        delta = F.normalize(z, dim=-1) @ F.normalize(prototypes, dim=-1).T  # (B, C): cos(z_k, P_G[c])
        delta_hat = torch.softmax(delta, dim=-1)
        if detach_similarity:
            delta_hat = delta_hat.detach()
        z_hat = delta_hat * z_teacher
    else:
        z_hat = z_teacher
    if released:  # KLDivLoss(reduction='none')(log q_k, q_xi) * T^2, summed over classes
        kl = F.kl_div(F.log_softmax(z / tau, dim=-1), F.softmax(z_hat / tau, dim=-1), reduction="none")
        per_sample = (kl * (tau * tau)).sum(-1)
    else:
        q_teacher = torch.softmax(z_hat / tau, dim=-1)
        per_sample = (-q_teacher * F.log_softmax(z / tau, dim=-1)).sum(-1) * tau**2
    judged = z_hat if released else z_teacher  # whose softmax the mask reads
    if mask == "adaptive":
        p_true = torch.softmax(judged, dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
        keep = p_true > 1.0 / num_classes
    elif mask == "argmax":
        keep = judged.argmax(-1) == y
    else:
        keep = torch.ones_like(y, dtype=torch.bool)
    return per_sample, keep.to(z.dtype)


@ALGORITHMS.register(
    "fedcsd", "FedCSD: CE + mu * class-prototype-similarity distillation from a TMA teacher, masked", FedCSDParams,
    space={"mu": "log:1e-4:1"},
)
def fedcsd(hp: FedCSDParams, setup: Setup) -> Algorithm:
    num_classes = setup.num_classes
    similarity = hp.similarity == "on"
    released = hp.variant == "released"
    ce_weight = 1.0 - hp.mu if hp.loss_form == "convex" else 1.0

    def init_server(global_params):
        return {"params": global_params, "teacher": global_params}  # w_xi^0 = w_G^0, the same tensors

    def broadcast(state, info):
        return {"params": state["params"], "teacher": state["teacher"]}

    def teacher(payload, x, apply):
        return {"logits": apply(payload["teacher"], x)}

    def client_summary(payload, ctx, data: ClientData, apply):
        protos, holds = class_prototypes(data.teacher["logits"], data.y, num_classes)
        return {"prototypes": protos, "holds": holds}

    def pre_combine(payload, summaries, weights):
        return {"prototypes": combine_prototypes(summaries["prototypes"], summaries["holds"])}

    def own_prototypes(payload, ctx, data: ClientData, apply):
        """released: the client's own ``P_k`` (``get_teacher_prototype``), kept in its round context."""
        return {"prototypes": class_prototypes(data.teacher["logits"], data.y, num_classes)[0]}

    def local_loss(params, batch, payload, ctx, apply):
        x, y, w = batch["x"], batch["y"], batch["w"]
        z = apply(params, x)
        z_teacher = batch["teacher"]["logits"].detach()
        protos = None if not similarity else ctx["prototypes"] if released else payload["prototypes"]
        per_sample, keep = csd_terms(
            z, z_teacher, y, protos, hp.tau, similarity, hp.mask, hp.detach_similarity, released
        )
        csd = (per_sample * keep * w).sum()
        loss = ce_weight * weighted_ce(z, y, w) + hp.mu * csd
        return loss, {"fedcsd_mask_filtered": ((1.0 - keep) * w).sum().detach()}

    def aggregate(state, uploads, weights, info):
        new = fedavg_aggregate(state, uploads, weights, info)
        g = new["params"]
        if hp.teacher == "last_global":
            return {**new, "teacher": g}
        return {**new, "teacher": tree_map(lambda t, p: hp.a * t + (1.0 - hp.a) * p, state["teacher"], g)}

    return Algorithm(
        name="fedcsd",
        hparams=hp,
        local_loss=local_loss,
        init_server=init_server,
        broadcast=broadcast,
        client_summary=None if released else client_summary,
        pre_combine=None if released else pre_combine,
        client_start=own_prototypes if released and similarity else None,
        teacher=teacher,
        aggregate=aggregate,
    )
