import json

import pytest
import torch
import yaml

import fedrift
from fedrift.errors import ConfigError, DivergenceError

VOLATILE = {"seconds", "wall_seconds"}


def _stable(rows):
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


def test_outputs_follow_the_contract(tiny):
    result = fedrift.run(tiny(train={"rounds": 3}, eval={"every": 2}))
    out = result.output_dir
    for name in ("config.yaml", "partition.json", "metrics.jsonl", "summary.json", "final_model.pt"):
        assert (out / name).is_file(), name
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [2, 3]  # every 2 rounds, and always the last
    assert rows == result.history
    for r in rows:
        assert 0.0 <= r["test_accuracy"] <= 1.0 and r["bytes_down"] > 0 and r["bytes_up"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_accuracy"] == rows[-1]["test_accuracy"]
    assert summary["best_accuracy"] == max(r["test_accuracy"] for r in rows)
    assert summary["wall_seconds"] > 0 and summary["status"] == "completed"
    state = torch.load(out / "final_model.pt")
    assert state.keys() == result.global_state.keys()
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["partition"]["alpha"] == 0.5 and resolved["partition"]["min_size"] == 5
    assert fedrift.load_config(resolved) is not None  # the written config is itself valid
    # The downlink of FedAvg is one model per sampled client.
    params_bytes = sum(v.numel() * 4 for v in result.global_state.values())
    assert rows[-1]["bytes_down"] == 3 * params_bytes == rows[-1]["bytes_up"]


def test_identical_reruns(tiny, tmp_path):
    a = fedrift.run(tiny(output={"dir": str(tmp_path / "a")}, train={"rounds": 3}))
    b = fedrift.run(tiny(output={"dir": str(tmp_path / "b")}, train={"rounds": 3}))
    assert _stable(a.history) == _stable(b.history)
    assert all(torch.equal(a.global_state[k], b.global_state[k]) for k in a.global_state)
    for name in ("partition.json", "partition.bin"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    c = fedrift.run(tiny(output={"dir": str(tmp_path / "c")}, train={"rounds": 3}, seed=1))
    assert _stable(a.history) != _stable(c.history)


def test_participation_fraction_sets_the_cohort(tiny):
    result = fedrift.run(tiny(train={"rounds": 1, "clients_per_round": None, "participation": 0.5}))
    assert result.history[0]["clients"] == 3  # 0.5 x 6 clients


def test_existing_run_is_never_overwritten(tiny):
    cfg = tiny(train={"rounds": 1})
    first = fedrift.run(cfg)
    before = (first.output_dir / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="already holds a run"):
        fedrift.run(cfg)
    assert (first.output_dir / "metrics.jsonl").read_text() == before
    cfg["output"]["overwrite"] = True
    fedrift.run(cfg)


@pytest.fixture
def nan_from_round_3(monkeypatch):
    """An algorithm whose loss turns NaN in round 3, through its broadcast hook."""
    from fedrift.algorithms import ALGORITHMS
    from fedrift.algorithms.base import Algorithm, AlgorithmParams
    from fedrift.algorithms.fedavg import ce_loss
    from fedrift.registry import Entry

    def broadcast(state, info):
        return {"params": state["params"], "scale": torch.tensor(float("nan") if info.round >= 3 else 1.0)}

    def local_loss(params, batch, payload, ctx, apply):
        loss, aux = ce_loss(params, batch, payload, ctx, apply)
        return loss * payload["scale"], aux

    def factory(hp, setup):
        return Algorithm(name="nan3", hparams=hp, local_loss=local_loss, broadcast=broadcast)

    monkeypatch.setitem(ALGORITHMS._entries, "nan3", Entry("nan3", factory, "test only", AlgorithmParams))


def test_divergence_stops_with_the_round_and_keeps_earlier_metrics(tiny, nan_from_round_3):
    with pytest.raises(DivergenceError, match=r"diverged in round 3: client \d+ produced a non-finite") as err:
        fedrift.run(tiny(algorithm={"name": "nan3"}, train={"rounds": 10}))
    out = err.value.result.output_dir
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["rounds"] == 2 and "round 3" in summary["message"]
    assert err.value.result.history == rows
    assert not (out / "final_model.pt").exists()


def test_an_exploding_learning_rate_is_caught(tiny):
    with pytest.raises(DivergenceError, match="diverged in round 1"):
        fedrift.run(tiny(model={"name": "logreg"}, train={"lr": 1e38, "momentum": 0.0}))


def test_too_many_clients_per_round_is_refused_before_training(tiny):
    with pytest.raises(ConfigError, match="train.clients_per_round"):
        fedrift.run(tiny(train={"clients_per_round": 7}))
