import pytest
import torch
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import ALGORITHMS, make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.engine.local import make_apply
from fedrift.functional.tree import stack
from fedrift.models import build_model

SETUP = Setup(num_classes=3, num_clients=3, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)
INFO = RoundInfo(round=1, num_clients=3, sampled=(0, 2))


def _uploads(*ws):
    return stack([{"params": {"w": torch.tensor(w)}} for w in ws])


def test_lookahead_broadcast_and_server_momentum_over_two_rounds_by_hand():
    alg = make("fedacg", SETUP, lam=0.5, beta=0.0)
    state = alg.init_server({"w": torch.tensor([1.0, -2.0])})
    assert torch.equal(state["momentum"]["w"], torch.zeros(2))
    # round 1: m_0 = 0, so the look-ahead is w_1 itself
    assert torch.equal(alg.broadcast(state, INFO)["params"]["w"], torch.tensor([1.0, -2.0]))
    p = torch.tensor([0.75, 0.25])
    uploads = _uploads([0.5, -1.0], [1.5, -2.0])  # avg = [0.75, -1.25]
    # Delta = avg - w~ = [-0.25, 0.75]; m_1 = 0.5 * 0 + Delta; w_2 = w_1 + m_1 = [0.75, -1.25]
    one = alg.aggregate(state, uploads, p, INFO)
    torch.testing.assert_close(one["momentum"]["w"], torch.tensor([-0.25, 0.75]))
    torch.testing.assert_close(one["params"]["w"], torch.tensor([0.75, -1.25]))
    # round 2: w~ = w_2 + 0.5 m_1 = [0.625, -0.875]; clients return [0.0, -1.0], [1.0, 0.0]: avg = [0.25, -0.75]
    look = alg.broadcast(one, INFO)["params"]["w"]
    torch.testing.assert_close(look, torch.tensor([0.625, -0.875]))
    # Delta = avg - w~ = [-0.375, 0.125]; m_2 = 0.5 m_1 + Delta = [-0.5, 0.5]; w_3 = w_2 + m_2 = [0.25, -0.75]
    two = alg.aggregate(one, _uploads([0.0, -1.0], [1.0, 0.0]), p, INFO)
    torch.testing.assert_close(two["momentum"]["w"], torch.tensor([-0.5, 0.5]))
    torch.testing.assert_close(two["params"]["w"], torch.tensor([0.25, -0.75]))


@pytest.mark.agreement
def test_proximal_pull_is_to_the_lookahead_by_hand():
    model = build_model("logreg", None, (4,), 3, seed=0)
    apply = make_apply(model, {})
    g = torch.Generator().manual_seed(1)
    params = {k: v.detach() + 0.3 * torch.randn(v.shape, generator=g) for k, v in model.named_parameters()}
    look = {k: v.detach() for k, v in model.named_parameters()}
    batch = {"x": torch.randn(5, 4, generator=g), "y": torch.tensor([0, 1, 2, 0, 1]), "w": torch.full((5,), 0.2)}
    payload = {"params": look}  # what broadcast sends: the look-ahead

    def grads(alg):
        return torch.func.grad(lambda p: alg.local_loss(p, batch, payload, {}, apply)[0])(params)

    base, acg = grads(make("fedavg", SETUP)), grads(make("fedacg", SETUP, beta=0.5))
    agree({k: acg[k] - base[k] for k in params}, {k: 0.5 * (params[k] - look[k]) for k in params})
    d2 = sum(((params[k] - look[k]) ** 2).sum() for k in params)
    l0 = make("fedavg", SETUP).local_loss(params, batch, payload, {}, apply)[0]
    l1 = make("fedacg", SETUP, beta=0.5).local_loss(params, batch, payload, {}, apply)[0]
    agree(l1 - l0, 0.25 * d2)


def test_defaults_and_tuning_space():
    hp = make("fedacg", SETUP).hparams
    assert (hp.lam, hp.beta) == (0.85, 1e-3)
    assert set(ALGORITHMS.get("fedacg").space) == {"lam", "beta"}


@pytest.mark.agreement
def test_fedacg_lam_zero_beta_zero_is_exactly_fedavg(tiny, tmp_path):
    train = {"rounds": 3}
    a = fedrift.run(tiny(algorithm={"name": "fedavg"}, train=train, output={"dir": str(tmp_path / "a")}))
    b = fedrift.run(tiny(algorithm={"name": "fedacg", "lam": 0.0, "beta": 0.0}, train=train, output={"dir": str(tmp_path / "b")}))
    agree(a.global_state, b.global_state, BITS)
    # one model down and one up per client, as FedAvg: the momentum rides inside the look-ahead
    assert [r["bytes_down"] for r in a.history] == [r["bytes_down"] for r in b.history]
    assert [r["bytes_up"] for r in a.history] == [r["bytes_up"] for r in b.history]
    # each term alone moves it
    for i, hp in enumerate(({"lam": 0.85, "beta": 0.0}, {"lam": 0.0, "beta": 0.5})):
        c = fedrift.run(tiny(algorithm={"name": "fedacg", **hp}, train=train, output={"dir": str(tmp_path / f"c{i}")}))
        assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state), hp
    assert set(c.server_state["momentum"]) == set(c.server_state["params"])


def test_batchnorm_statistics_go_down_without_the_lookahead():
    alg = make("fedacg", SETUP, lam=0.5)
    state = {"params": {"fc.weight": torch.tensor([1.0]), "bn.running_var": torch.tensor([0.1]), "bn.running_mean": torch.tensor([2.0])},
             "momentum": {"fc.weight": torch.tensor([2.0]), "bn.running_var": torch.tensor([-1.0]), "bn.running_mean": torch.tensor([1.0])}}
    sent = alg.broadcast(state, INFO)["params"]
    assert torch.equal(sent["fc.weight"], torch.tensor([2.0]))  # 1 + 0.5 * 2
    assert torch.equal(sent["bn.running_var"], torch.tensor([0.1])) and torch.equal(sent["bn.running_mean"], torch.tensor([2.0]))
