"""CCVR: the clients' statistics and the server's merge by hand (eq. 3-4), full and diagonal,
the virtual features' moments, the retraining as SGD on the classifier only, determinism,
runs whose training is FedAvg's bit for bit, and when it calibrates (``calibrate_at``: the
last round, every evaluated round, the rounds listed), with no statistics gathered between."""

import json

import numpy as np
import pytest
import torch
from agreement import BITS, agree, untimed
from conftest import one_line_refusal

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import Setup
from fedrift.algorithms.ccvr import (AUTO_DIAGONAL_ABOVE, CCVR_RNG, CCVRParams, class_stats, global_stats, merge,
                                     retrain_head, virtual_features, virtual_set)
from fedrift.engine.local import make_apply
from fedrift.functional.rng import generator
from fedrift.metrics.evaluate import evaluate
from fedrift.models import MODELS, build_model
from fedrift.experiments.tune import score_of

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0,
              clip_grad_norm=None, seed=0)


def fold(*clients, num_classes=3, diagonal=False):
    acc = None
    for h, y in clients:
        acc = merge(acc, class_stats(h, y, diagonal), num_classes)
    return acc


def test_client_statistics_by_hand():
    h = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 0.0]])
    s = class_stats(h, torch.tensor([2, 2, 0]))
    assert torch.equal(s["classes"], torch.tensor([0, 2])) and torch.equal(s["count"], torch.tensor([1, 2]))
    assert torch.equal(s["mean"], torch.tensor([[5.0, 0.0], [2.0, 3.0]]))
    # class 2: deviations +-(1, 1), unbiased: (2 * [[1, 1], [1, 1]]) / (2 - 1); one sample: zero
    assert torch.equal(s["cov"], torch.tensor([[[0.0, 0.0], [0.0, 0.0]], [[2.0, 2.0], [2.0, 2.0]]]))
    assert s["mean"].dtype == h.dtype  # sent in the features' dtype


def test_merge_by_hand_in_one_dimension():
    # client A holds class 0 at 1 and 3 (N 2, mean 2, var 2); client B at 5 (N 1, mean 5, var 0).
    # eq. 4: 1/2 * 2 + 0 + 2/2 * 4 + 1/2 * 25 - 3/2 * 9 = 4 = the variance of (1, 3, 5)
    acc = fold((torch.tensor([[1.0], [3.0]]), torch.tensor([0, 0])), (torch.tensor([[5.0]]), torch.tensor([0])),
               num_classes=2)
    n, mu, sigma = global_stats(acc)
    assert n.tolist() == [3.0, 0.0]
    assert mu[0].item() == 3.0 and sigma[0, 0, 0].item() == pytest.approx(4.0, abs=1e-12)
    assert torch.equal(mu[1], torch.zeros(1)) and torch.equal(sigma[1], torch.zeros(1, 1))  # nobody holds class 1


@pytest.mark.agreement
def test_merge_is_the_papers_equation_and_the_pooled_covariance():
    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(n, 4, generator=g, dtype=torch.float64) * 3 + 1, torch.randint(0, 3, (n,), generator=g))
               for n in (7, 12, 5)]
    n, mu, sigma = global_stats(fold(*clients))
    for c in range(3):
        # eq. 4 as the paper writes it, from each client's (N, mu, Sigma)
        parts = [class_stats(h[y == c], y[y == c]) for h, y in clients if (y == c).any()]
        nk = [float(p["count"][0]) for p in parts]
        mk = [p["mean"][0] for p in parts]
        sk = [p["cov"][0] for p in parts]
        nc = sum(nk)
        mc = sum(a / nc * m for a, m in zip(nk, mk))
        eq4 = (sum((a - 1) / (nc - 1) * s for a, s in zip(nk, sk)) + sum(a / (nc - 1) * torch.outer(m, m) for a, m in zip(nk, mk))
               - nc / (nc - 1) * torch.outer(mc, mc))
        pooled = torch.cat([h[y == c] for h, y in clients])
        assert n[c] == len(pooled) == nc
        agree(mu[c], mc, where=f"mean {c}")
        agree(sigma[c], eq4, where=f"covariance {c}")
        agree(sigma[c], torch.from_numpy(np.cov(pooled.numpy().T, ddof=1)), where=f"pooled covariance {c}")


def test_virtual_features_have_the_moments():
    mu = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    a = torch.tensor([[1.0, 0.0, 0.0], [0.5, 2.0, 0.0], [-1.0, 0.3, 0.7]], dtype=torch.float64)
    sigma = a @ a.T
    x = virtual_features(mu, sigma, 100_000, generator(0, CCVR_RNG, 1, 0, 0))
    torch.testing.assert_close(x.mean(0), mu, atol=0.03, rtol=0)
    torch.testing.assert_close(torch.cov(x.T), sigma, atol=0.06, rtol=0.02)
    # singular (rank 1, as one sample's class or dead ReLU units give): every draw on mu's line
    v = torch.tensor([1.0, 2.0, -2.0], dtype=torch.float64)
    x = virtual_features(mu, torch.outer(v, v), 1000, generator(0, CCVR_RNG, 1, 0, 1))
    off = (x - mu) - ((x - mu) @ v / (v @ v))[:, None] * v
    assert torch.isfinite(x).all() and off.abs().max() < 1e-9 and (x - mu).abs().max() > 1


def _model():
    model = build_model("mlp", MODELS.get("mlp").params(hidden=[4]), (5,), 3, seed=0)
    return model, make_apply(model, {}), {k: v.detach() for k, v in model.named_parameters()}


def _acc(apply, params, seed=1):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(30, 5, generator=g), torch.randint(0, 3, (30,), generator=g)
    h = apply(params, x, mode="features")
    return fold((h[:15], y[:15]), (h[15:], y[15:]))


def test_calibration_changes_only_the_classifier():
    model, apply, params = _model()
    alg = make("ccvr", SETUP, M=20, epochs=2)
    out = alg.calibration.calibrate(params, _acc(apply, params), 3, apply, {"fc.weight", "fc.bias"})
    assert out.keys() == params.keys()
    for k in params:
        if k.startswith("fc."):
            assert not torch.equal(out[k], params[k]), k
        else:
            assert out[k] is params[k], k  # the global model's own tensor


@pytest.mark.agreement
def test_retraining_is_sgd_with_momentum_on_the_virtual_features():
    """The same steps as torch.optim.SGD on an nn.Linear, in the seeded batch order."""
    model, apply, params = _model()
    hp = CCVRParams(M=10, epochs=3, lr=0.05, momentum=0.9, batch_size=8)
    x, y = virtual_set(_acc(apply, params), hp.M, 0, 2)
    out = retrain_head(apply, params, {"fc.weight", "fc.bias"}, x, y, hp, 0, 2)
    fc = torch.nn.Linear(4, 3)
    fc.load_state_dict({"weight": params["fc.weight"], "bias": params["fc.bias"]})
    opt = torch.optim.SGD(fc.parameters(), lr=0.05, momentum=0.9)
    for e in range(3):
        order = torch.from_numpy(generator(0, CCVR_RNG, 2, 1, e).permutation(len(y)))
        for i in range(0, len(y), 8):
            idx = order[i : i + 8]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(fc(x[idx].float()), y[idx]).backward()
            opt.step()
    agree({k: out[k] for k in ("fc.weight", "fc.bias")}, {"fc.weight": fc.weight.detach(), "fc.bias": fc.bias.detach()})


def test_deterministic_under_a_seed_and_keyed_by_round():
    _, apply, params = _model()
    head = {"fc.weight", "fc.bias"}
    cal = make("ccvr", SETUP, M=20, epochs=2).calibration
    acc = _acc(apply, params)
    a, b = cal.calibrate(params, acc, 3, apply, head), cal.calibrate(params, acc, 3, apply, head)
    other = cal.calibrate(params, acc, 4, apply, head)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["fc.weight"], other["fc.weight"])
    other_seed = make("ccvr", Setup(**{**SETUP.__dict__, "seed": 1}), M=20, epochs=2).calibration
    assert not torch.equal(a["fc.weight"], other_seed.calibrate(params, acc, 3, apply, head)["fc.weight"])


def test_no_virtual_features_is_the_global_model():
    _, apply, params = _model()
    out = make("ccvr", SETUP, M=0).calibration.calibrate(params, _acc(apply, params), 1, apply, {"fc.weight", "fc.bias"})
    assert out is params


def _runs(tiny, tmp_path, **ccvr):
    def run(alg, d, **sections):
        return fedrift.run(tiny(algorithm=alg, output={"dir": str(tmp_path / d)}, train={"rounds": 3}, **sections))

    every = {"name": "ccvr", "M": 40, "epochs": 2, "calibrate_at": "every", **ccvr}
    return run({"name": "fedavg"}, "fedavg"), run(every, "ccvr"), run


@pytest.mark.agreement
def test_training_is_fedavg_bit_for_bit_and_every_row_has_both_accuracies(tiny, tmp_path):
    """``calibrate_at: every`` (the behaviour before ``final`` became the default): every
    evaluated row carries the calibrated model's metrics beside the global model's."""
    fedavg, ccvr, _ = _runs(tiny, tmp_path)
    # the global model, its traffic and its metrics: FedAvg's
    agree(untimed(fedavg.history), [_uncalibrated(r) for r in untimed(ccvr.history)], BITS)
    for b in ccvr.history:
        assert {"calibrated_accuracy", "calibrated_loss", "calibrated_local_accuracy"} <= b.keys()
        assert 0 <= b["calibrated_accuracy"] <= 1
    agree(fedavg.global_state, ccvr.server_state["params"], BITS)  # the trained model: FedAvg's
    # the final model is the calibrated one: FedAvg's body, its own classifier
    body = lambda state: {k: v for k, v in state.items() if not k.startswith("fc.")}  # noqa: E731
    agree(body(fedavg.global_state), body(ccvr.global_state), BITS)
    assert all(not torch.equal(v, ccvr.global_state[k]) for k, v in fedavg.global_state.items() if k.startswith("fc."))
    last = ccvr.history[-1]
    assert ccvr.summary["calibrated_accuracy"] == last["calibrated_accuracy"]
    assert ccvr.summary["calibrated_local_accuracy"] == last["calibrated_local_accuracy"]
    agree(ccvr.summary["final_accuracy"], fedavg.summary["final_accuracy"], BITS)
    assert any(r["calibrated_accuracy"] != r["test_accuracy"] for r in ccvr.history)
    # the final model file scores the calibrated accuracy
    data = fedrift.api.prepare(tiny()).dataset
    model = build_model("mlp", MODELS.get("mlp").params(hidden=[32]), data.input_shape, 10, seed=0)
    model.load_state_dict(ccvr.global_state)
    apply = make_apply(model, {}, prepare=data.prepare)
    score = evaluate(apply, ccvr.global_state, data.x_test, data.y_test, 1024)["test_accuracy"]
    agree(score, last["calibrated_accuracy"], BITS)


def _uncalibrated(row):
    """A history row without the calibration's metrics and bytes."""
    return {k: v for k, v in row.items() if not k.startswith("calibrat")}


def test_bytes_of_the_statistics(tiny, tmp_path):
    """Each client sends, per class it holds, its class id and count (int64), a mean (32 floats)
    and a covariance (32 x 32) of its features; the global model goes to every client."""
    _, ccvr, _ = _runs(tiny, tmp_path)
    prep = fedrift.api.prepare(tiny())
    held = (prep.partition.counts(prep.dataset.y_train.numpy(), 10) > 0).sum()
    d = 32
    model_bytes = sum(v.numel() * 4 for v in ccvr.global_state.values())
    for row in ccvr.history:
        assert row["calibration_bytes_up"] == held * (8 + 8 + 4 * d + 4 * d * d)
        assert row["calibration_bytes_down"] == 6 * model_bytes


def _counting_stats(monkeypatch):
    """Count the clients' statistics computed (one call per panel client per calibration)."""
    import fedrift.algorithms.ccvr as ccvr_mod

    calls = []
    real = ccvr_mod.class_stats
    monkeypatch.setattr(ccvr_mod, "class_stats", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.agreement
def test_final_is_the_default_and_calibrates_at_the_last_round_only(tiny, tmp_path, monkeypatch):
    """The default calibrates once, after the last round: earlier rows have no calibrated
    metric and no statistics were gathered for them; the last row and the final model are
    ``every``'s at that round (the draws are keyed by the round, not by what came before)."""
    _, every, run = _runs(tiny, tmp_path)
    calls = _counting_stats(monkeypatch)
    final = run({"name": "ccvr", "M": 40, "epochs": 2}, "final")
    assert len(calls) == 6  # one calibration: each of the 6 panel clients once
    assert [("calibrated_accuracy" in r) for r in final.history] == [False, False, True]
    for r in final.history[:-1]:
        assert not any(k.startswith("calibrat") for k in r), r.keys()  # no bytes, no metrics
    agree(untimed(final.history[:-1]), [_uncalibrated(r) for r in untimed(every.history[:-1])], BITS)
    agree(untimed(final.history[-1:]), untimed(every.history[-1:]), BITS)
    agree(final.global_state, every.global_state, BITS)
    agree(final.summary["calibrated_accuracy"], every.summary["calibrated_accuracy"], BITS)
    # the option's old name still reads: when: final is final, when: eval is every
    old = run({"name": "ccvr", "M": 40, "epochs": 2, "when": "eval"}, "old-eval")
    agree([r["calibrated_accuracy"] for r in old.history], [r["calibrated_accuracy"] for r in every.history], BITS)
    assert CCVRParams(when="final").rounds() == () and CCVRParams(when="eval").rounds() is None


@pytest.mark.agreement
def test_a_list_of_rounds_calibrates_there_and_at_the_last(tiny, tmp_path, monkeypatch):
    """``[1]`` with ``eval.every: 2`` over 3 rounds: round 1 is evaluated for its calibration,
    round 2 is evaluated without one, round 3 (the last) calibrates; the calibrated scores are
    ``every``'s at those rounds. A round past the run's last is never reached."""
    _, every, run = _runs(tiny, tmp_path)
    calls = _counting_stats(monkeypatch)
    out = run({"name": "ccvr", "M": 40, "epochs": 2, "calibrate_at": [1, 9]}, "listed", eval={"every": 2})
    assert [r["round"] for r in out.history] == [1, 2, 3]
    assert [("calibrated_accuracy" in r) for r in out.history] == [True, False, True]
    assert len(calls) == 2 * 6
    assert "calibration_bytes_up" not in out.history[1]
    for r in (out.history[0], out.history[2]):
        agree(r["calibrated_accuracy"], every.history[r["round"] - 1]["calibrated_accuracy"], BITS, where=f"round {r['round']}")
        assert r["calibration_bytes_up"] == every.history[r["round"] - 1]["calibration_bytes_up"] > 0


def test_calibrate_at_refuses_what_is_not_a_schedule(tiny):
    assert CCVRParams(calibrate_at="3,1,3").rounds() == (1, 3)  # as the command line gives it
    assert CCVRParams(calibrate_at="every").rounds() is None and CCVRParams().rounds() == ()
    for bad in ("x", [0], [], [1.5], "never"):
        with pytest.raises(fedrift.ConfigError, match="algorithm.calibrate_at: .* allowed: final, every, or a list"):
            fedrift.run(tiny(algorithm={"name": "ccvr", "calibrate_at": bad}))
    with pytest.raises(fedrift.ConfigError, match="disagree"):
        fedrift.run(tiny(algorithm={"name": "ccvr", "calibrate_at": "every", "when": "final"}))


@pytest.mark.agreement
def test_diagonal_statistics_are_the_full_covariances_diagonal():
    """A client's variances are its covariance's diagonal, the server's pooled variances the
    pooled covariance's (eq. 4's diagonal), and a diagonal draw is the full draw from
    ``diag(var)`` with the same ``z``."""
    g = torch.Generator().manual_seed(1)
    clients = [(torch.randn(n, 5, generator=g, dtype=torch.float64) * 2 - 1, torch.randint(0, 3, (n,), generator=g))
               for n in (9, 4, 13)]
    for h, y in clients:
        full, diag = class_stats(h, y), class_stats(h, y, diagonal=True)
        assert "cov" not in diag and diag["var"].shape == (len(full["classes"]), 5)
        agree(diag["var"], torch.diagonal(full["cov"], dim1=1, dim2=2))
        agree({k: full[k] for k in ("classes", "count", "mean")}, {k: diag[k] for k in ("classes", "count", "mean")}, BITS)
    n, mu, sigma = global_stats(fold(*clients))
    nd, mud, var = global_stats(fold(*clients, diagonal=True))
    agree(n, nd, BITS)
    assert var.shape == (3, 5)
    agree(mud, mu)
    agree(var, torch.diagonal(sigma, dim1=1, dim2=2))
    x = virtual_features(mu[0], var[0], 50, generator(0, CCVR_RNG, 1, 0, 0))
    x_full = virtual_features(mu[0], torch.diag(var[0]), 50, generator(0, CCVR_RNG, 1, 0, 0))
    agree(x, x_full)
    # a rounding negative is a zero variance, not a NaN
    assert torch.equal(virtual_features(mu[0][:2], torch.tensor([-1e-18, 0.0], dtype=torch.float64), 3,
                                        generator(0, CCVR_RNG, 1, 0, 0)), mu[0][:2].expand(3, 2))


def test_auto_is_diagonal_above_the_threshold():
    auto = CCVRParams(covariance="auto")
    assert not auto.diagonal(AUTO_DIAGONAL_ABOVE) and auto.diagonal(AUTO_DIAGONAL_ABOVE + 1)
    assert CCVRParams(covariance="diagonal").diagonal(2) and not CCVRParams().diagonal(10_000)  # full: the default


@pytest.mark.agreement
def test_bytes_of_diagonal_statistics(tiny, tmp_path):
    """With ``covariance: diagonal`` each client sends, per class it holds, its class id and
    count (int64), a mean and the variances (32 floats each): no 32 x 32 matrix. Training is
    unchanged; the calibrated model is another."""
    fedavg, full, run = _runs(tiny, tmp_path)
    diag = run({"name": "ccvr", "M": 40, "epochs": 2, "covariance": "diagonal"}, "diagonal")
    prep = fedrift.api.prepare(tiny())
    held = (prep.partition.counts(prep.dataset.y_train.numpy(), 10) > 0).sum()
    assert diag.history[-1]["calibration_bytes_up"] == held * (8 + 8 + 4 * 32 + 4 * 32)
    agree(diag.history[-1]["test_accuracy"], full.history[-1]["test_accuracy"], BITS)
    agree(diag.server_state["params"], fedavg.global_state, BITS)
    assert not torch.equal(diag.global_state["fc.weight"], full.global_state["fc.weight"])


@pytest.mark.agreement
def test_validation_and_personalisation_side_by_side(tiny, tmp_path):
    """With a validation split the calibrated model is scored there too (what tunes CCVR); with
    eval.personalize, FedADC's per-client calibration is reported beside CCVR's on the same splits."""
    _, _, run = _runs(tiny, tmp_path)
    out = run({"name": "ccvr", "M": 40, "epochs": 2}, "both", partition={"val_share": 0.2},
              eval={"personalize": True, "personalize_epochs": 1})
    row = out.history[-1]
    assert {"calibrated_val_accuracy", "calibrated_val_loss", "val_accuracy"} <= row.keys()
    assert score_of(row) == ("calibrated_val_accuracy", row["calibrated_val_accuracy"])
    s = out.summary
    assert {"personalized_accuracy", "global_local_accuracy", "calibrated_local_accuracy", "final_local_accuracy"} <= s.keys()
    agree(s["global_local_accuracy"], s["final_local_accuracy"])  # the same splits


def test_refused_with_privacy_and_in_a_flower_deployment(tiny, capsys):
    with pytest.raises(fedrift.FedriftError, match="ccvr uploads per-class means and covariances"):
        fedrift.run(tiny(algorithm={"name": "ccvr"}, privacy={"level": "client", "clip": 1.0, "noise_multiplier": 1.0}))
    one_line_refusal(capsys, ["flower", "app", "/nonexistent/app", "data.name=digits", "algorithm.name=ccvr"],
                     "algorithm.name: ccvr calibrates on every client's feature statistics")


def test_run_prints_the_calibrated_accuracy(tmp_path, capsys):
    from fedrift.cli import main

    args = ["run", "data.name=digits", "model.name=mlp", "partition.num_clients=4", "train.rounds=1",
            "train.clients_per_round=2", "algorithm.name=ccvr", "algorithm.M=20", "algorithm.epochs=1",
            f"output.dir={tmp_path / 'r'}", "output.progress=false"]
    assert main(args) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("calibrated model (final_model.pt): test accuracy "))
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert line.endswith(f"{summary['calibrated_accuracy']:.4f}")


def test_statistics_of_a_diverged_model_end_the_run_as_diverged(tiny, monkeypatch):
    """Non-finite class statistics (a model whose features blew up) cannot be sampled from
    (eigh fails on them): the run stops as diverged, with a message and its metrics, instead
    of a linear-algebra traceback."""
    import fedrift.algorithms.ccvr as ccvr_mod

    acc = {"n": torch.tensor([3.0, 2.0]), "s1": torch.tensor([[1.0, 2.0], [float("inf"), 0.0]]),
           "s2": torch.zeros(2, 2, 2)}
    with pytest.raises(FloatingPointError, match="not finite"):
        ccvr_mod.virtual_set(acc, 4, 0, 1)
    real = ccvr_mod.global_stats
    monkeypatch.setattr(ccvr_mod, "global_stats", lambda a: (lambda n, mu, s: (n, mu * float("nan"), s))(*real(a)))
    with pytest.raises(fedrift.DivergenceError, match="round 1: the clients' class feature statistics are not finite"):
        fedrift.run(tiny(algorithm={"name": "ccvr", "calibrate_at": "every"}, train={"rounds": 2}))
