"""fedrift select: the better entry found and confirmed (and FedAvg when it is the best), the
budget kept (rounds and time, and refused when it cannot pay for the confirmation), a stopped
select resumed without repeating its trials, recommendation.yaml run as it is, no test metric
read by the search, one-line refusals, and the pieces (durations, the ranking) by hand."""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml

import fedrift.api
import fedrift.experiments.compare
from conftest import one_line_refusal, tiny_config
from fedrift.cli import main
from fedrift.errors import ConfigError
from fedrift.experiments.select import (
    STUDY, _no_better_than_stopped, _points, _trials, build_select, candidates, parse_duration, ranking, select,
)

CRIPPLE = "train.weight_decay=3"  # measured on digits: every lr of the space stays at chance (10 % test accuracy)
LR = {"train.lr": "log:0.03:0.3"}  # where the MLP learns digits in 6 rounds (0.64-0.93 test accuracy)
# what the search may read of a round's row: its number and validation metrics, nothing of the test set
SEARCH_KEYS = {"round", "val_accuracy", "calibrated_val_accuracy", "val_loss"}


def _base(rounds: int = 6, **sections) -> dict:
    cfg = tiny_config(Path("."), train={"rounds": rounds}, partition={"val_share": 0.2}, **sections)
    cfg.pop("output")
    return cfg


def _plan(out: Path, kwargs: dict):
    """The plan of the select that ``select(_base(), out=out, **kwargs)`` runs."""
    return build_select(_base(), out=out, **{k: v for k, v in kwargs.items() if k not in ("report", "verbose")})


def _quiet(**kwargs) -> dict:
    """A small select: 6 rounds, rungs at 2 and 6, one start-up point per entry, FedAvg and
    one other entry confirmed over 3 seeds (36 rounds kept back)."""
    return {"seeds": [1, 2, 3], "top": 1, "startup": 1, "min_rounds": 2, "space": LR, "report": False,
            "verbose": False, **kwargs}


class Recording(dict):
    """A round's row that notes every key read, and in which phase of the select."""

    def __init__(self, row, reads, phase):
        super().__init__(row)
        self._reads, self._phase = reads, phase

    def _note(self, *keys):
        self._reads.extend((self._phase[0], k) for k in keys)

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)

    def pop(self, key, *default):
        self._note(key)
        return super().pop(key, *default)

    def setdefault(self, key, default=None):
        self._note(key)
        return super().setdefault(key, default)

    def keys(self):
        self._note(*super().keys())
        return super().keys()

    def values(self):
        self._note(*super().keys())
        return super().values()

    def items(self):
        self._note(*super().keys())
        return super().items()

    def __iter__(self):
        self._note(*super().keys())
        return super().__iter__()

    def copy(self):
        self._note(*super().keys())
        return dict(super().items())


def _watched(mp: pytest.MonkeyPatch, reads: list, phase: list, run_started: list | None = None) -> None:
    """Rows handed to ``on_round`` recorded (``reads``); ``phase`` turns to ``confirmation`` when
    the confirmation's compare starts (select imports both at call time)."""
    real_run, real_compare = fedrift.api.run, fedrift.experiments.compare.compare

    def run(config=None, overrides=None, resume=False, on_round=None):
        if run_started is not None:
            run_started.append(config)
        watched = None if on_round is None else (lambda row: on_round(Recording(row, reads, phase)))
        return real_run(config, overrides, resume, on_round=watched)

    def compare(*args, **kwargs):
        phase[0] = "confirmation"
        phase.append(time.time())
        return real_compare(*args, **kwargs)

    mp.setattr(fedrift.api, "run", run)
    mp.setattr(fedrift.experiments.compare, "compare", compare)


@pytest.fixture(scope="module")
def better(tmp_path_factory):
    """FedAvg crippled through its entry's options (weight decay 3: chance accuracy), FedProx
    not: the search reads every row through :class:`Recording`."""
    out = tmp_path_factory.mktemp("better") / "select"
    reads, phase = [], ["search"]
    kwargs = _quiet(algorithms=[f"fedavg:{CRIPPLE}", "fedprox"], budget_rounds=60)
    with pytest.MonkeyPatch.context() as mp:
        _watched(mp, reads, phase)
        result = select(_base(), out=out, **kwargs)
    return SimpleNamespace(out=out, result=result, reads=reads, phase=phase, kwargs=kwargs, plan=_plan(out, kwargs))


def test_the_better_entry_is_found_and_confirmed(better):
    result = better.result
    picked = [t["entry"] for t in candidates(better.plan, result["trials"])]
    assert picked == [f"fedavg:{CRIPPLE}", "fedprox"]
    assert result["choice"] == "fedprox", result["text"]
    assert result["verdict"] in ("significant", "ahead, not tested"), result["text"]
    # the reference named with its options: it is not the plain FedAvg (the words: test_select_verdict.py)
    assert result["text"].startswith("fedprox ") and f"fedavg:{CRIPPLE} at lr " in result["text"], result["text"]
    assert result["outcome"] == "recommended" and result["confirmed"]["seeds"] == [1, 2, 3]
    # the reference first, and tuned at least as hard as the other entry though far behind it
    trials = result["trials"]
    assert trials[0]["entry"] == f"fedavg:{CRIPPLE}"
    count = {e: sum(t["entry"] == e for t in trials) for e in picked}
    assert count[f"fedavg:{CRIPPLE}"] >= count["fedprox"] - 1, count  # owed one at most while the last ran
    rows = {r["algorithm"]: r for r in result["rows"]}
    assert set(rows) == {f"fedavg:{CRIPPLE}", "fedprox"}
    assert rows["fedprox"]["test_accuracy_at_best_val_diff_low"] > 0.2  # at chance, FedAvg is far behind
    # candidates.yaml: the confirmed entries' values; the confirmation ran them on seeds 1-3
    cands = yaml.safe_load((better.out / "candidates.yaml").read_text())
    assert list(cands) == picked
    seeds = sorted(p.name for p in (better.out / "confirm").glob("*/seed*"))
    assert seeds == sorted(["seed1", "seed2", "seed3"] * 2)
    page = (better.out / "select.md").read_text()
    assert result["text"] in page and "| fedprox |" in page
    assert (better.out / "select.html").is_file()


@pytest.mark.process
def test_hyperband_on_two_processes_finds_the_better_entry_too(tmp_path):
    """The same search as ``better``'s under Hyperband with two trials at once (process
    workers): it picks FedProx over the crippled FedAvg, and stays within its budget."""
    kwargs = _quiet(algorithms=[f"fedavg:{CRIPPLE}", "fedprox"], budget_rounds=60, pruner="hyperband", jobs=2)
    result = select(_base(), out=tmp_path / "s", **kwargs)
    assert result["choice"] == "fedprox", result["text"]
    plan = _plan(tmp_path / "s", {k: v for k, v in kwargs.items() if k != "jobs"})
    assert plan.pruner == "hyperband"
    assert sum(t["rounds"] for t in result["trials"]) + plan.confirmation_rounds <= 60
    assert {t["entry"] for t in result["trials"]} == {f"fedavg:{CRIPPLE}", "fedprox"}


def test_fedavg_at_its_centre_runs_every_round_whatever_the_rungs(better):
    """The reference's first point (its space's centre) is not stopped at a rung: crippled
    FedAvg at chance runs all 6 rounds, where FedProx's lead would have stopped it at 2."""
    ref = [t for t in better.result["trials"] if t["entry"] == f"fedavg:{CRIPPLE}"]
    centre = ref[0]  # the first start-up point
    assert centre["values"] == {"train.lr": pytest.approx(math.sqrt(0.03 * 0.3), rel=1e-2)}  # at the space's precision
    assert centre["rounds"] == better.plan.rounds and centre["status"] == "completed", centre
    assert centre["score"] < 0.3  # at chance: a rung's pruner would have stopped it
    assert all(t["rounds"] < better.plan.rounds for t in ref[1:] if t["score"] is not None and t["score"] < 0.3)


def test_when_fedavg_is_best_the_verdict_is_fedavg(tmp_path):
    result = select(_base(), out=tmp_path / "s", **_quiet(algorithms=["fedavg", f"fedprox:{CRIPPLE}"], budget_rounds=50))
    assert [r["algorithm"] for r in result["rows"]] == ["fedavg", f"fedprox:{CRIPPLE}"]
    assert result["choice"] == "fedavg" and result["verdict"].startswith("fedavg"), result["text"]
    assert result["text"].startswith("FedAvg at lr "), result["text"]  # the words: test_select_verdict.py
    rec = yaml.safe_load((tmp_path / "s" / "recommendation.yaml").read_text())
    assert rec["algorithm"] == {"name": "fedavg"} and "weight_decay" not in rec["train"]
    lr = yaml.safe_load((tmp_path / "s" / "candidates.yaml").read_text())["fedavg"]["overrides"]["train.lr"]
    assert rec["train"]["lr"] == lr and 0.03 <= lr <= 0.3


def _rounds_run(folder: Path) -> int:
    """Rounds actually trained in the run folders under ``folder`` (their metrics lines)."""
    return sum(len(p.read_text().splitlines()) for p in folder.glob("**/metrics.jsonl"))


def test_the_rounds_budget_pays_for_search_and_confirmation(better):
    budget = better.kwargs["budget_rounds"]
    plan, trials = better.plan, better.result["trials"]
    assert plan.confirmation_rounds == 2 * 3 * 6
    searched = sum(t["rounds"] for t in trials)
    assert searched + plan.confirmation_rounds <= budget, (searched, plan.confirmation_rounds)
    assert searched >= budget - plan.confirmation_rounds - plan.rungs[0]  # and the search used what was left
    # what ran, counted from the run folders
    assert _rounds_run(better.out / "trials") <= searched
    assert _rounds_run(better.out / "confirm") == plan.confirmation_rounds
    assert {t["state"] for t in trials} <= {"complete", "pruned"}


def _left(said: str) -> list[float]:
    """The seconds of "N s|min of the budget left" in the progress lines, in order."""
    return [float(n) * (60 if unit == "min" else 1) for n, unit in re.findall(r"; (\d+) (s|min) of the budget left", said)]


def test_a_time_budget_that_passes_its_check_ends_with_an_answer(tmp_path, capsys):
    """8 s on tiny digits: refused at once with nothing written when the probe finds it cannot
    pay for the least search and confirmation, else an answer (never "no recommendation")
    within about the budget, the progress lines' time left only going down; the same command
    again reuses the confirmation and gives the same answer."""
    out = tmp_path / "s"
    seconds = 8.0
    reads, phase = [], ["search"]
    kwargs = _quiet(algorithms=["fedavg", "fedprox"], budget=f"{seconds:g}s", seeds=[1, 2], verbose=True)
    start = time.time()
    with pytest.MonkeyPatch.context() as mp:
        _watched(mp, reads, phase)
        try:
            result = select(_base(), out=out, **kwargs)
        except ConfigError as err:
            result, refused = None, str(err)
    ended = time.time()
    said = capsys.readouterr().out
    if result is None:  # the machine is slow today: refused before anything ran
        assert refused.startswith("--budget: 8 s cannot pay for the least search") and "at least about" in refused
        assert "\n" not in refused and not out.exists() and phase == ["search"]
        return
    assert result["outcome"] in ("recommended", "provisional") and (out / "recommendation.yaml").is_file()
    state = json.loads((out / "select.json").read_text())
    assert state["budget"] == {"seconds": seconds, "rounds": None}
    left = _left(said)
    assert len(left) >= 2 and left == sorted(left, reverse=True) and left[0] <= seconds, said
    # the search kept the confirmation's share (its estimate, with its margin) back
    search_ended = phase[1]
    assert search_ended - start <= seconds, search_ended - start
    assert state["spent"] <= seconds + 2.0 and ended - start < 2 * seconds
    trials = _trials(_plan(out, kwargs))
    assert sum(t["seconds"] for t in trials) <= seconds
    # the same command again: the budget is spent, the confirmation's runs are reused: the same answer
    starts = []
    with pytest.MonkeyPatch.context() as mp:
        _watched(mp, [], ["search"], starts)
        again = select(_base(), out=out, **kwargs)
    assert starts == [] and (again["choice"], again["text"]) == (result["choice"], result["text"])


@pytest.fixture(scope="module")
def dear(tmp_path_factory):
    """A 1.5 s budget checked at costs far below what the runs take (the probe said 1 ms a round):
    the first trial's rounds show the plan cannot pay for it; the search must stop and still
    confirm. Its output, page and trials."""
    import contextlib
    import io

    from fedrift.experiments import select as select_module
    from fedrift.experiments.select_plan import Cost

    from fedrift.engine import outputs

    out = tmp_path_factory.mktemp("dear") / "s"
    kwargs = _quiet(algorithms=["fedavg", "fedprox"], budget="1.5s", verbose=True)
    said = io.StringIO()
    log = outputs.RunWriter.log

    def slow(self, row):  # every round 0.1 s at least: the least confirmation alone (4 runs of 6) passes 1.5 s
        log(self, row)
        time.sleep(0.1)

    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(said):
        mp.setattr(outputs.RunWriter, "log", slow)
        mp.setattr(select_module, "probe", lambda plan, echo, entries=None: {plan.reference: Cost(0.001, 0.001, "probe")})
        result = select(_base(), out=out, **kwargs)
    return SimpleNamespace(out=out, result=result, said=said.getvalue(), page=(out / "select.md").read_text(),
                           trials=_trials(_plan(out, kwargs)), plan=_plan(out, kwargs))


def test_a_budget_the_runs_overspend_still_confirms_the_least(dear):
    """Not "no recommendation because the search spent the budget": FedAvg and the candidate
    over two seeds, provisional, the page saying the confirmation that ran and why."""
    assert dear.result["outcome"] == "provisional"
    assert dear.result["confirmed"] == {"entries": ["fedavg", "fedprox"], "seeds": [1, 2]}
    assert json.loads((dear.out / "select.json").read_text())["confirmation"]["seeds"] == [1, 2]
    assert "the least confirmation (FedAvg and fedprox over 2 seeds) needs about" in dear.said
    assert "it runs all the same, and may pass the budget" in dear.page
    spent = json.loads((dear.out / "select.json").read_text())["spent"]
    assert spent > 1.5 and "past the budget: the select took " in dear.page  # and by how much, said


def test_the_page_shows_the_plan_that_ran(dear):
    """The plan before the search (at the probe's costs) confirmed over 3 seeds; 2 ran: the
    page's plan says the confirmation that ran, and that it was re-planned."""
    plan = dear.page.split("## The plan")[1].split("## What ran")[0]
    assert "- confirmation (what ran): 1 candidate and FedAvg over 2 seeds (4 runs of 6 rounds" in plan, plan
    assert "re-planned: the plan before the search was 1 candidate and FedAvg over 3 seeds (6 runs of 6 rounds" in plan
    assert "search (as planned before it ran): " in plan and "\n- confirmation: " not in plan


def test_after_a_trial_stopped_by_the_budget_only_owed_looks_run(dear):
    """The search's end: once the budget stops a trial, no trial starts but an entry's first
    look (to the first rung), and no trial the budget stopped counts as an entry's tuning."""
    trials = sorted(dear.trials, key=lambda t: t["trial"])
    cut = [t["trial"] for t in trials if t["status"] == "budget"]
    assert cut, trials  # the runs cost more than the check was told: the budget stopped a trial
    seen = {t["entry"] for t in trials if t["trial"] <= cut[0]}
    for t in trials:
        if t["trial"] > cut[0]:
            assert t["entry"] not in seen and t["rounds"] <= dear.plan.rungs[0], trials
            seen.add(t["entry"])
    tuning = next(ln for ln in dear.result["lines"] if ln.startswith("tuning in the search: "))
    for entry, name in (("fedavg", "FedAvg"), ("fedprox", "fedprox")):
        own = [t for t in trials if t["entry"] == entry]
        counted = sum(t["status"] != "budget" for t in own)
        assert f"{name} {counted} trial" in tuning, tuning
        if counted < len(own):
            assert f"{len(own) - counted} more stopped by the budget, not counted" in tuning, tuning
            assert f"| {entry} | {counted} (+{len(own) - counted} budget) |" in dear.page


def test_the_time_of_a_stopped_select_counts_against_its_budget(tmp_path):
    """Ctrl-C in the 2nd trial: select.json keeps the time spent so far, so that the same
    command continues with what is left of its --budget."""
    out = tmp_path / "s"
    real_run = fedrift.api.run
    calls, recorded = [], []

    def stopping(config=None, overrides=None, resume=False, on_round=None):
        if Path(config["output"]["dir"]).parent != out / "trials":  # the budget check's probe of FedAvg
            return real_run(config, overrides, resume, on_round=on_round)
        calls.append(config)
        if len(calls) == 3:  # what select.json says while the search runs: a kill now keeps it
            recorded.append(json.loads((out / "select.json").read_text())["spent"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_run(config, overrides, resume, on_round=on_round)

    start = time.time()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fedrift.api, "run", stopping)
        with pytest.raises(KeyboardInterrupt):
            select(_base(), out=out, **_quiet(algorithms=["fedavg", "fedprox"], budget="1h"))
    elapsed = time.time() - start
    first = _trials(_plan(out, _quiet(algorithms=["fedavg", "fedprox"], budget="1h")))[0]
    spent = json.loads((out / "select.json").read_text())["spent"]
    assert first["seconds"] <= spent <= elapsed, (first["seconds"], spent, elapsed)
    page = (out / "select.md").read_text()  # the page of a stopped select: what ran, what is missing
    assert "stopped" in page and (out / "select.html").is_file()


def test_only_the_confirmation_runs_not_finished_need_time(better):
    """What a rerun's time check counts of the confirmation: the runs compare would not reuse."""
    from dataclasses import replace

    from fedrift.experiments.select import _to_confirm

    picked = candidates(better.plan, better.result["trials"])
    tuned = better.out / "candidates.yaml"
    assert _to_confirm(better.plan, picked, tuned, 1) == 0.0  # all 6 finished
    assert _to_confirm(replace(better.plan, seeds=[1, 2, 3, 4]), picked, tuned, 1) == 2 / 8  # seed 4 of each entry
    assert _to_confirm(replace(better.plan, root=better.out / "elsewhere"), picked, tuned, 1) == 1.0


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() + str(p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_stopped_select_resumes_without_repeating_finished_trials(tmp_path):
    """Ctrl-C in the 3rd trial (a start-up point); the same select again keeps the two finished
    trials (study rows and run folders), runs the stopped point again as a new trial, and no
    finished start-up point twice; the budget counts the trials of both."""
    out = tmp_path / "s"
    kwargs = _quiet(algorithms=["fedavg", "fedprox"], budget_rounds=48, seeds=[1, 2], startup=2)
    real_run = fedrift.api.run
    calls, recorded = [], []

    def stopping(config=None, overrides=None, resume=False, on_round=None):
        calls.append(config)
        if len(calls) == 3:  # what select.json says while the search runs: a kill now keeps it
            recorded.append(json.loads((out / "select.json").read_text())["spent"])

        def stop(row):
            if len(calls) == 3 and row["round"] == 2:
                raise KeyboardInterrupt
            on_round(row)

        return real_run(config, overrides, resume, on_round=stop)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fedrift.api, "run", stopping)
        with pytest.raises(KeyboardInterrupt):
            select(_base(), out=out, **kwargs)
    plan = _plan(out, kwargs)
    st = optuna.load_study(study_name=STUDY, storage=plan.storage)
    before = [(t.number, t.state.name, t.params, t.user_attrs.get("status")) for t in st.trials]
    assert len(before) == 3 and {b[1] for b in before[:2]} <= {"COMPLETE", "PRUNED"}, before
    assert before[2][1] == "FAIL" and before[2][3] == "interrupted", before
    assert recorded[0] > 0  # the two finished trials' time, recorded before the search ended
    finished = [b for b in before if b[1] in ("COMPLETE", "PRUNED")]
    assert len(finished) == 2
    design = _points(plan, SimpleNamespace(get_trials=lambda deepcopy=False, states=None: []))  # the whole design
    assert [b[2] for b in before] == design[:3]  # the start-up design, in turns: fedavg, fedprox, fedavg
    kept = {b[0]: _digest(out / "trials" / f"trial{b[0]}") for b in finished}
    assert not (out / "confirm").exists()

    starts = []
    with pytest.MonkeyPatch.context() as mp:
        _watched(mp, [], ["search"], starts)
        result = select(_base(), out=out, **kwargs)
    after = {t.number: (t.state.name, t.params) for t in optuna.load_study(study_name=STUDY, storage=plan.storage).trials}
    for number, state, params, _ in finished:  # kept as they were, and their run folders untouched
        assert after[number] == (state, params)
        assert _digest(out / "trials" / f"trial{number}") == kept[number]
    new = sorted(n for n in after if n > 2)
    assert new and new == list(range(3, 3 + len(new)))  # the numbering continues
    search_runs = [c for c in starts if Path(c["output"]["dir"]).parent == out / "trials"]
    assert len(search_runs) == len(new)  # only new trials ran: no finished one again
    new_params = [after[n][1] for n in new]
    assert new_params[0] == before[2][2]  # the stopped start-up point first, then the design's next
    assert new_params[1] == design[3]
    finished_points = [json.dumps(p, sort_keys=True) for s, p in after.values() if s in ("COMPLETE", "PRUNED")]
    assert not any(finished_points.count(json.dumps(p, sort_keys=True)) > 1 for p in design)
    # the budget counts the first select's trials too
    trials = result["trials"]
    assert sum(t["rounds"] for t in trials) + plan.confirmation_rounds <= kwargs["budget_rounds"]
    assert (out / "recommendation.yaml").is_file()
    # once more: the budget is spent and the confirmation finished; nothing runs again, the same answer
    confirmed, starts = _digest(out / "confirm"), []
    with pytest.MonkeyPatch.context() as mp:
        _watched(mp, [], ["search"], starts)
        again = select(_base(), out=out, **kwargs)
    assert starts == [] and len(again["trials"]) == len(trials)
    assert (again["choice"], again["text"]) == (result["choice"], result["text"])
    assert {k: v for k, v in _digest(out / "confirm").items() if "/seed" in k} == \
        {k: v for k, v in confirmed.items() if "/seed" in k}
    # a third seed (the budget raised by its rounds): accepted as the same select; the search as
    # it was, the confirmed runs untouched, and only the new seed's runs
    more, starts = {**kwargs, "seeds": [1, 2, 3], "budget_rounds": kwargs["budget_rounds"] + 2 * 6}, []
    with pytest.MonkeyPatch.context() as mp:
        _watched(mp, [], ["search"], starts)
        grown = select(_base(), out=out, **more)
    assert len(grown["trials"]) == len(trials)
    assert sorted(Path(c["output"]["dir"]).name for c in starts) == ["seed3", "seed3"]
    now = _digest(out / "confirm")
    assert all(now[k] == v for k, v in confirmed.items() if "/seed" in k)
    assert sorted((r["algorithm"], r["completed"] + r["diverged"]) for r in grown["rows"]) == [("fedavg", 3), ("fedprox", 3)]


def test_recommendation_yaml_runs_under_fedrift_run(better, tmp_path, monkeypatch, capsys):
    rec = better.out / "recommendation.yaml"
    text = rec.read_text()
    assert text.startswith("# fedrift select: ")
    doc = yaml.safe_load(text)
    values = yaml.safe_load((better.out / "candidates.yaml").read_text())[better.result["choice"]]["overrides"]
    assert doc["algorithm"]["name"] == "fedprox" and "output" not in doc
    assert doc["train"]["lr"] == values["train.lr"] and doc["algorithm"]["mu"] == values["algorithm.mu"]
    assert doc["partition"] == _base()["partition"] and doc["train"]["rounds"] == 6
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["run", "-c", str(rec)]) == 0, capsys.readouterr().err
    summaries = list(tmp_path.glob("runs/**/summary.json"))
    assert len(summaries) == 1
    summary = json.loads(summaries[0].read_text())
    assert summary["status"] == "completed" and summary["algorithm"] == "fedprox" and summary["rounds"] == 6


def test_the_search_reads_no_test_metric(better):
    read = {k for phase, k in better.reads if phase == "search"}
    assert "round" in read and better.phase[0] == "confirmation"  # the recording saw the search's reads
    test_like = sorted(k for k in read if "test" in k or "local" in k or k in ("final_accuracy", "best_accuracy"))
    assert not test_like, f"the search read {test_like}"
    assert read <= SEARCH_KEYS, read - SEARCH_KEYS
    assert "val_accuracy" in read


def test_report_metric_ranks_the_confirmation_on_the_worst_10_percent_and_reruns_no_trial(better, tmp_path):
    """The same select again with ``metric="local_accuracy_worst10"`` (a rerun: the trials and the
    confirmation's runs are reused): the confirmation's table ranks on it, the verdict is judged
    on it and says so at its head; FedProx's worst 10% of clients beats crippled FedAvg's."""
    import shutil

    out = tmp_path / "select"
    shutil.copytree(better.out, out)
    result = select(_base(), out=out, **better.kwargs, metric="local_accuracy_worst10")
    assert len(result["trials"]) == len(better.result["trials"])  # no trial ran
    assert result["metric"] == "local_accuracy_worst10" and result["judged_on"] == "final_local_accuracy_worst10"
    assert result["choice"] == "fedprox" and result["text"].startswith(
        "ranked on report.metric=local_accuracy_worst10 (the mean accuracy of the worst 10% of clients"), result["text"]
    assert "on worst 10% local accuracy" in result["text"]
    rows = {r["algorithm"]: r for r in result["rows"]}
    assert rows["fedprox"]["rank"] == 1 and rows["fedprox"]["rank_metric"] == "final_local_accuracy_worst10"
    assert rows["fedprox"]["final_local_accuracy_worst10_diff_n"] == 3
    assert "rank (worst 10% local)" in (out / "confirm" / "results.md").read_text()
    assert result["text"] in (out / "select.md").read_text()
    assert (out / "recommendation.yaml").read_text().startswith(
        "# fedrift select: ranked on report.metric=local_accuracy_worst10")
    with pytest.raises(ConfigError, match="report.metric: 'worst' is not a metric to rank on; allowed: accuracy"):
        select(_base(), out=tmp_path / "other", **better.kwargs, metric="worst")
    assert not (tmp_path / "other").exists()


def test_report_metric_on_selects_command_line(tmp_path, capsys, monkeypatch):
    import fedrift.experiments.select as select_module

    seen = {}
    monkeypatch.setattr(select_module, "select", lambda *a, **kw: seen.update(kw))
    assert main(["select", "-c", str(_cli_cfg(tmp_path)), "--budget-rounds", "500",
                 "report.metric=local_accuracy_worst10"]) == 0
    assert seen["metric"] == "local_accuracy_worst10"
    monkeypatch.undo()
    out = tmp_path / "s"
    one_line_refusal(capsys, ["select", "-c", str(_cli_cfg(tmp_path)), "--out", str(out), "--budget-rounds", "500",
                              "report.metric=worst"],
                     "report.metric: 'worst' is not a metric to rank on; allowed: accuracy, local_accuracy, "
                     "local_accuracy_worst10")
    one_line_refusal(capsys, ["select", "-c", str(_cli_cfg(tmp_path)), "--out", str(out), "--budget-rounds", "500",
                              "report.tsne=none"], "not select options", "report.metric=")
    assert not out.exists()


def _cli_cfg(tmp_path, **partition) -> Path:
    cfg = _base()
    cfg["partition"] = {**cfg["partition"], **partition}
    cfg["partition"] = {k: v for k, v in cfg["partition"].items() if v is not None}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("args, says", [
    (["algorithms=fedavg,fedprox"], "select needs a budget; allowed: --budget DURATION"),
    (["--budget", "2 hours"], "--budget: '2 hours' is not a duration; allowed: 2h, 90m"),
    (["--budget", "0s"], "--budget: '0s' is no time"),
    (["--budget-rounds", "500", "algorithms=fedavg,fedproto"], "algorithms: fedproto has per-client models"),
    (["--budget-rounds", "500", "top=0"], "top: 0; allowed: an integer >= 1"),
    (["--budget-rounds", "500", "seeds=3"], "seeds: [3]; allowed: at least 2 distinct seeds"),
    (["--budget-rounds", "500", "output.dir=x"], "output.dir: select sets every run's output keys"),
    (["--budget-rounds", "500", "algorithms=fedavg"], "algorithms: select needs FedAvg and at least one other entry"),
])
def test_refusals_are_one_line_and_write_nothing(tmp_path, capsys, args, says):
    out = tmp_path / "s"
    one_line_refusal(capsys, ["select", "-c", str(_cli_cfg(tmp_path)), "--out", str(out), *args],
                     "fedrift: error: ", says)
    assert not out.exists()


def test_output_progress_false_is_accepted_for_a_script(tmp_path, capsys):
    """select's runs show no progress bar: a script may say output.progress=false (issue 52);
    another output key, or a bar, is refused."""
    plan = _plan(tmp_path / "s", {"algorithms": ["fedavg", "fedprox"], "budget_rounds": 500,
                                  "overrides": ["output.progress=false"]})
    assert plan.entries and not (tmp_path / "s").exists()
    one_line_refusal(capsys, ["select", "-c", str(_cli_cfg(tmp_path)), "--out", str(tmp_path / "s"), "--budget-rounds",
                              "500", "output.progress=true"], "output.progress: select sets every run's output keys",
                     "allowed: --out for its folder, output.progress=false")


def test_a_config_without_a_validation_share_is_refused(tmp_path, capsys):
    out = tmp_path / "s"
    one_line_refusal(capsys, ["select", "-c", str(_cli_cfg(tmp_path, val_share=None)), "--out", str(out),
                              "--budget-rounds", "500"], "fedrift: error: partition.val_share: ", "never reads the test set")
    assert not out.exists()


def test_a_folder_of_another_select_is_refused(better, tmp_path, capsys):
    cfg = _base(rounds=5)  # another config than the folder's
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    before = _digest(better.out)
    line = one_line_refusal(capsys, ["select", "-c", str(path), "--out", str(better.out), "--budget-rounds", "200",
                                     f"algorithms=fedavg:{CRIPPLE},fedprox", "seeds=1,2,3", "top=1", "startup=1",
                                     "min_rounds=2", "space.train.lr=log:0.03:0.3"],
                            f"--out: {better.out} holds a select of another config or field (differs in base, rounds)")
    assert line.startswith("fedrift: error: ")
    assert _digest(better.out) == before


@pytest.mark.parametrize("text, seconds", [
    ("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("45s", 45), ("3600", 3600), ("1.5h", 5400), (" 2H ", 7200),
    ("1h 30m", 5400), ("2 h", 7200), ("0.5", 0.5),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["2 hours", "2hours", "h", "", "-5", "1d", "5m30", "two", "1h1h", "30m1h"])
def test_parse_duration_refuses_what_is_no_duration(text):
    with pytest.raises(ConfigError, match=r"^--budget: .* is not a duration; allowed: "):
        parse_duration(text)


@pytest.mark.process
def test_ctrl_c_on_a_parallel_select_stops_its_trials_as_interrupted(tmp_path):
    """A terminal's Ctrl-C on `select --jobs 2` while two trials train (the pool is compare's
    and tune's, whose tests also send `kill -INT` to the command alone): one line on stderr
    within seconds, exit 130, both trials in the study as interrupted (state fail: a rerun runs
    their points again) and their runs' summaries say so; nothing else starts, no confirmation."""
    from conftest import ctrl_c_cli

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_base(rounds=100_000)))  # trials that never end on their own
    out = tmp_path / "select"

    def both_train() -> bool:
        return len([m for m in out.glob("trials/trial*/metrics.jsonl") if m.read_text().count("\n") >= 2]) >= 2

    r = ctrl_c_cli(["select", "-c", str(cfg), "--out", str(out), "--budget-rounds", "10000000", "--jobs", "2",
                    "algorithms=fedavg,fedprox", "seeds=1,2", "top=1", "startup=1", "min_rounds=50000",
                    "space.train.lr=log:0.03:0.3"], both_train)
    assert r.code == 130 and r.err.strip().splitlines() == [
        "fedrift: interrupted; the trials or runs in progress were stopped and recorded as interrupted; run the same "
        "fedrift select command again to continue (finished trials and runs are kept)"], r.err
    assert r.line_s < 8.0, f"the line came {r.line_s:.1f} s after the signal (exit after {r.exit_s:.1f} s)"
    assert r.exit_s < 30.0, f"exit {r.exit_s:.1f} s after the signal"
    runs = sorted(p.parent for p in out.glob("trials/trial*/config.yaml"))
    assert len(runs) == 2 and [json.loads((d / "summary.json").read_text())["status"] for d in runs] == ["interrupted"] * 2
    st = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{out / 'study.db'}")
    assert [(t.state.name, t.user_attrs.get("status")) for t in st.trials] == [("FAIL", "interrupted")] * 2
    assert not (out / "confirm").exists()


def test_the_design_starts_at_the_centre_of_each_entry_space(tmp_path):
    """Every entry's first start-up point is its space's centre (the geometric middle of a log
    range: sqrt(0.005 x 0.5) for the default learning rate, sqrt(1e-4 x 1) for FedProx's mu),
    the second its Sobol design's first point; in turns over the entries."""
    kwargs = _quiet(algorithms=["fedavg", "fedprox"], budget_rounds=60, startup=2, space=None)
    design = _points(_plan(tmp_path / "s", kwargs), SimpleNamespace(get_trials=lambda deepcopy=False, states=None: []))
    assert [p["algorithm"] for p in design] == ["fedavg", "fedprox", "fedavg", "fedprox"]
    assert design[0] == {"algorithm": "fedavg", "fedavg/train.lr": pytest.approx(0.05)}
    assert design[1] == {"algorithm": "fedprox", "fedprox/train.lr": pytest.approx(0.05),
                         "fedprox/algorithm.mu": pytest.approx(0.01)}
    assert design[2] != design[0] and 0.005 <= design[2]["fedavg/train.lr"] <= 0.5


def test_a_trial_no_better_than_one_stopped_at_its_rung_stops(tmp_path):
    """Rungs at 2 and 6 rounds: a trial at 0.10 after 2 rounds stops when a trial stopped at
    that rung scored 0.10 there (a tie at chance level), goes on at 0.11; trials stopped by
    the budget, or stopped at another rung, or still running, do not count."""
    plan = _plan(tmp_path / "s", _quiet(algorithms=["fedavg", "fedprox"], budget_rounds=60))
    assert plan.rungs == [2, 6]

    def trial(number, steps, status="pruned"):
        return SimpleNamespace(number=number, intermediate_values=steps, user_attrs={"status": status})

    def check(others, score):
        study = SimpleNamespace(get_trials=lambda deepcopy=False, states=None: others)
        return _no_better_than_stopped(plan, SimpleNamespace(number=9, study=study), 2, score)

    at_chance = trial(1, {1: 0.08, 2: 0.10})
    assert check([at_chance], 0.10) and check([at_chance], 0.09)
    assert not check([at_chance], 0.11)
    assert not check([trial(2, {1: 0.1, 2: 0.10}, status="budget")], 0.10)
    assert not check([trial(3, {2: 0.10, 3: 0.2, 6: 0.3})], 0.10)  # went past the rung: stopped at the next
    assert not check([], 0.10)


def _t(trial, entry, rounds, score, status="pruned"):
    return {"trial": trial, "entry": entry, "rounds": rounds, "score": score, "status": status}


def test_ranking_puts_most_rounds_first_then_the_score_and_fedavg_is_always_the_reference():
    plan = SimpleNamespace(top=2)
    trials = [
        _t(0, "fedavg", 6, 0.70, "completed"), _t(1, "fedprox", 2, 0.95), _t(2, "fedprox", 6, 0.80, "completed"),
        _t(3, "fedprox", 6, 0.85, "completed"), _t(4, "moon", 6, 0.99, "diverged"), _t(5, "moon", 2, 0.60),
        _t(6, "fedgkd", 2, 0.90), _t(7, "scaffold", 2, None), _t(8, "scaffold", 2, math.nan),
        _t(9, "fedavg", 2, 0.99),
    ]
    ranked = ranking(plan, trials)
    # per entry its best trial: the most rounds, then the score; diverged and unscored ones not at all
    assert [(t["entry"], t["trial"]) for t in ranked] == [("fedprox", 3), ("fedavg", 0), ("fedgkd", 6), ("moon", 5)]
    # FedAvg first though ranked second, then the top 2 others
    assert [(t["entry"], t["trial"]) for t in candidates(plan, trials)] == [("fedavg", 0), ("fedprox", 3), ("fedgkd", 6)]
    # FedAvg with options is the reference too, however far behind
    crippled = [_t(0, "fedavg:train.weight_decay=3", 2, 0.10), _t(1, "fedprox", 6, 0.9, "completed"),
                _t(2, "fedgkd", 6, 0.8, "completed"), _t(3, "moon", 6, 0.7, "completed")]
    assert [t["entry"] for t in candidates(plan, crippled)] == ["fedavg:train.weight_decay=3", "fedprox", "fedgkd"]
    # no FedAvg trial: no reference (select then refuses to confirm)
    assert [t["entry"] for t in candidates(plan, crippled[1:])] == ["fedprox", "fedgkd"]
    assert candidates(plan, []) == [] and ranking(plan, []) == []


def _row(entry, val, mean=None, low=None, high=None, significant=False, n=3, p=None):
    return {"algorithm": entry, "best_val_accuracy_mean": val, "test_accuracy_at_best_val_diff_mean": mean,
            "test_accuracy_at_best_val_diff_p": p,
            "test_accuracy_at_best_val_diff_ci95": None if mean is None else (high - low) / 2,
            "test_accuracy_at_best_val_diff_low": low, "test_accuracy_at_best_val_diff_high": high,
            "test_accuracy_at_best_val_diff_significant": significant, "test_accuracy_at_best_val_diff_n": n}


def test_an_entry_that_fails_fails_its_trials_and_the_search_goes_on(tmp_path, monkeypatch):
    """An exception in one entry's runs (a bug, a library error) marks its trials failed with
    the error, and the search, the confirmation and the recommendation go on without it."""
    real_run = fedrift.api.run

    def failing(config=None, overrides=None, resume=False, on_round=None):
        if config["algorithm"]["name"] == "fedgkd":
            raise RuntimeError("a bug in this entry")
        return real_run(config, overrides, resume, on_round)

    monkeypatch.setattr(fedrift.api, "run", failing)
    out = tmp_path / "s"
    kwargs = _quiet(algorithms=["fedavg", "fedprox", "fedgkd"], budget_rounds=40, seeds=[1, 2])
    rec = select(_base(), out=out, **kwargs)
    trials = _trials(_plan(out, kwargs))
    failed = [t for t in trials if t["entry"] == "fedgkd"]
    assert failed and all(t["state"] == "fail" and t["status"] == "error: RuntimeError: a bug in this entry"
                          for t in failed)
    assert any(t["entry"] == "fedprox" and t["rounds"] > 0 for t in trials)
    assert rec["choice"] in ("fedavg", "fedprox") and (out / "recommendation.yaml").is_file()


def test_a_trial_stopped_by_the_budget_is_not_an_entrys_tuning(tmp_path):
    """Issue 72: FedProx's first trial, stopped by the budget at round 2, counted as one of its
    2 trials against 5 and 6. Such a trial stands for its entry in the ranking only when the
    entry has no other; it counts for no entry's trials (nor for FedAvg's owed trial); its
    start-up point is proposed again, so that a larger budget runs it."""
    from fedrift.experiments.select import _owed_reference, _tuning

    plan = SimpleNamespace(top=2)
    trials = [_t(0, "fedavg", 6, 0.70, "completed"), _t(1, "fedprox", 2, 0.50), _t(2, "fedprox", 4, 0.90, "budget"),
              _t(3, "moon", 3, 0.60, "budget")]
    assert [(t["entry"], t["trial"]) for t in ranking(plan, trials)] == [("fedavg", 0), ("moon", 3), ("fedprox", 1)]
    real = _plan(tmp_path / "s", _quiet(algorithms=["fedavg", "fedprox"], budget_rounds=60))
    mine = [{**t, "state": "pruned", "values": {}} for t in trials if t["entry"] != "moon"]
    assert {e: (v["trials"], v["cut"]) for e, v in _tuning(real, mine).items()} == {"fedavg": (1, 0), "fedprox": (1, 1)}
    assert _owed_reference(real, mine) is None  # 1 trial each: FedAvg is not behind
    owed = _owed_reference(real, [*mine, {**mine[1], "trial": 4, "status": "pruned"}])
    assert owed is not None and owed["algorithm"] == "fedavg"
    # the design: a point the budget stopped is proposed again, one pruned is not
    design = _points(real, SimpleNamespace(get_trials=lambda deepcopy=False, states=None: []))

    def stopped(status):
        return SimpleNamespace(params=design[1], user_attrs={"status": status, "rounds": 2}, state=SimpleNamespace(name="PRUNED"))

    for status, proposed in (("budget", True), ("pruned", False)):
        st = SimpleNamespace(get_trials=lambda deepcopy=False, states=None, s=status: [stopped(s)])
        assert (design[1] in _points(real, st)) is proposed, status
