import math

import pytest
import torch
from torch.utils import _pytree as pytree
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.algorithms.fedadc import self_confidence_target
from fedrift.algorithms.terms import weighted_ce
from fedrift.engine.local import make_apply, make_step
from fedrift.functional.tree import stack
from fedrift.errors import ConfigError
from fedrift.models import MODELS, build_model

ETA, WD = 0.1, 0.01
SETUP = Setup(num_classes=3, num_clients=2, feature_dim=5, lr=ETA, momentum=0.9, weight_decay=WD, clip_grad_norm=None, seed=0)


def _alg(name, setup=SETUP, **hp):
    return make(name, setup, **hp)


def _model():
    model = build_model("mlp", MODELS.get("mlp").params(hidden=[5]), (4,), 3, seed=0)
    return make_apply(model, {}), {k: v.detach() for k, v in model.named_parameters()}


def _batches(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [
        {"x": torch.randn(6, 4, generator=g), "y": torch.randint(0, 3, (6,), generator=g), "w": torch.full((6,), 1 / 6)}
        for _ in range(steps)
    ]


def _with_teacher(alg, payload, apply, batches):
    """What the engine adds to each batch for an algorithm with a teacher hook."""
    if alg.teacher is None:
        return batches
    return [{**b, "teacher": alg.teacher(payload, b["x"], apply)} for b in batches]


def _momentum(params, seed=2):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) for k, v in params.items()}


def _ctx(alg, payload, apply, steps, label_counts=(5.0, 3.0, 1.0)):
    ctx = {"num_steps": torch.tensor(float(steps)), "num_samples": torch.tensor(9.0),
           "label_counts": torch.tensor(label_counts), "state": {}}
    return {**ctx, **alg.client_start(payload, ctx, None, apply)}


def _iterates(alg, apply, w0, m, batches):
    """The client's models w^0 .. w^H, through the engine's own step."""
    payload = {"params": w0, "momentum": m}
    ctx = _ctx(alg, payload, apply, len(batches))
    step = make_step(alg, apply, alg.optimizer)
    params, opt, out = w0, alg.optimizer.init(w0), [w0]
    for b in batches:
        params, opt, _, _ = step(params, opt, b, payload, ctx)
        out.append(params)
    return out


def _grad(apply, params, batch):
    """``g = grad CE + wd w``: the gradient of the decayed local objective, by autograd."""
    g = torch.func.grad(lambda p: weighted_ce(apply(p, batch["x"]), batch["y"], batch["w"]))(params)
    return {k: g[k] + WD * params[k] for k in params}


@pytest.mark.agreement
def test_heavy_ball_model_change_is_eta_times_gradients_plus_beta_local_momentum():
    # eq. 4: w_t - w_k = eta (sum_tau g_tau + beta_local m_t), g_tau taken at w^{tau-1}
    apply, w0 = _model()
    m, batches = _momentum(w0), _batches(4)
    ws = _iterates(_alg("fedadc", beta=0.9, beta_local=0.6), apply, w0, m, batches)
    gsum = {k: sum(_grad(apply, w, b)[k] for w, b in zip(ws[:-1], batches)) for k in w0}
    agree({k: w0[k] - ws[-1][k] for k in w0}, {k: ETA * (gsum[k] + 0.6 * m[k]) for k in w0})


@pytest.mark.agreement
def test_nesterov_is_the_hand_unrolled_two_steps():
    apply, w0 = _model()
    m, batches = _momentum(w0), _batches(2)
    m_bar = {k: 0.9 * v / 2 for k, v in m.items()}  # beta_local m_t / H
    w = w0
    for b in batches:  # Algorithm 3, red: w_half = w - eta m_bar; w <- w_half - eta g(w_half)
        half = {k: w[k] - ETA * m_bar[k] for k in w}
        g = _grad(apply, half, b)
        w = {k: half[k] - ETA * g[k] for k in w}
    got = _iterates(_alg("fedadc", variant="nesterov"), apply, w0, m, batches)[-1]
    heavy = _iterates(_alg("fedadc"), apply, w0, m, batches)[-1]
    agree(got, w)
    # and it is not the heavy-ball step: the gradient is taken at another point
    assert max(float((heavy[k] - w[k]).abs().max()) for k in w0) > 1e-4


@pytest.mark.agreement
def test_double_momentum_is_the_hand_recursion():
    phi = 0.7
    apply, w0 = _model()
    m, batches = _momentum(w0), _batches(3)
    m_bar = {k: 0.9 * v / 3 for k, v in m.items()}
    w, mk = w0, None
    for tau, b in enumerate(batches, start=1):  # Algorithm 4
        g = _grad(apply, w, b)
        mk = g if tau == 1 else {k: phi * mk[k] + (1 - phi) * g[k] for k in w}
        w = {k: w[k] - ETA * (m_bar[k] + mk[k]) for k in w}
    got = _iterates(_alg("fedadc", variant="double_momentum", phi=phi), apply, w0, m, batches)[-1]
    agree(got, w)


@pytest.mark.agreement
def test_server_update_by_hand():
    w_t, m_t = torch.tensor([1.0, -2.0]), torch.tensor([0.4, -0.2])
    w_k = [torch.tensor([0.9, -1.7]), torch.tensor([1.3, -2.1])]
    p = torch.tensor([0.25, 0.75])
    uploads = stack([{"params": {"w": w}} for w in w_k])
    info = RoundInfo(round=2, num_clients=2, sampled=(0, 1))
    D = (p[0] * (w_t - w_k[0]) + p[1] * (w_t - w_k[1])) / ETA
    for hp, m_next in [
        ({"beta": 0.9, "beta_local": 0.5, "alpha": 1.5}, D + (0.9 - 0.5) * m_t),
        ({"variant": "nesterov", "beta_global": 0.7, "alpha": 1.5}, D + (0.7 - 0.9) * m_t),
        ({"variant": "double_momentum", "beta_local": 0.5, "alpha": 1.5}, D),
    ]:
        alg = _alg("fedadc", **hp)
        state = {**alg.init_server({"w": w_t}), "momentum": {"w": m_t}}
        out = alg.aggregate(state, uploads, p, info)
        agree(out["momentum"]["w"], m_next)
        agree(out["params"]["w"], w_t - 1.5 * ETA * m_next)
        # what goes down: w_t and m_t
        assert set(alg.broadcast(out, info)) == {"params", "momentum"}


def test_double_momentum_refuses_beta_global():
    with pytest.raises(ConfigError, match="beta_global"):
        _alg("fedadc", variant="double_momentum", beta_global=0.5)


def test_self_confidence_target_by_hand():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3]])
    y = torch.tensor([0, 2])
    counts = torch.tensor([10.0, 5.0, 0.0])  # gamma = (2/3, 1/3, 0): rho = (1, 0.5, 0)
    p_hat = self_confidence_target(probs, y, counts)
    # row 0 (y=0): (1-0.5) 0.2 = 0.1, (1-0) 0.1 = 0.1, true 1 - 0.2; row 1 (y=2): (1-1) 0.2, (1-0.5) 0.5
    torch.testing.assert_close(p_hat, torch.tensor([[0.8, 0.1, 0.1], [0.0, 0.25, 0.75]]))
    torch.testing.assert_close(p_hat.sum(-1), torch.ones(2))
    # every class held equally: rho = 1, the target is the one-hot label
    flat = self_confidence_target(probs, y, torch.tensor([4.0, 4.0, 4.0]))
    assert torch.equal(flat, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]))


@pytest.mark.agreement
def test_fedadc_plus_loss_is_convex_mix_of_ce_and_kl():
    apply, w0 = _model()
    params = {k: v + 0.1 * torch.ones_like(v) for k, v in w0.items()}  # a local model off the global one
    payload = {"params": w0, "momentum": _momentum(w0)}
    alg = _alg("fedadc_plus", lam=0.3, T=2.0)
    batch = _with_teacher(alg, payload, apply, _batches(1))[0]
    loss, aux = alg.local_loss(params, batch, payload, _ctx(alg, payload, apply, 1), apply)
    logits = apply(params, batch["x"])
    teacher = torch.softmax(apply(w0, batch["x"]) / 2.0, -1)
    target = self_confidence_target(teacher, batch["y"], torch.tensor([5.0, 3.0, 1.0]))
    log_q = torch.log_softmax(logits / 2.0, -1)
    kl = (target * (torch.log(target.clamp_min(1e-30)) - log_q)).sum(-1).mean()
    ce = torch.nn.functional.cross_entropy(logits, batch["y"])
    agree(loss, 0.7 * ce + 0.3 * kl)
    agree(aux["kd_loss"], kl)


@pytest.mark.agreement
@pytest.mark.parametrize(
    "name,hp",
    [("fedadc", {}), ("fedadc", {"variant": "nesterov"}), ("fedadc", {"variant": "double_momentum"}), ("fedadc_plus", {})],
)
def test_local_steps_run_under_vmap_and_match_sequential(name, hp):
    alg = _alg(name, **hp)
    apply, w0 = _model()
    payload = {"params": w0, "momentum": _momentum(w0)}
    steps = (2, 3)  # different H_k: different m_bar
    ctxs = [_ctx(alg, payload, apply, h, counts) for h, counts in zip(steps, [(5.0, 3.0, 1.0), (0.0, 2.0, 6.0)])]
    data = [_with_teacher(alg, payload, apply, _batches(2, seed=10 + k)) for k in range(2)]
    seq_step = make_step(alg, apply, alg.optimizer)
    expected = []
    for ctx, batches in zip(ctxs, data):
        params, opt = w0, alg.optimizer.init(w0)
        for b in batches:
            params, opt, _, _ = seq_step(params, opt, b, payload, ctx)
        expected.append(params)

    step = torch.func.vmap(make_step(alg, apply, alg.optimizer, functional=True), in_dims=(0, 0, 0, None, 0))
    params = stack([w0, w0])
    opt = pytree.tree_map(lambda *xs: torch.stack(xs), *[alg.optimizer.init(w0) for _ in range(2)])
    ctx = stack([{k: v for k, v in c.items() if k != "state"} for c in ctxs])
    for s in range(2):
        params, opt, _, _ = step(params, opt, stack([data[0][s], data[1][s]]), payload, ctx)
    for k in range(2):
        agree({key: params[key][k] for key in w0}, expected[k], where=f"client {k}")


@pytest.mark.agreement
def test_beta_zero_alpha_one_heavy_ball_is_exactly_fedavg_and_downlink_is_two_models(tiny, tmp_path):
    train = {"rounds": 3, "momentum": 0.0}  # FedADC has no local momentum; tiny's weight decay applies to both
    a = fedrift.run(tiny(algorithm={"name": "fedavg"}, train=train, output={"dir": str(tmp_path / "a")}))
    b = fedrift.run(tiny(algorithm={"name": "fedadc", "beta": 0.0, "alpha": 1.0}, train=train, output={"dir": str(tmp_path / "b")}))
    agree(a.global_state, b.global_state, BITS)
    pbytes = sum(v.numel() * v.element_size() for v in a.global_state.values())
    for row in b.history:  # 3 clients a round: w_t and m_t down, w_k up
        assert row["bytes_down"] == 3 * 2 * pbytes
        assert row["bytes_up"] == 3 * pbytes


@pytest.mark.agreement
def test_fedadc_plus_with_lam_zero_is_exactly_fedadc(tiny, tmp_path):
    def go(alg, d):
        return fedrift.run(tiny(algorithm=alg, train={"rounds": 3}, output={"dir": str(tmp_path / d)}))

    a = go({"name": "fedadc", "variant": "nesterov"}, "a")
    b = go({"name": "fedadc_plus", "variant": "nesterov", "lam": 0.0}, "b")
    agree(a.global_state, b.global_state, BITS)
    agree(a.server_state["momentum"], b.server_state["momentum"], BITS)
    c = go({"name": "fedadc_plus", "variant": "nesterov"}, "c")
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)
    assert c.history[-1]["kd_loss"] > 0


@pytest.mark.parametrize("t_squared,kd", [(False, 0.5 * math.log(3)), (True, 2.0 * math.log(3))])
def test_fedadc_plus_t_squared_scales_the_kl_by_hand(t_squared, kd):
    # one sample, y = 0, class counts (2, 1): rho = (1, 1/2); global logits (0, 0): p~ = (1/2, 1/2),
    # p_hat = (3/4, 1/4). Student logits (0, 2 ln 3): CE = ln 10; at T = 2, q = (1/4, 3/4),
    # KL(p_hat || q) = 3/4 ln 3 + 1/4 ln(1/3) = ln(3) / 2, times T^2 = 4 with T_squared
    apply = lambda p, x, mode="logits": p["z"].expand(len(x), -1)  # noqa: E731
    z = torch.tensor([0.0, 2 * math.log(3)], dtype=torch.float64)
    payload = {"params": {"z": torch.zeros(2, dtype=torch.float64)}, "momentum": {"z": torch.zeros(2, dtype=torch.float64)}}
    alg = _alg("fedadc_plus", lam=0.5, T=2.0, T_squared=t_squared)
    x = torch.zeros(1, 1, dtype=torch.float64)
    batch = {"x": x, "y": torch.tensor([0]), "w": torch.ones(1, dtype=torch.float64),
             "teacher": alg.teacher(payload, x, apply)}
    ctx = _ctx(alg, payload, apply, 1, label_counts=(2.0, 1.0))
    loss, aux = alg.local_loss({"z": z}, batch, payload, ctx, apply)
    assert aux["kd_loss"].item() == pytest.approx(kd, rel=1e-12)
    assert loss.item() == pytest.approx(0.5 * math.log(10) + 0.5 * kd, rel=1e-12)


@pytest.mark.agreement
def test_fedadc_plus_t_squared_at_t_one_changes_nothing():
    apply, w0 = _model()
    payload = {"params": w0, "momentum": _momentum(w0)}
    params = {k: v + 0.1 for k, v in w0.items()}
    out = []
    for t_squared in (False, True):
        alg = _alg("fedadc_plus", T=1.0, T_squared=t_squared)
        batch = _with_teacher(alg, payload, apply, _batches(1))[0]
        out.append(alg.local_loss(params, batch, payload, _ctx(alg, payload, apply, 1), apply)[0])
    agree(out[0], out[1], BITS)


@pytest.mark.agreement
def test_fedadc_objective_is_the_loss_at_w_without_the_nesterov_shift():
    # what personalisation fine-tunes with: FedADC+'s loss at w itself, whatever the variant
    apply, w0 = _model()
    payload = {"params": w0, "momentum": _momentum(w0)}
    params = {k: v + 0.1 for k, v in w0.items()}
    heavy, nesterov = _alg("fedadc_plus"), _alg("fedadc_plus", variant="nesterov")
    batch = _with_teacher(heavy, payload, apply, _batches(1))[0]
    at_w = heavy.local_loss(params, batch, payload, _ctx(heavy, payload, apply, 1), apply)[0]
    ctx = _ctx(nesterov, payload, apply, 1)
    agree(nesterov.objective(params, batch, payload, ctx, apply)[0], at_w, BITS)
    assert not torch.equal(nesterov.local_loss(params, batch, payload, ctx, apply)[0], at_w)  # w - eta m_bar
