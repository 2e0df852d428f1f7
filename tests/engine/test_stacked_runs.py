"""Stacked runs (``engine.executor: stacked``) equal the same runs done one by one.

The promise is to float rounding, not bit for bit: a stack of several runs vectorises over
clients x runs, and other stack sizes may run other kernels. Stated tolerance, as the batched
executor's (tests/engine/test_batched.py): after the rounds every parameter within 1e-4 of its
tensor's largest value, metrics within 1e-3 relative (1e-6 absolute). The runs alone are run
with ``batched``, whose step the stack shares (it is itself within that tolerance of
``sequential``).
"""

import importlib
import json

import pytest
import torch

import fedrift
from agreement import BITS, ROUNDING, agree, untimed
from algorithm_cases import NAMES, case, promise
from fedrift.errors import ConfigError, DivergenceError
from fedrift.experiments import stacked
from fedrift.experiments.stacked import run_stacked

stacked_executor = importlib.import_module("fedrift.engine.executors.stacked")
batched = importlib.import_module("fedrift.engine.executors.batched")


def _same_run(a, b, promise=ROUNDING) -> None:
    """Run ``b`` is run ``a`` as ``promise`` says: its model and its metrics."""
    agree(a.global_state, b.global_state, promise)
    agree(untimed(a.history), untimed(b.history), promise)


@pytest.fixture
def stacks(monkeypatch):
    """The RunStacks made while the test runs (to check that runs did train together)."""
    made = []

    class Recorded(stacked_executor.RunStack):
        def __post_init__(self):
            super().__post_init__()
            made.append(self)

    monkeypatch.setattr(stacked, "RunStack", Recorded)
    return made


def _configs(tiny, tmp_path, seeds, tag="s", **sections):
    return [tiny(seed=s, engine={"executor": "stacked"}, output={"dir": str(tmp_path / f"{tag}{s}")}, **sections)
            for s in seeds]


def _alone(tiny, tmp_path, seeds, **sections):
    return [fedrift.run(tiny(seed=s, engine={"executor": "batched"}, output={"dir": str(tmp_path / f"a{s}")}, **sections))
            for s in seeds]


def _other_values(name):
    """Run 1's sections of algorithm ``name``'s case: another train.lr, and every option of the
    algorithm's tune space at a value of that space other than the case's (engine.step_values);
    its own partition, cohort and local epochs (keys of the run, not of its step)."""
    from fedrift.experiments.space import resolve_space

    sections = case(name)
    algorithm = dict(sections["algorithm"])
    for dim in resolve_space(name, {}):
        if dim.key.startswith("algorithm."):
            key, value = dim.key.split(".", 1)[1], dim.middle()
            algorithm[key] = value if algorithm.get(key) != value else dim.typed(value / 2)
    partition = sections.get("partition", {})  # a case's own split (FedDecorr's IID) as it is: the seed draws another
    partition = partition if "name" in partition else {**partition, "alpha": 0.3}
    return {**sections, "algorithm": algorithm, "partition": partition,
            "train": {"rounds": 2, "batch_size": 32, "lr": 0.02, "clients_per_round": 4, "local_epochs": 2}}


@pytest.mark.agreement
@pytest.mark.parametrize("name", NAMES)
def test_stacked_runs_equal_one_by_one_for_every_algorithm(tiny, tmp_path, stacks, name, caplog):
    """Two runs of each algorithm, at other seeds, partitions, cohorts, local epochs, learning
    rates and values of every option of its tune space: one step reads each run's values
    (engine.step_values)."""
    sections = [{"train": {"rounds": 2, "batch_size": 32}, **case(name)}, _other_values(name)]
    configs = [_configs(tiny, tmp_path, [s], **sections[s])[0] for s in (0, 1)]
    if name in stacked.UNSTACKABLE:
        with pytest.raises(ConfigError, match=name):
            run_stacked(configs)
        return
    together = run_stacked(configs)
    alone = [_alone(tiny, tmp_path, [s], **sections[s])[0] for s in (0, 1)]
    assert stacks[0].rounds_trained == 2 and stacks[0].rounds_alone == 0, caplog.text  # both rounds, one stack
    assert stacks[0].live == 0  # each run left the stack once
    for t, a in zip(together, alone):
        assert not isinstance(t, BaseException), t
        _same_run(a, t, promise(name))
        assert t.summary["executor"] == "stacked" and t.summary["status"] == "completed"
    assert together[1].config.train.lr == 0.02


@pytest.mark.agreement
def test_stacked_runs_write_each_run_folder_as_alone(tiny, tmp_path, stacks):
    sections = {"train": {"rounds": 3}}
    together = run_stacked(_configs(tiny, tmp_path, [0, 1, 2], **sections))
    alone = _alone(tiny, tmp_path, [0, 1, 2], **sections)
    assert stacks[0].rounds_trained == 3
    for s, (t, a) in enumerate(zip(together, alone)):
        folder = tmp_path / f"s{s}"
        for name in ("config.yaml", "partition.json", "metrics.jsonl", "summary.json", "final_model.pt"):
            assert (folder / name).is_file(), name
        assert (folder / "partition.json").read_text() == (tmp_path / f"a{s}" / "partition.json").read_text()
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        agree(untimed(a.history), untimed(rows))
        assert json.loads((folder / "summary.json").read_text())["seed"] == s
    # different seeds, different runs: the stack did not mix them up
    assert together[0].summary["final_accuracy"] != together[1].summary["final_accuracy"] or \
        not torch.equal(together[0].global_state["fc.weight"], together[1].global_state["fc.weight"])


def test_stacked_runs_are_reproducible(tiny, tmp_path):
    first = run_stacked(_configs(tiny, tmp_path, [0, 1], tag="x"))
    again = run_stacked(_configs(tiny, tmp_path, [0, 1], tag="y"))
    for a, b in zip(first, again):
        for k in a.global_state:
            assert torch.equal(a.global_state[k], b.global_state[k]), k


@pytest.mark.agreement
def test_stacked_runs_resume_from_their_checkpoints(tiny, tmp_path, monkeypatch):
    """Ctrl-C in round 3 stops every run of the stack (each writes its interrupted summary);
    resumed, each ends where the unstopped stack ends."""
    from conftest import ctrl_c_in_round

    sections = {"train": {"rounds": 4}, "engine": {"executor": "stacked", "checkpoint_every": 2}}
    whole = run_stacked([tiny(seed=s, output={"dir": str(tmp_path / f"w{s}")}, **sections) for s in (0, 1)])
    configs = [tiny(seed=s, output={"dir": str(tmp_path / f"r{s}")}, **sections) for s in (0, 1)]
    undo = ctrl_c_in_round(monkeypatch, 3)
    stopped = run_stacked(configs)
    undo()
    for r in stopped:
        assert isinstance(r, KeyboardInterrupt)
    for s in (0, 1):
        summary = json.loads((tmp_path / f"r{s}" / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["checkpoint_round"] == 2
    resumed = run_stacked(configs, resume=[True, True])
    for w, r in zip(whole, resumed):
        assert not isinstance(r, BaseException), r
        assert r.summary["resumed_from_round"] == 2
        _same_run(w, r)


def test_stacked_runs_stop_within_a_step_of_a_ctrl_c_while_the_stack_trains(tiny, tmp_path, monkeypatch):
    """A Ctrl-C (``RunStack.stop``, from another thread) while the stack trains a round stops
    the runs at the next step, not at the end of the round: the run that trains the meeting
    holds the stack's lock for all of its steps (before, ``stop`` waited for that lock: a
    paper-scale round's training, minutes on a CPU, longer than a pool's grace)."""
    import threading
    import time

    seen = {"steps": 0, "after": None}
    check = stacked_executor.RunStack._check_stop

    def counted(self):
        seen["steps"] += 1
        if seen["steps"] == 3:  # mid-round: the Ctrl-C comes from another thread, this one holds the lock
            threading.Thread(target=self.stop, daemon=True).start()
            for _ in range(500):  # at most 5 s for the flag
                if self._stopped:
                    break
                time.sleep(0.01)
            seen["after"] = seen["steps"]
        check(self)

    monkeypatch.setattr(stacked_executor.RunStack, "_check_stop", counted)
    sections = {"train": {"rounds": 2, "local_steps": 40}, "engine": {"executor": "stacked", "checkpoint_every": 1}}
    results = run_stacked([tiny(seed=s, output={"dir": str(tmp_path / f"r{s}")}, **sections) for s in (0, 1)])
    assert all(isinstance(r, KeyboardInterrupt) for r in results), results
    assert seen["steps"] == seen["after"] == 3, seen  # no step trained after the stop
    for s in (0, 1):
        assert json.loads((tmp_path / f"r{s}" / "summary.json").read_text())["status"] == "interrupted"


def test_stacked_runs_stop_in_their_evaluation_on_a_ctrl_c(tiny, tmp_path, monkeypatch):
    """A Ctrl-C that comes once the stack's round has trained stops each run in its evaluation
    (``fedrift.stopping``), as a run in the main thread stops wherever it is: no metrics row
    for the round, each summary interrupted. Before, each run evaluated every set first (a
    large test set with a large model on a CPU: past a ``--jobs`` pool's grace)."""
    train = stacked_executor.RunStack._train_together

    def then_stop(self, requests):
        train(self, requests)
        self.stop()

    monkeypatch.setattr(stacked_executor.RunStack, "_train_together", then_stop)
    results = run_stacked([tiny(seed=s, output={"dir": str(tmp_path / f"r{s}")}, engine={"executor": "stacked"})
                           for s in (0, 1)])
    assert all(isinstance(r, KeyboardInterrupt) for r in results), results
    for s in (0, 1):
        run = tmp_path / f"r{s}"
        assert not (run / "metrics.jsonl").is_file() or not (run / "metrics.jsonl").read_text().strip()
        assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"


def _stack_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fedrift" and r.getMessage().startswith("stacked runs:")]


@pytest.mark.agreement
def test_stacked_runs_a_failed_client_is_its_runs_alone(tiny, tmp_path, monkeypatch, caplog):
    """Under engine.accept_failures a client that raises is left out of its own run only: the
    stack's round is trained again run by run (said in a line), and each run equals its run alone."""
    real = batched.BatchedExecutor.train_group
    bad = []  # seed 1's first client of round 2: it raises whenever it trains in that round

    def failing(self, parts, batch_size, stop=None, **kw):
        for part in parts:
            if part.round_ == 2 and part.tools.seed == 1:
                bad[:] = bad or [part.jobs[0].client_id]
                if any(j.client_id == bad[0] for j in part.jobs):
                    raise RuntimeError("client failure")
        return real(self, parts, batch_size, stop, **kw)

    monkeypatch.setattr(batched.BatchedExecutor, "train_group", failing)
    sections = {"train": {"rounds": 3}, "engine": {"executor": "stacked", "accept_failures": True}}
    together = run_stacked([tiny(seed=s, output={"dir": str(tmp_path / f"s{s}")}, **sections) for s in (0, 1)])
    assert not any(isinstance(r, BaseException) for r in together)
    # seed 0's run never saw the failure; seed 1's lost one client in round 2 and went on
    assert together[0].summary["clients_failed_total"] == 0
    assert together[1].summary["clients_failed_total"] >= 1
    assert _stack_lines(caplog) == ["stacked runs: round 2: training 2 runs together raised RuntimeError: client failure; "
                                    "this round trains each run alone"]
    monkeypatch.setattr(batched.BatchedExecutor, "train_group", real)
    alone = _alone(tiny, tmp_path, [0], **{"train": {"rounds": 3}})
    agree(alone[0].global_state, together[0].global_state)


@pytest.mark.agreement
def test_stacked_runs_an_error_of_the_stacks_own_trains_the_round_alone_and_says_so(tiny, tmp_path, monkeypatch, stacks,
                                                                                      caplog):
    """The stacked step itself failing (a device out of memory for the whole stack, a bug in
    the stacking) is not a run's failure: that round is trained run by run, a line says so
    (the stack's speed lost, not in silence), later rounds train together again, and the
    results are still the runs alone."""
    real = batched.BatchedExecutor.train_group
    raised = []

    def stack_fails_once(self, parts, batch_size, stop=None, **kw):
        if len({id(p.tools) for p in parts}) > 1 and not raised:  # several runs' clients in one step
            raised.append(1)
            raise RuntimeError("out of memory\n(a device's second line)")
        return real(self, parts, batch_size, stop, **kw)

    monkeypatch.setattr(batched.BatchedExecutor, "train_group", stack_fails_once)
    together = run_stacked(_configs(tiny, tmp_path, (0, 1), train={"rounds": 3}))
    assert raised and [s.rounds_alone for s in stacks] == [1] and stacks[0].rounds_trained == 2
    assert _stack_lines(caplog) == ["stacked runs: round 1: training 2 runs together raised RuntimeError: out of memory; "
                                    "this round trains each run alone"]
    monkeypatch.setattr(batched.BatchedExecutor, "train_group", real)
    for alone, got in zip(_alone(tiny, tmp_path, (0, 1), train={"rounds": 3}), together):
        assert got.summary["status"] == "completed" and got.summary["clients_failed_total"] == 0
        _same_run(alone, got)


def test_stacked_runs_one_diverging_run_ends_alone(tiny, tmp_path):
    """A run that diverges stops as diverged with its metrics kept; the others go on."""
    configs = [tiny(seed=0, train={"rounds": 3, "lr": 0.05}, engine={"executor": "stacked"}, output={"dir": str(tmp_path / "s0")}),
               tiny(seed=1, train={"rounds": 3, "lr": 0.05}, engine={"executor": "stacked"}, output={"dir": str(tmp_path / "s1")})]
    from fedrift.engine import server as server_mod

    real_close = server_mod.Server.close

    def close(self, rnd, outputs, failed, up=None, diverged=()):
        if self.cfg.seed == 1 and rnd.t == 2:
            raise self._diverged(rnd.t, "a test's divergence")
        return real_close(self, rnd, outputs, failed, up, diverged)

    server_mod.Server.close = close
    try:
        together = run_stacked(configs)
    finally:
        server_mod.Server.close = real_close
    assert isinstance(together[1], DivergenceError)
    assert json.loads((tmp_path / "s1" / "summary.json").read_text())["status"] == "diverged"
    assert together[0].summary["status"] == "completed" and together[0].summary["rounds"] == 3


def test_stacked_runs_refuse_runs_that_differ_in_more_than_the_seed_and_values(tiny, tmp_path):
    configs = [tiny(seed=0, engine={"executor": "stacked"}, output={"dir": str(tmp_path / "a")}),
               tiny(seed=1, engine={"executor": "stacked"}, train={"momentum": 0.5}, output={"dir": str(tmp_path / "b")})]
    with pytest.raises(ConfigError, match=r"^engine.executor: stacked runs share how a client trains; train.momentum "
                                          r"differs \(0.9 and 0.5\); allowed: .*partition.\* .*and train.lr; or methods that "
                                          r"all train their clients as FedAvg does \(FedAvgM, FedAdam, FedNova, ...\)$"):
        run_stacked(configs)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # refused before anything is written
    configs = [tiny(seed=s, engine={"executor": "batched"}, output={"dir": str(tmp_path / f"c{s}")}) for s in (0, 1)]
    with pytest.raises(ConfigError, match=r"^engine.executor: batched runs train one by one; allowed: stacked"):
        run_stacked(configs)


@pytest.mark.agreement
def test_a_stack_of_one_is_the_batched_executor(tiny, tmp_path):
    alone = fedrift.run(tiny(engine={"executor": "batched"}, output={"dir": str(tmp_path / "b")}))
    one = fedrift.run(tiny(engine={"executor": "stacked"}, output={"dir": str(tmp_path / "s")}))
    agree(alone.global_state, one.global_state, BITS)


@pytest.mark.agreement
def test_stacked_runs_in_compare_equal_the_runs_one_by_one_and_resume(tiny, tmp_path, stacks):
    """``fedrift compare ... engine.executor=stacked``: a setting's seeds as one stack, and the
    settings that differ only in each run's own keys (the partition's alpha) and values of the
    algorithm's tune space (FedProx's mu) in the same stack; the table as with the runs one by
    one; a second compare reruns nothing."""
    from fedrift.experiments.compare import compare

    base = tiny(train={"rounds": 2})
    base.pop("output")
    kw = dict(algorithms=["fedprox:mu=0.1", "fedprox:mu=0.5"], seeds=[0, 1], report=False, verbose=False,
              sweep={"partition.alpha": [0.3, 1.0]})
    stacked_rows = compare(base, overrides=["engine.executor=stacked"], out=tmp_path / "stacked", **kw)
    alone_rows = compare(base, overrides=["engine.executor=batched"], out=tmp_path / "alone", **kw)
    assert [s.size for s in stacks] == [8] and stacks[0].rounds_trained == 2  # the 8 runs: one stack
    agree([(a["setting"], a["best_accuracy_mean"]) for a in alone_rows],
          [(b["setting"], b["best_accuracy_mean"]) for b in stacked_rows])
    again = compare(base, overrides=["engine.executor=stacked"], out=tmp_path / "stacked", **kw)
    assert len(stacks) == 1  # nothing ran again
    assert again == stacked_rows


def test_stacked_runs_share_one_device_copy_of_their_data():
    """A stack's runs share one dataset; on another device they share one copy of each of its
    tensors (one gather then serves every run's batch), released with the dataset. The meta
    device stands in for a GPU: a copy there is a new tensor, as on CUDA."""
    import gc

    from fedrift.engine.federation import _COPIES, on_device

    x, other = torch.arange(6), torch.arange(6)
    assert on_device(x, "cpu") is x  # already there: no copy
    first, again, apart = on_device(x, "meta"), on_device(x, torch.device("meta")), on_device(other, "meta")
    assert first is again and first.device.type == "meta" and apart is not first
    held = len(_COPIES)
    del x, first, again
    gc.collect()
    assert len(_COPIES) == held - 1  # gone with its source


@pytest.mark.agreement
def test_stacked_runs_of_methods_that_train_clients_as_fedavg_share_one_step(tiny, tmp_path, stacks):
    """FedAvg, FedAvgM, FedAdam and FedNova differ on the server only: in a compare their
    settings' seeds are one stack (each run's server its own), the table as the runs one by
    one; FedProx (another local loss) is refused beside them in one line."""
    from fedrift.experiments.compare import compare

    base = tiny(train={"rounds": 2})
    base.pop("output")
    kw = dict(algorithms=["fedavg", "fedavgm:beta=0.5", "fedadam", "fednova:eta_s=1.5"], seeds=[0, 1], report=False,
              verbose=False)
    stacked_rows = compare(base, overrides=["engine.executor=stacked"], out=tmp_path / "stacked", **kw)
    alone_rows = compare(base, overrides=["engine.executor=batched"], out=tmp_path / "alone", **kw)
    assert [s.size for s in stacks] == [8] and stacks[0].rounds_trained == 2 and stacks[0].rounds_alone == 0
    agree([(a["setting"], a["final_accuracy_mean"]) for a in alone_rows],
          [(b["setting"], b["final_accuracy_mean"]) for b in stacked_rows])
    assert len({r["final_accuracy_mean"] for r in stacked_rows}) > 1  # four methods, not one run four times
    configs = [tiny(seed=0, engine={"executor": "stacked"}, output={"dir": str(tmp_path / "a")}),
               tiny(seed=1, engine={"executor": "stacked"}, algorithm={"name": "fedprox", "mu": 0.1},
                    output={"dir": str(tmp_path / "b")})]
    with pytest.raises(ConfigError, match=r"^engine.executor: stacked runs share how a client trains; algorithm.name "
                                          r"differs \('fedavg' and 'fedprox'\).*or methods that all train their "
                                          r"clients as FedAvg does"):
        run_stacked(configs)
    configs[1] = tiny(seed=1, engine={"executor": "stacked"}, algorithm={"name": "fedavgm"}, train={"momentum": 0.5},
                      output={"dir": str(tmp_path / "b")})
    with pytest.raises(ConfigError, match=r"; train.momentum differs \(0.9 and 0.5\)"):  # not the method, which may
        run_stacked(configs)
