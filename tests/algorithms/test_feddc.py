import dataclasses
from pathlib import Path

import pytest
import torch
from agreement import BITS, agree, untimed
from conftest import ctrl_c_in_round
from linear_model import apply
from linear_model import rand_params as _rand

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.algorithms.terms import weighted_ce
from fedrift.api import prepare
from fedrift.engine.local import make_step
from fedrift.engine.state import ClientStateStore
from fedrift.functional.tree import stack, weighted_sum
from fedrift.errors import ConfigError
from fedrift.models import build_model

ETA = 0.1
SETUP = Setup(num_classes=3, num_clients=4, feature_dim=4, lr=ETA, momentum=0.9, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(name="feddc", setup=SETUP, **hp):
    return make(name, setup, **hp)


def _batch(seed=1, n=5):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 4, generator=g), "y": torch.randint(0, 3, (n,), generator=g), "w": torch.full((n,), 1 / n)}


def _grad(params, batch):
    return torch.func.grad(lambda p: weighted_ce(apply(p, batch["x"]), batch["y"], batch["w"]))(params)


def _zeros(params):
    return {k: torch.zeros_like(v) for k, v in params.items()}


def test_one_local_step_by_hand():
    # no data gradient (every sample weighs 0): the step is the penalty's and the correction's
    # alpha (theta + h - w) + G - G_i = 0.5 [0.5, -1] + [0.25, 0.25] - [0.5, -0.5] = [0, 0.25]
    alg = _alg(alpha=0.5)
    w = {"v": torch.tensor([1.0, 2.0])}
    payload = {"params": w, "control": {"v": torch.tensor([0.25, 0.25])}}
    ctx = {"state": {"drift": {"v": torch.tensor([0.5, -1.0])}, "control": {"v": torch.tensor([0.5, -0.5])}}}
    batch = {"x": torch.ones(2, 2), "y": torch.tensor([0, 1]), "w": torch.zeros(2)}
    step = make_step(alg, lambda p, x, mode="logits": x * p["v"], alg.optimizer)
    new, _, loss, aux = step(w, alg.optimizer.init(w), batch, payload, ctx)
    torch.testing.assert_close(new["v"], torch.tensor([1.0, 1.975]))  # w - eta [0, 0.25]
    # loss: CE 0 + (0.5/2) ||[0.5, -1]||^2 + <[1, 2], [-0.25, 0.75]> = 0.3125 + 1.25
    torch.testing.assert_close(loss, torch.tensor(1.5625))
    assert aux["ce_loss"] == 0.0


@pytest.mark.agreement
def test_one_local_step_with_data_clip_and_decay():
    # theta_1 = theta_0 - eta (clip(g + alpha (theta_0 + h - w) + G - G_i) + wd theta_0): the
    # authors' code clips the whole gradient, penalty and correction included, then decays
    alpha, wd, clip = 0.3, 0.01, 0.5
    alg = _alg(alpha=alpha, setup=dataclasses.replace(SETUP, weight_decay=wd, clip_grad_norm=clip))
    theta, w, h, c, c_i = _rand(0), _rand(1), _rand(2, 0.3), _rand(3, 0.3), _rand(4, 0.3)
    batch = _batch()
    payload, ctx = {"params": w, "control": c}, {"state": {"drift": h, "control": c_i}}
    new, _, _, _ = make_step(alg, apply, alg.optimizer)(theta, alg.optimizer.init(theta), batch, payload, ctx)
    g = _grad(theta, batch)
    full = {k: g[k] + alpha * (theta[k] + h[k] - w[k]) + c[k] - c_i[k] for k in theta}
    norm = torch.sqrt(sum((v ** 2).sum() for v in full.values()))
    factor = min(1.0, clip / (norm.item() + 1e-6))
    assert factor < 1.0  # the clip is active here
    agree(new, {k: theta[k] - ETA * (factor * full[k] + wd * theta[k]) for k in theta})


@pytest.mark.agreement
def test_local_momentum_is_the_algorithms_own():
    alg = _alg(alpha=0.0, local_momentum=0.5)  # no penalty: the data gradient alone
    theta, batch = _rand(0), _batch()
    payload, ctx = {"params": theta, "control": _zeros(theta)}, {"state": {"drift": _zeros(theta), "control": _zeros(theta)}}
    step = make_step(alg, apply, alg.optimizer)
    p1, opt, _, _ = step(theta, alg.optimizer.init(theta), batch, payload, ctx)
    p2, _, _, _ = step(p1, opt, batch, payload, ctx)
    g1, g2 = _grad(theta, batch), _grad(p1, batch)
    # torch's SGD momentum: buf = 0.5 g1 + g2 at the second step
    agree(p2, {k: p1[k] - ETA * (0.5 * g1[k] + g2[k]) for k in theta})


@pytest.mark.agreement
def test_state_update_by_hand():
    # w_t - theta = [0.2, -0.4] after H = 2 steps of eta = 0.1: (w_t - theta) / (H eta) = [1, -2]
    payload = {"params": {"w": torch.tensor([1.0, 2.0])}, "control": {"w": torch.tensor([0.25, -0.25])}}
    ctx = {"num_steps": torch.tensor(2.0),
           "state": {"drift": {"w": torch.tensor([0.5, 0.5])}, "control": {"w": torch.tensor([0.5, 0.5])}}}
    theta = {"w": torch.tensor([0.8, 2.4])}
    upload, state = _alg().client_result(payload, theta, ctx)
    torch.testing.assert_close(state["drift"]["w"], torch.tensor([0.3, 0.9]))  # h + (theta - w_t)
    # G_i+ = G_i - G + [1, -2] = [0.5 - 0.25 + 1, 0.5 + 0.25 - 2]; Delta = G_i+ - G_i
    torch.testing.assert_close(state["control"]["w"], torch.tensor([1.25, -1.25]))
    torch.testing.assert_close(upload["delta_control"]["w"], torch.tensor([0.75, -1.75]))
    assert sorted(upload) == ["delta_control", "params"]  # h_i never leaves the client
    assert torch.equal(upload["params"]["w"], theta["w"])
    upload, state2 = _alg(drift_mean="sampled").client_result(payload, theta, ctx)
    assert sorted(upload) == ["delta_control", "drift", "params"]  # sampled: h_i+ goes up
    assert torch.equal(upload["drift"]["w"], state2["drift"]["w"])
    agree(state2["drift"], state["drift"], BITS)
    fresh = _alg().init_client({"w": torch.ones(3)})  # a client never sampled: h_i = 0, G_i = 0
    assert sorted(fresh) == ["control", "drift"] and all(torch.equal(v["w"], torch.zeros(3)) for v in fresh.values())


def _uploads(sampled=False):
    ups = [{"params": {"w": torch.tensor([2.0, 0.0])}, "delta_control": {"w": torch.tensor([1.0, 0.0])}},
           {"params": {"w": torch.tensor([0.0, 4.0])}, "delta_control": {"w": torch.tensor([3.0, 2.0])}}]
    if sampled:
        for u, h in zip(ups, ([0.5, 0.0], [1.0, 2.0])):
            u["drift"] = {"w": torch.tensor(h)}
    return stack(ups)


@pytest.mark.agreement
def test_server_update_by_hand():
    p = torch.tensor([0.75, 0.25], dtype=torch.float64)
    info = RoundInfo(round=2, num_clients=4, sampled=(0, 2))
    alg = _alg()
    state = alg.init_server({"w": torch.tensor([1.0, 1.0])})
    assert sorted(state) == ["control", "drift", "params"] and torch.equal(state["drift"]["w"], torch.zeros(2))
    state = {**state, "drift": {"w": torch.tensor([0.5, 0.25])}, "control": {"w": torch.tensor([0.5, -0.5])}}
    out = alg.aggregate(state, _uploads(), p, info)
    # all: h_bar + (1/N) sum (theta_i - w_t) = [0.5, 0.25] + [0, 2] / 4; avg = [1.5, 1.0]
    torch.testing.assert_close(out["drift"]["w"], torch.tensor([0.5, 0.75]))
    torch.testing.assert_close(out["params"]["w"], torch.tensor([2.0, 1.75]))
    torch.testing.assert_close(out["control"]["w"], torch.tensor([1.5, 0.0]))  # G + [4, 2] / 4, whatever p is
    # sampled: sum p (theta + h+) = [1.5, 1.0] + [0.625, 0.5]; no h_bar kept
    alg = _alg(drift_mean="sampled")
    state = {"params": {"w": torch.tensor([1.0, 1.0])}, "control": {"w": torch.tensor([0.5, -0.5])}}
    assert sorted(alg.init_server(state["params"])) == ["control", "params"]
    out = alg.aggregate(state, _uploads(sampled=True), p, info)
    torch.testing.assert_close(out["params"]["w"], torch.tensor([2.125, 1.5]))
    torch.testing.assert_close(out["control"]["w"], torch.tensor([1.5, 0.0]))
    assert sorted(out) == ["control", "params"]
    # the model part is FedAvg's weighted sum, then the drift added
    h = {"w": torch.tensor([0.125, -0.5])}
    ws = _uploads(sampled=True)
    out = alg.aggregate_sums(state, {"params": weighted_sum(ws["params"], p), "drift": h,
                                     "delta_control": weighted_sum(ws["delta_control"], torch.full((2,), 0.5))}, info)
    agree(out["params"]["w"], weighted_sum(ws["params"], p)["w"] + h["w"], BITS)


@pytest.mark.agreement
@pytest.mark.parametrize("alpha", [0.0, 0.2])
def test_zero_state_loss_is_fedprox_bit_for_bit(alpha):
    """A client's first round in round 1 (h_i = G_i = G = 0): FedProx's loss with mu = alpha
    (FedAvg's at alpha = 0), values and gradients bit for bit."""
    theta, w, batch = _rand(0), _rand(1), _batch()
    payload, ctx = {"params": w, "control": _zeros(w)}, {"state": {"drift": _zeros(w), "control": _zeros(w)}}
    ref = _alg("fedprox", mu=alpha) if alpha else _alg("fedavg")

    def grad_and_loss(a):
        return torch.func.grad_and_value(lambda p: a.local_loss(p, batch, payload, ctx, apply), has_aux=True)(theta)

    (g, (loss, aux)), (g0, (loss0, _)) = grad_and_loss(_alg(alpha=alpha)), grad_and_loss(ref)
    agree(loss, loss0, BITS)
    agree(g, g0, BITS)
    # the penalty ties theta + h_i (not theta) to w_t, and the correction adds G - G_i
    h, c, c_i = _rand(2, 0.3), _rand(3, 0.3), _rand(4, 0.3)
    ctx2, payload2 = {"state": {"drift": h, "control": c_i}}, {"params": w, "control": c}
    g2, (loss2, aux2) = torch.func.grad_and_value(
        lambda p: _alg(alpha=alpha).local_loss(p, batch, payload2, ctx2, apply), has_aux=True)(theta)
    ce = aux["ce_loss"]
    pen = sum(((theta[k] + h[k] - w[k]) ** 2).sum() for k in theta)
    lin = sum((theta[k] * (c[k] - c_i[k])).sum() for k in theta)
    agree(loss2, ce + 0.5 * alpha * pen + lin)
    agree(aux2["ce_loss"], ce)
    gce = _grad(theta, batch)
    agree(g2, {k: gce[k] + alpha * (theta[k] + h[k] - w[k]) + c[k] - c_i[k] for k in theta})
    # personalisation's loss (objective): no correction
    obj, _ = _alg(alpha=alpha).objective(theta, batch, payload2, ctx2, apply)
    agree(obj, ce + 0.5 * alpha * pen)


def _initial(cfg):
    prep = prepare(cfg)
    model = build_model(prep.config.model.name, prep.options["model"], prep.dataset.input_shape,
                        prep.dataset.num_classes, prep.config.seed)
    return {k: v.detach().clone() for k, v in model.named_parameters()}


@pytest.mark.agreement
@pytest.mark.parametrize("alpha, ref", [(0.0, {"name": "fedavg"}), (0.1, {"name": "fedprox", "mu": 0.1})])
@pytest.mark.parametrize("drift_mean", ["all", "sampled"])
def test_first_round_local_models_are_fedprox_and_the_server_adds_their_drift(tiny, tmp_path, alpha, ref, drift_mean):
    """Round 1, every client, local momentum 0 in both: the local models are FedProx's (FedAvg's at
    alpha = 0) bit for bit (eval.drift scores them); the global model is their mean plus the
    mean drift, 2 mean - w_0 (full participation, uniform weights)."""
    sections = dict(train={"rounds": 1, "clients_per_round": 6, "momentum": 0.0}, eval={"drift": True})
    a = fedrift.run(tiny(algorithm={**ref, "aggregation": "uniform"}, output={"dir": str(tmp_path / "ref")}, **sections))
    cfg = tiny(algorithm={"name": "feddc", "alpha": alpha, "drift_mean": drift_mean, "aggregation": "uniform"},
               output={"dir": str(tmp_path / "dc")}, **sections)
    b = fedrift.run(cfg)
    (ra,), (rb,) = a.history, b.history
    keys = ("local_test_accuracy", "local_test_accuracy_min", "drift_logit_kl", "drift_feature_l2", "train_loss")
    agree({key: ra[key] for key in keys}, {key: rb[key] for key in keys}, BITS)
    w0 = _initial(cfg)
    agree(b.global_state, {k: 2 * a.global_state[k] - w0[k] for k in w0})
    assert any(not torch.equal(a.global_state[k], b.global_state[k]) for k in w0)  # not FedAvg: the drift is added


def test_bytes_two_models_down_two_up_three_when_drifts_go_up(tiny, tmp_path):
    one = {"rounds": 1}
    runs = {name: fedrift.run(tiny(algorithm=alg, train=one, output={"dir": str(tmp_path / name)}))
            for name, alg in (("fedavg", {"name": "fedavg"}), ("all", {"name": "feddc"}),
                              ("sampled", {"name": "feddc", "drift_mean": "sampled"}))}
    avg = runs["fedavg"].history[0]
    for name, up in (("all", 2), ("sampled", 3)):
        row = runs[name].history[0]
        assert row["bytes_down"] == 2 * avg["bytes_down"]  # w_t and G
        assert row["bytes_up"] == up * avg["bytes_up"]  # theta_i and Delta G_i (and h_i+)


@pytest.mark.agreement
def test_states_persist_across_rounds_in_the_disk_store(tiny, tmp_path, monkeypatch):
    """4 rounds of 3 of 6 clients, states on disk: returning clients read their drift again, so
    the server's h_bar is the mean of every client's last stored drift, and G the mean of their
    controls (each moved by exactly what the clients stored)."""
    puts: dict[int, list] = {}
    opened, real_put, real_open = [], ClientStateStore.put, ClientStateStore._open

    def put(self, client, state):
        puts.setdefault(client, []).append({f: {k: v.clone() for k, v in t.items()} for f, t in state.items()})
        real_put(self, client, state)

    monkeypatch.setattr(ClientStateStore, "put", put)
    monkeypatch.setattr(ClientStateStore, "_open", lambda self, layout: (opened.append(self._path), real_open(self, layout)))
    r = fedrift.run(tiny(algorithm={"name": "feddc", "alpha": 0.1}, engine={"client_state": "disk"},
                         train={"rounds": 4, "clients_per_round": 3}))
    assert opened == [Path(r.output_dir) / "client_state.bin"]  # the states lived in the file
    assert max(len(v) for v in puts.values()) > 1  # some client came back
    n = 6
    for field in ("drift", "control"):
        # a returning client that had restarted from zero would have lost its earlier part
        mean = {k: sum(states[-1][field][k] for states in puts.values()) / n for k in r.server_state[field]}
        agree(r.server_state[field], mean, where=field)
        assert all(v.abs().max() > 1e-4 for v in r.server_state[field].values())


@pytest.mark.agreement
@pytest.mark.parametrize("drift_mean", ["all", "sampled"])
def test_checkpoint_and_resume_give_the_same_bits(tiny, tmp_path, drift_mean):
    """Ctrl-C in round 4, resumed from round 2's checkpoint (client states on disk)."""
    def cfg(name, every):
        return tiny(algorithm={"name": "feddc", "alpha": 0.1, "drift_mean": drift_mean}, train={"rounds": 5},
                    engine={"client_state": "disk", "checkpoint_every": every}, output={"dir": str(tmp_path / name)})

    ref = fedrift.run(cfg("reference", 0))
    with pytest.MonkeyPatch.context() as mp_:
        ctrl_c_in_round(mp_, 4)
        with pytest.raises(KeyboardInterrupt):
            fedrift.run(cfg("stopped", 2))
    resumed = fedrift.resume(tmp_path / "stopped")
    assert resumed.summary["resumed_from_round"] == 2
    agree(ref.global_state, resumed.global_state, BITS)
    for field, tree in ref.server_state.items():
        if isinstance(tree, dict):
            agree(tree, resumed.server_state[field], BITS, where=field)
    agree(untimed(resumed.history), untimed(ref.history), BITS)


@pytest.mark.process
@pytest.mark.agreement
def test_drift_mean_sampled_executors_agree(tiny, tmp_path):
    """The streamed form (algorithm_cases covers ``all``): processes equal sequential bit for
    bit at one thread, batched within float rounding."""
    runs = {ex: fedrift.run(tiny(algorithm={"name": "feddc", "alpha": 0.1, "drift_mean": "sampled"},
                                 train={"rounds": 3, "clients_per_round": 4},
                                 engine={"executor": ex, "threads": 1, "workers": 2}, output={"dir": str(tmp_path / ex)}))
            for ex in ("sequential", "processes", "batched")}
    seq = runs["sequential"]
    agree(seq.global_state, runs["processes"].global_state, BITS)
    agree(runs["batched"].global_state, seq.global_state)
    agree(untimed(runs["processes"].history), untimed(seq.history), BITS)


def test_client_level_privacy_is_refused_before_the_run(tiny):
    cfg = tiny(algorithm={"name": "feddc"}, privacy={"level": "client"})
    with pytest.raises(ConfigError, match="feddc uploads more \\(delta_control\\)"):
        fedrift.run(cfg)
    assert not Path(cfg["output"]["dir"]).exists()
