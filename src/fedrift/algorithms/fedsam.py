"""FedSAM and FedASAM: FedAvg with sharpness-aware local steps.

FedSAM (Qu et al., ICML 2022, "Generalized Federated Learning via Sharpness Aware
Minimization"; Caldarola et al., ECCV 2022, "Improving Generalization in Federated Learning
by Seeking Flat Minima") runs SAM (Foret et al. 2021, eq. 2-3) as the local optimiser's
gradient: at each local step, with ``g = grad L_B(w)`` on the step's batch ``B``,

    ``e = rho g / ||g||``                                  (SAM)
    ``e = rho T_w^2 g / ||T_w g||``, ``T_w = |w| + eta``    (ASAM, Kwon et al. 2021, eq. 8-9)

and the step uses ``grad L_B(w + e)`` (``e`` a constant) in place of ``grad L_B(w)``.
FedASAM (Caldarola et al.) is the same with ASAM's adaptive ``e``. ``T_w`` is elementwise
and, as in ASAM's released code (``SamsungLabs/ASAM``, ``asam.py``), applies to the tensors
whose name contains ``weight``; other tensors (biases) use ``T_w = 1``. ``||.||`` is the norm
over all parameter tensors together, plus ``1e-12`` so a zero gradient gives ``e = 0``
rather than NaN. Server: FedAvg's average.

How the two gradients are one: ``local_loss`` takes the first gradient with a nested
``torch.func.grad`` at the detached parameters, forms ``e`` (detached) and returns the loss at
``w + e``; the engine's gradient of that with respect to ``w`` is ``grad L_B(w + e)``. So the
batched executor vectorises both evaluations like any other loss (the nested grad runs
under its ``vmap``), and no Python branch or ``.item()`` reads a tensor. The loss reported
per step is ``L_B(w + e)``; ``objective`` (personalisation) is the plain loss at ``w``.

``rho = 0`` builds FedAvg's loss, so the result is FedAvg's bit for bit. Defaults: FedSAM
``rho = 0.05`` (SAM's default, Foret et al.), FedASAM ``rho = 0.5``, ``eta = 0.01`` (ASAM's
code's defaults); the tuning spaces cover the values the FL papers report per dataset.
Cost: two forward and backward passes per local step.

Interaction with the train section: the local optimiser (``train.optimizer``, momentum,
``train.weight_decay``, ``train.clip_grad_norm``) acts on the returned gradient
``grad L_B(w + e)``: clipping clips it, weight decay adds ``wd w`` at the unperturbed ``w``
(as torch's SGD does behind SAM's two-step optimiser); ``e`` is formed from the data
gradient alone, without decay or clipping, as in SAM's code. A BatchNorm model
(``model.norm: batch``) passes both forward passes through train mode, so its running
statistics take two updates a step, the second from the first's result (SAM's code skips
the second); GroupNorm, the default, has none.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Params, Setup, term_off
from fedrift.algorithms.fedavg import ce_loss
from fedrift.params import params

NORM_EPS = 1e-12  # added to ||g|| (||T_w g||): a zero gradient perturbs nothing


@params
class FedSAMParams(AlgorithmParams):
    """FedSAM's options (Qu et al. 2022; Caldarola et al. 2022).

    rho: radius of the perturbation ``e = rho g / ||g||`` (0 gives FedAvg exactly).
    """

    rho: Annotated[float, Field(ge=0)] = 0.05


@params
class FedASAMParams(AlgorithmParams):
    """FedASAM's options (Caldarola et al. 2022, with ASAM of Kwon et al. 2021).

    rho: radius of the adaptive perturbation ``e = rho T_w^2 g / ||T_w g||`` (0 gives FedAvg
        exactly).
    eta: ASAM's offset in ``T_w = |w| + eta`` (keeps zero weights perturbable).
    """

    rho: Annotated[float, Field(ge=0)] = 0.5
    eta: Annotated[float, Field(ge=0)] = 0.01


def scaled(name: str) -> bool:
    """Whether ASAM's ``T_w`` applies to a tensor: weights yes, biases no (ASAM's code)."""
    return "weight" in name


def perturbation(grads: Params, weights: Params, rho: float, eta: float | None = None) -> Params:
    """``e = rho g / (||g|| + eps)`` (SAM), or with ``eta`` given ASAM's
    ``e = rho T_w^2 g / (||T_w g|| + eps)`` with ``T_w = |w| + eta`` on the tensors ``scaled``
    picks. Pure tensor code (vmap-safe); the norm runs over every tensor together."""
    if eta is None:
        t = {k: None for k in grads}
    else:
        t = {k: weights[k].abs() + eta if scaled(k) else None for k in grads}
    tg = {k: g if t[k] is None else t[k] * g for k, g in grads.items()}
    norm = torch.stack([v.pow(2).sum() for v in tg.values()]).sum().sqrt() + NORM_EPS
    return {k: rho * (v if t[k] is None else t[k] * v) / norm for k, v in tg.items()}


def sharpness_aware(base_loss, rho: float, eta: float | None):
    """A ``local_loss`` whose gradient is ``grad base(w + e)`` with ``e`` from ``perturbation``
    at ``w`` (a constant)."""

    def local_loss(params, batch, payload, ctx, apply):
        w = {k: v.detach() for k, v in params.items()}
        g = torch.func.grad(lambda p: base_loss(p, batch, payload, ctx, apply)[0])(w)
        e = perturbation(g, w, rho, eta)
        shifted = {k: v + e[k].detach() for k, v in params.items()}
        return base_loss(shifted, batch, payload, ctx, apply)

    return local_loss


@ALGORITHMS.register(
    "fedsam", "FedSAM: local SAM steps, the gradient at w + rho g/||g||", FedSAMParams,
    space={"rho": "log:0.005:0.5"},
)
def fedsam(hp: FedSAMParams, setup: Setup) -> Algorithm:
    if term_off(hp.rho):  # FedAvg, exactly: no perturbation, one gradient
        return Algorithm(name="fedsam", hparams=hp, local_loss=ce_loss)
    return Algorithm(name="fedsam", hparams=hp, local_loss=sharpness_aware(ce_loss, hp.rho, None), objective=ce_loss)


@ALGORITHMS.register(
    "fedasam", "FedASAM: local adaptive SAM steps, e = rho T^2 g/||T g||, T = |w| + eta", FedASAMParams,
    space={"rho": "log:0.05:2", "eta": "log:0.001:0.5"},
)
def fedasam(hp: FedASAMParams, setup: Setup) -> Algorithm:
    if term_off(hp.rho):  # FedAvg, exactly
        return Algorithm(name="fedasam", hparams=hp, local_loss=ce_loss)
    return Algorithm(name="fedasam", hparams=hp, local_loss=sharpness_aware(ce_loss, hp.rho, hp.eta), objective=ce_loss)
