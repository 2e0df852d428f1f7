"""report.paper: the seed papers' published numbers beside the measured ones."""

from __future__ import annotations

import csv
import io
import json

import pytest
import yaml

from fedrift.algorithms import ALGORITHMS
from fedrift.cli import main
from fedrift.errors import ConfigError
from fedrift.report import published
from fedrift.report.published import FEDCSD_PRINTED_GAPS, PUBLISHED, data_caveat, match, parse_cell
from fedrift.report.table import load_groups, summarize

CIFAR10_JPEG = {"name": "imagefolder", "root": "../shared/data/cifar10-jpeg"}


def write_run(root, name, seed, algorithm, alpha, best, data=None, clients_per_round=4):
    """A finished run folder of a FedGKD Table 3 design (20 clients), as compare writes it."""
    d = root / name / f"seed{seed}"
    d.mkdir(parents=True)
    cfg = {"seed": seed, "data": data or CIFAR10_JPEG, "partition": {"name": "dirichlet", "alpha": alpha, "num_clients": 20},
           "algorithm": {"name": algorithm}, "train": {"rounds": 4, "clients_per_round": clients_per_round},
           "output": {"dir": str(d)}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "metrics.jsonl").write_text(json.dumps({"round": 4, "test_accuracy": best}) + "\n")
    summary = {"status": "completed", "best_accuracy": best, "final_accuracy": best, "rounds": 4, "seed": seed}
    (d / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    for seed in (0, 1):
        write_run(root, "avg", seed, "fedavg", 0.1, 0.60 + 0.01 * seed)
        write_run(root, "vote", seed, "fedgkd_vote", 0.1, 0.64 + 0.01 * seed)  # +4 points on both seeds
        write_run(root, "scaffold", seed, "scaffold", 0.1, 0.61)  # not a method of Table 3
        write_run(root, "avg3", seed, "fedavg", 0.3, 0.62)  # alpha 0.3: no column of Table 3
    return root


def test_every_table_is_whole_and_names_fedrift_algorithms():
    assert set(PUBLISHED) == {"fedgkd-table3-cifar10", "fedgkd-table3-cifar100", "fedgkd-table3-tinyimagenet",
                              "fedcsd-table1-cifar100", "fedcsd-table1-femnist", "fedadc-table1-cifar10",
                              "fedadc-table1-cifar100"}
    for t in PUBLISHED.values():
        assert set(t.cells) == set(t.methods) and list(t.methods.values()).count("fedavg") == 1
        assert all(len(row) == len(t.columns) for row in t.cells.values()), t.name
        assert all(alg in ALGORITHMS for alg in t.methods.values()), t.name
        assert t.source.startswith("papers/") and t.table.startswith("Table")
    assert parse_cell("77.30±0.72") == (77.30, 0.72) and parse_cell("66±1.28") == (66.0, 1.28)
    assert parse_cell("58.50") == (58.50, None) and parse_cell("-") == (None, None)
    assert PUBLISHED["fedgkd-table3-cifar10"].cells["FedGKD-Vote"][2] == "72.99±0.49"  # alpha=0.1
    assert PUBLISHED["fedadc-table1-cifar10"].cells["FedADC+"] == ("81.42±0.35", "78.77±0.7")


def test_fedcsd_printed_gaps_agree_with_its_accuracies_except_the_noted_cells():
    disagree = []
    for name, gaps in FEDCSD_PRINTED_GAPS.items():
        t = PUBLISHED[name]
        for method, printed in gaps.items():
            for col, gap in enumerate(printed):
                acc, base = parse_cell(t.cells[method][col])[0], parse_cell(t.cells["FedAvg"][col])[0]
                if abs(acc - base - gap) > 0.0101:
                    disagree.append((name, method, t.columns[col].label.split(",")[0]))
    assert disagree == [("fedcsd-table1-cifar100", "MOON", "beta=0.01"), ("fedcsd-table1-cifar100", "MOON", "beta=0.5"),
                        ("fedcsd-table1-cifar100", "FedCSD", "beta=5"), ("fedcsd-table1-femnist", "FedProto", "beta=0.05")]
    notes = " ".join(PUBLISHED["fedcsd-table1-cifar100"].notes + PUBLISHED["fedcsd-table1-femnist"].notes)
    for _, method, setting in disagree:
        assert f"{method} {setting}" in notes


def test_a_runs_setting_matches_the_tables_column_by_partition_and_participation():
    adc = PUBLISHED["fedadc-table1-cifar10"]
    shards = {"partition": {"name": "shards", "classes_per_client": 2, "num_clients": 100}}
    assert match(adc, {**shards, "train": {"clients_per_round": 20}}) == 0
    assert match(adc, {**shards, "train": {"clients_per_round": 10}}) == 1
    assert match(adc, {**shards, "train": {"participation": 0.1}}) == 1
    assert match(adc, {**shards, "train": {}}) == 0  # the engine's default C = 0.2
    sorted_runs = {"partition": {**shards["partition"], "mode": "sorted"}, "train": {"clients_per_round": 20}}
    assert match(adc, sorted_runs) is None  # McMahan's equal runs are not the paper's s distinct classes
    assert match(adc, {"partition": {"name": "shards", "classes_per_client": 3, "num_clients": 100}, "train": {}}) is None
    assert match(adc, {"partition": {"name": "dirichlet", "alpha": 2, "num_clients": 100}, "train": {}}) is None
    adc100 = PUBLISHED["fedadc-table1-cifar100"]
    part = {"name": "dirichlet", "alpha": 0.1, "num_clients": 100}
    assert match(adc100, {"partition": part, "train": {"clients_per_round": 10}}) == 3
    csd = PUBLISHED["fedcsd-table1-cifar100"]
    assert match(csd, {"partition": {"name": "dirichlet", "alpha": 5.0, "num_clients": 10},
                       "train": {"clients_per_round": 10}}) == 2
    assert match(csd, {"partition": {"name": "dirichlet", "alpha": 5.0, "num_clients": 10},
                       "train": {"clients_per_round": 5}}) is None  # C = 0.5: not the paper's


def test_the_caveat_names_the_jpeg_copy_and_other_data():
    t = PUBLISHED["fedgkd-table3-cifar10"]
    assert data_caveat(t, {"data": {"name": "cifar10", "root": "/data/cifar-10-batches-py"}}) is None
    assert data_caveat(t, {"data": CIFAR10_JPEG}).startswith("CIFAR-10 (JPEG q75 copy) vs published CIFAR-10")
    assert "the runs' data is digits, not the paper's CIFAR-10" in data_caveat(t, {"data": {"name": "digits"}})
    assert "not the paper's CIFAR-100" in data_caveat(PUBLISHED["fedcsd-table1-cifar100"], {"data": CIFAR10_JPEG})
    tiny = PUBLISHED["fedgkd-table3-tinyimagenet"]
    assert data_caveat(tiny, {"data": {"name": "tinyimagenet", "root": "data/tinyimagenet", "size": 64}}) is None
    assert data_caveat(tiny, {"data": {"name": "tinyimagenet"}}) is None  # the loader's default: 64
    assert data_caveat(tiny, {"data": {"name": "tinyimagenet", "size": 32}}).startswith(
        "Tiny-ImageNet at 32x32 (its 64x64 images downsampled) vs published Tiny-ImageNet")


def test_report_paper_renders_the_published_columns_beside_the_measured_ones(runs, capsys):
    args = ["report", str(runs), "report.plots=false", "report.tsne=none"]
    assert main([*args, "report.paper=fedgkd-table3-cifar10"]) == 0
    out = capsys.readouterr().out
    assert "published gap vs FedAvg" in out and "CIFAR-10 (JPEG q75 copy) vs published CIFAR-10" in out
    md = (runs / "results.md").read_text()
    assert md.splitlines()[0].startswith(
        "| setting | paper setting | runs | best acc % | published % | final acc % | best vs fedavg | "
        "published gap vs FedAvg |")
    # FedGKD-Vote at alpha 0.1: measured +4.0 points on both seeds (two seeds: no *); published 72.99 - 69.22 = +3.77
    assert "| fedgkd_vote alpha=0.1 | alpha=0.1, C=0.2 | 2/2 | 64.5 +- 0.7 | 72.99 +- 0.49 | 64.5 +- 0.7 | " \
           "+4.0 +- 0.0 | +3.77 |" in md
    assert "| fedavg alpha=0.1 | alpha=0.1, C=0.2 | 2/2 | 60.5 +- 0.7 | 69.22 +- 0.91 | 60.5 +- 0.7 | ref | ref |" in md
    assert "| scaffold alpha=0.1 | alpha=0.1, C=0.2 | 2/2 | 61.0 +- 0.0 | not in table |" in md
    assert "| fedavg alpha=0.3 | no published row | 2/2 | 62.0 +- 0.0 | - |" in md
    assert "Table 3, CIFAR-10, source papers/003_a25076a1fcb1f17c.txt" in md
    rows = {r["setting"]: r for r in csv.DictReader(io.StringIO((runs / "results.csv").read_text()))}
    vote = rows["fedgkd_vote alpha=0.1"]
    assert vote["paper"] == "fedgkd-table3-cifar10" and vote["paper_method"] == "FedGKD-Vote"
    assert float(vote["published_accuracy"]) == pytest.approx(0.7299)
    assert float(vote["published_std"]) == pytest.approx(0.0049)
    assert float(vote["published_gap"]) == pytest.approx(0.0377)
    assert rows["fedavg alpha=0.3"]["paper_setting"] == "no published row" and rows["fedavg alpha=0.3"]["published_accuracy"] == ""
    html = (runs / "report.html").read_text()
    assert "<th>published %</th>" in html and "<td>72.99 ±&nbsp;0.49</td>" in html and "<td>+3.77</td>" in html
    assert '<p class="note" id="published">' in html and "CIFAR-10 (JPEG q75 copy)" in html
    assert main(args) == 0  # without report.paper: no published columns
    assert "published" not in (runs / "results.md").read_text()


def test_published_rows_of_a_real_compare_say_what_they_match(grid):
    """The session's tiny compare (digits, 6 clients, 3 a round): no setting of FedCSD's table."""
    root, _ = grid
    groups, _ = load_groups(root)
    rows = summarize(groups, reference="fedavg")
    published.add_published(groups, rows, "fedcsd-table1-cifar100")
    assert [r["paper_setting"] for r in rows] == ["no published row"] * len(rows)
    assert all(r["published_accuracy"] is None for r in rows)
    assert rows[0]["paper_caveat"].startswith("the runs' data is digits, not the paper's CIFAR-100")
    assert published.cells(rows[0]) == ("no published row", "-", "-")


def test_an_unknown_paper_is_refused_in_one_line_before_anything_runs(runs, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"^report\.paper: 'fedgkd' is not a published table; allowed: fedgkd-table3-cifar10, "):
        published.get("fedgkd")
    assert published.get("none") is None
    assert main(["report", str(runs), "report.paper=fedgkd-table9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report.paper: 'fedgkd-table9' is not a published table; allowed: " in err[0]
    assert "fedadc-table1-cifar10" in err[0] and not (runs / "results.md").exists()
    out = tmp_path / "cmp"
    assert main(["compare", "algorithms=fedavg", "data.name=digits", "report.paper=nope", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report.paper: 'nope' is not a published table" in err[0] and not out.exists()
