import math

import pytest
import torch
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import ClientData, Setup
from fedrift.algorithms.terms import combine_class_means
from fedrift.engine.local import make_apply
from fedrift.models import build_model

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(**hp):
    return make("feddistill_plus", SETUP, **hp)


def test_server_averages_each_class_over_its_holders_weighted_by_counts():
    means = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]],
                          [[3.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    counts = torch.tensor([[1.0, 4.0, 0.0], [3.0, 0.0, 0.0]])
    old = torch.full((3, 3), 7.0)
    table, has = combine_class_means(means, counts, old, torch.tensor([False, False, True]))
    torch.testing.assert_close(table[0], torch.tensor([(1 * 1 + 3 * 3) / 4, 0.0, 0.0]))  # 2.5
    torch.testing.assert_close(table[1], torch.tensor([0.0, 2.0, 0.0]))  # only client 0 holds class 1
    torch.testing.assert_close(table[2], torch.full((3,), 7.0))  # nobody holds class 2: kept
    assert has.tolist() == [True, True, True]


def test_distillation_term_by_hand():
    model = build_model("logreg", None, (4,), 3, seed=0)
    apply = make_apply(model, {})
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 2])
    batch = {"x": x, "y": y, "w": torch.tensor([0.5, 0.5])}
    Z = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    payload = {"params": params, "class_logits": Z, "has": torch.tensor([True, True, False])}
    T, lam = 2.0, 0.3
    kd_loss, _ = _alg(lam=lam, T=T).local_loss(params, batch, payload, {}, apply)
    ce_loss, _ = _alg(lam=0.0).local_loss(params, batch, payload, {}, apply)
    z = apply(params, x)[0]
    p = [math.exp(v / T) for v in Z[0].tolist()]
    p = [v / sum(p) for v in p]
    q = torch.softmax(z / T, -1).tolist()
    kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    # sample 1's class (2) has no global entry: only sample 0 distils, with weight 0.5
    assert abs((kd_loss - ce_loss).item() - lam * T**2 * 0.5 * kl) < 1e-6


@pytest.mark.agreement
def test_client_uploads_its_models_mean_logits_per_class():
    model = build_model("logreg", None, (4,), 3, seed=0)
    apply = make_apply(model, {})
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 0, 1, 0, 1])
    alg = _alg()
    out = alg.client_end({}, params, {}, ClientData(x, y), apply)
    z = apply(params, x)
    agree(out["class_logits"][0], z[[0, 1, 3]].mean(0))
    agree(out["class_logits"][1], z[[2, 4]].mean(0))
    assert torch.equal(out["class_logits"][2], torch.zeros(3))


@pytest.mark.agreement
def test_lam_zero_is_exactly_fedavg(tiny, tmp_path):
    a = fedrift.run(tiny(algorithm={"name": "fedavg"}, output={"dir": str(tmp_path / "a")}, train={"rounds": 3}))
    b = fedrift.run(tiny(algorithm={"name": "feddistill_plus", "lam": 0.0}, output={"dir": str(tmp_path / "b")}, train={"rounds": 3}))
    agree(a.global_state, b.global_state, BITS)
    c = fedrift.run(tiny(algorithm={"name": "feddistill_plus", "lam": 1.0}, output={"dir": str(tmp_path / "c")}, train={"rounds": 3}))
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)
    # uploads carry the C x C table and the counts beside the parameters
    assert c.summary["bytes_up_total"] - a.summary["bytes_up_total"] == 3 * 3 * (10 * 10 * 4 + 10 * 4)
