import pytest
import torch
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.functional.tree import stack

SETUP = Setup(num_classes=3, num_clients=3, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(name, setup=SETUP, **hp):
    return make(name, setup, **hp)


@pytest.mark.agreement
def test_server_update_is_the_formula_by_hand():
    alg = _alg("slowmo", beta=0.5, alpha=2.0)
    eta, beta, alpha = 0.1, 0.5, 2.0
    w_t = torch.tensor([1.0, -2.0, 0.5])
    state = alg.init_server({"w": w_t})
    assert torch.equal(state["momentum"]["w"], torch.zeros(3))
    m_t = torch.tensor([0.3, 0.1, -0.2])
    state = {**state, "momentum": {"w": m_t}}
    w_k = [torch.tensor([0.9, -1.8, 0.4]), torch.tensor([1.2, -2.2, 0.7])]
    p = torch.tensor([0.75, 0.25])
    info = RoundInfo(round=1, num_clients=3, sampled=(0, 2))
    out = alg.aggregate(state, stack([{"params": {"w": w}} for w in w_k]), p, info)

    g = (p[0] * (w_t - w_k[0]) + p[1] * (w_t - w_k[1])) / eta
    m = beta * m_t + g
    agree(out["momentum"]["w"], m)
    agree(out["params"]["w"], w_t - alpha * eta * m)
    # the momentum carries into the next round: same clients, same models
    again = alg.aggregate(out, stack([{"params": {"w": w}} for w in w_k]), p, info)
    w1 = w_t - alpha * eta * m
    g1 = (p[0] * (w1 - w_k[0]) + p[1] * (w1 - w_k[1])) / eta
    agree(again["momentum"]["w"], beta * m + g1)


@pytest.mark.agreement
def test_slowmo_beta_zero_alpha_one_is_exactly_fedavg(tiny, tmp_path):
    train = {"rounds": 3, "momentum": 0.0}
    a = fedrift.run(tiny(algorithm={"name": "fedavg"}, train=train, output={"dir": str(tmp_path / "a")}))
    b = fedrift.run(tiny(algorithm={"name": "slowmo", "beta": 0.0, "alpha": 1.0}, train=train, output={"dir": str(tmp_path / "b")}))
    agree(a.global_state, b.global_state, BITS)
    # one model down and one up per client, as FedAvg
    pbytes = sum(v.numel() * v.element_size() for v in a.global_state.values())
    assert b.history[-1]["bytes_down"] == 3 * pbytes and b.history[-1]["bytes_up"] == 3 * pbytes
    # the default (beta 0.9) moves differently
    c = fedrift.run(tiny(algorithm={"name": "slowmo"}, train=train, output={"dir": str(tmp_path / "c")}))
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)
    assert set(c.server_state["momentum"]) == set(c.server_state["params"])


@pytest.mark.agreement
def test_local_momentum_option_is_the_engine_sgd_momentum(tiny, tmp_path):
    # train.momentum is not used by slowmo; its local_momentum is (torch.optim.SGD's rule)
    a = fedrift.run(tiny(algorithm={"name": "fedavg"}, train={"rounds": 2, "momentum": 0.9}, output={"dir": str(tmp_path / "a")}))
    b = fedrift.run(
        tiny(algorithm={"name": "slowmo", "beta": 0.0, "local_momentum": 0.9}, train={"rounds": 2, "momentum": 0.0},
             output={"dir": str(tmp_path / "b")})
    )
    agree(a.global_state, b.global_state, BITS)
