"""The processes executor must reproduce the sequential one exactly, in job order, and fail loudly.

Workers are separate interpreters that rebuild the run from its config, so everything here
goes through real registry entries (a monkeypatched entry would not exist in a worker).
"""

import multiprocessing as mp
import os
import signal
import shutil

import pytest
from agreement import BITS, agree, untimed
from algorithm_cases import NAMES, case
import torch

import fedrift
from fedrift.api import prepare
from fedrift.config import load_config
from fedrift.engine.executors.base import ClientJob
from fedrift.engine.build import client_tools
from fedrift.engine.executors.processes import ProcessesExecutor, WorkerError, WorkerTraceback, split_jobs
from fedrift.engine.executors.sequential import HookError, SequentialExecutor
from fedrift.errors import ConfigError
from fedrift.models import build_model

@pytest.mark.process
@pytest.mark.agreement
@pytest.mark.parametrize("name", NAMES)
def test_processes_equal_sequential_bit_for_bit(tiny, tmp_path, name):
    """One thread per worker and the parent's batch schedule: the same bits as sequential at
    engine.threads=1 (3 clients over 2 workers: one worker trains two)."""
    # fedavg: the FedAvg CNN (convolutions too), and personalisation after training
    sections = case(name)
    if name == "fedavg":
        sections.update(model={"name": "cnn", "hidden": 64}, eval={"personalize": True, "personalize_epochs": 1})
    results = {}
    for ex in ("sequential", "processes"):
        cfg = tiny(engine={"executor": ex, "threads": 1, "workers": 2}, output={"dir": str(tmp_path / ex)}, **sections)
        results[ex] = fedrift.run(cfg)
    seq, par = results["sequential"], results["processes"]
    agree(seq.global_state, par.global_state, BITS)
    agree(seq.server_state, par.server_state, BITS)
    agree(untimed(seq.history), untimed(par.history), BITS)
    if name == "fedavg":  # personalisation (other tools) ran in the parent, with the same result
        agree(seq.summary["personalized_accuracy"], par.summary["personalized_accuracy"], BITS)
    assert mp.active_children() == []  # api.run closed the executor


def _setup(cfg):
    """The parent's copy of the run's tools and a round-1 payload (the initial model)."""
    prep = prepare(cfg)
    model = build_model(cfg.model.name, prep.options["model"], prep.dataset.input_shape, prep.dataset.num_classes, cfg.seed)
    return client_tools(cfg), {"params": {k: v.detach().clone() for k, v in model.named_parameters()}}


def _job(tools, k, indices, batch=8):
    ix = torch.as_tensor(indices, dtype=torch.int64)
    schedule = [ix[i : i + batch] for i in range(0, len(ix), batch)]
    ctx = {"num_samples": torch.tensor(float(len(ix))), "num_steps": torch.tensor(float(len(schedule))),
           "label_counts": torch.bincount(tools.y[ix.clamp(max=len(tools.y) - 1)], minlength=10).float(), "state": {}}
    return ClientJob.from_schedule(k, ix, schedule, ctx)


def test_split_is_deterministic_balanced_and_in_job_order():
    jobs = [ClientJob.from_schedule(k, torch.arange(n), [torch.arange(n)], {}) for k, n in enumerate([5, 40, 10, 30, 20])]
    buckets = split_jobs(jobs, 2)
    assert buckets == split_jobs(jobs, 2) == [[0, 1, 2], [3, 4]]  # loads 55 and 50
    assert sorted(i for b in buckets for i in b) == list(range(5))
    assert split_jobs(jobs[:1], 3) == [[0]]


@pytest.mark.process
@pytest.mark.agreement
def test_job_order_worker_errors_and_no_child_left(tiny):
    cfg = load_config(tiny(engine={"executor": "processes", "workers": 2}))
    tools, payload = _setup(cfg)
    # clients out of id order, uneven sizes
    jobs = [_job(tools, 9, range(0, 50)), _job(tools, 2, range(50, 53)), _job(tools, 5, range(60, 90)),
            _job(tools, 1, range(100, 117))]
    ex = ProcessesExecutor(cfg)
    try:
        ref = SequentialExecutor().run_round(tools, payload, jobs, 1)
        out = ex.run_round(tools, payload, jobs, 1)
        assert [o.client_id for o in out] == [9, 2, 5, 1]
        for a, b in zip(ref, out):
            agree((a.upload, a.loss), (b.upload, b.loss), BITS)
        pids = [w.process.pid for w in ex._procs]
        assert len(pids) == 2

        # hooks fail in both workers (clients 7 and 3): the first failing client in job order
        # is reported, with its type and the worker's traceback
        bad = [jobs[0], _job(tools, 7, [0, 10**7]), jobs[2], _job(tools, 3, [*range(200, 224), 10**7])]
        assert split_jobs(bad, 2) == [[0, 1], [2, 3]]
        with pytest.raises(HookError, match=r"hook local_loss failed in round 2, client 7") as info:
            ex.run_round(tools, payload, bad, 2)
        assert isinstance(info.value.__cause__, WorkerTraceback)
        assert "IndexError" in info.value.__cause__.text and "in worker" in info.value.__cause__.text
        assert any("client 7" in note for note in info.value.__notes__)

        # the workers are still in step after an error
        again = ex.run_round(tools, payload, jobs, 1)
        assert [o.client_id for o in again] == [9, 2, 5, 1]
        agree(again[2].loss, ref[2].loss, BITS)
        assert [w.process.pid for w in ex._procs] == pids  # resident, not restarted
        ex.close()
        assert mp.active_children() == []
        ex.close()  # twice is fine

        # workers start again on the next round; one is killed: reported, the others stopped
        ex.run_round(tools, payload, jobs, 3)
        os.kill(ex._procs[0].process.pid, signal.SIGKILL)
        # dead before its round was sent, or as it trains: which one is the kill's timing (both seen)
        with pytest.raises(WorkerError, match=r"worker 0 \(pid \d+\) died while (being sent|training) round 4 \(exit code -9"):
            ex.run_round(tools, payload, jobs, 4)
        assert mp.active_children() == []
    finally:
        ex.close()


@pytest.mark.process
def test_a_start_up_failure_keeps_its_type(tiny, tmp_path):
    """A FedriftError in a worker (here: data.root vanished before the workers started)."""
    root = tmp_path / "data"
    root.mkdir()
    cfg = load_config(tiny(data={"name": "digits", "root": str(root)}, engine={"executor": "processes", "workers": 1}))
    shutil.rmtree(root)
    tools = client_tools(load_config(tiny()))
    ex = ProcessesExecutor(cfg)
    try:
        with pytest.raises(ConfigError, match="data.root") as info:
            ex.run_round(tools, {"params": {}}, [_job(tools, 0, range(8))], 1)
        assert isinstance(info.value.__cause__, WorkerTraceback)
    finally:
        ex.close()
    assert mp.active_children() == []


@pytest.mark.process
def test_workers_refuse_tools_not_built_from_the_config(tiny):
    tools, payload = _setup(load_config(tiny(algorithm={"name": "fedprox", "mu": 0.1})))
    ex = ProcessesExecutor(load_config(tiny(engine={"executor": "processes", "workers": 1})))  # fedavg
    try:
        with pytest.raises(ConfigError, match=r"engine.executor: .*their algorithm \(fedavg"):
            ex.run_round(tools, payload, [_job(tools, 0, range(8))], 1)
    finally:
        ex.close()
    assert mp.active_children() == []


def test_workers_option(tiny):
    with pytest.raises(ConfigError, match="engine.workers"):
        load_config(tiny(engine={"workers": 0}))
    cfg = load_config(tiny(engine={"executor": "processes"}))
    assert ProcessesExecutor(cfg).workers == len(os.sched_getaffinity(0))
    assert ProcessesExecutor(load_config(tiny(engine={"workers": 3}))).workers == 3
