"""LG-FedAvg (algorithms/lgfedavg.py): FedPer's split turned over. By hand on a two-layer
linear model: the head goes down, up and is averaged, each client keeps its body; with every
layer global it is FedAvg, the whole run bit for bit; round 1's head is FedAvg's average, bit
for bit, and each client keeps its own lower layers. The executors run it through
tests/engine/algorithm_cases.py."""

from __future__ import annotations

import pytest
import torch
from agreement import BITS, agree, untimed
from partial_sharing import one_round, server_of, two_layers

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.functional.tree import stack

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=2, lr=0.1, momentum=0.0, weight_decay=0.0,
              clip_grad_norm=None, seed=0)
BODY, HEAD = ("body.weight", "body.bias"), ("fc.weight", "fc.bias")


@pytest.mark.agreement
def test_hooks_by_hand_the_head_is_averaged_and_each_client_keeps_its_body():
    alg = make("lgfedavg", SETUP)
    w0 = two_layers()
    server = alg.init_server(w0)
    payload = alg.broadcast(server, RoundInfo(1, 2, (0, 1)))
    assert tuple(payload["params"]) == HEAD  # the lower layers never go down
    own = alg.init_client(w0)
    assert tuple(own["own"]) == BODY
    mine = {"own": {k: v + 1.0 for k, v in own["own"].items()}}
    start = alg.client_model(payload, mine)
    assert torch.equal(start["body.bias"], w0["body.bias"] + 1.0) and torch.equal(start["fc.bias"], w0["fc.bias"])
    ends = [two_layers(1.0), two_layers(3.0)]
    results = [alg.client_result(payload, end, {"state": mine}) for end in ends]
    assert all(tuple(up["params"]) == HEAD for up, _ in results)  # nor up
    assert all(torch.equal(kept["own"]["body.weight"], end["body.weight"]) for (_, kept), end in zip(results, ends))
    new = alg.aggregate(server, stack([up for up, _ in results]), torch.tensor([0.25, 0.75]), RoundInfo(1, 2, (0, 1)))
    for k in HEAD:
        agree(new["params"][k], 0.25 * ends[0][k] + 0.75 * ends[1][k])
    assert all(torch.equal(new["params"][k], w0[k]) for k in BODY)  # the server's lower layers: the initial ones


@pytest.mark.agreement
def test_with_every_layer_global_it_is_fedavg(tiny, tmp_path):
    sections = dict(train={"rounds": 3})  # the tiny MLP has two layers
    a = fedrift.run(tiny(algorithm={"name": "fedavg"}, output={"dir": str(tmp_path / "a")}, **sections))
    b = fedrift.run(tiny(algorithm={"name": "lgfedavg", "global_layers": 2}, output={"dir": str(tmp_path / "b")},
                         **sections))
    agree(a.global_state, b.global_state, BITS)
    agree(untimed(a.history), untimed(b.history), BITS)


@pytest.mark.agreement
def test_round_one_averages_the_head_as_fedavg_and_each_client_keeps_its_lower_layers(tiny, tmp_path):
    with server_of(tiny, tmp_path, "avg", algorithm={"name": "fedavg"}) as (avg, _), \
            server_of(tiny, tmp_path, "lg", algorithm={"name": "lgfedavg"}) as (lg, w0):
        rnd_a, out_a = one_round(avg, 1)
        rnd, out = one_round(lg, 1)
        for a, b in zip(out_a, out):  # the same start (the initial model): the same training
            agree(a.end_params, b.end_params, BITS, where=f"client {a.client_id}")
        avg.close(rnd_a, out_a, [])
        ends = {o.client_id: o.end_params for o in out}
        lg.close(rnd, out, [])
        head = ("fc.weight", "fc.bias")
        agree({k: lg.state["params"][k] for k in head}, {k: avg.state["params"][k] for k in head}, BITS)
        assert all(torch.equal(lg.state["params"][k], w0[k]) for k in w0 if k not in head)
        for k, end in ends.items():
            stored = lg.store.get(k)["own"]
            assert stored.keys() == set(w0) - set(head) and all(torch.equal(stored[n], end[n]) for n in stored)
