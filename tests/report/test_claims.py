"""report.claims: orderings checked with paired differences, against hand-computed values."""

from __future__ import annotations

import csv
import io
import json

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
        ("feddc:train.clip_grad_norm=10 > scaffold", "FedDC"),
        ("ccvr > fedavg (calibrated_accuracy vs final_accuracy)", "CCVR")]  # its gain: the calibrated model's
    # FedBN against FedAvg on each of their BatchNorm models (workload D's two), each on its own
    d = ["fedavg", "fedavg:model.name=resnet8:model.norm=batch", "fedbn:model.name=resnet8:model.norm=batch",
         "fedavg:model.norm=batch", "fedbn:model.norm=batch"]
    assert [c.text for c in resolve_claims(["papers"], d)] == [
        "fedbn:model.name=resnet8:model.norm=batch > fedavg:model.name=resnet8:model.norm=batch (on final_local_accuracy)",
        "fedbn:model.norm=batch > fedavg:model.norm=batch (on final_local_accuracy)"]
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


def test_a_claim_on_named_keys_pairs_them_by_hand(tmp_path):
    """CCVR's claim: its calibrated model against FedAvg's final one, seed by seed, in the final
    column (+3, +1, +2 points: mean +2), judged there; FedBN's: own-split accuracies."""
    root = tmp_path / "runs"
    for seed, (f, cal, own, theirs) in enumerate([(0.90, 0.93, 0.95, 0.90), (0.80, 0.81, 0.85, 0.84), (0.85, 0.87, 0.9, 0.9)]):
        write_run(root, "avg", seed, {"name": "fedavg"}, 0.1, f + 0.01, f, at_val=f)
        write_run(root, "ccvr", seed, {"name": "ccvr"}, 0.1, f + 0.01, f, at_val=f, calibrated_accuracy=cal)
        write_run(root, "bn", seed, {"name": "fedbn"}, 0.1, f, f - 0.1, at_val=f - 0.1, final_local_accuracy=own)
        (root / "avg" / f"seed{seed}" / "summary.json").write_text(json.dumps(
            {**json.loads((root / "avg" / f"seed{seed}" / "summary.json").read_text()), "final_local_accuracy": theirs}))
    groups, _ = load_groups(root)
    rows = check_claims(resolve_claims(["papers"], [g.algorithm for g in groups]), groups)
    by = {r["claim"]: r for r in rows}
    cal = by["ccvr > fedavg (calibrated_accuracy vs final_accuracy)"]
    assert cal["metric"] == "final_accuracy" and cal["final_accuracy_diff_n"] == 3
    assert cal["final_accuracy_diff_mean"] == pytest.approx(0.02) and cal["verdict"] == "3 seeds: ahead, too few to test"
    assert "best_accuracy_diff_mean" not in cal  # only the named keys: its trained model is FedAvg's
    bn = by["fedbn > fedavg (on final_local_accuracy)"]  # +5, +1, 0 points, though its global model is 10 behind
    assert bn["final_accuracy_diff_mean"] == pytest.approx(0.02) and bn["metric"] == "final_accuracy"
    md = to_markdown(rows)
    assert "| ccvr > fedavg (calibrated_accuracy vs final_accuracy) | +2.0 +- 2.5 | 3 | 0.25 |" in md
    assert "names its summary keys in brackets" in md
    assert "names its summary keys" not in to_markdown([r for r in rows if not r["named"]])


def test_a_users_claim_may_name_its_keys_as_the_papers_do(tmp_path, capsys):
    """`report.claims="ccvr>fedavg (calibrated_accuracy vs final_accuracy)"` is the papers'
    claim, row for row; `(on KEY)` compares one key; a key no run records is refused in one
    line naming the keys there are, and the report's files are left as they were."""
    root = tmp_path / "runs"
    for seed, (f, cal) in enumerate([(0.90, 0.93), (0.80, 0.81), (0.85, 0.87)]):
        write_run(root, "avg", seed, {"name": "fedavg"}, 0.1, f + 0.01, f, at_val=f)
        write_run(root, "ccvr", seed, {"name": "ccvr"}, 0.1, f + 0.01, f, at_val=f, calibrated_accuracy=cal)
    groups, _ = load_groups(root)
    labels = [g.algorithm for g in groups]
    papers = check_claims(resolve_claims(["papers"], labels), groups)
    mine = check_claims(resolve_claims(["ccvr>fedavg (calibrated_accuracy vs final_accuracy)"], labels), groups)
    assert [{k: v for k, v in r.items() if k != "source"} for r in mine] == \
           [{k: v for k, v in r.items() if k != "source"} for r in papers]
    on = check_claims(resolve_claims(["ccvr >= fedavg (on final_accuracy)"], labels), groups)
    assert on[0]["claim"] == "ccvr >= fedavg (on final_accuracy)" and on[0]["final_accuracy_diff_mean"] == 0.0
    with pytest.raises(ConfigError, match="is not a claim"):
        resolve_claims(["ccvr>fedavg (calibrated_accuracy)"], labels)
    args = ["report", str(root), "report.tsne=none", "report.plots=false"]
    assert main(args) == 0
    before = {p: p.read_bytes() for p in root.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main([*args, "report.claims=ccvr>fedavg (on calibrated_acc)"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report.claims: 'calibrated_acc' is in no run's summary.json; allowed: " in err[0], err
    assert "calibrated_accuracy" in err[0]
    assert {p: p.read_bytes() for p in root.iterdir() if p.is_file()} == before


def test_report_metric_judges_claims_on_the_worst_10_percent(tmp_path, capsys):
    """fedprox ahead of fedavg on the test set at best validation (+2 points every seed) but its
    worst 10% of clients behind (-5, -4, -6 points): the claim on the default metric says
    ahead, on ``report.metric=local_accuracy_worst10`` behind, in its own column."""
    root = tmp_path / "runs"
    for seed, (at, worst) in enumerate([(0.70, 0.40), (0.65, 0.35), (0.80, 0.50)]):
        write_run(root, "avg", seed, {"name": "fedavg"}, 0.1, at, at, at_val=at, final_local_accuracy=at,
                  final_local_accuracy_worst10=worst)
        write_run(root, "prox", seed, {"name": "fedprox", "mu": 0.01}, 0.1, at + 0.02, at + 0.02, at_val=at + 0.02,
                  final_local_accuracy=at, final_local_accuracy_worst10=worst - (0.05, 0.04, 0.06)[seed])
    groups, _ = load_groups(root)
    claims = resolve_claims(["fedprox>fedavg"], [g.algorithm for g in groups])
    default = check_claims(claims, groups)
    assert default == check_claims(claims, groups, "accuracy")  # accuracy: today's claims
    assert default[0]["metric"] == "test_accuracy_at_best_val" and default[0]["verdict"] == "3 seeds: ahead, too few to test"
    assert "final_local_accuracy_worst10_diff_mean" not in default[0]
    assert "worst 10% local" not in to_markdown(default)
    rows = check_claims(claims, groups, "local_accuracy_worst10")
    r = rows[0]
    assert r["metric"] == "final_local_accuracy_worst10" and r["verdict"] == "3 seeds: behind, too few to test"
    assert r["final_local_accuracy_worst10_diff_mean"] == pytest.approx(-0.05)
    assert r["final_local_accuracy_worst10_diff_n"] == 3
    md = to_markdown(rows)
    assert "| claim | best (A - B) | final (A - B) | at best val (A - B) | worst 10% local (A - B) | seeds | p |" in md
    assert "| -5.0 +- 2.5 | 3 | 0.25 | 3 seeds: behind, too few to test |" in md
    assert "p: the exact sign-flip test's on the worst 10% local accuracy" in md
    assert check_claims(claims, groups, "local_accuracy")[0]["verdict"] == "3 seeds: tied, too few to test"
    # on the command line: the claims' verdict and the table's rank follow report.metric
    args = ["report", str(root), "report.tsne=none", "report.plots=false", "report.claims=fedprox>fedavg"]
    assert main([*args, "report.metric=local_accuracy_worst10"]) == 0
    out = capsys.readouterr().out
    assert "3 seeds: behind, too few to test" in out and "rank (worst 10% local)" in out
    assert "final_local_accuracy_worst10" in (root / "claims.csv").read_text()
