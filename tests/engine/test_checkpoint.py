"""Checkpoints: a run killed with SIGKILL at a random round and resumed ends with the same bits
as a run never stopped; a checkpoint that is corrupt or of another config is refused.

The killed runs are real processes: forked from this one (``sequential``), or a ``fedrift
run`` subprocess (``processes``, whose workers come from a fork server that a forked child
cannot share). Each round of a run to be killed sleeps a little after its metrics line, so the
kill lands mid-run on a busy machine too (sleeping changes no result)."""

import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

import fedrift
from agreement import BITS, agree, untimed
from algorithm_cases import NAMES, case
from conftest import ctrl_c_in_round
from fedrift.engine import outputs
from fedrift.engine.checkpoint import CheckpointError, resumable_keys

ROUNDS = 6
CASES = {  # the algorithms whose state a checkpoint must carry, and where it lives
    "fedavg": {"name": "fedavg"},  # the global model only
    "scaffold": {"name": "scaffold"},  # per-client controls, in the store on disk
    "fedgkd_vote": {"name": "fedgkd_vote", "M": 2, "lam": 0.5},  # the model buffer, the teacher memo
    "fedadc": {"name": "fedadc"},  # server momentum
    "fedproto": {"name": "fedproto", "lam": 1.0},  # personal models
}
_REFERENCE: dict[tuple[str, str], fedrift.RunResult] = {}


def _config(tiny, name, executor, run_dir, **engine):
    engine = {"executor": executor, "threads": 1, "workers": 2, "checkpoint_every": 2, **engine}
    if name == "scaffold":
        engine["client_state"] = "disk"
    return tiny(algorithm=CASES[name], train={"rounds": ROUNDS}, engine=engine, output={"dir": str(run_dir)})


def _reference(tiny, tmp_path, name, executor="sequential"):
    """The uninterrupted run (sequential: processes equals it bit for bit at one thread)."""
    if (name, executor) not in _REFERENCE:
        cfg = _config(tiny, name, executor, tmp_path / "reference", checkpoint_every=0)
        _REFERENCE[name, executor] = fedrift.run(cfg)
    return _REFERENCE[name, executor]


def _slow_run(cfg):
    """A forked child's run: 0.3 s of sleep after each metrics line (two rounds at least are
    left after the kill's round: 0.6 s for the poll to see it on a busy machine)."""
    log = outputs.RunWriter.log

    def slow(self, row):
        log(self, row)
        time.sleep(0.3)

    outputs.RunWriter.log = slow
    fedrift.run(cfg)


SLOW_CLI = (
    "import sys, time\nfrom fedrift.engine import outputs\nlog = outputs.RunWriter.log\n"
    "outputs.RunWriter.log = lambda self, row: (log(self, row), time.sleep(0.3))\n"
    "from fedrift.cli import main\nsys.exit(main(sys.argv[1:]))\n"
)


def _kill_after(proc_pid, is_alive, metrics, k, timeout=120):
    """SIGKILL the run once round ``k``'s metrics line is written."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= k:
            os.kill(proc_pid, signal.SIGKILL)
            return
        assert is_alive(), "the run ended before it could be killed"
        time.sleep(0.005)
    raise AssertionError(f"round {k} never came")


def _ends_as_reference(reference, resumed, run_dir):
    agree(reference.global_state, resumed.global_state, BITS)
    agree(untimed(reference.history), untimed(resumed.history), BITS)
    written = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    agree(untimed(reference.history), untimed(written), BITS)  # no round twice, none torn
    for key in ("final_accuracy", "best_accuracy", "best_round", "rounds", "bytes_down_total", "bytes_up_total"):
        assert resumed.summary[key] == reference.summary[key], key
    assert resumed.summary["status"] == "completed"
    assert not (run_dir / "checkpoint").exists()  # a finished run keeps no checkpoint


@pytest.mark.process
@pytest.mark.agreement
@pytest.mark.parametrize("name", list(CASES))
def test_killed_sequential_run_resumes_to_the_same_bits(tiny, tmp_path, name):
    ref = _reference(tiny, tmp_path, name)
    k = random.Random(f"{name}-sequential").randint(2, ROUNDS - 2)
    run_dir = tmp_path / "killed"
    child = mp.get_context("fork").Process(target=_slow_run, args=(_config(tiny, name, "sequential", run_dir),))
    child.start()
    _kill_after(child.pid, child.is_alive, run_dir / "metrics.jsonl", k)
    child.join()
    assert child.exitcode == -signal.SIGKILL
    assert not (run_dir / "summary.json").exists()
    resumed = fedrift.resume(run_dir)
    start = resumed.summary["resumed_from_round"]
    assert start % 2 == 0 and start >= k - k % 2 - 2  # a checkpoint, at most one older than round k's
    _ends_as_reference(ref, resumed, run_dir)


@pytest.mark.process
@pytest.mark.agreement
@pytest.mark.parametrize("name", ["fedgkd_vote", "scaffold"])
def test_killed_processes_run_resumes_to_the_same_bits(tiny, tmp_path, name):
    """A ``fedrift run`` subprocess killed with SIGKILL; resumed with the processes executor.
    The two whose state the processes executor changes: the workers' teacher memos
    (FedGKD-Vote), the disk store's rows (SCAFFOLD); the other three below (a subprocess
    and its workers cost about 10 s here)."""
    ref = _reference(tiny, tmp_path, name)
    k = random.Random(f"{name}-processes").randint(2, ROUNDS - 2)
    run_dir = tmp_path / "killed"
    (tmp_path / "run.yaml").write_text(json.dumps(_config(tiny, name, "processes", run_dir)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CLI, "run", "-c", str(tmp_path / "run.yaml")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _kill_after(proc.pid, lambda: proc.poll() is None, run_dir / "metrics.jsonl", k)
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err.decode()
    resumed = fedrift.resume(run_dir)
    assert resumed.summary["executor"] == "processes" and resumed.summary["resumed_from_round"] >= 0
    _ends_as_reference(ref, resumed, run_dir)


def _stopped_run(tiny, tmp_path, rounds=4, cfg=None, **engine):
    """A run stopped by Ctrl-C in round 4, with a checkpoint of round 2."""
    run_dir = tmp_path / "stopped"
    cfg = cfg or tiny(train={"rounds": rounds}, engine={"checkpoint_every": 2, **engine}, output={"dir": str(run_dir)})
    with pytest.MonkeyPatch.context() as mp_:
        ctrl_c_in_round(mp_, 4)
        with pytest.raises(KeyboardInterrupt) as info:
            fedrift.run(cfg)
    return cfg, run_dir, info.value


@pytest.mark.process
@pytest.mark.agreement
@pytest.mark.parametrize("executor, name", [("processes", "fedavg"), ("processes", "fedadc"),
                                            ("processes", "fedproto"), ("batched", "fedgkd_vote")])
def test_interrupted_run_resumes_to_the_same_bits(tiny, tmp_path, executor, name):
    """Ctrl-C in round 4, resumed from round 2's checkpoint (batched: against a batched run)."""
    ref = _reference(tiny, tmp_path, name, "batched" if executor == "batched" else "sequential")
    _, run_dir, _ = _stopped_run(tiny, tmp_path, cfg=_config(tiny, name, executor, tmp_path / "stopped"))
    resumed = fedrift.resume(run_dir)
    assert resumed.summary["executor"] == executor and resumed.summary["resumed_from_round"] == 2
    _ends_as_reference(ref, resumed, run_dir)


def test_ctrl_c_inside_a_checkpoint_save_stops_the_run_cleanly(tiny, tmp_path, monkeypatch, capsys):
    """Ctrl-C while torch.save writes a checkpoint: its zip writer's exit raises a RuntimeError
    over the KeyboardInterrupt (seen on a 220 MB SCAFFOLD checkpoint). The run must still stop
    as at any Ctrl-C: one line, exit 130, status interrupted, the last whole checkpoint kept."""
    from fedrift.cli import main
    from fedrift.engine import checkpoint

    real, calls = torch.save, []

    def save(obj, f):
        calls.append(1)
        if len(calls) == 2:  # round 2's checkpoint, as the real writer fails on a Ctrl-C mid-write
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 219838080") from None
        real(obj, f)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    run_dir = tmp_path / "run"
    cfg = tiny(train={"rounds": 4}, engine={"checkpoint_every": 1})
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    assert main(["run", "-c", str(tmp_path / "c.yaml")]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "RuntimeError" not in err and "interrupted in round" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["checkpoint_round"] == 1
    monkeypatch.setattr(checkpoint.torch, "save", real)
    assert fedrift.resume(run_dir).summary["resumed_from_round"] == 1


@pytest.mark.agreement
def test_interrupted_run_writes_its_status_and_points_to_resume(tiny, tmp_path):
    cfg, run_dir, err = _stopped_run(tiny, tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds"] == 3 and summary["checkpoint_round"] == 2
    assert summary["message"].startswith("interrupted in round 4 (metrics up to round 3 kept")
    assert summary["message"].endswith(f"continue with: fedrift run --resume {run_dir}; it continues from the checkpoint of round 2")
    assert err.result.summary == summary
    with pytest.raises(fedrift.ConfigError, match=r"was interrupted after round 3; continue it with fedrift run --resume"):
        fedrift.run(cfg)  # a rerun into the folder
    resumed = fedrift.resume(run_dir)
    whole = fedrift.run({**cfg, "output": {"dir": str(tmp_path / "whole"), "progress": False}})
    assert resumed.summary["resumed_from_round"] == 2
    _ends_as_reference(whole, resumed, run_dir)


def test_checkpoint_of_another_config_is_refused_naming_the_key(tiny, tmp_path):
    _, run_dir, _ = _stopped_run(tiny, tmp_path)
    with pytest.raises(CheckpointError, match=r"another config \(train.lr: 0.05 there, 0.1 here\)"):
        fedrift.resume(run_dir, ["train.lr=0.1"])
    # keys that do not change results may differ
    assert fedrift.resume(run_dir, ["engine.checkpoint_every=1"]).summary["resumed_from_round"] == 2


def test_resumable_keys_say_what_a_resume_may_change():
    """engine.ray_address always; the executor among sequential, processes and ray (and their
    worker count) only where their results are equal: one thread, on the cpu."""
    base = {"engine.executor": "ray", "engine.threads": 1, "engine.device": "cpu", "engine.workers": 2,
            "engine.ray_address": "10.0.0.1:6379", "train.lr": 0.1}
    moved = {**base, "engine.executor": "sequential", "engine.workers": None, "engine.ray_address": None}
    assert resumable_keys(base) == resumable_keys(moved) == resumable_keys({**base, "engine.executor": "processes"})
    assert resumable_keys(base) != resumable_keys({**base, "engine.executor": "batched"})
    assert resumable_keys(base) != resumable_keys({**base, "train.lr": 0.2})
    for other in ({"engine.threads": None}, {"engine.threads": 2}, {"engine.device": "cuda"}):
        assert resumable_keys({**base, **other}) != resumable_keys({**moved, **other}), other


@pytest.mark.process
@pytest.mark.agreement
def test_a_resume_may_change_the_executor_where_results_are_equal(tiny, tmp_path):
    """FedGKD-Vote stopped under processes (its workers' teacher memos in the checkpoint)
    continues under sequential, one thread: the same bits as the run never stopped."""
    ref = _reference(tiny, tmp_path, "fedgkd_vote")
    _, run_dir, _ = _stopped_run(tiny, tmp_path, cfg=_config(tiny, "fedgkd_vote", "processes", tmp_path / "stopped"))
    resumed = fedrift.resume(run_dir, ["engine.executor=sequential"])
    assert resumed.summary["executor"] == "sequential" and resumed.summary["resumed_from_round"] == 2
    _ends_as_reference(ref, resumed, run_dir)


def test_another_executor_is_refused_where_results_could_differ(tiny, tmp_path):
    _, run_dir, _ = _stopped_run(tiny, tmp_path, cfg=_config(tiny, "fedavg", "sequential", tmp_path / "stopped"))
    with pytest.raises(CheckpointError, match=r"another config \(engine.executor: 'sequential' there, 'batched' here\)"):
        fedrift.resume(run_dir, ["engine.executor=batched"])
    with pytest.raises(CheckpointError, match=r"another config \(engine.executor: 'sequential' there, 'processes' here\)"):
        fedrift.resume(run_dir, ["engine.executor=processes", "engine.threads=2"])
    # the executor is the same; the key that changed is named, not the executor (issue 52)
    with pytest.raises(CheckpointError, match=r"another config \(engine.threads: 1 there, 2 here\)"):
        fedrift.resume(run_dir, ["engine.threads=2"])


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest"])
def test_corrupt_checkpoint_is_refused_and_nothing_is_written(tiny, tmp_path, damage):
    _, run_dir, _ = _stopped_run(tiny, tmp_path)
    state = run_dir / "checkpoint" / "state-r000002.pt"
    data = state.read_bytes()
    if damage == "truncate":
        state.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        state.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:
        (run_dir / "checkpoint" / "manifest.json").write_text('{"round": 2, "files"')
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    with pytest.raises(CheckpointError, match="the checkpoint is corrupt"):
        fedrift.resume(run_dir)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_resume_refuses_a_finished_run_and_a_folder_without_one(tiny, tmp_path):
    cfg = tiny()
    fedrift.run(cfg)
    with pytest.raises(fedrift.ConfigError, match="has completed; there is nothing to continue"):
        fedrift.resume(cfg["output"]["dir"])
    with pytest.raises(fedrift.ConfigError, match="holds no run"):
        fedrift.resume(tmp_path / "nowhere")


def _ctrl_c_while_training(monkeypatch, k):
    """Runs stop as at Ctrl-C while round ``k``'s clients train (before its aggregation)."""
    from fedrift.engine import loop

    train = loop.train_clients

    def stop(executor, tools, payload, jobs, t, *args):
        if t == k:
            raise KeyboardInterrupt
        return train(executor, tools, payload, jobs, t, *args)

    monkeypatch.setattr(loop, "train_clients", stop)
    return lambda: monkeypatch.setattr(loop, "train_clients", train)


@pytest.mark.agreement
@pytest.mark.parametrize("name", ["fedavg", "fedgkd_vote", "fedproto"])
def test_a_stop_saves_the_last_whole_round_whatever_checkpoint_every_says(tiny, tmp_path, name, monkeypatch):
    """Ctrl-C (a budget's stop, SIGTERM) while round 4 trains, with no periodic checkpoint
    (checkpoint_every 0): round 3's checkpoint is saved at the stop, the summary and its line
    say so, and the resumed run ends with the same bits as one never stopped."""
    cfg = lambda d: _config(tiny, name, "sequential", tmp_path / d, checkpoint_every=0)  # noqa: E731
    whole = fedrift.run(cfg("whole"))
    undo = _ctrl_c_while_training(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        fedrift.run(cfg("stopped"))
    undo()
    summary = json.loads((tmp_path / "stopped" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["checkpoint_round"] == 3
    assert summary["message"].endswith("it continues from the checkpoint of round 3")
    assert summary["run_seconds"] >= summary["setup_seconds"] > 0
    start = time.perf_counter()
    resumed = fedrift.resume(tmp_path / "stopped")
    own = time.perf_counter() - start
    assert resumed.summary["resumed_from_round"] == 3
    _ends_as_reference(whole, resumed, tmp_path / "stopped")
    assert resumed.summary["run_seconds"] > own  # the earlier call's time, to its checkpoint, counts too


def test_no_checkpoint_yet_runs_again_from_round_one(tiny, tmp_path):
    """Ctrl-C in round 4's metrics line: its state changed already (neither round 3's nor whole),
    so the stop saves no checkpoint of it, and with none periodic the resume starts afresh."""
    cfg, run_dir, _ = _stopped_run(tiny, tmp_path, checkpoint_every=0)
    assert not (run_dir / "checkpoint").exists()
    resumed = fedrift.resume(run_dir)
    assert resumed.summary["resumed_from_round"] == 0
    assert [r["round"] for r in resumed.history] == [1, 2, 3, 4]
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 4


def _stop_in_3_and_resume(monkeypatch, tmp_path, cfg):
    """``cfg(folder, checkpoint_every)`` run whole, and stopped in round 3 then resumed from
    round 2's checkpoint: the same bits."""
    whole = fedrift.run(cfg("whole", 0))
    undo = ctrl_c_in_round(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        fedrift.run(cfg("stopped", 2))
    undo()
    resumed = fedrift.resume(tmp_path / "stopped")
    assert resumed.summary["resumed_from_round"] == 2
    _ends_as_reference(whole, resumed, tmp_path / "stopped")
    return whole, resumed


@pytest.mark.agreement
@pytest.mark.parametrize("name", [n for n in NAMES if n not in CASES])
def test_every_other_algorithm_resumes_to_the_same_bits(tiny, tmp_path, name, monkeypatch):
    """Ctrl-C in round 3 and resume from round 2's checkpoint, for every registered algorithm
    not killed above: whatever it keeps between rounds (FedGen's generator, MOON's previous
    models, SlowMo's momentum, ...) is in the server or client state, and loads back."""
    sections = case(name)
    cfg = lambda d, every: tiny(**sections, train={"rounds": 3}, output={"dir": str(tmp_path / d)},  # noqa: E731
                                engine={"executor": "sequential", "checkpoint_every": every})
    _stop_in_3_and_resume(monkeypatch, tmp_path, cfg)


@pytest.mark.agreement
@pytest.mark.parametrize("level", ["client", "sample"])
def test_resume_with_failures_and_privacy_to_the_same_bits(tiny, tmp_path, level, monkeypatch):
    """Dropout, stragglers and DP noise are drawn per (seed, round, client): nothing to save;
    the privacy accountant composes the checkpoint's rounds again, so epsilon continues exactly."""
    cfg = lambda d, every: tiny(  # noqa: E731
        train={"rounds": 3}, output={"dir": str(tmp_path / d)}, privacy={"level": level, "noise_multiplier": 0.8},
        engine={"executor": "sequential", "checkpoint_every": every, "dropout": 0.3, "stragglers": 0.5})
    whole, resumed = _stop_in_3_and_resume(monkeypatch, tmp_path, cfg)
    assert resumed.history[-1]["epsilon"] > 0
    assert resumed.summary["epsilon"] == whole.summary["epsilon"]
