"""fedrift study: a study file's tunes and runs in order, resumed after SIGKILL and a budget stop
with the same results, an entry added or changed (only it reruns), status, bad files refused,
and a study over committed benchmark results that reruns nothing."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import fedrift.api
from fedrift.cli import main
from fedrift.experiments.study_run import run_study
from fedrift.experiments.study_status import study_status

from agreement import BITS, agree
from conftest import grid_config

REPO = Path(__file__).resolve().parents[2]
ENTRIES = ["fedavg", "fedprox:mu=0.01", {"entry": "fedavgm", "tune": False}]


def write_study(folder: Path, entries=None, **changes) -> Path:
    """A study of 3 entries x 2 seeds on the tiny config (digits): two of them tuned on a grid
    of two learning rates at 2 rounds, the runs at 3 rounds (so a seed-0 run is not a trial)."""
    folder.mkdir(parents=True, exist_ok=True)
    base = grid_config(folder, partition={"val_share": 0.2}, train={"rounds": 3})
    (folder / "base.yaml").write_text(yaml.safe_dump(base))
    doc = {"base": "base.yaml", "entries": entries if entries is not None else ENTRIES, "seeds": [0, 1],
           "tune": {"space": {"train.lr": [0.02, 0.1]}, "rounds": 2, "trials": 2},
           "report": {"claims": ["fedprox>fedavg"], "tsne": "none", "paper": "fedgkd-table3-cifar10"}, "out": "out",
           **changes}
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def results(out: Path) -> dict[str, object]:
    """Every run's final accuracy, every completed trial's score at its point, the tuned values:
    what must not depend on whether the study was stopped on the way (a trial's number may: a
    trial killed running is run again under the next number)."""
    found: dict[str, object] = {}
    for p in sorted((out / "runs").glob("*/seed*/summary.json")):
        s = json.loads(p.read_text())
        found[str(p.parent.relative_to(out))] = (s["status"], round(s["final_accuracy"], 12))
    with open(out / "tune" / "trials.csv") as f:
        found["trials"] = sorted((r["entry"], r["train.lr"], r["val_accuracy"]) for r in csv.DictReader(f)
                                 if r["state"] == "complete")
    best = yaml.safe_load((out / "tune" / "best.yaml").read_text())
    found["best"] = {k: v["overrides"] for k, v in best.items()}
    return found


def mtimes(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.glob("**/summary.json")}


@pytest.fixture
def calls(monkeypatch):
    """The output folders of the runs and trials started, in order."""
    started: list[str] = []
    real = fedrift.api.run

    def recorded(config, *args, **kwargs):
        started.append(str(config["output"]["dir"]))
        return real(config, *args, **kwargs)

    monkeypatch.setattr(fedrift.api, "run", recorded)
    return started


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """The study run once, from start to end, never stopped: what the others are checked
    against; ``started.txt`` lists the runs and trials it started, in order."""
    folder = tmp_path_factory.mktemp("finished")
    started: list[str] = []
    real = fedrift.api.run

    def recorded(config, *args, **kwargs):
        started.append(str(config["output"]["dir"]))
        return real(config, *args, **kwargs)

    fedrift.api.run = recorded
    try:
        outcome = run_study(write_study(folder), verbose=False)
    finally:
        fedrift.api.run = real
    assert outcome.finished and not outcome.budget_hit
    (folder / "started.txt").write_text("\n".join(str(Path(c).relative_to(folder / "out")) for c in started))
    return folder


def copy(finished: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished, tmp_path / "s")
    return tmp_path / "s"


def test_the_order_is_most_informative_first_and_a_rerun_runs_nothing(finished, tmp_path, calls):
    assert (finished / "started.txt").read_text().splitlines() == [
        "tune/trials/fedavg/trial0", "tune/trials/fedavg/trial1", "runs/fedavg/seed0",
        "tune/trials/fedprox-mu=0.01/trial0", "tune/trials/fedprox-mu=0.01/trial1", "runs/fedprox-mu=0.01/seed0",
        "runs/fedavgm/seed0", "runs/fedavg/seed1", "runs/fedprox-mu=0.01/seed1", "runs/fedavgm/seed1"]
    out = finished / "out"
    values = yaml.safe_load((out / "tune" / "study-best.yaml").read_text())
    assert values["fedavgm"] == {"overrides": {}, "base": {}}  # not tuned: the config's values, not fedavg's
    assert yaml.safe_load((out / "runs" / "fedavgm" / "seed0" / "config.yaml").read_text())["train"]["lr"] == 0.05
    tuned = values["fedavg"]["overrides"]["train.lr"]
    assert yaml.safe_load((out / "runs" / "fedavg" / "seed1" / "config.yaml").read_text())["train"]["lr"] == tuned
    assert "algorithm.mu" not in values["fedprox:mu=0.01"]["overrides"]  # the entry fixes mu: not tuned

    folder = copy(finished, tmp_path)
    before = mtimes(folder / "out")
    assert run_study(folder / "study.yaml", verbose=False, report=False).finished
    assert calls == [] and mtimes(folder / "out") == before


def test_the_report_has_the_table_and_the_claims(finished):
    runs = finished / "out" / "runs"
    for name in ("report.html", "results.md", "claims.md", "study.md", "compare.json"):
        assert (runs / name).is_file(), name
    page = (runs / "study.md").read_text()
    assert "fedrift study run" in page and "## Results" in page and "## Claims" in page
    assert "fedprox:mu=0.01 > fedavg" in page
    assert "worst 10% local %" in page and "worst 10% local vs fedavg" in page  # every run's worst 10% of clients
    # the published table's columns beside the measured ones (this tiny setting is none of its columns)
    assert "published %" in page and "no published row" in page and "Published (fedgkd-table3-cifar10)" in page
    grid = json.loads((runs / "compare.json").read_text())
    assert grid["algorithms"] == ["fedavg", "fedprox:mu=0.01", "fedavgm"] and grid["seeds"] == [0, 1]
    assert grid["report"]["reference"] == "fedavg"


def test_status_finds_the_folders_compare_makes(tmp_path):
    from fedrift.experiments.grid import build_grid
    from fedrift.experiments.study_file import load_study
    from fedrift.experiments.study_status import setting_dirs

    study = load_study(write_study(tmp_path, sweep={"partition.alpha": [0.1, 1.0], "train.local_epochs": [1]}))
    grid = build_grid(study.config, [e.entry for e in study.entries], study.seeds, study.sweep, study.overrides,
                      study.runs_dir)
    assert [d for e in study.entries for d in setting_dirs(study, e)] == [
        s.dir for e in study.entries for s in grid.settings if s.algorithm == e.entry]
    assert "\n".join(study_status(study.path)).endswith(
        f"0 of 4 tune trials, 0 of 12 runs; left: 12 runs of 3 rounds and 4 trials of 2 rounds; no cost measured yet "
        f"(fedrift study run {study.path} --dry-run measures the cost on this machine)")


def _kill_when(proc: subprocess.Popen, pattern: str, root: Path, path: Path) -> None:
    deadline = time.monotonic() + 180
    while not list(root.glob(pattern)):
        assert proc.poll() is None, "the study ended before it was killed"
        assert time.monotonic() < deadline, f"no {pattern} in 180 s"
        time.sleep(0.01)
    if pattern.startswith("tune/"):  # status names the process running the study
        assert f"running: pid {proc.pid} on " in "\n".join(study_status(path))
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.process
def test_killed_in_its_tune_and_in_its_compare_it_resumes_to_the_same_results(finished, tmp_path, calls):
    path = write_study(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "fedrift.cli", "study", "run", str(path), "--no-report"]
    for pattern in ("tune/trials/*/trial*/summary.json", "runs/*/seed*/summary.json"):
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _kill_when(proc, pattern, out, path)
        finally:
            proc.kill()
            proc.wait()
    kept = {k: t for k, t in mtimes(out).items() if k.startswith("runs/")
            and json.loads((out / k).read_text())["status"] == "completed"}
    assert kept and len(mtimes(out)) < 10  # killed in its compare, not at its end
    assert run_study(path, verbose=False, report=False).finished
    assert all(mtimes(out)[k] == t for k, t in kept.items())  # the finished runs are not redone
    assert not {str(out / Path(k).parent) for k in kept} & set(calls)
    assert results(out) == results(finished / "out")


def test_a_budget_stops_it_as_ctrl_c_and_the_next_run_continues(finished, tmp_path, monkeypatch, capsys):
    path = write_study(tmp_path)
    real = fedrift.api.run
    n = [0]

    def slow_third(config, *args, **kwargs):
        n[0] += 1
        if n[0] == 3:  # the reference's seed-0 run waits for the budget's end
            time.sleep(60)
        return real(config, *args, **kwargs)

    monkeypatch.setattr(fedrift.api, "run", slow_third)
    start = time.monotonic()
    outcome = run_study(path, budget="8s", report=False)
    assert time.monotonic() - start < 45
    assert outcome.budget_hit and not outcome.finished
    out = capsys.readouterr().out
    assert "stopped at the budget" in out and "run the same command again" in out
    status = "\n".join(study_status(path))
    assert "finished:" in status and "fedavg (reference): tune" in status and "runs 0/2 finished" in status
    assert "left:" in status
    monkeypatch.setattr(fedrift.api, "run", real)
    assert run_study(path, verbose=False, report=False).finished
    assert results(tmp_path / "out") == results(finished / "out")
    assert "nothing left" in "\n".join(study_status(path))


def test_an_entry_added_later_is_tuned_and_run_alone(finished, tmp_path, calls, capsys):
    folder = copy(finished, tmp_path)
    before = mtimes(folder / "out")
    path = write_study(folder, entries=[*ENTRIES, "fedavg:train.momentum=0.5"])
    status = "\n".join(study_status(path))
    assert "fedavg:train.momentum=0.5 (new since the last run): tune 0/2 trials, runs 0/2 finished" in status
    assert run_study(path, report=False).finished
    assert "fedavg:train.momentum=0.5: new since the last run: tuned and run alone" in capsys.readouterr().out
    assert calls and all("fedavg-train.momentum=0.5" in c for c in calls)
    assert len(calls) == 4  # its two trials and its two runs
    assert all(mtimes(folder / "out")[k] == t for k, t in before.items())


def test_a_changed_entry_is_rerun_alone_and_said_so(finished, tmp_path, calls, capsys):
    folder = copy(finished, tmp_path)
    before = mtimes(folder / "out")
    changed = {"entry": "fedprox:mu=0.01", "space": {"train.lr": [0.3]}}
    path = write_study(folder, entries=["fedavg", changed, ENTRIES[2]])
    assert "fedprox:mu=0.01 (changed since the last run" in "\n".join(study_status(path))
    assert run_study(path, report=False).finished
    said = capsys.readouterr().out
    assert "fedprox:mu=0.01: changed since the last run (tune.space.train.lr" in said
    assert "fedprox:mu=0.01: its tune's space changed (train.lr: '0.02,0.1' there, '0.3' here)" in said
    assert all("fedprox-mu=0.01" in c for c in calls) and len(calls) == 3  # one trial, two runs at lr 0.3
    assert (folder / "out" / "tune" / "retired" / "fedprox-mu=0.01-1" / "trials" / "fedprox-mu=0.01").is_dir()
    after = mtimes(folder / "out")
    assert all(after[k] == t for k, t in before.items() if "fedprox" not in k)
    run = folder / "out" / "runs" / "fedprox-mu=0.01" / "seed1" / "config.yaml"
    assert yaml.safe_load(run.read_text())["train"]["lr"] == 0.3


@pytest.mark.parametrize("change, key", [
    ({"entries": ["fedavg", "fedsomething"]}, "fedsomething"),
    ({"colour": "red"}, "colour: unknown key"),
    ({"tune": {"space": {"train.lr": "grid:0.1:1"}, "rounds": 2}}, "space.train.lr"),
    ({"tune": {"spaces": {}}}, "tune.spaces: unknown key"),
    ({"report": {"paper": "fedgkd-table9"}}, "report.paper"),
    ({"report": {"metric": "worst10"}}, "report.metric: 'worst10' is not a metric to rank on; allowed: accuracy"),
    ({"reference": "scaffold"}, "reference"),
    ({"entries": [{"entry": "fedprox:mu=0.1", "space": {"mu": "log:1e-3:1"}}]}, "the entry fixes mu"),
    ({"sweep": {"partition.alpha": []}}, "sweep.partition.alpha"),
])
def test_bad_study_files_are_refused_in_one_line(tmp_path, capsys, change, key):
    path = write_study(tmp_path, **change)
    for command in ("run", "status"):
        assert main(["study", command, str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("fedrift: error: ") and key in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_study_over_committed_results_reruns_nothing_but_what_changed(tmp_path, monkeypatch):
    """benchmarks/studies/d.yaml over copies of the committed tune-d-new and workload-d-new:
    every trial and run is found finished, nothing is rewritten, except CCVR's runs: they were
    made calibrating at every evaluated round (``when: eval``), and CCVR's default is now to
    calibrate once after the last round (issue 51), so the study reruns them first of all."""
    for name in ("tune-d-new", "workload-d-new"):
        shutil.copytree(REPO / "benchmarks" / "results" / name, tmp_path / name)
    before = mtimes(tmp_path)
    ran = []

    def refuse(*args, **kwargs):
        ran.append(Path(args[0]["output"]["dir"]).relative_to(tmp_path).as_posix())
        raise KeyboardInterrupt  # the study stops here, as at Ctrl-C

    monkeypatch.setattr(fedrift.api, "run", refuse)
    with pytest.raises(KeyboardInterrupt):
        run_study(REPO / "benchmarks" / "studies" / "d.yaml", out=tmp_path, verbose=False, report=False)
    assert ran == ["workload-d-new/ccvr/seed0"]
    assert mtimes(tmp_path) == before


BENCH_STUDIES = sorted((REPO / "benchmarks" / "studies").glob("*.yaml"))


@pytest.mark.parametrize("path", BENCH_STUDIES, ids=lambda p: p.stem)
def test_a_benchmark_study_continues_its_committed_tune_and_compare(path):
    """Each benchmark study file against the folders its chain committed (read only, no data
    loaded): its tune is the committed one (base, and the space of every study it shares), and
    its runs' folders are the committed compare's (compare's naming rule); d.yaml's full reuse
    is the test above."""
    from fedrift.experiments import study_run
    from fedrift.experiments.study_file import load_study
    from fedrift.experiments.study_status import setting_dirs

    study = load_study(path)
    assert study.runs_dir.parent == REPO / "benchmarks" / "results"
    if study.tuned_entries:
        built, head = study_run._tune_studies(study)
        study_run._check_tune_head(study, head)  # refuses another base config
        stored = json.loads((study.tune_dir / "tune.json").read_text())["studies"]
        shared = [spec for _, spec in built.values() if spec["entry"] in {s["entry"] for s in stored.values()}]
        assert shared and all(stored[built[spec["entry"]][0].name] == spec for spec in shared)
    grid = json.loads((study.runs_dir / "compare.json").read_text())
    committed = {s["dir"] for s in grid["settings"]}
    ours = {d for e in study.entries for d in setting_dirs(study, e)}
    assert committed & ours and {s["dir"] for s in grid["settings"] if s["algorithm"] in
                                 {e.entry for e in study.entries}} <= ours


def test_where_runs_stack_an_entrys_seeds_run_together_after_its_tune(tmp_path, capsys):
    """compare's stacked runs (engine.executor: stacked): a stack of seeds costs about one run,
    so each entry's seeds run as one stack right after its tune (whose trials are one stack
    too), before the next entry's tune."""
    path = write_study(tmp_path, entries=ENTRIES[:2], overrides={"engine.executor": "stacked"})
    assert run_study(path, report=False).finished
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("== study:")
            or line.endswith("trained as one stack")]
    assert said == ["== study: tune fedavg (2 trials, in " + str(tmp_path / "out" / "tune") + ")",
                    "fedavg: trials 0, 1 trained as one stack",
                    "== study: fedavg, seeds 0, 1", "fedavg: seeds 0, 1 trained as one stack",
                    "== study: tune fedprox:mu=0.01 (2 trials, in " + str(tmp_path / "out" / "tune") + ")",
                    "fedprox:mu=0.01: trials 0, 1 trained as one stack",
                    "== study: fedprox:mu=0.01, seeds 0, 1", "fedprox:mu=0.01: seeds 0, 1 trained as one stack"]


def _small_study(folder: Path, rounds: int = 3, seeds=(0,)) -> Path:
    """Two entries, not tuned, ``rounds`` rounds: a study a test can run whole in seconds."""
    return write_study(folder, entries=[{"entry": "fedavg", "tune": False}, {"entry": "fedprox:mu=0.01", "tune": False}],
                       seeds=list(seeds), tune=None, report={"tsne": "none"})


def test_key_value_sizes_the_study_is_recorded_and_a_change_reruns(tmp_path, capsys):
    """``study run FILE train.rounds=2 seeds=0``: every run at 2 rounds, one seed; recorded in
    study.json, which ``study status`` then reads; another value reruns the runs it changes."""
    path = write_study(tmp_path, entries=["fedavg", {"entry": "fedavgm", "tune": False}], report={"tsne": "none"})
    assert main(["study", "run", str(path), "train.rounds=2", "seeds=0", "--no-report"]) == 0
    runs = sorted((tmp_path / "out" / "runs").glob("*/seed*/summary.json"))
    assert [p.parent.parent.name + "/" + p.parent.name for p in runs] == ["fedavg/seed0", "fedavgm/seed0"]
    assert all(json.loads(p.read_text())["rounds"] == 2 for p in runs)
    ledger = json.loads((tmp_path / "out" / "runs" / "study.json").read_text())
    assert ledger["overrides"] == ["train.rounds=2", "seeds=0"] and ledger["seeds"] == [0]
    status = "\n".join(study_status(path))
    assert "run with train.rounds=2 seeds=0" in status and "0 of 0 runs" not in status and "2 of 2 runs" in status
    capsys.readouterr()
    assert main(["study", "run", str(path), "train.rounds=3", "seeds=0", "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "changed since the last run (base.train.rounds: 2 -> 3)" in out
    assert all(json.loads(p.read_text())["rounds"] == 3 for p in runs)


@pytest.mark.parametrize("token, key", [("seed=1", "seed"), ("algorithm.mu=0.1", "algorithm.mu"), ("rounds", "key=value"),
                                        ("seeds=a", "seeds=a")])
def test_bad_key_values_are_refused_in_one_line(tmp_path, capsys, token, key):
    from conftest import one_line_refusal

    one_line_refusal(capsys, ["study", "run", str(_small_study(tmp_path)), token], key)


def test_dry_run_says_the_size_and_estimates_from_a_probe_writing_nothing(tmp_path, capsys):
    path = _small_study(tmp_path, seeds=(0, 1, 2))
    assert main(["study", "run", str(path), "--dry-run", "train.rounds=4"]) == 0
    out = capsys.readouterr().out
    assert "runs: 2 entries x 3 seeds = 6 runs of 4 rounds (24 rounds in all)" in out
    assert "probe: fedavg seed 0, 2 rounds on this machine: start-up " in out
    assert "left: 6 runs of 4 rounds, about " in out
    assert not (tmp_path / "out").exists()


def test_reports_are_rewritten_together_when_each_run_ends(tmp_path, monkeypatch):
    """At the start of the third run (where a kill could land) results.md, study.md and
    report.html show the same two finished runs."""
    from fedrift.experiments import study_run

    monkeypatch.setattr(study_run._Reports, "PACE", 0.0)
    path = _small_study(tmp_path, seeds=(0, 1))
    real, seen = fedrift.api.run, []

    def look(config, *args, **kwargs):
        runs = tmp_path / "out" / "runs"
        if len(seen) == 2:
            seen.append({name: (runs / name).read_text() for name in ("results.md", "study.md", "report.html")})
        else:
            seen.append(None)
        return real(config, *args, **kwargs)

    monkeypatch.setattr(fedrift.api, "run", look)
    assert run_study(path, verbose=False).finished
    files = seen[2]
    assert "runs 1/2 finished" in files["study.md"] and "finished: 0 of 0 tune trials, 2 of 4 runs" in files["study.md"]
    for name, text in files.items():
        assert "fedprox:mu=0.01" in text and "fedavg" in text, name


@pytest.mark.agreement
def test_a_budget_stop_leaves_each_stopped_run_a_checkpoint_the_next_call_continues(tmp_path, monkeypatch, capsys):
    """Rounds of 0.4 s, no periodic checkpoint, a budget that ends mid-run (as a stop mostly
    does, while clients train): the stopped run's
    checkpoint is of its last whole round, and the next call continues it from there to the
    results of a study never stopped."""
    from fedrift.engine import loop

    path = _small_study(tmp_path / "a", rounds=20)
    whole = _small_study(tmp_path / "b", rounds=20)
    for p in (path, whole):
        doc = yaml.safe_load(p.read_text())
        doc["overrides"] = {"train.rounds": 20, "engine.checkpoint_every": 0}
        p.write_text(yaml.safe_dump(doc))
    train = loop.train_clients

    def slow(*args):  # the clients' training, where a stop mostly lands
        time.sleep(0.4)
        return train(*args)

    monkeypatch.setattr(loop, "train_clients", slow)
    outcome = run_study(path, budget="6s", report=False)  # past round 1, before round 20 (8 s of sleep)
    assert outcome.budget_hit
    stopped = json.loads((tmp_path / "a" / "out" / "runs" / "fedavg" / "seed0" / "summary.json").read_text())
    assert stopped["status"] == "interrupted" and stopped["checkpoint_round"] >= 1, stopped
    monkeypatch.setattr(loop, "train_clients", train)
    assert run_study(path, verbose=False, report=False).finished
    resumed = json.loads((tmp_path / "a" / "out" / "runs" / "fedavg" / "seed0" / "summary.json").read_text())
    assert resumed["resumed_from_round"] == stopped["checkpoint_round"]
    assert run_study(whole, verbose=False, report=False).finished
    for name in ("fedavg", "fedprox-mu=0.01"):
        a = json.loads((tmp_path / "a" / "out" / "runs" / name / "seed0" / "summary.json").read_text())
        b = json.loads((tmp_path / "b" / "out" / "runs" / name / "seed0" / "summary.json").read_text())
        agree(a["final_accuracy"], b["final_accuracy"], BITS, name)
