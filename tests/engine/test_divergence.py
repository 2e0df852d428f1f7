"""Finite blow-ups are divergences (engine/failures.py ``DivergenceBound``): a client whose
training loss or update norm is far beyond the run's first round's stops the run as a
non-finite loss does, or under ``engine.accept_failures`` is left out and counted."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest

import fedrift
from fedrift.engine.sampling import uniform
from fedrift.errors import DivergenceError

sequential = importlib.import_module("fedrift.engine.executors.sequential")
VICTIM = 3  # sampled in rounds 1 to 4 (4 of the tiny config's 6 clients, seed 0)


def _sampled(round_: int) -> list[int]:
    return uniform(6, 4, 0, round_, np.zeros((6, 10)))


def _corrupt(monkeypatch, loss: float = 1.0, shift: float = 0.0, rounds: tuple[int, ...] | None = None) -> None:
    """Client VICTIM's training returns its loss times ``loss`` and its parameters moved by
    ``shift`` (finite both), in ``rounds`` (None: every round)."""
    real = sequential.train_client

    def client(tools, payload, job, round_):
        out = real(tools, payload, job, round_)
        if job.client_id == VICTIM and (rounds is None or round_ in rounds):
            out.loss = out.loss * loss
            out.upload = {**out.upload, "params": {k: v + shift for k, v in out.upload["params"].items()}}
        return out

    monkeypatch.setattr(sequential, "train_client", client)


def _summary(cfg) -> dict:
    return json.loads((Path(cfg["output"]["dir"]) / "summary.json").read_text())


def _metric_lines(cfg) -> int:
    return len((Path(cfg["output"]["dir"]) / "metrics.jsonl").read_text().splitlines())


def test_fedadagrads_finite_blow_up_stops_the_run_as_diverged(tiny, tmp_path):
    """FedAdagrad's server step moves each coordinate by up to ``eta_s`` whatever the size of
    its update (Adagrad's normalisation): at ``eta_s`` 1000 one step takes the MLP's clients
    from a loss near 1.6 in round 1 to about 7e5 in round 2, finite, as workload A's CNN went
    from 1.4 to 1.4e17 in round 17 (alpha 1.0, seed 1). Without the bound such a run ends
    ``completed``; with the default one it stops ``diverged`` in the round of the blow-up,
    naming the client, the loss and the key, its first round's metrics kept."""
    sections = dict(algorithm={"name": "fedadagrad", "eta_s": 1000.0}, train={"rounds": 3})
    unbounded = fedrift.run(tiny(engine={"divergence_factor": None}, output={"dir": str(tmp_path / "off")}, **sections))
    assert unbounded.summary["status"] == "completed" and unbounded.history[1]["train_loss"] > 1e5
    cfg = tiny(**sections)
    with pytest.raises(DivergenceError, match=r"training diverged in round 2: client \d+ had a training loss of "
                                              r"\S+, beyond engine.divergence_factor 1000 times the run's first round's"):
        fedrift.run(cfg)
    summary = _summary(cfg)
    assert summary["status"] == "diverged" and summary["rounds"] == 1 and "engine.divergence_factor" in summary["message"]
    assert _metric_lines(cfg) == 1


def test_one_clients_blow_up_in_round_1_is_judged_against_the_others(tiny, monkeypatch):
    """The reference is the first round's median, not its largest: a client that blows up in
    round 1 itself does not set the bound it is judged by."""
    assert VICTIM in _sampled(1)
    _corrupt(monkeypatch, loss=1e9)
    cfg = tiny(train={"rounds": 3, "clients_per_round": 4}, engine={"executor": "sequential"})
    with pytest.raises(DivergenceError, match=f"training diverged in round 1: client {VICTIM} had a training loss"):
        fedrift.run(cfg)
    assert _summary(cfg)["status"] == "diverged"


def test_an_update_far_beyond_the_first_rounds_is_a_divergence(tiny, monkeypatch):
    """A finite loss but parameters moved 1e4 per entry from the broadcast (round 2 only):
    the update norm's bound stops the run."""
    assert VICTIM in _sampled(2)
    _corrupt(monkeypatch, shift=1e4, rounds=(2,))
    cfg = tiny(train={"rounds": 3, "clients_per_round": 4}, engine={"executor": "sequential"})
    with pytest.raises(DivergenceError, match=f"round 2: client {VICTIM} made an update of norm \\S+, beyond "
                                              "engine.divergence_factor 1000"):
        fedrift.run(cfg)


def test_under_accept_failures_the_client_is_left_out_and_counted(tiny, monkeypatch, caplog):
    """As a non-finite loss is: left out of each round it blows up in, with a warning, counted
    in clients_failed; the run goes through its rounds and ends diverged in effect."""
    _corrupt(monkeypatch, loss=1e9)
    hit = [t for t in range(1, 5) if VICTIM in _sampled(t)]
    cfg = tiny(train={"rounds": 4, "clients_per_round": 4}, engine={"executor": "sequential", "accept_failures": True})
    with pytest.raises(DivergenceError, match=f"training diverged in effect: {len(hit)} client trainings from round "
                                              f"{hit[0]} on returned a non-finite loss, or a loss or update beyond"):
        fedrift.run(cfg)
    summary = _summary(cfg)
    assert summary["status"] == "diverged" and summary["rounds"] == 4 and summary["clients_failed_total"] == len(hit)
    assert _metric_lines(cfg) == 4
    assert f"round {hit[0]}: client {VICTIM} had a training loss" in caplog.text and "it is left out" in caplog.text


def test_an_absolute_loss_bound_applies_from_round_1_and_none_turns_the_relative_one_off(tiny, monkeypatch):
    cfg = tiny(train={"rounds": 2}, engine={"divergence_loss": 0.5})
    with pytest.raises(DivergenceError, match=r"round 1: client \d+ had a training loss of \S+, beyond "
                                              "engine.divergence_loss 0.5"):
        fedrift.run(cfg)
    _corrupt(monkeypatch, loss=1e9)
    off = tiny(train={"rounds": 2, "clients_per_round": 4}, engine={"executor": "sequential", "divergence_factor": None},
               output={"dir": str(Path(cfg["output"]["dir"]) / "off")})
    assert fedrift.run(off).summary["status"] == "completed"


def test_a_resumed_run_keeps_its_first_rounds_reference(tiny, monkeypatch):
    """The reference lives in the run's totals, saved with each checkpoint: a run stopped
    after round 2 and resumed judges round 3 by round 1's clients, as the uninterrupted one,
    not by round 3's own (which a blow-up there would set, and pass)."""
    from conftest import ctrl_c_in_round

    assert VICTIM in _sampled(3)
    cfg = tiny(train={"rounds": 3, "clients_per_round": 4}, engine={"executor": "sequential", "checkpoint_every": 1})
    undo = ctrl_c_in_round(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        fedrift.run(cfg)
    undo()
    real = sequential.train_client

    def everyone_blows_up_in_round_3(tools, payload, job, round_):
        out = real(tools, payload, job, round_)
        out.loss = out.loss * (1e9 if round_ == 3 else 1.0)
        return out

    monkeypatch.setattr(sequential, "train_client", everyone_blows_up_in_round_3)
    with pytest.raises(DivergenceError, match=r"round 3: client \d+ had a training loss"):
        fedrift.resume(cfg["output"]["dir"])
