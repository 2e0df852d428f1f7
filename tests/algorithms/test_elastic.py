from pathlib import Path

import pytest
import torch

import fedrift
from fedrift.algorithms import ALGORITHMS, make
from fedrift.algorithms.base import ClientData, RoundInfo, Setup
from fedrift.algorithms.elastic import sensitivity
from fedrift.algorithms.fedavg import ce_loss
from fedrift.engine.build import build_run, prepare
from fedrift.functional.tree import stack
from fedrift.errors import ConfigError
from agreement import BITS, agree
from linear_model import apply, rand_params

SETUP = Setup(num_classes=3, num_clients=3, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0,
              batch_size=2)
INFO = RoundInfo(round=1, num_clients=3, sampled=(0, 2))
P = torch.tensor([0.5, 0.5], dtype=torch.float64)


def _by_hand(params, x, batch_size):
    """Omega for logits F = x W + b: d||F||^2 / dW[j, c] = 2 F_c x_j, d/db_c = 2 F_c; a batch's
    gradient is the mean of its rows', weighted |b| / n, absolute value taken per batch."""
    W, b = params["w"].double(), params["b"].double()
    x = x.double()
    n = len(x)
    om_w, om_b = torch.zeros_like(W), torch.zeros_like(b)
    for i in range(0, n, batch_size):
        xb = x[i : i + batch_size]
        F = xb @ W + b
        gw = sum(2 * torch.outer(xb[r], F[r]) for r in range(len(xb))) / len(xb)
        gb = sum(2 * F[r] for r in range(len(xb))) / len(xb)
        om_w += len(xb) / n * gw.abs()
        om_b += len(xb) / n * gb.abs()
    return {"w": om_w, "b": om_b}


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_sensitivity_by_hand(batch_size):
    """One row per batch is the mean over samples of |g(x_i)| (the definition); five rows in
    batches of 2 weigh the last batch by 1/5; one batch of all is |mean g|."""
    params = rand_params(0)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # as the engine calls client_end: torch.func.grad still differentiates
        got = sensitivity(apply, params, x, batch_size)
    want = _by_hand(params, x, batch_size)
    for k in params:
        torch.testing.assert_close(got[k].double(), want[k], rtol=1e-5, atol=1e-5)
    assert all((v >= 0).all() for v in got.values())
    if batch_size == 1:  # a sample's own gradients do not cancel: the mean of |g| is at least |mean g|
        whole = sensitivity(apply, params, x, 5)
        assert all((got[k] >= whole[k] - 1e-6).all() for k in params) and any((got[k] > whole[k] + 1e-3).any() for k in params)


def test_client_uploads_model_and_sensitivity_from_its_data():
    alg = make("elastic", SETUP)
    params = rand_params(1)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(4))
    data = ClientData(x, torch.zeros(5, dtype=torch.int64))
    with torch.no_grad():
        ctx = alg.client_end({"params": rand_params(0)}, params, {}, data, apply)
    upload, _ = alg.client_result({"params": rand_params(0)}, params, ctx)
    assert upload["params"] is params
    want = _by_hand(params, x, SETUP.batch_size)  # train.batch_size rows per batch
    for k in params:
        torch.testing.assert_close(upload["sensitivity"][k].double(), want[k], rtol=1e-5, atol=1e-5)


def _uploads(ws, omegas):
    return stack([{"params": {"w": torch.tensor(w, dtype=torch.float64)}, "sensitivity": {"w": torch.tensor(o, dtype=torch.float64)}}
                  for w, o in zip(ws, omegas)])


def test_server_step_by_hand():
    # w_t = [0, 0]; w_1 = [1, 2], w_2 = [3, 0]: avg = [2, 1], FedAvg's change [2, 1].
    # Omega_1 = [1, 4], Omega_2 = [1, 2]: Omega = [1, 3], max 3; tau = 0.5:
    # zeta = [1.5 - 1/3, 1.5 - 1] = [7/6, 1/2]; w_{t+1} = zeta * [2, 1] = [7/3, 1/2]
    alg = make("elastic", SETUP, tau=0.5)
    state = alg.init_server({"w": torch.zeros(2, dtype=torch.float64)})
    out = alg.aggregate(state, _uploads([[1.0, 2.0], [3.0, 0.0]], [[1.0, 4.0], [1.0, 2.0]]), P, INFO)
    torch.testing.assert_close(out["params"]["w"], torch.tensor([7 / 3, 0.5], dtype=torch.float64), rtol=1e-15, atol=1e-15)


def test_max_is_over_every_parameter_of_the_model_and_statistics_are_averaged():
    # two tensors: Omega(a) = [1], Omega(b) = [4]; max 4, tau = 0: zeta(a) = 0.75, zeta(b) = 0
    alg = make("elastic", SETUP, tau=0.0)
    w0 = {"a": torch.zeros(1, dtype=torch.float64), "b": torch.zeros(1, dtype=torch.float64),
          "bn.running_mean": torch.zeros(1, dtype=torch.float64)}
    ups = stack([{"params": {"a": torch.tensor([2.0], dtype=torch.float64), "b": torch.tensor([2.0], dtype=torch.float64),
                             "bn.running_mean": torch.tensor([c], dtype=torch.float64)},
                  "sensitivity": {"a": torch.tensor([1.0], dtype=torch.float64), "b": torch.tensor([4.0], dtype=torch.float64)}}
                 for c in (1.0, 3.0)])
    out = alg.aggregate(alg.init_server(w0), ups, P, INFO)["params"]
    assert (out["a"].item(), out["b"].item(), out["bn.running_mean"].item()) == (1.5, 0.0, 2.0)


@pytest.mark.agreement
def test_equal_sensitivities_with_tau_one_are_fedavgs_step_bit_for_bit():
    """zeta = 1 + tau - Omega / max(Omega) = 1 exactly where Omega / max = tau: with tau = 1 and
    equal sensitivities everywhere, the model is FedAvg's weighted average itself."""
    w_t = {"w": torch.tensor([0.2, -0.1, 0.7], dtype=torch.float64)}
    ws = [[0.3, -0.7, 0.1], [0.25, -0.5, 1.9]]
    ups = _uploads(ws, [[0.4] * 3, [0.4] * 3])
    avg = make("fedavg", SETUP).aggregate({"params": w_t}, ups, P, INFO)["params"]["w"]
    out = make("elastic", SETUP, tau=1.0).aggregate({"params": w_t}, ups, P, INFO)["params"]["w"]
    agree(out, avg, BITS)
    other = make("elastic", SETUP, tau=0.5).aggregate({"params": w_t}, ups, P, INFO)["params"]["w"]
    agree(other, w_t["w"] + 0.5 * (avg - w_t["w"]))  # zeta = tau everywhere
    none = make("elastic", SETUP, tau=0.5).aggregate({"params": w_t}, _uploads(ws, [[0.0] * 3] * 2), P, INFO)["params"]["w"]
    agree(none, w_t["w"] + 1.5 * (avg - w_t["w"]))  # no sensitivity: zeta = 1 + tau


def test_defaults_and_tuning_space():
    hp = make("elastic", SETUP).hparams
    assert (hp.tau, hp.aggregation) == (0.5, "samples")
    assert set(ALGORITHMS.get("elastic").space) == {"tau"}
    alg = make("elastic", SETUP)
    assert alg.local_loss is ce_loss and alg.optimizer is None and alg.grad_correction is None
    assert alg.sums == {"params": "weights", "sensitivity": "weights"}  # streamed: two weighted sums
    with pytest.raises(fedrift.FedriftError, match="tau"):
        make("elastic", SETUP, tau=-0.1)


def test_a_run_moves_each_parameter_by_zeta_in_tau_to_one_plus_tau_times_fedavgs_step(tiny, tmp_path):
    """Round 1: the clients train as FedAvg's, so FedAvg's model change is the same avg - w_0;
    Elastic's change is zeta times it, per parameter, zeta in [tau, 1 + tau] and not constant.
    The upload is twice FedAvg's (Omega is model-sized), the broadcast the same."""
    train = {"rounds": 1}
    cfg = tiny(algorithm={"name": "fedavg"}, train=train, output={"dir": str(tmp_path / "a")})
    model, _ = build_run(prepare(cfg))
    w0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    a = fedrift.run(cfg)
    b = fedrift.run(tiny(algorithm={"name": "elastic", "tau": 0.25}, train=train, output={"dir": str(tmp_path / "b")}))
    zetas = []
    for k in w0:
        fed, ela = a.global_state[k] - w0[k], b.global_state[k] - w0[k]
        moved = fed.abs() > 1e-4
        zetas.append((ela[moved] / fed[moved]).flatten())
    zeta = torch.cat(zetas)
    assert zeta.min() >= 0.25 - 1e-3 and zeta.max() <= 1.25 + 1e-3 and zeta.max() - zeta.min() > 0.1
    assert [r["bytes_up"] for r in b.history] == [2 * r["bytes_up"] for r in a.history]
    assert [r["bytes_down"] for r in b.history] == [r["bytes_down"] for r in a.history]


@pytest.mark.parametrize("level, says", [("client", "sensitivity"), ("sample", "after them")])
def test_privacy_refuses_the_sensitivity_upload(tiny, level, says):
    cfg = tiny(algorithm={"name": "elastic"}, privacy={"level": level})
    with pytest.raises(ConfigError, match=says):
        fedrift.run(cfg)
    assert not Path(cfg["output"]["dir"]).exists()


@pytest.mark.agreement
def test_streamed_sensitivities_equal_the_stacked_aggregate_bit_for_bit(tiny):
    cfg = tiny(algorithm={"name": "elastic"}, train={"rounds": 3, "clients_per_round": 4})
    streamed = fedrift.run(cfg)
    stacked = fedrift.run({**cfg, "engine": {"accept_failures": True}, "output": {**cfg["output"], "dir": cfg["output"]["dir"] + "-stacked"}})
    agree(streamed.global_state, stacked.global_state, BITS)
    assert streamed.summary["bytes_up_total"] == stacked.summary["bytes_up_total"]
