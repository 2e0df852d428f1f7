"""Every file of the report exists and is well-formed; report.html is self-contained."""

from __future__ import annotations

import base64
import csv
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

from matplotlib.image import imread

from .conftest import SEEDS

VOID = {"meta", "img", "br", "hr", "link", "input", "col", "area", "base", "source", "wbr"}


class Checker(HTMLParser):
    """Tag balance, <img> sources, table ids, and any URL that would need a network."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.imgs, self.tables, self.cells = [], [], [], {}, 0
        self.current_table = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        if tag == "table":
            self.current_table = a.get("id")
            self.tables[self.current_table] = 0
        if tag == "tr" and self.current_table:
            self.tables[self.current_table] += 1
        for k, v in attrs:
            if k in ("src", "href") and v and not v.startswith("data:"):
                self.errors.append(f"external {k}={v[:40]}")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()
        if tag == "table":
            self.current_table = None


def test_every_file_exists_and_is_well_formed(grid):
    root, rows = grid
    for name in ("compare.json", "results.csv", "results.md", "report.html"):
        assert (root / name).is_file(), name
    with open(root / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["algorithm"] for r in table] == ["fedavg", "fedprox:mu=0.1"]
    md = (root / "results.md").read_text().strip().splitlines()
    table_lines = [line for line in md if line.startswith("|")]
    assert len(table_lines) == 2 + len(rows) and "acc@2 %" in md[0] and "final vs fedavg" in md[0]
    assert md[-1].startswith("'vs fedavg': paired differences")  # the note under the table
    figures = sorted(p.name for p in (root / "figures").iterdir())
    names = ("drift", "learning_curves", "worst10_curves", "client_accuracy", "partition-1", "tsne")  # the runs write clients.csv
    assert figures == sorted(f"{n}.{ext}" for n in names for ext in ("png", "svg"))
    assert "worst 10% local %" in md[0] and "worst 10% local vs fedavg" in md[0]  # every run reports its worst 10%
    for p in (root / "figures").iterdir():
        if p.suffix == ".png":
            assert imread(p).ndim == 3
        else:
            assert ET.parse(p).getroot().tag.endswith("svg")
    for setting in ("fedavg", "fedprox-mu=0.1"):
        for seed in SEEDS:
            run = root / setting / f"seed{seed}"
            for name in ("config.yaml", "partition.json", "metrics.jsonl", "summary.json", "final_model.pt"):
                assert (run / name).is_file(), run / name


def test_report_html_is_self_contained(grid):
    root, rows = grid
    text = (root / "report.html").read_text()
    assert text.startswith("<!DOCTYPE html>")
    checker = Checker()
    checker.feed(text)
    checker.close()
    assert checker.errors == [] and checker.stack == []
    assert checker.tables["results"] == 1 + len(rows)  # header + a row per setting
    assert len(checker.imgs) == 6  # learning curves, worst 10% curves, per-client accuracy, drift, partition, t-SNE
    for src in checker.imgs:
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r"https?://|src=\"//|@import|<script", text)
    assert text.count("<details>") == len(rows) and "algorithm:\n  name: fedprox\n  mu: 0.1" in text
    # the t-SNE's panels are the default's, and the caption says which and why
    assert ("Panels (report.tsne&#x27;s default): fedavg (the reference) and fedprox:mu=0.1, the setting with the highest "
            "mean best accuracy") in text


def test_the_partition_plot_reads_any_run_that_kept_its_index_arrays(grid, tmp_path, recwarn):
    """A committed results folder keeps seed 0's ``partition.bin`` alone (.gitignore): the plot
    comes from a run that has both files, and with none it is left out without a warning."""
    import shutil

    import fedrift

    root = tmp_path / "cmp"
    shutil.copytree(grid[0], root)
    shutil.rmtree(root / "figures")
    (root / "fedavg" / "seed0" / "partition.bin").unlink()  # the first run the plot would read
    fedrift.write_report(root, verbose=False, tsne="none")
    assert (root / "figures" / "partition-1.png").is_file()
    assert not [w for w in recwarn if "partition plot" in str(w.message)]
    for run in root.glob("*/seed*"):
        (run / "partition.bin").unlink(missing_ok=True)
    shutil.rmtree(root / "figures")
    fedrift.write_report(root, verbose=False, tsne="none")
    assert not (root / "figures" / "partition-1.png").exists() and (root / "report.html").is_file()
    assert not [w for w in recwarn if "partition plot" in str(w.message)]
