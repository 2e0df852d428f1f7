"""fedrift select's plan: the costs measured per round (not per trial), the confirmation fitted
to the budget (all, fewer candidates, fewer seeds, none), the least budget refused with the
page written, the order (FedAvg first), the first rung's floor, entries that train as FedAvg
at first judged later, --dry-run writing nothing, a provisional recommendation when the
budget pays for part of the confirmation, and more seeds confirming only, past the budget.
The arithmetic by hand; the runs on tiny digits configs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import one_line_refusal, tiny_config
from fedrift.cli import main
from fedrift.errors import ConfigError
from fedrift.experiments.select import (
    _trials, apply_floor, budget_plan, build_select, floor_round, judged_from, select,
)
from fedrift.experiments.select_plan import (
    MARGIN, OVERHEAD_S, Cost, confirmation_cost, cost_of_trial, estimate_room, fit_confirmation, kept_back, make_plan,
    measured_costs, order, trial_rounds,
)

LR = {"train.lr": "log:0.03:0.3"}


def _base(rounds: int = 6) -> dict:
    cfg = tiny_config(Path("."), train={"rounds": rounds}, partition={"val_share": 0.2})
    cfg.pop("output")
    return cfg


def _t(entry, rounds, seconds, first_round=0, first_seconds=0.0):
    return {"entry": entry, "rounds": rounds, "seconds": seconds, "first_round": first_round,
            "first_seconds": first_seconds}


def test_a_round_costs_what_the_rounds_after_the_first_took_and_the_start_up_is_apart():
    # first round reported 5 s after the start, the 10th at 23 s: 2 s a round, 3 s of start-up
    assert cost_of_trial(_t("fedavg", 10, 23.0, 1, 5.0)) == pytest.approx((2.0, 3.0))
    assert cost_of_trial(_t("fedavg", 1, 7.0, 1, 7.0)) == (7.0, 0.0)  # one round: an upper bound
    assert cost_of_trial(_t("fedavg", 0, 0.0)) is None


def test_the_confirmation_estimate_is_not_inflated_by_start_ups():
    """Issue 51: 17 min estimated for runs that took 10.3, from trials stopped at a round or
    three whose start-up was counted in every round. Here 20 s of start-up and 10 s a round:
    a trial stopped at round 3 reports round 1 at 30 s and round 3 at 50 s; one stopped at
    round 1 only its 30 s (used only when no trial told the start-up apart). A confirmation of
    2 entries x 3 seeds x 12 rounds is 6 x (20 + 12 x 10) = 840 s; a whole-trial rate
    (50/3 and 30 s a round) would have said 6 x 12 x 23.3 = 1680 s."""
    trials = [_t("fedavg", 3, 50.0, 1, 30.0), _t("fedavg", 1, 30.0, 1, 30.0), _t("fedprox", 3, 50.0, 1, 30.0)]
    costs = measured_costs(trials, ["fedavg", "fedprox", "moon"])
    assert costs["fedavg"] == Cost(10.0, 20.0, "trials")
    assert costs["moon"].source == "assumed" and costs["moon"].per_round == 10.0  # the median measured entry
    seconds, rounds = confirmation_cost(["fedavg", "fedprox"], [1, 2, 3], 12, costs)
    assert (seconds, rounds) == (pytest.approx(840.0), 72)
    assert confirmation_cost(["fedavg", "fedprox"], [1, 2, 3], 12, costs, jobs=2)[0] == pytest.approx(420.0)
    # runs finished in an earlier confirmation cost nothing
    assert confirmation_cost(["fedavg", "fedprox"], [1, 2, 3], 12, costs, done=lambda e, s: s < 3)[0] == pytest.approx(280.0)
    assert measured_costs([], ["fedavg"]) == {}


def test_the_confirmation_fits_the_room_with_fewer_candidates_then_fewer_seeds():
    costs = {e: Cost(10.0, 20.0, "trials") for e in ("fedavg", "a", "b")}  # a run of 12 rounds: 140 s
    ranked, seeds = ["fedavg", "a", "b"], [1, 2, 3]

    def fit(room):
        c = fit_confirmation(ranked, seeds, 12, costs, room, None)
        return None if c is None else (c.entries, c.seeds, c.full)

    assert fit(1260) == (ranked, seeds, True)  # 9 runs
    assert fit(1259) == (["fedavg", "a"], seeds, False)  # 6 runs: 840 s, the best candidate kept
    assert fit(839) == (["fedavg", "a"], [1, 2], False)  # 4 runs: 560 s
    assert fit(559) is None  # never one seed
    assert fit_confirmation(["fedavg"], seeds, 12, costs, None, None) is None
    # a rounds room the same way: 9 x 12 = 108 rounds, 6 x 12, 4 x 12
    assert fit_confirmation(ranked, seeds, 12, costs, None, 107).entries == ["fedavg", "a"]
    assert fit_confirmation(ranked, seeds, 12, costs, None, 48).seeds == [1, 2]


def test_a_confirmation_already_run_fits_an_overspent_budget():
    """The same select again after its confirmation ran past the budget (its estimate was
    short): the room is below zero, but the runs are done (compare reuses them) and cost
    nothing, so the confirmation, and the answer, are the same; one run not done does not fit."""
    costs = {e: Cost(10.0, 20.0, "trials") for e in ("fedavg", "a")}
    ranked, seeds = ["fedavg", "a"], [1, 2]
    for room_s, room_r in ((-0.3, None), (None, -12), (-0.3, -12)):
        c = fit_confirmation(ranked, seeds, 12, costs, room_s, room_r, done=lambda e, s: True)
        assert c is not None and (c.entries, c.seeds, c.seconds, c.rounds) == (ranked, seeds, 0.0, 0)
        assert fit_confirmation(ranked, seeds, 12, costs, room_s, room_r, done=lambda e, s: s == 1) is None


def test_the_plan_keeps_the_least_search_and_refuses_only_what_cannot_pay_for_it():
    """2 entries, 6 rounds, rungs 2 and 6, 3 seeds, top 1: the least search is a trial of each
    entry to round 2 (4 rounds), the least confirmation 2 entries x 2 seeds x 6 rounds (24)."""
    kw = dict(entries=["fedavg", "fedprox"], reference="fedavg", rounds=6, rungs=[2, 6], eta=3, seeds=[1, 2, 3], top=1,
              costs={})
    plan = make_plan(**kw, budget_seconds=None, budget_rounds=27)
    assert plan["refused"].startswith("--budget-rounds: 27 cannot pay") and "at least 28" in plan["refused"]
    assert any(line.startswith("refused: ") for line in plan["lines"])
    plan = make_plan(**kw, budget_seconds=None, budget_rounds=28)  # 2 of 3 seeds fit beside the least search
    assert plan["refused"] is None and plan["confirmation"]["seeds"] == [1, 2] and not plan["confirmation"]["full"]
    assert plan["search"]["rounds"] == 28 - 24
    assert make_plan(**kw, budget_seconds=None, budget_rounds=39)["confirmation"]["seeds"] == [1, 2]
    # 36 + 4 would pay for everything asked, but the confirmation takes at most two thirds of
    # the budget where a smaller one fits there (26 rounds of 40: 2 seeds), the search the rest
    plan = make_plan(**kw, budget_seconds=None, budget_rounds=40)
    assert plan["confirmation"]["seeds"] == [1, 2] and plan["search"]["rounds"] == 40 - 24
    assert not make_plan(**kw, budget_seconds=None, budget_rounds=53)["confirmation"]["full"]
    plan = make_plan(**kw, budget_seconds=None, budget_rounds=54)  # 36 <= 2/3 x 54: everything asked
    assert plan["confirmation"]["full"] and plan["confirmation"]["rounds"] == 36
    # 100 rounds: 64 for the search, FedAvg's first trial 6 of them; a trial costs 2 + 4/3 rounds
    plan = make_plan(**kw, budget_seconds=None, budget_rounds=100)
    assert plan["search"]["trials_per_entry"] == pytest.approx((64 - 6) / (2 + 4 / 3) / 2)
    # in seconds: 1 s a round, 2 s of start-up; least search 2 x 4 s, least confirmation 4 runs x 8 s,
    # kept back with MARGIN (25%) more and OVERHEAD_S (1 s): 8 + 32 x 1.25 + 1 = 49 s
    timed = {**kw, "costs": {e: Cost(1.0, 2.0, "trials") for e in ("fedavg", "fedprox")}}
    refused = make_plan(**timed, budget_seconds=48.9, budget_rounds=None)["refused"]
    assert refused.startswith("--budget: 49 s cannot pay") and "at least about 49 s" in refused, refused
    assert "kept back with 25% more and 1 s for its tables" in refused and "\n" not in refused
    assert make_plan(**timed, budget_seconds=49, budget_rounds=None)["refused"] is None
    # the seconds the command spent before its search count: 3 s more needed; so do a report's 5 s
    assert "at least about 52 s" in make_plan(**timed, budget_seconds=49, budget_rounds=None, before_seconds=3)["refused"]
    assert "at least about 53 s" in make_plan(**timed, budget_seconds=49, budget_rounds=None, overhead=5.0)["refused"]
    assert trial_rounds([3, 9, 27, 30], 3) == pytest.approx(3 + 6 / 3 + 18 / 9 + 3 / 27)


def test_the_budget_that_would_do_is_rounded_up_and_passes():
    """A refusal names a budget that passes the same check: rounded up (5.2 min is "at least
    about 6 min", never 5), and the plan at that budget is not refused."""
    from fedrift.experiments.select_plan import _dur

    assert (_dur(312.0, up=True), _dur(312.0)) == ("6 min", "5 min")
    assert (_dur(48.2, up=True), _dur(48.2)) == ("49 s", "48 s")
    kw = dict(entries=["fedavg", "fedprox", "scaffold"], reference="fedavg", rounds=30, rungs=[3, 9, 27, 30], eta=3,
              seeds=[1, 2, 3], top=2, costs={e: Cost(2.0, 3.0, "probe") for e in ("fedavg", "fedprox", "scaffold")})
    # the demo's shape: least search 3 x (3 + 3 x 2) = 27 s, least confirmation 4 x 63 = 252 s kept
    # back as 316 s, the probe's 8 s: 351 s, 5.85 min
    refused = make_plan(**kw, budget_seconds=300, budget_rounds=None, before_seconds=8.0)["refused"]
    assert refused.startswith("--budget: 5 min cannot pay") and "at least about 6 min" in refused, refused
    assert "beside the 8 s the command spent before its search" in refused and "a timed probe of each entry" in refused
    assert make_plan(**kw, budget_seconds=350, budget_rounds=None, before_seconds=8.0)["refused"] is not None
    assert make_plan(**kw, budget_seconds=360, budget_rounds=None, before_seconds=8.0)["refused"] is None


def test_the_least_confirmation_is_kept_back_with_its_margin():
    """A confirmation fits a room once its estimate, 25% more and the overhead do."""
    assert kept_back(100.0) == pytest.approx(100 * (1 + MARGIN) + OVERHEAD_S) and kept_back(0.0) == 0.0
    assert kept_back(100.0, 5.0) == pytest.approx(130.0)
    assert estimate_room(kept_back(80.0)) == pytest.approx(80.0) and estimate_room(None) is None


def test_fedavg_first_then_the_cheapest_measured():
    costs = {"moon": Cost(3.0, 0, "trials"), "fedprox": Cost(1.0, 0, "trials"), "fedavg": Cost(2.0, 0, "trials"),
             "scaffold": Cost(2.0, 0, "assumed")}
    assert order(["moon", "scaffold", "fedprox", "fedavg"], "fedavg", costs) == ["fedavg", "fedprox", "scaffold", "moon"]
    assert order(["moon", "fedprox", "fedavg"], "fedavg", {}) == ["fedavg", "moon", "fedprox"]  # the field's order


def test_the_first_rungs_floor_is_where_fedavg_leaves_the_majority_class(tmp_path):
    # majority 10% of 100 samples: above 10% + 2 x 3% = 16%
    assert floor_round({1: 0.10, 2: 0.15, 3: 0.2, 4: 0.5}, 0.1, 100) == 3
    assert floor_round({1: 0.10, 2: 0.12}, 0.1, 100) is None and floor_round({1: 0.5}, None, 0) is None
    plan = build_select(_base(rounds=9), algorithms=["fedavg", "fedprox", "fedgkd"], budget_rounds=500, out=tmp_path / "s")
    assert plan.auto_rungs and plan.rungs == [1, 3, 9] and 0.05 < plan.majority < 0.2 and plan.n_val > 0
    curve = {1: plan.majority, 2: plan.majority, 3: 0.9}
    trials = [{"trial": 0, "entry": "fedavg", "curve": curve, "state": "complete", "rounds": 9}]
    floor = apply_floor(plan, trials)
    assert floor["rounds"] == 3 and plan.rungs == [3, 9] and "round 3" in floor["text"]
    # an entry that trains as FedAvg in round 1 (FedGKD) is judged a rung later; the others at the first
    assert [e.same_until for e in plan.entries] == [0, 0, 1]
    assert judged_from(plan, plan.entry("fedgkd")) == 9 and judged_from(plan, plan.entry("fedprox")) == 3
    given = build_select(_base(rounds=9), algorithms=["fedavg", "fedprox"], budget_rounds=500, min_rounds=1)
    assert apply_floor(given, trials) is None and given.rungs == [1, 3, 9]  # min_rounds= is taken as given


def _cfg(tmp_path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_base()))
    return path


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["select", "-c", str(_cfg(tmp_path)), "--out", str(out), "--budget", "10m", "--dry-run",
                 "algorithms=fedavg,fedprox", "seeds=1,2,3", "top=1", "space.train.lr=log:0.03:0.3"]) == 0
    said = capsys.readouterr().out
    assert not out.exists()
    lines = [ln for ln in said.splitlines() if ln.startswith("select --dry-run: ")]
    assert any("field: 2 entries, in this order: fedavg, fedprox" in ln for ln in lines), said
    assert any("confirmation: 1 candidate and FedAvg over 3 seeds (6 runs of 6 rounds, about" in ln for ln in lines), said
    assert any("estimate: times from a timed probe of each entry" in ln for ln in lines), said
    assert any("fedprox" in ln and "s a round" in ln and "(probe)" in ln for ln in lines), said
    assert lines[-1] == "select --dry-run: nothing was written (dry run)"


def test_a_budget_too_small_is_refused_in_one_line_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "s"
    one_line_refusal(capsys, ["select", "-c", str(_cfg(tmp_path)), "--out", str(out), "--budget-rounds", "27",
                              "algorithms=fedavg,fedprox", "seeds=1,2,3", "top=1", "min_rounds=2"],
                     "fedrift: error: --budget-rounds: 27 cannot pay for the least search", "at least 28")
    assert not out.exists()  # nothing written
    with pytest.raises(ConfigError, match="at least 28"):  # and from Python the same
        select(_base(), out=tmp_path / "t", algorithms=["fedavg", "fedprox"], budget_rounds=27, seeds=[1, 2, 3], top=1,
               min_rounds=2, verbose=False)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("report, need", [(True, 53), (False, 49)])
def test_a_time_budget_is_checked_on_fedavgs_probe_before_any_trial(tmp_path, capsys, monkeypatch, report, need):
    """--budget: FedAvg timed by a probe (here its costs given: 1 s a round, 2 s of start-up,
    every entry assumed to cost as much) before any trial; a budget below the least search
    (2 x 4 s) and the least confirmation (4 runs x 8 s, kept back with 25% more and the
    tables' 1 s, or the reports' 5 s) is refused in one line naming the budget that would do;
    nothing is written, no run starts. The budget named passes the same check."""
    import fedrift.api
    from fedrift.experiments import select as select_module

    probed, started = [], []
    monkeypatch.setattr(select_module, "probe", lambda plan, echo, entries=None: probed.append(entries) or
                        {plan.reference: Cost(1.0, 2.0, "probe")})
    monkeypatch.setattr(fedrift.api, "run", lambda *a, **k: started.append(a) or {})
    out = tmp_path / "s"
    args = ["select", "-c", str(_cfg(tmp_path)), "--out", str(out), "algorithms=fedavg,fedprox", "seeds=1,2,3", "top=1",
            "min_rounds=2", *([] if report else ["--no-report"])]
    line = one_line_refusal(capsys, [*args, "--budget", "45s"], "fedrift: error: --budget: 45 s cannot pay for the least "
                            "search (about 8 s: one trial of each entry to round 2)",
                            "(entries not probed assumed to cost as much as those probed")
    assert not out.exists() and not started
    assert [[e.entry for e in entries] for entries in probed] == [["fedavg"]]  # FedAvg alone, once
    # 49 s (53 s with the reports), and what the command spent before (the field built: a second or
    # two on the tests' machines), rounded up
    would = int(re.search(r"allowed: at least about (\d+) s,", line).group(1))
    assert need <= would <= need + 5, line
    plan = build_select(_base(), algorithms=["fedavg", "fedprox"], budget=f"{would}s", seeds=[1, 2, 3], top=1,
                        min_rounds=2, out=out)
    plan.overhead = 5.0 if report else 1.0
    select_module.check_budget(plan, {}, 1, lambda _: None)  # passes (the budget named would do)
    assert not out.exists() and line.count("--budget") == 1


@pytest.fixture(scope="module")
def provisional(tmp_path_factory):
    """34 rounds: 2 of the 3 seeds' confirmation (24) and a search of 10 (FedAvg's first trial
    6 of them); the first rung waits for FedAvg's first trial (no min_rounds)."""
    out = tmp_path_factory.mktemp("provisional") / "s"
    kwargs = {"algorithms": ["fedavg", "fedprox"], "seeds": [1, 2, 3], "top": 1, "startup": 1, "space": LR,
              "report": False, "verbose": False}
    result = select(_base(), out=out, budget_rounds=34, **kwargs)
    return SimpleNamespace(out=out, result=result, kwargs=kwargs, page=(out / "select.md").read_text(),
                           state=json.loads((out / "select.json").read_text()),
                           seeds=sorted(p.name for p in (out / "confirm").glob("*/seed*")))


def test_a_confirmation_the_budget_cannot_pay_in_full_recommends_provisionally(provisional):
    result, out = provisional.result, provisional.out
    assert result["outcome"] == "provisional" and result["confirmed"] == {"entries": ["fedavg", "fedprox"], "seeds": [1, 2]}
    assert provisional.seeds == ["seed1", "seed1", "seed2", "seed2"]
    trials = result["trials"]
    assert sum(t["charged"] for t in trials) + 24 <= 34
    # FedAvg's first trial ran first, at its centre, every round; it set the first rung
    assert trials[0]["entry"] == "fedavg" and trials[0]["rounds"] == 6 and trials[0]["status"] == "completed"
    state = provisional.state
    assert state["floor"]["rounds"] is None or state["floor"]["rounds"] >= 1
    assert state["confirmation"] == {"entries": ["fedavg", "fedprox"], "seeds": [1, 2], "asked": [1, 2, 3], "full": False}
    page = provisional.page
    assert "provisional" in page and "2 of 3 seeds" in page, page
    assert (out / "recommendation.yaml").is_file()


def test_more_seeds_after_the_budget_is_spent_confirm_only(provisional):
    """The same command with seeds=1,2,3,4 and the budget spent: no trial, only the two new
    seeds' runs of the confirmed entries, a recommendation (not 'no recommendation')."""
    import fedrift.api

    out, real = provisional.out, fedrift.api.run
    before = len(provisional.result["trials"])
    started = []

    def run(config=None, overrides=None, resume=False, on_round=None):
        started.append(Path(config["output"]["dir"]))
        return real(config, overrides, resume, on_round=on_round)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fedrift.api, "run", run)
        more = select(_base(), out=out, budget_rounds=34, **{**provisional.kwargs, "seeds": [1, 2, 3, 4]})
    assert len(more["trials"]) == before and all(p.parent.parent == out / "confirm" for p in started)
    assert sorted(p.name for p in started) == ["seed3", "seed3", "seed4", "seed4"]
    assert more["outcome"] == "recommended" and more["confirmed"]["seeds"] == [1, 2, 3, 4]
    assert sorted(r["algorithm"] for r in more["rows"]) == ["fedavg", "fedprox"]
    plan = build_select(_base(), out=out, budget_rounds=34, **{k: v for k, v in provisional.kwargs.items()
                                                                if k not in ("report", "verbose")})
    assert budget_plan(plan, _trials(plan))["confirmation"] is not None


def test_ccvr_is_calibrated_at_the_rungs_and_a_search_with_nothing_to_confirm_writes_its_page(tmp_path, monkeypatch):
    """The search sets CCVR's calibrate_at to the rungs (its rungs compare calibrated scores);
    a search whose trials all fail ends 'no recommendation' in one line, with the page."""
    import fedrift.api

    seen = []

    def failing(config=None, overrides=None, resume=False, on_round=None):
        seen.append(config)
        raise RuntimeError("not run here")

    monkeypatch.setattr(fedrift.api, "run", failing)
    out = tmp_path / "s"
    from fedrift.algorithms import ALGORITHMS

    assert "calibrate_at" in ALGORITHMS.get("ccvr").params.__dataclass_fields__
    with pytest.raises(ConfigError, match=r"^--budget: the search finished no trial .*nothing to confirm.*the page: "):
        select(_base(), out=out, algorithms=["fedavg", "ccvr"], budget_rounds=28, seeds=[1, 2], top=1, min_rounds=2,
               verbose=False, report=False)
    ccvr = [c for c in seen if c["algorithm"]["name"] == "ccvr"]
    assert ccvr
    assert all(c["algorithm"]["calibrate_at"] == [2, 6] for c in ccvr), ccvr[:1]
    assert all("calibrate_at" not in c["algorithm"] for c in seen if c["algorithm"]["name"] == "fedavg")
    page = (out / "select.md").read_text()
    assert "no recommendation" in page.lower() and (out / "select.html").is_file()


def test_ccvr_is_scored_on_its_calibrated_rounds_only(tmp_path, monkeypatch):
    """CCVR's output is its calibrated model: a round it does not calibrate (between the
    rungs) keeps the last calibrated score, never its uncalibrated model's higher one."""
    import fedrift.api

    def rows(config=None, overrides=None, resume=False, on_round=None):
        if on_round is None:  # the confirmation's runs: not this test's
            raise ConfigError("not confirmed here")
        ccvr = config["algorithm"]["name"] == "ccvr"
        for r in range(1, 7):
            row = {"round": r, "val_accuracy": 0.9 if ccvr else 0.3}
            if ccvr and r in config["algorithm"]["calibrate_at"]:
                row["calibrated_val_accuracy"] = 0.1 * r  # 0.2 at round 2, 0.6 at 6
            on_round(row)
        raise RuntimeError("no result here")

    monkeypatch.setattr(fedrift.api, "run", rows)
    out = tmp_path / "s"
    with pytest.raises(ConfigError):
        select(_base(), out=out, algorithms=["fedavg", "ccvr"], budget_rounds=28, seeds=[1, 2], top=1, min_rounds=2,
               verbose=False, report=False)
    plan = build_select(_base(), out=out, algorithms=["fedavg", "ccvr"], budget_rounds=28, seeds=[1, 2], top=1,
                        min_rounds=2)
    curves = [t["curve"] for t in _trials(plan) if t["entry"] == "ccvr"]
    assert curves and all(c for c in curves), curves
    for curve in curves:  # no round 1 (nothing calibrated yet); the calibrated best so far after
        assert min(curve) == 2 and all(abs(v - 0.1 * max(k for k in (2, 6) if k <= r)) < 1e-9
                                       for r, v in curve.items()), curve
