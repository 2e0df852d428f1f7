"""Apple's pfl (0.6.0, PyTorch backend) against fedrift, each training the same work end to end:
FedAvg, FedProx, SCAFFOLD and FedAdam.

How pfl is fed (its public API only): a ``pfl.model.pytorch.PyTorchModel`` around a copy of the
work's model at fedrift's initial weights (:class:`Classifier` adds the ``loss`` and ``metrics``
methods pfl calls: the mean cross-entropy fedrift's clients minimise), ``torch.optim.SGD`` as
the local optimiser (momentum 0), a ``FederatedDataset`` of one ``Dataset`` per client (user ids
0..3, the work's client tensors) drawn by ``MinimizeReuseUserSampler`` (it cycles through the
ids: a cohort of 4 is every user, every round), ``NNTrainHyperParams(local_num_epochs,
local_learning_rate, local_batch_size=None)`` (``None``: the user's whole split, one step an
epoch), a ``SimulatedBackend`` and ``algorithm.run(...)`` for 3 central iterations; a
:class:`Snapshots` callback keeps the global model (and what else a test reads) after each
iteration, so that rounds 1 and 3 come from one run. fedrift runs the work for 1 and for 3
rounds (two runs); the global models (and SCAFFOLD's server control, FedAdam's moments) are
held to ``PEER`` after rounds 1 and 3.

Aggregation. pfl weights each user's statistics by 1 (a plain mean) unless a weighting
postprocessor says otherwise: FedAvg is compared as McMahan et al. write it, ``p_k = n_k / n``
(pfl's ``WeightByDatapoints``, fedrift's default ``aggregation: samples``); FedProx, SCAFFOLD
and FedAdam as their papers write them, a plain mean over the cohort (no postprocessor,
``aggregation: uniform``). pfl's central step is its ``central_optimizer`` on the negated mean
update: ``torch.optim.SGD(lr=1)`` is the average itself.

FedAvg and FedProx agree. SCAFFOLD departs: pfl negates the control variates (a sign error in
option II's update, and in option I's), pinned against a float64 replay of the paper's
Algorithm 1 that agrees with fedrift and, with that one sign flipped, with pfl. FedAdam departs:
pfl has no FedAdam of its own; its benchmarks pass ``torch.optim.Adam`` as the central
optimiser, which bias-corrects and starts ``v`` at 0 where Reddi et al.'s Algorithm 2 does
neither; pinned by round 1's closed form and by an Adam whose state starts where Algorithm 2's
does, which agrees with fedrift. pfl has no FedYogi or FedAdagrad (torch.optim has no Yogi, and
its Adagrad has no first moment): no rows for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from agreement import agree
from peer_work import CLIENTS, PEER, Work, config, fedrift_run, params_of, record, relative_difference, work
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.algorithm.fedprox import FedProx, FedProxParams
from pfl.algorithm.scaffold import SCAFFOLD, SCAFFOLDParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import MinimizeReuseUserSampler
from pfl.data.user_state import InMemoryUserStateStorage
from pfl.hyperparam import NNTrainHyperParams
from pfl.metrics import Metrics, StringMetricName, Weighted, get_overall_value
from pfl.model.pytorch import PyTorchModel

State = dict[str, torch.Tensor]
Keeps = Callable[[Metrics, torch.optim.Optimizer], dict[str, Any]]  # what a snapshot reads beside the model
COMPARED = [1, 3]  # the rounds compared
ROUNDS = max(COMPARED)
LOCAL_EPOCHS = 2


# ---------------------------------------------------------------------------------------
# pfl's side


class Classifier(torch.nn.Module):
    """The work's model as pfl's ``PyTorchModel`` wants it: ``loss(x, y)`` (the mean cross-entropy,
    fedrift's local loss) and ``metrics(x, y)``. Its parameters are the model's, under ``net.``."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, Weighted]:
        return {"loss": Weighted(F.cross_entropy(self.net(x), y, reduction="sum").item(), len(y))}


def named(tensors: dict[str, torch.Tensor]) -> State:
    """pfl's ``net.``-prefixed names as the model's own (fedrift's state-dict names)."""
    return {k.removeprefix("net."): v.detach().clone().cpu() for k, v in tensors.items()}


@dataclass
class Snapshots(TrainingProcessCallback):
    """A pfl callback keeping, after each central iteration, the global model (``"params"``) and
    what ``keeps(aggregate_metrics, central_optimizer)`` reads of the rest."""

    net: torch.nn.Module
    central: torch.optim.Optimizer
    keeps: Keeps
    rounds: list[dict[str, Any]] = field(default_factory=list)

    def after_central_iteration(self, aggregate_metrics: Metrics, model: Any, *,
                                central_iteration: int) -> tuple[bool, Metrics]:
        self.rounds.append({"params": named(dict(self.net.named_parameters())),
                            **self.keeps(aggregate_metrics, self.central)})
        return False, Metrics()


def users(w: Work) -> FederatedDataset:
    """The work's clients as pfl's users 0..3, every one in every cohort of 4."""
    return FederatedDataset(lambda user: Dataset(w.clients[user], user_id=user),
                            MinimizeReuseUserSampler(range(CLIENTS)))


def pfl_run(w: Work, algorithm: Any, params: NNAlgorithmParams, central: Callable[[list], torch.optim.Optimizer],
            postprocessors: list | None = None, local_epochs: int = LOCAL_EPOCHS,
            keeps: Keeps = lambda metrics, central: {}) -> list[dict[str, Any]]:
    """pfl trains the work (full-batch local SGD at the work's lr) for ``params``'s central
    iterations from fedrift's initial model, with the central optimiser ``central`` builds on the
    model's parameters; each iteration's snapshot."""
    net = Classifier(w.fresh_model())
    optimizer = central(list(net.parameters()))
    model = PyTorchModel(net, torch.optim.SGD, optimizer)
    snapshots = Snapshots(net, optimizer, keeps)
    algorithm.run(algorithm_params=params, backend=SimulatedBackend(users(w), None, postprocessors=postprocessors),
                  model=model, model_train_params=NNTrainHyperParams(local_num_epochs=local_epochs,
                                                                     local_learning_rate=w.lr, local_batch_size=None),
                  callbacks=[snapshots], send_metrics_to_platform=False)
    return snapshots.rounds


def every_user(rounds: int = ROUNDS) -> dict[str, Any]:
    """``NNAlgorithmParams``' fields for ``rounds`` iterations of one cohort of all 4 users (no
    validation cohort; pfl evaluates each user in the first iteration only, reading the model)."""
    return dict(central_num_iterations=rounds, evaluation_frequency=10**6, train_cohort_size=CLIENTS,
                val_cohort_size=None)


def sgd_average(parameters: list) -> torch.optim.Optimizer:
    """The central step that is the average: ``w + 1 x mean update``."""
    return torch.optim.SGD(parameters, lr=1.0)


# ---------------------------------------------------------------------------------------
# fedrift's side, and the comparison


def fedrift_rounds(tmp_path: Path, algorithm: dict[str, Any], *state: str) -> list[dict[str, State]]:
    """fedrift's global model and server ``state`` entries after rounds 1 and 3 (one run each)."""
    out = []
    for rounds in COMPARED:
        run = fedrift_run(config(tmp_path / f"run{rounds}", algorithm, rounds=rounds, local_epochs=LOCAL_EPOCHS))
        out.append({"params": params_of(run.global_state), **{k: params_of(run.server_state[k]) for k in state}})
    return out


def at(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The compared rounds (1 and 3) of a per-round list."""
    return [rounds[t - 1] for t in COMPARED]


def apart(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    """The largest relative difference of two sides' global models over the compared rounds."""
    return max(relative_difference(x["params"], y["params"]) for x, y in zip(a, b, strict=True))


def the_work(tmp_path: Path, algorithm: dict[str, Any], local_epochs: int = LOCAL_EPOCHS) -> Work:
    """What pfl is handed: fedrift's initial model and clients for ``algorithm``'s config."""
    return work(config(tmp_path / "work", algorithm, rounds=ROUNDS, local_epochs=local_epochs))


# ---------------------------------------------------------------------------------------
# The pairs that agree


@pytest.mark.agreement
def test_fedavg_agrees_with_pfls_federated_averaging(tmp_path: Path) -> None:
    """``FederatedAveraging`` with ``WeightByDatapoints`` (McMahan et al.'s ``p_k = n_k / n``)
    and a central SGD at lr 1 is fedrift's FedAvg (``aggregation: samples``, its default)."""
    algorithm = {"name": "fedavg"}
    w = the_work(tmp_path, algorithm)
    pfl = pfl_run(w, FederatedAveraging(), NNAlgorithmParams(**every_user()), sgd_average, [WeightByDatapoints()])
    ours = fedrift_rounds(tmp_path, algorithm)
    agree(ours, at(pfl), PEER)
    record("fedavg", "pfl", COMPARED, apart(ours, at(pfl)), "agrees")


@pytest.mark.agreement
def test_fedprox_agrees_with_pfls_fedprox(tmp_path: Path) -> None:
    """``FedProx`` with ``FedProxParams(mu=1)`` (its local loss adds ``mu/2 ||w - w_t||^2``
    summed over the parameters, as the paper and fedrift) and the plain mean of the paper's
    Algorithm 2 (no weighting postprocessor; fedrift ``aggregation: uniform``). mu is the top of
    pfl's documented range: two local steps move ``w`` little from ``w_t``, and at 1 the term
    moves the round-3 model 2e-3 of its scale from FedAvg's, 20 times ``PEER``'s bound."""
    mu = 1.0
    algorithm = {"name": "fedprox", "mu": mu, "aggregation": "uniform"}
    w = the_work(tmp_path, algorithm)
    pfl = pfl_run(w, FedProx(), FedProxParams(mu=mu, **every_user()), sgd_average)
    ours = fedrift_rounds(tmp_path, algorithm)
    agree(ours, at(pfl), PEER)
    record("fedprox", "pfl", COMPARED, apart(ours, at(pfl)), "agrees")


# ---------------------------------------------------------------------------------------
# SCAFFOLD: pfl negates the control variates


def scaffold_replay(w: Work, rounds: int, sign: float = 1.0) -> list[dict[str, State]]:
    """Karimireddy et al.'s Algorithm 1, option II, in float64 on the work: every client every
    round, ``K`` full-batch steps ``y <- y - eta (g(y) - c_k + c)``, then
    ``c_k+ = c_k - c + sign (w_t - y_k) / (K eta)`` (``sign = 1``: the paper), the model the
    plain mean of the ``y_k`` (``eta_g = 1``) and ``c <- c + (|S|/N) mean_k (c_k+ - c_k)``. The
    global model and ``c`` after each round."""
    net = w.fresh_model().double()
    x_y = [(x.double(), y) for x, y in w.clients]
    wt = {k: p.detach().clone() for k, p in net.named_parameters()}
    zeros = {k: torch.zeros_like(p) for k, p in wt.items()}
    c, ck = dict(zeros), [dict(zeros) for _ in x_y]
    steps, eta = w.local_epochs, w.lr
    share = 1.0  # |S| / N: every client every round
    out = []
    for _ in range(rounds):
        local, changes = [], []
        for k, (x, y) in enumerate(x_y):
            p = dict(wt)
            for _ in range(steps):
                live = {n: v.clone().requires_grad_(True) for n, v in p.items()}
                loss = F.cross_entropy(torch.func.functional_call(net, live, (x,)), y)
                grads = dict(zip(live, torch.autograd.grad(loss, list(live.values())), strict=True))
                p = {n: p[n] - eta * (grads[n] - ck[k][n] + c[n]) for n in p}
            change = {n: sign * (wt[n] - p[n]) / (steps * eta) - c[n] for n in p}  # c_k+ - c_k
            ck[k] = {n: ck[k][n] + change[n] for n in p}
            local.append(p)
            changes.append(change)
        wt = {n: sum(p[n] for p in local) / len(local) for n in wt}
        c = {n: c[n] + share * sum(d[n] for d in changes) / len(changes) for n in c}
        out.append({"params": wt, "control": c})
    return out


def scaffold_params(storage: InMemoryUserStateStorage, option_one: bool, rounds: int) -> SCAFFOLDParams:
    """pfl's SCAFFOLD for ``rounds`` iterations of every user, population 4 (``|S|/N = 1``)."""
    return SCAFFOLDParams(population=CLIENTS, use_gradient_as_control_variate=option_one, user_state_storage=storage,
                          **every_user(rounds))


def stored_controls(storage: InMemoryUserStateStorage) -> list[State]:
    """Each user's ``c_k`` as pfl's public user-state storage holds it."""
    return [named(dict(storage.load_state(str(user), "local_c").items())) for user in range(CLIENTS)]


def pfl_scaffold(w: Work) -> list[dict[str, Any]]:
    """pfl's ``SCAFFOLD``, option II (``use_gradient_as_control_variate=False``), on the work: its
    global model and server control after each round. The server control is read through the
    public user-state storage: with every user in every round pfl's
    ``c += (|S|/N) mean_k (c_k+ - c_k)`` is ``mean_k c_k``; its norm is held to pfl's own
    ``server_c norm`` metric."""
    storage = InMemoryUserStateStorage()

    def keeps(metrics: Metrics, central: torch.optim.Optimizer) -> dict[str, Any]:
        controls = stored_controls(storage)
        control = {n: sum(c[n] for c in controls) / CLIENTS for n in controls[0]}
        norm = float(torch.cat([v.flatten() for v in control.values()]).norm())
        reported = float(get_overall_value(metrics[StringMetricName("server_c norm")]))
        return {"control": control, "norms": (norm, reported)}

    rounds = pfl_run(w, SCAFFOLD(), scaffold_params(storage, False, ROUNDS), sgd_average, keeps=keeps)
    for r in rounds:
        agree(*r.pop("norms"), PEER)
    return rounds


SCAFFOLD_REASON = (
    "pfl departs: pfl/algorithm/scaffold.py:157 adds (w_k - w_t)/(K eta) to c_k - c (its model difference, "
    "pfl/model/pytorch.py:252, is the local model minus the global one) where SCAFFOLD's option II adds "
    "(w_t - w_k)/(K eta), and option I (scaffold.py:133) stores -g_k(w_t) for g_k(w_t); its step still adds "
    "c - c_k (pfl/internal/bridge/pytorch/scaffold.py:37), so from round 2 on the correction pushes along the drift."
)


@pytest.mark.agreement
def test_pfls_scaffold_negates_the_control_variates(tmp_path: Path) -> None:
    """Both sides pinned to their rule: a float64 replay of option II (:func:`scaffold_replay`)
    agrees with fedrift's model and server control after rounds 1 and 3; the same replay with
    ``(w_t - w_k)`` negated agrees with pfl's (``use_gradient_as_control_variate=False``), and
    the paper's does not. Round 1's models agree (every control starts at 0), with pfl's
    control fedrift's negated; by round 3 the models are far apart."""
    algorithm = {"name": "scaffold", "aggregation": "uniform"}  # the paper's plain means
    w = the_work(tmp_path, algorithm)
    paper, flipped = scaffold_replay(w, ROUNDS), scaffold_replay(w, ROUNDS, sign=-1.0)
    ours = fedrift_rounds(tmp_path, algorithm, "control")
    agree(ours, at(paper), PEER)  # fedrift is Algorithm 1

    pfl = pfl_scaffold(w)
    agree(at(pfl), at(flipped), PEER)  # pfl is Algorithm 1 with the control update's sign flipped
    with pytest.raises(AssertionError):
        agree(at(pfl), at(paper), PEER)
    agree(ours[0]["params"], pfl[0]["params"], PEER)  # round 1: no correction yet, the same models
    agree(ours[0]["control"], {n: -v for n, v in pfl[0]["control"].items()}, PEER)  # ... and c negated
    with pytest.raises(AssertionError):
        agree(ours[1]["params"], pfl[ROUNDS - 1]["params"], PEER)
    record("scaffold", "pfl", COMPARED, apart(ours, at(pfl)), "departs", SCAFFOLD_REASON,
           compared="global model, server control")


@pytest.mark.agreement
def test_pfls_scaffold_controls_are_minus_the_gradient(tmp_path: Path) -> None:
    """The smallest case, where the paper's two options coincide: one full-batch step
    (``K = 1``) from ``c = c_k = 0`` gives ``c_k+ = (w_t - y_k) / eta = g_k(w_t)`` (option II),
    which is option I's definition. fedrift's server control after one such round is
    ``mean_k g_k(w_0)``; pfl stores ``-g_k(w_0)`` under option II. Under option I pfl stores the
    negated gradient too, and every user's ends as the last one's, ``-g_3(w_0)``: the control is
    the model's reused difference buffer (pfl/algorithm/scaffold.py:133, ``get_model_difference``
    without ``clone``, pfl/model/pytorch.py:243), which ``InMemoryUserStateStorage`` keeps by
    reference (pfl/data/user_state.py:135) and the next user's difference overwrites. (Its
    ``DiskUserStateStorage`` copies, but cannot load what it saved under torch >= 2.6:
    pfl/internal/bridge/pytorch/common.py:42 calls ``torch.load`` with ``weights_only`` at its
    default, which refuses pfl's ``MappedVectorStatistics``.)"""
    algorithm = {"name": "scaffold", "aggregation": "uniform"}
    w = the_work(tmp_path, algorithm, local_epochs=1)
    grads = []
    for x, y in w.clients:
        net = w.fresh_model()
        F.cross_entropy(net(x), y).backward()
        grads.append({n: p.grad.detach().clone() for n, p in net.named_parameters()})
    minus = [{n: -v for n, v in g.items()} for g in grads]
    run = fedrift_run(config(tmp_path / "one", algorithm, rounds=1, local_epochs=1))
    agree(params_of(run.server_state["control"]), {n: sum(g[n] for g in grads) / CLIENTS for n in grads[0]}, PEER)
    for option_one, expected in ((False, minus), (True, [minus[-1]] * CLIENTS)):
        storage = InMemoryUserStateStorage()
        pfl_run(w, SCAFFOLD(), scaffold_params(storage, option_one, 1), sgd_average, local_epochs=1)
        agree(stored_controls(storage), expected, PEER)


# ---------------------------------------------------------------------------------------
# FedAdam: pfl's central Adam is torch.optim.Adam


ETA_S, BETA1, BETA2, TAU = 1e-2, 0.9, 0.99, 1e-3  # fedrift's defaults; pfl's benchmarks' betas
PRIMED_STEP = 100_000  # beta ** step is 0 in float64 from here: Adam's bias corrections are 1


def adam(parameters: list, primed: bool = False) -> torch.optim.Optimizer:
    """FedAdam's central optimiser as pfl's benchmarks build it (benchmarks/lm/pytorch/train.py:96:
    ``torch.optim.Adam(params, lr, eps=adaptivity_degree, betas=(0.9, 0.99))``), at fedrift's
    ``eta_s``, ``beta1``, ``beta2`` and ``tau``. ``primed``: its state starts where Algorithm 2's
    does, ``v = tau^2`` and ``m = 0``, at a step count where its bias corrections are 1 (the
    optimiser's public ``load_state_dict``)."""
    optimizer = torch.optim.Adam(parameters, lr=ETA_S, betas=(BETA1, BETA2), eps=TAU)
    if primed:
        state = {i: {"step": torch.tensor(float(PRIMED_STEP)), "exp_avg": torch.zeros_like(p),
                     "exp_avg_sq": torch.full_like(p, TAU**2)} for i, p in enumerate(parameters)}
        optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
    return optimizer


def adam_moments(optimizer: torch.optim.Optimizer, names: list[str]) -> dict[str, State]:
    """torch Adam's state as Algorithm 2's ``m`` and ``sqrt(v)``: its gradient is pfl's negated mean
    update, ``-Delta``, so ``exp_avg = -m``; ``v`` (about 1e-5 here, below ``agree``'s floor) is
    compared through its square root, in Delta's units."""
    states = [optimizer.state[p] for p in optimizer.param_groups[0]["params"]]
    return {"m": {n: -s["exp_avg"].clone() for n, s in zip(names, states, strict=True)},
            "sqrt_v": {n: s["exp_avg_sq"].sqrt() for n, s in zip(names, states, strict=True)}}


ADAM_REASON = (
    "pfl departs: it has no FedAdam of its own; its benchmarks pass torch.optim.Adam as PyTorchModel's "
    "central_optimizer (benchmarks/lm/pytorch/train.py:96), which starts v at 0 (torch/optim/adam.py:182) "
    "and bias-corrects each step (adam.py:530-533) where Reddi et al.'s Algorithm 2 starts v at tau^2 and has "
    "no correction."
)


@pytest.mark.agreement
def test_pfls_central_adam_departs_from_algorithm_2(tmp_path: Path) -> None:
    """pfl's ``FederatedAveraging`` with a central ``torch.optim.Adam`` against fedrift's FedAdam
    (plain mean: Algorithm 2's ``1/|S|``). Round 1 (both sides' clients start from ``w_0``, so
    ``Delta_1`` is shared): Adam's first step is ``w_0 + eta Delta_1 / (|Delta_1| + tau)``,
    computed from fedrift's own ``m_1 = (1 - beta1) Delta_1``; the two sides are far apart after
    rounds 1 and 3. With Adam's state primed to Algorithm 2's start (:func:`adam`), the same pfl
    run agrees with fedrift's model, ``m`` and ``v`` after rounds 1 and 3: the departure is the
    start of ``v`` and the bias correction, nothing else."""
    algorithm = {"name": "fedadam", "eta_s": ETA_S, "beta1": BETA1, "beta2": BETA2, "tau": TAU,
                 "aggregation": "uniform"}
    w = the_work(tmp_path, algorithm)
    names = [n for n, _ in w.model.named_parameters()]
    ours = [{"params": r["params"], "m": r["m"], "sqrt_v": {n: v.sqrt() for n, v in r["v"].items()}}
            for r in fedrift_rounds(tmp_path, algorithm, "m", "v")]

    paper = pfl_run(w, FederatedAveraging(), NNAlgorithmParams(**every_user()), lambda ps: adam(ps, primed=True),
                    keeps=lambda metrics, central: adam_moments(central, names))
    agree(ours, at(paper), PEER)  # pfl with Algorithm 2's start is fedrift

    pfl = pfl_run(w, FederatedAveraging(), NNAlgorithmParams(**every_user()), adam)
    w0 = w.initial
    delta = {n: m / (1 - BETA1) for n, m in ours[0]["m"].items()}
    agree(pfl[0]["params"], {n: w0[n] + ETA_S * d / (d.abs() + TAU) for n, d in delta.items()}, PEER)
    for x, y in zip(ours, at(pfl), strict=True):
        with pytest.raises(AssertionError):
            agree(x["params"], y["params"], PEER)
    record("fedadam", "pfl", COMPARED, apart(ours, at(pfl)), "departs", ADAM_REASON)


PAIRS = [("fedavg", "pfl"), ("fedprox", "pfl"), ("scaffold", "pfl"), ("fedadam", "pfl")]
