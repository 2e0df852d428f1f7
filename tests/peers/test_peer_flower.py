"""Flower's strategies (flwr 1.42, ``flwr.server.strategy``) against fedrift's server side, on the
same client results: FedAvg, FedAvgM, FedAdam, FedYogi, FedAdagrad and FedProx.

Flower has a server side only (a strategy; its clients are the user's code), so the clients are
fedrift's. fedrift runs the work of ``peer_work.config`` through ``fedrift.run`` for 1 and for 3
rounds, its sequential executor's ``train_client`` (the real client half, unchanged) watched; each
round, the uploads fedrift aggregated (each client's parameters, as float64 arrays that copy
its float32 ones exactly, with its sample count) go to the Flower strategy's public
``aggregate_fit(server_round, results, failures)`` as ``(ClientProxy, FitRes)`` pairs built with
``ndarrays_to_parameters``. The strategy is built with fedrift's hyper-parameters (and Flower's
local rate ``eta_l``, which its aggregation never reads, set to fedrift's) and the run's initial
model as ``initial_parameters``. Flower's new
global model after rounds 1 and 3 (and its server optimiser's state where it keeps one) is held
to ``PEER`` against the global model and ``server_state`` of the 1-round and the 3-round run.

FedAvg, FedAvgM and FedProx's aggregation agree. FedAdam, FedYogi and FedAdagrad do not: Flower
departs from Reddi et al.'s Algorithm 2 (Adaptive Federated Optimization, ICLR 2021), which
starts the second moment at ``v_{-1} >= tau^2`` (fedrift: ``tau^2``) and has no bias correction.
Those pairs are pinned from both sides on the same averages ``sum_k p_k w_k``: a float64 replay of
Algorithm 2 agrees with fedrift, a replay of Flower's own rule (each departure, with its
file:line) agrees with Flower, reverting any one departure breaks that agreement, and fedrift and
Flower stay far apart; a fix on either side fails the test. From round 2 on, a departing Flower
server's model is not the one the clients trained from (they are fedrift's, trained from
fedrift's model); its replay takes the same inputs, so the rule is checked all the same.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from agreement import BITS, agree
from flwr.common import (Code, FitRes, NDArrays, Parameters, Status, ndarrays_to_parameters,
                         parameters_to_ndarrays)
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAdagrad, FedAdam, FedAvg, FedAvgM, FedProx, FedYogi, Strategy
from peer_work import CLIENTS, PEER, config, fedrift_run, params_of, record, relative_difference

import fedrift

SEQUENTIAL = importlib.import_module("fedrift.engine.executors.sequential")  # the package's name is a function
State = dict[str, torch.Tensor]
COMPARED = [1, 3]  # the rounds compared
LOCAL = {"local_epochs": 2, "lr": 0.05}  # the clients' work: two full-batch SGD steps a round


# ---------------------------------------------------------------------------------------
# fedrift's side: the runs, and the uploads its server aggregated


@dataclass
class Trace:
    """fedrift's 1-round and 3-round runs of one algorithm, and what the 3-round run's server
    got: each round's broadcast model ``w_t`` and each client's upload with its sample count."""

    one: fedrift.RunResult
    three: fedrift.RunResult
    initial: State
    broadcast: list[State]
    uploads: list[list[tuple[State, int]]]

    @property
    def names(self) -> list[str]:
        return list(self.initial)

    def averages(self) -> list[State]:
        """Each round's ``sum_k p_k w_k``, ``p_k = n_k / sum_j n_j``, in float64."""
        out = []
        for uploads in self.uploads:
            total = sum(n for _, n in uploads)
            out.append({k: sum(up[k].double() * (n / total) for up, n in uploads) for k in self.names})
        return out


def fedrift_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: dict[str, Any]) -> Trace:
    """Run fedrift for 1 and for 3 rounds, keeping what each client was sent and uploaded."""
    seen: list[tuple[int, int, State, State, int]] = []
    train_client = SEQUENTIAL.train_client

    def watched(tools, payload, job, round_):
        out = train_client(tools, payload, job, round_)
        seen.append((round_, job.client_id, params_of(payload["params"]), params_of(out.upload["params"]),
                     int(job.ctx["num_samples"])))
        return out

    monkeypatch.setattr(SEQUENTIAL, "train_client", watched)
    one = fedrift_run(config(tmp_path / "run1", algorithm, rounds=1, **LOCAL))
    first, seen[:] = list(seen), []
    three = fedrift_run(config(tmp_path / "run3", algorithm, rounds=3, **LOCAL))
    assert [s[:2] for s in seen] == [(t, k) for t in (1, 2, 3) for k in range(CLIENTS)]  # every client every round
    agree([s[3] for s in first], [s[3] for s in seen[:CLIENTS]], BITS)  # both runs' first rounds: the same uploads
    by_round = [[s for s in seen if s[0] == t] for t in (1, 2, 3)]
    return Trace(one, three, by_round[0][0][2], [r[0][2] for r in by_round],
                 [[(s[3], s[4]) for s in r] for r in by_round])


# ---------------------------------------------------------------------------------------
# Flower's side: its strategy's public API fed those uploads


class Proxy(ClientProxy):
    """A client as a strategy sees it in ``aggregate_fit``'s results: an id (it is never called)."""

    def get_properties(self, ins, timeout, group_id):
        raise NotImplementedError

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError

    def fit(self, ins, timeout, group_id):
        raise NotImplementedError

    def evaluate(self, ins, timeout, group_id):
        raise NotImplementedError

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError


def arrays(state: State, names: list[str]) -> NDArrays:
    """``state``'s tensors as the float64 arrays Flower is handed: exact copies of fedrift's float32
    ones, so that Flower's arithmetic rounds no more than the float64 replays it is held to."""
    return [state[k].double().numpy() for k in names]


def tensors(ndarrays: NDArrays, names: list[str]) -> State:
    return {k: torch.from_numpy(np.array(a)) for k, a in zip(names, ndarrays, strict=True)}


def parameters(state: State, names: list[str]) -> Parameters:
    return ndarrays_to_parameters(arrays(state, names))


def no_metrics(metrics: list[tuple[int, dict]]) -> dict:
    return {}


def flower_rounds(strategy: Strategy, trace: Trace,
                  keeps: Callable[[Strategy], dict[str, NDArrays]] = lambda s: {}) -> list[dict[str, State]]:
    """Flower's global model (``"params"``) and what ``keeps`` reads of its state, after each
    round, from ``aggregate_fit`` on the uploads fedrift aggregated in that round."""
    out = []
    for t, uploads in enumerate(trace.uploads, 1):
        results = [(Proxy(str(k)), FitRes(Status(Code.OK, ""), parameters(up, trace.names), n, {}))
                   for k, (up, n) in enumerate(uploads)]
        new, _ = strategy.aggregate_fit(t, results, [])
        assert new is not None
        out.append({"params": tensors(parameters_to_ndarrays(new), trace.names),
                    **{key: tensors(value, trace.names) for key, value in keeps(strategy).items()}})
    return out


def fedrift_rounds(trace: Trace, *state: str) -> list[dict[str, State]]:
    """fedrift's global model and server ``state`` entries after rounds 1 and 3 (its two runs)."""
    return [{"params": params_of(run.global_state), **{k: params_of(run.server_state[k]) for k in state}}
            for run in (trace.one, trace.three)]


def at(rounds: list[dict[str, State]]) -> list[dict[str, State]]:
    """The compared rounds (1 and 3) of a per-round list."""
    return [rounds[t - 1] for t in COMPARED]


def apart(a: list[dict[str, State]], b: list[dict[str, State]]) -> float:
    """The largest relative difference of two sides' global models over the compared rounds."""
    return max(relative_difference(x["params"], y["params"]) for x, y in zip(a, b, strict=True))


FEDAVG_LIKE = dict(fraction_fit=1.0, min_fit_clients=CLIENTS, min_available_clients=CLIENTS,
                   fit_metrics_aggregation_fn=no_metrics)


# ---------------------------------------------------------------------------------------
# The pairs that agree


@pytest.mark.agreement
def test_fedavg_agrees_with_flowers_fedavg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``FedAvg.aggregate_fit``: the sample-weighted average of the uploads, fedrift's ``w_{t+1}``."""
    trace = fedrift_side(tmp_path, monkeypatch, {"name": "fedavg"})
    flower = at(flower_rounds(FedAvg(**FEDAVG_LIKE), trace))
    ours = fedrift_rounds(trace)
    agree(ours, flower, PEER)
    record("fedavg", "flower", COMPARED, apart(ours, flower), "agrees", compared="server aggregation")


@pytest.mark.agreement
def test_fedprox_server_agrees_with_flowers_fedprox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower's FedProx is FedAvg's aggregation plus ``proximal_mu`` in each client's fit config
    (its clients add the proximal term themselves). fedrift's FedProx clients (mu = 0.1) trained;
    ``FedProx(proximal_mu=0.1)`` aggregates their uploads to fedrift's global model, and its
    ``configure_fit`` sends every client that mu and the model fedrift broadcast that round.
    (Flower's docstring, flwr/server/strategy/fedprox.py:57, sums ``.norm(2)`` unsquared where
    its formula, line 41, and the paper square it: client code, not compared here.)"""
    mu = 0.1
    trace = fedrift_side(tmp_path, monkeypatch, {"name": "fedprox", "mu": mu})
    strategy = FedProx(proximal_mu=mu, **FEDAVG_LIKE)
    manager = SimpleClientManager()
    for k in range(CLIENTS):
        manager.register(Proxy(str(k)))
    rounds = flower_rounds(strategy, trace)
    for t, sent in enumerate([trace.initial] + [r["params"] for r in rounds[:-1]], 1):
        instructions = strategy.configure_fit(t, parameters(sent, trace.names), manager)
        assert len(instructions) == CLIENTS
        for _, fit_ins in instructions:
            assert fit_ins.config["proximal_mu"] == mu
            agree(tensors(parameters_to_ndarrays(fit_ins.parameters), trace.names), trace.broadcast[t - 1], PEER)
    flower, ours = at(rounds), fedrift_rounds(trace)
    agree(ours, flower, PEER)
    record("fedprox", "flower", COMPARED, apart(ours, flower), "agrees", compared="server aggregation")


@pytest.mark.agreement
def test_fedavgm_agrees_with_flowers_fedavgm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``FedAvgM(server_learning_rate=eta_s, server_momentum=beta)`` (Flower's defaults, 1 and 0,
    are plain FedAvg): ``v = beta v + (w_t - avg)``, ``w_{t+1} = w_t - eta_s v``, as fedrift; its
    ``momentum_vector`` is fedrift's ``momentum``."""
    beta, eta_s = 0.9, 0.7
    trace = fedrift_side(tmp_path, monkeypatch, {"name": "fedavgm", "beta": beta, "eta_s": eta_s})
    strategy = FedAvgM(initial_parameters=parameters(trace.initial, trace.names), server_learning_rate=eta_s,
                       server_momentum=beta, **FEDAVG_LIKE)
    flower = at(flower_rounds(strategy, trace, lambda s: {"momentum": s.momentum_vector}))
    ours = fedrift_rounds(trace, "momentum")
    agree(ours, flower, PEER)
    record("fedavgm", "flower", COMPARED, apart(ours, flower), "agrees",
           compared="server step: global model, momentum")


# ---------------------------------------------------------------------------------------
# FedAdam, FedYogi, FedAdagrad: Flower departs from Algorithm 2


@dataclass(frozen=True)
class Rule:
    """One reading of Algorithm 2's server step (``Delta = avg - w_t``)::

        m = beta1 m + (1 - beta1) Delta                     (m starts at 0)
        v = v + Delta^2 | beta2 v + (1 - beta2) Delta^2 | v - (1 - beta2) Delta^2 sign(v - Delta^2)
        w = w + eta c_t m / (sqrt(v) + tau)

    ``v0``: v's start (Algorithm 2: ``v_{-1} >= tau^2``); ``c_t``: 1, or with ``bias`` set
    Adam's correction ``sqrt(1 - beta2^(t + bias)) / (1 - beta1^(t + bias))`` in round ``t``."""

    second: str  # adagrad | adam | yogi
    eta: float
    beta1: float
    beta2: float
    tau: float
    v0: float
    bias: int | None = None

    def replay(self, initial: State, averages: list[State]) -> list[dict[str, State]]:
        """The model, ``m`` and ``sqrt(v)`` after each round, in float64."""
        w = {k: v.double() for k, v in initial.items()}
        m = {k: torch.zeros_like(v) for k, v in w.items()}
        v = {k: torch.full_like(x, self.v0) for k, x in w.items()}
        out = []
        for t, avg in enumerate(averages, 1):
            c = 1.0
            if self.bias is not None:  # Adam's bias correction at step t + bias
                c = (1 - self.beta2 ** (t + self.bias)) ** 0.5 / (1 - self.beta1 ** (t + self.bias))
            for k in w:
                d = avg[k] - w[k]
                m[k] = self.beta1 * m[k] + (1 - self.beta1) * d
                if self.second == "adagrad":
                    v[k] = v[k] + d * d
                elif self.second == "adam":
                    v[k] = self.beta2 * v[k] + (1 - self.beta2) * d * d
                else:
                    v[k] = v[k] - (1 - self.beta2) * d * d * torch.sign(v[k] - d * d)
                w[k] = w[k] + self.eta * c * m[k] / (v[k].sqrt() + self.tau)
            out.append({"params": dict(w), "m": dict(m), "sqrt_v": {k: x.sqrt() for k, x in v.items()}})
        return out


def agrees(a: Any, b: Any) -> bool:
    """Whether ``agree(a, b, PEER)`` holds."""
    try:
        agree(a, b, PEER)
    except AssertionError:
        return False
    return True


ETA_S = {"fedadam": 1e-2, "fedyogi": 1e-2, "fedadagrad": 1e-1}  # fedrift's defaults
BETA1, BETA2, TAU = 0.9, 0.99, 1e-3  # fedrift's defaults (Flower's tau: 1e-9 for FedAdam, FedAdagrad)

# (Flower's strategy, Flower's rule as changes to Algorithm 2's, each departure: its revert, the reason)
ADAPTIVE: dict[str, tuple[Callable[..., Strategy], dict[str, Any], dict[str, dict[str, Any]], str]] = {
    "fedadam": (
        lambda p: FedAdam(initial_parameters=p, eta=ETA_S["fedadam"], eta_l=LOCAL["lr"], beta_1=BETA1, beta_2=BETA2,
                          tau=TAU, **FEDAVG_LIKE),
        {"v0": 0.0, "bias": 1},
        {"v starts at 0": {"v0": TAU**2}, "bias correction": {"bias": None},
         "its exponent server_round + 1": {"bias": 0}},
        "Flower departs: flwr/server/strategy/fedadam.py:169 starts v at 0 where Reddi et al.'s Algorithm 2 "
        "starts it at v_{-1} >= tau^2, and fedadam.py:179-183 scales eta by Adam's bias correction at step "
        "server_round + 1 (flwrlabs/flower#4362), which Algorithm 2 does not have.",
    ),
    "fedyogi": (
        lambda p: FedYogi(initial_parameters=p, eta=ETA_S["fedyogi"], eta_l=LOCAL["lr"], beta_1=BETA1, beta_2=BETA2,
                          tau=TAU, **FEDAVG_LIKE),
        {"v0": 0.0},
        {"v starts at 0": {"v0": TAU**2}},
        "Flower departs: flwr/server/strategy/fedyogi.py:169 starts v at 0 where Reddi et al.'s Algorithm 2 "
        "starts it at v_{-1} >= tau^2 (fedrift: tau^2).",
    ),
    "fedadagrad": (
        lambda p: FedAdagrad(initial_parameters=p, eta=ETA_S["fedadagrad"], eta_l=LOCAL["lr"], tau=TAU, **FEDAVG_LIKE),
        {"v0": 0.0, "beta1": 0.0},
        {"v starts at 0": {"v0": TAU**2}, "beta_1 fixed at 0": {"beta1": BETA1}},
        "Flower departs: flwr/server/strategy/fedadagrad.py:122 fixes beta_1 at 0 (its constructor takes none) "
        "where Reddi et al.'s Algorithm 2 keeps m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t, and "
        "fedadagrad.py:163 starts v at 0 where Algorithm 2 starts it at v_{-1} >= tau^2.",
    ),
}


@pytest.mark.agreement
@pytest.mark.parametrize("name", list(ADAPTIVE))
def test_flowers_adaptive_strategies_depart_from_algorithm_2(name: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower's FedAdam/FedYogi/FedAdagrad, built with fedrift's eta_s, beta_1, beta_2 and tau,
    against fedrift's: both sides pinned to their own rule on the same averages (module doc)."""
    make, flower_changes, departures, reason = ADAPTIVE[name]
    second = name.removeprefix("fed")
    algorithm = {"name": name, "eta_s": ETA_S[name], "beta1": BETA1, "tau": TAU} | (
        {"beta2": BETA2} if second != "adagrad" else {})
    trace = fedrift_side(tmp_path, monkeypatch, algorithm)
    averages = trace.averages()
    paper = Rule(second, ETA_S[name], BETA1, BETA2 if second != "adagrad" else 0.0, TAU, v0=TAU**2)

    # v, of the order of Delta^2 (1e-5 here), lies below agree's floor: compared through its
    # square root, in Delta's units (the step divides by it)
    ours = [{"params": r["params"], "m": r["m"], "sqrt_v": {k: v.sqrt() for k, v in r["v"].items()}}
            for r in fedrift_rounds(trace, "m", "v")]
    agree(ours, at(paper.replay(trace.initial, averages)), PEER)  # fedrift is Algorithm 2

    flower_rule = dataclasses.replace(paper, **flower_changes)
    flower = at(flower_rounds(make(parameters(trace.initial, trace.names)), trace,
                              lambda s: {"m": s.m_t, "sqrt_v": [np.sqrt(v) for v in s.v_t]}))
    agree(flower, at(flower_rule.replay(trace.initial, averages)), PEER)  # Flower is its own rule
    for departure, revert in departures.items():  # ... and each departure is part of it
        reverted = at(dataclasses.replace(flower_rule, **revert).replay(trace.initial, averages))
        assert not agrees(flower, reverted), f"Flower's {name} no longer departs so: {departure}"
    for t, x, y in zip(COMPARED, ours, flower, strict=True):  # so the two sides are far apart
        assert not agrees(x["params"], y["params"]), f"round {t}: Flower's {name} agrees with fedrift: record it"
    record(name, "flower", COMPARED, apart(ours, flower), "departs", reason, compared="server step: global model")


PAIRS = [("fedavg", "flower"), ("fedavgm", "flower"), ("fedadam", "flower"), ("fedyogi", "flower"),
         ("fedadagrad", "flower"), ("fedprox", "flower")]
