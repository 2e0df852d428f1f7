import dataclasses

import pytest
import torch
from agreement import BITS, agree
from linear_model import apply
from linear_model import rand_params as _rand

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.algorithms.terms import weighted_ce
from fedrift.engine.local import make_step
from fedrift.functional.tree import stack, weighted_sum

ETA = 0.1
SETUP = Setup(num_classes=3, num_clients=4, feature_dim=4, lr=ETA, momentum=0.9, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(name, setup=SETUP, **hp):
    return make(name, setup, **hp)


def _batches(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(5, 4, generator=g), "y": torch.randint(0, 3, (5,), generator=g), "w": torch.full((5,), 0.2)}
            for _ in range(steps)]


def _grad(params, batch):
    return torch.func.grad(lambda p: weighted_ce(apply(p, batch["x"]), batch["y"], batch["w"]))(params)


def test_corrected_gradient_by_hand():
    alg = _alg("scaffold")
    grads = {"w": torch.tensor([1.0, 2.0])}
    ctx = {"state": {"control": {"w": torch.tensor([0.5, -0.5])}}}
    payload = {"control": {"w": torch.tensor([0.25, 0.25])}}
    out = alg.grad_correction(grads, {"w": torch.zeros(2)}, payload, ctx)
    assert torch.equal(out["w"], torch.tensor([0.75, 2.75]))  # g - c_k + c
    fresh = alg.init_client({"w": torch.ones(3)})  # a client never sampled: c_k = 0
    assert list(fresh) == ["control"] and torch.equal(fresh["control"]["w"], torch.zeros(3))


@pytest.mark.agreement
def test_one_local_step_is_w_minus_eta_corrected_gradient():
    # with weight decay and clipping: clip(g) + wd w is the data gradient, then - c_k + c
    wd, clip = 0.01, 0.5
    alg = _alg("scaffold", setup=dataclasses.replace(SETUP, weight_decay=wd, clip_grad_norm=clip))
    w, c_k, c = _rand(0), _rand(1, 0.3), _rand(2, 0.3)
    batch = _batches(1)[0]
    payload, ctx = {"params": w, "control": c}, {"state": {"control": c_k}, "num_steps": torch.tensor(1.0)}
    step = make_step(alg, apply, alg.optimizer)
    new, _, _, _ = step(w, alg.optimizer.init(w), batch, payload, ctx)
    g = _grad(w, batch)
    norm = torch.sqrt(sum((v ** 2).sum() for v in g.values()))
    factor = min(1.0, clip / (norm.item() + 1e-6))
    assert factor < 1.0  # the clip is active here
    agree(new, {k: w[k] - ETA * (factor * g[k] + wd * w[k] - c_k[k] + c[k]) for k in w})


def test_control_update_by_hand():
    # w_t - w_k = [0.2, -0.4] after H = 2 steps of eta = 0.1: (w_t - w_k) / (H eta) = [1, -2]
    alg = _alg("scaffold")
    payload = {"params": {"w": torch.tensor([1.0, 2.0])}, "control": {"w": torch.tensor([0.25, -0.25])}}
    ctx = {"num_steps": torch.tensor(2.0), "state": {"control": {"w": torch.tensor([0.5, 0.5])}}}
    upload, state = alg.client_result(payload, {"w": torch.tensor([0.8, 2.4])}, ctx)
    # c_k+ = c_k - c + [1, -2] = [0.25 + 1, 0.75 - 2]
    torch.testing.assert_close(state["control"]["w"], torch.tensor([1.25, -1.25]))
    torch.testing.assert_close(upload["delta_control"]["w"], torch.tensor([0.75, -1.75]))
    torch.testing.assert_close(upload["params"]["w"], torch.tensor([0.8, 2.4]))


@pytest.mark.agreement
def test_new_client_control_is_the_mean_raw_gradient_along_the_path():
    # w_k = w_t - eta sum_s (g_s - c_k + c), so c_k+ = c_k - c + mean_s (g_s - c_k + c) = mean_s g_s
    alg = _alg("scaffold")
    w0, c_k, c = _rand(0), _rand(1, 0.3), _rand(2, 0.3)
    batches = _batches(4)
    payload, ctx = {"params": w0, "control": c}, {"state": {"control": c_k}, "num_steps": torch.tensor(4.0)}
    step = make_step(alg, apply, alg.optimizer)
    params, opt, gsum = w0, alg.optimizer.init(w0), {k: torch.zeros_like(v) for k, v in w0.items()}
    for b in batches:
        g = _grad(params, b)
        gsum = {k: gsum[k] + g[k] for k in gsum}
        params, opt, _, _ = step(params, opt, b, payload, ctx)
    _, state = alg.client_result(payload, params, ctx)
    agree(state["control"], {k: gsum[k] / 4 for k in w0})


@pytest.mark.agreement
def test_server_update_by_hand():
    alg = _alg("scaffold", eta_g=0.5)
    state = alg.init_server({"w": torch.tensor([1.0, 1.0])})
    state = {**state, "control": {"w": torch.tensor([0.5, -0.5])}}
    uploads = stack([{"params": {"w": torch.tensor([2.0, 0.0])}, "delta_control": {"w": torch.tensor([1.0, 0.0])}},
                     {"params": {"w": torch.tensor([0.0, 4.0])}, "delta_control": {"w": torch.tensor([3.0, 2.0])}}])
    p = torch.tensor([0.75, 0.25], dtype=torch.float64)
    info = RoundInfo(round=1, num_clients=4, sampled=(0, 2))
    out = alg.aggregate(state, uploads, p, info)
    # avg = [1.5, 1.0]; w = w_t + 0.5 (avg - w_t) = [1.25, 1.0]
    torch.testing.assert_close(out["params"]["w"], torch.tensor([1.25, 1.0]))
    # c + |S|/N mean(delta) = [0.5, -0.5] + (2/4) [2, 1] (a plain mean, whatever p is)
    torch.testing.assert_close(out["control"]["w"], torch.tensor([1.5, 0.0]))
    # eta_g = 1: FedAvg's weighted average, bit for bit
    g = torch.Generator().manual_seed(0)
    ws = stack([{"params": {"w": torch.randn(9, generator=g)}, "delta_control": {"w": torch.randn(9, generator=g)}}
                for _ in range(3)])
    p3 = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    state = {"params": {"w": torch.randn(9, generator=g)}, "control": {"w": torch.zeros(9)}}
    out = _alg("scaffold").aggregate(state, ws, p3, RoundInfo(1, 4, (0, 1, 3)))
    agree(out["params"]["w"], weighted_sum(ws["params"], p3)["w"], BITS)


@pytest.mark.agreement
def test_first_round_is_fedavg_without_momentum_then_the_controls_act(tiny, tmp_path):
    # round 1: c = c_k = 0, so the corrected step is plain SGD and the average FedAvg's
    one = {"rounds": 1, "momentum": 0.0}
    a = fedrift.run(tiny(algorithm={"name": "fedavg"}, train=one, output={"dir": str(tmp_path / "a")}))
    b = fedrift.run(tiny(algorithm={"name": "scaffold"}, train=one, output={"dir": str(tmp_path / "b")}))
    agree(a.global_state, b.global_state, BITS)
    # two models down (w_t, c) and two up (w_k, delta c_k) per client
    assert b.history[0]["bytes_down"] == 2 * a.history[0]["bytes_down"]
    assert b.history[0]["bytes_up"] == 2 * a.history[0]["bytes_up"]
    assert any(v.abs().max() > 0 for v in b.server_state["control"].values())
    three = {"rounds": 3, "momentum": 0.0}
    c = fedrift.run(tiny(algorithm={"name": "fedavg"}, train=three, output={"dir": str(tmp_path / "c")}))
    d = fedrift.run(tiny(algorithm={"name": "scaffold"}, train=three, output={"dir": str(tmp_path / "d")}))
    assert any(not torch.equal(c.global_state[k], d.global_state[k]) for k in c.global_state)
