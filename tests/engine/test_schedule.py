"""The per-round learning rate (``train.lr_schedule``): round t trains, and aggregates, exactly
as a constant-lr run at ``train.lr_at(t)`` would; every executor sees the same lr; a resumed run
continues the schedule; ``constant`` is the run without a schedule."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

import fedrift
from agreement import BITS, agree, untimed
from conftest import ctrl_c_in_round
from fedrift.api import prepare
from fedrift.config import load_config
from fedrift.engine.build import build_run, client_tools
from fedrift.engine.executors.sequential import SequentialExecutor
from fedrift.engine.executors.worker import same_run
from fedrift.engine.federation import Federation, client_job
from fedrift.engine.outputs import RunWriter
from fedrift.engine.server import Server

STEP = {"lr_schedule": "step", "lr_milestones": [2, 3], "lr_gamma": 0.5}  # 0.05, 0.025, 0.0125
COSINE = {"lr_schedule": "cosine", "lr_min": 0.01}


def _cfg(tiny, tmp_path, name, executor, schedule, rounds=3, **sections):
    return tiny(algorithm={"name": name}, train={"rounds": rounds, **schedule},
                engine={"executor": executor, "threads": 1, "workers": 2, **sections.pop("engine", {})},
                output={"dir": str(tmp_path / f"{name}-{executor}")}, **sections)


def test_lr_of_each_round_by_hand():
    step = load_config({"train": {"rounds": 5, "lr": 0.5, "lr_schedule": "step", "lr_milestones": [2, 4], "lr_gamma": 0.5}})
    assert [step.train.lr_at(t) for t in range(1, 6)] == [0.5, 0.25, 0.25, 0.125, 0.125]
    cos = load_config({"train": {"rounds": 4, "lr": 0.4, "lr_schedule": "cosine"}})
    # lr_t = lr_min + (lr - lr_min) (1 + cos(pi (t - 1) / R)) / 2 with R = 4, lr_min = 0
    assert cos.train.lr_at(1) == 0.4  # exactly train.lr
    assert cos.train.lr_at(2) == pytest.approx(0.2 * (1 + math.sqrt(0.5)), rel=1e-15)
    assert cos.train.lr_at(3) == pytest.approx(0.2, rel=1e-15)
    assert cos.train.lr_at(4) == pytest.approx(0.2 * (1 - math.sqrt(0.5)), rel=1e-15)
    floor = load_config({"train": {"rounds": 4, "lr": 0.4, "lr_schedule": "cosine", "lr_min": 0.1}})
    assert floor.train.lr_at(3) == pytest.approx(0.25, rel=1e-15) and floor.train.lr_at(1) == 0.4
    const = load_config({"train": {"rounds": 3, "lr": 0.3}})
    assert [const.train.lr_at(t) for t in (1, 2, 3)] == [0.3, 0.3, 0.3]


@pytest.mark.agreement
def test_constant_builds_nothing_new_and_logs_its_lr(tiny, tmp_path):
    """``constant`` (the default) is the run of before: no rebuilt algorithm, the same tools
    every round (so the same operations), and the same bits as a run that names it."""
    cfg = tiny(train={"rounds": 2})
    prep = prepare(cfg)
    assert prep.config.train.lr_schedule == "constant"
    tools = client_tools(prep)
    assert tools.schedule is None and tools.lr == 0.05 and tools.at_round(2) is tools and tools.at_lr(0.1) is tools
    plain = fedrift.run(cfg)
    named = fedrift.run(tiny(train={"rounds": 2, "lr_schedule": "constant"}, output={"dir": str(tmp_path / "named")}))
    agree(plain.global_state, named.global_state, BITS)
    assert [r["lr"] for r in plain.history] == [0.05, 0.05]


@pytest.mark.agreement
@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold", "slowmo", "fedadc", "feddyn"])
def test_a_round_trains_as_a_constant_run_at_its_lr(tiny, name):
    """Round 3's client work under the step schedule (lr 0.0125) equals, bit for bit, the same
    client's round 3 in a constant run at train.lr 0.0125: local steps, client state (SCAFFOLD's
    control divides by H_k eta_t) and upload."""
    sched = load_config(tiny(algorithm={"name": name}, train={"rounds": 3, **STEP}))
    const = load_config(tiny(algorithm={"name": name}, train={"rounds": 3, "lr": 0.0125}))
    tools = client_tools(sched)
    at3 = tools.at_round(3)
    assert (tools.lr, at3.lr) == (0.05, 0.0125) and at3.algorithm is not tools.algorithm
    assert tools.at_round(3).algorithm is at3.algorithm  # built once while it is the latest lr
    assert tools.at_round(1).algorithm is tools.algorithm
    ref = client_tools(const)
    prep = prepare(sched)
    model, algorithm = build_run(prep)
    fed = Federation(prep.dataset, prep.partition, prep.device)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    server = algorithm.init_server(params)
    server = {k: (v if k == "params" else {n: torch.full_like(t, 0.01) for n, t in v.items()}) for k, v in server.items()}
    state = algorithm.init_client(params) if algorithm.init_client else {}
    state = {k: {n: torch.full_like(t, -0.02) for n, t in v.items()} for k, v in state.items()}  # a used control
    from fedrift.algorithms.base import RoundInfo

    info = RoundInfo(round=3, num_clients=fed.num_clients, sampled=(0, 1))
    payload = at3.algorithm.broadcast(server, info)
    job = client_job(fed, 1, state, sched.train, sched.seed, 3)
    out = SequentialExecutor().run_round(at3, payload, [job], 3)[0]
    want = SequentialExecutor().run_round(ref, ref.algorithm.broadcast(server, info), [client_job(fed, 1, state, const.train, const.seed, 3)], 3)[0]
    agree((out.upload, out.state, out.loss), (want.upload, want.state, want.loss), BITS)


def _composed(tiny, tmp_path, name, lrs):
    """The run by hand: round t served by a Server built from a constant-lr config at lrs[t-1],
    starting from the state the previous round's server left (algorithms without client state)."""
    state = None
    for t, lr in enumerate(lrs, start=1):
        cfg = tiny(algorithm={"name": name}, train={"rounds": len(lrs), "lr": lr}, engine={"threads": 1},
                   output={"dir": str(tmp_path / f"composed-{t}")})
        prep = prepare(cfg)
        model, algorithm = build_run(prep)
        writer = RunWriter(Path(cfg["output"]["dir"]), overwrite=False)
        server = Server(prep.config, Federation(prep.dataset, prep.partition, prep.device), model, algorithm, writer)
        try:
            if state is not None:
                server.state = state
            rnd = server.open(t)
            server.close(rnd, SequentialExecutor().run_round(rnd.tools, rnd.payload, rnd.jobs, t), [])
            state = server.state
        finally:
            server.release()
            writer.close()
            writer.release()
    return state


@pytest.mark.agreement
@pytest.mark.parametrize("name, schedule", [("fedadc", STEP), ("slowmo", STEP), ("fedadc", COSINE)])
def test_scheduled_run_equals_rounds_composed_at_each_lr(tiny, tmp_path, name, schedule):
    """A 3-round scheduled run equals, bit for bit, three rounds each run by a constant-lr
    server at that round's lr: FedADC's and SlowMo's server steps (D = (1/eta) sum p_k (w_t - w_k),
    w_{t+1} = w_t - alpha eta m) use the lr the clients trained with that round."""
    cfg = _cfg(tiny, tmp_path, name, "sequential", schedule)
    run = fedrift.run(cfg)
    lrs = [load_config(cfg).train.lr_at(t) for t in (1, 2, 3)]
    assert [r["lr"] for r in run.history] == lrs and len(set(lrs)) == 3
    agree(run.server_state, _composed(tiny, tmp_path, name, lrs), BITS)


@pytest.mark.process
@pytest.mark.agreement
@pytest.mark.parametrize("name, schedule", [("fedavg", STEP), ("scaffold", STEP), ("fedadc", COSINE)])
def test_processes_equal_sequential_bit_for_bit(tiny, tmp_path, name, schedule):
    results = {ex: fedrift.run(_cfg(tiny, tmp_path, name, ex, schedule)) for ex in ("sequential", "processes")}
    seq, par = results["sequential"], results["processes"]
    agree(seq.server_state, par.server_state, BITS)
    for a, b in zip(seq.history, par.history, strict=True):
        assert {k: v for k, v in a.items() if "seconds" not in k} == {k: v for k, v in b.items() if "seconds" not in k}


def test_workers_keep_training_a_scheduled_run(tiny):
    """The processes and Ray executors send a round's clients to their workers when its tools
    are the run's at the round's lr, and keep any other tools (personalisation's) in the parent."""
    tools = client_tools(load_config(tiny(train={"rounds": 3, **STEP})))
    at2 = tools.at_round(2)
    assert same_run(at2, tools) and same_run(tools, at2) and same_run(tools.at_round(3), at2)
    other = dataclasses.replace(at2, algorithm=dataclasses.replace(at2.algorithm, name="tuned"))
    assert not same_run(other, tools)


@pytest.mark.agreement
@pytest.mark.parametrize("name", ["fedavg", "scaffold", "slowmo", "fedadc"])
def test_batched_equals_sequential(tiny, tmp_path, name):
    """To float rounding, as every batched run (tests/engine/test_batched.py)."""
    results = {ex: fedrift.run(_cfg(tiny, tmp_path, name, ex, STEP)) for ex in ("sequential", "batched")}
    agree(results["sequential"].global_state, results["batched"].global_state)
    agree(untimed(results["sequential"].history), untimed(results["batched"].history))


@pytest.mark.process
@pytest.mark.agreement
@pytest.mark.parametrize("executor", ["sequential", "processes"])
def test_resumed_mid_schedule_equals_the_uninterrupted_run(tiny, tmp_path, executor):
    """Ctrl-C in round 4, resumed from round 2's checkpoint: rounds 3 and 4 at the decayed lr."""
    schedule = {"lr_schedule": "step", "lr_milestones": [3], "lr_gamma": 0.5}
    ref = fedrift.run(_cfg(tiny, tmp_path / "ref", "fedadc", "sequential", schedule, rounds=4))
    cfg = _cfg(tiny, tmp_path / "stopped", "fedadc", executor, schedule, rounds=4, engine={"checkpoint_every": 2})
    with pytest.MonkeyPatch.context() as mp_:
        ctrl_c_in_round(mp_, 4)
        with pytest.raises(KeyboardInterrupt):
            fedrift.run(cfg)
    resumed = fedrift.resume(cfg["output"]["dir"])
    assert resumed.summary["resumed_from_round"] == 2
    agree(ref.server_state, resumed.server_state, BITS)
    agree(untimed(ref.history), untimed(resumed.history), BITS)
    written = [json.loads(line) for line in (Path(cfg["output"]["dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in written] == [0.05, 0.05, 0.025, 0.025]


def test_schedule_keys_in_compare_and_tune_overrides(tmp_path):
    """Lists and schedules pass through the grid's override parsing (``compare``, ``tune``)."""
    from fedrift.experiments.grid import build_grid, parse_grid_tokens
    from fedrift.overrides import parse_algorithm

    tokens = parse_grid_tokens(["algorithms=fedavg,fedavg:train.lr_schedule=step:train.lr_milestones=[2,3]",
                                "train.rounds=3", "sweep.train.lr_gamma=0.5,0.25"])
    assert tokens["algorithms"] == ["fedavg", "fedavg:train.lr_schedule=step:train.lr_milestones=[2,3]"]
    assert parse_algorithm(tokens["algorithms"][1])[1] == ["train.lr_schedule=step", "train.lr_milestones=[2,3]"]
    grid = build_grid({"data": {"name": "digits"}, "model": {"name": "logreg"}},
                      ["fedavg:train.lr_schedule=step:train.lr_milestones=[2,3]"], [0],
                      {"train.lr_gamma": tokens["sweep"]["train.lr_gamma"]}, ["train.rounds=3"], out=tmp_path)
    train = [load_config(run.doc).train for run in grid.runs]
    assert [(t.lr_schedule, t.lr_milestones, t.lr_gamma) for t in train] == [("step", [2, 3], 0.5), ("step", [2, 3], 0.25)]
