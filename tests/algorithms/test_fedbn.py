"""FedBN (algorithms/fedbn.py): BatchNorm entries stay on each client, the rest is FedAvg.

Hand cases of the hooks; on a BatchNorm ResNet-8: round 1's shared weights equal FedAvg's
bit for bit (both start from the initial model) while each client keeps its own BatchNorm and
the server its initial one; a client sampled again starts from the shared weights with its
stored BatchNorm (and trains as FedAvg from that model would), a first-timer from the
initial BatchNorm; evaluation is per client with its own BatchNorm; BatchNorm bytes never
travel; refusals are one line. The executors (batched, processes, ray), disk client states
and checkpoint/resume run it through tests/engine/algorithm_cases.py."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from agreement import BITS, agree
from conftest import one_line_refusal

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.algorithms.fedbn import local_keys, split
from fedrift.api import prepare
from fedrift.engine.build import build_run
from fedrift.engine.client import train_client
from fedrift.engine.executors.sequential import SequentialExecutor
from fedrift.engine.federation import Federation
from fedrift.engine.outputs import RunWriter
from fedrift.engine.server import Server
from fedrift.functional.tree import stack
from fedrift.models.norm import model_state
from fedrift.experiments.tune import score_of

SETUP = Setup(num_classes=3, num_clients=4, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0,
              clip_grad_norm=None, seed=0)
BN = {"name": "resnet8", "width": 4, "norm": "batch"}  # digits are 1x8x8: the smallest a ResNet takes
BN_ENTRIES = ("weight", "bias", "running_mean", "running_var")


def _state(shift: float = 0.0) -> dict[str, torch.Tensor]:
    """A model state as models/norm.py orders one: parameters, then running statistics."""
    return {"conv.weight": torch.tensor([1.0, 2.0]) + shift, "bn.weight": torch.tensor([1.0]) + shift,
            "bn.bias": torch.tensor([0.0]) + shift, "fc.weight": torch.tensor([3.0]) + shift,
            "bn.running_mean": torch.tensor([0.0]) + shift, "bn.running_var": torch.tensor([1.0]) + shift}


def test_the_batchnorm_entries_are_told_by_their_running_statistics():
    state = _state()
    assert local_keys(state) == {"bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"}
    shared, own = split(state)
    assert list(shared) == ["conv.weight", "fc.weight"] and list(own) == ["bn.weight", "bn.bias", "bn.running_mean",
                                                                          "bn.running_var"]
    assert local_keys({"conv.weight": torch.zeros(1), "norm.weight": torch.zeros(1)}) == set()  # GroupNorm: none


def test_hooks_by_hand():
    alg = make("fedbn", SETUP)
    w0 = _state()
    server = alg.init_server(w0)
    payload = alg.broadcast(server, RoundInfo(1, 4, (0, 1)))
    assert list(payload["params"]) == ["conv.weight", "fc.weight"]  # BatchNorm never goes down
    fresh = alg.init_client(w0)  # a client never sampled: the initial model's BatchNorm
    assert {k: v.tolist() for k, v in fresh["bn"].items()} == {
        "bn.weight": [1.0], "bn.bias": [0.0], "bn.running_mean": [0.0], "bn.running_var": [1.0]}
    own = {"bn": split(_state(5.0))[1]}
    start = alg.client_model(payload, own)  # shared weights with the client's own BatchNorm
    assert start["conv.weight"].tolist() == [1.0, 2.0] and start["bn.running_var"].tolist() == [6.0]
    upload, kept = alg.client_result(payload, _state(2.0), {"state": own})
    assert list(upload["params"]) == ["conv.weight", "fc.weight"]  # BatchNorm never goes up
    assert kept["bn"]["bn.bias"].tolist() == [2.0] and kept["bn"]["bn.running_mean"].tolist() == [2.0]
    # the server: p = (0.25, 0.75) over shared uploads 1 and 3 apart: w + 0.25*1 + 0.75*3; its BatchNorm stays
    uploads = stack([{"params": split(_state(1.0))[0]}, {"params": split(_state(3.0))[0]}])
    new = alg.aggregate(server, uploads, torch.tensor([0.25, 0.75]), RoundInfo(1, 4, (0, 1)))
    assert new["params"]["conv.weight"].tolist() == [3.5, 4.5] and new["params"]["fc.weight"].tolist() == [5.5]
    assert all(torch.equal(new["params"][k], w0[k]) for k in local_keys(w0))
    assert list(new["params"]) == list(w0)  # the model state's order kept
    # evaluation: the server's model with the client's BatchNorm in place of the server's
    scored = alg.client_model(new, own)
    assert scored["fc.weight"].tolist() == [5.5] and scored["bn.weight"].tolist() == [6.0]


@contextmanager
def _server(tiny, tmp_path: Path, name: str, **sections):
    cfg = tiny(model=BN, algorithm={"name": name}, output={"dir": str(tmp_path / name), "progress": False},
               engine={"executor": "sequential", "threads": 1}, **sections)
    prep = prepare(cfg)
    model, alg = build_run(prep)
    fed = Federation(prep.dataset, prep.partition, prep.device)
    writer = RunWriter(Path(prep.config.output.dir), overwrite=False)
    server = Server(prep.config, fed, model, alg, writer)
    try:
        yield server, model_state(model)
    finally:
        server.release()
        writer.close()
        writer.release()


def _round(server: Server, t: int):
    rnd = server.open(t)
    outputs = SequentialExecutor().run_round(rnd.tools, rnd.payload, rnd.jobs, t)
    return rnd, outputs


@pytest.mark.agreement
def test_round_one_is_fedavg_for_the_shared_weights_and_each_client_keeps_its_batchnorm(tiny, tmp_path):
    """Round 1: FedAvg and FedBN clients start from the same initial model, so they train to
    the same bits; FedBN's server then holds FedAvg's average of every shared tensor, bit for
    bit, and the initial BatchNorm, and each client's stored BatchNorm is its own end one."""
    with _server(tiny, tmp_path, "fedavg") as (avg, _), _server(tiny, tmp_path, "fedbn") as (bn, w0):
        avg_rnd, avg_out = _round(avg, 1)
        rnd, bn_out = _round(bn, 1)
        own = local_keys(w0)
        assert len(own) == 4 * 9  # resnet8: 9 BatchNorm layers
        ends = {o.client_id: o.end_params for o in bn_out}
        for a, b in zip(avg_out, bn_out):
            assert a.client_id == b.client_id
            agree({k: a.end_params[k] for k in w0}, {k: b.end_params[k] for k in w0}, BITS, where=f"client {a.client_id}")
        avg.close(avg_rnd, avg_out, [])
        bn.close(rnd, bn_out, [])
        for k in own:
            assert torch.equal(bn.state["params"][k], w0[k]), k  # the server's BatchNorm: the initial one
            assert not torch.equal(avg.state["params"][k], w0[k]), k  # (FedAvg averaged its own)
        shared = [k for k in w0 if k not in own]
        agree({k: bn.state["params"][k] for k in shared}, {k: avg.state["params"][k] for k in shared}, BITS)
        for k_client, end in ends.items():
            stored = bn.store.get(k_client)["bn"]
            assert stored.keys() == own and all(torch.equal(stored[k], end[k]) for k in own)


@pytest.mark.agreement
def test_a_client_sampled_again_resumes_its_batchnorm_and_trains_as_fedavg_from_that_model(tiny, tmp_path):
    """Over 4 rounds of 3 of 6 clients: a client sampled before starts from the server's shared
    weights with the BatchNorm it ended its last round with, a first-timer with the initial
    BatchNorm; and what it trains is FedAvg's local training from that model, bit for bit."""
    fedavg = make("fedavg", SETUP)
    seen: dict[int, dict[str, torch.Tensor]] = {}
    again = first = 0
    with _server(tiny, tmp_path, "fedbn", train={"rounds": 4, "clients_per_round": 3}) as (server, w0):
        own = local_keys(w0)
        for t in server.rounds():
            rnd, outputs = _round(server, t)
            for job, out in zip(rnd.jobs, outputs):
                start = rnd.tools.start_params(rnd.payload, job.context())
                expected_bn = seen.get(job.client_id, {k: w0[k] for k in own})
                again, first = again + (job.client_id in seen), first + (job.client_id not in seen)
                for k in w0:
                    want = expected_bn[k] if k in own else server.state["params"][k]
                    assert torch.equal(start[k], want), (t, job.client_id, k)
                as_fedavg = train_client(dataclasses.replace(rnd.tools, algorithm=fedavg), {"params": start}, job, t)
                agree({k: as_fedavg.end_params[k] for k in w0}, {k: out.end_params[k] for k in w0}, BITS,
                      where=f"round {t}, client {job.client_id}")
            ends = {o.client_id: {k: o.end_params[k] for k in own} for o in outputs}
            server.close(rnd, outputs, [])  # (a streamed close drops the outputs' tensors)
            seen.update(ends)
    assert again > 0 and first > 0  # both kinds of start were checked


@pytest.mark.agreement
def test_each_client_is_scored_with_its_own_batchnorm_and_batchnorm_bytes_never_travel(tiny, tmp_path):
    """local_accuracy is the mean over the panel's clients of (shared weights + own BatchNorm)
    on their own test split; val_local_accuracy is what the tuner scores; bytes down and up
    are FedAvg's less the BatchNorm entries of every client."""
    sections = dict(train={"rounds": 2, "clients_per_round": 3}, partition={"val_share": 0.2})
    with _server(tiny, tmp_path, "fedbn", **sections) as (server, w0):
        for t in server.rounds():
            rnd, outputs = _round(server, t)
            row = server.close(rnd, outputs, [])
        apply, fed = server.tools.apply, server.fed
        accs = []
        for k in server.panel:
            model = {**server.state["params"], **server.store.get(k)["bn"]}
            ix = fed.test_indices(k)
            with torch.no_grad():
                accs.append((apply(model, fed.x_test[ix]).argmax(1) == fed.y_test[ix]).double().mean().item())
        agree(row["local_accuracy"], sum(accs) / len(accs))
        assert score_of(row)[0] == "val_local_accuracy"
        bn_bytes = sum(w0[k].numel() * w0[k].element_size() for k in local_keys(w0))
        all_bytes = sum(v.numel() * v.element_size() for v in w0.values())
        assert row["bytes_down"] == 3 * (all_bytes - bn_bytes) and row["bytes_up"] == 3 * (all_bytes - bn_bytes)
    avg = fedrift.run(tiny(model=BN, **sections, output={"dir": str(tmp_path / "avg"), "progress": False}))
    assert avg.history[-1]["bytes_down"] == 3 * all_bytes  # FedAvg's model carries them


@pytest.mark.parametrize("args", [[], ["model.name=resnet8", "model.width=4"]], ids=["mlp", "resnet8-group"])
def test_a_model_without_batchnorm_is_refused_in_one_line(tmp_path, capsys, args):
    base = ["data.name=digits", "algorithm.name=fedbn", "train.rounds=1", "partition.num_clients=4",
            "train.clients_per_round=2", f"output.dir={tmp_path / 'run'}", "output.progress=false"]
    line = one_line_refusal(capsys, ["run", *base, *args], "model.norm", "fedbn", "allowed: batch")
    assert "resnet8" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key", ["eval.drift", "eval.personalize"])
def test_global_model_diagnostics_are_refused_in_one_line(tmp_path, capsys, key):
    base = ["data.name=digits", "algorithm.name=fedbn", "model.name=resnet8", "model.width=4", "model.norm=batch",
            "train.rounds=1", "partition.num_clients=4", "train.clients_per_round=2",
            f"output.dir={tmp_path / 'run'}", "output.progress=false"]
    one_line_refusal(capsys, ["run", *base, f"{key}=true"], key, "allowed: false")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
