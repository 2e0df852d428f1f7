import pytest
import torch
from agreement import BITS, agree
from linear_model import apply
from linear_model import rand_params as _rand

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.functional.tree import stack

SETUP = Setup(num_classes=3, num_clients=4, feature_dim=4, lr=0.1, momentum=0.9, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(name, setup=SETUP, **hp):
    return make(name, setup, **hp)


@pytest.mark.agreement
def test_local_loss_adds_minus_gr_dot_w_and_the_proximal_term():
    alpha = 0.5
    alg, base = _alg("feddyn", alpha=alpha), _alg("fedavg")
    w, w_t, gr = _rand(0), _rand(1), _rand(2, 0.3)
    g = torch.Generator().manual_seed(3)
    batch = {"x": torch.randn(5, 4, generator=g), "y": torch.tensor([0, 1, 2, 0, 1]), "w": torch.full((5,), 0.2)}
    payload, ctx = {"params": w_t}, {"state": {"grad": gr}}

    def loss_and_grad(a):
        return torch.func.grad_and_value(lambda p: a.local_loss(p, batch, payload, ctx, apply), has_aux=True)(w)

    (g1, (l1, aux)), (g0, (l0, _)) = loss_and_grad(alg), loss_and_grad(base)
    # gradient: grad CE - gr_k + alpha (w - w_t)
    agree({k: g1[k] - g0[k] for k in w}, {k: -gr[k] + alpha * (w[k] - w_t[k]) for k in w})
    dot = sum((gr[k] * w[k]).sum() for k in w)
    d2 = sum(((w[k] - w_t[k]) ** 2).sum() for k in w)
    agree(l1, l0 - dot + 0.5 * alpha * d2)
    agree(aux["ce_loss"], l0)


def test_client_gradient_state_update_by_hand():
    alg = _alg("feddyn", alpha=0.5)
    fresh = alg.init_client({"w": torch.ones(2)})  # a client never sampled: gr_k = 0
    assert list(fresh) == ["grad"] and torch.equal(fresh["grad"]["w"], torch.zeros(2))
    payload = {"params": {"w": torch.tensor([1.0, 1.0])}}
    ctx = {"state": {"grad": {"w": torch.tensor([1.0, 2.0])}}, "num_steps": torch.tensor(3.0)}
    upload, state = alg.client_result(payload, {"w": torch.tensor([1.5, 0.0])}, ctx)
    # gr_k - alpha (w_k - w_t) = [1, 2] - 0.5 [0.5, -1]
    torch.testing.assert_close(state["grad"]["w"], torch.tensor([0.75, 2.5]))
    assert list(upload) == ["params"] and torch.equal(upload["params"]["w"], torch.tensor([1.5, 0.0]))


def test_server_h_and_model_by_hand():
    alg = _alg("feddyn", alpha=0.5)
    state = alg.init_server({"w": torch.tensor([1.0, 1.0])})
    assert torch.equal(state["h"]["w"], torch.zeros(2))
    state = {**state, "h": {"w": torch.tensor([0.5, 0.25])}}
    uploads = stack([{"params": {"w": torch.tensor([2.0, 0.0])}}, {"params": {"w": torch.tensor([0.0, 4.0])}}])
    p = torch.tensor([0.75, 0.25], dtype=torch.float64)
    out = alg.aggregate(state, uploads, p, RoundInfo(round=2, num_clients=4, sampled=(1, 3)))
    # sum_k (w_k - w_t) = [0, 2]; h = h - (0.5 / 4) [0, 2] = [0.5, 0]
    torch.testing.assert_close(out["h"]["w"], torch.tensor([0.5, 0.0]))
    # avg = [1.5, 1.0]; w = avg - h / alpha = [0.5, 1.0]
    torch.testing.assert_close(out["params"]["w"], torch.tensor([0.5, 1.0]))


@pytest.mark.agreement
def test_feddyn_alpha_zero_is_exactly_fedavg(tiny, tmp_path):
    train = {"rounds": 3}
    a = fedrift.run(tiny(algorithm={"name": "fedavg"}, train=train, output={"dir": str(tmp_path / "a")}))
    b = fedrift.run(tiny(algorithm={"name": "feddyn", "alpha": 0.0}, train=train, output={"dir": str(tmp_path / "b")}))
    agree(a.global_state, b.global_state, BITS)
    agree([r["train_loss"] for r in a.history], [r["train_loss"] for r in b.history], BITS)
    assert [r["bytes_up"] for r in a.history] == [r["bytes_up"] for r in b.history]  # w_k only
    c = fedrift.run(tiny(algorithm={"name": "feddyn", "alpha": 0.1}, train=train, output={"dir": str(tmp_path / "c")}))
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)
    assert any(v.abs().max() > 0 for v in c.server_state["h"].values())
