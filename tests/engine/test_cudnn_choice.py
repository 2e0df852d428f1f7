"""``engine.cudnn_benchmark``: cuDNN's convolution algorithms timed, not picked by heuristics
(``torch.backends.cudnn.benchmark``), for a run's duration. The flag is the process's: a run
sets it and gives it back, however it ends; stacked runs (threads of one process) keep it
until the last has ended; a worker's process keeps its run's. Its effect (a GPU's kernels) is
measured by ``benchmarks/step_kernels.py --cudnn-benchmark``, not here."""

import pytest
import torch

import fedrift
from agreement import BITS, agree
from fedrift.api import prepare
from fedrift.engine.build import client_tools
from fedrift.engine.checkpoint import resumable_keys


@pytest.fixture
def flag():
    """torch's flag, put back after the test whatever it did."""
    before = torch.backends.cudnn.benchmark
    yield
    torch.backends.cudnn.benchmark = before


@pytest.mark.parametrize("value", [True, False])
def test_a_run_holds_its_value_and_gives_the_flag_back(tiny, flag, value):
    torch.backends.cudnn.benchmark = not value
    seen = []
    fedrift.run(tiny(engine={"cudnn_benchmark": value}), on_round=lambda row: seen.append(torch.backends.cudnn.benchmark))
    assert seen == [value, value]  # both rounds
    assert torch.backends.cudnn.benchmark is (not value)


def test_a_run_that_stops_gives_the_flag_back(tiny, flag):
    torch.backends.cudnn.benchmark = False

    def stop(row):
        raise RuntimeError("stopped by the test")

    with pytest.raises(RuntimeError, match="stopped by the test"):
        fedrift.run(tiny(engine={"cudnn_benchmark": True}), on_round=stop)
    assert torch.backends.cudnn.benchmark is False


def test_stacked_runs_keep_the_flag_until_the_last_has_ended(tiny, tmp_path, flag, monkeypatch):
    """Run 0 ends in round 1 (its ``on_round`` raises: that run alone ends); run 1 goes on to
    round 3 with the flag still set, and the flag is given back once both have ended. Each run
    sets and gives back the flag itself too: the stack's caller sets it before any run starts,
    so that each run finds the value already set and gives back that value (were the first run
    to start to find the flag off, its end would turn it off under the others: checked at each
    run's start, which does not depend on the order the threads run in)."""
    from fedrift.experiments import stacked
    from fedrift.experiments.stacked import prepare_stack, stacked_outcomes

    torch.backends.cudnn.benchmark = False
    seen: list[bool] = []
    at_start: list[bool] = []
    run_prepared = stacked.run_prepared

    def starting(*args, **kwargs):
        at_start.append(torch.backends.cudnn.benchmark)
        return run_prepared(*args, **kwargs)

    monkeypatch.setattr(stacked, "run_prepared", starting)

    def stop(row):
        raise RuntimeError("run 0 stops")

    preps = prepare_stack([tiny(seed=s, engine={"executor": "stacked", "cudnn_benchmark": True}, train={"rounds": 3},
                                output={"dir": str(tmp_path / f"s{s}"), "progress": False}) for s in (0, 1)])
    out, stopped = stacked_outcomes(preps, on_round=[stop, lambda row: seen.append(torch.backends.cudnn.benchmark)])
    assert not stopped and isinstance(out[0], RuntimeError) and not isinstance(out[1], BaseException)
    assert seen == [True, True, True] and at_start == [True, True]
    assert torch.backends.cudnn.benchmark is False


def test_a_workers_process_keeps_its_runs_value(tiny, flag):
    """``client_tools`` (a ``processes`` worker's, a Ray actor's build of the run) sets it."""
    torch.backends.cudnn.benchmark = False
    client_tools(prepare(tiny(engine={"cudnn_benchmark": True})))
    assert torch.backends.cudnn.benchmark is True


def test_a_checkpoint_from_before_the_key_resumes_with_heuristics():
    """Manifests written before the key existed hold its default then (false); on the CPU at one
    thread, under the executors equal there, it may differ (it changes nothing on a CPU)."""
    old = {"engine.executor": "batched", "engine.device": "cuda", "seed": 0}
    assert resumable_keys(old) == resumable_keys({**old, "engine.cudnn_benchmark": False})
    assert resumable_keys(old) != resumable_keys({**old, "engine.cudnn_benchmark": True})
    cpu = {"engine.executor": "sequential", "engine.device": "cpu", "engine.threads": 1, "seed": 0}
    assert resumable_keys(cpu) == resumable_keys({**cpu, "engine.cudnn_benchmark": True})


@pytest.mark.agreement
def test_on_a_cpu_it_changes_nothing(tiny, tmp_path, flag):
    """The flag is cuDNN's: a CPU run with it ends where one without it does, bit for bit."""
    runs = [fedrift.run(tiny(engine={"cudnn_benchmark": v}, output={"dir": str(tmp_path / str(v))})) for v in (False, True)]
    agree(runs[1].global_state, runs[0].global_state, BITS)
