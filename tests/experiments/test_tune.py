"""fedrift tune: the search space, a study that finds the better learning rate, pruning, a
resumed tune, and compare's tuned=DIR."""

from __future__ import annotations

import csv
import json

import optuna
import pytest
import yaml

import fedrift
from agreement import BITS, agree
from fedrift.algorithms import ALGORITHMS
from fedrift.cli import main
from fedrift.config import _fields
from fedrift.errors import ConfigError
from fedrift.experiments.space import Dim, default_space, resolve_space, startup_points
from fedrift.experiments.tune import build_tune


def _cfg(tiny, rounds=3, **sections):
    cfg = tiny(train={"rounds": rounds}, partition={"val_share": 0.2}, **sections)
    cfg.pop("output")
    return cfg


def test_space_specs_parse_and_bad_ones_name_the_key():
    assert Dim.parse("train.lr", "log:1e-3:1") == Dim("train.lr", "log", 1e-3, 1.0)
    assert Dim.parse("algorithm.M", "int:1:5") == Dim("algorithm.M", "int", 1, 5)
    assert Dim.parse("algorithm.variant", "nesterov,heavy_ball").choices == ("nesterov", "heavy_ball")
    assert Dim.parse("train.lr", "0.01,0.1").choices == (0.01, 0.1)
    for bad in ("log:0:1", "float:1:0", "int:a:3", "0.1,0.1", "log:1"):
        with pytest.raises(ConfigError, match=r"^space\.train\.lr: "):
            Dim.parse("train.lr", bad)


def test_every_default_space_names_options_its_algorithm_has():
    for entry in ALGORITHMS:
        dims = resolve_space(entry.name, {})
        assert dims[0].key == "train.lr"
        for d in dims[1:]:
            assert d.key.startswith("algorithm.") and d.key.split(".", 1)[1] in _fields(entry.params), (entry.name, d)
    assert set(default_space("fedprox")) == {"train.lr", "algorithm.mu"}
    # overrides: replaced, removed, added; another algorithm's option is left to it
    dims = {d.key: d for d in resolve_space("fedprox", {"mu": "0.01,0.1", "train.lr": "none", "gamma": "log:0.1:1"})}
    assert set(dims) == {"algorithm.mu"} and dims["algorithm.mu"].choices == (0.01, 0.1)


def test_the_start_up_design_spreads_a_small_budget_over_every_dimension():
    import math

    dims = [
        *resolve_space("fedavgm", {}), Dim.parse("algorithm.k", "int:1:8"), Dim.parse("algorithm.v", "a,b,c,d")]
    points = startup_points(dims, 8, seed=0)
    assert len(points) == 8 and len({json.dumps(p) for p in points}) == 8
    for d in dims:  # one point in each eighth of every dimension (of its log for a log range)
        if d.kind == "choice":
            assert sorted(p[d.key] for p in points) == ["a", "a", "b", "b", "c", "c", "d", "d"]
            continue
        if d.kind == "int":
            assert sorted(p[d.key] for p in points) == list(range(1, 9))
            continue
        scale = math.log if d.kind == "log" else (lambda v: v)
        cells = sorted(int(8 * (scale(p[d.key]) - scale(d.low)) / (scale(d.high) - scale(d.low))) for p in points)
        assert cells == list(range(8)), (d.key, cells)
    # a prefix of one sequence (a growing tune keeps its points); the learning rates are the
    # same for every algorithm of a tune, whatever its other dimensions; the seed moves them
    assert startup_points(dims, 4, seed=0) == points[:4]
    lrs = [p["train.lr"] for p in points]
    for name in ("fedavg", "fedprox", "fedavgm"):
        assert [p["train.lr"] for p in startup_points(resolve_space(name, {}), 8, seed=0)] == lrs
    assert [p["train.lr"] for p in startup_points(dims, 8, seed=1)] != lrs


def test_a_tune_runs_the_start_up_design_first(tiny, tmp_path):
    results = fedrift.tune(_cfg(tiny, rounds=1), algorithms=["fedprox"], trials=2, out=tmp_path / "t", pruner="none",
                           seed=5, report=False, verbose=False)
    ran = sorted((t["params"] for t in results["fedprox"]["trials"]), key=lambda p: p["train.lr"])
    assert ran == sorted(startup_points(resolve_space("fedprox", {}), 2, seed=5), key=lambda p: p["train.lr"])


def test_personal_models_are_tuned_on_their_own_clients_validation(tiny, tmp_path):
    results = fedrift.tune(_cfg(tiny, rounds=2), algorithms=["fedproto", "fedavg"], trials=1, out=tmp_path / "t",
                           pruner="none", report=False, verbose=False)
    for name, metric in (("fedproto", "val_local_accuracy"), ("fedavg", "val_accuracy")):
        best = results[name]["best"]
        rows = [json.loads(line) for line in open(best["dir"] + "/metrics.jsonl")]
        assert best["metric"] == metric and best["val_accuracy"] == max(r[metric] for r in rows)
    best = yaml.safe_load((tmp_path / "t" / "best.yaml").read_text())
    assert best["fedproto"]["metric"] == "val_local_accuracy" and "metric" not in best["fedavg"]


def test_a_calibrated_run_is_scored_on_its_calibrated_rounds_only(tiny, tmp_path, monkeypatch):
    """CCVR's output is its calibrated model (by default calibrated after its last round): its
    trial scores that, never the higher accuracy of its uncalibrated rounds before."""
    from types import SimpleNamespace

    rows = [{"round": 1, "val_accuracy": 0.9}, {"round": 2, "val_accuracy": 0.95, "calibrated_val_accuracy": 0.4}]

    def run(config=None, overrides=None, resume=False, on_round=None):
        for row in rows:
            on_round(row)
        return SimpleNamespace(history=rows, summary={"rounds": 2})

    monkeypatch.setattr(fedrift.api, "run", run)
    results = fedrift.tune(_cfg(tiny, rounds=2), algorithms=["ccvr"], trials=1, out=tmp_path / "t", pruner="none",
                           report=False, verbose=False)
    assert results["ccvr"]["best"]["val_accuracy"] == 0.4


def test_a_personalising_run_is_scored_on_its_personalised_models(tiny, tmp_path, monkeypatch):
    """A run with eval.personalize (FedBABU's fine-tuning, FedADC's calibration) outputs its
    clients' fine-tuned models: its trial scores their personalized_val_accuracy, never the
    higher validation accuracy of its global model before, and best.yaml names that metric."""
    from types import SimpleNamespace

    rows = [{"round": 1, "val_accuracy": 0.9}, {"round": 2, "val_accuracy": 0.95}]

    def run(config=None, overrides=None, resume=False, on_round=None):
        for row in rows:
            on_round(row)
        return SimpleNamespace(history=rows, summary={"rounds": 2, "personalized_val_accuracy": 0.3})

    monkeypatch.setattr(fedrift.api, "run", run)
    results = fedrift.tune(_cfg(tiny, rounds=2, eval={"personalize": True}), algorithms=["fedavg"], trials=1,
                           out=tmp_path / "t", pruner="none", report=False, verbose=False)
    assert results["fedavg"]["best"]["val_accuracy"] == 0.3
    best = yaml.safe_load((tmp_path / "t" / "best.yaml").read_text())
    assert best["fedavg"]["metric"] == "personalized_val_accuracy"


def test_tune_needs_a_validation_split_and_checks_the_space(tiny):
    cfg = _cfg(tiny)
    cfg["partition"].pop("val_share")
    with pytest.raises(ConfigError, match=r"partition\.val_share: .*never reads the test set"):
        build_tune(cfg, ["fedavg"])
    with pytest.raises(ConfigError, match=r"space\.gamma: no algorithm of the tune takes 'gamma'"):
        build_tune(_cfg(tiny), ["fedavg", "fedprox"], space={"gamma": "log:0.1:1"})
    with pytest.raises(ConfigError, match=r"algorithm\.mu: .*\(in the study of fedprox\)"):
        build_tune(_cfg(tiny), ["fedprox"], space={"mu": "-1,0.1"})


def test_tune_finds_the_better_of_two_learning_rates_and_compare_takes_it(tiny, tmp_path, capsys):
    out = tmp_path / "tune"
    results = fedrift.tune(_cfg(tiny), algorithms=["fedavg", "fedprox"], space={"train.lr": "1e-5,0.1", "mu": "none"},
                           trials=5, out=out, pruner="none")
    for name in ("fedavg", "fedprox"):
        r = results[name]
        assert len(r["trials"]) == 2  # a grid of two values: capped at its size
        lrs = {t["params"]["train.lr"]: t["val_accuracy"] for t in r["trials"]}
        assert lrs[0.1] > lrs[1e-5] + 0.2
        assert r["best"]["params"] == {"train.lr": 0.1}
        # scored on validation: the trial's own metrics agree, and hold the test accuracy beside it
        rows = [json.loads(line) for line in open(r["best"]["dir"] + "/metrics.jsonl")]
        assert r["best"]["val_accuracy"] == max(row["val_accuracy"] for row in rows)
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["fedprox"]["overrides"] == {"train.lr": 0.1} and best["fedavg"]["trials"] == 2
    with open(out / "trials.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    assert "fedprox" in (out / "tune.md").read_text() and (out / "tune.html").read_text().count("<img") == 2

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(tiny, rounds=1)))
    base = ["compare", "-c", str(cfg), "--out", str(tmp_path / "g"), "--no-report", "algorithms=fedprox,scaffold"]
    capsys.readouterr()
    assert main([*base, f"tuned={out}"]) == 0
    printed = capsys.readouterr().out
    assert "tuned fedprox: train.lr=0.1" in printed and f"tuned scaffold: not in {out}, the config's values" in printed
    run = yaml.safe_load((tmp_path / "g" / "fedprox" / "seed0" / "config.yaml").read_text())
    assert run["train"]["lr"] == 0.1
    # an entry's own value wins over the tuned one, and the line says so
    own = ["compare", "-c", str(cfg), "--out", str(tmp_path / "own"), "--no-report", "algorithms=fedprox:train.lr=0.3"]
    assert main([*own, f"tuned={out}"]) == 0
    assert "tuned fedprox:train.lr=0.3: (train.lr=0.1: the entry's own value instead)" in capsys.readouterr().out
    run = yaml.safe_load((tmp_path / "own" / "fedprox-train.lr=0.3" / "seed0" / "config.yaml").read_text())
    assert run["train"]["lr"] == 0.3
    assert main([*base, f"tuned={out}", "train.lr=0.2"]) == 2
    assert "train.lr: both tuned" in capsys.readouterr().err
    assert main([*base, f"tuned={tmp_path}"]) == 2
    assert "holds no best.yaml" in capsys.readouterr().err


def _results(run_dir):
    """A run's metrics without its timings (what a rerun reproduces)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if "seconds" not in k} for row in rows]


@pytest.mark.process
def test_compare_copies_the_tuned_trial_that_is_one_of_its_runs(tiny, tmp_path, capsys):
    out = tmp_path / "tune"
    fedrift.tune(_cfg(tiny, rounds=2), algorithms=["fedavg"], space={"train.lr": "1e-5,0.1"}, trials=2, out=out,
                 pruner="none", report=False, verbose=False)
    trial = next(d for d in (out / "trials" / "fedavg").iterdir()
                 if yaml.safe_load((d / "config.yaml").read_text())["train"]["lr"] == 0.1)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(tiny, rounds=2)))
    base = ["compare", "-c", str(cfg), "--no-report", "algorithms=fedavg", "seeds=0,1", "--jobs", "2"]
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "g"), f"tuned={out}"]) == 0
    printed = capsys.readouterr().out
    assert f"fedavg/seed0: the tune's {trial} is this run" in printed
    assert "1 finished before (1 of them copied from the tune), 1 to run" in printed
    copied = tmp_path / "g" / "fedavg" / "seed0"
    assert (copied / "metrics.jsonl").read_text() == (trial / "metrics.jsonl").read_text()
    assert yaml.safe_load((copied / "config.yaml").read_text())["output"]["dir"] == str(trial)  # where it came from
    assert json.loads((tmp_path / "g" / "fedavg" / "seed1" / "summary.json").read_text())["status"] == "completed"
    # the copy is the run compare would have made: the same runs without the tune
    assert main([*base, "--out", str(tmp_path / "plain"), "train.lr=0.1"]) == 0
    for seed in (0, 1):
        assert _results(tmp_path / "g" / "fedavg" / f"seed{seed}") == _results(tmp_path / "plain" / "fedavg" / f"seed{seed}")
    # a copied run is reused as any finished run; runs that differ from every trial are run
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "g"), f"tuned={out}"]) == 0
    assert "2 finished before, 0 to run" in capsys.readouterr().out
    assert main([*base, "--out", str(tmp_path / "r3"), f"tuned={out}", "train.rounds=3"]) == 0
    assert "0 finished before, 2 to run" in capsys.readouterr().out
    assert len(_results(tmp_path / "r3" / "fedavg" / "seed0")) == 3


class _BelowAfter(optuna.pruners.BasePruner):
    """Prunes a trial whose validation accuracy is below ``floor`` at round 2: a pruner with a
    known answer, to check the wiring (what the median pruner decides is Optuna's)."""

    def __init__(self, floor: float) -> None:
        self.floor = floor

    def prune(self, study, trial) -> bool:
        step = trial.last_step
        return step is not None and step >= 2 and trial.intermediate_values[step] < self.floor


def test_pruning_stops_a_hopeless_trial_and_a_diverging_one_is_marked(tiny, tmp_path):
    out = tmp_path / "tune"
    results = fedrift.tune(_cfg(tiny, rounds=5), algorithms=["fedavg"], space={"train.lr": "0.1,1e-7,1e8"}, trials=3,
                           out=out, pruner=_BelowAfter(0.5))
    trials = {t["params"]["train.lr"]: t for t in results["fedavg"]["trials"]}
    assert trials[0.1]["status"] == "completed" and trials[0.1]["rounds"] == 5
    assert trials[1e-7]["status"] == "pruned" and trials[1e-7]["state"] == "pruned"
    rows = (out / "trials" / "fedavg" / f"trial{trials[1e-7]['trial']}" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2  # stopped at round 2
    assert trials[1e8]["status"] == "diverged" and trials[1e8]["state"] == "pruned"
    assert results["fedavg"]["best"]["params"] == {"train.lr": 0.1}


class _Recorder(optuna.pruners.BasePruner):
    """Prunes nothing; keeps what each round reported."""

    def __init__(self) -> None:
        self.seen: dict[int, dict[int, float]] = {}

    def prune(self, study, trial) -> bool:
        self.seen[trial.number] = dict(trial.intermediate_values)
        return False


def test_the_pruner_sees_the_score_so_far_and_waits_for_the_middle_round(tiny, tmp_path):
    from fedrift.experiments.tune import _pruner

    rec = _Recorder()
    results = fedrift.tune(_cfg(tiny, rounds=6), algorithms=["fedavg"], space={"train.lr": "0.5"}, trials=1,
                           out=tmp_path / "t", pruner=rec, report=False, verbose=False)
    vals = [json.loads(line)["val_accuracy"] for line in open(results["fedavg"]["trials"][0]["dir"] + "/metrics.jsonl")]
    running = [max(vals[: i + 1]) for i in range(len(vals))]
    assert vals != running  # a round fell back (this config's curve is not monotone), and the pruner saw the best
    assert list(rec.seen[0].values()) == running and list(rec.seen[0]) == list(range(1, 7))
    assert _pruner("median", 12)._n_warmup_steps == 6


def test_a_stopped_tune_resumes_without_repeating_finished_trials(tiny, tmp_path, capsys):
    out = tmp_path / "tune"
    cfg = _cfg(tiny, rounds=2)
    fedrift.tune(cfg, algorithms=["fedavg"], trials=2, out=out, pruner="none", seed=3)
    first = {p.parent.name: p.stat().st_mtime_ns for p in (out / "trials" / "fedavg").glob("trial*/metrics.jsonl")}
    # what a kill leaves: a trial the study holds as running, its folder half written
    st = optuna.load_study(study_name="fedavg", storage=f"sqlite:///{out / 'study.db'}")
    st.ask()
    capsys.readouterr()
    results = fedrift.tune(cfg, algorithms=["fedavg"], trials=3, out=out, pruner="none", seed=3)
    assert "2 of 3 trials finished before, 1 left running marked failed" in capsys.readouterr().out
    states = sorted(t["state"] for t in results["fedavg"]["trials"])
    assert states == ["complete", "complete", "complete", "fail"]
    # the resumed trial is a new point, not a replay of the sampler's first proposal
    lrs = [t["params"]["train.lr"] for t in results["fedavg"]["trials"] if t["state"] == "complete"]
    assert len(set(lrs)) == 3, lrs
    assert {p.parent.name: p.stat().st_mtime_ns for p in (out / "trials" / "fedavg").glob("trial*/metrics.jsonl")
            if p.parent.name in first} == first  # the finished trials were not run again
    # the same folder with another space is refused
    with pytest.raises(ConfigError, match="holds a tune of another config or space"):
        fedrift.tune(cfg, algorithms=["fedavg"], space={"train.lr": "0.1,0.2"}, trials=3, out=out)


def test_a_tune_grows_by_more_algorithms_and_refuses_to_drop_one(tiny, tmp_path, capsys):
    out = tmp_path / "tune"
    cfg = _cfg(tiny, rounds=1)
    fedrift.tune(cfg, algorithms=["fedavg"], trials=1, out=out, pruner="none")
    before = {p.name: p.stat().st_mtime_ns for p in (out / "trials" / "fedavg").glob("trial*")}
    capsys.readouterr()
    results = fedrift.tune(cfg, algorithms=["fedavg", "fedprox"], trials=1, out=out, pruner="none")
    assert "fedavg: 1 of 1 trials finished before" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in (out / "trials" / "fedavg").glob("trial*")} == before
    assert set(results) == {"fedavg", "fedprox"} and len(results["fedprox"]["trials"]) == 1
    assert set(yaml.safe_load((out / "best.yaml").read_text())) == {"fedavg", "fedprox"}
    with pytest.raises(ConfigError, match="it also tunes fedprox, which algorithms= leaves out"):
        fedrift.tune(cfg, algorithms=["fedavg"], trials=1, out=out, pruner="none")
    with pytest.raises(ConfigError, match="the space or entry of fedprox differs"):
        fedrift.tune(cfg, algorithms=["fedavg", "fedprox"], space={"mu": "0.1,0.2"}, trials=1, out=out, pruner="none")


def test_a_tune_folder_of_another_config_names_the_keys_and_both_values(tiny, tmp_path):
    out = tmp_path / "tune"
    cfg = _cfg(tiny, rounds=1)
    kwargs = dict(algorithms=["fedavg", "fedprox"], space={"train.lr": "0.05"}, trials=1, out=out, pruner="none",
                  report=False, verbose=False)
    fedrift.tune(cfg, **kwargs)
    with pytest.raises(ConfigError, match=r"holds a tune of another config or space \(model.hidden: \[32\] there, "
                                          r"\[16\] here; train.rounds: 1 there, 2 here\); allowed: "):
        fedrift.tune(cfg, **{**kwargs, "overrides": ["train.rounds=2", "model.hidden=[16]"]})
    with pytest.raises(ConfigError, match=r"\(seed: 0 there, 3 here\)"):
        fedrift.tune(cfg, **{**kwargs, "seed": 3})
    with pytest.raises(ConfigError, match=r"\(the space or entry of fedprox differs: fedprox.space.algorithm.mu: "
                                          r"'log:0.0001:1' there, '0.1,0.2' here\)"):
        fedrift.tune(cfg, **{**kwargs, "space": {"train.lr": "0.05", "mu": "0.1,0.2"}})


def test_cli_tune_and_its_refusals(tiny, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(tiny, rounds=1)))
    out = tmp_path / "t"
    assert main(["tune", "-c", str(cfg), "--out", str(out), "--trials", "1", "--jobs", "1", "algorithms=fedprox",
                 "space.mu=0.01", "space.train.lr=0.05"]) == 0
    assert "fedprox: best train.lr=0.05 algorithm.mu=0.01" in capsys.readouterr().out
    for args, says in ((["space.train.lr=log:1:0"], "space.train.lr: 'log:1:0' needs LOW < HIGH"),
                       (["seeds=0,1"], "seeds: not a tune option"),
                       (["partition.val_share=0"], "partition.val_share")):
        assert main(["tune", "-c", str(cfg), "--out", str(tmp_path / "u"), *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err
        assert not (tmp_path / "u").exists()


@pytest.mark.process
def test_parallel_trials_share_the_study(tiny, tmp_path):
    """--jobs 2: two processes draw from one study (SQLite); each grid point runs once."""
    results = fedrift.tune(_cfg(tiny, rounds=1), algorithms=["fedavg"], space={"train.lr": "0.05,0.1,0.2"}, trials=3,
                           jobs=2, out=tmp_path / "tune", pruner="none", report=False, verbose=False)
    trials = results["fedavg"]["trials"]
    assert sorted(t["params"]["train.lr"] for t in trials if t["state"] == "complete") == [0.05, 0.1, 0.2]


def test_a_tune_folder_in_use_is_refused(tiny, tmp_path):
    from fedrift.engine.folder_lock import FolderLock

    out = tmp_path / "tune"
    out.mkdir()
    with FolderLock(out, "--out"):  # as a running tune holds it
        with pytest.raises(fedrift.FedriftError, match="is in use by another fedrift process"):
            fedrift.tune(_cfg(tiny, rounds=1), algorithms=["fedavg"], space={"train.lr": "0.1"}, trials=1, out=out)
    assert not (out / "study.db").exists()


@pytest.mark.parametrize("key", ["output.dir=x", "output.progress=false"])
def test_output_keys_are_the_tuners_and_refused_in_one_line(capsys, tmp_path, key):
    from conftest import one_line_refusal

    name = key.partition("=")[0]
    one_line_refusal(capsys, ["tune", "--out", str(tmp_path / "t"), "partition.val_share=0.2", key],
                     f"{name}: the tuner sets every trial's output keys", "allowed: --out")
    assert not (tmp_path / "t").exists()  # refused before anything is written


@pytest.mark.parametrize("name", ["workload-a", "workload-b"])
def test_the_committed_benchmark_choices_are_points_of_their_tunes_design(name):
    """BENCHMARKS.md's tables rerun from benchmarks/tuned/*.yaml: each entry's values must be a
    point the tune tried (one of the first 8 of its Sobol design) inside the entry's space."""
    from pathlib import Path

    from fedrift.overrides import parse_algorithm
    from fedrift.experiments.tuned import read_tuned

    doc = read_tuned(Path(__file__).parents[2] / "benchmarks" / "tuned" / f"{name}.yaml")
    assert "fedavg" in doc and len(doc) >= 20
    for entry, best in doc.items():
        dims = resolve_space(parse_algorithm(entry)[0], {})
        assert list(best["overrides"]) == [d.key for d in dims], entry
        # the files were tuned before a space rounded what it draws (Dim.typed): their values
        # are the design's points unrounded
        typed = {d.key: d.typed(best["overrides"][d.key]) for d in dims}
        assert typed in startup_points(dims, 8, 0), entry
        assert startup_points(dims, 8, 0)[best["trial"]] == typed, entry


def test_a_best_value_at_the_edge_of_its_range_is_flagged():
    lr = Dim.parse("train.lr", "log:0.005:0.5")  # log: 5% of the log range is a factor 100 ** 0.05 = 1.26
    assert lr.edge(0.006) == "low" and lr.edge(0.4) == "high" and lr.edge(0.05) is None and lr.edge(0.007) is None
    beta = Dim.parse("algorithm.beta", "float:0:1")
    assert beta.edge(0.04) == "low" and beta.edge(0.96) == "high" and beta.edge(0.5) is None
    m = Dim.parse("algorithm.M", "int:1:5")
    assert (m.edge(1), m.edge(5), m.edge(3)) == ("low", "high", None)
    assert Dim.parse("algorithm.M", "int:1:2").edge(2) is None  # two values: every one is an edge, none flagged
    grid = Dim.parse("train.lr", "0.01,0.05,0.1")
    assert (grid.edge(0.01), grid.edge(0.1), grid.edge(0.05)) == ("low", "high", None)
    assert Dim.parse("train.lr", "0.01,0.1").edge(0.1) is None
    assert Dim.parse("algorithm.variant", "nesterov,heavy_ball,none").edge("none") is None


def test_best_yaml_keeps_the_base_and_compare_warns_when_its_runs_differ(tiny, tmp_path, capsys):
    out = tmp_path / "tune"
    fedrift.tune(_cfg(tiny, rounds=2), algorithms=["fedavg"], space={"train.lr": "1e-5,1e-4,0.1"}, trials=3, out=out,
                 pruner="none")
    printed = capsys.readouterr().out
    assert "fedavg: best train.lr=0.1 " in printed
    assert ("fedavg: train.lr=0.1 is at the high edge of its range 1e-05,0.0001,0.1: the best may lie above it; "
            "widen space.train.lr and tune again (another --out: a tune folder keeps its space)") in printed
    best = yaml.safe_load((out / "best.yaml").read_text())["fedavg"]
    assert best["overrides"] == {"train.lr": 0.1} and best["edges"] == {"train.lr": "high"}
    assert best["space"] == {"train.lr": "1e-05,0.0001,0.1"}
    base = best["base"]
    assert base["data.name"] == "digits" and base["model.name"] == "mlp" and base["train.rounds"] == 2
    assert base["partition.val_share"] == 0.2 and base["partition.num_clients"] == 6 and "train.lr" not in base
    md = (out / "tune.md").read_text()
    assert "| fedavg | train.lr=0.1 (high edge) |" in md and "| train.lr (high) |" in md
    assert "data.name=digits" in md and "train.rounds=2" in md and "own test" in md
    html = (out / "tune.html").read_text()
    assert html.index('<table id="summary"') < html.index("<h2>fedavg</h2>")  # the summary comes first
    assert "train.lr=0.1 (high edge)" in html and "at the high edge of its range" in html and "own test" in html

    # compare on another base: one line naming each key that differs and both values
    cfg = tmp_path / "c.yaml"
    other = _cfg(tiny, rounds=1)
    other["partition"].pop("val_share")
    cfg.write_text(yaml.safe_dump(other))
    args = ["compare", "-c", str(cfg), "--out", str(tmp_path / "g"), "algorithms=fedavg", f"tuned={out}",
            "report.plots=false", "report.tsne=none"]
    assert main(args) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "another base" in x]
    assert len(lines) == 1, lines
    assert f"tuned: {out} chose its values on another base than these runs" in lines[0]
    assert "train.rounds: tuned on 2, here 1" in lines[0] and "partition.val_share: tuned on 0.2, here 0.0" in lines[0]
    assert "data.name" not in lines[0]  # the same data: not named
    grid = json.loads((tmp_path / "g" / "compare.json").read_text())
    assert grid["tuned"]["base"]["differences"]["train.rounds"] == {"tuned": [2], "here": [1], "entries": ["fedavg"]}
    report = (tmp_path / "g" / "report.html").read_text()
    assert 'id="tuned-warning"' in report and "train.rounds: tuned on 2, here 1" in report

    # on its own base: no warning
    cfg.write_text(yaml.safe_dump(_cfg(tiny, rounds=2)))
    assert main([*args[:4], str(tmp_path / "g2"), *args[5:]]) == 0
    assert "another base" not in capsys.readouterr().out
    assert 'id="tuned-warning"' not in (tmp_path / "g2" / "report.html").read_text()


def test_an_older_best_yaml_without_a_base_still_works_and_is_said_unchecked(tiny, tmp_path, capsys):
    from pathlib import Path

    from fedrift.experiments.tuned import base_check

    old = tmp_path / "best.yaml"  # as fedrift wrote it before bases were stored
    old.write_text("fedavg:\n  overrides:\n    train.lr: 0.1\n  val_accuracy: 0.5\n  trial: 0\n  trials: 1\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(tiny, rounds=1)))
    assert main(["compare", "-c", str(cfg), "--out", str(tmp_path / "g"), "--no-report", "algorithms=fedavg",
                 f"tuned={old}"]) == 0
    printed = capsys.readouterr().out
    assert "tuned fedavg: train.lr=0.1" in printed
    assert f"tuned: {old} records no base for fedavg (a best.yaml from before fedrift stored one)" in printed
    committed = Path(__file__).parents[2] / "benchmarks" / "tuned" / "workload-a.yaml"
    assert base_check(committed, [("fedavg", _cfg(tiny))]) == {"differences": {}, "unrecorded": ["fedavg"]}


@pytest.mark.process
def test_ctrl_c_on_a_parallel_tune_records_its_trials_as_interrupted(tiny, tmp_path):
    """A terminal's Ctrl-C on `tune --jobs 2` with 4 trials while the first two train: no
    other trial starts, the two are in the study as interrupted (state fail: the next tune
    runs their points again) and their runs' summaries say so; one line on stderr within
    seconds, exit 130; no Optuna "Trial failed" warning, traceback or leaked semaphore."""
    from conftest import ctrl_c_cli

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**_cfg(tiny, rounds=100000), "engine": {"checkpoint_every": 1}}))
    out = tmp_path / "tune"
    started: list = []

    def both_train() -> bool:
        started[:] = sorted(p.parent for p in out.glob("trials/fedavg/trial*/config.yaml"))
        return len([m for m in out.glob("trials/fedavg/trial*/metrics.jsonl") if m.read_text().count("\n") >= 2]) >= 2

    r = ctrl_c_cli(["tune", "-c", str(cfg), "--out", str(out), "--trials", "4", "--jobs", "2", "--pruner", "none",
                    "space.train.lr=0.01,0.02,0.03,0.04", "--no-report"], both_train)
    assert r.code == 130 and r.err.strip().splitlines() == [
        "fedrift: interrupted; the trials in progress were stopped and recorded as interrupted; run the same fedrift "
        "tune command again to continue (finished trials are kept, interrupted ones continue from their checkpoints; "
        "best.yaml has the best of those finished so far)"], r.err
    assert r.line_s < 8.0, f"the line came {r.line_s:.1f} s after the signal (exit after {r.exit_s:.1f} s)"
    assert r.exit_s < 30.0, f"exit {r.exit_s:.1f} s after the signal"
    runs = sorted(p.parent for p in out.glob("trials/fedavg/trial*/config.yaml"))
    assert runs == started and len(runs) == 2, (runs, started)
    assert [json.loads((d / "summary.json").read_text())["status"] for d in runs] == ["interrupted"] * 2
    st = optuna.load_study(study_name="fedavg", storage=f"sqlite:///{out / 'study.db'}")
    assert [(t.state.name, t.user_attrs.get("status")) for t in st.trials] == [("FAIL", "interrupted")] * 2


def test_ctrl_c_in_a_tune_marks_the_trial_interrupted_and_a_rerun_runs_it_again(tiny, tmp_path, capsys, monkeypatch):
    """Ctrl-C in a trial of `tune --jobs 1`: exit 130 with the tune's one line (not the
    trial run's --resume hint), no Optuna warning; the next tune runs that point again."""
    from conftest import ctrl_c_in_round

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(tiny, rounds=2)))
    args = ["tune", "-c", str(cfg), "--out", str(tmp_path / "t"), "--trials", "1", "--pruner", "none",
            "space.train.lr=0.05", "--no-report"]
    undo = ctrl_c_in_round(monkeypatch, 2)
    assert main(args) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "fedrift: interrupted; the trials in progress were stopped and recorded as interrupted; run the same fedrift "
        "tune command again to continue (finished trials are kept, interrupted ones continue from their checkpoints; "
        "best.yaml has the best of those finished so far)"], err
    undo()
    assert main(args) == 0
    assert "fedavg: 0 of 1 trials finished before;" in capsys.readouterr().out
    st = optuna.load_study(study_name="fedavg", storage=f"sqlite:///{tmp_path / 't' / 'study.db'}")
    assert [(t.state.name, t.user_attrs.get("status")) for t in st.trials] == [("FAIL", "interrupted"),
                                                                               ("COMPLETE", "completed")]


def test_a_stopped_tune_summarises_the_trials_that_finished(tiny, tmp_path, capsys, monkeypatch):
    """Ctrl-C in fedavg's second trial, before fedprox's study begins: best.yaml, trials.csv
    and tune.md hold fedavg's finished trial (compare can use it), and fedprox, never begun, has
    no row; the next tune finishes both and rewrites them."""
    from fedrift.engine import loop
    from fedrift.experiments.tuned import read_tuned

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(tiny, rounds=2)))
    args = ["tune", "-c", str(cfg), "--out", str(tmp_path / "t"), "--trials", "2", "--pruner", "none",
            "algorithms=fedavg,fedprox", "--no-report"]
    train, calls = loop.train_clients, []

    def stop(*a):
        calls.append(1)
        if len(calls) == 3:  # round 1 of the second trial
            raise KeyboardInterrupt
        return train(*a)

    monkeypatch.setattr(loop, "train_clients", stop)
    assert main(args) == 130
    monkeypatch.setattr(loop, "train_clients", train)
    best = yaml.safe_load((tmp_path / "t" / "best.yaml").read_text())
    assert list(best) == ["fedavg"] and best["fedavg"]["trial"] == 0 and best["fedavg"]["trials"] == 2
    assert set(read_tuned(tmp_path / "t")) == {"fedavg"}
    rows = (tmp_path / "t" / "trials.csv").read_text().splitlines()
    assert len(rows) == 3 and all(r.startswith("fedavg,") for r in rows[1:])  # the finished and the stopped trial
    capsys.readouterr()
    assert main(args) == 0
    assert set(yaml.safe_load((tmp_path / "t" / "best.yaml").read_text())) == {"fedavg", "fedprox"}


@pytest.mark.agreement
def test_a_trial_stopped_mid_run_continues_from_its_checkpoint_next_time(tiny, tmp_path, capsys, monkeypatch):
    """Ctrl-C while round 4 of a 6-round trial trains: the trial saves round 3's checkpoint
    (trials keep no periodic ones), and the next tune's trial at that point takes its folder and
    continues from round 3, to the score of a trial never stopped."""
    from fedrift.engine import loop

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(tiny, rounds=6)))
    args = lambda out: ["tune", "-c", str(cfg), "--out", str(tmp_path / out), "--trials", "1",  # noqa: E731
                        "--pruner", "none", "space.train.lr=0.05", "--no-report"]
    train = loop.train_clients

    def stop(executor, tools, payload, jobs, t, *rest):
        if t == 4:
            raise KeyboardInterrupt
        return train(executor, tools, payload, jobs, t, *rest)

    monkeypatch.setattr(loop, "train_clients", stop)
    assert main(args("t")) == 130
    monkeypatch.setattr(loop, "train_clients", train)
    assert (tmp_path / "t" / "trials" / "fedavg" / "trial0" / "checkpoint" / "manifest.json").is_file()
    capsys.readouterr()
    assert main(args("t")) == 0
    assert "fedavg trial 1 (lr=0.05): continues stopped trial's run from its checkpoint of round 3" in capsys.readouterr().out
    summary = json.loads((tmp_path / "t" / "trials" / "fedavg" / "trial1" / "summary.json").read_text())
    assert summary["resumed_from_round"] == 3 and summary["rounds"] == 6
    assert not (tmp_path / "t" / "trials" / "fedavg" / "trial0").exists()
    assert main(args("whole")) == 0
    st = lambda out: optuna.load_study(study_name="fedavg", storage=f"sqlite:///{tmp_path / out / 'study.db'}")  # noqa: E731
    agree(st("t").best_value, st("whole").best_value, BITS, "the continued trial's score")


def test_a_stopped_trial_whose_folder_is_a_link_is_not_taken_over(tiny, tmp_path, capsys, monkeypatch):
    """A link put where a stopped trial's folder was is left as it is: the next trial at its
    point runs from round 1 in a folder of its own, and nothing is written behind the link."""
    import shutil

    from fedrift.engine import loop

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(tiny, rounds=6)))
    args = ["tune", "-c", str(cfg), "--out", str(tmp_path / "t"), "--trials", "1", "--pruner", "none",
            "space.train.lr=0.05", "--no-report"]
    train = loop.train_clients

    def stop(executor, tools, payload, jobs, t, *rest):
        if t == 4:
            raise KeyboardInterrupt
        return train(executor, tools, payload, jobs, t, *rest)

    monkeypatch.setattr(loop, "train_clients", stop)
    assert main(args) == 130
    monkeypatch.setattr(loop, "train_clients", train)
    trial0 = tmp_path / "t" / "trials" / "fedavg" / "trial0"
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(trial0), str(elsewhere))
    trial0.symlink_to(elsewhere, target_is_directory=True)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in elsewhere.rglob("*"))
    capsys.readouterr()
    assert main(args) == 0
    assert "continues stopped trial" not in capsys.readouterr().out
    assert trial0.is_symlink() and sorted((p.name, p.stat().st_mtime_ns) for p in elsewhere.rglob("*")) == before
    summary = json.loads((tmp_path / "t" / "trials" / "fedavg" / "trial1" / "summary.json").read_text())
    assert "resumed_from_round" not in summary and summary["rounds"] == 6


def _by_params(results, entry):
    return {json.dumps(t["params"], sort_keys=True): t for t in results[entry]["trials"]}


def test_stacked_runs_of_a_tune_at_other_values_equal_its_trials_one_by_one(tiny, tmp_path, capsys):
    """`engine.executor: stacked`: a study's grid (learning rates x FedProx's mu) trained as one
    stack, each trial's step at its own values (engine.step_values), scores as the trials run
    one by one within the stack's tolerance (tests/engine/test_stacked_runs.py)."""
    space = {"train.lr": "0.02,0.1", "mu": "0.01,0.5"}
    kw = dict(algorithms=["fedprox"], space=space, trials=4, pruner="none", report=False)
    stacked = fedrift.tune(_cfg(tiny, rounds=2, engine={"executor": "stacked"}), out=tmp_path / "s", **kw)
    assert "fedprox: trials 0, 1, 2, 3 trained as one stack" in capsys.readouterr().out
    alone = fedrift.tune(_cfg(tiny, rounds=2, engine={"executor": "batched"}), out=tmp_path / "a", **kw)
    assert "trained as one stack" not in capsys.readouterr().out
    s, a = _by_params(stacked, "fedprox"), _by_params(alone, "fedprox")
    assert s.keys() == a.keys() and len(s) == 4
    for key in s:
        assert s[key]["status"] == "completed", key
        assert s[key]["val_accuracy"] == pytest.approx(a[key]["val_accuracy"], rel=1e-3), key
    assert len({t["val_accuracy"] for t in s.values()}) > 1  # four trials at four values, not one run four times
    trial = stacked["fedprox"]["best"]["dir"]
    assert yaml.safe_load(open(f"{trial}/config.yaml"))["engine"]["executor"] == "stacked"


def test_stacked_runs_of_a_tune_are_pruned_and_diverge_each_on_its_own(tiny, tmp_path):
    """A stack of three trials: one pruned at round 2 and one diverging leave it; the third
    trains on to its last round, as the trials one by one do."""
    out = tmp_path / "tune"
    results = fedrift.tune(_cfg(tiny, rounds=5, engine={"executor": "stacked"}), algorithms=["fedavg"],
                           space={"train.lr": "0.1,1e-7,1e8"}, trials=3, out=out, pruner=_BelowAfter(0.5))
    trials = {t["params"]["train.lr"]: t for t in results["fedavg"]["trials"]}
    assert trials[0.1]["status"] == "completed" and trials[0.1]["rounds"] == 5
    assert trials[1e-7]["status"] == "pruned" and trials[1e-7]["state"] == "pruned"
    rows = (out / "trials" / "fedavg" / f"trial{trials[1e-7]['trial']}" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2
    assert trials[1e8]["status"] == "diverged" and trials[1e8]["state"] == "pruned"


def test_stacked_runs_of_a_tune_take_tpe_proposals_jobs_at_a_time(tiny, tmp_path, capsys, monkeypatch):
    from fedrift.experiments import tune as tune_module

    monkeypatch.setattr(tune_module, "STARTUP", 2)
    results = fedrift.tune(_cfg(tiny, rounds=1, engine={"executor": "stacked"}), algorithms=["fedavg"], trials=5,
                           jobs=2, out=tmp_path / "t", pruner="none", report=False)
    out = capsys.readouterr().out
    assert [line.split(": ", 1)[1] for line in out.splitlines() if "as one stack" in line] == [
        "trials 0, 1 trained as one stack", "trials 2, 3 trained as one stack"], out
    trials = results["fedavg"]["trials"]
    assert [t["state"] for t in trials] == ["complete"] * 5
    assert len({t["params"]["train.lr"] for t in trials}) == 5


@pytest.mark.process
def test_stacked_runs_of_a_tune_ctrl_c_records_its_trials_as_interrupted(tiny, tmp_path):
    """A terminal's Ctrl-C while a stack of three trials trains: each run stops and writes its
    interrupted summary, each trial is in the study as interrupted, one line, exit 130."""
    from conftest import ctrl_c_cli

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(tiny, rounds=100000, engine={"executor": "stacked", "checkpoint_every": 1})))
    out = tmp_path / "tune"

    def all_train() -> bool:
        return len([m for m in out.glob("trials/fedavg/trial*/metrics.jsonl") if m.read_text().count("\n") >= 2]) >= 3

    r = ctrl_c_cli(["tune", "-c", str(cfg), "--out", str(out), "--trials", "3", "--pruner", "none",
                    "space.train.lr=0.01,0.02,0.03", "--no-report"], all_train)
    assert r.code == 130 and r.err.strip().splitlines() == [
        "fedrift: interrupted; the trials in progress were stopped and recorded as interrupted; run the same fedrift "
        "tune command again to continue (finished trials are kept, interrupted ones continue from their checkpoints; "
        "best.yaml has the best of those finished so far)"], r.err
    assert r.exit_s < 30.0, f"exit {r.exit_s:.1f} s after the signal"
    runs = sorted(p.parent for p in out.glob("trials/fedavg/trial*/config.yaml"))
    assert [json.loads((d / "summary.json").read_text())["status"] for d in runs] == ["interrupted"] * 3
    st = optuna.load_study(study_name="fedavg", storage=f"sqlite:///{out / 'study.db'}")
    states = [(t.state.name, t.user_attrs.get("status")) for t in st.trials]
    assert states == [("FAIL", "interrupted")] * 3, (states, [t.user_attrs for t in st.trials], r.err)


def test_stacked_runs_of_a_tune_that_differ_in_another_key_run_one_by_one(tiny, tmp_path, capsys):
    results = fedrift.tune(_cfg(tiny, rounds=1, engine={"executor": "stacked"}), algorithms=["fedavg"],
                           space={"train.lr": "0.05", "train.momentum": "0.5,0.9"}, trials=2, out=tmp_path / "t",
                           pruner="none", report=False)
    out = capsys.readouterr().out
    assert "fedavg: trials 0, 1 run one by one (engine.executor: stacked runs share how a client trains; " \
           "train.momentum differs (0.5 and 0.9);" in out, out
    assert [t["state"] for t in results["fedavg"]["trials"]] == ["complete"] * 2
