"""report.claims: orderings checked with paired differences, against hand-computed values."""

from __future__ import annotations

import csv
import io

import pytest

from fedrift.cli import main
from fedrift.errors import ConfigError
from fedrift.report.claims import check_claims, resolve_claims, to_csv, to_markdown, verdict
from fedrift.report.table import load_groups

from .test_paired import grid, write_run  # noqa: F401  (the fixture)


def test_verdicts_by_hand():
    def d(mean, low=None, high=None):
        return {"k_diff_mean": mean, "k_diff_low": low, "k_diff_high": high}

    assert verdict(">", d(0.02, 0.01, 0.03), "k") == "holds"
    assert verdict(">", d(0.02, -0.01, 0.05), "k") == "ahead, not significant"
    assert verdict(">", d(-0.01, -0.03, 0.01), "k") == "behind, not significant"
    assert verdict(">", d(0.0, -0.03, 0.03), "k") == "behind, not significant"
    assert verdict(">", d(-0.03, -0.05, -0.01), "k") == "reversed"
    assert verdict(">=", d(0.02, 0.01, 0.03), "k") == "holds (ahead)"
    assert verdict(">=", d(0.0, -0.01, 0.01), "k") == "holds (not behind)"
    assert verdict(">=", d(-0.01, -0.03, 0.01), "k") == "behind, not significant"
    assert verdict(">=", d(-0.03, -0.05, -0.01), "k") == "reversed"
    assert verdict(">", d(0.05), "k") == "one seed: ahead" and verdict(">", d(None), "k") == "no pairs"


def test_claims_name_settings_and_papers_expand_to_the_grids_algorithms():
    labels = ["fedavg", "slowmo", "fedadc:variant=nesterov", "fedadc:variant=heavy_ball",
              "fedadc_plus:variant=nesterov", "fedgkd_plus:model.projection_dim=256"]
    found = [(c.text, c.source) for c in resolve_claims(["papers"], labels)]
    assert found == [("fedadc:variant=nesterov > slowmo", "FedADC"), ("fedadc:variant=heavy_ball > slowmo", "FedADC"),
                     ("slowmo > fedavg", "FedADC"),
                     # FedADC+ against the FedADC of the same variant only; FedGKD+ is not FedGKD
                     ("fedadc_plus:variant=nesterov > fedadc:variant=nesterov", "FedADC")]
    # labels with more options (a folder's tuned learning rates): the pair sharing the variant
    tuned = ["fedadc:variant=nesterov:lr=0.03", "fedadc:variant=heavy_ball:lr=0.02", "fedadc_plus:variant=nesterov:lr=0.1571"]
    assert [c.text for c in resolve_claims(["fedadc_plus>fedadc"], tuned)] == [
        "fedadc_plus:variant=nesterov:lr=0.1571 > fedadc:variant=nesterov:lr=0.03"]
    mine = resolve_claims(["fedadc>=fedavg", "slowmo > fedavg"], labels)
    assert [(c.better, c.op, c.worse, c.source) for c in mine] == [
        ("fedadc:variant=nesterov", ">=", "fedavg", ""), ("fedadc:variant=heavy_ball", ">=", "fedavg", ""),
        ("slowmo", ">", "fedavg", "")]
    for spec, says in (("scaffold>fedavg", "'scaffold' in 'scaffold>fedavg' is not an algorithm of the grid"),
                       ("fedavg", "'fedavg' is not a claim; allowed: A>B or A>=B"),
                       ("fedavg>", "'fedavg>' is not a claim"), ("a>b>c", "'a>b>c' is not a claim")):
        with pytest.raises(ConfigError, match=r"^report\.claims: " + says):
            resolve_claims([spec], labels)


def test_claims_against_hand_computed_values(grid):  # noqa: F811
    groups, _ = load_groups(grid)
    rows = check_claims(resolve_claims(["fedprox>fedavg", "fedavg>=fedprox", "fedgkd>fedavg"], [g.algorithm for g in groups]),
                        groups)
    by = {(r["claim"], r["partition.alpha"]): r for r in rows}
    # fedprox - fedavg at best validation: +2, +2, +2 points: an interval of width 0 above 0
    prox = by[("fedprox > fedavg", 0.1)]
    assert prox["metric"] == "test_accuracy_at_best_val" and prox["verdict"] == "holds"
    assert prox["test_accuracy_at_best_val_diff_mean"] == pytest.approx(0.02)
    assert prox["best_accuracy_diff_mean"] == pytest.approx(0.02) and prox["best_accuracy_diff_significant"] is False
    assert by[("fedavg >= fedprox", 0.1)]["verdict"] == "reversed"
    # alpha 1.0 has one seed and no validation value: no pairs at best validation
    assert by[("fedprox > fedavg", 1.0)]["verdict"] == "no pairs"
    assert by[("fedgkd > fedavg", 0.1)]["verdict"] == "no pairs"  # fedgkd's one paired seed has no validation
    md = to_markdown(rows)
    assert "| fedprox > fedavg | 0.1 | +2.0 +- 2.5 | +6.0 +- 2.5* | +2.0 +- 0.0* | 3 | holds | - |" in md
    parsed = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert parsed[0]["verdict"] == "holds" and float(parsed[0]["test_accuracy_at_best_val_diff_mean"]) == pytest.approx(0.02)


def test_the_report_command_prints_and_writes_claims_and_refuses_a_bad_one(grid, capsys):  # noqa: F811
    args = ["report", str(grid), "report.tsne=none", "report.plots=false"]
    assert main([*args, "report.claims=fedprox>fedavg"]) == 0
    out = capsys.readouterr().out
    assert "fedprox > fedavg" in out and "holds" in out and "the verdict is on the test accuracy" in out
    assert "holds" in (grid / "claims.md").read_text() and (grid / "claims.csv").is_file()
    html = (grid / "report.html").read_text()
    assert '<table id="claims">' in html and "+2.0 ± 0.0*" in html
    assert main(args) == 0  # a report without claims: the old files would describe another question
    assert not (grid / "claims.md").exists() and '<table id="claims">' not in (grid / "report.html").read_text()
    capsys.readouterr()
    assert main([*args, "report.claims=moon>fedavg"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report.claims: 'moon' in 'moon>fedavg' is not an algorithm of the grid" in err[0]
