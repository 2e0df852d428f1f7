"""FedNTD: the not-true logits, the distillation term by hand, FedAvg identity, learning."""

import math

import pytest
import torch
from torch.func import grad, vmap
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import Setup
from fedrift.algorithms.fedntd import not_true, not_true_distillation
from fedrift.engine.local import make_apply
from fedrift.models import MODELS, build_model

SETUP = Setup(num_classes=4, num_clients=2, feature_dim=3, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(name, **hp):
    return make(name, SETUP, **hp)


def _softmax(v, T=1.0):
    e = [math.exp(x / T) for x in v]
    return [x / sum(e) for x in e]


def _kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def test_not_true_drops_the_label_column_and_keeps_the_order():
    z = torch.tensor([[10.0, 11.0, 12.0, 13.0]] * 4)
    out = not_true(z, torch.tensor([0, 1, 2, 3]))
    assert torch.equal(out, torch.tensor([[11.0, 12.0, 13.0], [10.0, 12.0, 13.0], [10.0, 11.0, 13.0], [10.0, 11.0, 12.0]]))
    # extreme logits stay finite: a gather, no -inf masking
    big = torch.tensor([[-1e30, 0.0, 1e30]])
    assert torch.isfinite(not_true(big, torch.tensor([1]))).all()


@pytest.mark.agreement
def test_not_true_distillation_by_hand():
    """4 classes, 2 samples, T = 2: the not-true distributions written out."""
    zs = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]])
    zg = torch.tensor([[0.0, 1.0, 5.0, 2.0], [3.0, 1.0, -2.0, 0.0]])
    y = torch.tensor([2, 0])
    w = torch.tensor([0.25, 0.75])
    T = 2.0
    # sample 0 (y = 2): student [1, 2, 4], global [0, 1, 2]; sample 1 (y = 0): [-1, 2, 0], [1, -2, 0]
    kl0 = _kl(_softmax([0.0, 1.0, 2.0], T), _softmax([1.0, 2.0, 4.0], T))
    kl1 = _kl(_softmax([1.0, -2.0, 0.0], T), _softmax([-1.0, 2.0, 0.0], T))
    expected = T**2 * (0.25 * kl0 + 0.75 * kl1)
    got = not_true_distillation(zs, zg, y, w, T)
    assert abs(float(got) - expected) < 1e-6 and expected > 1e-2
    # the true class plays no part: changing it in either logit table changes nothing
    zs2, zg2 = zs.clone(), zg.clone()
    zs2[0, 2], zg2[1, 0] = -7.0, 9.0
    agree(not_true_distillation(zs2, zg2, y, w, T), got, BITS)
    # no gradient reaches the true-class logit through the distillation term
    g = grad(lambda s: not_true_distillation(s, zg, y, w, T))(zs)
    assert g[0, 2] == 0 and g[1, 0] == 0 and g.abs().sum() > 0


@pytest.mark.agreement
def test_local_loss_is_ce_plus_beta_T2_kl_and_the_teacher_is_the_global_model():
    model = build_model("logreg", None, (3,), 4, seed=0)
    apply = make_apply(model, {})
    g = torch.Generator().manual_seed(1)
    w_t = {k: v.detach() for k, v in model.named_parameters()}
    student = {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in w_t.items()}
    batch = {"x": torch.randn(5, 3, generator=g), "y": torch.tensor([0, 1, 2, 3, 1]), "w": torch.full((5,), 0.2)}
    payload = {"params": w_t}
    beta, T = 0.7, 1.5
    alg = _alg("fedntd", beta=beta, T=T)
    teacher = alg.teacher(payload, batch["x"], apply)
    agree(teacher["logits"], apply(w_t, batch["x"]))
    batch = {**batch, "teacher": teacher}
    loss, aux = alg.local_loss(student, batch, payload, {}, apply)
    ce = _alg("fedavg").local_loss(student, batch, payload, {}, apply)[0]
    zs, zg = apply(student, batch["x"]), teacher["logits"]
    kd = 0.0
    for i, yi in enumerate(batch["y"].tolist()):
        keep = [c for c in range(4) if c != yi]
        kd += 0.2 * _kl(_softmax([float(zg[i, c]) for c in keep], T), _softmax([float(zs[i, c]) for c in keep], T))
    assert abs(float(loss - ce) - beta * T**2 * kd) < 1e-5 and kd > 1e-3
    agree(aux["fedntd_kd"], loss - ce)
    # the teacher logits are constants
    gt = grad(lambda t: alg.local_loss(student, {**batch, "teacher": {"logits": t}}, payload, {}, apply)[0])(zg)
    assert torch.equal(gt, torch.zeros_like(zg))


@pytest.mark.agreement
def test_local_loss_gradient_under_vmap_matches_per_client():
    model = build_model("mlp", MODELS.get("mlp").params(hidden=[8]), (3,), 4, seed=0)
    apply = make_apply(model, {})
    w_t = {k: v.detach() for k, v in model.named_parameters()}
    g = torch.Generator().manual_seed(2)
    stacked = {k: torch.stack([v + 0.3 * torch.randn(v.shape, generator=g) for _ in range(2)]) for k, v in w_t.items()}
    b = {"x": torch.randn(2, 6, 3, generator=g), "y": torch.randint(0, 4, (2, 6), generator=g),
         "w": torch.tensor([[1 / 6] * 6, [0.25] * 4 + [0.0] * 2])}  # client 2: two padding rows
    alg = _alg("fedntd", beta=1.0, T=2.0)
    b["teacher"] = {"logits": apply(w_t, b["x"].reshape(12, 3)).reshape(2, 6, 4)}
    payload = {"params": w_t}

    def loss(p, bb):
        return alg.local_loss(p, bb, payload, {}, apply)[0]

    batched = vmap(grad(loss))(stacked, b)
    for i in range(2):
        one = grad(loss)({k: v[i] for k, v in stacked.items()},
                         {"x": b["x"][i], "y": b["y"][i], "w": b["w"][i], "teacher": {"logits": b["teacher"]["logits"][i]}})
        agree({k: batched[k][i] for k in one}, one, where=f"client {i}")


@pytest.mark.agreement
def test_beta_zero_is_exactly_fedavg(tiny, tmp_path):
    def run(alg, d):
        return fedrift.run(tiny(algorithm=alg, output={"dir": str(tmp_path / d)}, train={"rounds": 3}))

    a = run({"name": "fedavg"}, "a")
    b = run({"name": "fedntd", "beta": 0.0, "T": 3.0}, "b")
    agree(a.global_state, b.global_state, BITS)
    c = run({"name": "fedntd"}, "c")
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)
    assert c.history[-1]["fedntd_kd"] > 0
