import math

import pytest
import torch
import torch.nn.functional as F

import fedrift
from fedrift.algorithms import ALGORITHMS, make
from fedrift.algorithms.base import ClientData, Setup
from fedrift.config import validate_options
from fedrift.engine.local import make_apply
from fedrift.engine.tree import stack
from fedrift.errors import ConfigError
from fedrift.models import MODELS, build_model

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)
e = math.e


def _alg(**hp):
    return make("fedcsd", SETUP, **hp)


def _identity(params, x, mode="logits"):
    return x  # "teacher logits" given directly as the data


def _stored(params, x, mode="logits"):
    return params["z"]  # a "model" whose logits are its only parameter


# ---------------------------------------------------------------------------------------
# The pre-phase: prototypes and their server average, by hand (C = 3)


def test_prototypes_by_hand_and_server_mean_over_holders_only():
    alg = _alg()
    payload = {"params": {}, "teacher": {}}
    # client A: two samples of class 0, one of class 1, none of class 2
    xa, xb = torch.tensor([[2.0, 0, 0], [4, 0, 0], [0, 2, 1]]), torch.tensor([[1.0, 2, 0]])
    # the engine hands client_summary the teacher's outputs on the client's samples
    a = ClientData(xa, torch.tensor([0, 0, 1]), alg.teacher(payload, xa, _identity))
    # client B: one sample of class 0 only
    b = ClientData(xb, torch.tensor([0]), alg.teacher(payload, xb, _identity))
    sa = alg.client_summary(payload, {}, a, _identity)
    sb = alg.client_summary(payload, {}, b, _identity)
    assert torch.equal(sa["prototypes"], torch.tensor([[3.0, 0, 0], [0, 2, 1], [0, 0, 0]]))
    assert torch.equal(sa["holds"], torch.tensor([True, True, False]))
    assert torch.equal(sb["prototypes"], torch.tensor([[1.0, 2, 0], [0, 0, 0], [0, 0, 0]]))
    assert torch.equal(sb["holds"], torch.tensor([True, False, False]))
    # class 0: mean of A's and B's rows; class 1: A's row alone; class 2: held by no one, zero.
    # A plain mean over holders: the sample weights (A has 3x B's samples) play no part.
    out = alg.pre_combine(payload, stack([sa, sb]), torch.tensor([0.75, 0.25]))
    assert set(out) == {"prototypes"}
    assert torch.equal(out["prototypes"], torch.tensor([[2.0, 1, 0], [0, 2, 1], [0, 0, 0]]))


# ---------------------------------------------------------------------------------------
# The local loss, by hand (C = 3, tau = 2, three samples of weight 1/3)

P_G = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 0]])  # class 2 held by no one
Z_K = torch.tensor([[3.0, 4, 0], [0, 0, 2], [0, -2, 0]])  # student logits
Z_XI = torch.tensor([[2.0, 0, 0], [1, 0, 0.5], [1, 0, 0.9]])  # teacher logits
Y = torch.tensor([0, 2, 2])
W = torch.full((3,), 1 / 3)
TAU = 2.0
# delta = cos(z_k, P_G[c]): [3/5, 4/5, 0], [0, 0, 0] (zero rows and orthogonal), [0, -1, 0]
Z1, Z3 = math.exp(0.6) + math.exp(0.8) + 1, 2 + math.exp(-1)
DELTA_HAT = torch.tensor([
    [math.exp(0.6) / Z1, math.exp(0.8) / Z1, 1 / Z1],
    [1 / 3, 1 / 3, 1 / 3],
    [1 / Z3, math.exp(-1) / Z3, 1 / Z3],
])
Z_HAT = torch.tensor([[2 * math.exp(0.6) / Z1, 0, 0], [1 / 3, 0, 0.5 / 3], [1 / Z3, 0, 0.9 / Z3]])
# teacher's probability of the true class: e^2/(e^2+2) = 0.787, e^.5/(e+1+e^.5) = 0.307, e^.9/(e+1+e^.9) = 0.398
# adaptive mask (> 1/3): 1, 0, 1; argmax mask (teacher predicts y): 1, 0, 0
MASKS = {"adaptive": [1.0, 0, 1], "argmax": [1.0, 0, 0], "off": [1.0, 1, 1]}


def _per_sample_csd(z_hat):
    """tau^2 sum_c -softmax(z_hat / tau)_c log softmax(z_k / tau)_c, per sample."""
    return TAU**2 * (-torch.softmax(z_hat / TAU, -1) * torch.log_softmax(Z_K / TAU, -1)).sum(-1)


def _row(v, i):
    return {k: t[i] for k, t in v.items()} if isinstance(v, dict) else v[i]


def _loss(alg, z=Z_K):
    batch = {"x": torch.zeros(3, 1), "y": Y, "w": W}
    payload = {"params": {}, "teacher": {"z": Z_XI}, "prototypes": P_G}
    batch["teacher"] = alg.teacher(payload, batch["x"], _stored)  # as the engine adds it
    return alg.local_loss({"z": z}, batch, payload, {}, _stored)


def test_hand_numbers_behind_the_loss():
    torch.testing.assert_close(torch.tensor([e**2 / (e**2 + 2), e**0.5 / (e + 1 + e**0.5), e**0.9 / (e + 1 + e**0.9)]),
                               torch.softmax(Z_XI, -1).gather(1, Y[:, None]).squeeze(1))
    delta = F.normalize(Z_K, dim=-1) @ F.normalize(P_G, dim=-1).T
    torch.testing.assert_close(delta, torch.tensor([[0.6, 0.8, 0], [0, 0, 0], [0, -1.0, 0]]))
    torch.testing.assert_close(torch.softmax(delta, -1), DELTA_HAT)
    torch.testing.assert_close(DELTA_HAT * Z_XI, Z_HAT)


@pytest.mark.parametrize("mask,filtered", [("adaptive", 1 / 3), ("argmax", 2 / 3), ("off", 0.0)])
def test_csd_loss_by_hand(mask, filtered):
    ce = F.cross_entropy(Z_K, Y)
    m = torch.tensor(MASKS[mask])
    l_csd = (m * _per_sample_csd(Z_HAT)).sum() / 3  # masked samples count as zero in the batch mean
    loss, aux = _loss(_alg(mu=0.5, tau=TAU, mask=mask))
    torch.testing.assert_close(loss, ce + 0.5 * l_csd)
    torch.testing.assert_close(aux["fedcsd_mask_filtered"], torch.tensor(filtered))
    # the released code's form: (1 - mu) CE + mu L_CSD
    loss, _ = _loss(_alg(mu=0.5, tau=TAU, mask=mask, loss_form="convex"))
    torch.testing.assert_close(loss, 0.5 * ce + 0.5 * l_csd)
    # no similarity refinement: the teacher's own logits are the target
    l_plain = (m * _per_sample_csd(Z_XI)).sum() / 3
    loss, _ = _loss(_alg(mu=0.5, tau=TAU, mask=mask, similarity="off"))
    torch.testing.assert_close(loss, ce + 0.5 * l_plain)


def test_gradient_treats_similarity_as_constant_unless_told_otherwise():
    mu = 0.5
    ce_grad = torch.func.grad(lambda z: F.cross_entropy(z, Y))(Z_K)
    g = torch.func.grad(lambda z: _loss(_alg(mu=mu, tau=TAU), z)[0])(Z_K)
    # d/dz_k of tau^2 sum -q_xi log softmax(z_k/tau) with q_xi constant: tau (softmax(z_k/tau) - q_xi)
    m = torch.tensor(MASKS["adaptive"])[:, None]
    expect = ce_grad + mu * TAU * (1 / 3) * m * (torch.softmax(Z_K / TAU, -1) - torch.softmax(Z_HAT / TAU, -1))
    torch.testing.assert_close(g, expect)
    # the released code lets the gradient flow through delta_hat: same value, other gradient
    released = _alg(mu=mu, tau=TAU, detach_similarity=False)
    torch.testing.assert_close(_loss(released)[0], _loss(_alg(mu=mu, tau=TAU))[0])
    g2 = torch.func.grad(lambda z: _loss(released, z)[0])(Z_K)
    assert not torch.allclose(g, g2)
    assert torch.isfinite(g2).all()  # the zero prototype row gives no NaN through the cosine


def test_local_loss_under_vmap_equals_one_client_at_a_time():
    model = build_model("logreg", None, (4,), 3, seed=0)
    apply = make_apply(model, {})
    g = torch.Generator().manual_seed(1)
    base = {k: v.detach() for k, v in model.named_parameters()}
    clients = [{k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(2)]
    x = torch.randn(2, 5, 4, generator=g)
    y = torch.tensor([[0, 1, 2, 0, 1], [2, 2, 1, 0, 0]])
    w = torch.tensor([[0.2] * 5, [0.25, 0.0, 0.25, 0.25, 0.25]])  # client 2's 2nd sample is padding
    teacher = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in base.items()}
    payload = {"params": base, "teacher": teacher, "prototypes": P_G}
    for detach in (True, False):
        alg = _alg(mu=0.5, tau=TAU, detach_similarity=detach)

        def grad_fn(p, batch):
            return torch.func.grad(lambda q: alg.local_loss(q, batch, payload, {}, apply), has_aux=True)(p)

        batches = {"x": x, "y": y, "w": w, "teacher": {"logits": torch.stack([apply(teacher, xi) for xi in x])}}
        vg, vaux = torch.func.vmap(grad_fn)(stack(clients), batches)
        for i in range(2):
            gi, auxi = grad_fn(clients[i], {k: _row(v, i) for k, v in batches.items()})
            for k in gi:
                torch.testing.assert_close(vg[k][i], gi[k])
            torch.testing.assert_close(vaux["fedcsd_mask_filtered"][i], auxi["fedcsd_mask_filtered"])
            # the filter rate: the weighted share of samples whose true class gets <= 1/C from
            # the teacher; the padding sample weighs 0
            p_true = torch.softmax(apply(teacher, x[i]), -1).gather(1, y[i][:, None]).squeeze(1)
            torch.testing.assert_close(auxi["fedcsd_mask_filtered"], (w[i] * (p_true <= 1 / 3)).sum())


# ---------------------------------------------------------------------------------------
# Through the engine (digits, MLP)


def _run(tiny, tmp_path, name, algorithm, rounds=3, **sections):
    cfg = tiny(algorithm=algorithm, output={"dir": str(tmp_path / name)}, train={"rounds": rounds}, **sections)
    return fedrift.run(cfg)


def test_teacher_is_the_temporal_moving_average_of_global_models(tiny, tmp_path):
    a = 0.7
    alg = {"name": "fedcsd", "a": a, "mu": 0.1}
    runs = [_run(tiny, tmp_path, f"r{r}", alg, rounds=r) for r in (1, 2, 3)]  # round r of each run is the same
    init = build_model("mlp", MODELS.get("mlp").params(hidden=[32]), (1, 8, 8), 10, seed=0)
    teacher = {k: v.detach() for k, v in init.named_parameters()}  # w_xi^0 = w_G^0
    for run in runs:
        teacher = {k: a * teacher[k] + (1 - a) * run.global_state[k] for k in teacher}
        for k in teacher:
            torch.testing.assert_close(run.server_state["teacher"][k], teacher[k])
    # the ablation: the teacher is the round's global model itself, the same tensors
    last = _run(tiny, tmp_path, "last", {"name": "fedcsd", "teacher": "last_global"}, rounds=2)
    assert last.server_state["teacher"] is last.server_state["params"]


@pytest.mark.parametrize("loss_form", ["paper", "convex"])
def test_mu_zero_is_exactly_fedavg(tiny, tmp_path, loss_form):
    a = _run(tiny, tmp_path, "a", {"name": "fedavg"})
    b = _run(tiny, tmp_path, "b", {"name": "fedcsd", "mu": 0.0, "loss_form": loss_form})
    for k in a.global_state:
        assert torch.equal(a.global_state[k], b.global_state[k]), k
    c = _run(tiny, tmp_path, "c", {"name": "fedcsd", "mu": 0.5, "loss_form": loss_form})
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)


def test_mask_filter_rate_is_reported_per_round(tiny, tmp_path):
    rates = {}
    for mask in ("adaptive", "argmax", "off"):
        res = _run(tiny, tmp_path, mask, {"name": "fedcsd", "mask": mask}, rounds=2)
        rates[mask] = [row["fedcsd_mask_filtered"] for row in res.history]
        assert len(rates[mask]) == 2 and all(0.0 <= r <= 1.0 for r in rates[mask])
    assert rates["off"] == [0.0, 0.0]
    # round 1: same teacher (w_G^0), same batches; argmax keeps a subset of what adaptive keeps
    assert rates["argmax"][0] >= rates["adaptive"][0] > 0.0


def test_prephase_adds_a_class_by_class_matrix_up_and_down(tiny, tmp_path):
    base = _run(tiny, tmp_path, "avg", {"name": "fedavg"}, rounds=2)
    last = _run(tiny, tmp_path, "last", {"name": "fedcsd", "teacher": "last_global"}, rounds=2)
    tma = _run(tiny, tmp_path, "tma", {"name": "fedcsd"}, rounds=2)
    clients, C = 3, 10
    pbytes = sum(v.numel() * 4 for v in base.global_state.values())
    for r in range(2):
        b, l, t = base.history[r], last.history[r], tma.history[r]
        # down: P_G (C x C float32); up: P_k (C x C float32) + the classes held (C bools)
        assert l["bytes_down"] - b["bytes_down"] == clients * C * C * 4
        assert l["bytes_up"] - b["bytes_up"] == clients * (C * C * 4 + C)
        assert t["bytes_up"] == l["bytes_up"]
        # TMA teacher: in round 1 it is w_G^0 itself (sent once); later a second model goes down
        assert t["bytes_down"] - l["bytes_down"] == (0 if r == 0 else clients * pbytes)


# ---------------------------------------------------------------------------------------
# Options


def test_options_defaults_yaml_switches_and_refusals():
    entry = ALGORITHMS.get("fedcsd")
    hp = validate_options("algorithm", entry.params, {})
    assert (hp.mu, hp.tau, hp.a, hp.similarity, hp.mask, hp.teacher, hp.detach_similarity, hp.loss_form, hp.aggregation) == (
        0.001, 10.0, 0.9, "on", "adaptive", "tma", True, "paper", "samples")
    # YAML reads a bare off/on as a boolean
    hp = validate_options("algorithm", entry.params, {"similarity": False, "mask": False})
    assert (hp.similarity, hp.mask) == ("off", "off")
    with pytest.raises(ConfigError, match="algorithm.mu"):
        validate_options("algorithm", entry.params, {"loss_form": "convex", "mu": 2.0})
    with pytest.raises(ConfigError, match="algorithm.mask"):
        validate_options("algorithm", entry.params, {"mask": "hard"})
    with pytest.raises(ConfigError, match="algorithm.alpha: unknown key"):
        validate_options("algorithm", entry.params, {"alpha": 0.9})
