"""FedDC (Gao, Fu, Li, Chen, Xu, Xu, CVPR 2022, "FedDC: Federated Learning with Non-IID Data
via Local Drift Decoupling and Correction"): a local drift variable per client, and
SCAFFOLD's gradient correction.

Client ``i`` keeps two model-shaped variables (client state, zero for a client never
sampled): its local drift ``h_i`` and its control ``G_i``; the server keeps the global control
``G`` and sends ``w_t`` and ``G`` (two models down). The local objective (the paper's
``F(theta_i; h_i, D_i, w) = L_i(theta_i) + R(theta_i; h_i, w) + G(theta_i; g_i, g)``)::

    L_i(theta) + (alpha/2) ||theta + h_i - w_t||^2 + <theta, G - G_i>

The penalty ``R`` ties the drift-corrected local model ``theta + h_i`` (not ``theta`` itself)
to the global one. The gradient correction ``G`` is written in the paper as
``(1/(eta K)) <theta, g_i - g>`` with ``g_i`` the client's previous local update and ``g`` the
mean one; the authors' code (``gaoliang13/FedDC``, ``utils_methods_FedDC.py``, ``train_FedDC``,
and ``utils_general.py``, ``train_model_FedDC``) keeps them as SCAFFOLD's option-II control
variates, ``-(g_i - g)/(eta K)`` as ``G_i - G``, and so does this module. After ``H_i`` local
steps of lr ``eta`` from ``w_t`` to ``theta_i``::

    h_i+ = h_i + (theta_i - w_t)                                   (local drift)
    G_i+ = G_i - G + (w_t - theta_i) / (H_i eta)                    (as SCAFFOLD's c_k+)

The client uploads ``theta_i`` and ``Delta G_i = G_i+ - G_i`` (two models up, like SCAFFOLD);
``h_i`` never leaves it. Server (``drift_mean: all``, the authors' code)::

    h_bar   = h_bar + (1/N) sum_{i in S_t} (theta_i - w_t)          (= (1/N) sum over ALL N clients of h_i)
    w_{t+1} = sum_i p_i theta_i + h_bar
    G       = G + (1/N) sum_{i in S_t} Delta G_i

The server knows ``h_bar`` without an extra upload: each ``h_i`` moves by exactly the client's
model change. ``drift_mean: sampled`` is the other reading (e.g. OpenFGL's FedDC):
``w_{t+1} = sum_i p_i (theta_i + h_i+)`` over the round's clients only; the client then uploads
``h_i+`` too (three models up) and the server keeps no ``h_bar``.

At ``alpha = 0`` only the penalty vanishes: the gradient correction and the drift the server
adds stay, so FedDC has no setting that equals FedAvg. What holds exactly: in a client's first
round (``h_i = 0``, ``G_i = 0``) and while ``G = 0`` (the first round), the local loss is
FedProx's with ``mu = alpha`` (FedAvg's at ``alpha = 0``), same values and gradients bit for bit,
so the first round's local models are FedProx's (FedAvg's); the round's global model is then
their average plus the mean drift (tests/algorithms/test_feddc.py checks both).

Decisions, against the authors' code. Weights ``p_i`` for the model average as every method
(their code's plain mean over the round's clients is ``aggregation: uniform``). ``K`` is the
client's own step count ``H_i`` (their ``n_minibatch`` is one count for all clients, from the
mean client size: the same for equal-size clients). Their code scales ``alpha`` and ``G`` by the
client's relative size ``N n_i / n`` (1 for equal sizes); here neither is scaled, as SCAFFOLD's
controls here. ``G``'s update is a plain mean, as SCAFFOLD's. The local optimiser is the
algorithm's own: SGD with momentum ``local_momentum`` (0, as their code), after
``train.clip_grad_norm`` and ``train.weight_decay`` on the whole gradient, penalty and correction
included (their code clips that gradient at norm 10 and decays in ``torch.optim.SGD``). That
clipping matters: on workload A (alpha 0.1) at its tuned lr 0.0514, FedDC unclipped reached
94-96% and then collapsed (one seed diverged, two ended at 24% and 55%), and with
``train.clip_grad_norm=10`` it ended at 95-97% on the same seeds (BENCHMARKS.md, "The newer
remedies on workload A"); the tables run ``feddc:train.clip_grad_norm=10``, as MOON's entry.
``alpha`` defaults to 0.01 (their CIFAR-10/100 scripts; MNIST 0.1, synthetic 0.005). Under
``train.lr_schedule``, ``eta`` in ``G_i+`` is the round's lr, as SCAFFOLD's. The local loss's
value (``train_loss``) holds all three terms; the cross-entropy alone is ``ce_loss``.
Personalisation (``objective``) takes cross-entropy plus the penalty: the correction is part of
the update rule, as SCAFFOLD's. A BatchNorm model's running statistics are left out of both
terms (the engine averages them); their entries in ``h_i`` and ``h_bar`` go unused. Privacy:
``privacy.level: client`` is refused (the upload holds ``Delta G_i``); under ``sample`` (DP-SGD)
the penalty and correction are part of each sample's clipped gradient, as FedProx's term is.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.functional.optim import sgd
from fedrift.functional.tree import tree_map, weighted_sum
from fedrift.params import params


@params
class FedDCParams(AlgorithmParams):
    """FedDC's options (Gao et al., CVPR 2022).

    alpha: weight of the drift penalty ``(alpha/2) ||theta + h_i - w_t||^2`` (the paper's alpha);
        0 drops the penalty only (the correction and the server's drift stay).
    drift_mean: which drifts the server adds to the average, ``all`` (``(1/N) sum`` over every
        client's ``h_i``, the authors' code) or ``sampled`` (``sum_i p_i h_i`` over the round's
        clients, who then upload ``h_i``).
    local_momentum: momentum of the clients' local SGD (0: off, the authors' setting).
    """

    alpha: Annotated[float, Field(ge=0)] = 0.01
    drift_mean: Literal["all", "sampled"] = "all"
    local_momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0


def drift_penalty(params: Tree, drift: Tree, anchor: Tree) -> torch.Tensor:
    """``||theta + h - w||^2`` over the trained tensors (``params``' keys: BatchNorm's running
    statistics, in ``drift`` and ``anchor`` only, are left out)."""
    return torch.stack([(p + drift[k] - anchor[k]).pow(2).sum() for k, p in params.items()]).sum()


def correction(params: Tree, control: Tree, own: Tree) -> torch.Tensor:
    """``<theta, G - G_i>``: its gradient is SCAFFOLD's correction ``G - G_i``."""
    return torch.stack([(p * (control[k] - own[k])).sum() for k, p in params.items()]).sum()


@ALGORITHMS.register(
    "feddc", "FedDC: local drift h_i, (alpha/2)||w + h_i - w_t||^2 and SCAFFOLD's gradient correction", FedDCParams,
    space={"alpha": "log:1e-3:1"},
)
def feddc(hp: FedDCParams, setup: Setup) -> Algorithm:
    alpha, lr, sampled = hp.alpha, setup.lr, hp.drift_mean == "sampled"

    def zeros(global_params: dict) -> Tree:
        zero = lambda: tree_map(torch.zeros_like, global_params)  # noqa: E731
        return {"drift": zero(), "control": zero()}

    def init_server(global_params: dict) -> Tree:
        state = {"params": global_params, "control": tree_map(torch.zeros_like, global_params)}
        return state if sampled else {**state, "drift": tree_map(torch.zeros_like, global_params)}

    def broadcast(state: Tree, info: RoundInfo) -> Tree:
        return {"params": state["params"], "control": state["control"]}

    def objective(params, batch, payload, ctx, apply):
        ce, _ = ce_loss(params, batch, payload, ctx, apply)
        return ce + 0.5 * alpha * drift_penalty(params, ctx["state"]["drift"], payload["params"]), {"ce_loss": ce}

    def local_loss(params, batch, payload, ctx, apply):
        loss, aux = objective(params, batch, payload, ctx, apply)
        return loss + correction(params, payload["control"], ctx["state"]["control"]), aux

    def client_result(payload: Tree, end_params: dict, ctx: Tree) -> tuple[Tree, Tree]:
        scale = ctx["num_steps"] * lr  # H_i eta
        w_t, state = payload["params"], ctx["state"]
        drift = tree_map(lambda h, wk, w: h + (wk - w), state["drift"], end_params, w_t)
        delta = tree_map(lambda w, wk, c: (w - wk) / scale - c, w_t, end_params, payload["control"])
        control = tree_map(lambda ck, d: ck + d, state["control"], delta)
        upload = {"params": end_params, "delta_control": delta}
        return ({**upload, "drift": drift} if sampled else upload), {"drift": drift, "control": control}

    def aggregate(state: Tree, uploads: Tree, weights: torch.Tensor, info: RoundInfo) -> Tree:
        """``drift_mean: all``: every client's drift, tracked from the round's model changes."""
        w_t, n = state["params"], info.num_clients
        drift = tree_map(lambda h, wk, w: h + (wk - w).sum(0) / n, state["drift"], uploads["params"], w_t)
        model = tree_map(lambda a, h: a + h, weighted_sum(uploads["params"], weights), drift)
        control = tree_map(lambda c, d: c + d.sum(0) / n, state["control"], uploads["delta_control"])
        return {**state, "params": model, "drift": drift, "control": control}

    def aggregate_sums(state: Tree, sums: Tree, info: RoundInfo) -> Tree:
        """``drift_mean: sampled``: the p-weighted drift-corrected models (streamed, see base)."""
        model = tree_map(lambda a, h: a + h, sums["params"], sums["drift"])
        share = len(info.sampled) / info.num_clients  # |S_t| / N
        control = tree_map(lambda c, d: c + share * d, state["control"], sums["delta_control"])
        return {**state, "params": model, "control": control}

    sums = {"params": "weights", "drift": "weights", "delta_control": "uniform"}
    server = {"sums": sums, "aggregate_sums": aggregate_sums} if sampled else {"aggregate": aggregate}
    return Algorithm(
        name="feddc",
        hparams=hp,
        local_loss=local_loss,
        objective=objective,
        init_server=init_server,
        broadcast=broadcast,
        init_client=zeros,
        optimizer=sgd(lr, hp.local_momentum, setup.weight_decay, setup.clip_grad_norm),
        client_result=client_result,
        **server,
    )
