"""FedSAM and FedASAM: the perturbation by hand, the gradient at w + e against an explicit
two-step autograd computation, the nested gradient under vmap, FedAvg identity at rho = 0."""

import math
from pathlib import Path

import pytest
import torch
from torch.func import grad, vmap
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import Setup
from fedrift.algorithms.fedsam import perturbation
from fedrift.engine.local import autograd_grad_and_value, make_apply
from fedrift.errors import ConfigError
from fedrift.models import build_model

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=2, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(name, **hp):
    return make(name, SETUP, **hp)


def test_sam_perturbation_by_hand():
    g = {"fc.weight": torch.tensor([[1.0, 1.0]]), "fc.bias": torch.tensor([2.0])}
    w = {"fc.weight": torch.tensor([[1.0, -2.0]]), "fc.bias": torch.tensor([0.5])}
    e = perturbation(g, w, 0.3)  # ||g|| = sqrt(6)
    torch.testing.assert_close(e["fc.weight"], torch.tensor([[0.3, 0.3]]) / math.sqrt(6))
    torch.testing.assert_close(e["fc.bias"], torch.tensor([0.6]) / math.sqrt(6))


def test_asam_perturbation_by_hand():
    """``e = rho T^2 g / ||T g||``, ``T = |w| + eta`` on weights, 1 on biases (ASAM's code)."""
    g = {"fc.weight": torch.tensor([[1.0, 1.0]]), "fc.bias": torch.tensor([2.0])}
    w = {"fc.weight": torch.tensor([[1.0, -2.0]]), "fc.bias": torch.tensor([0.5])}
    # eta = 0: T = [1, 2]; T g = [1, 2], [2]; ||T g|| = 3; e = 0.3 [1, 4] / 3, 0.3 * 2 / 3
    e = perturbation(g, w, 0.3, eta=0.0)
    torch.testing.assert_close(e["fc.weight"], torch.tensor([[0.1, 0.4]]))
    torch.testing.assert_close(e["fc.bias"], torch.tensor([0.2]))
    # eta = 1: T = [2, 3]; T g = [2, 3], [2]; ||T g|| = sqrt(17); e = rho [4, 9], rho [2] over sqrt(17)
    e = perturbation(g, w, 0.5, eta=1.0)
    torch.testing.assert_close(e["fc.weight"], torch.tensor([[2.0, 4.5]]) / math.sqrt(17))
    torch.testing.assert_close(e["fc.bias"], torch.tensor([1.0]) / math.sqrt(17))


def test_zero_gradient_perturbs_nothing():
    g = {"fc.weight": torch.zeros(1, 2), "fc.bias": torch.zeros(1)}
    w = {"fc.weight": torch.ones(1, 2), "fc.bias": torch.ones(1)}
    for eta in (None, 0.01):
        e = perturbation(g, w, 0.5, eta)
        assert all(torch.equal(v, torch.zeros_like(v)) for v in e.values())


def _case():
    model = build_model("logreg", None, (2,), 3, seed=0)
    apply = make_apply(model, {})
    params = {"fc.weight": torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), "fc.bias": torch.tensor([0.0, 0.5, -1.0])}
    batch = {"x": torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, -1.0]]), "y": torch.tensor([0, 2, 1]),
             "w": torch.tensor([0.25, 0.5, 0.25])}
    return apply, params, batch


def _two_step(apply, params, batch, rho, eta=None):
    """SAM as its papers write it, with plain autograd: g at w, e, then the gradient at w + e."""
    def ce(p):
        logp = torch.log_softmax(apply(p, batch["x"]), -1)
        return -(logp[torch.arange(len(batch["y"])), batch["y"]] * batch["w"]).sum()

    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    g = dict(zip(leaves, torch.autograd.grad(ce(leaves), list(leaves.values()))))
    if eta is None:
        norm = torch.sqrt(sum((v ** 2).sum() for v in g.values()))
        e = {k: rho * g[k] / norm for k in g}
    else:
        t = {k: params[k].abs() + eta if "weight" in k else torch.ones_like(params[k]) for k in g}
        norm = torch.sqrt(sum(((t[k] * g[k]) ** 2).sum() for k in g))
        e = {k: rho * t[k] ** 2 * g[k] / norm for k in g}
    shifted = {k: (params[k] + e[k]).requires_grad_(True) for k in params}
    return dict(zip(shifted, torch.autograd.grad(ce(shifted), list(shifted.values()))))


@pytest.mark.agreement
@pytest.mark.parametrize("name,hp,eta", [("fedsam", {"rho": 0.2}, None), ("fedasam", {"rho": 0.7, "eta": 0.1}, 0.1)])
def test_gradient_is_taken_at_the_perturbed_point(name, hp, eta):
    apply, params, batch = _case()
    alg = _alg(name, **hp)
    expected = _two_step(apply, params, batch, hp["rho"], eta)
    # torch.func (the batched executor's transform) and plain autograd (the sequential one's)
    functional = grad(lambda p: alg.local_loss(p, batch, {}, {}, apply)[0])(params)
    eager, _ = autograd_grad_and_value(lambda p: alg.local_loss(p, batch, {}, {}, apply))(params)
    plain = grad(lambda p: _alg("fedavg").local_loss(p, batch, {}, {}, apply)[0])(params)
    agree(functional, expected)
    agree(eager, expected)
    for k in params:
        assert (functional[k] - plain[k]).abs().max() > 1e-4  # the perturbation matters here


@pytest.mark.agreement
def test_objective_is_the_plain_loss():
    apply, params, batch = _case()
    alg = _alg("fedsam", rho=0.5)
    plain = _alg("fedavg").local_loss(params, batch, {}, {}, apply)[0]
    agree(alg.objective(params, batch, {}, {}, apply)[0], plain, BITS)
    assert not torch.equal(alg.local_loss(params, batch, {}, {}, apply)[0], plain)  # L(w + e)


@pytest.mark.agreement
@pytest.mark.parametrize("name,hp", [("fedsam", {"rho": 0.2}), ("fedasam", {"rho": 0.7, "eta": 0.1})])
def test_nested_gradient_under_vmap_matches_per_client(name, hp):
    """The batched executor's form: vmap over clients of grad of a loss that takes a grad."""
    apply, params, batch = _case()
    alg = _alg(name, **hp)
    stacked = {k: torch.stack([v, 0.5 * v - 0.1]) for k, v in params.items()}
    b = {k: torch.stack([v, v]) for k, v in batch.items()}
    b["w"] = torch.stack([batch["w"], torch.tensor([0.5, 0.5, 0.0])])  # the second client: one padded row

    def loss(p, bb):
        return alg.local_loss(p, bb, {}, {}, apply)[0]

    batched = vmap(grad(loss))(stacked, b)
    for i in range(2):
        one = grad(loss)({k: v[i] for k, v in stacked.items()}, {k: v[i] for k, v in b.items()})
        agree({k: batched[k][i] for k in one}, one, where=f"client {i}")


@pytest.mark.agreement
@pytest.mark.parametrize("name", ["fedsam", "fedasam"])
def test_rho_zero_is_exactly_fedavg(tiny, tmp_path, name):
    def run(alg, d):
        return fedrift.run(tiny(algorithm=alg, output={"dir": str(tmp_path / d)}, train={"rounds": 3}))

    a = run({"name": "fedavg"}, "a")
    b = run({"name": name, "rho": 0.0}, "b")
    agree(a.global_state, b.global_state, BITS)
    c = run({"name": name}, "c")
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)


def test_runs_with_weight_decay_and_clipping(tiny, tmp_path):
    """The train section's decay and clipping act on the returned gradient grad L(w + e)."""
    r = fedrift.run(tiny(algorithm={"name": "fedasam"}, train={"weight_decay": 1e-3, "clip_grad_norm": 1.0},
                         engine={"executor": "batched"}))
    assert all(torch.isfinite(v).all() for v in r.global_state.values())
    assert r.summary["final_accuracy"] > 0.3


@pytest.mark.parametrize("name", ["fedsam", "fedasam"])
def test_sample_level_privacy_is_refused(tiny, name):
    """DP-SGD takes each sample's gradient alone: the batch's perturbation would not exist."""
    cfg = tiny(algorithm={"name": name}, privacy={"level": "sample"})
    with pytest.raises(ConfigError, match="whole batch"):
        fedrift.run(cfg)
    assert not Path(cfg["output"]["dir"]).exists()
