"""Paired differences to a reference method, against hand-computed values; the ``*`` rule
(an exact sign-flip test and the t interval, so never below 6 seeds) on hand-made seeds."""

from __future__ import annotations

import csv
import io
import json

import pytest
import yaml

from fedrift.cli import main
from fedrift.errors import ConfigError
from fedrift.report.paired import MIN_SEEDS, interval, resolve_reference, sign_flip_p, significant
from fedrift.report.table import load_groups, summarize, to_csv, to_markdown

T_975_2 = 4.302653  # Student t, 0.975 quantile, 2 degrees of freedom (tables)


def write_run(root, name, seed, algorithm, alpha, best, final, at_val=None, status="completed", **more):
    d = root / name / f"seed{seed}"
    d.mkdir(parents=True)
    cfg = {"seed": seed, "data": {"name": "digits"}, "partition": {"name": "dirichlet", "alpha": alpha},
           "algorithm": algorithm, "train": {"rounds": 4}, "output": {"dir": str(d)}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "metrics.jsonl").write_text(json.dumps({"round": 4, "test_accuracy": final}) + "\n")
    summary = {"status": status, "best_accuracy": best, "final_accuracy": final, "rounds": 4, "seed": seed}
    if at_val is not None:
        summary.update(best_val_accuracy=at_val, best_val_round=3, test_accuracy_at_best_val=at_val)
    summary.update(more)  # other summary keys (calibrated_accuracy, final_local_accuracy)
    (d / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def grid(tmp_path):
    root = tmp_path / "runs"
    avg = {"name": "fedavg"}
    prox = {"name": "fedprox", "mu": 0.01}
    gkd = {"name": "fedgkd"}
    for seed, (b, f) in enumerate([(0.80, 0.70), (0.70, 0.65), (0.90, 0.80)]):
        write_run(root, "avg", seed, avg, 0.1, b, f, at_val=f)
        # fedprox: best +1, +2, +3 points (by seed); final +5, +6, +7 points
        write_run(root, "prox", seed, prox, 0.1, b + 0.01 * (seed + 1), f + 0.05 + 0.01 * seed, at_val=f + 0.02)
    write_run(root, "gkd", 0, gkd, 0.1, 0.85, 0.75)  # one seed: a difference, no interval
    write_run(root, "gkd", 1, gkd, 0.1, 0.5, 0.4, status="diverged")  # not paired
    write_run(root, "gkd", 5, gkd, 0.1, 0.9, 0.9)  # no fedavg run of seed 5: not paired
    write_run(root, "avg1", 0, avg, 1.0, 0.95, 0.9)  # another swept value: its own reference
    write_run(root, "prox1", 0, prox, 1.0, 0.90, 0.8)
    return root


def test_interval_by_hand():
    mean, half = interval([1.0, 2.0, 3.0])  # mean 2, sd 1, n 3
    assert mean == pytest.approx(2.0) and half == pytest.approx(T_975_2 * 1.0 / 3 ** 0.5, abs=1e-6)
    assert half == pytest.approx(2.484, abs=1e-3)
    assert interval([0.4]) == (0.4, None) and interval([]) == (None, None)


def test_paired_rows_against_hand_computed_values(grid):
    groups, _ = load_groups(grid)
    rows = {r["setting"]: r for r in summarize(groups, reference="fedavg")}
    prox = rows["fedprox alpha=0.1"]
    assert prox["reference"] == "fedavg" and prox["best_accuracy_diff_n"] == 3
    assert prox["best_accuracy_diff_mean"] == pytest.approx(0.02)
    assert prox["best_accuracy_diff_ci95"] == pytest.approx(T_975_2 * 0.01 / 3 ** 0.5, abs=1e-7)  # 0.02484
    assert prox["best_accuracy_diff_low"] == pytest.approx(0.02 - 0.024841, abs=1e-6)
    assert prox["best_accuracy_diff_significant"] is False  # the interval holds 0
    assert prox["final_accuracy_diff_mean"] == pytest.approx(0.06)  # 5, 6, 7 points: same sd, far from 0
    assert prox["final_accuracy_diff_low"] > 0  # the t interval excludes 0 ...
    assert prox["final_accuracy_diff_p"] == pytest.approx(0.25)  # ... but 3 seeds on one side: 2 of 8 sign patterns
    assert prox["final_accuracy_diff_significant"] is False
    assert prox["test_accuracy_at_best_val_diff_mean"] == pytest.approx(0.02)
    assert prox["test_accuracy_at_best_val_diff_ci95"] == pytest.approx(0.0, abs=1e-12)  # all three +2
    assert prox["test_accuracy_at_best_val_diff_significant"] is False  # a zero-width interval is no evidence
    gkd = rows["fedgkd alpha=0.1"]
    assert gkd["best_accuracy_diff_n"] == 1 and gkd["best_accuracy_diff_mean"] == pytest.approx(0.05)
    assert gkd["best_accuracy_diff_ci95"] is None and gkd["best_accuracy_diff_significant"] is None
    assert gkd["best_accuracy_diff_p"] == 1.0
    assert gkd["test_accuracy_at_best_val_diff_n"] == 0 and gkd["test_accuracy_at_best_val_diff_mean"] is None
    assert rows["fedprox alpha=1.0"]["best_accuracy_diff_mean"] == pytest.approx(-0.05)  # against fedavg at alpha 1.0
    assert "best_accuracy_diff_mean" not in rows["fedavg alpha=0.1"]  # the reference itself
    assert all("reference" not in r for r in summarize(groups))  # no reference: no paired keys


def test_paired_columns_in_markdown_csv_and_the_report_command(grid, capsys):
    groups, _ = load_groups(grid)
    rows = summarize(groups, reference="fedavg")
    md = to_markdown(rows)
    head = md.splitlines()[0]
    assert "| best vs fedavg | final vs fedavg | at best val vs fedavg |" in head
    line = next(x for x in md.splitlines() if x.startswith("| fedprox alpha=0.1 "))
    assert "| +2.0 +- 2.5 | +6.0 +- 2.5 | +2.0 +- 0.0 |" in line  # 3 seeds: no *
    assert "| +5.0 +- - |" in next(x for x in md.splitlines() if x.startswith("| fedgkd"))
    assert "| ref | ref | ref |" in next(x for x in md.splitlines() if x.startswith("| fedavg alpha=0.1"))
    assert "95% Student t interval" in md and "sign-flip test" in md and "at least 6 paired seeds" in md
    assert "These differences pair at most 3 seeds: none can carry *" in md
    parsed = {r["setting"]: r for r in csv.DictReader(io.StringIO(to_csv(rows)))}
    assert float(parsed["fedprox alpha=0.1"]["final_accuracy_diff_mean"]) == pytest.approx(0.06)
    assert parsed["fedprox alpha=0.1"]["final_accuracy_diff_significant"] == "False"
    assert float(parsed["fedprox alpha=0.1"]["final_accuracy_diff_p"]) == pytest.approx(0.25)

    assert main(["report", str(grid), "report.tsne=none", "report.plots=false"]) == 0  # fedavg by default
    out = capsys.readouterr().out
    assert "best vs fedavg" in out and "+6.0 +- 2.5 " in out and "+6.0 +- 2.5*" not in out
    assert "none can carry *" in out  # the rule, under the printed table
    html = (grid / "report.html").read_text()
    assert "best vs fedavg" in html and "+6.0 ±&nbsp;2.5<" in html and "Student t" in html and "sign-flip" in html
    assert "*</td>" not in html
    assert "best_accuracy_diff_mean" in (grid / "results.csv").read_text()
    assert main(["report", str(grid), "report.reference=fedprox", "report.tsne=none", "report.plots=false"]) == 0
    out = capsys.readouterr().out
    assert "best vs fedprox" in out and "-2.0 +- 2.5" in out  # fedavg against fedprox: the signs turn
    assert main(["report", str(grid), "report.reference=none", "report.tsne=none", "report.plots=false"]) == 0
    assert " vs " not in capsys.readouterr().out


def test_a_reference_the_grid_lacks_is_refused(grid, capsys):
    with pytest.raises(ConfigError, match=r"^report\.reference: 'scaffold' is not an algorithm of the grid"):
        resolve_reference("scaffold", ["fedavg", "fedprox"])
    with pytest.raises(ConfigError, match=r"names 2 settings"):
        resolve_reference("fedadc", ["fedadc:variant=nesterov", "fedadc:variant=heavy_ball"])
    assert resolve_reference("auto", ["fedprox"]) is None and resolve_reference("auto", ["fedavg"]) == "fedavg"
    assert main(["report", str(grid), "report.reference=scaffold"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report.reference" in err[0]


def test_the_sign_flip_test_by_hand():
    assert sign_flip_p([1.0, 2.0, 3.0]) == pytest.approx(2 / 8)  # |sum| of +-1 +-2 +-3 reaches 6 twice
    assert sign_flip_p([1.0, -1.0]) == 1.0 and sign_flip_p([0.0, 0.0, 0.0]) == 1.0
    assert sign_flip_p([2.0, 1.0, -1.0]) == pytest.approx(6 / 8)  # +-2 +-1 +-1: 4, 2, 2, 0, 0, -2, -2, -4; |s| >= 2: 6
    assert sign_flip_p([0.01] * 5) == pytest.approx(2 / 32) and sign_flip_p([0.01] * 6) == pytest.approx(2 / 64)
    assert sign_flip_p([]) is None and sign_flip_p([0.3]) == 1.0
    # past the exact enumeration: a seeded random sample of patterns, never below the exact p
    assert sign_flip_p([0.01] * 20) == pytest.approx(1 / 65537, rel=0.2) and sign_flip_p([0.01] * 20) >= 2 / 2 ** 20
    assert MIN_SEEDS == 6 and 2 ** (1 - 5) >= 0.05 > 2 ** (1 - 6)


def test_two_seeds_with_identical_differences_carry_no_star(tmp_path):
    """The demo's case: 1,000 test images move accuracy in 0.1-point steps, and both seeds are
    exactly 0.3 points behind: a t interval of width 0, and still no significance."""
    diffs = [0.917 - 0.920, 0.905 - 0.908]
    mean, half = interval(diffs)
    assert mean == pytest.approx(-0.003) and half == pytest.approx(0.0, abs=1e-12)
    assert sign_flip_p(diffs) == 0.5 and significant(diffs) is False
    root = tmp_path / "runs"
    for seed, (a, c) in enumerate([(0.920, 0.917), (0.908, 0.905)]):
        write_run(root, "avg", seed, {"name": "fedavg"}, 0.1, a, a)
        write_run(root, "csd", seed, {"name": "fedcsd"}, 0.1, c, c)
    rows = summarize(load_groups(root)[0], reference="fedavg")
    md = to_markdown(rows)
    csd = next(x for x in md.splitlines() if x.startswith("| fedcsd"))
    assert "| -0.3 +- 0.0 | -0.3 +- 0.0 |" in csd and "*" not in csd
    assert "pair at most 2 seeds: none can carry *" in md


@pytest.mark.parametrize("diffs, star", [
    ([0.01, 0.02, 0.01, 0.03, 0.02, 0.01], True),  # six seeds on one side: p = 1/32, interval above 0
    ([-0.003] * 6, True),  # identical differences: with six seeds the test can speak, and does
    ([0.01, 0.02, 0.01, 0.03, 0.02, -0.01], False),  # one seed the other way: p = 8/64 (no flip or one
    # of the three 1-point seeds, and the mirror images)
    ([0.001, 0.001, 0.001, 0.001, 0.001, 0.3], False),  # all ahead (p = 1/32) but the t interval holds 0
    ([0.01, 0.02, 0.01, 0.03, 0.02], False),  # five seeds: the smallest p is 1/16
])
def test_the_star_needs_the_test_and_the_interval(diffs, star):
    assert significant(diffs) is star
    if not star and len(diffs) == 6 and diffs[-1] < 0:
        assert sign_flip_p(diffs) == pytest.approx(8 / 64)


def test_six_seeds_carry_a_star_in_the_tables(tmp_path):
    root = tmp_path / "runs"
    for seed in range(6):
        write_run(root, "avg", seed, {"name": "fedavg"}, 0.1, 0.80 + 0.01 * seed, 0.80)
        write_run(root, "prox", seed, {"name": "fedprox", "mu": 0.01}, 0.1, 0.81 + 0.01 * seed + 0.001 * (seed % 2), 0.79)
    rows = summarize(load_groups(root)[0], reference="fedavg")
    prox = next(r for r in rows if r["algorithm"].startswith("fedprox"))
    assert prox["best_accuracy_diff_n"] == 6 and prox["best_accuracy_diff_p"] == pytest.approx(1 / 32)
    assert prox["best_accuracy_diff_significant"] is True and prox["final_accuracy_diff_significant"] is True
    md = to_markdown(rows)
    assert "| +1.1 +- 0.1* | -1.0 +- 0.0* |" in next(x for x in md.splitlines() if x.startswith("| fedprox"))
    assert "none can carry *" not in md and "at least 6 paired seeds" in md


def test_the_worst_10_percent_is_paired_with_its_interval_over_seeds(tmp_path):
    """The worst 10% of clients' local accuracy: fedavg 30, 40, 50 by seed, fedprox +1, +2, +3
    points: mean +2.0, sd 1, the 95% t interval +- 4.303 / sqrt(3) = 2.48 points; 3 seeds, no *."""
    root = tmp_path / "runs"
    for seed, worst in enumerate([0.30, 0.40, 0.50]):
        write_run(root, "avg", seed, {"name": "fedavg"}, 0.1, 0.8, 0.7, final_local_accuracy=0.6,
                  final_local_accuracy_worst10=worst)
        write_run(root, "prox", seed, {"name": "fedprox", "mu": 0.01}, 0.1, 0.8, 0.7, final_local_accuracy=0.6,
                  final_local_accuracy_worst10=worst + 0.01 * (seed + 1))
    rows = summarize(load_groups(root)[0], reference="fedavg")
    prox = rows[1]
    assert prox["final_local_accuracy_worst10_diff_n"] == 3
    assert prox["final_local_accuracy_worst10_diff_mean"] == pytest.approx(0.02)
    assert prox["final_local_accuracy_worst10_diff_ci95"] == pytest.approx(T_975_2 * 0.01 / 3 ** 0.5, abs=1e-7)
    assert prox["final_local_accuracy_worst10_diff_low"] == pytest.approx(0.02 - 0.024841, abs=1e-6)
    assert prox["final_local_accuracy_worst10_diff_p"] == pytest.approx(0.25)
    assert prox["final_local_accuracy_worst10_diff_significant"] is False
    md = to_markdown(rows)
    head = [c.strip() for c in md.splitlines()[0].split("|")]
    at = head.index("best vs fedavg")
    assert head[at:at + 3] == ["best vs fedavg", "final vs fedavg", "worst 10% local vs fedavg"]
    line = next(x for x in md.splitlines() if x.startswith("| fedprox"))
    assert line.split("|")[head.index("worst 10% local vs fedavg")].strip() == "+2.0 +- 2.5"
    assert line.split("|")[head.index("worst 10% local %")].strip() == "42.0 +- 11.0"  # 31, 42, 53: sd 11
