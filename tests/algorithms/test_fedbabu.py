"""FedBABU (algorithms/fedbabu.py): the head never changes during training (the server's is the
initial one, bit for bit, weight decay or not) and the body trains and averages exactly as
FedAvg's does with the head's gradient zeroed (no weight decay; the server keeping its head);
head_layers 0 is FedAvg, the whole run bit for bit; its personalisation is eval.personalize's
fine-tuning; a head of every layer is refused in one line; it writes a Flower app and enters
fedrift select, where the per-client splits are refused in one line. The executors run it
through tests/engine/algorithm_cases.py; test_learning.py that it learns;
tests/algorithms/test_fedrep.py that FedRep with no head epochs is it, and its refusal of adamw."""

from __future__ import annotations

import pytest
import torch
from agreement import BITS, agree, untimed
from conftest import one_line_refusal

import fedrift
from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams
from fedrift.algorithms.fedavg import ce_loss
from fedrift.api import prepare
from fedrift.engine.build import build_run
from fedrift.models.norm import model_state

HEAD = ("fc.weight", "fc.bias")


@pytest.fixture
def fedavg_frozen_head():
    """FedAvg whose head gradient is zeroed at every step, and whose server keeps its head (the
    average of the clients' unchanged heads is the head, but not bit for bit): a test-only
    algorithm."""

    def zero_head(grads, params, payload, ctx):
        return {k: torch.zeros_like(g) if k in HEAD else g for k, g in grads.items()}

    def keep_head(state, sums, info):
        return {**state, "params": {k: v if k in HEAD else sums["params"][k] for k, v in state["params"].items()}}

    @ALGORITHMS.register("fedavg_zero_head_test", "test only", AlgorithmParams)
    def make(hp, setup):
        return Algorithm(name="fedavg_zero_head_test", hparams=hp, local_loss=ce_loss, grad_correction=zero_head,
                         sums={"params": "weights"}, aggregate_sums=keep_head)

    try:
        yield "fedavg_zero_head_test"
    finally:
        ALGORITHMS._entries.pop("fedavg_zero_head_test", None)


@pytest.mark.agreement
def test_the_head_never_changes_and_the_body_is_fedavgs_with_the_head_gradient_zeroed(tiny, tmp_path, fedavg_frozen_head):
    sections = dict(train={"rounds": 3, "clients_per_round": 4, "weight_decay": 0.0})  # momentum 0.9 (the default)
    babu = fedrift.run(tiny(algorithm={"name": "fedbabu"}, output={"dir": str(tmp_path / "b")}, **sections))
    ref = fedrift.run(tiny(algorithm={"name": fedavg_frozen_head}, output={"dir": str(tmp_path / "r")}, **sections))
    init = model_state(build_run(prepare(tiny()))[0])
    assert all(torch.equal(babu.global_state[k], init[k]) for k in HEAD)
    agree(babu.global_state, ref.global_state, BITS)
    # with weight decay too (the head gets none)
    decayed = fedrift.run(tiny(algorithm={"name": "fedbabu"}, train={"weight_decay": 0.01},
                               output={"dir": str(tmp_path / "d")}))
    assert all(torch.equal(decayed.global_state[k], init[k]) for k in HEAD)
    assert babu.history[-1]["bytes_up"] == ref.history[-1]["bytes_up"]  # the head comes back, unchanged


@pytest.mark.agreement
def test_with_no_head_it_is_fedavg(tiny, tmp_path):
    a = fedrift.run(tiny(algorithm={"name": "fedavg"}, output={"dir": str(tmp_path / "a")}))
    b = fedrift.run(tiny(algorithm={"name": "fedbabu", "head_layers": 0}, output={"dir": str(tmp_path / "b")}))
    agree(a.global_state, b.global_state, BITS)
    agree(untimed(a.history), untimed(b.history), BITS)


@pytest.mark.parametrize("part", ["head", "all"])
def test_personalisation_fine_tunes_each_clients_head_or_whole_model(tiny, tmp_path, part):
    """The paper's fine-tuning moves the whole model (eval.personalize_part=all); the head alone
    is FedADC's calibration. Either changes what each client scores."""
    r = fedrift.run(tiny(algorithm={"name": "fedbabu"}, output={"dir": str(tmp_path / "p")},
                         eval={"personalize": True, "personalize_epochs": 5, "personalize_part": part}))
    s = r.summary
    assert 0.0 <= s["personalized_accuracy"] <= 1.0 and s["personalized_accuracy"] != s["global_local_accuracy"]


def test_a_head_of_every_layer_is_refused_in_one_line(tmp_path, capsys):
    one_line_refusal(capsys, ["run", "data.name=digits", "model.name=logreg", "algorithm.name=fedbabu", "train.rounds=1",
                              f"output.dir={tmp_path / 'run'}", "output.progress=false"],
                     "algorithm.head_layers", "allowed: 0 to 0")
    assert not (tmp_path / "run").exists()


def test_it_deploys_with_flower_where_the_per_client_splits_are_refused(tmp_path, capsys):
    from fedrift.cli import main

    assert main(["flower", "app", str(tmp_path / "app"), "data.name=digits", "algorithm.name=fedbabu"]) == 0
    capsys.readouterr()
    for name in ("fedper", "lgfedavg", "fedrep"):
        one_line_refusal(capsys, ["flower", "app", str(tmp_path / name), "data.name=digits", f"algorithm.name={name}"],
                         f"algorithm.name: {name} is evaluated on each client's model with the part it keeps")
        assert not (tmp_path / name).exists()


def test_select_takes_it_and_refuses_the_per_client_splits_in_one_line(tiny, tmp_path, capsys):
    import yaml

    from fedrift.cli import main

    cfg = tiny(partition={"val_share": 0.2})
    cfg.pop("output")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    base = ["select", "-c", str(path), "--budget", "10m", "--dry-run", "seeds=1,2", "top=1"]
    assert main([*base, "--out", str(tmp_path / "s"), "algorithms=fedavg,fedbabu"]) == 0
    assert "field: 2 entries, in this order: fedavg, fedbabu" in capsys.readouterr().out
    for name in ("fedper", "lgfedavg", "fedrep"):
        one_line_refusal(capsys, [*base, "--out", str(tmp_path / name), f"algorithms=fedavg,{name}"],
                         f"algorithms: {name} has per-client models")
    assert not any((tmp_path / n).exists() for n in ("s", "fedper", "lgfedavg", "fedrep"))
