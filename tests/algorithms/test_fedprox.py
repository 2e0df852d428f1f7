import pytest
import torch
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import Setup
from fedrift.engine.local import make_apply
from fedrift.models import build_model

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(name, **hp):
    return make(name, SETUP, **hp)


@pytest.mark.agreement
def test_proximal_gradient_is_mu_times_distance_to_global():
    model = build_model("logreg", None, (4,), 3, seed=0)
    apply = make_apply(model, {})
    g = torch.Generator().manual_seed(1)
    params = {k: v.detach() + 0.3 * torch.randn(v.shape, generator=g) for k, v in model.named_parameters()}
    anchor = {k: v.detach() for k, v in model.named_parameters()}
    batch = {"x": torch.randn(5, 4, generator=g), "y": torch.tensor([0, 1, 2, 0, 1]), "w": torch.full((5,), 0.2)}
    payload = {"params": anchor}

    def grads(alg):
        return torch.func.grad(lambda p: alg.local_loss(p, batch, payload, {}, apply)[0])(params)

    base, prox = grads(_alg("fedavg")), grads(_alg("fedprox", mu=0.5))
    agree({k: prox[k] - base[k] for k in params}, {k: 0.5 * (params[k] - anchor[k]) for k in params})
    # and the loss value itself: CE + (mu/2) ||w - w_t||^2
    d2 = sum(((params[k] - anchor[k]) ** 2).sum() for k in params)
    l0 = _alg("fedavg").local_loss(params, batch, payload, {}, apply)[0]
    l1 = _alg("fedprox", mu=0.5).local_loss(params, batch, payload, {}, apply)[0]
    agree(l1 - l0, 0.25 * d2)


@pytest.mark.agreement
def test_fedprox_with_mu_zero_is_exactly_fedavg(tiny, tmp_path):
    a = fedrift.run(tiny(algorithm={"name": "fedavg"}, output={"dir": str(tmp_path / "a")}, train={"rounds": 3}))
    b = fedrift.run(tiny(algorithm={"name": "fedprox", "mu": 0.0}, output={"dir": str(tmp_path / "b")}, train={"rounds": 3}))
    agree(a.global_state, b.global_state, BITS)
    c = fedrift.run(tiny(algorithm={"name": "fedprox", "mu": 0.5}, output={"dir": str(tmp_path / "c")}, train={"rounds": 3}))
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)
