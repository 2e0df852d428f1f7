import math

import pytest
import torch
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import ALGORITHMS, make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.algorithms.fedavg import ce_loss
from fedrift.engine.build import build_run, prepare
from fedrift.functional.tree import stack

SETUP = Setup(num_classes=3, num_clients=3, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)
INFO = RoundInfo(round=1, num_clients=3, sampled=(0, 2))
P = torch.tensor([0.75, 0.25], dtype=torch.float64)


def _uploads(*ws):
    return stack([{"params": {"w": torch.tensor(w, dtype=torch.float64)}} for w in ws])


def _by_hand(rule, w, avg, rounds, eta, b1, b2, tau):
    """Algorithm 2 written out per coordinate with Python floats: the (w, m, v) after each round."""
    m, v, out = [0.0] * len(w), [tau * tau] * len(w), []
    for _ in range(rounds):
        for i in range(len(w)):
            d = avg[i] - w[i]
            m[i] = b1 * m[i] + (1 - b1) * d
            if rule == "fedadagrad":
                v[i] = v[i] + d * d
            elif rule == "fedadam":
                v[i] = b2 * v[i] + (1 - b2) * d * d
            else:
                v[i] = v[i] - (1 - b2) * d * d * (1.0 if v[i] > d * d else -1.0 if v[i] < d * d else 0.0)
            w[i] = w[i] + eta * m[i] / (math.sqrt(v[i]) + tau)
        out.append((list(w), list(m), list(v)))
    return out


def test_adagrad_first_step_by_hand():
    # w_0 = 1, avg = 1.4: Delta = 0.4; m = 0.5 * 0.4 = 0.2; v = 0.3^2 + 0.16 = 0.25;
    # w_1 = 1 + 2 * 0.2 / (0.5 + 0.3) = 1.5
    alg = make("fedadagrad", SETUP, eta_s=2.0, beta1=0.5, tau=0.3)
    state = alg.init_server({"w": torch.tensor([1.0], dtype=torch.float64)})
    out = alg.aggregate(state, _uploads([1.4], [1.4]), P, INFO)
    torch.testing.assert_close(out["m"]["w"], torch.tensor([0.2], dtype=torch.float64))
    torch.testing.assert_close(out["v"]["w"], torch.tensor([0.25], dtype=torch.float64))
    torch.testing.assert_close(out["params"]["w"], torch.tensor([1.5], dtype=torch.float64))


@pytest.mark.parametrize("name", ["fedadagrad", "fedadam", "fedyogi"])
def test_two_rounds_carry_m_and_v_as_algorithm_2(name):
    hp = {"eta_s": 0.5, "beta1": 0.5, "tau": 0.1} | ({} if name == "fedadagrad" else {"beta2": 0.75})
    alg = make(name, SETUP, **hp)
    w0 = [1.0, -2.0]
    state = alg.init_server({"w": torch.tensor(w0, dtype=torch.float64)})
    assert torch.equal(state["m"]["w"], torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(state["v"]["w"], torch.full((2,), 0.01, dtype=torch.float64))  # v_{-1} = tau^2
    # avg = 0.75 [1.02, -1.0] + 0.25 [1.02, -2.0] = [1.02, -1.25]: Delta = [0.02, 0.75], so under
    # Yogi coordinate 0 has v > Delta^2 (v shrinks) and coordinate 1 v < Delta^2 (v grows)
    uploads = _uploads([1.02, -1.0], [1.02, -2.0])
    avg = [1.02, -1.25]
    expect = _by_hand(name, list(w0), avg, 2, hp["eta_s"], 0.5, hp.get("beta2", 0.0), 0.1)
    for w, m, v in expect:  # round 2 from round 1's state, same uploads: Delta changes as w moved
        state = alg.aggregate(state, uploads, P, INFO)
        for key, want in (("params", w), ("m", m), ("v", v)):
            torch.testing.assert_close(state[key]["w"], torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    if name == "fedyogi":
        assert state["v"]["w"][0] < 0.01 < state["v"]["w"][1]


def test_the_sign_the_server_moves_towards_the_clients():
    alg = make("fedadam", SETUP)
    state = alg.init_server({"w": torch.zeros(3)})
    out = alg.aggregate(state, stack([{"params": {"w": torch.tensor([1.0, -1.0, 0.0])}}] * 2), torch.tensor([0.5, 0.5]), INFO)
    assert out["params"]["w"][0] > 0 > out["params"]["w"][1] and out["params"]["w"][2] == 0


def test_defaults_and_tuning_spaces():
    adam, yogi, adagrad = (make(n, SETUP).hparams for n in ("fedadam", "fedyogi", "fedadagrad"))
    assert (adam.eta_s, adam.beta1, adam.beta2, adam.tau) == (1e-2, 0.9, 0.99, 1e-3) == (yogi.eta_s, yogi.beta1, yogi.beta2, yogi.tau)
    assert (adagrad.eta_s, adagrad.beta1, adagrad.tau) == (0.1, 0.9, 1e-3) and not hasattr(adagrad, "beta2")
    for name in ("fedadam", "fedyogi", "fedadagrad"):
        assert set(ALGORITHMS.get(name).space) == {"eta_s", "tau"}
    with pytest.raises(fedrift.FedriftError, match="beta2"):
        make("fedadagrad", SETUP, beta2=0.9)  # Adagrad has no second-moment decay
    with pytest.raises(fedrift.FedriftError, match="tau"):
        make("fedadam", SETUP, tau=0.0)


@pytest.mark.agreement
def test_clients_are_fedavgs_and_the_pseudo_gradient_is_fedavgs_update_bit_for_bit(tiny, tmp_path):
    """The exact identity FedOpt has: its clients are FedAvg's and Delta_t is FedAvg's model
    change, so with beta1 = 0, m after round 1 is FedAvg's w_1 - w_0 bit for bit. (FedOpt with
    server SGD is fedavgm, whose beta = 0, eta_s = 1 is FedAvg: tests/algorithms/test_fedavgm.py.)"""
    for name in ("fedadam", "fedyogi", "fedadagrad"):
        alg = make(name, SETUP)
        assert alg.local_loss is ce_loss and alg.optimizer is None and alg.grad_correction is None
    train = {"rounds": 1}
    cfg = tiny(algorithm={"name": "fedavg"}, train=train, output={"dir": str(tmp_path / "a")})
    model, _ = build_run(prepare(cfg))
    w0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    a = fedrift.run(cfg)
    b = fedrift.run(tiny(algorithm={"name": "fedadam", "beta1": 0.0}, train=train, output={"dir": str(tmp_path / "b")}))
    assert set(b.server_state["m"]) == set(w0) == set(a.global_state)
    agree(b.server_state["m"], {k: a.global_state[k] - w0[k] for k in w0}, BITS)
    for k in w0:
        assert not torch.equal(b.global_state[k], a.global_state[k]), k
    # one model down and one up per client, as FedAvg
    assert [r["bytes_down"] for r in a.history] == [r["bytes_down"] for r in b.history]
    assert [r["bytes_up"] for r in a.history] == [r["bytes_up"] for r in b.history]
