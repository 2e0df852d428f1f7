"""FedPer (algorithms/fedper.py) and the split by layers that LG-FedAvg, FedRep and FedBABU
share: the layers of fedrift's models; the hooks by hand on a two-layer linear model (which
entries are averaged, which kept); personal_layers 0 is FedAvg, the whole run bit for bit;
round 1's body is FedAvg's and a client sampled again resumes its head and trains as FedAvg
from that model, bit for bit; local_accuracy is each client's own model on its own split; a
split that shares nothing is refused in one line; fedrift compare and tune take all four
methods. The
executors (batched, processes, ray), disk client states and checkpoints run it through
tests/engine/algorithm_cases.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from agreement import BITS, agree, untimed
from conftest import one_line_refusal
from partial_sharing import one_round, server_of, two_layer_apply, two_layers

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.algorithms.fedper import layers, top_keys
from fedrift.engine.client import train_client
from fedrift.experiments.tune import score_of
from fedrift.functional.tree import stack
from fedrift.models import build_model
from fedrift.models.norm import model_state
from fedrift.models.resnet import ResNetParams

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=2, lr=0.1, momentum=0.0, weight_decay=0.0,
              clip_grad_norm=None, seed=0)


def test_the_layers_of_the_models_top_last():
    mlp = model_state(build_model("mlp", None, (1, 8, 8), 10, 0))
    assert layers(mlp) == (("layers.0.weight", "layers.0.bias"), ("layers.1.weight", "layers.1.bias"),
                           ("fc.weight", "fc.bias"))
    assert top_keys(mlp, 1) == {"fc.weight", "fc.bias"} and top_keys(mlp, 9) == set(mlp)
    cnn = model_state(build_model("cnn", None, (1, 28, 28), 10, 0))
    assert [layer[0] for layer in layers(cnn)] == ["conv1.weight", "conv2.weight", "dense.weight", "fc.weight"]
    # a BatchNorm ResNet: each normalisation (weight, bias, running statistics) joins the
    # convolution before it, though the model state lists the statistics after every parameter
    bn = model_state(build_model("resnet8", ResNetParams(width=4, norm="batch"), (1, 8, 8), 10, 0))
    first = layers(bn)[0]
    assert set(first) == {"stem.weight", "stem_norm.weight", "stem_norm.bias", "stem_norm.running_mean",
                          "stem_norm.running_var"}
    assert layers(bn)[-1] == ("fc.weight", "fc.bias") and sum(map(len, layers(bn))) == len(bn)


@pytest.mark.agreement
def test_hooks_by_hand_on_a_two_layer_linear_model():
    """Two clients: each trains its whole model one step; only the body goes up and is
    averaged with p = (0.25, 0.75); each keeps its own head; a client starts from the
    broadcast body with its own head, and is scored with it."""
    alg = make("fedper", SETUP)
    w0 = two_layers()
    server = alg.init_server(w0)
    payload = alg.broadcast(server, RoundInfo(1, 2, (0, 1)))
    assert list(payload["params"]) == ["body.weight", "body.bias"]  # the head never goes down
    states = [alg.init_client(w0) for _ in range(2)]
    assert {k: torch.equal(v, w0[k]) for k, v in states[0]["own"].items()} == {"fc.weight": True, "fc.bias": True}
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(5, 4, generator=g), torch.tensor([0, 1, 2, 0, 1])), (torch.randn(3, 4, generator=g),
                                                                               torch.tensor([2, 2, 1]))]
    uploads, kept, ends = [], [], []
    for (x, y), state in zip(data, states):
        start = alg.client_model(payload, state)
        batch = {"x": x, "y": y, "w": torch.full((len(y),), 1.0 / len(y))}
        leaves = {k: v.clone().requires_grad_(True) for k, v in start.items()}
        grads = torch.autograd.grad(alg.local_loss(leaves, batch, payload, {}, two_layer_apply)[0], list(leaves.values()))
        end = {k: v - 0.1 * g for (k, v), g in zip(start.items(), grads)}  # one SGD step of the whole model
        assert all(not torch.equal(end[k], w0[k]) for k in w0)  # every layer trained
        up, own = alg.client_result(payload, end, {"state": state})
        uploads.append(up), kept.append(own), ends.append(end)
        assert list(up["params"]) == ["body.weight", "body.bias"]  # the head never goes up
        assert own["own"].keys() == {"fc.weight", "fc.bias"} and all(torch.equal(own["own"][k], end[k]) for k in own["own"])
    new = alg.aggregate(server, stack(uploads), torch.tensor([0.25, 0.75]), RoundInfo(1, 2, (0, 1)))
    for k in ("body.weight", "body.bias"):
        agree(new["params"][k], 0.25 * ends[0][k] + 0.75 * ends[1][k])
    assert torch.equal(new["params"]["fc.weight"], w0["fc.weight"]) and list(new["params"]) == list(w0)
    scored = alg.client_model(new, kept[1])  # client 1's model: the new body, its own head
    assert torch.equal(scored["body.bias"], new["params"]["body.bias"]) and torch.equal(scored["fc.bias"], ends[1]["fc.bias"])


@pytest.mark.agreement
def test_with_nothing_personal_it_is_fedavg(tiny, tmp_path):
    sections = dict(train={"rounds": 3})
    a = fedrift.run(tiny(algorithm={"name": "fedavg"}, output={"dir": str(tmp_path / "a")}, **sections))
    b = fedrift.run(tiny(algorithm={"name": "fedper", "personal_layers": 0}, output={"dir": str(tmp_path / "b")}, **sections))
    agree(a.global_state, b.global_state, BITS)
    agree(untimed(a.history), untimed(b.history), BITS)


@pytest.mark.agreement
def test_a_client_trains_as_fedavg_from_the_shared_body_and_its_own_head(tiny, tmp_path):
    """Over 4 rounds of 3 of 6 clients: round 1's body on the server is FedAvg's, bit for bit; a
    client sampled again starts from the server's body with the head it ended its last round
    with, a first-timer with the initial head; its local training is FedAvg's from that model,
    bit for bit; the server's head stays the initial one."""
    fedavg = make("fedavg", SETUP)
    seen: dict[int, dict[str, torch.Tensor]] = {}
    again = first = 0
    with server_of(tiny, tmp_path, "avg", algorithm={"name": "fedavg"}) as (avg, _), \
            server_of(tiny, tmp_path, "per", algorithm={"name": "fedper"}, train={"rounds": 4, "clients_per_round": 3}) \
            as (server, w0):
        head = {"fc.weight", "fc.bias"}
        rnd, outputs = one_round(avg, 1)
        avg.close(rnd, outputs, [])
        for t in server.rounds():
            rnd, outputs = one_round(server, t)
            for job, out in zip(rnd.jobs, outputs):
                start = rnd.tools.start_params(rnd.payload, job.context())
                own = seen.get(job.client_id, {k: w0[k] for k in head})
                again, first = again + (job.client_id in seen), first + (job.client_id not in seen)
                for k in w0:
                    assert torch.equal(start[k], own[k] if k in head else server.state["params"][k]), (t, job.client_id, k)
                as_fedavg = train_client(dataclasses.replace(rnd.tools, algorithm=fedavg), {"params": start}, job, t)
                agree(as_fedavg.end_params, out.end_params, BITS, where=f"round {t}, client {job.client_id}")
            ends = {o.client_id: {k: o.end_params[k] for k in head} for o in outputs}
            server.close(rnd, outputs, [])
            seen.update(ends)
            if t == 1:  # both started from the initial model: the same body, averaged alike
                agree({k: server.state["params"][k] for k in w0 if k not in head},
                      {k: avg.state["params"][k] for k in w0 if k not in head}, BITS)
            assert all(torch.equal(server.state["params"][k], w0[k]) for k in head)
    assert again > 0 and first > 0


@pytest.mark.agreement
def test_local_accuracy_is_each_clients_own_model_on_its_own_split(tiny, tmp_path):
    sections = dict(algorithm={"name": "fedper"}, train={"rounds": 2, "clients_per_round": 3},
                    partition={"val_share": 0.2})
    with server_of(tiny, tmp_path, "per", **sections) as (server, w0):
        for t in server.rounds():
            rnd, outputs = one_round(server, t)
            row = server.close(rnd, outputs, [])
        apply, fed = server.tools.apply, server.fed
        accs = []
        for k in server.panel:
            model = {**server.state["params"], **server.store.get(k)["own"]}
            ix = fed.test_indices(k)
            with torch.no_grad():
                accs.append((apply(model, fed.x_test[ix]).argmax(1) == fed.y_test[ix]).double().mean().item())
        agree(row["local_accuracy"], sum(accs) / len(accs))
        assert score_of(row)[0] == "val_local_accuracy"
        head = sum(w0[k].numel() * w0[k].element_size() for k in ("fc.weight", "fc.bias"))
        body = sum(v.numel() * v.element_size() for v in w0.values()) - head
        assert row["bytes_down"] == 3 * body and row["bytes_up"] == 3 * body  # the head never travels


def test_a_split_that_shares_nothing_is_refused_in_one_line(tmp_path, capsys):
    base = ["data.name=digits", "model.name=mlp", "model.hidden=[16]", "train.rounds=1", "partition.num_clients=4",
            "train.clients_per_round=2", f"output.dir={tmp_path / 'run'}", "output.progress=false"]
    one_line_refusal(capsys, ["run", *base, "algorithm.name=fedper", "algorithm.personal_layers=2"],
                     "algorithm.personal_layers", "allowed: 0 to 1")
    assert not (tmp_path / "run").exists()


def test_compare_and_tune_take_the_four_partial_sharing_methods(tiny, tmp_path):
    """One in-process call each: fedrift compare runs FedPer, LG-FedAvg, FedRep and FedBABU
    beside FedAvg; fedrift tune scores the per-client ones on their clients' own validation
    splits and FedBABU, one global model, on the global one."""
    cfg = tiny(train={"rounds": 2}, partition={"val_share": 0.2})
    cfg.pop("output")
    names = ["fedper", "lgfedavg", "fedrep", "fedbabu"]
    rows = fedrift.compare(cfg, algorithms=["fedavg", *names], seeds=[0], out=tmp_path / "c", report=False,
                           verbose=False)
    assert [r["completed"] for r in rows] == [1] * 5
    results = fedrift.tune(cfg, algorithms=["fedper", "fedrep", "fedbabu"], trials=1, out=tmp_path / "t", pruner="none",
                           report=False, verbose=False)
    assert {n: results[n]["best"]["metric"] for n in results} == {
        "fedper": "val_local_accuracy", "fedrep": "val_local_accuracy", "fedbabu": "val_accuracy"}


@pytest.mark.agreement
def test_per_client_test_at_rounds_skips_the_whole_sets_and_keeps_the_local_accuracies(tiny, tmp_path):
    """eval.per_client_test=at_rounds: each client's model on the whole test set and validation
    union only at eval.at_rounds and the last round; every round's local accuracies (each model
    on its own samples, alone) are those of the run that passes the whole sets each round (the
    same per-sample predictions, in other batches: the rounding rule), and so is the final
    model and its final accuracy."""
    sections = dict(algorithm={"name": "fedper"}, train={"rounds": 4}, partition={"val_share": 0.2})
    every = fedrift.run(tiny(**sections, output={"dir": str(tmp_path / "every")}))
    sparse = fedrift.run(tiny(**sections, eval={"per_client_test": "at_rounds", "at_rounds": [2]},
                              output={"dir": str(tmp_path / "sparse")}))
    assert [r["round"] for r in sparse.history if "test_accuracy" in r] == [2, 4]
    assert [r["round"] for r in sparse.history if "val_accuracy" in r] == [2, 4]
    local = ("local_accuracy", "local_accuracy_worst10", "val_local_accuracy", "local_clients")
    agree([{k: r[k] for k in local} for r in sparse.history], [{k: r[k] for k in local} for r in every.history])
    agree(sparse.global_state, every.global_state, BITS)  # evaluation never touches training
    agree(sparse.summary["final_accuracy"], every.summary["final_accuracy"], BITS)
    assert (tmp_path / "sparse" / "clients.csv").read_text() == (tmp_path / "every" / "clients.csv").read_text()
