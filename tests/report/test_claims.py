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
    def d(mean, n=6, sig=False):
        return {"k_diff_mean": mean, "k_diff_n": n, "k_diff_significant": sig if n > 1 else None}

    assert verdict(">", d(0.02, sig=True), "k") == "holds"
    assert verdict(">", d(0.02), "k") == "ahead, not significant"
    assert verdict(">", d(-0.01), "k") == "behind, not significant"
    assert verdict(">", d(0.0), "k") == "behind, not significant"
    assert verdict(">", d(-0.03, sig=True), "k") == "reversed"
    assert verdict(">=", d(0.02, sig=True), "k") == "holds (ahead)"
    assert verdict(">=", d(0.0), "k") == "holds (not behind)"
    assert verdict(">=", d(-0.01), "k") == "behind, not significant"
    assert verdict(">=", d(-0.03, sig=True), "k") == "reversed"
    # below 6 seeds nothing is significant, and nothing is called: not even "not behind"
    assert verdict(">", d(0.02, n=3), "k") == "3 seeds: ahead, too few to test"
    assert verdict(">=", d(0.0, n=2), "k") == "2 seeds: tied, too few to test"
    assert verdict(">=", d(-0.003, n=2), "k") == "2 seeds: behind, too few to test"
    assert verdict(">", d(0.05, n=1), "k") == "one seed: ahead" and verdict(">", d(None, n=0), "k") == "no pairs"


def test_claims_name_settings_and_papers_expand_to_the_grids_algorithms():
    labels = ["fedavg", "slowmo", "fedadc:variant=nesterov", "fedadc:variant=heavy_ball",
              "fedadc_plus:variant=nesterov", "fedgkd_plus:model.projection_dim=256"]
    found = [(c.text, c.source) for c in resolve_claims(["papers"], labels)]
    assert found == [("fedadc:variant=nesterov > slowmo", "FedADC"), ("fedadc:variant=heavy_ball > slowmo", "FedADC"),
                     ("slowmo > fedavg", "FedADC"),
                     # FedADC+ against the FedADC of the same variant only; FedGKD+ is not FedGKD
                     ("fedadc_plus:variant=nesterov > fedadc:variant=nesterov", "FedADC")]
    # a newer remedy's paper (FedDC's tables: FedAvg, FedProx, SCAFFOLD, FedDyn), its entry clipped
    newer = ["fedavg", "scaffold", "feddc:train.clip_grad_norm=10", "fedlc", "ccvr"]
    assert [(c.text, c.source) for c in resolve_claims(["papers"], newer)] == [
        ("fedlc > fedavg", "FedLC"), ("feddc:train.clip_grad_norm=10 > fedavg", "FedDC"),
        ("feddc:train.clip_grad_norm=10 > scaffold", "FedDC")]
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
    # fedprox - fedavg at best validation: +2, +2, +2 points: an interval of width 0 above 0,
    # and three seeds, which cannot carry significance (p = 2/8)
    prox = by[("fedprox > fedavg", 0.1)]
    assert prox["metric"] == "test_accuracy_at_best_val" and prox["verdict"] == "3 seeds: ahead, too few to test"
    assert prox["test_accuracy_at_best_val_diff_p"] == pytest.approx(0.25)
    assert prox["test_accuracy_at_best_val_diff_mean"] == pytest.approx(0.02)
    assert prox["best_accuracy_diff_mean"] == pytest.approx(0.02) and prox["best_accuracy_diff_significant"] is False
    assert by[("fedavg >= fedprox", 0.1)]["verdict"] == "3 seeds: behind, too few to test"
    # alpha 1.0 has one seed and no validation value: no pairs at best validation
    assert by[("fedprox > fedavg", 1.0)]["verdict"] == "no pairs"
    assert by[("fedgkd > fedavg", 0.1)]["verdict"] == "no pairs"  # fedgkd's one paired seed has no validation
    md = to_markdown(rows)
    assert ("| fedprox > fedavg | 0.1 | +2.0 +- 2.5 | +6.0 +- 2.5 | +2.0 +- 0.0 | 3 | 0.25 | 3 seeds: ahead, too few to "
            "test | - |") in md
    assert "sign-flip" in md and "pair at most 3 seeds: none can carry *" in md
    parsed = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert parsed[0]["verdict"] == "3 seeds: ahead, too few to test"
    assert float(parsed[0]["test_accuracy_at_best_val_diff_mean"]) == pytest.approx(0.02)


def test_six_seeds_let_a_claim_hold_or_reverse(tmp_path):
    root = tmp_path / "runs"
    for seed in range(6):
        write_run(root, "avg", seed, {"name": "fedavg"}, 0.1, 0.80, 0.80, at_val=0.80)
        write_run(root, "prox", seed, {"name": "fedprox", "mu": 0.01}, 0.1, 0.81, 0.81, at_val=0.80 + 0.01 * (1 + seed % 3))
        write_run(root, "gkd", seed, {"name": "fedgkd"}, 0.1, 0.81, 0.81, at_val=0.80 + 0.01 * (seed % 2) * (-1) ** seed)
    groups, _ = load_groups(root)
    rows = check_claims(resolve_claims(["fedprox>fedavg", "fedavg>=fedprox", "fedgkd>fedavg", "fedgkd>=fedavg"],
                                       [g.algorithm for g in groups]), groups)
    by = {r["claim"]: r for r in rows}
    assert by["fedprox > fedavg"]["verdict"] == "holds" and by["fedprox > fedavg"]["test_accuracy_at_best_val_diff_p"] == 1 / 32
    assert by["fedavg >= fedprox"]["verdict"] == "reversed"
    # fedgkd: 0, -1, 0, -1, 0, -1 points: behind in three seeds, tied in three: p = 1/4
    assert by["fedgkd > fedavg"]["verdict"] == "behind, not significant"
    assert by["fedgkd >= fedavg"]["verdict"] == "behind, not significant"
    assert "none can carry" not in to_markdown(rows)


def test_the_report_command_prints_and_writes_claims_and_refuses_a_bad_one(grid, capsys):  # noqa: F811
    args = ["report", str(grid), "report.tsne=none", "report.plots=false"]
    assert main([*args, "report.claims=fedprox>fedavg"]) == 0
    out = capsys.readouterr().out
    assert "fedprox > fedavg" in out and "3 seeds: ahead, too few to test" in out and "the verdict is on" in out
    assert "none can carry *" in out.split("fedprox > fedavg")[-1]  # the rule, under the claims too
    assert "too few to test" in (grid / "claims.md").read_text() and (grid / "claims.csv").is_file()
    html = (grid / "report.html").read_text()
    assert '<table id="claims" class="fit">' in html and "+2.0 ±&nbsp;0.0<" in html and "sign-flip" in html.split('id="claims"')[1]
    assert main(args) == 0  # a report without claims: the old files would describe another question
    assert not (grid / "claims.md").exists() and 'id="claims"' not in (grid / "report.html").read_text()
    capsys.readouterr()
    assert main([*args, "report.claims=moon>fedavg"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report.claims: 'moon' in 'moon>fedavg' is not an algorithm of the grid" in err[0]
