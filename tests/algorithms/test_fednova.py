import dataclasses

import pytest
import torch
from agreement import agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import Algorithm, RoundInfo, Setup
from fedrift.algorithms.fednova import normalizer
from fedrift.engine.local import make_step
from fedrift.functional.optim import sgd
from fedrift.functional.tree import stack, weighted_sum

ETA = 0.1
SETUP = Setup(num_classes=3, num_clients=3, feature_dim=4, lr=ETA, momentum=0.9, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(name, setup=SETUP, **hp):
    return make(name, setup, **hp)


def _uploads(rows):
    return stack([{"params": {"w": torch.tensor(w)}, "a": torch.tensor(a, dtype=torch.float64)} for w, a in rows])


def test_a_k_is_tau_without_momentum():
    for tau in (1.0, 5.0, 37.0):
        assert normalizer(torch.tensor(tau), 0.0).item() == tau
    alg = _alg("fednova", setup=dataclasses.replace(SETUP, momentum=0.0))
    ctx = {"num_steps": torch.tensor(7.0), "state": {}}
    upload, _ = alg.client_result({"params": {"w": torch.zeros(2)}}, {"w": torch.ones(2)}, ctx)
    assert upload["a"].item() == 7.0 and torch.equal(upload["params"]["w"], torch.ones(2))


def test_a_k_with_momentum_is_the_formula_and_the_weight_of_the_gradients():
    rho = 0.9
    # by hand: sum_{s=1..tau} (1 + rho + ... + rho^{s-1}): 1, 1 + 1.9 = 2.9, 2.9 + 2.71 = 5.61
    for tau, expected in ((1, 1.0), (2, 2.9), (3, 5.61)):
        assert normalizer(torch.tensor(float(tau)), rho).item() == pytest.approx(expected, rel=1e-12)
    # the same number from the formula for a larger tau, against the plain double sum
    tau = 20
    direct = sum(sum(rho**j for j in range(s)) for s in range(1, tau + 1))
    assert normalizer(torch.tensor(float(tau)), rho).item() == pytest.approx(direct, rel=1e-12)
    # and what it means: tau steps of SGD with momentum rho on a constant gradient g move the
    # model by eta a_k g (the engine's own step and optimiser)
    g = torch.tensor([0.5, -2.0])
    alg = _alg("fednova")

    linear = Algorithm(name="linear", hparams=None, local_loss=lambda p, b, pl, c, apply: ((g * p["w"]).sum(), {}))
    opt = sgd(ETA, rho)  # loss <g, w>: gradient g everywhere
    step = make_step(linear, None, opt)
    w0 = {"w": torch.tensor([1.0, 1.0])}
    params, state = w0, opt.init(w0)
    for _ in range(tau):
        params, state, _, _ = step(params, state, {}, {}, {})
    upload, _ = alg.client_result({"params": w0}, params, {"num_steps": torch.tensor(float(tau)), "state": {}})
    torch.testing.assert_close((w0["w"] - params["w"]) / (ETA * g), torch.full((2,), direct), rtol=1e-5, atol=0)
    assert upload["a"].item() == pytest.approx(direct, rel=1e-12)


def test_server_update_by_hand():
    # w_t = 1; client 1: w = 0 after a = 2 (d = 0.5); client 2: w = 3 after a = 4 (d = -0.5);
    # p = (0.75, 0.25): tau_eff = 2.5, sum p d = 0.25, w_{t+1} = 1 - eta_s 2.5 0.25
    state = {"params": {"w": torch.tensor([1.0])}}
    uploads = _uploads([([0.0], 2.0), ([3.0], 4.0)])
    p = torch.tensor([0.75, 0.25], dtype=torch.float64)
    info = RoundInfo(1, 3, (0, 1))
    out = _alg("fednova").aggregate(state, uploads, p, info)
    torch.testing.assert_close(out["params"]["w"], torch.tensor([0.375]))
    out = _alg("fednova", eta_s=2.0).aggregate(state, uploads, p, info)
    torch.testing.assert_close(out["params"]["w"], torch.tensor([-0.25]))
    # FedAvg would give 0.75: the client with more steps no longer pulls harder


@pytest.mark.agreement
def test_equal_steps_aggregate_is_the_weighted_average():
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(5, generator=g) for _ in range(3)]
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    a = normalizer(torch.tensor(6.0), 0.9)
    uploads = stack([{"params": {"w": w}, "a": a} for w in ws])
    out = _alg("fednova").aggregate({"params": {"w": torch.randn(5, generator=g)}}, uploads, p, RoundInfo(1, 3, (0, 1, 2)))
    agree(out["params"]["w"], weighted_sum(uploads["params"], p)["w"])


@pytest.mark.agreement
def test_equal_local_steps_and_eta_s_one_is_fedavg(tiny, tmp_path):
    train = {"rounds": 3, "local_steps": 4}  # every client 4 steps; local momentum 0.9 (the default)
    a = fedrift.run(tiny(algorithm={"name": "fedavg"}, train=train, output={"dir": str(tmp_path / "a")}))
    b = fedrift.run(tiny(algorithm={"name": "fednova"}, train=train, output={"dir": str(tmp_path / "b")}))
    agree(a.global_state, b.global_state)
    # uneven step counts (local epochs over clients of different sizes): a different model
    c = fedrift.run(tiny(algorithm={"name": "fedavg"}, train={"rounds": 3}, output={"dir": str(tmp_path / "c")}))
    d = fedrift.run(tiny(algorithm={"name": "fednova"}, train={"rounds": 3}, output={"dir": str(tmp_path / "d")}))
    assert max((c.global_state[k] - d.global_state[k]).abs().max().item() for k in c.global_state) > 1e-4


def test_unequal_steps_extrapolate_past_the_average_so_eta_s_is_tuned():
    # Every client moved w from 0 to 1: FedAvg gives 1 whatever the weights. FedNova's
    # coefficients c_k = tau_eff p_k / a_k sum to tau_eff sum p_k / a_k >= 1 (Jensen), here
    # p = (0.5, 0.5), a = (1, 3): tau_eff 2, c = (1, 1/3), so the server moves 4/3 of the way.
    state = {"params": {"w": torch.tensor([0.0])}}
    uploads = _uploads([([1.0], 1.0), ([1.0], 3.0)])
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    out = _alg("fednova").aggregate(state, uploads, p, RoundInfo(1, 3, (0, 1)))
    torch.testing.assert_close(out["params"]["w"], torch.tensor([4.0 / 3.0]))
    out = _alg("fednova", eta_s=0.75).aggregate(state, uploads, p, RoundInfo(1, 3, (0, 1)))
    torch.testing.assert_close(out["params"]["w"], torch.tensor([1.0]))
    from fedrift.experiments.space import default_space

    assert set(default_space("fednova")) == {"train.lr", "algorithm.eta_s"}
