"""FedADC and FedADC+ (papers/004_..., Algorithms 3 and 4, eq. 6-9).

FedADC embeds SlowMo's server momentum into the local steps. The server keeps a momentum
``m`` (zero-initialised) and sends ``w_t`` and ``m_t`` (two models down per client). Each
client ``k`` uses ``m_bar = beta_local m_t / H_k`` (``H_k``: its local steps this round), so
that over a round the momentum adds exactly ``beta_local m_t`` to its model change:

- ``heavy_ball`` (the paper's blue): ``w <- w - eta (g(w) + m_bar)``;
- ``nesterov`` (red): ``w_half = w - eta m_bar``; ``w <- w_half - eta g(w_half)``. The loss is
  evaluated at ``w - eta m_bar`` (so its gradient is ``g(w_half)``) and ``m_bar`` is added to
  that gradient, which is the same step;
- ``double_momentum`` (Algorithm 4): a local momentum ``m_k^1 = g^1``,
  ``m_k^tau = phi m_k^{tau-1} + (1 - phi) g^tau`` and ``w <- w - eta (m_bar + m_k^tau)``.

Server, with ``D = (1/eta) sum_k p_k (w_t - w_k)``: ``m_{t+1} = D + (beta_global - beta_local)
m_t`` (heavy_ball, nesterov) or ``m_{t+1} = D`` (double_momentum), then
``w_{t+1} = w_t - alpha eta m_{t+1}`` (computed as in :mod:`fedrift.algorithms.slowmo`, so that
``beta = 0, alpha = 1`` with heavy_ball is FedAvg without local momentum bit for bit).
Aggregation weights are ``p_k`` by samples like every method; ``aggregation: uniform`` gives
the paper's plain mean.

FedADC+ adds self-confidence distillation (eq. 7-9) to the local loss:
``(1 - lam) CE + lam KL(p_hat || softmax(z / T))`` with the target from
:func:`self_confidence_target` and the round's global model as teacher. The paper states no
temperature and writes no ``T^2``; ``T_squared: true`` scales the KL by ``T^2``, the form of
cs-kd, which FedADC+ follows (cs-kd runs ``T=4``): ``algorithm.T=4 algorithm.T_squared=true``.

Personalisation (``eval.personalize_loss: algorithm``) takes the loss alone (``objective``:
the base loss at ``w``, without the Nesterov shift), never the embedded momentum or this
optimiser (ALGORITHMS.md).

Local optimiser: the algorithm brings its own (``train.momentum`` is not used; local
momentum exists only in ``double_momentum``). ``eta`` is ``train.lr`` (under
``train.lr_schedule`` the round's, in the local steps, the Nesterov shift and the server step
alike, as SlowMo's). ``train.weight_decay``
is added to the gradient as in SGD, ``g = grad f + wd w`` (at ``w_half`` for nesterov, so
``g`` is the gradient of the decayed objective at the point the paper evaluates it), and
``train.clip_grad_norm`` clips the data gradient before decay, as torch does; neither
touches ``m_bar``.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

import torch
import torch.nn.functional as F
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import FEDAVG_SUMS, Algorithm, AlgorithmParams, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.slowmo import momentum_server, server_momentum_step
from fedrift.algorithms.terms import kl_to_target, weighted_ce
from fedrift.functional.optim import Transform, add_decay, chain, clip_by_global_norm, scale
from fedrift.functional.tree import leaves, tree_map
from fedrift.errors import ConfigError
from fedrift.params import params

Beta = Annotated[float, Field(ge=0, lt=1)]


@params
class FedADCParams(AlgorithmParams):
    """FedADC's options (papers/004_..., Algorithms 3 and 4).

    variant: ``heavy_ball`` (Alg. 3 blue), ``nesterov`` (Alg. 3 red) or ``double_momentum`` (Alg. 4).
    beta: momentum coefficient, the default of both ``beta_local`` and ``beta_global``.
    beta_local: share of ``m_t`` spread over the local steps (``m_bar = beta_local m_t / H_k``);
        None: ``beta``.
    beta_global: server momentum ``m_{t+1} = D + (beta_global - beta_local) m_t``; None:
        ``beta``. Not used by ``double_momentum`` (its server sets ``m_{t+1} = D``).
    alpha: server learning rate, a multiple of the local ``eta``.
    phi: local momentum coefficient of ``double_momentum``.
    """

    variant: Literal["heavy_ball", "nesterov", "double_momentum"] = "heavy_ball"
    beta: Beta = 0.9
    beta_local: Optional[Beta] = None
    beta_global: Optional[Beta] = None
    alpha: Annotated[float, Field(gt=0)] = 1.0
    phi: Beta = 0.9


@params
class FedADCPlusParams(FedADCParams):
    """FedADC+ = FedADC's options plus self-confidence distillation (eq. 7-9).

    lam: weight of the KL term, loss ``(1 - lam) CE + lam KL``; 0 gives FedADC exactly.
    T: temperature of the student and the teacher softmax (the paper states none).
    T_squared: ``false`` (default) is eq. 7 as written, ``lam KL``; ``true`` is cs-kd's form,
        ``lam T^2 KL``, which keeps the KL's gradient on the scale of CE's as ``T`` grows (cs-kd
        uses ``T=4``). Equal at ``T=1``.
    """

    lam: Annotated[float, Field(ge=0, le=1)] = 0.35
    T: Annotated[float, Field(gt=0)] = 1.0
    T_squared: bool = False


def self_confidence_target(global_probs: torch.Tensor, y: torch.Tensor, label_counts: torch.Tensor) -> torch.Tensor:
    """The self-confidence target ``p_hat`` (eq. 8-9), one row per sample.

    ``rho_i = gamma_i / max_j gamma_j`` from the client's class counts (``label_counts``, C);
    ``p_hat_i = (1 - rho_i) p~_i`` for ``i != y`` and ``p_hat_y = 1 - sum_{i != y} (1 - rho_i) p~_i``,
    with ``p~ = global_probs`` (B x C, rows summing to 1). Rows of ``p_hat`` sum to 1; a client
    holding every class equally (``rho = 1``) gets the one-hot label. Pure and vmap-safe.
    """
    counts = label_counts.to(global_probs.dtype)
    rho = counts / counts.amax(-1, keepdim=True).clamp_min(torch.finfo(counts.dtype).tiny)
    classes = torch.arange(global_probs.shape[-1], device=global_probs.device)
    true = (y.unsqueeze(-1) == classes).to(global_probs.dtype)
    off = (1.0 - rho) * global_probs * (1.0 - true)
    return off + true * (1.0 - off.sum(-1, keepdim=True))


def local_momentum(phi: float) -> Transform:
    """Algorithm 4's local momentum: ``m^1 = u^1``, ``m^tau = phi m^{tau-1} + (1 - phi) u^tau``.

    The state carries a step counter, so the first step is picked by ``torch.where`` (no
    Python branch on tensors). FedADC feeds it ``u = g + m_bar``; since the weights of this
    average sum to 1 and ``m_bar`` is constant within a round, the output is
    ``m_k^tau + m_bar``, the paper's step direction.
    """

    def init(params: dict) -> dict:
        return {"count": leaves(params)[0].new_zeros(()), "m": tree_map(torch.zeros_like, params)}

    def update(grads: dict, state: dict, params: dict) -> tuple[dict, dict]:
        first = state["count"] == 0
        m = tree_map(lambda b, g: torch.where(first, g, phi * b + (1.0 - phi) * g), state["m"], grads)
        return m, {"count": state["count"] + 1, "m": m}

    return Transform(init, update)


def _fedadc(name: str, hp: FedADCParams, setup: Setup, base_loss, teacher=None) -> Algorithm:
    lr, wd = setup.lr, setup.weight_decay
    beta_local = hp.beta if hp.beta_local is None else hp.beta_local
    beta_global = hp.beta if hp.beta_global is None else hp.beta_global
    if hp.variant == "double_momentum" and hp.beta_global is not None:
        raise ConfigError(
            "algorithm.beta_global: not used by variant double_momentum (its server sets m_{t+1} = D); "
            "allowed: leave it unset, or use variant heavy_ball or nesterov"
        )
    server_beta = 0.0 if hp.variant == "double_momentum" else beta_global - beta_local
    nesterov = hp.variant == "nesterov"
    clip = clip_by_global_norm(setup.clip_grad_norm) if setup.clip_grad_norm is not None else None

    def broadcast(state: Tree, info: RoundInfo) -> Tree:
        return {"params": state["params"], "momentum": state["momentum"]}

    def client_start(payload: Tree, ctx: Tree, data, apply) -> Tree:
        steps = ctx["num_steps"]
        return {"m_bar": tree_map(lambda m: beta_local * m / steps, payload["momentum"])}

    def point(params: dict, ctx: Tree) -> dict:
        """Where the gradient is taken: ``w``, or ``w_half = w - eta m_bar`` for nesterov."""
        if not nesterov:
            return params
        return tree_map(lambda p, m: p - lr * m, params, ctx["m_bar"])

    def local_loss(params, batch, payload, ctx, apply):
        return base_loss(point(params, ctx), batch, payload, ctx, apply)

    def grad_correction(grads, params, payload, ctx):
        if clip is not None:
            grads, _ = clip.update(grads, (), params)
        grads = add_decay(grads, point(params, ctx), wd)
        return tree_map(lambda g, m: g + m, grads, ctx["m_bar"])

    def aggregate_sums(state: Tree, sums: Tree, info: RoundInfo) -> Tree:
        return server_momentum_step(state, sums["params"], lr, hp.alpha, server_beta)  # sums: FedAvg's average

    steps = [local_momentum(hp.phi)] if hp.variant == "double_momentum" else []
    return Algorithm(
        name=name,
        hparams=hp,
        local_loss=local_loss,
        objective=base_loss,  # the loss at w: no Nesterov shift (personalisation)
        teacher=teacher,
        init_server=momentum_server,
        broadcast=broadcast,
        client_start=client_start,
        grad_correction=grad_correction,
        optimizer=chain(*steps, scale(-lr)),
        sums=FEDAVG_SUMS,
        aggregate_sums=aggregate_sums,
    )


@ALGORITHMS.register(
    "fedadc", "FedADC: server momentum embedded in the local steps", FedADCParams,
    space={"beta": "float:0.5:0.99"},
)
def fedadc(hp: FedADCParams, setup: Setup) -> Algorithm:
    return _fedadc("fedadc", hp, setup, ce_loss)


@ALGORITHMS.register(
    "fedadc_plus", "FedADC+: FedADC + self-confidence distillation", FedADCPlusParams,
    space={"beta": "float:0.5:0.99", "lam": "float:0:1"},
)
def fedadc_plus(hp: FedADCPlusParams, setup: Setup) -> Algorithm:
    lam, T = hp.lam, hp.T

    def loss(params, batch, payload, ctx, apply):
        x, y, w = batch["x"], batch["y"], batch["w"]
        logits = apply(params, x)
        ce = weighted_ce(logits, y, w)
        teacher = F.softmax(batch["teacher"]["logits"].detach() / T, dim=-1)
        target = self_confidence_target(teacher, y, ctx["label_counts"])
        kd = kl_to_target(target, logits, w, T)
        if hp.T_squared:
            kd = (T * T) * kd
        return (1.0 - lam) * ce + lam * kd, {"ce_loss": ce, "kd_loss": kd}

    def teacher(payload, x, apply):  # the round's global model w_t, fixed all round: cacheable
        return {"logits": apply(payload["params"], x)}

    return _fedadc("fedadc_plus", hp, setup, loss, teacher)
