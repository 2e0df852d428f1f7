"""FedRS: absent classes' logits scaled by alpha, the loss by hand, FedAvg identity, learning."""

import math

import pytest
import torch
from torch.func import grad, vmap
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import Setup
from fedrift.algorithms.fedrs import restricted_logits
from fedrift.engine.local import make_apply
from fedrift.models import build_model

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=2, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(name, **hp):
    return make(name, SETUP, **hp)


def test_absent_classes_are_scaled_by_alpha():
    z = torch.tensor([[1.0, 2.0, 3.0], [-4.0, 6.0, 0.5]])
    counts = torch.tensor([5.0, 0.0, 2.0])  # class 1 absent
    out = restricted_logits(z, counts, 0.5)
    assert torch.equal(out, torch.tensor([[1.0, 1.0, 3.0], [-4.0, 3.0, 0.5]]))
    assert torch.equal(restricted_logits(z, counts, 0.0), torch.tensor([[1.0, 0.0, 3.0], [-4.0, 0.0, 0.5]]))
    assert torch.equal(restricted_logits(z, torch.tensor([1.0, 1.0, 1.0]), 0.3), z)  # all present: unchanged


def _case():
    """A 2-feature, 3-class logreg with hand-set weights and a 2-sample batch."""
    model = build_model("logreg", None, (2,), 3, seed=0)
    apply = make_apply(model, {})
    params = {"fc.weight": torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), "fc.bias": torch.tensor([0.0, 0.5, -1.0])}
    assert params.keys() == dict(model.named_parameters()).keys()
    batch = {"x": torch.tensor([[2.0, 1.0], [0.0, 3.0]]), "y": torch.tensor([0, 2]), "w": torch.tensor([0.25, 0.75])}
    return apply, params, batch


def test_loss_by_hand():
    apply, params, batch = _case()
    # logits: x0 = (2, 1) -> [2, 1.5, 2]; x1 = (0, 3) -> [0, 3.5, 2]; class 1 absent, alpha = 0.4
    # restricted: [2, 0.6, 2] and [0, 1.4, 2]
    ctx = {"label_counts": torch.tensor([3.0, 0.0, 1.0])}
    ce0 = -math.log(math.exp(2) / (math.exp(2) + math.exp(0.6) + math.exp(2)))
    ce1 = -math.log(math.exp(2) / (math.exp(0) + math.exp(1.4) + math.exp(2)))
    loss, _ = _alg("fedrs", alpha=0.4).local_loss(params, batch, {}, ctx, apply)
    assert abs(float(loss) - (0.25 * ce0 + 0.75 * ce1)) < 1e-6
    # FedAvg's CE on the raw logits is another number
    plain = _alg("fedavg").local_loss(params, batch, {}, ctx, apply)[0]
    assert abs(float(plain) - float(loss)) > 1e-2
    # the absent class's classifier row gets the gradient of the scaled logit: alpha * dCE/dz'_1 * x
    g = grad(lambda p: _alg("fedrs", alpha=0.4).local_loss(p, batch, {}, ctx, apply)[0])(params)
    p0 = math.exp(0.6) / (2 * math.exp(2) + math.exp(0.6))
    p1 = math.exp(1.4) / (math.exp(0) + math.exp(1.4) + math.exp(2))
    expected = [0.4 * (0.25 * p0 * 2 + 0.75 * p1 * 0), 0.4 * (0.25 * p0 * 1 + 0.75 * p1 * 3)]
    torch.testing.assert_close(g["fc.weight"][1], torch.tensor(expected))
    torch.testing.assert_close(g["fc.bias"][1], torch.tensor(0.4 * (0.25 * p0 + 0.75 * p1)))


@pytest.mark.agreement
def test_gradient_under_vmap_matches_per_client():
    """Each client's own label counts, stacked as the batched executor stacks ctx."""
    apply, params, batch = _case()
    alg = _alg("fedrs", alpha=0.2)
    stacked = {k: torch.stack([v, v * 0.5]) for k, v in params.items()}
    b = {k: torch.stack([v, v]) for k, v in batch.items()}
    ctx = {"label_counts": torch.tensor([[3.0, 0.0, 1.0], [0.0, 2.0, 2.0]])}

    def loss(p, bb, c):
        return alg.local_loss(p, bb, {}, c, apply)[0]

    batched = vmap(grad(loss))(stacked, b, ctx)
    for i in range(2):
        one = grad(loss)({k: v[i] for k, v in stacked.items()}, batch, {"label_counts": ctx["label_counts"][i]})
        agree({k: batched[k][i] for k in one}, one, where=f"client {i}")


@pytest.mark.agreement
def test_alpha_one_is_exactly_fedavg(tiny, tmp_path):
    def run(alg, d):
        return fedrift.run(tiny(algorithm=alg, output={"dir": str(tmp_path / d)}, train={"rounds": 3}))

    a = run({"name": "fedavg"}, "a")
    b = run({"name": "fedrs", "alpha": 1.0}, "b")
    agree(a.global_state, b.global_state, BITS)
    c = run({"name": "fedrs"}, "c")  # dirichlet 0.5 over 10 digits: clients lack classes
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)
