"""fedrift compare: grid expansion, validation before running, resumption, parallel jobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import fedrift
from fedrift.cli import main
from fedrift.experiments.grid import build_grid, parse_grid_tokens
from fedrift.overrides import split_list
from fedrift.errors import ConfigError

from conftest import grid_config

import fedrift.experiments.grid as grid_mod


def test_split_list_respects_brackets():
    assert split_list("0.1,0.5,1") == ["0.1", "0.5", "1"]
    assert split_list("[64,64],[32]") == ["[64,64]", "[32]"]
    assert split_list("[0.1, 0.5]") == ["0.1", "0.5"]
    tokens = parse_grid_tokens(["algorithms=fedavg,fedprox:mu=0.1", "seeds=0,1", "sweep.model.hidden=[64,64],[32]",
                                "report.at_rounds=1,2", "train.rounds=2"])
    assert tokens["algorithms"] == ["fedavg", "fedprox:mu=0.1"] and tokens["seeds"] == [0, 1]
    assert tokens["sweep"] == {"model.hidden": ["[64,64]", "[32]"]}
    assert tokens["report"] == {"at_rounds": "1,2"} and tokens["overrides"] == ["train.rounds=2"]


def test_grid_expansion(tmp_path):
    grid = build_grid(grid_config(tmp_path), algorithms=["fedavg", "fedprox:mu=0.1"], seeds=[0, 1],
                      sweep={"partition.alpha": ["0.1", "1.0"]}, overrides=["train.rounds=1"], out=tmp_path / "g")
    assert not (tmp_path / "g").exists()  # expanding and validating writes nothing
    assert [s.label for s in grid.settings] == ["fedavg alpha=0.1", "fedprox:mu=0.1 alpha=0.1",
                                                "fedavg alpha=1.0", "fedprox:mu=0.1 alpha=1.0"]
    assert len(grid.runs) == 8 and len({r.dir for r in grid.runs}) == 8
    run = next(r for r in grid.runs if r.setting.algorithm == "fedprox:mu=0.1" and r.seed == 1
               and dict(r.setting.sweep) == {"partition.alpha": 1.0})
    assert run.dir == tmp_path / "g" / "fedprox-mu=0.1_alpha=1.0" / "seed1"
    assert run.doc["algorithm"] == {"name": "fedprox", "mu": 0.1}
    assert run.doc["seed"] == 1 and run.doc["partition"]["alpha"] == 1.0 and run.doc["train"]["rounds"] == 1
    assert run.doc["output"] == {"dir": str(run.dir), "overwrite": True, "progress": False}
    assert run.expected["algorithm.mu"] == 0.1 and run.expected["algorithm.aggregation"] == "samples"


def test_an_entry_may_set_other_config_keys_for_its_own_runs(tmp_path):
    grid = build_grid(grid_config(tmp_path), algorithms=["fedavg", "moon:mu=5:model.projection_dim=16"], seeds=[0],
                      out=tmp_path / "g")
    docs = {r.setting.algorithm: r.doc for r in grid.runs}
    assert docs["moon:mu=5:model.projection_dim=16"]["model"]["projection_dim"] == 16
    assert docs["moon:mu=5:model.projection_dim=16"]["algorithm"] == {"name": "moon", "mu": 5}
    assert "projection_dim" not in docs["fedavg"]["model"]
    with pytest.raises(ConfigError, match="section"):
        build_grid(grid_config(tmp_path), algorithms=["moon:output.dir=x"], seeds=[0], out=tmp_path / "h")


def test_config_files_algorithm_options_stay_with_that_algorithm(tmp_path):
    cfg = grid_config(tmp_path, algorithm={"name": "fedprox", "mu": 0.05})
    grid = build_grid(cfg, algorithms=["fedavg", "fedprox"], seeds=[0], overrides=["algorithm.aggregation=uniform"],
                      out=tmp_path / "g")
    docs = {r.setting.algorithm: r.doc["algorithm"] for r in grid.runs}
    assert docs["fedavg"] == {"name": "fedavg", "aggregation": "uniform"}
    assert docs["fedprox"] == {"name": "fedprox", "mu": 0.05, "aggregation": "uniform"}


@pytest.mark.parametrize(
    "args, key",
    [
        (["train.colour=red"], "train.colour"),
        (["algorithms=fedavg,fedsomething"], "algorithm.name"),
        (["sweep.partition.alpha=0.5,0"], "partition.alpha"),
        (["sweep.partition.num_clients=6,5000"], "partition.num_clients"),
        (["seeds=0,x"], "seeds"),
        (["algorithms=fedavg,fedavg"], "algorithms"),
        (["report.colour=red"], "report.colour"),
        (["report.target=fedavg:lots"], "report.target"),
        (["output.dir=elsewhere"], "output.dir"),
        (["algorithms=fedprox:mu"], "algorithms"),
        (["report.tsne=fedgkd"], "report.tsne"),
        (["algorithms=fedprox", "report.target=fedavg:0.9"], "report.target"),
        (["algorithms=fedavg,feddf"], "partition.holdout"),  # needs the model and algorithm built
        (["algorithms=fedavg,moon"], "model.projection_dim"),
        (["algorithms=fedproto", "eval.drift=true"], "eval.drift"),
    ],
)
def test_bad_grid_fails_at_once_with_one_line(capsys, tmp_path, args, key):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(grid_config(tmp_path)))
    code = main(["compare", "-c", str(cfg), "--out", str(tmp_path / "g"), "seeds=0", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedrift: error: ") and key in lines[0], err
    assert not (tmp_path / "g").exists()  # refused before any run


def _mtimes(run_dir):
    return {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}


def test_interrupted_grid_resumes_without_repeating_finished_runs(tmp_path, monkeypatch):
    cfg = grid_config(tmp_path)
    kwargs = dict(algorithms=["fedavg", "fedprox"], seeds=[0, 1], out=tmp_path / "g", report=False, verbose=False)
    real = grid_mod.execute_run
    calls = []

    def stop_on_second(doc, resume=False):
        calls.append(doc["output"]["dir"])
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C during the second run
        return real(doc, resume)

    monkeypatch.setattr(grid_mod, "execute_run", stop_on_second)
    with pytest.raises(KeyboardInterrupt):
        fedrift.compare(cfg, **kwargs)
    first = tmp_path / "g" / "fedavg" / "seed0"
    assert json.loads((first / "summary.json").read_text())["status"] == "completed"
    before = _mtimes(first)

    calls.clear()
    monkeypatch.setattr(grid_mod, "execute_run", lambda doc, resume=False: (calls.append(doc["output"]["dir"]), real(doc, resume))[1])
    rows = fedrift.compare(cfg, **kwargs)
    assert str(first) not in calls and len(calls) == 3  # the finished run is not repeated
    assert _mtimes(first) == before
    assert [r["completed"] for r in rows] == [2, 2]

    calls.clear()
    fedrift.compare(cfg, **kwargs)  # everything finished: nothing runs
    assert calls == []


@pytest.mark.process
def test_killed_process_resumes(tmp_path):
    """A real interruption: the CLI process is killed after its first run finished (runs
    long enough that a busy machine cannot finish them all unseen)."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(grid_config(tmp_path, train={"rounds": 30})))
    root = tmp_path / "g"
    args = ["compare", "-c", str(cfg), "--out", str(root), "algorithms=fedavg,fedprox", "seeds=0,1", "--no-report"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-m", "fedrift.cli", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list(root.glob("*/seed*/summary.json")):
            assert proc.poll() is None, "compare ended before it was killed"
            assert time.monotonic() < deadline, "no run finished in 120 s"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    finished = sorted(p.parent for p in root.glob("*/seed*/summary.json"))
    assert 1 <= len(finished) < 4
    before = {d: _mtimes(d) for d in finished}

    calls = []
    real = grid_mod.execute_run
    try:
        grid_mod.execute_run = lambda doc, resume=False: (calls.append(doc["output"]["dir"]), real(doc, resume))[1]
        assert main(args) == 0
    finally:
        grid_mod.execute_run = real
    assert len(calls) == 4 - len(finished)
    assert all(_mtimes(d) == before[d] for d in finished)
    assert len(list(root.glob("*/seed*/summary.json"))) == 4


def _session_alive(sid: int) -> list[str]:
    """The processes of session ``sid`` that are not zombies ("pid name state"), from /proc
    (Linux, as the suite's other process checks: the CLI's signal masks, Ray's and Flower's
    leftover processes)."""
    assert Path("/proc/self/stat").is_file(), "no /proc here: the processes a compare leaves cannot be listed"
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # it ended while we looked
            continue
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if int(rest[3]) == sid and rest[0] != "Z":  # fields after the name: state ppid pgrp session
            out.append(f"{stat.parent.name} {name} {rest[0]}")
    return out


@pytest.mark.process
def test_a_killed_parallel_compare_leaves_no_worker_running(tmp_path, capsys):
    """`compare --jobs 2` killed with SIGKILL while both workers train: the workers stop too
    (their lifeline closes) instead of finishing runs nobody waits for, and the next compare
    continues those runs and reuses the finished ones."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(grid_config(tmp_path, train={"rounds": 100}, engine={"checkpoint_every": 1})))
    root = tmp_path / "g"
    args = ["compare", "-c", str(cfg), "--out", str(root), "algorithms=fedavg,fedprox", "seeds=0", "--jobs", "2",
            "--no-report"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-m", "fedrift.cli", *args], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len([m for m in root.glob("*/seed0/metrics.jsonl") if m.read_text().count("\n") >= 2]) < 2:
            assert proc.poll() is None, "compare ended before it was killed"
            assert time.monotonic() < deadline, "the two runs did not both start training in 120 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while (alive := _session_alive(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for line in alive:  # a failure leaves nothing running behind it
        os.kill(int(line.split()[0]), signal.SIGKILL)
    assert not alive, f"still running 30 s after the compare was killed: {alive}"
    stopped = [m.parent for m in root.glob("*/seed0/metrics.jsonl") if not (m.parent / "summary.json").exists()]
    assert stopped  # both, unless a busy machine let one finish while the other started

    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("continued from its checkpoint") == len(stopped), out
    assert [json.loads(p.read_text())["status"] for p in root.glob("*/seed0/summary.json")] == ["completed"] * 2


@pytest.mark.process
@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "process"])
def test_ctrl_c_on_a_parallel_compare_records_its_runs_as_interrupted(tmp_path, terminal):
    """Ctrl-C on `compare --jobs 2` with 4 runs, while the first two train: a terminal's
    (SIGINT to the whole foreground group) or `kill -INT` to the compare alone. No run starts
    after the signal (two are queued), each running run's summary says interrupted, one line
    on stderr within seconds (not after the 10 s grace), exit 130, and no process is left."""
    from conftest import ctrl_c_cli

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(grid_config(tmp_path, train={"rounds": 100000}, engine={"checkpoint_every": 1})))
    root = tmp_path / "g"
    started: list[Path] = []

    def both_train() -> bool:  # the runs that exist when the signal goes
        started[:] = sorted(p.parent for p in root.glob("*/seed*/config.yaml"))
        return len([m for m in root.glob("*/seed*/metrics.jsonl") if m.read_text().count("\n") >= 2]) >= 2

    r = ctrl_c_cli(["compare", "-c", str(cfg), "--out", str(root), "algorithms=fedavg,fedprox", "seeds=0,1",
                    "--jobs", "2", "--no-report"], both_train, terminal)
    assert r.code == 130 and r.err.strip().splitlines() == [
        "fedrift: interrupted; the runs in progress were stopped and recorded as interrupted; run the same fedrift "
        "compare command again to continue (finished runs are kept, stopped ones continue from their checkpoints)"], r.err
    assert r.line_s < 8.0, f"the line came {r.line_s:.1f} s after the signal (exit after {r.exit_s:.1f} s)"
    assert r.exit_s < 30.0, f"exit {r.exit_s:.1f} s after the signal"  # the rest: a torch process's own teardown
    runs = sorted(p.parent for p in root.glob("*/seed*/config.yaml"))
    assert runs == started and len(runs) == 2, (runs, started)  # the queued runs never started
    assert [json.loads((d / "summary.json").read_text())["status"] for d in runs] == ["interrupted"] * 2
    _none_left(r.pid)


def _none_left(sid: int) -> None:
    """No process of session ``sid`` (a Ctrl-C'd command's) is left 30 s after the signal;
    any that is, is killed and named."""
    deadline = time.monotonic() + 30
    while (alive := _session_alive(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for line in alive:
        os.kill(int(line.split()[0]), signal.SIGKILL)
    assert not alive, f"still running 30 s after the Ctrl-C: {alive}"


@pytest.mark.process
def test_ctrl_c_on_a_parallel_compare_of_stacks_records_their_runs_as_interrupted(tmp_path):
    """The same with each setting's seeds one stack (``engine.executor: stacked``: a pool
    task a stack, its runs threads of one worker): the pool's stop interrupts the stack, and
    every run of both stacks writes its interrupted summary within the grace (before, the stack
    did not hear the stop: its worker was ended after the grace, the runs said nothing)."""
    from conftest import ctrl_c_cli

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(grid_config(tmp_path, train={"rounds": 100000},
                                              engine={"checkpoint_every": 1, "executor": "stacked"})))
    root = tmp_path / "g"

    def all_train() -> bool:
        return len([m for m in root.glob("*/seed*/metrics.jsonl") if m.read_text().count("\n") >= 2]) >= 4

    r = ctrl_c_cli(["compare", "-c", str(cfg), "--out", str(root), "algorithms=fedavg,fedprox", "seeds=0,1",
                    "--jobs", "2", "--no-report"], all_train, terminal=False)
    assert r.code == 130 and "recorded as interrupted" in r.err, r.err
    runs = sorted(p.parent for p in root.glob("*/seed*/config.yaml"))
    assert len(runs) == 4 and [json.loads((d / "summary.json").read_text())["status"] for d in runs
                               if (d / "summary.json").is_file()] == ["interrupted"] * 4, r.err
    assert r.exit_s < 30.0, f"exit {r.exit_s:.1f} s after the signal"
    _none_left(r.pid)


def test_an_older_runs_relative_data_root_is_the_same_folder_seen_from_here(tmp_path, monkeypatch):
    """A run folder written before data.root was stored absolute holds the relative root: the
    same run when it names the same folder from where compare runs, another one elsewhere."""
    from fedrift.experiments.grid import config_differences

    (tmp_path / "d").mkdir()
    monkeypatch.chdir(tmp_path)
    assert config_differences({"data.root": "d", "seed": 0}, {"data.root": str(tmp_path / "d"), "seed": 0}, []) == []
    monkeypatch.chdir(tmp_path / "d")
    assert config_differences({"data.root": "d"}, {"data.root": str(tmp_path / "d")}, []) == [
        f"data.root: 'd' -> {str(tmp_path / 'd')!r}"]


def test_stopped_run_continues_from_its_checkpoint(tmp_path, capsys, monkeypatch):
    """Ctrl-C in round 4 of a run (checkpoint of round 2): the next compare continues it from
    round 3, to the bits of a run never stopped; a checkpoint of another config is not used."""
    from conftest import ctrl_c_in_round

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(grid_config(tmp_path, train={"rounds": 5}, engine={"checkpoint_every": 2})))
    base = ["compare", "-c", str(cfg), "--out", str(tmp_path / "g"), "seeds=0", "--no-report"]
    undo = ctrl_c_in_round(monkeypatch, 4)
    assert main(base) == 130
    assert "run the same fedrift compare command again to continue" in capsys.readouterr().err
    undo()
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "fedavg/seed0: was interrupted after round 3, continued from its checkpoint" in out
    run = tmp_path / "g" / "fedavg" / "seed0"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from_round"] == 2 and summary["status"] == "completed"
    whole = fedrift.run({**grid_config(tmp_path, train={"rounds": 5}), "output": {"dir": str(tmp_path / "w"), "progress": False}})
    assert torch.equal(torch.load(run / "final_model.pt")["layers.0.weight"], whole.global_state["layers.0.weight"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["test_loss"] for r in rows] == [r["test_loss"] for r in whole.history]

    # stopped again, then the config changes: its checkpoint is named and not used
    undo = ctrl_c_in_round(monkeypatch, 4)
    assert main([*base, "train.lr=0.1"]) == 130
    undo()
    capsys.readouterr()
    assert main([*base, "train.lr=0.2"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint not used (" in out and "another config (train.lr: 0.1 there, 0.2 here)" in out
    assert "resumed_from_round" not in json.loads((run / "summary.json").read_text())  # ran from round 1


def test_changed_config_reruns_and_says_why(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(grid_config(tmp_path)))
    base = ["compare", "-c", str(cfg), "--out", str(tmp_path / "g"), "seeds=0", "--no-report"]
    assert main(base) == 0
    run = tmp_path / "g" / "fedavg" / "seed0"
    stamp = _mtimes(run)
    capsys.readouterr()
    # how a run executes does not make it another run
    assert main([*base, "engine.executor=batched", "engine.threads=1", "eval.batch_size=64"]) == 0
    assert "0 to run" in capsys.readouterr().out and _mtimes(run) == stamp
    # a clone of committed results keeps no models (benchmarks/results/.gitignore): still reused
    (run / "final_model.pt").unlink()
    assert main([*base, "engine.executor=batched"]) == 0
    assert "0 to run" in capsys.readouterr().out and not (run / "final_model.pt").exists()
    assert main([*base, "train.rounds=3"]) == 0
    out = capsys.readouterr().out
    assert "config changed (train.rounds: 2 -> 3), rerun" in out and "1 to run" in out
    assert json.loads((run / "summary.json").read_text())["rounds"] == 3


def test_diverged_run_is_reported_and_not_rerun(tmp_path):
    cfg = grid_config(tmp_path)
    kwargs = dict(algorithms=["fedavg"], seeds=[0], sweep={"train.lr": [0.05, 1e8]}, out=tmp_path / "g",
                  report=False, verbose=False)
    rows = fedrift.compare(cfg, **kwargs)
    assert [(r["completed"], r["diverged"]) for r in rows] == [(1, 0), (0, 1)]
    assert rows[1]["best_accuracy_mean"] is None
    calls = []
    real = grid_mod.execute_run
    try:
        grid_mod.execute_run = lambda doc: (calls.append(doc), real(doc))[1]
        fedrift.compare(cfg, **kwargs)
    finally:
        grid_mod.execute_run = real
    assert calls == []


@pytest.mark.process
def test_parallel_jobs_give_the_serial_results(tmp_path):
    cfg = grid_config(tmp_path)
    kwargs = dict(algorithms=["fedavg", "fedprox"], seeds=[0], report=False, verbose=False)
    serial = fedrift.compare(cfg, out=tmp_path / "s", jobs=1, **kwargs)
    parallel = fedrift.compare(cfg, out=tmp_path / "p", jobs=2, **kwargs)
    for a, b in zip(serial, parallel):
        assert a["best_accuracy_mean"] == b["best_accuracy_mean"] and a["final_accuracy_mean"] == b["final_accuracy_mean"]
    for name in ("fedavg", "fedprox"):
        s, p = tmp_path / "s" / name / "seed0", tmp_path / "p" / name / "seed0"
        acc = lambda d: [json.loads(x)["test_accuracy"] for x in (d / "metrics.jsonl").read_text().splitlines()]
        assert acc(s) == acc(p)
        ws, wp = torch.load(s / "final_model.pt"), torch.load(p / "final_model.pt")
        assert all(torch.equal(ws[k], wp[k]) for k in ws)
        assert yaml.safe_load((p / "config.yaml").read_text())["engine"]["workers"] == 1


def test_top_level_names_survive_submodule_imports():
    import fedrift.report.plots as plots  # the package is not shadowed by a function

    assert callable(fedrift.write_report) and callable(fedrift.compare) and callable(plots.learning_curves)


def test_jobs_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="jobs"):
        fedrift.compare(grid_config(tmp_path), out=tmp_path / "g", jobs=0)
