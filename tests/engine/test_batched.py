"""The batched executor must reproduce the sequential one: same batches, same results."""

import dataclasses
import importlib
import math

import numpy as np
import pytest
import torch

import fedrift
from agreement import BITS, ROUNDING, agree, largest_difference, through_square_root, untimed
from algorithm_cases import NAMES, case, promise
from fedrift.api import prepare, run_prepared
from fedrift.data.partition_base import Partition
from fedrift.engine.executors.batched import BatchedExecutor, _rows

batched_module = importlib.import_module("fedrift.engine.executors.batched")


def test_rows_of_a_batched_tree_and_its_unbatched_leaves():
    """A finished client leaves the step: the rows kept of every batched tensor at any nesting;
    what vmap does not batch (in-dim None, non-tensor leaves) as it is."""
    tree = ({"w": torch.arange(6.0).reshape(3, 2), "n": 4}, (torch.arange(3.0),), {"shared": torch.ones(5)})
    keep = torch.tensor([0, 2])
    out = _rows(tree, keep, (0, 0, {"shared": None}))
    assert torch.equal(out[0]["w"], torch.tensor([[0.0, 1.0], [4.0, 5.0]])) and out[0]["n"] == 4
    assert torch.equal(out[1][0], torch.tensor([0.0, 2.0])) and out[2]["shared"] is tree[2]["shared"]
    assert _rows(tree, keep, None) is tree


def test_a_group_shrinks_by_one_plan_made_at_its_start():
    """Clients of 1, 3, 3 and 5 steps: the rows kept, the clients still training (a list and
    the same on the device) and the step batch's padding at each step where some finish;
    padded to the captured widths (5 -> 6)."""
    from fedrift.engine.executors.batched import _leaving
    from fedrift.engine.step_graphs import width

    fill, plan = _leaving([3, 1, 5, 3], None, torch.device("cpu"))
    assert fill is None and sorted(plan) == [1, 3]
    rows, still, at, pad = plan[1]
    assert rows.tolist() == [0, 2, 3] and still == at.tolist() == [0, 2, 3] and pad is None
    rows, still, at, pad = plan[3]
    assert rows.tolist() == [1] and still == at.tolist() == [2] and pad is None  # client 2 was the second row left
    fill, plan = _leaving([3, 1, 5, 3, 2], width, torch.device("cpu"))
    assert fill.tolist() == [0, 1, 2, 3, 4, 0]  # 5 clients in a graph of 6 rows
    rows, still, at, pad = plan[1]  # 4 left: a width of its own, no padding
    assert rows.tolist() == [0, 2, 3, 4] and still == at.tolist() == [0, 2, 3, 4] and pad is None
    rows, still, at, pad = plan[2]  # 3 left (width 3)
    assert rows.tolist() == [0, 1, 2] and still == at.tolist() == [0, 2, 3]
    rows, still, at, pad = plan[3]  # 1 left
    assert rows.tolist() == [1] and still == at.tolist() == [2] and pad is None
    fill, plan = _leaving([2, 2, 2, 2, 2, 9], width, torch.device("cpu"))  # 6 -> 1: no padding
    rows, still, at, pad = plan[2]
    assert fill is None and rows.tolist() == [5] and still == [5] and pad is None
    fill, plan = _leaving([1, 1, 1, 5, 5, 5, 5, 5], width, torch.device("cpu"))  # 8 -> 5, padded to 6
    rows, still, at, pad = plan[1]
    assert rows.tolist() == [3, 4, 5, 6, 7, 3] and still == at.tolist() == [3, 4, 5, 6, 7] and pad.tolist() == [0, 1, 2, 3, 4, 0]
    assert len({t.untyped_storage().data_ptr() for t in (rows, at, pad)}) == 1  # one tensor


@pytest.mark.agreement
@pytest.mark.parametrize("algorithm", [{"name": "fedavg"}, {"name": "fedprox", "mu": 0.1}])
@pytest.mark.parametrize("max_parallel", [None, 2])
def test_uneven_clients_one_sample_to_fifty_times_more(tiny, tmp_path, algorithm, max_parallel, monkeypatch):
    """Sizes 1, 2, 3, 150: clients that finish early leave the step, padded last batches, and
    groups split by K."""
    results, trained = {}, []
    vstep = BatchedExecutor.vstep

    def counted(self, tools, payload_dims=None, **kw):  # the clients each vectorised step trains
        step = vstep(self, tools, payload_dims, **kw)

        def counting_step(params, *rest):
            trained.append(len(next(iter(params.values()))))
            return step(params, *rest)

        return counting_step

    monkeypatch.setattr(BatchedExecutor, "vstep", counted)
    for ex in ("sequential", "batched"):
        cfg = tiny(algorithm=algorithm, engine={"executor": ex, "max_parallel_clients": max_parallel},
                   train={"rounds": 2, "clients_per_round": 4, "local_epochs": 2, "batch_size": 8},
                   output={"dir": str(tmp_path / ex)})
        prep = prepare(cfg)
        rng = np.random.default_rng(0)
        ix = rng.permutation(prep.dataset.num_train)
        sizes = [1, 2, 3, 150]
        cuts = np.cumsum([0, *sizes])
        train = [np.sort(ix[a:b]) for a, b in zip(cuts, cuts[1:])]
        test = [np.arange(10)] * 4
        prep = dataclasses.replace(prep, partition=Partition("manual", train, test))
        results[ex] = run_prepared(prep)
    agree(results["sequential"].global_state, results["batched"].global_state)
    agree(untimed(results["sequential"].history), untimed(results["batched"].history))
    # the vectorised steps trained only clients with steps left: 2, 2, 2 and 38 steps a round
    # (2 epochs of batch 8), 44 client-steps a round, not 4 x 38
    assert sum(trained) == 2 * sum(math.ceil(n / 8) * 2 for n in sizes) == 88, trained


def test_auto_parallel_is_bounded():
    ex = BatchedExecutor()
    assert ex.max_parallel is None
    from fedrift.engine.executors.batched import auto_parallel

    small = auto_parallel({"w": torch.zeros(100)}, 10, 60)
    big = auto_parallel({"w": torch.zeros(10_000_000)}, 32, 784)
    assert small == 256 and big == 1


@pytest.mark.agreement
@pytest.mark.parametrize("form", ["vmap", "stacked"])
@pytest.mark.parametrize("name", NAMES)
def test_every_algorithm_gives_the_same_result_batched(tiny, tmp_path, name, form, monkeypatch):
    """Trained models and metrics equal to float rounding (other kernels under vmap; the
    algorithm's promise, tests/agreement.py). A calibrated model (CCVR: ``global_state``; the
    trained one is ``server_state["params"]``) is a function of the trained model, computed in
    the server's process for every executor: equal inputs give it bit for bit (the next test),
    and trained models ``eps`` apart give calibrated ones and ``calibrated_*`` metrics within a
    square root of ``eps`` (its draws use the covariance's symmetric square root;
    algorithms/ccvr.py).
    ``stacked``: the MLP steps through its stacked form (engine/stacked_step.py; ResNet-8's
    default), every hook of the algorithm with it."""
    from fedrift.engine import stacked_step
    from fedrift.models.mlp import MLP

    made = []
    if form == "stacked":
        monkeypatch.setattr(MLP, "stacked_step", True)
        real = stacked_step.make_vstep
        monkeypatch.setattr(batched_module, "make_vstep", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    results = {}
    for ex in ("sequential", "batched"):
        cfg = tiny(engine={"executor": ex}, train={"rounds": 3, "batch_size": 32},
                   output={"dir": str(tmp_path / ex)}, **case(name))
        results[ex] = fedrift.run(cfg)
    seq, bat = results["sequential"], results["batched"]
    # the batched run stepped through the form, but for a BatchNorm model (FedBN's case) or a
    # projection head (MOON's, FedGKD+'s), which vmap
    model = case(name).get("model", {})
    has_form = model.get("norm") != "batch" and not model.get("projection_dim")
    assert form == "vmap" or any(m is not None for m in made) == has_form
    calibrated = name == "ccvr"
    trained = (seq.server_state["params"], bat.server_state["params"]) if calibrated else (seq.global_state, bat.global_state)
    agree(*trained, promise(name))
    if calibrated:
        calibration = through_square_root(promise(name), largest_difference(*trained))
        agree(seq.global_state, bat.global_state, calibration)
        agree(untimed(seq.history), untimed(bat.history), calibration)
    else:
        agree(untimed(seq.history), untimed(bat.history), promise(name))


@pytest.mark.agreement
def test_a_calibration_is_the_same_for_equal_trained_models(tiny, tmp_path):
    """CCVR's calibrated model is a function of the trained model alone: the server's
    calibration of each executor's trained model, done again here in a fresh server, is that
    run's calibrated model bit for bit; so executors whose trained models are equal give equal
    calibrated models (the previous test bounds them where the trained models differ)."""
    from fedrift.engine.build import build_run
    from fedrift.engine.federation import Federation
    from fedrift.engine.outputs import RunWriter
    from fedrift.engine.server import Server

    for ex in ("sequential", "batched"):
        cfg = tiny(engine={"executor": ex}, train={"rounds": 2, "batch_size": 32},
                   output={"dir": str(tmp_path / ex)}, **case("ccvr"))
        run = fedrift.run(cfg)
        prep = prepare(cfg)
        model, algorithm = build_run(prep)
        writer = RunWriter(tmp_path / f"again-{ex}", overwrite=False)
        server = Server(prep.config, Federation(prep.dataset, prep.partition, prep.device), model, algorithm, writer)
        try:
            server.state = {**server.state, "params": run.server_state["params"]}
            row = server.calibrate(cfg["train"]["rounds"])
        finally:
            server.release()
            writer.close()
            writer.release()
        agree(run.global_state, server.calibrated, BITS, where=ex)
        agree([row["calibrated_accuracy"], row["calibrated_loss"]],
              [run.history[-1]["calibrated_accuracy"], run.history[-1]["calibrated_loss"]], BITS, where=ex)


def test_auto_rule():
    from fedrift.engine.executors import choose_executor

    # R1 on a GPU (4 clients of ResNet-8): batched with its step captured, sequential launched op by op
    assert choose_executor("cuda:0", 4, 10, True, 2) == "batched" and choose_executor("cuda:0", 1, 10, True, 2) == "sequential"
    assert choose_executor("cuda:0", 4, 10, True, 2, graphs=False) == "sequential"
    assert choose_executor("cuda:0", 20, 2_300_000, True, 2, graphs=False) == "batched"  # R2 on a GPU: 20 clients of a CNN
    assert choose_executor("cuda:0", 8, 10, False, 2, graphs=False) == "batched"
    assert choose_executor("cuda:0", 7, 10, False, 2, graphs=False) == "sequential"
    assert choose_executor("cpu", 4, 1_663_370, True, 2) == "processes"  # the FedAvg CNN
    assert choose_executor("cpu", 4, 1_663_370, True, 2, samples_per_client=1000) == "processes"  # workload A
    assert choose_executor("cpu", 50, 1_663_370, True, 2, samples_per_client=8) == "sequential"  # S2
    assert choose_executor("cpu", 4, 1_663_370, True, 1) == "sequential"
    assert choose_executor("cpu", 1, 1_663_370, True, 2) == "sequential"
    assert choose_executor("cpu", 100, 610, False, 2) == "batched"  # S1: logreg, 100 clients
    assert choose_executor("cpu", 100, 179_658, False, 2, states_on_disk=True) == "sequential"  # S4
    assert choose_executor("cuda:0", 100, 179_658, False, 2, states_on_disk=True) == "batched"
    assert choose_executor("cpu", 3, 55_210, False, 2) == "sequential"
    # a short run does not pay for starting the workers (issue 17: a 4-round CNN run)
    assert choose_executor("cpu", 5, 1_663_370, True, 2, samples_per_client=400, rounds=4) == "sequential"
    assert choose_executor("cpu", 5, 1_663_370, True, 2, samples_per_client=400, rounds=30) == "processes"
    assert choose_executor("cpu", 4, 1_663_370, True, 2, samples_per_client=1000, rounds=50) == "processes"  # workload A


def test_auto_is_the_default_and_the_summary_says_what_ran(tiny):
    r = fedrift.run(tiny())
    assert r.config.engine.executor == "auto" and r.summary["executor"] == "sequential"
    r = fedrift.run(tiny(train={"clients_per_round": 8, "rounds": 1}, partition={"name": "iid", "num_clients": 10},
                         output={"dir": str(r.output_dir) + "-b"}))
    assert r.summary["executor"] == "batched"  # a small model, 8 clients a round


def test_auto_sends_the_cnn_to_processes_only_when_clients_have_enough_work():
    from fedrift.api import prepare, resolve_executor
    from fedrift.models import build_model

    def chosen(num_clients):
        prep = prepare({"data": {"name": "mnist5k"}, "model": {"name": "cnn"},
                        "partition": {"name": "iid", "num_clients": num_clients},
                        "train": {"clients_per_round": 4, "local_epochs": 1}, "engine": {"workers": 2}})
        model = build_model("cnn", prep.options["model"], prep.dataset.input_shape, 10, 0)
        return resolve_executor(prep.config, prep, model)

    assert chosen(10) == "processes"  # 400 samples a client a round
    assert chosen(500) == "sequential"  # 8: shipping the model costs more than training it


@pytest.mark.agreement
def test_the_cnn_batched_is_within_the_stated_tolerance_after_one_round(tiny, tmp_path):
    """docs/concepts/executors.md: the FedAvg CNN, batched against sequential, after one round: every
    parameter equal to float rounding (convolutions: other kernels under vmap)."""
    results = {}
    for ex in ("sequential", "batched"):
        cfg = tiny(model={"name": "cnn", "hidden": 64}, engine={"executor": ex}, train={"rounds": 1, "batch_size": 16},
                   output={"dir": str(tmp_path / ex)})
        results[ex] = fedrift.run(cfg)
    agree(results["sequential"].global_state, results["batched"].global_state, ROUNDING)
