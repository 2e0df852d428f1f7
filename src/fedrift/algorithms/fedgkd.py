"""FedGKD family (Yao et al., "FedGKD: Toward Heterogeneous Federated Learning via Global
Knowledge Distillation"; papers/003, eq. 3-5, Algorithm 1): ``fedgkd``, ``fedgkd_vote``,
``fedgkd_plus``.

The server keeps a buffer of the last ``M`` global models ``w_t, ..., w_{t-M+1}``, most
recent first, where ``w_t`` is the model round ``t`` produced (fewer at the start). As in the
paper and the authors' released code the buffer never holds the untrained initial model
``w_0``: it is empty in round 1, holds ``w_1`` in round 2 (round 2's teacher is ``w_1``, not
``(w_0 + w_1)/2``), and so on (``buffer_initial: true`` restores fedrift's former buffer,
which started with ``w_0``). Every variant trains locally on ``CE`` plus a distillation term
towards teacher logits computed without gradient, and aggregates parameters as FedAvg does.
The teacher logits come from the ``teacher`` hook (per sample, so the engine computes them
once a round and hands them to each step as ``batch["teacher"]``; ``.detach()`` keeps them
constants either way).

- ``fedgkd`` (eq. 4): teacher ``w_bar = (1/n) sum_m w_{t-m+1}``, the parameter average of the
  ``n <= M`` buffered models; loss ``CE + (gamma/2) T^2 KL(softmax(f(w_bar;x)/T) || softmax(f(w;x)/T))``.
  The payload carries ``w_t`` and ``w_bar``: 2x FedAvg's downlink when more than one model is
  buffered, 1x when at most one is (``M=1``, and rounds 1 and 2), because ``w_bar`` then *is*
  ``w_t``, the very same tensors, which the engine's byte count sends once.
- ``fedgkd_vote`` (eq. 5): ``CE + sum_m (gamma_m/2) T^2 KL(softmax(f(w_{t-m+1};x)/T) || softmax(f(w;x)/T))``
  with ``gamma_m/2 = lam softmax_m(-L_m / beta)``, ``beta = 1/M`` (the paper's choice, section
  "Hyper-parameters"), ``L_m`` the mean cross-entropy of buffered model ``m`` on validation
  data. Where it is measured is ``vote_loss`` (ALGORITHMS.md's decision):

  - ``server`` (the paper's and the released code's form): on the training samples the server
    holds (``partition.holdout``, never a client's). Each global model is scored once, in the
    aggregation that makes it (one forward pass over the held-out samples a round, on the
    server); its ``L_m`` stays in the server state (``vote_losses``, most recent first) for
    the ``M`` rounds the model stays buffered, and the broadcast sends the ``n`` weights
    ``gamma_m/2`` with the buffer (``vote_coef``: ``n`` floats of the model's dtype, counted
    in the downlink). Every client distils with the same weights.
  - ``client``: each client measures ``L_m`` on its own training data before local training
    (in ``client_start``, from the round's teacher table, which already holds every buffered
    model's logits). The weights are then client-specific: at ``beta = 0.2`` a loss gap of
    0.46 between two teachers is already a 10x weight ratio on that client.
  - ``auto`` (default): ``server`` when the run holds server data (``partition.holdout > 0``),
    else ``client``. ``server`` on a run without held-out data is refused when the algorithm
    is built (ConfigError naming ``algorithm.vote_loss`` and ``partition.holdout``). The
    resolved form is the built algorithm's ``hparams.vote_loss``.

  The payload carries every buffered model (``w_t`` is the first: Mx FedAvg's downlink once
  the buffer is full). Follows the paper: the authors' released Vote branch is unreachable and
  computes its KL under ``no_grad``.
- ``fedgkd_plus``: ``fedgkd`` on a model with MOON's projection head (model option
  ``projection_dim``), distilling the final logits. A model without the head is refused
  with a ConfigError that names the override to add, ``model.projection_dim=256`` (the
  released code's width), when the algorithm is built, before anything is written
  (``Setup.projection_dim``). The algorithm does not pick the width itself: the model section
  is built before, and independently of, the algorithm, and a head that appears with the
  algorithm's name would compare ``fedgkd`` and ``fedgkd_plus`` on different architectures
  without the config saying so (grids give it per entry: ``fedgkd_plus:model.projection_dim=256``).

As in the authors' released code: no distillation in round 1 (there is no buffered model
yet) - the payload's ``kd_on`` is 0.0 in round 1 and 1.0 after, so the loss code has no
branch, and round 1's teacher slot holds ``w_t`` itself (the same tensors, no extra bytes);
local SGD momentum 0.9 reset every round (the engine's default); optional gradient-norm
clipping is the engine's ``train.clip_grad_norm`` (their code uses 10).
Their teacher averages normalisation buffers too and runs in eval mode: fedrift's models
have no buffers and no train/eval difference (GroupNorm, no dropout), so both are moot here.

Decisions where paper and spec are silent:

- ``beta = 1/M`` uses the configured buffer size ``M`` in every round, also while fewer
  models are buffered: ``beta`` is a temperature set once (the paper: "for simplicity"), and
  re-scaling it as the buffer fills would sharpen the weights for no stated reason.
- Vote's server split is the whole of ``partition.holdout``, labels used; not the clients'
  validation splits (``partition.val_share``): those belong to the clients in a deployment,
  and they select models (``fedrift tune``), which training must not see.
- ``kd_loss: mse`` (paper Table 9) replaces ``T^2 KL`` by ``logit_mse`` (the squared logit
  difference averaged over classes and samples, as the released code's ``F.mse_loss``), with
  the same weights (``gamma/2``, or ``gamma_m/2`` for Vote) and no temperature.
- ``kd_on`` is a Python float, not a tensor: the round number is known to every client, so
  it costs no downlink bytes; multiplying by it is vmap- and grad-safe.
- The term actually added to the loss (weights and ``kd_on`` included) is reported per
  round as ``fedgkd_kd``.
"""

from __future__ import annotations

from typing import Annotated, Callable, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import (
    FEDAVG_SUMS, Algorithm, AlgorithmParams, ClientData, Params, RoundInfo, Setup, Tree, require_projection)
from fedrift.algorithms.terms import CHUNK, kl_to_target, logit_mse, weighted_ce
from fedrift.errors import ConfigError
from fedrift.params import params, with_options



@params
class FedGKDBaseParams(AlgorithmParams):
    """Options of every FedGKD variant (papers/003).

    M: buffer size, the number of latest global models kept (5 for CV in the paper).
    T: distillation temperature (the paper's eq. 4 has none, i.e. 1; the temperature form is
        from its LaTeX source).
    kd_loss: ``kl`` (eq. 4-5) or ``mse`` on the logits (paper Table 9; no temperature).
    buffer_initial: also buffer the untrained initial model ``w_0`` (false, as the paper and
        the released code; true is fedrift's former behaviour: round 2's teacher ``(w_0 + w_1)/2``).
    """

    M: Annotated[int, Field(ge=1)] = 5
    T: Annotated[float, Field(gt=0)] = 1.0
    kd_loss: Literal["kl", "mse"] = "kl"
    buffer_initial: bool = False


@params
class FedGKDParams(FedGKDBaseParams):
    """FedGKD / FedGKD+ options: the above, and

    gamma: distillation weight; the loss adds ``(gamma/2) T^2 KL`` (0 gives FedAvg exactly;
        0.2 for ResNet-8 in the paper, the released code's ``distillation_coefficient`` 0.1
        is ``gamma/2``).
    """

    gamma: Annotated[float, Field(ge=0)] = 0.2


@params
class FedGKDVoteParams(FedGKDBaseParams):
    """FedGKD-Vote options: the above, and

    lam: scale of the per-model weights, ``gamma_m/2 = lam softmax_m(-L_m M)`` (0 gives FedAvg
        exactly; 0.1 in the paper).
    vote_loss: where ``L_m`` is measured: ``server`` (the paper's validation loss: on the
        server's held-out samples, ``partition.holdout``, weights sent with the buffer),
        ``client`` (each client's own training data, client-specific weights), or ``auto``
        (``server`` when the run holds server data, else ``client``).
    """

    lam: Annotated[float, Field(ge=0)] = 0.1
    vote_loss: Literal["auto", "server", "client"] = "auto"


# ---------------------------------------------------------------------------------------
# Pure pieces (tested on their own)


def average_params(models: list[Params]) -> Params:
    """The parameter average ``(1/n) sum_m w_m`` of ``n`` same-structured models."""
    return {k: torch.stack([m[k] for m in models]).mean(0) for k in models[0]}


def buffered(buffer: dict[str, Params]) -> list[Params]:
    """The models of a buffer tree ``{"0": w_t, "1": w_{t-1}, ...}`` as a list, most recent first."""
    return [buffer[str(i)] for i in range(len(buffer))]


def as_buffer(models: list[Params]) -> dict[str, Params]:
    """A list of models as the server state's buffer tree: ``{"0": w_t, "1": w_{t-1}, ...}``."""
    return {str(i): m for i, m in enumerate(models)}


def distillation(student: torch.Tensor, teacher: torch.Tensor, w: torch.Tensor, T: float, kind: str) -> torch.Tensor:
    """``sum_i w_i T^2 KL(softmax(teacher_i/T) || softmax(student_i/T))`` (``kl``) or
    ``logit_mse(student, teacher, w)`` (``mse``); ``teacher`` must already be a constant."""
    if kind == "mse":
        return logit_mse(student, teacher, w)
    return T * T * kl_to_target(torch.softmax(teacher / T, dim=-1), student, w, T)


def vote_coefficients(losses: torch.Tensor, lam: float, beta: float) -> torch.Tensor:
    """``gamma_m / 2 = lam softmax_m(-L_m / beta)``: lower loss, larger weight; they sum to ``lam``."""
    return lam * torch.softmax(-losses / beta, dim=-1)


@torch.no_grad()
def mean_ce(apply: Callable, params_: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A model's mean cross-entropy on ``(x, y)``, shape (1,): per-chunk sums over all samples."""
    total = sum(F.cross_entropy(apply(params_, xc), yc, reduction="sum") for xc, yc in zip(x.split(CHUNK), y.split(CHUNK)))
    return (total / len(y)).reshape(1)


def kd_switch(info: RoundInfo) -> float:
    """1.0 from round 2 on; 0.0 in round 1, which has no buffered model to distil from."""
    return 0.0 if info.round <= 1 else 1.0


# ---------------------------------------------------------------------------------------
# The algorithms


def _init_buffer(buffer_initial: bool):
    def init_server(global_params: Params) -> Tree:
        # w_0 buffered only on request; then the buffer's first model and the global model are the same tensors
        return {"params": global_params, "buffer": as_buffer([global_params] if buffer_initial else [])}

    return init_server


def _push(state: Tree, new: Params, M: int) -> Tree:
    """The state with ``new`` as the global model and the buffer's first (oldest beyond M dropped)."""
    return {**state, "params": new, "buffer": as_buffer([new, *buffered(state["buffer"])[: M - 1]])}


def _teachers(state: Tree) -> dict[str, Params]:
    """The buffer as the broadcast sends it; round 1's empty one as ``w_t`` itself (KD is off then)."""
    return state["buffer"] if state["buffer"] else {"0": state["params"]}


def _fedgkd(name: str, hp: FedGKDParams) -> Algorithm:
    weight = hp.gamma / 2

    def broadcast(state, info):
        models = buffered(state["buffer"])
        # At most one buffered model: the teacher is w_t itself (same tensors, sent once).
        teacher = state["params"] if len(models) <= 1 else average_params(models)
        return {"params": state["params"], "teacher": teacher, "kd_on": kd_switch(info)}

    def teacher(payload, x, apply):
        return {"logits": apply(payload["teacher"], x)}

    def local_loss(params, batch, payload, ctx, apply):
        x, y, w = batch["x"], batch["y"], batch["w"]
        z = apply(params, x)
        z_teacher = batch["teacher"]["logits"].detach()
        kd = payload["kd_on"] * weight * distillation(z, z_teacher, w, hp.T, hp.kd_loss)
        return weighted_ce(z, y, w) + kd, {"fedgkd_kd": kd}

    return Algorithm(
        name=name,
        hparams=hp,
        local_loss=local_loss,
        init_server=_init_buffer(hp.buffer_initial),
        broadcast=broadcast,
        teacher=teacher,
        sums=FEDAVG_SUMS,
        aggregate_sums=lambda state, sums, info: _push(state, sums["params"], hp.M),
        same_as_fedavg_until=1,  # no distillation in round 1 (kd_switch)
    )


@ALGORITHMS.register(
    "fedgkd", "FedGKD: CE + (gamma/2) T^2 KL to the average of the last M global models", FedGKDParams,
    space={"gamma": "log:0.01:1"},
)
def fedgkd(hp: FedGKDParams, setup: Setup) -> Algorithm:
    return _fedgkd("fedgkd", hp)


@ALGORITHMS.register(
    "fedgkd_plus", "FedGKD+: FedGKD on a model with a projection head (needs model.projection_dim=256)", FedGKDParams,
    space={"gamma": "log:0.01:1"},
)
def fedgkd_plus(hp: FedGKDParams, setup: Setup) -> Algorithm:
    require_projection("fedgkd_plus", setup)  # refused before anything is written
    return _fedgkd("fedgkd_plus", hp)


def vote_loss_form(hp: FedGKDVoteParams, setup: Setup) -> Literal["server", "client"]:
    """``hp.vote_loss`` resolved for this run (``auto``: ``server`` when the server holds
    samples); ``server`` without any is refused."""
    held = setup.holdout_x is not None and setup.holdout_y is not None and len(setup.holdout_y) > 0
    if hp.vote_loss == "auto":
        return "server" if held else "client"
    if hp.vote_loss == "server" and not held:
        raise ConfigError(
            "algorithm.vote_loss: server scores the buffered models on samples the server holds and this run "
            "holds none; allowed: client or auto, or set partition.holdout to a share of the training set (e.g. 0.1)"
        )
    return hp.vote_loss


@ALGORITHMS.register(
    "fedgkd_vote",
    "FedGKD-Vote: CE + KL to each of the last M global models, weighted by their validation loss",
    FedGKDVoteParams,
    space={"lam": "log:0.01:1"},
)
def fedgkd_vote(hp: FedGKDVoteParams, setup: Setup) -> Algorithm:
    hp = with_options(hp, vote_loss=vote_loss_form(hp, setup))  # the built algorithm says which form runs
    beta = 1.0 / hp.M  # the configured M, also while the buffer fills (see module docstring)

    def teacher(payload, x, apply):
        # (n, m, C): the logits of every buffered model, w_t first
        return {"logits": torch.stack([apply(m, x) for m in buffered(payload["teachers"])], dim=1)}

    def vote_kd(z, batch, coef):
        """``sum_m coef_m T^2 KL_m`` (or MSE) to every buffered model's logits."""
        z_teachers = batch["teacher"]["logits"].detach()
        div = torch.stack(
            [distillation(z, z_teachers[:, m], batch["w"], hp.T, hp.kd_loss) for m in range(z_teachers.shape[1])]
        )
        return (coef * div).sum()

    if hp.vote_loss == "client":
        def broadcast(state, info):
            # buffer["0"] is state["params"]: w_t goes down once.
            return {"params": state["params"], "teachers": _teachers(state), "kd_on": kd_switch(info)}

        def client_start(payload, ctx, data: ClientData, apply):
            # L_m from the round's teacher table, which already holds every buffered model's logits
            logits = data.teacher["logits"]  # (n, m, C)
            target = data.y[:, None].expand(-1, logits.shape[1])
            losses = F.cross_entropy(logits.transpose(1, 2), target, reduction="none").mean(0)
            return {"vote_coef": vote_coefficients(losses, hp.lam, beta)}

        def local_loss(params, batch, payload, ctx, apply):
            z = apply(params, batch["x"])
            kd = payload["kd_on"] * vote_kd(z, batch, ctx["vote_coef"])
            return weighted_ce(z, batch["y"], batch["w"]) + kd, {"fedgkd_kd": kd}

        return Algorithm(
            name="fedgkd_vote", hparams=hp, local_loss=local_loss, init_server=_init_buffer(hp.buffer_initial),
            broadcast=broadcast, client_start=client_start, teacher=teacher, sums=FEDAVG_SUMS,
            aggregate_sums=lambda state, sums, info: _push(state, sums["params"], hp.M),
        )

    # server: L_m on the held-out samples, scored once per model, as it enters the buffer
    held_x, held_y = setup.holdout_x, setup.holdout_y

    def score(model: Params) -> torch.Tensor:
        if setup.apply is None:
            raise ValueError("fedgkd_vote: Setup.apply is needed to score the buffered models on the server")
        return mean_ce(setup.apply, model, held_x, held_y)

    def init_server(global_params: Params) -> Tree:
        state = _init_buffer(hp.buffer_initial)(global_params)
        first = next(iter(global_params.values()))
        return {**state, "vote_losses": score(global_params) if hp.buffer_initial else first.new_zeros(0)}

    def aggregate_sums(state, sums, info):
        new = sums["params"]
        return {**_push(state, new, hp.M), "vote_losses": torch.cat([score(new), state["vote_losses"][: hp.M - 1]])}

    def broadcast(state, info):
        losses = state["vote_losses"]
        # round 1 without w_0: one slot, w_t itself, weight lam (softmax of one loss); KD is off
        coef = vote_coefficients(losses, hp.lam, beta) if len(losses) else losses.new_full((1,), hp.lam)
        return {"params": state["params"], "teachers": _teachers(state), "kd_on": kd_switch(info), "vote_coef": coef}

    def local_loss(params, batch, payload, ctx, apply):
        z = apply(params, batch["x"])
        kd = payload["kd_on"] * vote_kd(z, batch, payload["vote_coef"])
        return weighted_ce(z, batch["y"], batch["w"]) + kd, {"fedgkd_kd": kd}

    return Algorithm(
        name="fedgkd_vote", hparams=hp, local_loss=local_loss, init_server=init_server, broadcast=broadcast,
        teacher=teacher, sums=FEDAVG_SUMS, aggregate_sums=aggregate_sums,
    )
