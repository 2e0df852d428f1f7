"""Validation metrics per round (partition.val_share) and the summary's at-best-validation keys."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fedrift
from conftest import ctrl_c_in_round
from fedrift.cli import main
from fedrift.data.partition_base import Partition
from fedrift.engine.server import best_validation
from fedrift.api import prepare
from fedrift.models import build_model

VAL_KEYS = {"best_val_accuracy", "best_val_round", "test_accuracy_at_best_val"}


def test_val_metrics_are_the_global_models_on_the_clients_validation_union(tiny):
    result = fedrift.run(tiny(partition={"val_share": 0.2}, train={"rounds": 3}, eval={"every": 2}))
    rows = result.history
    assert [r["round"] for r in rows] == [2, 3]
    assert all({"val_accuracy", "val_loss"} <= r.keys() for r in rows)
    part = Partition.load(result.output_dir / "partition.json")
    val = part.val_union()
    assert len(val) > 0 and not set(val.tolist()) & {i for ix in part.train for i in ix.tolist()}
    # recomputed here, from the saved final model, on the training tensors' validation rows
    prep = prepare(result.config)  # the run's data, and its partition drawn again: the same split
    assert all(np.array_equal(a, b) for a, b in zip(prep.partition.val, part.val))
    data = prep.dataset
    model = build_model("mlp", prep.options["model"], data.input_shape, data.num_classes, 0)
    model.load_state_dict(torch.load(result.output_dir / "final_model.pt"))
    with torch.no_grad():
        logits = model(data.x_train[torch.as_tensor(val)].float())
    right = (logits.argmax(1) == data.y_train[torch.as_tensor(val)]).double().mean().item()
    assert abs(rows[-1]["val_accuracy"] - right) <= 1 / len(val) + 1e-12  # another batching: one argmax may flip
    summary = json.loads((result.output_dir / "summary.json").read_text())
    pick = max(rows, key=lambda r: r["val_accuracy"])
    assert summary["best_val_accuracy"] == pick["val_accuracy"] and summary["best_val_round"] == pick["round"]
    assert summary["test_accuracy_at_best_val"] == pick["test_accuracy"]


def test_no_validation_split_adds_nothing(tiny):
    result = fedrift.run(tiny(train={"rounds": 2}))
    assert not any(k.startswith("val_") for r in result.history for k in r)
    assert not VAL_KEYS & result.summary.keys()
    assert '"val"' not in (result.output_dir / "partition.json").read_text()


def test_personal_models_are_validated_too(tiny):
    result = fedrift.run(tiny(algorithm={"name": "fedproto"}, partition={"val_share": 0.25}, train={"rounds": 1}))
    row = result.history[-1]
    assert 0.0 <= row["val_accuracy"] <= 1.0 and row["val_loss"] > 0 and "local_accuracy" in row
    assert 0.0 <= row["val_local_accuracy"] <= 1.0
    assert result.summary["best_val_round"] == 1
    # each client's own validation samples, as positions in the union the server holds
    from fedrift.engine.federation import Federation

    prep = prepare(result.config)
    fed = Federation(prep.dataset, prep.partition, torch.device("cpu"))
    for k in range(fed.num_clients):
        own = torch.as_tensor(prep.partition.val[k])
        assert torch.equal(fed.x_val[fed.val_positions(k)], prep.dataset.x_train[own])


def test_personal_accuracies_by_hand():
    """Two clients' models that always answer 0 and 1, on y = 0 0 1 1: the mean of their
    accuracies on the whole set, and on their own parts (an empty part is left out)."""
    from fedrift.metrics.evaluate import evaluate_personal

    def apply(params, x):
        return torch.nn.functional.one_hot(params["c"].expand(len(x)), 2).float()

    models = [{"c": torch.tensor(0)}, {"c": torch.tensor(1)}, {"c": torch.tensor(1)}]
    x, y = torch.zeros(4, 1), torch.tensor([0, 0, 1, 1])
    local = [torch.tensor([0, 2]), torch.tensor([2, 3]), torch.tensor([], dtype=torch.int64)]
    val = evaluate_personal(apply, models, local, x, y, batch_size=3, prefix="val")
    assert val["val_accuracy"] == 0.5 and val["val_local_accuracy"] == (0.5 + 1.0) / 2
    test = evaluate_personal(apply, models, local, x, y, batch_size=3)
    assert test["local_accuracy"] == 0.75 and "test_local_accuracy" not in test


def test_a_global_models_local_accuracy_by_hand():
    """One model answering 0 on y = 0 0 1 1, and a predictor answering 1: each client's share
    on its own part (1 and 1/3; 0 and 2/3), averaged over the clients that have a part."""
    from fedrift.metrics.evaluate import LocalParts, evaluate

    def apply(params, x):
        return torch.nn.functional.one_hot(torch.zeros(len(x), dtype=torch.int64), 2).float()

    x, y = torch.zeros(4, 1), torch.tensor([0, 0, 1, 1])
    parts = LocalParts([torch.tensor([0]), torch.tensor([], dtype=torch.int64), torch.tensor([1, 2, 3])])
    ones = lambda params, xb: {"ones": torch.ones(len(xb), dtype=torch.int64)}  # noqa: E731
    test = evaluate(apply, {}, x, y, batch_size=3, predict=ones, local=parts)
    assert test["test_accuracy"] == 0.5 and test["local_accuracy"] == pytest.approx((1 + 1 / 3) / 2, abs=1e-15)
    assert test["test_accuracy_ones"] == 0.5 and test["local_accuracy_ones"] == pytest.approx((0 + 2 / 3) / 2, abs=1e-15)
    val = evaluate(apply, {}, x, y, batch_size=3, prefix="val", local=parts)
    assert val["val_local_accuracy"] == test["local_accuracy"] and "local_accuracy" not in val
    assert "local_accuracy" not in evaluate(apply, {}, x, y, batch_size=3, local=LocalParts([torch.tensor([], dtype=torch.int64)]))
    assert "local_accuracy" not in evaluate(apply, {}, x, y, batch_size=3)


def test_a_global_model_reports_its_accuracy_on_the_clients_own_test_splits(tiny):
    result = fedrift.run(tiny(partition={"val_share": 0.2}, train={"rounds": 2}))
    last = result.history[-1]
    assert "val_local_accuracy" not in last  # the tuner scores a global model's val_accuracy
    prep = prepare(result.config)
    data = prep.dataset
    model = build_model("mlp", prep.options["model"], data.input_shape, data.num_classes, 0)
    model.load_state_dict(torch.load(result.output_dir / "final_model.pt"))
    shares = []
    for ix in prep.partition.test:  # each client's own test split, recomputed from the saved model
        if len(ix):
            with torch.no_grad():
                pred = model(data.x_test[torch.as_tensor(ix)].float()).argmax(1)
            shares.append((pred == data.y_test[torch.as_tensor(ix)]).double().mean().item())
    assert len(shares) > 1 and abs(last["local_accuracy"] - float(np.mean(shares))) <= 1 / min(map(len, prep.partition.test)) + 1e-12
    assert result.summary["final_local_accuracy"] == last["local_accuracy"]


def test_best_validation_by_hand():
    history = [
        {"round": 1, "test_accuracy": 0.50},  # no validation this round: not a candidate
        {"round": 2, "test_accuracy": 0.60, "val_accuracy": 0.70},
        {"round": 4, "test_accuracy": 0.65, "val_accuracy": 0.75},
        {"round": 6, "test_accuracy": 0.80, "val_accuracy": 0.75},  # a tie: the first round stays
        {"round": 8, "test_accuracy": 0.90, "val_accuracy": 0.72},  # the best test round, not chosen
    ]
    assert best_validation(history) == {"best_val_accuracy": 0.75, "best_val_round": 4, "test_accuracy_at_best_val": 0.65}
    assert best_validation(history[:1]) == {} and best_validation([]) == {}
    assert np.isclose(best_validation(history[:2])["test_accuracy_at_best_val"], 0.60)


def test_fedrift_run_prints_the_test_accuracy_at_the_best_validation_round(tiny, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(tiny(partition={"val_share": 0.2}, train={"rounds": 2})))
    assert main(["run", "-c", str(path)]) == 0
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    line = (f"at the best validation accuracy {s['best_val_accuracy']:.4f} (round {s['best_val_round']}): "
            f"test accuracy {s['test_accuracy_at_best_val']:.4f}")
    assert line in capsys.readouterr().out


def test_a_resumed_run_selects_over_all_its_rounds(tiny, tmp_path):
    run_dir = tmp_path / "stopped"
    cfg = tiny(partition={"val_share": 0.2}, train={"rounds": 4}, engine={"checkpoint_every": 2},
               output={"dir": str(run_dir)})
    with pytest.MonkeyPatch.context() as mp:
        ctrl_c_in_round(mp, 4)
        with pytest.raises(KeyboardInterrupt):
            fedrift.run(cfg)
    resumed = fedrift.resume(run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4] and resumed.summary["resumed_from_round"] == 2
    assert {k: resumed.summary[k] for k in VAL_KEYS} == best_validation(rows)
