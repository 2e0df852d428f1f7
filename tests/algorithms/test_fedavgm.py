import pytest
import torch
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import ALGORITHMS, make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.config import validate_options
from fedrift.functional.tree import stack

SETUP = Setup(num_classes=3, num_clients=3, feature_dim=4, lr=0.1, momentum=0.9, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(name, setup=SETUP, **hp):
    return make(name, setup, **hp)


def _uploads(*ws):
    return stack([{"params": {"w": torch.tensor(w)}} for w in ws])


def test_server_momentum_over_two_rounds_by_hand():
    alg = _alg("fedavgm", beta=0.5, eta_s=2.0)
    state = alg.init_server({"w": torch.tensor([1.0, -2.0])})
    assert torch.equal(state["momentum"]["w"], torch.zeros(2))
    p = torch.tensor([0.75, 0.25])
    info = RoundInfo(round=1, num_clients=3, sampled=(0, 2))
    uploads = _uploads([0.5, -1.0], [1.5, -2.0])  # avg = [0.75, -1.25]
    # round 1: d = w_0 - avg = [0.25, -0.75]; v = d; w_1 = w_0 - 2 v = [0.5, -0.5]
    one = alg.aggregate(state, uploads, p, info)
    torch.testing.assert_close(one["momentum"]["w"], torch.tensor([0.25, -0.75]))
    torch.testing.assert_close(one["params"]["w"], torch.tensor([0.5, -0.5]))
    # round 2, same client models: d = w_1 - avg = [-0.25, 0.75]; v = 0.5 v + d = [-0.125, 0.375];
    # w_2 = w_1 - 2 v = [0.75, -1.25]
    two = alg.aggregate(one, uploads, p, info)
    torch.testing.assert_close(two["momentum"]["w"], torch.tensor([-0.125, 0.375]))
    torch.testing.assert_close(two["params"]["w"], torch.tensor([0.75, -1.25]))


@pytest.mark.agreement
def test_beta_zero_aggregate_is_the_weighted_average_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(7, generator=g) for _ in range(3)]
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    alg = _alg("fedavgm", beta=0.0)
    state = {"params": {"w": torch.randn(7, generator=g)}, "momentum": {"w": torch.randn(7, generator=g)}}
    out = alg.aggregate(state, stack([{"params": {"w": w}} for w in ws]), p, RoundInfo(1, 3, (0, 1, 2)))
    fedavg = ALGORITHMS.get("fedavg").factory(validate_options("algorithm", ALGORITHMS.get("fedavg").params, {}), SETUP)
    ref = fedavg.aggregate({"params": state["params"]}, stack([{"params": {"w": w}} for w in ws]), p, RoundInfo(1, 3, (0, 1, 2)))
    agree(out["params"]["w"], ref["params"]["w"], BITS)


@pytest.mark.agreement
def test_fedavgm_beta_zero_is_exactly_fedavg(tiny, tmp_path):
    train = {"rounds": 3}
    a = fedrift.run(tiny(algorithm={"name": "fedavg"}, train=train, output={"dir": str(tmp_path / "a")}))
    b = fedrift.run(tiny(algorithm={"name": "fedavgm", "beta": 0.0, "eta_s": 1.0}, train=train, output={"dir": str(tmp_path / "b")}))
    agree(a.global_state, b.global_state, BITS)
    # one model down and one up per client, as FedAvg
    assert [r["bytes_down"] for r in a.history] == [r["bytes_down"] for r in b.history]
    assert [r["bytes_up"] for r in a.history] == [r["bytes_up"] for r in b.history]
    c = fedrift.run(tiny(algorithm={"name": "fedavgm"}, train=train, output={"dir": str(tmp_path / "c")}))
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)
    assert set(c.server_state["momentum"]) == set(c.server_state["params"])
