"""FedDF: proxy/validation data, teacher, distillation, early stopping, refusal, FedAvg identity."""

import dataclasses

import pytest
import torch
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.algorithms.feddf import FedDFParams, distill, ensemble_probs, proxy_batches, split_holdout, validation_score
from fedrift.algorithms.terms import kl_to_target
from fedrift.api import prepare
from fedrift.data.partition_base import Partition
from fedrift.engine.local import make_apply
from fedrift.functional.tree import stack
from fedrift.errors import ConfigError
from fedrift.models import MODELS, build_model

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=5, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(name, setup, **hp):
    return make(name, setup, **hp)


def _mlp(seed=0):
    model = build_model("mlp", MODELS.get("mlp").params(hidden=[8]), (4,), 3, seed=seed)
    return make_apply(model, {}), {k: v.detach() for k, v in model.named_parameters()}


def _data(n=60, seed=0):
    """A 3-class toy problem: the label is the argmax of the first three inputs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, x[:, :3].argmax(1)


# ----------------------------------------------------------------------------------------
# Data: where the proxy and the validation split come from


def test_split_is_seeded_disjoint_and_covers_the_holdout():
    proxy, val = split_holdout(50, 0.2, seed=0)
    assert len(val) == 10 and len(proxy) == 40
    assert sorted(torch.cat([proxy, val]).tolist()) == list(range(50))
    p2, v2 = split_holdout(50, 0.2, seed=0)
    assert torch.equal(proxy, p2) and torch.equal(val, v2)
    assert not torch.equal(val, split_holdout(50, 0.2, seed=1)[1])
    assert len(split_holdout(50, 0.0, seed=0)[1]) == 0 and len(split_holdout(3, 0.01, seed=0)[1]) == 1


def test_proxy_batches_are_seeded_epochs():
    it = proxy_batches(10, 4, seed=0, round_=2)
    first = [next(it) for _ in range(6)]
    assert [len(b) for b in first] == [4, 4, 2, 4, 4, 2]
    assert sorted(torch.cat(first[:3]).tolist()) == list(range(10))  # an epoch: every sample once
    again = proxy_batches(10, 4, seed=0, round_=2)
    assert all(torch.equal(a, next(again)) for a in first)
    assert not torch.equal(torch.cat(first[:3]), torch.cat([next(proxy_batches(10, 10, 0, 3))]))


def test_proxy_and_validation_come_from_the_holdout_and_no_client_holds_them(tiny, tmp_path):
    cfg = tiny(partition={"holdout": 0.1}, algorithm={"name": "feddf", "steps": 10},
               train={"rounds": 1}, output={"dir": str(tmp_path / "run")})
    res = fedrift.run(cfg)
    part = Partition.load(res.output_dir / "partition.json")
    held = set(part.holdout.tolist())
    assert held and not held & set(part.train.values.tolist())
    # the algorithm, as the engine builds it, reads only held-out rows (recorded through its apply)
    prep = prepare(cfg)
    model = build_model("mlp", MODELS.get("mlp").params(hidden=[32]), prep.dataset.input_shape, 10, seed=0)
    apply = make_apply(model, {})
    seen = []

    def recording(params, x, mode="logits"):
        seen.append(x.reshape(len(x), -1))
        return apply(params, x, mode)

    x_train = prep.dataset.x_train
    ix = torch.as_tensor(prep.partition.holdout)
    assert sorted(ix.tolist()) == sorted(held)
    setup = dataclasses.replace(SETUP, num_classes=10, feature_dim=32, apply=recording,
                                holdout_x=x_train[ix], holdout_y=prep.dataset.y_train[ix])
    alg = _alg("feddf", setup, steps=10, eval_every=5)
    clients = [{k: v.detach() + 0.01 * s for k, v in model.named_parameters()} for s in (1, 2)]
    params = {k: v.detach() for k, v in model.named_parameters()}
    alg.aggregate({"params": params}, stack([{"params": c} for c in clients]), torch.tensor([0.5, 0.5]),
                  RoundInfo(1, 6, (0, 1)))
    rows = {r.numpy().tobytes() for r in torch.cat(seen)}
    holdout_rows = {r.numpy().tobytes() for r in x_train[ix].reshape(len(ix), -1)}
    client_rows = {r.numpy().tobytes() for r in x_train[part.train.values].reshape(-1, 64)}
    assert rows and rows <= holdout_rows and not rows & client_rows


@pytest.mark.agreement
def test_proxy_labels_are_never_read():
    apply, params = _mlp()
    x, y = _data(50)
    proxy, _ = split_holdout(50, 0.2, seed=0)
    garbled = y.clone()
    garbled[proxy] = (y[proxy] + 1) % 3  # the proxy's labels changed, validation's kept
    clients = stack([{"params": _mlp(seed=s)[1]} for s in (1, 2)])
    out = []
    for labels in (y, garbled):
        setup = dataclasses.replace(SETUP, apply=apply, holdout_x=x, holdout_y=labels)
        alg = _alg("feddf", setup, steps=20, eval_every=5, batch_size=8)
        out.append(alg.aggregate({"params": params}, clients, torch.tensor([0.5, 0.5]), RoundInfo(1, 2, (0, 1))))
    agree(out[0]["params"], out[1]["params"], BITS)


def test_refused_without_holdout_before_anything_is_written(tiny, tmp_path):
    with pytest.raises(ConfigError, match="partition.holdout"):
        _alg("feddf", SETUP)
    with pytest.raises(ConfigError, match="partition.holdout"):
        fedrift.run(tiny(algorithm={"name": "feddf"}, output={"dir": str(tmp_path / "run")}))
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------------------
# Teacher, distillation, early stopping


@pytest.mark.agreement
def test_teacher_is_the_mean_of_the_client_softmaxes():
    apply, _ = _mlp()
    clients = [_mlp(seed=s)[1] for s in (1, 2, 3)]
    x, _ = _data(7)
    for T in (1.0, 2.5):
        by_hand = sum(torch.softmax(apply(c, x) / T, dim=-1) for c in clients) / 3
        agree(ensemble_probs(apply, clients, x, T), by_hand, where=f"T = {T}")
    # one client at T = 1: its own softmax
    agree(ensemble_probs(apply, clients[:1], x, 1.0), torch.softmax(apply(clients[0], x), -1))


def _kl(apply, params, teacher, x, T=1.0):
    return float(kl_to_target(teacher, apply(params, x), torch.full((len(x),), 1.0 / len(x)), T))


def test_distillation_moves_the_model_toward_the_teacher():
    apply, start = _mlp()
    x, _ = _data(40)
    teacher = ensemble_probs(apply, [_mlp(seed=s)[1] for s in (1, 2)], x, 2.0)
    hp = FedDFParams(steps=60, batch_size=16, T=2.0, lr=1e-2)
    out, log = distill(apply, start, teacher, x, None, None, proxy_batches(40, 16, 0, 1), hp)
    assert log["steps"] == 60 and log["best_step"] == 60 and log["scores"] == []  # no validation: the last
    before, after = _kl(apply, start, teacher, x, 2.0), _kl(apply, out, teacher, x, 2.0)
    assert after < 0.3 * before
    assert all(not v.requires_grad for v in out.values())


@pytest.mark.agreement
def test_early_stopping_keeps_the_best_validation_model():
    apply, start = _mlp()
    x, y = _data(80)
    val_x, val_y, proxy_x, proxy_y = x[:30], y[:30], x[30:], y[30:]
    hp = FedDFParams(steps=200, batch_size=16, lr=1e-2, eval_every=10, patience=3)
    # a good teacher (the true labels, as probabilities): validation improves, the best is kept
    good = torch.nn.functional.one_hot(proxy_y, 3).float()
    out, log = distill(apply, start, good, proxy_x, val_x, val_y, proxy_batches(50, 16, 0, 1), hp)
    steps, scores = [s for s, _ in log["scores"]], [sc for _, sc in log["scores"]]
    assert steps[0] == 0 and all(b - a == 10 for a, b in zip(steps, steps[1:]))
    best = max(scores)
    assert log["best_step"] == steps[scores.index(best)] > 0
    agree(validation_score(apply, out, val_x, val_y), best, BITS)
    # the kept model is the one the run held at best_step: replay exactly that many steps
    replay, _ = distill(apply, start, good, proxy_x, None, None, proxy_batches(50, 16, 0, 1),
                        dataclasses.replace(hp, steps=log["best_step"]))
    agree(out, replay, BITS)
    # stopped after `patience` evaluations without improvement, before the budget
    assert log["steps"] == log["best_step"] + 3 * 10 < 200 or log["steps"] == 200
    # from that good model, a wrong teacher (every label shifted): nothing beats the start,
    # which is kept as it is, after `patience` evaluations
    bad = torch.nn.functional.one_hot((proxy_y + 1) % 3, 3).float()
    good_model = out
    out, log = distill(apply, good_model, bad, proxy_x, val_x, val_y, proxy_batches(50, 16, 0, 1),
                       dataclasses.replace(hp, lr=0.1))
    assert log["best_step"] == 0 and log["steps"] == 3 * 10
    assert all(out[k] is good_model[k] for k in good_model)


# ----------------------------------------------------------------------------------------
# Through the engine


@pytest.mark.agreement
def test_no_steps_is_fedavg_exactly_on_the_same_clients(tiny, tmp_path):
    def go(algorithm, name):
        return fedrift.run(tiny(partition={"holdout": 0.1}, algorithm=algorithm, train={"rounds": 3},
                                output={"dir": str(tmp_path / name)}))

    base, zero = go({"name": "fedavg"}, "a"), go({"name": "feddf", "steps": 0}, "b")
    agree(base.global_state, zero.global_state, BITS)
    moved = go({"name": "feddf", "steps": 20, "eval_every": 5, "val_share": 0.0}, "c")
    assert any(not torch.equal(base.global_state[k], moved.global_state[k]) for k in base.global_state)
    for a, b in zip(base.history, moved.history):  # communication is FedAvg's
        assert a["bytes_down"] == b["bytes_down"] and a["bytes_up"] == b["bytes_up"]
