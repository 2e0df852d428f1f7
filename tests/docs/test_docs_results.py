"""The results page's numbers are the committed runs': each paired gap of the orderings table
(BENCHMARKS.md, section R, which the page includes) is what fedrift's paired differences give
on the runs in benchmarks/results, and what the page's figure draws."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docs_results_figures", ROOT / "docs" / "results" / "figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)

# the figure's row -> the orderings table's (setting, claim) row
ROWS = {
    "R1 alpha 0.5: FedGKD - FedAvg": ("R1, alpha 0.5 (CPU)", "FedGKD > FedAvg"),
    "R1 alpha 0.5: FedGKD-Vote - FedAvg": ("R1, alpha 0.5 (CPU)", "FedGKD-Vote > FedAvg"),
    "R1 alpha 0.5: FedProx - FedAvg": ("R1, alpha 0.5 (CPU)", "FedProx = FedAvg"),
    "R1 alpha 0.5: FedADC - FedAvg": ("R1, alpha 0.5 (CPU)", "(FedADC, not in Table 3)"),
    "R2 C 0.2: FedADC - FedAvg": ("R2, C = 0.2 (CPU)", "FedADC > FedAvg"),
    "R2 C 0.2: FedADC+ - FedAvg": ("R2, C = 0.2 (CPU)", "FedADC+ > FedAvg"),
    "R2 C 0.2: FedADC+ - FedADC": ("R2, C = 0.2 (CPU)", "FedADC+ > FedADC"),
    "R2 C 0.2: FedGKD - FedAvg": ("R2, C = 0.2 (CPU)", "FedGKD > FedAvg"),
    "R2 C 0.1: FedADC, coverage - uniform": ("R2, C = 0.1 (GPU, 6 seeds)", "class coverage lifts FedADC"),
}


def _table() -> dict[tuple[str, str], str]:
    text = (ROOT / "BENCHMARKS.md").read_text()
    block = text.split("**The papers' orderings at a glance**", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in block.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[(cells[0], cells[1])] = cells[2].replace("**", "")
    return rows


def test_every_gap_drawn_is_the_tables_and_the_runs():
    from fedrift.report.paired import differences
    from fedrift.report.table import load_groups

    table = _table()
    assert set(ROWS) == {label for label, *_ in figures.GAPS}
    for label, folder, a, b in figures.GAPS:
        groups = load_groups(figures.RESULTS / folder)[0]
        d = differences(figures._group(groups, a), figures._group(groups, b), ["best_accuracy"])
        shown = f"{100 * d['best_accuracy_diff_mean']:+.1f} +- {100 * d['best_accuracy_diff_ci95']:.1f}"
        assert re.match(re.escape(shown) + r"\b", table[ROWS[label]]), (label, shown, table[ROWS[label]])


def test_the_results_figures_legends_cover_no_curve(tmp_path, monkeypatch):
    """Issue 72 item 6: in R1's and R2's learning curves the legend covered the FedAvg curves the
    text compares against; every legend the results page's figures draw now covers none."""
    from fedrift.report import plots
    from report.test_plots import legend_hits

    drawn = []

    def keep(fig, base):
        drawn.append(fig)
        return save(fig, base)

    save = plots.save
    monkeypatch.setattr(plots, "save", keep)
    figures.curves(tmp_path)
    assert len(drawn) == len(figures.CURVES)
    for name, fig in zip(figures.CURVES, drawn):
        assert legend_hits(fig) == [], name
