"""The results page's figures, drawn by fedrift's own report code from the committed runs.

    .venv/bin/python docs/results/figures.py [OUT]     # default OUT: docs/_generated/figures

``make docs`` runs this at the start of every build (``fedrift_figures``), so the figures are
always those of the runs in ``benchmarks/results``. The learning curves are
:func:`fedrift.report.plots.learning_curves`, the figure ``fedrift report`` puts in
``report.html``; the paired differences are :func:`fedrift.report.paired.differences`, the
numbers of the results tables' "vs fedavg" columns, drawn with the report's figure helpers.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "_generated" / "figures"

# (figure file, committed runs folder): the learning curves of each
CURVES = {
    "r1-alpha05-curves": "r1-a05",
    "r2-c02-curves": "r2-c02",
    "r2-c01-coverage-curves": "r2-gpu-c01",
}
# (label, committed runs folder, setting, reference setting): the paired gaps drawn together
GAPS = [
    ("R1 alpha 0.5: FedGKD - FedAvg", "r1-a05", "fedgkd", "fedavg"),
    ("R1 alpha 0.5: FedGKD-Vote - FedAvg", "r1-a05", "fedgkd_vote", "fedavg"),
    ("R1 alpha 0.5: FedProx - FedAvg", "r1-a05", "fedprox:mu=0.01", "fedavg"),
    ("R1 alpha 0.5: FedADC - FedAvg", "r1-a05", "fedadc", "fedavg"),
    ("R2 C 0.2: FedADC - FedAvg", "r2-c02", "fedadc", "fedavg:train.momentum=0"),
    ("R2 C 0.2: FedADC+ - FedAvg", "r2-c02", "fedadc_plus:variant=nesterov", "fedavg:train.momentum=0"),
    ("R2 C 0.2: FedADC+ - FedADC", "r2-c02", "fedadc_plus:variant=nesterov", "fedadc"),
    ("R2 C 0.2: FedGKD - FedAvg", "r2-c02", "fedgkd:T=0.5", "fedavg:train.momentum=0"),
    ("R2 C 0.1: FedADC, coverage - uniform", "r2-gpu-c01", "fedadc:engine.sampling=class_coverage", "fedadc"),
]


def _group(groups: Sequence, name: str):
    for g in groups:
        if g.algorithm == name or g.label == name:
            return g
    raise SystemExit(f"figures.py: no setting {name!r} among {[g.algorithm for g in groups]}")


def curves(out: Path) -> list[Path]:
    from fedrift.report.plots import learning_curves
    from fedrift.report.table import load_groups

    made = []
    for name, folder in CURVES.items():
        groups, _ = load_groups(RESULTS / folder)
        plot = learning_curves(groups, out / name)
        if plot is None:
            raise SystemExit(f"figures.py: no completed runs in benchmarks/results/{folder}")
        plot.svg.unlink()  # the page shows the PNG
        made.append(plot.png)
    return made


def gaps(out: Path) -> Path:
    """Each gap's paired mean over seeds and its 95% t interval, in points of best accuracy."""
    from fedrift.report.paired import differences
    from fedrift.report.plots import new_figure, save
    from fedrift.report.table import load_groups

    rows = []
    loaded: dict[str, list] = {}
    for label, folder, a, b in GAPS:
        groups = loaded.setdefault(folder, load_groups(RESULTS / folder)[0])
        d = differences(_group(groups, a), _group(groups, b), ["best_accuracy"])
        rows.append((f"{label} (n={d['best_accuracy_diff_n']})", 100 * d["best_accuracy_diff_mean"],
                     100 * (d["best_accuracy_diff_ci95"] or 0.0), d["best_accuracy_diff_low"] is not None
                     and d["best_accuracy_diff_low"] > 0))
    fig = new_figure(7.5, 0.42 * len(rows) + 1.2)
    ax = fig.subplots()
    for i, (label, mean, half, held) in enumerate(reversed(rows)):
        colour = "#1f77b4" if held else "#7f7f7f"
        ax.errorbar(mean, i, xerr=half, fmt="o", color=colour, capsize=3, lw=1.4)
    ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)], fontsize=8)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("paired gap in best test accuracy (points): mean over seeds, 95% t interval")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("The papers' orderings on real images (blue: interval above 0)", fontsize=10)
    fig.tight_layout()
    png, svg = save(fig, out / "paired-gaps")
    svg.unlink()
    return png


def draw(out: Path = OUT) -> list[Path]:
    """Every figure in ``out``, quietly (the docs build's ``fedrift_figures`` calls this)."""
    return [*curves(out), gaps(out)]


def main(argv: Sequence[str]) -> int:
    for path in draw(Path(argv[0]) if argv else OUT):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
