"""Client failures and stragglers (engine/failures.py): pure draws, renormalised weights,
the per-round counts, and what a failing client does to a round with and without
``engine.accept_failures``."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import fedrift
from agreement import BITS, agree
from fedrift.config import EngineConfig
from fedrift.engine.failures import fates
from fedrift.engine.sampling import SAMPLERS, uniform
from fedrift.errors import DivergenceError, NoClientsError

# the module (``fedrift.engine.executors.sequential`` is also the name of its registry entry)
sequential = importlib.import_module("fedrift.engine.executors.sequential")

_FIXED: dict[int, list[int]] = {}  # round -> the clients the "fixed" sampler returns


@SAMPLERS.register("test_fixed", "tests: the clients _FIXED names for each round")
def _fixed(num_clients, m, seed, round_, label_counts, retries=0):
    return _FIXED[round_]


def test_fates_are_a_pure_function_of_seed_round_client():
    eng = EngineConfig(dropout=0.3, stragglers=0.5, straggler_work="uniform")
    whole = fates(eng, 7, 3, list(range(40)))
    assert whole == fates(eng, 7, 3, list(range(40)))
    for k in range(40):  # a client's fate does not depend on who else was sampled
        alone = fates(eng, 7, 3, [k])
        assert (k in alone.dropped) == (k in whole.dropped)
        assert alone.work.get(k) == whole.work.get(k)
    assert not set(whole.dropped) & set(whole.returning)
    assert all(0 < w < 1 for w in whole.work.values())
    assert fates(eng, 8, 3, list(range(40))) != whole


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_and_straggler_rates(p):
    """Over 100 rounds of 100 clients the shares are within 4 standard deviations of p."""
    eng = EngineConfig(dropout=p, stragglers=p)
    dropped = returning = straggling = 0
    for t in range(1, 101):
        f = fates(eng, 0, t, list(range(100)))
        dropped, returning, straggling = dropped + len(f.dropped), returning + len(f.returning), straggling + len(f.work)
    n = 10_000
    assert abs(dropped / n - p) < 4 * math.sqrt(p * (1 - p) / n)
    assert abs(straggling / returning - p) < 4 * math.sqrt(p * (1 - p) / returning)
    assert set(fates(eng, 0, 1, list(range(100))).work.values()) == {0.5}


@pytest.mark.agreement
def test_dropout_equals_sampling_only_the_clients_that_return(tiny):
    """The dropped clients neither train nor count: the round is the returning clients' round,
    their weights renormalised, bit for bit; the broadcast still reached every sampled client."""
    cfg = tiny(train={"rounds": 4, "clients_per_round": 4}, engine={"dropout": 0.4, "executor": "sequential"},
               algorithm={"name": "scaffold"})  # SCAFFOLD: the server's |S_t| / N is the returning clients'
    dropped = fedrift.run(cfg)
    eng = EngineConfig(dropout=0.4)
    _FIXED.clear()
    for t in range(1, 5):
        sampled = uniform(6, 4, 0, t, np.zeros((6, 10)))
        _FIXED[t] = fates(eng, 0, t, sampled).returning
    assert sum(len(v) for v in _FIXED.values()) < 16  # some client did drop out
    fixed = fedrift.run(tiny(train={"rounds": 4, "clients_per_round": 4}, algorithm={"name": "scaffold"},
                             engine={"sampling": "test_fixed", "executor": "sequential"},
                             output={"dir": cfg["output"]["dir"] + "-fixed"}))
    agree(dropped.global_state, fixed.global_state, BITS)
    for row, ref in zip(dropped.history, fixed.history):
        assert row["clients"] == 4 and row["clients_returned"] == len(_FIXED[row["round"]])
        assert row["clients_dropped"] == 4 - row["clients_returned"] and row["clients_failed"] == 0
        assert row["bytes_up"] == ref["bytes_up"]  # only the returning upload
        assert row["bytes_down"] == ref["bytes_down"] * 4 // row["clients_returned"]  # all four were sent the model
    assert dropped.summary["clients_dropped_total"] == 16 - sum(len(v) for v in _FIXED.values())


@pytest.mark.agreement
def test_a_straggler_runs_the_first_part_of_its_schedule(tiny):
    """Every client a straggler at half its work, 4 planned steps: the run is the 2-step run
    (the same first batches), bit for bit, and FedNova's normaliser sees the 2 steps."""
    def go(d, steps, **engine):
        return fedrift.run(tiny(algorithm={"name": "fednova"}, train={"rounds": 3, "local_steps": steps},
                                engine={"executor": "sequential", **engine}, output={"dir": d}))

    base = str(tiny()["output"]["dir"])
    half = go(base + "-s", 4, stragglers=1.0, straggler_work=0.5)
    two = go(base + "-2", 2)
    agree(half.global_state, two.global_state, BITS)
    assert all(r["clients_straggling"] == r["clients_returned"] == 3 for r in half.history)
    four = go(base + "-4", 4).global_state
    assert not any(torch.equal(v, four[k]) for k, v in two.global_state.items())


@pytest.mark.process
@pytest.mark.agreement
def test_executors_agree_under_dropout_and_stragglers(tiny):
    """processes equals sequential bit for bit at one thread, failures included."""
    eng = {"dropout": 0.3, "stragglers": 0.5, "straggler_work": "uniform", "threads": 1}
    runs = [fedrift.run(tiny(algorithm={"name": "fednova"}, train={"rounds": 3, "clients_per_round": 4},
                             engine={**eng, "executor": ex, **({"workers": 2} if ex == "processes" else {})},
                             output={"dir": str(tiny()["output"]["dir"]) + ex}))
            for ex in ("sequential", "processes")]
    agree(runs[0].global_state, runs[1].global_state, BITS)
    assert [r["clients_returned"] for r in runs[0].history] == [r["clients_returned"] for r in runs[1].history]


VICTIM = 2


@pytest.fixture
def victim_fails(monkeypatch):
    """Client VICTIM's training raises (``how="raise"``) or uploads NaN (``how="nan"``)."""
    real = sequential.train_client

    def set_(how):
        def client(tools, payload, job, round_):
            if job.client_id == VICTIM:
                if how == "raise":
                    raise RuntimeError("the device ran out of battery")
                out = real(tools, payload, job, round_)
                out.upload = {**out.upload, "params": {k: torch.full_like(v, float("nan")) for k, v in out.upload["params"].items()}}
                return out
            return real(tools, payload, job, round_)

        monkeypatch.setattr(sequential, "train_client", client)

    return set_


@pytest.mark.agreement
@pytest.mark.parametrize("how", ["raise", "nan"])
def test_accept_failures_leaves_the_failing_client_out(tiny, victim_fails, how, caplog):
    victim_fails(how)
    cfg = tiny(train={"rounds": 4, "clients_per_round": 4}, engine={"executor": "sequential", "accept_failures": True})
    res = fedrift.run(cfg)
    _FIXED.clear()
    for t in range(1, 5):
        _FIXED[t] = [k for k in uniform(6, 4, 0, t, np.zeros((6, 10))) if k != VICTIM]
    hit = [t for t in range(1, 5) if len(_FIXED[t]) == 3]
    assert hit, "the victim is sampled in some round"
    ref = fedrift.run(tiny(train={"rounds": 4, "clients_per_round": 4}, engine={"sampling": "test_fixed", "executor": "sequential"},
                           output={"dir": cfg["output"]["dir"] + "-ref"}))
    agree(res.global_state, ref.global_state, BITS)
    assert [r["clients_failed"] for r in res.history] == [int(t in hit) for t in range(1, 5)]
    assert res.summary["clients_failed_total"] == len(hit)
    assert f"client {VICTIM} " in caplog.text and "left out" in caplog.text
    if how == "raise":  # the round raised first, then each client trained alone: said once a round it hit
        assert caplog.text.count("clients raised RuntimeError: the device ran out of battery; each client trains again alone") == len(hit)


def test_a_round_that_raises_as_a_whole_trains_each_client_alone_and_says_so(tiny, monkeypatch, caplog):
    """The batched executor's vectorised round raising for a reason of its own (a device out of
    memory for the whole group): under accept_failures each client trains again alone, no
    client is counted failed, and a line says the round lost its vectorised step."""
    batched = importlib.import_module("fedrift.engine.executors.batched")  # the package's `batched` is a function
    real, raised = batched.BatchedExecutor.train_group, []

    def group_fails_once(self, parts, batch_size, stop=None, **kw):
        if sum(len(p.jobs) for p in parts) > 1 and not raised:
            raised.append(1)
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\n(a second line)")
        return real(self, parts, batch_size, stop, **kw)

    monkeypatch.setattr(batched.BatchedExecutor, "train_group", group_fails_once)
    res = fedrift.run(tiny(train={"rounds": 2, "clients_per_round": 3}, engine={"executor": "batched", "accept_failures": True}))
    assert raised and res.summary["status"] == "completed" and res.summary["clients_failed_total"] == 0
    said = [r.getMessage() for r in caplog.records if r.name == "fedrift"]
    assert said == ["round 1: training its 3 clients raised RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB; "
                    "each client trains again alone"], said


def test_without_accept_failures_a_failing_client_stops_the_run(tiny, victim_fails):
    victim_fails("nan")
    with pytest.raises(DivergenceError, match="non-finite"):
        fedrift.run(tiny(train={"rounds": 4, "clients_per_round": 4}, engine={"executor": "sequential"}))
    victim_fails("raise")
    with pytest.raises(RuntimeError, match="out of battery"):
        fedrift.run(tiny(train={"rounds": 4, "clients_per_round": 4}, engine={"executor": "sequential"},
                         output={"dir": str(tiny()["output"]["dir"]) + "-r"}))


def test_a_round_without_clients_stops_the_run_and_keeps_the_metrics(tiny):
    """One client a round, dropout 0.9: some round loses it; the run stops there, naming it."""
    cfg = tiny(train={"rounds": 20, "clients_per_round": 1}, engine={"dropout": 0.9})
    eng = EngineConfig(dropout=0.9)
    first = next(t for t in range(1, 21) if not fates(eng, 0, t, uniform(6, 1, 0, t, np.zeros((6, 10)))).returning)
    with pytest.raises(NoClientsError, match=f"round {first}: no client returned"):
        fedrift.run(cfg)
    out = tiny()["output"]["dir"]
    summary = json.loads((Path(out) / "summary.json").read_text())
    assert summary["status"] == "no_clients" and summary["rounds"] == first - 1
    lines = (Path(out) / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == first - 1


def test_a_round_whose_clients_all_fail_counts_them(tiny, monkeypatch):
    """Every client raises in round 2: the run stops there (no_clients), and the round's three
    failures are counted in clients_failed_total, as a round that goes on would count them."""
    real = sequential.train_client

    def client(tools, payload, job, round_):
        if round_ == 2:
            raise RuntimeError("the devices lost power")
        return real(tools, payload, job, round_)

    monkeypatch.setattr(sequential, "train_client", client)
    cfg = tiny(train={"rounds": 3, "clients_per_round": 3}, engine={"executor": "sequential", "accept_failures": True})
    with pytest.raises(NoClientsError, match="round 2: no client returned"):
        fedrift.run(cfg)
    summary = json.loads((Path(cfg["output"]["dir"]) / "summary.json").read_text())
    assert summary["status"] == "no_clients" and summary["rounds"] == 1
    assert summary["clients_failed_total"] == 3 and summary["clients_returned_total"] == 3


@pytest.mark.parametrize("how", ["loss", "upload"])
def test_accept_failures_with_diverging_clients_ends_diverged(tiny, monkeypatch, how):
    """Client VICTIM's training diverges (a non-finite loss) whenever it is sampled: with
    accept_failures every round runs without it, and the run then ends as diverged (status,
    one line, every round's metrics kept), as it would without accept_failures. A non-finite
    upload with a finite loss (a corrupt device, not a diverging training) is only left out."""
    real = sequential.train_client

    def client(tools, payload, job, round_):
        out = real(tools, payload, job, round_)
        if job.client_id == VICTIM:
            if how == "loss":
                out.loss = torch.full_like(out.loss, float("inf"))
            out.upload = {**out.upload, "params": {k: torch.full_like(v, float("nan")) for k, v in out.upload["params"].items()}}
        return out

    monkeypatch.setattr(sequential, "train_client", client)
    cfg = tiny(train={"rounds": 4, "clients_per_round": 4}, engine={"executor": "sequential", "accept_failures": True})
    hit = [t for t in range(1, 5) if VICTIM in uniform(6, 4, 0, t, np.zeros((6, 10)))]
    assert hit
    folder = Path(cfg["output"]["dir"])
    if how == "upload":
        assert fedrift.run(cfg).summary["status"] == "completed"
        return
    with pytest.raises(DivergenceError, match=f"training diverged in effect: {len(hit)} client trainings from round {hit[0]} on"):
        fedrift.run(cfg)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["rounds"] == 4 and summary["clients_failed_total"] == len(hit)
    assert "accept_failures" in summary["message"] and "train.lr" in summary["message"]
    assert len((folder / "metrics.jsonl").read_text().splitlines()) == 4


def test_diverged_in_effect_is_one_line_and_exit_3(tiny, monkeypatch, capsys, tmp_path):
    import yaml

    from fedrift.cli import main

    real = sequential.train_client

    def client(tools, payload, job, round_):
        out = real(tools, payload, job, round_)
        if job.client_id == VICTIM:
            out.loss = torch.full_like(out.loss, float("nan"))
        return out

    monkeypatch.setattr(sequential, "train_client", client)
    cfg = tiny(train={"rounds": 4, "clients_per_round": 4}, engine={"executor": "sequential", "accept_failures": True})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["run", "-c", str(tmp_path / "c.yaml")]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fedrift: error: training diverged in effect" in err
