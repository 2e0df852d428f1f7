import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fedrift
from agreement import BITS, agree
from fedrift.engine.executors import EXECUTORS
from fedrift.engine.executors.sequential import SequentialExecutor
from fedrift.engine.local import make_apply
from fedrift.metrics.drift import drift_metrics, probe_indices
from fedrift.models import build_model
from fedrift.registry import Entry


def test_drift_metrics_by_hand():
    model = build_model("logreg", None, (3,), 3, seed=0)
    apply = make_apply(model, {})
    g = {k: v.detach() for k, v in model.named_parameters()}
    shifted = {**g, "fc.bias": g["fc.bias"] + torch.tensor([1.0, 0.0, 0.0])}
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    y = torch.zeros(8, dtype=torch.long)
    probe = torch.arange(8)
    same = drift_metrics(apply, g, [g], x, y, probe, 4)
    assert same["drift_logit_kl"] == 0.0 and same["drift_feature_l2"] == 0.0
    out = drift_metrics(apply, g, [g, shifted], x, y, probe, 4)
    kl = F.kl_div(F.log_softmax(apply(shifted, x), -1), F.log_softmax(apply(g, x), -1), log_target=True, reduction="batchmean")
    assert out["drift_logit_kl"] == pytest.approx(kl.item() / 2, rel=1e-5)  # mean over the two local models
    assert out["drift_feature_l2"] == 0.0  # logreg's features are its input: a bias shift moves only logits
    acc = lambda p: (apply(p, x).argmax(1) == y).float().mean().item()
    assert out["local_test_accuracy"] == pytest.approx((acc(g) + acc(shifted)) / 2)


def test_probe_is_fixed_and_seeded():
    assert torch.equal(probe_indices(100, 10, 0), probe_indices(100, 10, 0))
    assert len(probe_indices(5, 10, 0)) == 5


def test_drift_rows_and_accuracy_at_rounds(tiny):
    r = fedrift.run(tiny(train={"rounds": 3}, eval={"drift": True, "at_rounds": [1, 3]}))
    for row in r.history:
        assert 0 <= row["local_test_accuracy"] <= 1 and row["drift_logit_kl"] > 0 and row["drift_feature_l2"] > 0
    assert r.summary["accuracy_at"] == {"1": r.history[0]["test_accuracy"], "3": r.history[2]["test_accuracy"]}


def test_no_local_training_means_no_drift(tiny):
    r = fedrift.run(tiny(train={"rounds": 3, "lr": 1e-12, "weight_decay": 0.0}, eval={"drift": True}))
    for prev, row in zip(r.history, r.history[1:]):
        assert row["drift_logit_kl"] < 1e-9 and row["drift_feature_l2"] < 1e-5
        assert row["local_test_accuracy"] == prev["test_accuracy"]  # local models are w_t


class Recording(SequentialExecutor):
    calls: list = []

    def run_round(self, tools, payload, jobs, round_, **kw):
        outs = super().run_round(tools, payload, jobs, round_, **kw)
        Recording.calls.append((round_, outs))
        return outs


@pytest.fixture
def recording(monkeypatch):
    Recording.calls = []
    monkeypatch.setitem(EXECUTORS._entries, "recording", Entry("recording", lambda cfg: Recording(), "test only", None))


@pytest.mark.agreement
def test_personalisation_changes_only_the_classifier_and_helps_locally(tiny, recording):
    cfg = tiny(partition={"name": "dirichlet", "alpha": 0.1, "num_clients": 6, "min_size": 5},
               train={"rounds": 3}, engine={"executor": "recording"},
               eval={"personalize": True, "personalize_epochs": 3})
    r = fedrift.run(cfg)
    last_round, outs = Recording.calls[-1]
    assert last_round == 4 and len(outs) == 6  # every client, after the 3 training rounds
    for o in outs:
        for k, v in o.end_params.items():
            if k.startswith("fc."):
                assert not torch.equal(v, r.global_state[k])
            else:
                agree(v, r.global_state[k], BITS, where=k)
    doc = json.loads((r.output_dir / "personalization.json").read_text())
    assert len(doc["clients"]) == 6 and all(c["local_test_size"] >= 10 for c in doc["clients"])
    assert r.summary["personalized_accuracy"] == pytest.approx(doc["personalized_accuracy"])
    # the calibrated models' spread over the clients, as the global model's local accuracy has it
    pers = sorted(c["personalized_accuracy"] for c in doc["clients"])
    assert r.summary["personalized_accuracy_worst"] == pytest.approx(pers[0])
    assert r.summary["personalized_accuracy_worst10"] == pytest.approx(pers[0])  # ceil(6 / 10) = 1 client
    assert r.summary["personalized_accuracy_best10"] == pytest.approx(pers[-1])
    assert r.summary["global_local_accuracy_std"] == pytest.approx(
        float(np.std([c["global_local_accuracy"] for c in doc["clients"]])))
    # under strong label skew a calibrated classifier fits the client's own label mix better
    assert r.summary["personalized_accuracy"] > r.summary["global_local_accuracy"]
