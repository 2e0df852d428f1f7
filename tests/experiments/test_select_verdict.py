"""select's verdict says only what the seeds show (issue 51 item 3), on hand-built
confirmations: no training. The rows are those ``fedrift compare`` computes (the report's
own ``summarize`` over run folders written here), so the paired statistics are the real ones."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedrift.errors import ConfigError
from fedrift.experiments.select_verdict import MARGIN, SIGN_FLIP_SEEDS, recommend, rerun_command, six_seeds
from fedrift.report.table import load_groups, summarize

MB = 1e6


def _confirm(root: Path, diffs: dict[str, list[float | None]], seeds: list[int], ref_val: float = 0.70,
             vals: dict[str, float] | None = None, down: dict[str, float] | None = None,
             worst10: dict[str, list[float]] | None = None) -> list[dict]:
    """A confirmation folder as compare writes it: FedAvg at 0.40 test accuracy (at best
    validation) on every seed, each other entry at 0.40 + its diff (None: that run did not
    finish); ``worst10``: per entry (FedAvg's too) its runs' ``final_local_accuracy_worst10`` by
    seed; returns compare's rows (FedAvg the reference)."""
    root.mkdir(parents=True, exist_ok=True)
    entries = {"fedavg": [0.0] * len(seeds), **diffs}
    settings = []
    for entry, ds in entries.items():
        settings.append({"label": entry, "algorithm": entry, "sweep": {}, "dir": entry})
        for seed, d in zip(seeds, ds):
            run = root / entry / f"seed{seed}"
            run.mkdir(parents=True, exist_ok=True)
            if d is None:
                continue
            val = ref_val if entry == "fedavg" else (vals or {}).get(entry, ref_val + 0.02)
            per_round = (down or {}).get(entry, 33.8 * MB)
            (run / "summary.json").write_text(json.dumps({
                "status": "completed", "seed": seed, "rounds": 10, "best_accuracy": 0.4 + d, "final_accuracy": 0.4 + d,
                "test_accuracy_at_best_val": 0.4 + d, "best_val_accuracy": val,
                "bytes_down_total": 10 * per_round, "bytes_up_total": 10 * 33.8 * MB,
                **({"final_local_accuracy": 0.5, "final_local_accuracy_worst10": worst10[entry][seeds.index(seed)]}
                   if worst10 and entry in worst10 else {})}))
    (root / "compare.json").write_text(json.dumps({"settings": settings, "seeds": seeds}))
    groups, _ = load_groups(root)
    return summarize(groups, reference="fedavg")


def _plan(tmp_path: Path, seeds: list[int]) -> SimpleNamespace:
    return SimpleNamespace(root=tmp_path, seeds=seeds, seed=0, rounds=12)


PICKED = [{"entry": "fedavg", "values": {"train.lr": 0.05}, "score": 0.70, "rounds": 12, "trial": 0},
          {"entry": "fedadc", "values": {"train.lr": 0.0124, "algorithm.beta": 0.9}, "score": 0.72, "rounds": 12, "trial": 3}]
TRIALS = ([{"entry": "fedavg", "rounds": r, "status": "pruned"} for r in (1, 1, 3)]
          + [{"entry": "fedavg", "rounds": 12, "status": "completed"}]
          + [{"entry": "fedadc", "rounds": r, "status": "pruned"} for r in [1] * 10 + [3] * 4]
          + [{"entry": "fedadc", "rounds": 12, "status": "completed"}])


def test_the_issues_three_seeds_all_ahead_say_so_not_tested_with_the_six_seed_command(tmp_path):
    """Issue 51: FedADC ahead on all 3 seeds (+3.0, +2.7, +5.8) was called "FedAvg ... as good as
    any". Now: ahead on every seed, not tested, the command for 6 seeds; never "as good as any"."""
    rows = _confirm(tmp_path / "confirm", {"fedadc": [0.030, 0.027, 0.058]}, [1, 2, 3], down={"fedadc": 67.6 * MB})
    argv = ["fedrift", "select", "-c", "femnist.yaml", "--budget", "25m", "algorithms=fedavg,fedadc", "seeds=1,2,3"]
    rec = recommend(_plan(tmp_path, [1, 2, 3]), rows, PICKED, trials=TRIALS, argv=argv)
    text = rec["text"]
    assert rec["choice"] == "fedadc" and rec["verdict"] == "ahead, not tested" and rec["tested"] is False
    assert "ahead of FedAvg at lr 0.05 on every seed" in text and "not tested" in text
    assert "(per seed: +3.0, +2.7, +5.8)" in text  # read from the confirmation's runs
    assert "seeds=1,2,3,4,5,6" in text and f"({SIGN_FLIP_SEEDS} paired seeds" in text
    assert rec["command"] == "fedrift select -c femnist.yaml --budget 25m algorithms=fedavg,fedadc seeds=1,2,3,4,5,6"
    assert rec["command"] in text
    assert "as good as any" not in " ".join(rec["lines"]) and "significant" not in text.replace("sign-flip", "")
    # the tuning each got, and FedADC's downlink beside FedAvg's
    tuning = next(ln for ln in rec["lines"] if ln.startswith("tuning"))
    assert "FedAvg 4 trials (furthest 12 rounds)" in tuning and "fedadc 15 trials (furthest 12 rounds)" in tuning
    assert "FedAvg was tuned less than the median candidate (4 trials against 15)" in tuning
    comm = next(ln for ln in rec["lines"] if ln.startswith("communication"))
    assert "FedAvg 33.80 MB down, 33.80 MB up" in comm and "fedadc 67.60 MB down" in comm and "2.0x the downlink" in comm
    assert not rec["missing"]


def test_without_the_runs_the_sides_are_told_by_the_sign_flip_p(tmp_path):
    """The rows alone (no confirm folder): p = 2^(1-n) exactly when every seed is on one side."""
    rows = _confirm(tmp_path / "elsewhere", {"fedadc": [0.030, 0.027, 0.058]}, [1, 2, 3])
    rec = recommend(_plan(tmp_path, [1, 2, 3]), rows, PICKED, trials=TRIALS)
    assert "on every seed" in rec["text"] and "per seed" not in rec["text"] and rec["verdict"] == "ahead, not tested"
    mixed = _confirm(tmp_path / "elsewhere2", {"fedadc": [0.030, -0.027, 0.058]}, [1, 2, 3])
    rec = recommend(_plan(tmp_path, [1, 2, 3]), mixed, PICKED, trials=TRIALS)
    assert rec["choice"] == "fedavg" and rec["verdict"] == "fedavg, not tested" and "mixed" in rec["text"]


@pytest.mark.parametrize("diffs, words, choice", [
    ([-0.01, -0.02, -0.005], "behind on every seed", "fedavg"),
    ([0.01, -0.02, 0.005], "mixed (2 of 3 seeds ahead)", "fedavg"),
    ([0.01, 0.02], "ahead of FedAvg at lr 0.05 on both seeds", "fedadc"),
])
def test_below_six_seeds_each_side_is_said_and_nothing_is_tested(tmp_path, diffs, words, choice):
    seeds = list(range(1, len(diffs) + 1))
    rows = _confirm(tmp_path / "confirm", {"fedadc": diffs}, seeds)
    rec = recommend(_plan(tmp_path, seeds), rows, PICKED, trials=TRIALS)
    assert words in rec["text"] and rec["text"].count("not tested") == 1 and rec["choice"] == choice
    assert rec["tested"] is False and "seeds=" + ",".join(map(str, six_seeds(_plan(tmp_path, seeds)))) in rec["text"]
    assert "as good as any" not in rec["text"]


def test_six_seeds_apply_the_significance_rule(tmp_path):
    seeds = [1, 2, 3, 4, 5, 6]
    rows = _confirm(tmp_path / "a", {"fedadc": [0.03, 0.027, 0.058, 0.05, 0.04, 0.07]}, seeds)
    rec = recommend(SimpleNamespace(root=tmp_path / "x", seeds=seeds, seed=0, rounds=12), rows, PICKED, trials=TRIALS)
    assert rec["verdict"] == "significant" and rec["choice"] == "fedadc" and rec["tested"] is True
    assert "beats FedAvg" in rec["text"] and "p = 0.0312 < 0.05" in rec["text"] and rec["command"] is None
    # one seed against: p > 0.05 though the interval excludes 0: ahead, not significant
    rows = _confirm(tmp_path / "b", {"fedadc": [0.03, 0.027, 0.058, 0.05, 0.04, -0.002]}, seeds)
    rec = recommend(SimpleNamespace(root=tmp_path / "x", seeds=seeds, seed=0, rounds=12), rows, PICKED, trials=TRIALS)
    assert rec["verdict"] == "ahead, not significant" and "does not pass" in rec["text"]
    # an interval holding 0 and reaching past the margin: FedAvg kept, neither better nor "as good"
    rows = _confirm(tmp_path / "c", {"fedadc": [0.03, -0.027, 0.058, -0.05, 0.04, -0.03]}, seeds)
    rec = recommend(SimpleNamespace(root=tmp_path / "x", seeds=seeds, seed=0, rounds=12), rows, PICKED, trials=TRIALS)
    assert rec["verdict"] == "fedavg" and rec["choice"] == "fedavg" and "as good as any" not in rec["text"]
    assert rec["tested"] and not rec["equivalent"] and "Nor is it shown as good" in rec["text"] and "+-1 point" in rec["text"]


def test_as_good_as_any_only_with_the_margin_stated_and_shown(tmp_path):
    seeds = [1, 2, 3, 4, 5, 6]
    small = [0.002, -0.001, 0.001, 0.0, 0.003, -0.002]
    rows = _confirm(tmp_path / "a", {"fedadc": small}, seeds)
    plan = SimpleNamespace(root=tmp_path / "x", seeds=seeds, seed=0, rounds=12)
    rec = recommend(plan, rows, PICKED, trials=TRIALS)
    assert rec["verdict"] == "fedavg" and rec["equivalent"] is True and rec["margin"] == MARGIN and rec["tested"]
    assert "as good as any confirmed entry within an equivalence margin of +-1 point" in rec["text"]
    # a tighter margin than the interval: not shown, not said
    rec = recommend(plan, rows, PICKED, trials=TRIALS, margin=0.001)
    assert rec["verdict"] == "fedavg" and not rec["equivalent"] and "as good as any" not in rec["text"]
    assert "+-0.1 points" in rec["text"]
    # the same small differences over 3 seeds: not tested, so no equivalence either
    rows = _confirm(tmp_path / "b", {"fedadc": small[:3]}, seeds[:3])
    rec = recommend(SimpleNamespace(root=tmp_path / "y", seeds=seeds[:3], seed=0, rounds=12), rows, PICKED, trials=TRIALS)
    assert "as good as any" not in rec["text"] and "not tested" in rec["text"]
    with pytest.raises(ConfigError, match="margin"):
        recommend(plan, rows, PICKED, margin=1.5)


def test_fedavg_best_by_validation_is_kept_and_the_others_said_by_seed(tmp_path):
    rows = _confirm(tmp_path / "confirm", {"fedadc": [0.01, 0.02, 0.03]}, [1, 2, 3], vals={"fedadc": 0.60})
    rec = recommend(_plan(tmp_path, [1, 2, 3]), rows, PICKED, trials=TRIALS)
    assert rec["choice"] == "fedavg" and rec["verdict"] == "fedavg" and rec["tested"] is False
    assert "has the best validation accuracy" in rec["text"] and "fedadc ahead on every seed" in rec["text"]
    assert "as good as any" not in rec["text"] and "seeds=1,2,3,4,5,6" in rec["text"]


def test_a_partial_confirmation_recommends_from_what_finished_and_says_what_is_missing(tmp_path):
    rows = _confirm(tmp_path / "confirm", {"fedadc": [0.03, None, 0.05]}, [1, 2, 3])
    rec = recommend(_plan(tmp_path, [1, 2, 3]), rows, PICKED, trials=TRIALS)
    assert rec["verdict"] == "ahead, not tested" and "on both seeds" in rec["text"]
    assert rec["missing"] == ["fedadc: 2 of 3 confirmation runs finished"]
    assert rec["lines"][-1] == "partial confirmation: fedadc: 2 of 3 confirmation runs finished"
    # nothing confirmed: the search's scores, said as such (and no crash)
    rec = recommend(_plan(tmp_path / "none", [1, 2, 3]), [], PICKED, trials=TRIALS)
    assert rec["verdict"] == "search only" and rec["choice"] == "fedadc" and "not confirmed, not tested" in rec["text"]
    assert len(rec["missing"]) == 2 and "larger --budget" in rec["text"]
    # today's callers (no trials=): no tuning line, the rest as before
    rec = recommend(_plan(tmp_path, [1, 2, 3]), rows, PICKED)
    assert not any(ln.startswith("tuning") for ln in rec["lines"]) and rec["choice"] == "fedadc"


def test_the_six_seed_command_keeps_the_seeds_run_and_skips_the_searchs():
    plan = SimpleNamespace(root=Path("runs/s"), seeds=[1, 2, 3], seed=4, rounds=12)
    assert six_seeds(plan) == [1, 2, 3, 5, 6, 7]
    assert rerun_command(plan, ["fedrift", "select", "--out", "my runs", "seeds=1,2,3"]) == \
        "fedrift select --out 'my runs' seeds=1,2,3,5,6,7"
    assert rerun_command(plan, None) == "fedrift select <the same arguments> --out runs/s seeds=1,2,3,5,6,7"
    # six asked, four paired (two runs diverged): two more
    six = SimpleNamespace(root=Path("runs/s"), seeds=[1, 2, 3, 5, 6, 7], seed=4, rounds=12)
    assert six_seeds(six, paired=4) == [1, 2, 3, 5, 6, 7, 8, 9] and six_seeds(six) == six.seeds


def test_a_trial_the_budget_stopped_is_said_apart_from_the_tuning(tmp_path):
    """Issue 72: "fedprox 2 trials" when one of them was stopped by the budget at round 2.
    Such a trial is not counted, and said apart; FedAvg tuned as hard as the counted trials."""
    rows = _confirm(tmp_path / "confirm", {"fedadc": [0.030, 0.027, 0.058]}, [1, 2, 3])
    trials = [*TRIALS, {"entry": "fedadc", "rounds": 2, "status": "budget"}, {"entry": "fedavg", "rounds": 12,
                                                                            "status": "budget"}]
    rec = recommend(_plan(tmp_path, [1, 2, 3]), rows, PICKED, trials=trials)
    tuning = next(ln for ln in rec["lines"] if ln.startswith("tuning"))
    assert "fedadc 15 trials (furthest 12 rounds; 1 more stopped by the budget, not counted)" in tuning, tuning
    assert "FedAvg 4 trials (furthest 12 rounds; 1 more stopped by the budget, not counted)" in tuning, tuning
    assert "(4 trials against 15)" in tuning
    assert rec["entries"]["fedadc"]["trials"] == 15 and rec["entries"]["fedadc"]["cut"] == 1


# ---------------------------------------------------------------------------------------
# The worst 10% of clients (issue 71 item 2): said when the remedy's is below FedAvg's, and
# report.metric ranking and judging on it


def test_a_remedy_whose_worst_10_percent_is_below_fedavgs_is_said_so_with_both_numbers(tmp_path):
    """FedADC ahead on test accuracy on every seed, but its worst 10% of clients at 61.2% on
    average (61.0, 61.5, 61.1) against FedAvg's 64.0% (64.0 each seed): one sentence says so."""
    worst = {"fedavg": [0.640, 0.640, 0.640], "fedadc": [0.610, 0.615, 0.611]}
    rows = _confirm(tmp_path / "confirm", {"fedadc": [0.030, 0.027, 0.058]}, [1, 2, 3], worst10=worst)
    rec = recommend(_plan(tmp_path, [1, 2, 3]), rows, PICKED, trials=TRIALS)
    assert rec["choice"] == "fedadc" and rec["verdict"] == "ahead, not tested"
    sentence = ("Its worst 10% of clients score 61.2% on their own test splits, below FedAvg's 64.0% "
                "(final_local_accuracy_worst10, the mean over the confirmation's 3 runs each)")
    assert sentence in rec["text"] and rec["text"].count("worst 10%") == 1
    assert rec["text"].index(sentence) < rec["text"].index("To test it")  # before the command, after the verdict
    assert rec["worst10"] == {"choice": pytest.approx(0.612), "reference": pytest.approx(0.64), "below": True,
                              "runs": 3, "reference_runs": 3}
    assert rec["metric"] == "accuracy" and rec["judged_on"] == "test_accuracy_at_best_val"
    assert not rec["text"].startswith("ranked on")  # the default verdict's words are today's
    # its tail above FedAvg's: nothing said
    rows = _confirm(tmp_path / "up", {"fedadc": [0.030, 0.027, 0.058]}, [1, 2, 3],
                    worst10={"fedavg": [0.60] * 3, "fedadc": [0.62] * 3})
    rec = recommend(_plan(tmp_path / "x", [1, 2, 3]), rows, PICKED, trials=TRIALS)
    assert "worst 10%" not in rec["text"] and rec["worst10"]["below"] is False
    # FedAvg kept: nothing to compare; runs from before the metric: nothing said either
    rows = _confirm(tmp_path / "kept", {"fedadc": [-0.01, -0.02, -0.005]}, [1, 2, 3], worst10=worst)
    rec = recommend(_plan(tmp_path / "y", [1, 2, 3]), rows, PICKED, trials=TRIALS)
    assert rec["choice"] == "fedavg" and rec["worst10"] is None and "worst 10%" not in rec["text"]
    rows = _confirm(tmp_path / "old", {"fedadc": [0.030, 0.027, 0.058]}, [1, 2, 3])
    rec = recommend(_plan(tmp_path / "z", [1, 2, 3]), rows, PICKED, trials=TRIALS)
    assert rec["worst10"] is None and "worst 10%" not in rec["text"]


PICKED3 = [*PICKED, {"entry": "fedprox", "values": {"train.lr": 0.02}, "score": 0.71, "rounds": 12, "trial": 5}]


def test_report_metric_worst10_ranks_the_confirmed_entries_and_judges_the_gain_on_it(tmp_path):
    """FedADC has the best validation accuracy (0.72) and +3 points of test accuracy, but its
    worst 10% of clients 5 points below FedAvg's; FedProx's worst 10% is 5, 6, 7 points above.
    By default FedADC is recommended (and its tail said); on the worst 10%, FedProx, the metric
    named at the verdict's head and its gain on the worst 10% per seed."""
    worst = {"fedavg": [0.60, 0.50, 0.55], "fedadc": [0.55, 0.45, 0.50], "fedprox": [0.65, 0.56, 0.62]}
    rows = _confirm(tmp_path / "confirm", {"fedadc": [0.03, 0.03, 0.03], "fedprox": [0.01, 0.01, 0.01]}, [1, 2, 3],
                    vals={"fedadc": 0.72, "fedprox": 0.71}, worst10=worst)
    plan = _plan(tmp_path, [1, 2, 3])
    rec = recommend(plan, rows, PICKED3, trials=TRIALS)
    assert rec["choice"] == "fedadc" and "below FedAvg's 55.0%" in rec["text"] and "50.0%" in rec["text"]
    explicit = recommend(plan, rows, PICKED3, trials=TRIALS, metric="accuracy")
    assert explicit["choice"] == "fedadc" and explicit["text"].startswith(
        "ranked on report.metric=accuracy (the confirmed entries' validation accuracy, the gain in test accuracy at the "
        "best validation round): ")
    assert explicit["text"].endswith(rec["text"])
    rec = recommend(plan, rows, PICKED3, trials=TRIALS, metric="local_accuracy_worst10")
    assert rec["choice"] == "fedprox" and rec["verdict"] == "ahead, not tested"
    assert rec["validation_order"] == ["fedprox", "fedavg", "fedadc"]  # 61.0, 55.0, 50.0
    assert rec["metric"] == "local_accuracy_worst10" and rec["ranked_on"] == "final_local_accuracy_worst10"
    assert rec["judged_on"] == "final_local_accuracy_worst10"
    text = rec["text"]
    assert text.startswith("ranked on report.metric=local_accuracy_worst10 (the mean accuracy of the worst 10% of "
                           "clients on their own test splits (final_local_accuracy_worst10), the mean over the "
                           "confirmation's seeds and the paired gain on it; the search ranked its trials on validation "
                           "accuracy): fedprox at lr 0.02 is ahead of FedAvg at lr 0.05 on every seed: +6.0 +- 2.5 "
                           "points (3 seeds) on worst 10% local accuracy (per seed: +5.0, +6.0, +7.0)"), text
    assert "not tested" in text and "seeds=1,2,3,4,5,6" in text and "below FedAvg" not in text
    assert rec["entries"]["fedprox"]["ranked"] == pytest.approx(0.61)
    # the mean over clients: equal for all three here (0.5): FedAvg first by the stable order, kept
    rec = recommend(plan, rows, PICKED3, trials=TRIALS, metric="local_accuracy")
    assert rec["judged_on"] == "final_local_accuracy" and rec["ranked_on"] == "final_local_accuracy"
    assert rec["choice"] == "fedavg" and "has the best mean local accuracy of the confirmed entries" in rec["text"]
    with pytest.raises(ConfigError, match="report.metric: 'worst' is not a metric to rank on; allowed: accuracy, "
                                          "local_accuracy, local_accuracy_worst10"):
        recommend(plan, rows, PICKED3, metric="worst")
    # no confirmation run finished: the metric is said unused
    rec = recommend(_plan(tmp_path / "none", [1, 2, 3]), [], PICKED3, metric="local_accuracy_worst10")
    assert rec["verdict"] == "search only" and "report.metric=local_accuracy_worst10 ranks the confirmation's runs" in \
        rec["text"]
