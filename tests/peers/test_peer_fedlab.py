"""fedrift against FedLab 1.3.0: FedAvg, FedProx, SCAFFOLD, FedNova and FedDyn on the shared work.

What is compared: the global model after rounds 1 and 3 (fedrift: one run of each length), and
SCAFFOLD's server control ``c``. How FedLab is fed: through its public standalone API, as
fedlab/core/standalone.py drives it. Its serial client trainer (``cuda=False``) and its server
handler each get a copy of the work's model at fedrift's initial weights; the trainer reads
the work's client tensors through a ``FedDataset`` whose ``get_dataloader(id, batch_size)``
gives one batch (the client's whole split) an epoch; ``setup_optim(epochs, batch_size, lr, ...)``
gets the work's settings, and ``sample_ratio`` 1.0 puts every client in every round. Each
round: ``handler.sample_clients()``, ``handler.downlink_package``,
``trainer.local_process(payload, ids)``, ``trainer.uplink_package``, ``handler.load(pack)``.

FedLab averages every round's models unweighted (its ``Aggregators.fedavg_aggregate`` with no
weights), and its SCAFFOLD, FedNova and FedDyn handlers take no weights either. That is the
plain mean that FedProx's, SCAFFOLD's and FedDyn's papers write, which fedrift gives under
``aggregation: uniform``. FedAvg's and FedNova's papers weight by ``n_k / n``, which is
fedrift's default. Where FedLab departs from the paper, the test pins what FedLab computes
instead (module ``PAIRS``; each test's docstring says how).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from agreement import agree, largest_difference
from peer_work import FULL_BATCH, PEER, Work, config, fedrift_run, params_of, record, relative_difference, work
from torch.utils.data import DataLoader, TensorDataset

import fedrift
from fedrift.config import EngineConfig
from fedrift.engine.failures import fates, steps_done

# FedLab is installed without its declared dependencies (Makefile PEERS). It asks for torchvision,
# which has no CPU wheel here, and imports it at module level only in fedlab/contrib/dataset/*,
# which fedlab/core/client/trainer.py imports. Nothing here reads those datasets, so empty
# stand-ins let FedLab import. They are taken out of sys.modules again once FedLab is in (its
# modules keep their own references), so no other test sees a torchvision without a spec.
_STAND_INS = [] if importlib.util.find_spec("torchvision") is not None else [
    "torchvision", "torchvision.transforms", "torchvision.datasets"]
for _name in _STAND_INS:
    sys.modules[_name] = types.ModuleType(_name)
try:
    from fedlab.contrib.algorithm.fedavg import FedAvgSerialClientTrainer, FedAvgServerHandler
    from fedlab.contrib.algorithm.feddyn import FedDynSerialClientTrainer, FedDynServerHandler
    from fedlab.contrib.algorithm.fednova import FedNovaSerialClientTrainer, FedNovaServerHandler
    from fedlab.contrib.algorithm.fedprox import FedProxSerialClientTrainer, FedProxServerHandler
    from fedlab.contrib.algorithm.scaffold import ScaffoldSerialClientTrainer, ScaffoldServerHandler
    from fedlab.contrib.dataset.basic_dataset import FedDataset
    from fedlab.utils import SerializationTool
finally:
    for _name in _STAND_INS:
        sys.modules.pop(_name, None)

ROUNDS = (1, 3)
EPOCHS = 2  # local epochs: two full-batch steps a round
MU = 1.0  # FedProx: large enough that the proximal term moves the model ~20x PEER past FedAvg's
ETA_G = 0.5  # SCAFFOLD's global lr: not 1, so that the server step is exercised too
ALPHA = 1.0  # FedDyn: large enough that each of FedLab's departures alone shows beyond PEER
STRAGGLERS = {"stragglers": 0.5, "straggler_work": 0.5}  # FedNova: 1 or 2 local steps a client


class Clients(FedDataset):
    """The work's client splits as FedLab's trainers read them: one loader per client id."""

    def __init__(self, clients: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().__init__()
        self.clients = clients
        self.num = len(clients)

    def get_dataloader(self, id: int, batch_size: int, type: str = "train") -> DataLoader:
        loader = DataLoader(TensorDataset(*self.clients[id]), batch_size=batch_size)
        assert len(loader) == 1, "one batch an epoch: the client's whole split"
        return loader


def global_model(handler: Any) -> dict[str, torch.Tensor]:
    """A FedLab server handler's global model, as a state dict."""
    return params_of(handler.model)


def fedlab_rounds(handler: Any, trainer: Any, w: Work, rounds: int,
                  epochs_of: Callable[[int, int], int] | None = None,
                  read: Callable[[Any], Any] = global_model) -> list[Any]:
    """FedLab's standalone pipeline for ``rounds`` rounds: ``read(handler)`` after each (the
    global model). ``epochs_of(round, client)``: a client's own local epochs (FedNova's unequal
    steps), set by ``setup_optim`` before that client's ``local_process``."""
    trainer.setup_dataset(Clients(w.clients))
    handler.num_clients = trainer.num_clients
    states = []
    for t in range(1, rounds + 1):
        sampled = handler.sample_clients()
        assert sampled == list(range(len(w.clients)))  # sample_ratio 1.0: everyone
        payload = handler.downlink_package
        if epochs_of is None:
            trainer.local_process(payload, sampled)
        else:
            for k in sampled:
                trainer.setup_optim(epochs_of(t, k), FULL_BATCH, w.lr)
                trainer.local_process(payload, [k])
        for pack in trainer.uplink_package:
            handler.load(pack)
        assert handler.round == t
        states.append(read(handler))
    return states


def fedrift_rounds(out: Path, algorithm: dict[str, Any],
                   engine: dict[str, Any] | None = None) -> dict[int, fedrift.RunResult]:
    """fedrift's runs of the work, one for each compared round count."""
    runs = {}
    for rounds in ROUNDS:
        cfg = config(out / f"{algorithm['name']}-{algorithm.get('aggregation', 'samples')}-{rounds}", algorithm,
                     rounds=rounds, local_epochs=EPOCHS)
        cfg["engine"] |= engine or {}
        runs[rounds] = fedrift_run(cfg)
    return runs


def unflatten(w: Work, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """One of FedLab's flat parameter vectors as a state dict of the work's model."""
    model = w.fresh_model()
    SerializationTool.deserialize_model(model, flat)
    return params_of(model)


def compare(fedrift_runs: dict[int, fedrift.RunResult], fedlab_states: list[dict[str, torch.Tensor]]) -> float:
    """``agree`` at each compared round; the largest relative difference."""
    for rounds in ROUNDS:
        agree(fedrift_runs[rounds].global_state, fedlab_states[rounds - 1], PEER, f"round {rounds}")
    return max(relative_difference(fedrift_runs[r].global_state, fedlab_states[r - 1]) for r in ROUNDS)


def apart(fedrift_runs: dict[int, fedrift.RunResult], fedlab_states: list[dict[str, torch.Tensor]]) -> float:
    """How far FedLab ends from the paper's rule (fedrift's runs of it), held beyond PEER at
    every compared round so that a recorded departure is one this work shows."""
    for rounds in ROUNDS:
        gap = largest_difference(fedrift_runs[rounds].global_state, fedlab_states[rounds - 1])
        assert gap > PEER.rtol, f"round {rounds}: FedLab within {gap:.2g} of the paper's rule; no departure shown"
    return max(relative_difference(fedrift_runs[r].global_state, fedlab_states[r - 1]) for r in ROUNDS)


@pytest.mark.agreement
def test_fedavg(tmp_path: Path) -> None:
    """FedAvgServerHandler averages the clients' models unweighted (basic_server.py:88): it
    equals fedrift's ``aggregation: uniform``, and departs from McMahan et al.'s ``n_k / n``
    weights (fedrift's default) on this work's unequal clients. No FedLab option weights it."""
    w = work(config(tmp_path / "work", {"name": "fedavg"}, local_epochs=EPOCHS))
    trainer = FedAvgSerialClientTrainer(w.fresh_model(), len(w.clients), cuda=False)
    trainer.setup_optim(w.local_epochs, FULL_BATCH, w.lr)
    handler = FedAvgServerHandler(w.fresh_model(), max(ROUNDS), sample_ratio=1.0, cuda=False)
    fedlab = fedlab_rounds(handler, trainer, w, max(ROUNDS))
    compare(fedrift_rounds(tmp_path, {"name": "fedavg", "aggregation": "uniform"}), fedlab)
    difference = apart(fedrift_rounds(tmp_path, {"name": "fedavg"}), fedlab)
    record("fedavg", "fedlab", list(ROUNDS), difference, "departs",
           "FedLab departs: fedlab/contrib/algorithm/basic_server.py:88 (SyncServerHandler, which FedAvgServerHandler "
           "is) averages the client models unweighted where McMahan et al.'s Algorithm 1 weights them by n_k/n "
           "(FedLab issue #305). Pinned: FedLab equals fedrift's aggregation: uniform.")


@pytest.mark.agreement
def test_fedprox(tmp_path: Path) -> None:
    """FedProxSerialClientTrainer's loss ``CE + (mu/2) ||w - w_t||^2`` (mu given to
    ``setup_optim``) and FedProxServerHandler's unweighted mean, Li et al.'s Algorithm 2
    (``w = (1/K) sum_k w_k``, its clients drawn with probability p_k; here every client is
    taken): fedrift with ``aggregation: uniform``. ``MU`` puts the proximal term well above PEER."""
    alg = {"name": "fedprox", "mu": MU, "aggregation": "uniform"}
    w = work(config(tmp_path / "work", alg, local_epochs=EPOCHS))
    trainer = FedProxSerialClientTrainer(w.fresh_model(), len(w.clients), cuda=False)
    trainer.setup_optim(w.local_epochs, FULL_BATCH, w.lr, MU)
    handler = FedProxServerHandler(w.fresh_model(), max(ROUNDS), sample_ratio=1.0, cuda=False)
    difference = compare(fedrift_rounds(tmp_path, alg), fedlab_rounds(handler, trainer, w, max(ROUNDS)))
    record("fedprox", "fedlab", list(ROUNDS), difference, "agrees")


@pytest.mark.agreement
def test_scaffold(tmp_path: Path) -> None:
    """Karimireddy et al.'s Algorithm 1, option II, on both sides: FedLab's local step
    ``g - c_k + c`` (scaffold.py:78), ``Delta c_k = (w_t - w_k)/(K eta) - c`` with ``K`` the
    epochs times the batches (scaffold.py:90), ``c`` zero at the start (scaffold.py:22) and
    moved by ``|S|/N`` of the mean ``Delta c_k`` (scaffold.py:35), the model by ``eta_g`` times
    the unweighted mean change (scaffold.py:32; ``eta_g`` is ScaffoldServerHandler's
    ``setup_optim(lr)``). fedrift: ``aggregation: uniform`` (the paper's ``1/|S|``). The global
    model and the server control ``c`` are compared."""
    alg = {"name": "scaffold", "eta_g": ETA_G, "aggregation": "uniform"}
    w = work(config(tmp_path / "work", alg, local_epochs=EPOCHS))
    trainer = ScaffoldSerialClientTrainer(w.fresh_model(), len(w.clients), cuda=False)
    trainer.setup_optim(w.local_epochs, FULL_BATCH, w.lr)
    handler = ScaffoldServerHandler(w.fresh_model(), max(ROUNDS), sample_ratio=1.0, cuda=False)
    handler.setup_optim(ETA_G)
    both = fedlab_rounds(handler, trainer, w, max(ROUNDS), read=lambda h: (global_model(h), unflatten(w, h.global_c)))
    fedlab, controls = [model for model, _ in both], [c for _, c in both]
    runs = fedrift_rounds(tmp_path, alg)
    difference = compare(runs, fedlab)
    for rounds in ROUNDS:
        agree(runs[rounds].server_state["control"], controls[rounds - 1], PEER, f"c after round {rounds}")
    difference = max([difference] + [relative_difference(runs[r].server_state["control"], controls[r - 1])
                                     for r in ROUNDS])
    record("scaffold", "fedlab", list(ROUNDS), difference, "agrees", compared="global model, server control c")


@pytest.mark.agreement
def test_fednova(tmp_path: Path) -> None:
    """FedNova with unequal local steps (fedrift's stragglers run 1 of their 2 full-batch steps;
    FedLab's client is given the same count as its epochs, so its ``tau_k`` is the same): FedLab
    normalises as Wang et al. (``(w_k - w_t)/tau_k``, rescaled by ``tau_eff``) but with every
    ``p_k = 1/m`` (fednova.py:26-30, in every ``setup_optim`` option), where the paper has
    ``n_k / n`` (fedrift's default). Pinned: FedLab equals fedrift's ``aggregation: uniform``."""
    cfg = config(tmp_path / "work", {"name": "fednova"}, local_epochs=EPOCHS)
    w = work(cfg)
    engine = EngineConfig(**cfg["engine"] | STRAGGLERS)  # fedrift's stragglers, a pure function of (seed, round, k)
    clients = list(range(len(w.clients)))
    steps = {t: [steps_done(EPOCHS, fates(engine, cfg["seed"], t, clients).work.get(k, 1.0)) for k in clients]
             for t in range(1, max(ROUNDS) + 1)}
    assert all(len(set(s)) > 1 for s in steps.values()), steps  # unequal steps in every round
    trainer = FedNovaSerialClientTrainer(w.fresh_model(), len(w.clients), cuda=False)
    handler = FedNovaServerHandler(w.fresh_model(), max(ROUNDS), sample_ratio=1.0, cuda=False)
    handler.setup_optim()  # "weighted_scale": with every client sampled, N/K = 1
    fedlab = fedlab_rounds(handler, trainer, w, max(ROUNDS), lambda t, k: steps[t][k])
    compare(fedrift_rounds(tmp_path, {"name": "fednova", "aggregation": "uniform"}, STRAGGLERS), fedlab)
    difference = apart(fedrift_rounds(tmp_path, {"name": "fednova"}, STRAGGLERS), fedlab)
    record("fednova", "fedlab", list(ROUNDS), difference, "departs",
           "FedLab departs: fedlab/contrib/algorithm/fednova.py:26-30 sets every client's weight p_k to 1/m in tau_eff "
           "and in the mean of the normalised updates, under every setup_optim option, where Wang et al. weight by "
           "p_k = n_k/n. Pinned with unequal local steps: FedLab equals fedrift's aggregation: uniform.")


def feddyn_by_hand(w: Work, alpha: float, rounds: int, regulariser_gradient: bool,
                   h_change: Callable[[list[torch.Tensor], torch.Tensor], torch.Tensor],
                   ) -> list[dict[str, torch.Tensor]]:
    """FedDyn on the work, written out (Acar et al., Algorithm 1, with the plain mean): client
    loss ``CE(w) - <gr_k, w> + (alpha/2) ||w - w_t||^2``, ``gr_k <- gr_k - alpha (w_k - w_t)``,
    ``h <- h - (alpha/N) h_change(w_k's, w_t)``, ``w_{t+1} = mean_k w_k - h/alpha``. Two switches
    give FedLab's departures: ``regulariser_gradient=False`` trains on CE alone (the two terms
    built from a detached copy), and ``h_change`` is the sum that moves ``h``."""
    x = w.initial
    gr = [{q: torch.zeros_like(v) for q, v in x.items()} for _ in w.clients]
    h = {q: torch.zeros_like(v) for q, v in x.items()}
    states = []
    for _ in range(rounds):
        ends = []
        for k, (inputs, labels) in enumerate(w.clients):
            model = w.fresh_model()
            model.load_state_dict(x)
            opt = torch.optim.SGD(model.parameters(), lr=w.lr)
            for _ in range(w.local_epochs):
                loss = torch.nn.functional.cross_entropy(model(inputs), labels)
                if regulariser_gradient:
                    for q, p in model.named_parameters():
                        loss = loss - (gr[k][q] * p).sum() + 0.5 * alpha * ((p - x[q]) ** 2).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
            ends.append(params_of(model))
            gr[k] = {q: gr[k][q] - alpha * (ends[k][q] - x[q]) for q in x}
        h = {q: h[q] - alpha / len(w.clients) * h_change([e[q] for e in ends], x[q]) for q in x}
        x = {q: sum(e[q] for e in ends) / len(ends) - h[q] / alpha for q in x}
        states.append(x)
    return states


def paper_h(ends: list[torch.Tensor], w_t: torch.Tensor) -> torch.Tensor:
    """Acar et al.'s ``sum_k (w_k - w_t)`` (and their code's, alpemreacar/FedDyn utils_methods.py:393)."""
    return sum(e - w_t for e in ends)


def fedlab_h(ends: list[torch.Tensor], w_t: torch.Tensor) -> torch.Tensor:
    """FedLab's ``sum_k w_k - w_t`` (fedlab/contrib/algorithm/feddyn.py:23): ``w_t`` taken once, not K times."""
    return sum(ends) - w_t


@pytest.mark.agreement
def test_feddyn(tmp_path: Path) -> None:
    """FedDyn written out (``feddyn_by_hand``) with the paper's two rules agrees with fedrift
    (``aggregation: uniform``, the paper's mean), and with FedLab's two departures agrees with
    FedLab: its server moves ``h`` by ``sum_k w_k - w_t`` (feddyn.py:23), and its client builds
    ``-<L, w> + (alpha/2)||w - w_t||^2`` from ``self.model_parameters`` (feddyn.py:74-75), a
    copy of ``param.data`` (fedlab/utils/serialization.py:56) with no gradient, so it trains on
    CE alone. Each departure alone leaves the hand computation beyond PEER from FedLab."""
    alg = {"name": "feddyn", "alpha": ALPHA, "aggregation": "uniform"}
    w = work(config(tmp_path / "work", alg, local_epochs=EPOCHS))
    trainer = FedDynSerialClientTrainer(w.fresh_model(), len(w.clients), cuda=False)
    trainer.setup_optim(w.local_epochs, FULL_BATCH, w.lr, ALPHA)
    handler = FedDynServerHandler(w.fresh_model(), max(ROUNDS), sample_ratio=1.0, cuda=False)
    handler.setup_optim(ALPHA)
    fedlab = fedlab_rounds(handler, trainer, w, max(ROUNDS))
    runs = fedrift_rounds(tmp_path, alg)
    paper = feddyn_by_hand(w, ALPHA, max(ROUNDS), True, paper_h)
    as_written = feddyn_by_hand(w, ALPHA, max(ROUNDS), False, fedlab_h)
    for rounds in ROUNDS:
        agree(runs[rounds].global_state, paper[rounds - 1], PEER, f"fedrift against the paper, round {rounds}")
        agree(fedlab[rounds - 1], as_written[rounds - 1], PEER, f"FedLab against its rule, round {rounds}")
    for one_departure in (feddyn_by_hand(w, ALPHA, max(ROUNDS), True, fedlab_h),
                          feddyn_by_hand(w, ALPHA, max(ROUNDS), False, paper_h)):
        assert largest_difference(fedlab[-1], one_departure[-1]) > PEER.rtol
    difference = apart(runs, fedlab)
    record("feddyn", "fedlab", list(ROUNDS), difference, "departs",
           "FedLab departs twice: fedlab/contrib/algorithm/feddyn.py:23 moves h by alpha/N (sum_k w_k - w_t) where "
           "Acar et al.'s Algorithm 1 (and alpemreacar/FedDyn utils_methods.py:393) has sum_k (w_k - w_t), and "
           "feddyn.py:74-75 build the linear and proximal terms from a detached copy of the parameters "
           "(fedlab/utils/serialization.py:56), so its clients train on cross-entropy alone.")


PAIRS = [("fedavg", "fedlab"), ("fedprox", "fedlab"), ("scaffold", "fedlab"), ("fednova", "fedlab"),
         ("feddyn", "fedlab")]
