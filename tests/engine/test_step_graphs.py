"""The vectorised step replayed from captured graphs (``engine/step_graphs.py``).

A GPU is not needed: ``eager_capture`` stands in for the CUDA capture with the same buffer
handling (inputs copied into a graph's own buffers, outputs its own buffers overwritten by the
next call), so what the batched executor does with them (padding groups to the graphs' widths,
reading the outputs before the next step) is checked here as a GPU runs it. Tolerance as the
batched executor's (tests/engine/test_batched.py): padded groups are vmapped at other widths.
"""

import dataclasses
import importlib
import logging

import numpy as np
import pytest
import torch

from agreement import agree, untimed
from algorithm_cases import case

from fedrift.api import prepare, run_prepared
from fedrift.data.partition_base import Partition
from fedrift.engine.executors.batched import BatchedExecutor
from fedrift.engine.step_graphs import StepGraphs, eager_capture, width
from fedrift.experiments import stacked
from fedrift.experiments.stacked import run_stacked

stacked_executor = importlib.import_module("fedrift.engine.executors.stacked")


def test_widths_are_few_and_waste_at_most_a_third():
    assert [width(n) for n in range(1, 14)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]
    assert all(n <= width(n) < 1.5 * n for n in range(1, 5000))
    assert len({width(n) for n in range(1, 193)}) == 15  # 48 stacked runs of 4 clients: 15 graphs at most


def test_a_graph_per_signature_its_outputs_overwritten_by_the_next_call():
    calls = []

    def step(x, scale, opts):
        calls.append(opts["mode"])
        return {"y": x * scale + 1}, x.sum()

    graphs = StepGraphs(step, eager_capture)
    a, b = torch.arange(3.0), torch.ones(3)
    out1, total1 = graphs(a, torch.tensor(2.0), {"mode": "m"})
    assert torch.equal(out1["y"], torch.tensor([1.0, 3.0, 5.0])) and total1.item() == 3.0
    y1 = out1["y"]
    out2, _ = graphs(b, torch.tensor(3.0), {"mode": "m"})
    assert out2["y"] is y1 and torch.equal(y1, torch.full((3,), 4.0))  # the same buffer, the new values
    assert graphs.captures == 1 and graphs.replays == 2
    graphs(torch.ones(4), torch.tensor(1.0), {"mode": "m"})  # another shape: another graph
    graphs(a, torch.tensor(1.0), {"mode": "n"})  # another value that is not a tensor: another graph
    assert graphs.captures == 3 and graphs.replays == 4 and set(calls) == {"m", "n"}


def test_a_capture_that_raises_is_said_once_and_the_step_runs_uncaptured(caplog):
    def refusing(fn, args, pool):
        raise RuntimeError("operation not permitted when stream is capturing\nmore lines")

    graphs = StepGraphs(lambda x: x + 1, refusing)
    with caplog.at_level(logging.WARNING, logger="fedrift"):
        assert torch.equal(graphs(torch.zeros(2)), torch.ones(2))
        assert torch.equal(graphs(torch.ones(3)), torch.full((3,), 2.0))
    said = [r.getMessage() for r in caplog.records if "CUDA graph" in r.getMessage()]
    assert said == ["engine: capturing the vectorised step as a CUDA graph raised RuntimeError: operation not "
                    "permitted when stream is capturing; it runs uncaptured (op by op) for the rest of the run"]
    assert graphs.failed and graphs.captures == 0 and graphs.replays == 0


@pytest.mark.agreement
@pytest.mark.parametrize("name", ["fedavg", "scaffold", "fedgkd", "fedadc", "fedbn", "fedprox-resnet8"])
def test_a_captured_group_equals_the_uncaptured_one(tiny, tmp_path, name):
    """Eight clients of 1 to 150 samples: finishing clients leave the group and the rest are
    padded (5 rows to 6); every step is a replay, one graph per width. ``-resnet8``: a GroupNorm
    ResNet-8, whose step runs through its stacked form (engine/stacked_step.py)."""
    results, executors = {}, {}
    name, _, model = name.partition("-")
    sections = {**case(name), **({"model": {"name": model, "width": 4, "group_channels": 2}} if model else {})}
    for graphs in (False, eager_capture):
        cfg = tiny(**sections, train={"rounds": 2, "clients_per_round": 8, "local_epochs": 2, "batch_size": 16},
                   output={"dir": str(tmp_path / str(bool(graphs)))})
        prep = prepare(cfg)
        ix = np.random.default_rng(0).permutation(prep.dataset.num_train)
        cuts = np.cumsum([0, 1, 2, 3, 20, 40, 60, 80, 150])
        train = [np.sort(ix[a:b]) for a, b in zip(cuts, cuts[1:])]
        prep = dataclasses.replace(prep, partition=Partition("manual", train, [np.arange(10)] * 8))
        executors[graphs] = BatchedExecutor(None, graphs)
        results[graphs] = run_prepared(prep, executor=executors[graphs])
    plain, captured = results[False], results[eager_capture]
    agree(plain.global_state, captured.global_state)
    agree(untimed(plain.history), untimed(captured.history))
    counts = executors[eager_capture].graph_counts()
    # 2 epochs of 16: 2, 2, 2, 4, 6, 8, 10 and 20 steps a round; 8, 5, 4, 3, 2 and 1 clients
    # training, in widths 8, 6, 4, 3, 2, 1: 6 graphs a payload's signature (FedGKD's round 2 holds
    # a second teacher: 6 more)
    assert counts["replays"] == 2 * 20 and 6 <= counts["captures"] <= 12 and counts["failed"] is None, counts
    assert executors[False].graph_counts()["captures"] == 0


@pytest.mark.agreement
def test_stacked_runs_captured_equal_the_uncaptured_stack(tiny, tmp_path, monkeypatch):
    """Three runs stacked (each client its run's payload, padded rows included) with the step
    replayed from graphs: each run as the uncaptured stack leaves it."""
    made = []

    class Captured(stacked_executor.RunStack):
        def __post_init__(self):
            self.cuda_graphs = eager_capture
            super().__post_init__()
            made.append(self)

    results = {}
    for graphs in (False, True):
        if graphs:
            monkeypatch.setattr(stacked, "RunStack", Captured)
        configs = [tiny(seed=s, algorithm={"name": "scaffold"}, engine={"executor": "stacked"},
                        train={"rounds": 2, "clients_per_round": 3, "batch_size": 8},
                        output={"dir": str(tmp_path / f"{graphs}-{s}")}) for s in range(3)]
        results[graphs] = run_stacked(configs)
    for plain, captured in zip(results[False], results[True]):
        agree(plain.global_state, captured.global_state)
        agree(untimed(plain.history), untimed(captured.history))
    counts = made[0]._engine.graph_counts()
    assert made[0].rounds_trained == 2 and counts["replays"] > 0 and counts["failed"] is None, counts


@pytest.mark.agreement
def test_a_learning_rate_schedule_keeps_its_graphs_from_round_to_round(tiny, tmp_path):
    """Under train.lr_schedule the captured step reads each round's rate as a tensor
    (engine.step_values), so a round of the same shapes replays the graphs the first captured,
    and the run equals the uncaptured one, whose step is built at each round's rate."""
    results, executors = {}, {}
    for graphs in (False, eager_capture):
        cfg = tiny(train={"rounds": 4, "clients_per_round": 4, "local_epochs": 1, "batch_size": 16,
                          "lr_schedule": "cosine"}, output={"dir": str(tmp_path / str(bool(graphs)))})
        prep = prepare(cfg)
        ix = np.random.default_rng(0).permutation(prep.dataset.num_train)
        train = [np.sort(ix[40 * k : 40 * (k + 1)]) for k in range(4)]  # 4 clients of 40: 3 steps each, every round
        prep = dataclasses.replace(prep, partition=Partition("manual", train, [np.arange(10)] * 4))
        executors[graphs] = BatchedExecutor(None, graphs)
        results[graphs] = run_prepared(prep, executor=executors[graphs])
    plain, captured = results[False], results[eager_capture]
    agree(plain.global_state, captured.global_state)
    agree(untimed(plain.history), untimed(captured.history))
    assert len({r["lr"] for r in plain.history}) == 4  # a new rate every round
    counts = executors[eager_capture].graph_counts()
    assert counts["captures"] == 1 and counts["replays"] == 4 * 3 and counts["failed"] is None, counts
