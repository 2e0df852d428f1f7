"""Personalisation by classifier calibration (engine/personalize.py): the algorithm's loss only,
never its update rule; the train section's SGD once; only the classifier moves."""

import json

import pytest
import torch
import torch.nn.functional as F

import fedrift
from fedrift.engine.executors import EXECUTORS
from fedrift.engine.executors.batched import BatchedExecutor
from fedrift.engine.executors.sequential import SequentialExecutor
from fedrift.registry import Entry
from agreement import BITS, agree
from algorithm_cases import NAMES, build, case

LR, MOMENTUM, EPOCHS = 0.05, 0.9, 2
CALLS: list = []  # (round, tools, payload, jobs, outputs) of each run_round


def _recording(base):
    class Recording(base):
        def run_round(self, tools, payload, jobs, round_, **kw):
            outs = super().run_round(tools, payload, jobs, round_, **kw)
            CALLS.append((round_, tools, payload, jobs, outs))
            return outs

    return Recording


@pytest.fixture
def recorded(monkeypatch):
    CALLS.clear()
    monkeypatch.setitem(EXECUTORS._entries, "rec_sequential",
                        Entry("rec_sequential", lambda cfg: _recording(SequentialExecutor)(), "test only", None))
    monkeypatch.setitem(EXECUTORS._entries, "rec_batched",
                        Entry("rec_batched", lambda cfg: _recording(BatchedExecutor)(), "test only", None))


def _run(tiny, tmp_path, algorithm, wd=0.0, loss="algorithm", mu=0.0, executor="rec_sequential", out="run", part="head",
         lr=None, **sections):
    cfg = tiny(algorithm=algorithm, engine={"executor": executor}, output={"dir": str(tmp_path / out)},
               train={"rounds": 2, "lr": LR, "momentum": MOMENTUM, "weight_decay": wd},
               eval={"personalize": True, "personalize_epochs": EPOCHS, "personalize_loss": loss, "personalize_mu": mu,
                     "personalize_part": part, "personalize_lr": lr},
               **sections)
    r = fedrift.run(cfg)
    round_, tools, payload, jobs, outs = CALLS[-1]
    assert round_ == 3 and len(outs) == 6  # every client, after the 2 training rounds
    return r, tools, jobs, outs


def _is_head(name):
    return name.split(".")[0] == "fc"


def _body_is_global_and_head_moved(r, outs):
    for o in outs:
        for k, v in o.end_params.items():
            if _is_head(k):
                assert not torch.equal(v, r.global_state[k]), k
            else:
                agree(v, r.global_state[k], BITS, where=k)


def _hand_run(apply, glob, schedule, x, y, loss, wd, moves=_is_head, lr=LR):
    """Plain SGD with momentum on the classifier alone (``moves``: those tensors), as
    torch.optim.SGD writes it: ``buf = momentum buf + (g + wd w)``, ``w <- w - lr buf``; the body
    held at the global model."""
    w = {k: v.clone() for k, v in glob.items() if moves(k)}
    buf = {k: torch.zeros_like(v) for k, v in w.items()}
    for idx in schedule:
        g = torch.func.grad(lambda head: loss({**glob, **head}, x[idx], y[idx]))(w)
        for k in w:
            buf[k] = MOMENTUM * buf[k] + (g[k] + wd * w[k])
            w[k] = w[k] - lr * buf[k]
    return w


def _check_hand_run(r, tools, jobs, outs, loss_for, wd, moves=_is_head, lr=LR):
    """Every client's classifier (``moves``: those tensors) equals the hand-run over its batches
    (the same order)."""
    glob = {k: r.global_state[k] for k in outs[0].end_params}
    hand = {}
    for job, o in zip(jobs, outs):
        hand[job.client_id] = _hand_run(tools.apply, glob, job.schedule, tools.x, tools.y, loss_for(job), wd, moves, lr)
        for k, v in hand[job.client_id].items():
            agree(o.end_params[k], v, where=f"client {job.client_id}, {k}")
    return hand


def _ce(apply):
    return lambda p, x, y: F.cross_entropy(apply(p, x), y)


@pytest.mark.agreement
@pytest.mark.parametrize("lr", [None, 0.02])
def test_personalize_part_all_fine_tunes_the_whole_model_by_the_same_sgd(tiny, tmp_path, recorded, lr):
    """FedBABU's fine-tuning (eval.personalize_part=all): every tensor moves, each client's model
    the hand-run SGD on the whole model over its batches, with weight decay once, at train.lr or
    at eval.personalize_lr; none diverged."""
    r, tools, jobs, outs = _run(tiny, tmp_path, {"name": "fedavg"}, wd=1e-3, loss="ce", part="all", lr=lr)
    for o in outs:
        assert not any(torch.equal(v, r.global_state[k]) for k, v in o.end_params.items())
    _check_hand_run(r, tools, jobs, outs, lambda job: _ce(tools.apply), wd=1e-3, moves=lambda k: True, lr=lr or LR)
    assert r.summary["personalized_clients_diverged"] == 0


@pytest.mark.agreement
@pytest.mark.parametrize("variant", ["heavy_ball", "nesterov"])
def test_fedadc_calibration_is_plain_sgd_on_ce_of_the_classifier(tiny, tmp_path, recorded, variant):
    # (a) no embedded server momentum, no Nesterov shift, no SGD momentum on top of either
    r, tools, jobs, outs = _run(tiny, tmp_path, {"name": "fedadc", "variant": variant})
    assert sum(float(m.abs().sum()) for m in r.server_state["momentum"].values()) > 0  # m_t != 0: it would show
    _body_is_global_and_head_moved(r, outs)
    _check_hand_run(r, tools, jobs, outs, lambda job: _ce(tools.apply), wd=0.0)


@pytest.mark.agreement
@pytest.mark.parametrize("variant", ["heavy_ball", "nesterov"])
def test_fedadc_calibration_decays_once(tiny, tmp_path, recorded, variant):
    # (b) train.weight_decay once: FedADC's own gradient correction (which decays too) is not used
    wd = 0.05
    r, tools, jobs, outs = _run(tiny, tmp_path, {"name": "fedadc", "variant": variant}, wd=wd)
    _body_is_global_and_head_moved(r, outs)
    _check_hand_run(r, tools, jobs, outs, lambda job: _ce(tools.apply), wd=wd)
    # the check tells once from twice: the hand-run decaying twice is far off
    glob = {k: r.global_state[k] for k in outs[0].end_params}
    twice = _hand_run(tools.apply, glob, jobs[0].schedule, tools.x, tools.y, _ce(tools.apply), 2 * wd)
    assert max(float((twice[k] - outs[0].end_params[k]).abs().max()) for k in twice) > 1e-3
    # FedADC's loss is CE: calibrating with it is calibrating with ce, bit for bit
    r_ce, *_ = _run(tiny, tmp_path, {"name": "fedadc", "variant": variant}, wd=wd, loss="ce", out="ce")
    a = json.loads((r.output_dir / "personalization.json").read_text())
    b = json.loads((r_ce.output_dir / "personalization.json").read_text())
    assert a == b
    agree([o.end_params for o in outs], [o.end_params for o in CALLS[-1][4]], BITS)


@pytest.mark.agreement
@pytest.mark.parametrize("t_squared", [False, True])
def test_fedadc_plus_calibration_is_its_self_confidence_loss(tiny, tmp_path, recorded, t_squared):
    # (c) (1 - lam) CE + lam [T^2] KL(p_hat || softmax(z / T)), the teacher the global model w_T,
    # gamma the client's class shares; at the unshifted point (nesterov variant), decayed once
    lam, T, wd = 0.5, 2.0, 0.01
    alg = {"name": "fedadc_plus", "variant": "nesterov", "lam": lam, "T": T, "T_squared": t_squared}
    r, tools, jobs, outs = _run(tiny, tmp_path, alg, wd=wd)
    _body_is_global_and_head_moved(r, outs)
    glob = {k: r.global_state[k] for k in outs[0].end_params}
    classes = int(tools.y.max()) + 1

    def loss_for(job):
        counts = torch.bincount(tools.y[job.indices], minlength=classes).float()
        rho = counts / counts.max()

        def loss(p, x, y):
            z = tools.apply(p, x)
            p_glob = torch.softmax(tools.apply(glob, x) / T, -1)
            true = F.one_hot(y, classes).float()
            off = (1 - rho) * p_glob * (1 - true)
            p_hat = off + true * (1 - off.sum(-1, keepdim=True))
            log_q = torch.log_softmax(z / T, -1)
            kl = (torch.xlogy(p_hat, p_hat) - p_hat * log_q).sum(-1).mean()
            return (1 - lam) * F.cross_entropy(z, y) + lam * (T * T if t_squared else 1.0) * kl

        return loss

    _check_hand_run(r, tools, jobs, outs, loss_for, wd=wd)


@pytest.mark.agreement
def test_fedprox_calibration_anchors_to_the_global_model(tiny, tmp_path, recorded):
    mu = 0.5
    r, tools, jobs, outs = _run(tiny, tmp_path, {"name": "fedprox", "mu": mu})
    glob = {k: r.global_state[k] for k in outs[0].end_params}

    def prox(p, x, y):
        return F.cross_entropy(tools.apply(p, x), y) + 0.5 * mu * sum((p[k] - glob[k]).pow(2).sum() for k in p)

    _body_is_global_and_head_moved(r, outs)
    _check_hand_run(r, tools, jobs, outs, lambda job: prox, wd=0.0)


@pytest.mark.agreement
def test_personalize_mu_adds_the_proximal_term_to_the_ce(tiny, tmp_path, recorded):
    mu = 0.5
    r, tools, jobs, outs = _run(tiny, tmp_path, {"name": "fedadc", "variant": "nesterov"}, loss="ce", mu=mu)
    glob = {k: r.global_state[k] for k in outs[0].end_params}

    def prox(p, x, y):
        return F.cross_entropy(tools.apply(p, x), y) + 0.5 * mu * sum((p[k] - glob[k]).pow(2).sum() for k in p)

    _check_hand_run(r, tools, jobs, outs, lambda job: prox, wd=0.0)


@pytest.mark.agreement
def test_batched_calibration_keeps_the_body_and_equals_sequential(tiny, tmp_path, recorded):
    alg = {"name": "fedadc_plus", "variant": "nesterov", "lam": 0.5}
    r_seq, _, _, seq = _run(tiny, tmp_path, alg, wd=0.01, out="seq")
    r, _, _, bat = _run(tiny, tmp_path, alg, wd=0.01, executor="rec_batched", out="bat")
    _body_is_global_and_head_moved(r, bat)
    for a, b in zip(seq, bat):
        for k in a.end_params:
            torch.testing.assert_close(b.end_params[k], a.end_params[k], rtol=1e-5, atol=1e-6)


@pytest.mark.agreement
@pytest.mark.parametrize("name", [n for n in NAMES if not build(n).personal and build(n).client_model is None])
def test_every_algorithm_calibrates_with_its_loss_and_moves_only_the_classifier(tiny, tmp_path, recorded, name):
    # its loss reads what it needs (payload, client state, client_start, teacher, noise, pre-phase)
    r, _, _, outs = _run(tiny, tmp_path, case(name)["algorithm"], wd=0.01,
                         **{k: v for k, v in case(name).items() if k != "algorithm"})
    _body_is_global_and_head_moved(r, outs)
    assert 0.0 <= r.summary["personalized_accuracy"] <= 1.0


@pytest.mark.agreement
@pytest.mark.parametrize("alg", [{"name": "scaffold"}, {"name": "fedadc", "variant": "double_momentum"}, {"name": "slowmo"}],
                         ids=["scaffold", "fedadc_double_momentum", "slowmo"])
def test_update_rules_of_ce_algorithms_are_left_out(tiny, tmp_path, recorded, alg):
    # their loss is CE: with SCAFFOLD's control variates, FedADC's local momentum, SlowMo's own
    # optimiser all left out, calibrating with the algorithm's loss is calibrating with ce, bit for bit
    _, _, _, outs = _run(tiny, tmp_path, alg, wd=0.01)
    _, _, _, outs_ce = _run(tiny, tmp_path, alg, wd=0.01, loss="ce", out="ce")
    agree([o.end_params for o in outs], [o.end_params for o in outs_ce], BITS)


def test_a_fine_tuning_that_diverges_is_counted(tiny, tmp_path, recorded):
    """A fine-tuning whose model goes non-finite (here at eval.personalize_lr 1e30) still scores
    what that model predicts, and the run says how many did: personalized_clients_diverged."""
    r, _, _, outs = _run(tiny, tmp_path, {"name": "fedavg"}, loss="ce", part="all", lr=1e30)
    bad = sum(not all(torch.isfinite(v).all() for v in o.end_params.values()) for o in outs)
    assert bad > 0 and r.summary["personalized_clients_diverged"] == bad
    doc = json.loads((r.output_dir / "personalization.json").read_text())
    assert sum(c["diverged"] for c in doc["clients"]) == bad


@pytest.mark.agreement
def test_personalised_models_are_scored_on_their_own_validation_samples(tiny, tmp_path, recorded):
    """personalized_val_accuracy: each client's fine-tuned model on its own validation samples
    (partition.val_share; one batch each, as the run takes them), right answers counted by hand
    and averaged over the clients that have some as the spread does: bit for bit; a run without
    a validation split has none."""
    from fedrift.api import prepare
    from fedrift.metrics.client_spread import ClientScores, client_spread

    r, tools, jobs, outs = _run(tiny, tmp_path, {"name": "fedavg"}, loss="ce", part="all", partition={"val_share": 0.2})
    prep = prepare(r.config)
    n, right = [], []
    for job, o in zip(jobs, outs):
        own = torch.as_tensor(prep.partition.val[job.client_id])
        x, y = prep.dataset.x_train[own], prep.dataset.y_train[own]
        n.append(len(own))
        right.append(int((tools.apply(o.end_params, x).argmax(1) == y).sum()) if len(own) else 0)
    assert sum(k > 0 for k in n) >= 5 and max(n) <= tools.eval_batch
    hand = client_spread(ClientScores(torch.tensor(n), torch.tensor(right)), "v", spread=False)["v"]
    agree(r.summary["personalized_val_accuracy"], hand, BITS)
    plain, *_ = _run(tiny, tmp_path, {"name": "fedavg"}, loss="ce", part="all", out="plain")
    assert "personalized_val_accuracy" not in plain.summary and "personalized_accuracy" in plain.summary
