"""The results table against hand-computed numbers, from fabricated run folders."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil

import pytest
import yaml

from fedrift.cli import main
from fedrift.errors import ConfigError
from fedrift.report.table import (
    Run,
    accuracy_at,
    load_groups,
    mean_std,
    parse_target,
    rounds_to,
    summarize,
    to_csv,
    to_markdown,
    to_text,
)


def write_run(d, seed, algorithm, alpha, accs, status="completed", rounds=None, every=1):
    """A run folder as fedrift writes it, with the given test accuracy per evaluated round."""
    d.mkdir(parents=True)
    cfg = {"seed": seed, "data": {"name": "digits"}, "partition": {"name": "dirichlet", "alpha": alpha},
           "algorithm": algorithm, "train": {"rounds": 4}, "output": {"dir": str(d)}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = [{"round": every * (i + 1), "test_accuracy": a, "bytes_down": 1000, "bytes_up": 500} for i, a in enumerate(accs)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = rounds if rounds is not None else every * len(accs)
    summary = {"status": status, "final_accuracy": accs[-1] if status == "completed" else None,
               "best_accuracy": max(accs), "rounds": done, "wall_seconds": 2.0 * done,
               "seconds_per_round": 2.0, "bytes_down_total": 1000 * done, "bytes_up_total": 500 * done, "seed": seed}
    (d / "summary.json").write_text(json.dumps(summary))


FEDAVG = {"name": "fedavg"}
FEDPROX = {"name": "fedprox", "mu": 0.01}


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    write_run(root / "a" / "s0", 0, FEDAVG, 0.1, [0.50, 0.70, 0.80, 0.78])
    write_run(root / "a" / "s1", 1, FEDAVG, 0.1, [0.60, 0.90, 0.85, 0.88])
    write_run(root / "a" / "s2", 2, FEDAVG, 0.1, [0.55, 0.75, 0.85, 0.83])
    write_run(root / "p" / "s0", 0, FEDPROX, 0.1, [0.60, 0.80, 0.82, 0.84])
    write_run(root / "p" / "s1", 1, FEDPROX, 0.1, [0.30], status="diverged")
    write_run(root / "b" / "s0", 0, FEDAVG, 1.0, [0.70, 0.92], every=2)
    return root


def test_mean_and_sample_std():
    m, s = mean_std([0.80, 0.90, 0.85])
    assert m == pytest.approx(0.85) and s == pytest.approx(0.05)  # sqrt(((-.05)^2 + .05^2 + 0) / (3 - 1))
    assert mean_std([0.7]) == (0.7, 0.0)  # one seed: std 0
    assert mean_std([None, float("nan"), 0.5, 0.7]) == (pytest.approx(0.6), pytest.approx(math.sqrt(0.02)))
    assert mean_std([]) == (None, None)


def test_grouped_by_config_minus_seed(runs):
    groups, grid = load_groups(runs)
    assert grid is None
    assert [g.label for g in groups] == ["fedavg alpha=0.1", "fedprox alpha=0.1", "fedavg alpha=1.0"]
    assert [[r.seed for r in g.runs] for g in groups] == [[0, 1, 2], [0, 1], [0]]
    assert groups[0].sweep == {"partition.alpha": 0.1}


def test_rows_against_hand_computed_values(runs):
    groups, _ = load_groups(runs)
    rows = summarize(groups, at_rounds=[2, 3, 5], target="fedavg:0.9")
    avg, prox, avg1 = rows
    assert avg["runs"] == 3 and avg["completed"] == 3 and avg["diverged"] == 0
    assert avg["best_accuracy_mean"] == pytest.approx(0.85) and avg["best_accuracy_std"] == pytest.approx(0.05)
    assert avg["final_accuracy_mean"] == pytest.approx(0.83) and avg["final_accuracy_std"] == pytest.approx(0.05)
    # acc@2 = 0.70, 0.90, 0.75: mean 0.78333, sample std sqrt(0.0216667 / 2) = 0.104083
    assert avg["accuracy_at_2_mean"] == pytest.approx(0.783333, abs=1e-6)
    assert avg["accuracy_at_2_std"] == pytest.approx(0.104083, abs=1e-6)
    assert avg["accuracy_at_5_mean"] is None  # no run reached round 5
    # target 0.9 * 0.85 = 0.765: rounds 3, 2, 3
    assert avg["target"] == pytest.approx(0.765)
    assert avg["rounds_to_target_mean"] == pytest.approx(8 / 3) and avg["rounds_to_target_reached"] == 3
    assert avg["bytes_down_per_round"] == 1000 and avg["bytes_up_per_round"] == 500
    assert avg["seconds_per_round_mean"] == 2.0 and avg["wall_seconds_mean"] == 8.0

    # the diverged seed is counted, not averaged
    assert (prox["completed"], prox["diverged"]) == (1, 1)
    assert prox["best_accuracy_mean"] == pytest.approx(0.84) and prox["best_accuracy_std"] == 0.0
    assert prox["target"] == pytest.approx(0.765) and prox["rounds_to_target_mean"] == 2

    # alpha=1.0: evaluated every 2 rounds; acc@3 is the evaluation at round 2; its own fedavg target
    assert avg1["accuracy_at_3_mean"] == pytest.approx(0.70) and avg1["accuracy_at_2_mean"] == pytest.approx(0.70)
    assert avg1["target"] == pytest.approx(0.9 * 0.92) and avg1["rounds_to_target_mean"] == 4


def test_absolute_and_no_target(runs):
    groups, _ = load_groups(runs)
    rows = summarize(groups, target=0.85)
    assert rows[0]["rounds_to_target_mean"] == pytest.approx(2.5) and rows[0]["rounds_to_target_reached"] == 2
    assert rows[1]["rounds_to_target_reached"] == 0 and rows[1]["rounds_to_target_mean"] is None
    rows = summarize(groups, target=None)
    assert all(r["target"] is None for r in rows)


def test_round_helpers():
    run = Run(dir=None, metrics=[{"round": 2, "test_accuracy": 0.5}, {"round": 4, "test_accuracy": 0.7}])
    assert accuracy_at(run, 3) == 0.5 and accuracy_at(run, 4) == 0.7 and accuracy_at(run, 1) is None
    assert accuracy_at(run, 5) is None
    assert rounds_to(run, 0.6) == 4 and rounds_to(run, 0.9) is None


@pytest.mark.parametrize("bad", ["fedavg:x", "fedavg:0", 1.5, "lots"])
def test_bad_targets_are_refused(bad):
    with pytest.raises(ConfigError, match="report.target"):
        parse_target(bad)


def test_formats(runs):
    groups, _ = load_groups(runs)
    rows = summarize(groups, at_rounds=[2], target="fedavg:0.9")
    parsed = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert len(parsed) == 3 and float(parsed[0]["best_accuracy_mean"]) == pytest.approx(0.85)
    assert parsed[1]["final_accuracy_mean"] == "0.84" and parsed[0]["partition.alpha"] == "0.1"
    md = to_markdown(rows, [2]).strip().splitlines()
    assert len(md) == 5 and md[1].startswith("|---")
    assert all(line.count("|") == md[0].count("|") for line in md)
    assert "| fedavg alpha=0.1 | 3/3 | 85.0 +- 5.0 | 83.0 +- 5.0 | 78.3 +- 10.4 |" in md[2]
    assert "1/2 (1 diverged)" in md[3]
    assert "fedprox alpha=0.1" in to_text(rows, [2])


def test_report_command_on_a_folder_of_runs(runs, capsys):
    assert main(["report", str(runs), "report.at_rounds=2,3", "report.tsne=none", "report.plots=false"]) == 0
    out = capsys.readouterr().out
    assert "fedprox alpha=0.1" in out and "report in" in out
    assert (runs / "report.html").is_file() and (runs / "results.csv").is_file() and (runs / "results.md").is_file()


def test_report_command_refuses_bad_input(capsys, tmp_path):
    for args, key in ((["report", str(tmp_path / "nope")], "does not exist"),
                      (["report", str(tmp_path)], "no runs"),
                      (["report", str(tmp_path), "at_rounds=2"], "report.key=value"),
                      (["report", str(tmp_path), "report.band=wide"], "report.band")):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and key in err[0], err


def test_a_setting_only_some_algorithms_have_labels_them_and_does_not_split_panels(tmp_path):
    root = tmp_path / "runs"
    for alpha in (0.1, 1.0):
        write_run(root / f"a{alpha}", 0, FEDAVG, alpha, [0.5, 0.6])
        write_run(root / f"h{alpha}", 0, FEDAVG, alpha, [0.5, 0.6])
        cfg = yaml.safe_load((root / f"h{alpha}" / "config.yaml").read_text())
        cfg["algorithm"] = {"name": "fedprox", "mu": 0.01}
        cfg["partition"]["holdout"] = 0.1  # like FedDF's held-out data: only this algorithm has it
        (root / f"h{alpha}" / "config.yaml").write_text(yaml.safe_dump(cfg))
    groups, _ = load_groups(root)
    assert {g.algorithm for g in groups} == {"fedavg", "fedprox:holdout=0.1"}
    assert all(list(g.sweep) == ["partition.alpha"] for g in groups)  # alpha is swept, holdout is not


def test_at_best_validation_column_when_runs_have_a_validation_split(runs, tmp_path):
    # without a validation split: no column
    assert "at best val" not in to_markdown(summarize(load_groups(runs)[0]))
    root = tmp_path / "val"
    for seed, (val, at) in enumerate([(0.80, 0.70), (0.90, 0.76)]):
        write_run(root / f"s{seed}", seed, FEDAVG, 0.1, [0.6, 0.8])
        summary = json.loads((root / f"s{seed}" / "summary.json").read_text())
        summary.update(best_val_accuracy=val, best_val_round=1, test_accuracy_at_best_val=at)
        (root / f"s{seed}" / "summary.json").write_text(json.dumps(summary))
    rows = summarize(load_groups(root)[0])
    assert rows[0]["test_accuracy_at_best_val_mean"] == pytest.approx(0.73)
    assert rows[0]["test_accuracy_at_best_val_std"] == pytest.approx(math.sqrt(0.0018))  # (.03^2 * 2) / 1
    assert rows[0]["best_val_accuracy_mean"] == pytest.approx(0.85)
    md = to_markdown(rows).splitlines()
    assert "| best acc % | final acc % | at best val % |" in md[0]
    assert "| 80.0 +- 0.0 | 80.0 +- 0.0 | 73.0 +- 4.2 |" in md[2]


def test_final_local_accuracy_column_when_runs_report_it(runs, tmp_path):
    assert "final local %" not in to_markdown(summarize(load_groups(runs)[0]))
    for d, local in (("a/s0", 0.90), ("a/s1", 0.80), ("a/s2", 0.85), ("p/s0", 0.70), ("b/s0", 0.75)):
        path = runs / d / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "final_local_accuracy": local}))
    rows = summarize(load_groups(runs)[0])
    fedavg = next(r for r in rows if r["setting"] == "fedavg alpha=0.1")
    assert fedavg["final_local_accuracy_mean"] == pytest.approx(0.85) and fedavg["final_local_accuracy_std"] == pytest.approx(0.05)
    lines = to_markdown(rows).splitlines()
    col = [c.strip() for c in lines[0].split("|")].index("final local %")
    cells = {row.split("|")[1].strip(): row.split("|")[col].strip() for row in lines[2:] if row.startswith("|")}
    assert cells["fedavg alpha=0.1"] == "85.0 +- 5.0" and cells["fedprox alpha=0.1"] == "70.0"  # one run: no spread
    assert cells["fedavg alpha=1.0"] == "75.0"
    path = runs / "a/s2/summary.json"  # a run from before the metric: the mean says it is of 2
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "final_local_accuracy"}))
    lines = to_markdown(summarize(load_groups(runs)[0])).splitlines()
    assert "| 85.0 +- 7.1 (2/3 runs) |" in next(line for line in lines if line.startswith("| fedavg alpha=0.1 "))


def test_calibrated_and_personalized_columns_side_by_side(runs):
    """CCVR's calibrated model (test set, clients' own splits) and FedADC's per-client
    calibration (eval.personalize) get a column each when runs report them, beside final local."""
    assert "calibrated %" not in to_markdown(summarize(load_groups(runs)[0]))
    for d in ("a/s0", "a/s1", "a/s2"):
        path = runs / d / "summary.json"
        extra = {"final_local_accuracy": 0.80, "calibrated_accuracy": 0.90 if d != "a/s2" else 0.70,
                 "calibrated_local_accuracy": 0.85, "personalized_accuracy": 0.95,
                 "personalized_accuracy_worst10": 0.60 if d != "a/s0" else 0.90}
        path.write_text(json.dumps({**json.loads(path.read_text()), **extra}))
    rows = summarize(load_groups(runs)[0])
    lines = to_markdown(rows).splitlines()
    head = [c.strip() for c in lines[0].split("|")]
    assert head.index("final local %") + 1 == head.index("calibrated %") == head.index("calibrated local %") - 1
    assert head.index("personalized %") == head.index("calibrated local %") + 1
    assert head.index("personalized worst 10% %") == head.index("personalized %") + 1  # FedADC's calibration's worst 10%
    row = next(line for line in lines if line.startswith("| fedavg alpha=0.1 ")).split("|")
    cell = lambda h: row[head.index(h)].strip()  # noqa: E731
    assert (cell("calibrated %"), cell("calibrated local %"), cell("personalized %"), cell("personalized worst 10% %")) == (
        "83.3 +- 11.5", "85.0 +- 0.0", "95.0 +- 0.0", "70.0 +- 17.3")
    other = next(line for line in lines if line.startswith("| fedprox alpha=0.1 ")).split("|")
    assert other[head.index("calibrated %")].strip() == "-"  # runs without a calibration


def test_personalized_accuracies_pair_with_the_references_local_ones(runs):
    """A setting's per-client fine-tuned models (eval.personalize) against the reference's final
    local accuracy and its worst 10%, on the same seed: 0.95 - 0.80 and 0.70 - 0.60 on seed 0,
    the one seed both completed; a column each, said in the note."""
    def add(d, **extra):
        path = runs / d / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **extra}))

    for d in ("a/s0", "a/s1", "a/s2"):
        add(d, final_local_accuracy=0.80 if d == "a/s0" else 0.5, final_local_accuracy_worst10=0.60)
    add("p/s0", final_local_accuracy=0.9, final_local_accuracy_worst10=0.5,
        personalized_accuracy=0.95, personalized_accuracy_worst10=0.70)
    rows = summarize(load_groups(runs)[0], reference="fedavg")
    prox = rows[1]
    assert prox["personalized_accuracy_diff_mean"] == pytest.approx(0.15, abs=1e-12)
    assert prox["personalized_accuracy_worst10_diff_mean"] == pytest.approx(0.10, abs=1e-12)
    assert prox["personalized_accuracy_diff_n"] == 1 and prox["personalized_accuracy_diff_ci95"] is None
    assert "personalized_accuracy_diff_n" not in rows[0]  # the reference's own row
    lines = to_markdown(rows).splitlines()
    head = [c.strip() for c in lines[0].split("|")]
    row = next(line for line in lines if line.startswith("| fedprox alpha=0.1 ")).split("|")
    assert row[head.index("personalized vs fedavg")].strip() == "+15.0 +- -"
    assert row[head.index("personalized worst 10% vs fedavg")].strip() == "+10.0 +- -"
    assert "'personalized (worst 10%) vs fedavg': each client's model fine-tuned after training" in to_markdown(rows)


def test_labels_of_tuned_runs_without_compare_json(tmp_path):
    """Runs of a tuned comparison read as a plain folder: a learning rate that only tells
    algorithms apart is said (4 significant digits) where it is not the one most settings
    share; FedADC+ names its variant as FedADC's two settings must, so that its claim pairs
    it with the Nesterov one only."""
    root = tmp_path / "runs"

    def write(d, algorithm, lr):
        write_run(root / d, 0, algorithm, 0.1, [0.5, 0.6])
        cfg = yaml.safe_load((root / d / "config.yaml").read_text())
        cfg["train"]["lr"] = lr
        (root / d / "config.yaml").write_text(yaml.safe_dump(cfg))

    write("h", {"name": "fedadc", "variant": "heavy_ball"}, 0.03)
    write("n", {"name": "fedadc", "variant": "nesterov"}, 0.03)
    write("p", {"name": "fedadc_plus", "variant": "nesterov"}, 0.1571121)
    write("a", FEDAVG, 0.01243)
    write("g", {"name": "fedgkd"}, 0.02)
    labels = sorted(g.algorithm for g in load_groups(root)[0])
    assert labels == ["fedadc:variant=heavy_ball", "fedadc:variant=nesterov", "fedadc_plus:variant=nesterov:lr=0.1571",
                      "fedavg:lr=0.01243", "fedgkd:lr=0.02"]
    # no value more common than another (two at 0.03, two at 0.01243): every setting says its own
    shutil.rmtree(root / "g")
    write("g", {"name": "fedgkd"}, 0.01243)
    labels = sorted(g.algorithm for g in load_groups(root)[0])
    assert labels == ["fedadc:variant=heavy_ball:lr=0.03", "fedadc:variant=nesterov:lr=0.03",
                      "fedadc_plus:variant=nesterov:lr=0.1571", "fedavg:lr=0.01243", "fedgkd:lr=0.01243"]


def test_python_api_rows(grid):
    root, rows = grid
    assert [r["algorithm"] for r in rows] == ["fedavg", "fedprox:mu=0.1"]
    for r in rows:
        assert r["runs"] == 2 and r["completed"] == 2 and r["diverged"] == 0
        assert 0 < r["best_accuracy_mean"] <= 1 and r["best_accuracy_std"] >= 0
        assert r["accuracy_at_2_mean"] is not None and r["bytes_down_per_round"] > 0
        assert r["target"] == pytest.approx(0.9 * rows[0]["best_accuracy_mean"])  # default: 90% of fedavg's best
    desc = json.loads((root / "compare.json").read_text())
    assert desc["algorithms"] == ["fedavg", "fedprox:mu=0.1"] and desc["seeds"] == [0, 1]


def test_one_seed_shows_the_value_alone_in_every_format(runs, capsys, monkeypatch):
    """A setting of one completed run shows ``92.0``, not ``92.0 +- 0.0`` (issue 72), in
    Markdown, the printed table (plain and rich) and report.html, whose note says so."""
    from fedrift.report.table import print_table

    rows = summarize(load_groups(runs)[0], at_rounds=[2], target=None)
    md = to_markdown(rows, [2])
    assert "| fedavg alpha=1.0 | 1/1 | 92.0 | 92.0 | 70.0 |" in md
    assert "| fedprox alpha=0.1 | 1/2 (1 diverged) | 84.0 | 84.0 | 80.0 |" in md
    assert "| 85.0 +- 5.0 | 83.0 +- 5.0 |" in md and "+- 0.0" not in md  # more seeds keep their spread
    text = to_text(rows, [2])
    assert "+- 0.0" not in text and "92.0" in text
    print_table(rows, [2])
    assert "+- 0.0" not in capsys.readouterr().out
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)  # rich's table, on a wide terminal
    monkeypatch.setattr("shutil.get_terminal_size", lambda *a: os.terminal_size((300, 40)))
    monkeypatch.setenv("COLUMNS", "300")
    print_table(rows, [2])
    out = capsys.readouterr().out
    assert "┃" in out or "│" in out, out  # rich drew it
    assert "± 0.0" not in out and "92.0" in out and "85.0 ± 5.0" in out
    assert main(["report", str(runs), "report.at_rounds=2", "report.plots=false", "report.tsne=none"]) == 0
    page = (runs / "report.html").read_text()
    results = page[page.index('<table id="results"'):page.index("</table>", page.index('<table id="results"'))]
    assert "<td>92.0</td>" in results and "±&nbsp;0.0" not in results and "± 0.0" not in results
    assert "the value alone for 1 seed" in page


def _titled_runs(root):
    """fedavg and fedprox on digits, dirichlet alpha 0.1 over 20 clients, one seed each."""
    for name, alg in (("a", FEDAVG), ("p", FEDPROX)):
        write_run(root / name, 0, alg, 0.1, [0.5, 0.6])
        cfg = yaml.safe_load((root / name / "config.yaml").read_text())
        cfg["partition"].update(num_clients=20, min_size=5)
        (root / name / "config.yaml").write_text(yaml.safe_dump(cfg))
    return root


def test_the_report_title_says_what_was_compared(tmp_path, capsys):
    """The printed table and report.html are titled by the algorithms, data and partition, not
    the folder's name (issue 72); report.title still overrides."""
    root = _titled_runs(tmp_path / "runs")
    title = "fedrift comparison: fedavg, fedprox on digits (dirichlet alpha=0.1, 20 clients)"
    assert main(["report", str(root), "report.plots=false", "report.tsne=none"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == title  # the printed table's title
    page = (root / "report.html").read_text()
    assert f"<title>{title}</title>" in page and f"<h1>{title}</h1>" in page
    assert main(["report", str(root), "report.plots=false", "report.tsne=none", "report.title=My runs"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "My runs"
    page = (root / "report.html").read_text()
    assert "<title>My runs</title>" in page and "<h1>My runs</h1>" in page


def test_a_swept_partition_value_is_left_out_of_the_title(runs):
    from fedrift.report.table import describe_groups

    assert describe_groups(load_groups(runs)[0]) == "fedavg, fedprox on digits (dirichlet)"  # alpha 0.1 and 1.0


# ---------------------------------------------------------------------------------------
# The worst 10% of clients (issue 71 item 2) and report.metric


def _local(runs, values):
    """Add ``final_local_accuracy`` and ``final_local_accuracy_worst10`` (run folder -> (mean, worst10))."""
    for d, (mean, worst) in values.items():
        path = runs / d / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "final_local_accuracy": mean,
                                    "final_local_accuracy_worst10": worst}))


LOCAL = {"a/s0": (0.90, 0.40), "a/s1": (0.80, 0.50), "a/s2": (0.85, 0.45), "p/s0": (0.70, 0.55), "b/s0": (0.75, 0.30)}


def _cells(md: str, header: str) -> dict[str, str]:
    lines = md.splitlines()
    col = [c.strip() for c in lines[0].split("|")].index(header)
    return {row.split("|")[1].strip(): row.split("|")[col].strip() for row in lines[2:] if row.startswith("| ")}


def test_worst10_column_beside_final_local_with_its_paired_difference(runs):
    """fedavg's worst 10% at alpha 0.1: 40, 50, 45 -> 45.0 +- 5.0 over seeds; fedprox's one
    completed seed (seed 0) 55 against fedavg's 40 on seed 0: +15.0, one pair, no interval."""
    assert "worst 10% local" not in to_markdown(summarize(load_groups(runs)[0], reference="fedavg"))  # older runs
    _local(runs, LOCAL)
    rows = summarize(load_groups(runs)[0], reference="fedavg")
    avg, prox, avg1 = rows
    assert avg["final_local_accuracy_worst10_mean"] == pytest.approx(0.45)
    assert avg["final_local_accuracy_worst10_std"] == pytest.approx(0.05)  # over the seeds
    assert avg["final_local_accuracy_worst10_n"] == 3
    assert prox["final_local_accuracy_worst10_diff_mean"] == pytest.approx(0.15)
    assert prox["final_local_accuracy_worst10_diff_n"] == 1 and prox["final_local_accuracy_worst10_diff_ci95"] is None
    assert "final_local_accuracy_diff_n" not in prox  # the mean's paired column only when report.metric ranks on it
    md = to_markdown(rows)
    head = [c.strip() for c in md.splitlines()[0].split("|")]
    assert head.index("worst 10% local %") == head.index("final local %") + 1
    assert "worst 10% local vs fedavg" in head and "rank" not in md.splitlines()[0]
    worst = _cells(md, "worst 10% local %")
    assert worst == {"fedavg alpha=0.1": "45.0 +- 5.0", "fedprox alpha=0.1": "55.0", "fedavg alpha=1.0": "30.0"}
    paired = _cells(md, "worst 10% local vs fedavg")
    assert paired == {"fedavg alpha=0.1": "ref", "fedprox alpha=0.1": "+15.0 +- -", "fedavg alpha=1.0": "ref"}
    assert "worst 10% local: per run, the mean accuracy of its worst 10% of evaluated clients" in md
    parsed = list(csv.DictReader(io.StringIO(to_csv(rows))))
    for field in ("final_local_accuracy_worst10_mean", "final_local_accuracy_worst10_std",
                  "final_local_accuracy_worst10_n", "final_local_accuracy_worst10_diff_mean",
                  "final_local_accuracy_worst10_diff_ci95", "final_local_accuracy_worst10_diff_p"):
        assert field in parsed[0], field
    assert float(parsed[1]["final_local_accuracy_worst10_diff_mean"]) == pytest.approx(0.15)
    assert float(parsed[0]["final_local_accuracy_std"]) == pytest.approx(0.05)  # the mean local's std over seeds
    # a run from before the metric: the mean says over how many runs it is
    path = runs / "a/s2/summary.json"
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items()
                                if k != "final_local_accuracy_worst10"}))
    md = to_markdown(summarize(load_groups(runs)[0]))
    assert _cells(md, "worst 10% local %")["fedavg alpha=0.1"] == "45.0 +- 7.1 (2/3 runs)"


def test_report_metric_ranks_settings_of_the_same_swept_values(runs):
    """``report.metric``: a rank column on the chosen metric, per swept values; none by default."""
    _local(runs, LOCAL)
    groups = load_groups(runs)[0]
    default = summarize(groups, reference="fedavg")
    assert all("rank" not in r and "rank_metric" not in r for r in default)
    assert to_markdown(summarize(groups, reference="fedavg", metric=None)) == to_markdown(default)
    # the worst 10%: fedprox (55) above fedavg (45) at alpha 0.1; fedavg alone at 1.0
    rows = summarize(groups, reference="fedavg", metric="local_accuracy_worst10")
    assert [(r["rank"], r["rank_metric"]) for r in rows] == [(2, "final_local_accuracy_worst10"),
                                                             (1, "final_local_accuracy_worst10"),
                                                             (1, "final_local_accuracy_worst10")]
    md = to_markdown(rows)
    assert md.splitlines()[0].startswith("| setting | runs | rank (worst 10% local) | best acc % |")
    assert _cells(md, "rank (worst 10% local)") == {"fedavg alpha=0.1": "2", "fedprox alpha=0.1": "1",
                                                    "fedavg alpha=1.0": "1"}
    assert "rank: by the mean over seeds of worst 10% local (final_local_accuracy_worst10; report.metric)" in md
    # accuracy: the best accuracy without a validation split: fedavg 85.0 above fedprox 84.0
    rows = summarize(groups, reference="fedavg", metric="accuracy")
    assert [r["rank"] for r in rows] == [1, 2, 1] and rows[0]["rank_metric"] == "best_accuracy"
    # the mean local accuracy: fedavg 85 above fedprox 70; its paired column is added
    rows = summarize(groups, reference="fedavg", metric="local_accuracy")
    assert [r["rank"] for r in rows] == [1, 2, 1]
    assert rows[1]["final_local_accuracy_diff_mean"] == pytest.approx(-0.20)  # 70 - 90 on seed 0
    assert "final local vs fedavg" in to_markdown(rows).splitlines()[0]
    # equal means share a place; a setting without the value has none
    _local(runs, {"p/s0": (0.70, 0.45)})
    rows = summarize(load_groups(runs)[0], metric="local_accuracy_worst10")
    assert [r["rank"] for r in rows[:2]] == [1, 1]
    for d in ("a/s0", "a/s1", "a/s2", "p/s0", "b/s0"):
        path = runs / d / "summary.json"
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if "local" not in k}))
    rows = summarize(load_groups(runs)[0], metric="local_accuracy_worst10")
    assert [r["rank"] for r in rows] == [None, None, None]
    assert _cells(to_markdown(rows), "rank (worst 10% local)")["fedavg alpha=0.1"] == "-"


@pytest.mark.parametrize("bad", ["worst10", "local_accuracy_worst", "final_local_accuracy_worst10", 3])
def test_a_bad_report_metric_is_refused_in_one_line_listing_the_allowed(runs, capsys, bad):
    from fedrift.report.html import ReportOptions
    from fedrift.report.table import check_metric

    allowed = "allowed: accuracy, local_accuracy, local_accuracy_worst10"
    with pytest.raises(ConfigError, match=f"report.metric: .* is not a metric to rank on; {allowed}"):
        check_metric(bad)
    with pytest.raises(ConfigError, match="report.metric: "):
        ReportOptions.parse({"metric": bad})
    with pytest.raises(ConfigError, match="report.metric"):
        summarize(load_groups(runs)[0], metric=bad)
    assert main(["report", str(runs), f"report.metric={bad}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report.metric" in err[0] and allowed in err[0], err
    assert not (runs / "results.md").exists()


def test_report_metric_on_the_command_line_and_a_metric_no_run_reports(runs, capsys):
    assert main(["report", str(runs), "report.metric=local_accuracy_worst10", "report.plots=false"]) == 0
    out = capsys.readouterr().out
    assert "report.metric=local_accuracy_worst10: no completed run reports final_local_accuracy_worst10" in out
    _local(runs, LOCAL)
    assert main(["report", str(runs), "report.metric=local_accuracy_worst10", "report.plots=false"]) == 0
    out = capsys.readouterr().out
    assert "report.metric=local_accuracy_worst10: no completed run" not in out and "rank (worst 10% local)" in out
    assert "rank (worst 10% local)" in (runs / "results.md").read_text()
    page = (runs / "report.html").read_text()
    assert "<th>rank (worst 10% local)</th>" in page and "rank: by the mean over seeds of worst 10% local" in page
    parsed = list(csv.DictReader(io.StringIO((runs / "results.csv").read_text())))
    assert [r["rank"] for r in parsed] == ["2", "1", "1"] and parsed[0]["rank_metric"] == "final_local_accuracy_worst10"


def test_the_data_line_names_a_partition_switch_only_when_it_is_set():
    from fedrift.report.table import describe_data

    usual = {"data": {"name": "mnist"}, "partition": {"name": "dirichlet", "alpha": 0.1, "num_clients": 20,
                                                        "balance": False}}
    assert describe_data([usual]) == "mnist (dirichlet alpha=0.1, 20 clients)"
    balanced = {**usual, "partition": {**usual["partition"], "balance": True}}
    assert describe_data([balanced]) == "mnist (dirichlet alpha=0.1 balance=true, 20 clients)"
    runs = {"data": {"name": "mnist"}, "partition": {"name": "shards", "classes_per_client": 2, "mode": "sorted"}}
    assert describe_data([runs]) == "mnist (shards classes_per_client=2 mode=sorted)"
