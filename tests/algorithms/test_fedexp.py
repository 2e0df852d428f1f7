from pathlib import Path

import pytest
import torch
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import ALGORITHMS, make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.algorithms.fedavg import ce_loss
from fedrift.functional.tree import stack
from fedrift.errors import ConfigError

SETUP = Setup(num_classes=3, num_clients=3, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)
P = torch.tensor([0.75, 0.25], dtype=torch.float64)


def _info(t):
    return RoundInfo(round=t, num_clients=3, sampled=(0, 2))


def _round(alg, state, t, *ends):
    """Round ``t``: the clients' uploads from their end models (client_result), then aggregate."""
    payload = alg.broadcast(state, _info(t))
    ups = [alg.client_result(payload, {"w": torch.tensor(w, dtype=torch.float64)}, {})[0] for w in ends]
    return alg.aggregate(state, stack(ups), P, _info(t)), ups


def test_extrapolated_step_with_two_clients_by_hand():
    # w_t = [0, 0]; w_1 = [1, 1], w_2 = [1, -3]: Delta_1 = [-1, -1] (||.||^2 = 2), Delta_2 = [-1, 3] (10);
    # sum p ||Delta_k||^2 = 0.75 * 2 + 0.25 * 10 = 4; Delta = [-1, 0] (||.||^2 = 1);
    # eta_g = max(1, 4 / (2 (1 + 0.25))) = 1.6; w_1 = w_0 - 1.6 Delta = [1.6, 0] (FedAvg's: [1, 0])
    alg = make("fedexp", SETUP, epsilon=0.25)
    state = alg.init_server({"w": torch.zeros(2, dtype=torch.float64)})
    one, ups = _round(alg, state, 1, [1.0, 1.0], [1.0, -3.0])
    assert [u["sq_norm"]["delta"].item() for u in ups] == [2.0, 10.0]  # the scalar each client uploads
    torch.testing.assert_close(one["iterate"]["w"], torch.tensor([1.6, 0.0], dtype=torch.float64), rtol=1e-15, atol=1e-15)
    assert torch.equal(one["params"]["w"], one["iterate"]["w"])  # round 1 reports w_1 itself (the authors' code)
    # round 2 from w_1 = [1.6, 0]: the same moves give eta_g = 1.6 again, w_2 = [3.2, 0]; reported:
    # the mean of the last two iterates, (w_2 + w_1) / 2 = [2.4, 0]; the clients started from w_1
    assert torch.equal(alg.broadcast(one, _info(2))["params"]["w"], one["iterate"]["w"])
    two, _ = _round(alg, one, 2, [2.6, 1.0], [2.6, -3.0])
    torch.testing.assert_close(two["iterate"]["w"], torch.tensor([3.2, 0.0], dtype=torch.float64), rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(two["params"]["w"], torch.tensor([2.4, 0.0], dtype=torch.float64), rtol=1e-15, atol=1e-15)
    # the next round starts from the iterate, not the reported average
    assert torch.equal(alg.broadcast(two, _info(3))["params"]["w"], two["iterate"]["w"])


@pytest.mark.agreement
def test_agreeing_clients_clamp_eta_at_one_and_give_fedavgs_average_bit_for_bit():
    # w_t = [0.2, -0.1], w_1 = [0.3, -0.7], w_2 = [0.25, -0.5]: sum p ||Delta_k||^2 = 0.75 * 0.37 + 0.25 * 0.1625
    # = 0.318125, avg = [0.2875, -0.65], ||Delta||^2 = 0.31015625: ratio 0.51, so eta_g = 1 and the
    # iterate is FedAvg's sum_k p_k w_k itself
    alg = make("fedexp", SETUP, average_last=False)
    state = alg.init_server({"w": torch.tensor([0.2, -0.1], dtype=torch.float64)})
    ends = ([0.3, -0.7], [0.25, -0.5])
    avg = make("fedavg", SETUP).aggregate(state, stack([{"params": {"w": torch.tensor(w, dtype=torch.float64)}} for w in ends]),
                                          P, _info(1))["params"]["w"]
    torch.testing.assert_close(avg, torch.tensor([0.2875, -0.65], dtype=torch.float64))
    out, ups = _round(alg, state, 1, *ends)
    s = sum(float(p) * u["sq_norm"]["delta"].item() for p, u in zip(P, ups))
    assert s == pytest.approx(0.318125) and s / (2 * (0.31015625 + 1e-3)) < 1
    agree(out["iterate"]["w"], avg, BITS)
    agree(out["params"]["w"], avg, BITS)


def test_running_statistics_are_averaged_not_extrapolated_nor_counted():
    alg = make("fedexp", SETUP, epsilon=0.25)
    zero = {"w": torch.zeros(2, dtype=torch.float64), "bn.running_var": torch.ones(1, dtype=torch.float64)}
    state = alg.init_server(zero)
    ends = [{"w": torch.tensor([1.0, 1.0], dtype=torch.float64), "bn.running_var": torch.tensor([3.0], dtype=torch.float64)},
            {"w": torch.tensor([1.0, -3.0], dtype=torch.float64), "bn.running_var": torch.tensor([7.0], dtype=torch.float64)}]
    ups = [alg.client_result({"params": zero}, e, {})[0] for e in ends]
    assert [u["sq_norm"]["delta"].item() for u in ups] == [2.0, 10.0]  # the statistics are not in the norms
    out = alg.aggregate(state, stack(ups), P, _info(1))
    torch.testing.assert_close(out["iterate"]["w"], torch.tensor([1.6, 0.0], dtype=torch.float64))  # as by hand above
    assert torch.equal(out["iterate"]["bn.running_var"], torch.tensor([4.0], dtype=torch.float64))  # 0.75 * 3 + 0.25 * 7


def test_defaults_and_tuning_space():
    hp = make("fedexp", SETUP).hparams
    assert (hp.epsilon, hp.average_last, hp.aggregation) == (1e-3, True, "samples")
    assert set(ALGORITHMS.get("fedexp").space) == {"epsilon"}
    alg = make("fedexp", SETUP)
    assert alg.local_loss is ce_loss and alg.optimizer is None and alg.grad_correction is None
    assert alg.sums == {"params": "weights", "sq_norm": "weights"}  # streamed: two weighted sums
    with pytest.raises(fedrift.FedriftError, match="epsilon"):
        make("fedexp", SETUP, epsilon=0.0)


def _runs(tiny, tmp_path, train, *algorithms):
    return [fedrift.run(tiny(algorithm=a, train=train, output={"dir": str(tmp_path / f"r{i}")})) for i, a in enumerate(algorithms)]


@pytest.mark.agreement
def test_never_extrapolating_is_exactly_fedavg(tiny, tmp_path):
    """One client a round (its ratio is ||D||^2 / (2 (||D||^2 + eps)) < 1) or a huge epsilon:
    eta_g = 1 every round, and without the reported average the run is FedAvg's bit for bit."""
    one = {"rounds": 3, "clients_per_round": 1}
    a, b = _runs(tiny, tmp_path / "one", one, {"name": "fedavg"}, {"name": "fedexp", "average_last": False})
    three = {"rounds": 3}
    c, d, e = _runs(tiny, tmp_path / "three", three, {"name": "fedavg"}, {"name": "fedexp", "average_last": False, "epsilon": 1e9},
                    {"name": "fedexp", "average_last": False})
    for x, y in ((a, b), (c, d)):
        agree(x.global_state, y.global_state, BITS)
        agree([r["test_accuracy"] for r in x.history], [r["test_accuracy"] for r in y.history], BITS)
    # with the paper's epsilon these three-client rounds do extrapolate
    assert any(not torch.equal(c.global_state[k], e.global_state[k]) for k in c.global_state)
    # the upload is the model and one float32 per client; the broadcast is one model
    assert [r["bytes_up"] - 3 * 4 for r in d.history] == [r["bytes_up"] for r in c.history]
    assert [r["bytes_down"] for r in d.history] == [r["bytes_down"] for r in c.history]


@pytest.mark.agreement
def test_the_reported_average_never_enters_training(tiny, tmp_path):
    """The iterates with and without the reported average are the same bits; the reported model
    is (w_3 + w_2) / 2 of those iterates."""
    w3, avg = _runs(tiny, tmp_path, {"rounds": 3}, {"name": "fedexp", "average_last": False}, {"name": "fedexp"})
    w2 = fedrift.run(tiny(algorithm={"name": "fedexp", "average_last": False}, train={"rounds": 2}, output={"dir": str(tmp_path / "two")}))
    agree(avg.server_state["iterate"], w3.server_state["iterate"], BITS)
    agree(avg.global_state, {k: 0.5 * (w3.server_state["iterate"][k] + w2.server_state["iterate"][k]) for k in w3.global_state},
          BITS)
    for k in w3.global_state:
        assert torch.equal(avg.global_state[k], avg.server_state["params"][k])
    final = torch.load(Path(avg.output_dir) / "final_model.pt")
    assert all(torch.equal(final[k], avg.global_state[k]) for k in final)


def test_privacy_client_level_refuses_the_norm_upload(tiny):
    cfg = tiny(algorithm={"name": "fedexp"}, privacy={"level": "client"})
    with pytest.raises(ConfigError, match="sq_norm"):
        fedrift.run(cfg)
    assert not Path(cfg["output"]["dir"]).exists()


@pytest.mark.agreement
def test_streamed_norms_equal_the_stacked_aggregate_bit_for_bit(tiny):
    """The scalar ||Delta_k||^2 folded into a running sum as clients finish gives the same model
    as the round's uploads stacked whole (engine.accept_failures takes the stacked path)."""
    cfg = tiny(algorithm={"name": "fedexp", "epsilon": 1e-4}, train={"rounds": 3, "clients_per_round": 4})
    streamed = fedrift.run(cfg)
    stacked = fedrift.run({**cfg, "engine": {"accept_failures": True}, "output": {**cfg["output"], "dir": cfg["output"]["dir"] + "-stacked"}})
    for key in ("params", "iterate"):
        agree(streamed.server_state[key], stacked.server_state[key], BITS, where=key)
    assert streamed.summary["bytes_up_total"] == stacked.summary["bytes_up_total"]
