"""MOON: the contrastive loss in closed form, the previous-model state, the projection head
requirement, FedAvg identity, client-state storages, learning."""

import math

import pytest
import torch
from torch.func import grad, vmap
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import ClientData, Setup
from fedrift.algorithms.moon import model_contrastive
from fedrift.engine.local import make_apply
from fedrift.errors import ConfigError
from fedrift.models import MODELS, build_model

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None,
              seed=0, projection_dim=4)
PROJ_MODEL = {"name": "mlp", "hidden": [32], "projection_dim": 16}


def _alg(name, setup=SETUP, **hp):
    return make(name, setup, **hp)


def test_contrastive_loss_on_2d_vectors_equals_the_closed_form():
    """cos values 1/sqrt2 vs 0, 1 vs -1, 0 vs 1 (norms deliberately not 1); T = 0.5."""
    r = torch.tensor([[2.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    r_glob = torch.tensor([[3.0, 3.0], [4.0, 4.0], [1.0, 0.0]])
    r_prev = torch.tensor([[0.0, -5.0], [-1.0, -1.0], [0.0, 2.0]])
    w = torch.tensor([0.5, 0.25, 0.25])
    T = 0.5

    def l_con(sg, sp):  # -log(e^{sg/T} / (e^{sg/T} + e^{sp/T})), as the spec writes it
        return -math.log(math.exp(sg / T) / (math.exp(sg / T) + math.exp(sp / T)))

    terms = [l_con(1 / math.sqrt(2), 0.0), l_con(1.0, -1.0), l_con(0.0, 1.0)]
    assert abs(terms[0] - math.log(1 + math.exp(-math.sqrt(2)))) < 1e-12  # = log(1 + e^{(s_p - s_g)/T})
    expected = 0.5 * terms[0] + 0.25 * terms[1] + 0.25 * terms[2]
    got = model_contrastive(r, r_glob, r_prev, w, T)
    assert abs(float(got) - expected) < 1e-6
    # r_glob = r_prev: log 2 per sample, whatever the vectors
    assert abs(float(model_contrastive(r, r_glob, r_glob, w, T)) - math.log(2)) < 1e-6
    # extreme similarities at a low temperature stay finite (logsumexp form)
    far = model_contrastive(r[:1], -r[:1], r[:1], torch.ones(1), 1e-3)
    assert torch.isfinite(far) and abs(float(far) - 2000.0) < 1e-2


def _case(seed=1):
    model = build_model("mlp", MODELS.get("mlp").params(hidden=[6], projection_dim=4), (3,), 3, seed=0)
    apply = make_apply(model, {})
    g = torch.Generator().manual_seed(seed)
    w_t = {k: v.detach() for k, v in model.named_parameters()}

    def moved(scale):
        return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in w_t.items()}

    batch = {"x": torch.randn(5, 3, generator=g), "y": torch.tensor([0, 1, 2, 0, 1]), "w": torch.full((5,), 0.2)}
    return apply, w_t, moved(0.5), moved(0.5), batch


def _cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.mark.agreement
def test_local_loss_is_ce_plus_mu_l_con_with_r_glob_from_the_teacher_and_r_prev_from_the_state():
    apply, w_t, student, prev, batch = _case()
    mu, T = 0.7, 0.5
    alg = _alg("moon", mu=mu, T=T)
    payload = {"params": w_t}
    teacher = alg.teacher(payload, batch["x"], apply)
    agree(teacher["features"], apply(w_t, batch["x"], mode="features"))
    batch = {**batch, "teacher": teacher}
    ctx = {"prev": prev}
    loss, aux = alg.local_loss(student, batch, payload, ctx, apply)
    ce = _alg("fedavg").local_loss(student, batch, payload, ctx, apply)[0]
    r, rg, rp = (apply(p, batch["x"], mode="features").tolist() for p in (student, w_t, prev))
    con = 0.0
    for i in range(5):
        sg, sp = _cos(r[i], rg[i]), _cos(r[i], rp[i])
        con += 0.2 * -math.log(math.exp(sg / T) / (math.exp(sg / T) + math.exp(sp / T)))
    assert abs(float(loss - ce) - mu * con) < 1e-5 and con > 0.1
    agree(aux["moon_con"], loss - ce)
    # neither the previous model nor the global features get a gradient
    g_prev = grad(lambda p: alg.local_loss(student, batch, payload, {"prev": p}, apply)[0])(prev)
    assert all(torch.equal(v, torch.zeros_like(v)) for v in g_prev.values())
    feats = teacher["features"]
    g_glob = grad(lambda f: alg.local_loss(student, {**batch, "teacher": {"features": f}}, payload, ctx, apply)[0])(feats)
    assert torch.equal(g_glob, torch.zeros_like(feats))


@pytest.mark.agreement
def test_at_first_participation_the_term_is_log2_and_pulls_nowhere():
    """prev = global model: r_prev = r_glob, so l_con = log 2 and its gradient is 0."""
    apply, w_t, student, _, batch = _case()
    alg = _alg("moon", mu=1.0)
    payload = {"params": w_t}
    batch = {**batch, "teacher": alg.teacher(payload, batch["x"], apply)}
    loss, aux = alg.local_loss(student, batch, payload, {"prev": w_t}, apply)
    assert abs(float(aux["moon_con"]) - math.log(2)) < 1e-6
    g = grad(lambda p: alg.local_loss(p, batch, payload, {"prev": w_t}, apply)[0])(student)
    g_avg = grad(lambda p: _alg("fedavg").local_loss(p, batch, payload, {}, apply)[0])(student)
    agree(g, g_avg)


def test_client_state_is_the_previous_local_model_and_the_global_model_at_first():
    apply, w_t, end, older, batch = _case()
    alg = _alg("moon")
    data = ClientData(batch["x"], batch["y"], alg.teacher({"params": w_t}, batch["x"], apply))
    init = alg.init_client(older)  # the engine passes the initial global model
    assert not bool(init["seen"]) and init["prev"] is older
    # never seen: the round's global model w_t, not the initial one
    ctx = alg.client_start({"params": w_t}, {"state": init}, data, apply)
    assert ctx["prev"] is w_t and ctx["state"] == {}
    # after training: the end parameters are uploaded and kept as the previous model
    upload, state = alg.client_result({"params": w_t}, end, {**ctx, "state": {}})
    assert upload["params"] is end and state["prev"] is end and bool(state["seen"])
    assert state["seen"].dtype == init["seen"].dtype and state["seen"].shape == init["seen"].shape  # one layout
    # seen: its own previous model
    ctx = alg.client_start({"params": w_t}, {"state": state}, data, apply)
    assert ctx["prev"] is end


@pytest.mark.agreement
def test_gradient_under_vmap_matches_per_client():
    apply, w_t, s1, s2, batch = _case()
    _, _, p1, p2, _ = _case(seed=2)
    alg = _alg("moon", mu=2.0, T=0.5)
    payload = {"params": w_t}
    stacked = {k: torch.stack([s1[k], s2[k]]) for k in w_t}
    ctx = {"prev": {k: torch.stack([p1[k], p2[k]]) for k in w_t}}
    b = {k: torch.stack([v, v.flip(0)]) for k, v in batch.items()}
    b["teacher"] = {"features": apply(w_t, b["x"].reshape(10, 3), mode="features").reshape(2, 5, 4)}

    def loss(p, bb, c):
        return alg.local_loss(p, bb, payload, c, apply)[0]

    batched = vmap(grad(loss))(stacked, b, ctx)
    for i in range(2):
        one = grad(loss)({k: v[i] for k, v in stacked.items()},
                         {"x": b["x"][i], "y": b["y"][i], "w": b["w"][i], "teacher": {"features": b["teacher"]["features"][i]}},
                         {"prev": {k: v[i] for k, v in ctx["prev"].items()}})
        agree({k: batched[k][i] for k in one}, one, where=f"client {i}")


def test_refuses_a_model_without_a_projection_head(tiny, tmp_path):
    plain = Setup(**{**SETUP.__dict__, "projection_dim": None})
    for mu in (1.0, 0.0):
        with pytest.raises(ConfigError, match="model.projection_dim"):
            _alg("moon", setup=plain, mu=mu)
    out = tmp_path / "refused"
    with pytest.raises(ConfigError, match="model.projection_dim"):
        fedrift.run(tiny(algorithm={"name": "moon"}, output={"dir": str(out)}))
    assert not out.exists()  # refused before anything was written


@pytest.mark.agreement
def test_mu_zero_is_exactly_fedavg_on_the_same_model(tiny, tmp_path):
    def run(alg, d):
        return fedrift.run(tiny(algorithm=alg, model=PROJ_MODEL, output={"dir": str(tmp_path / d)}, train={"rounds": 3}))

    a = run({"name": "fedavg"}, "a")
    b = run({"name": "moon", "mu": 0.0, "T": 0.1}, "b")
    agree(a.global_state, b.global_state, BITS)
    c = run({"name": "moon"}, "c")
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)
    assert c.history[-1]["moon_con"] > 0
