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

# (figure file, title, committed runs folders): every client's accuracy on its own split, global
# remedies against personalised ones (issue 71's comparison)
SPREADS = [
    ("d-personal-spread", "Workload D (feature skew: 4 digit domains, 20 clients), 15 rounds, 3 seeds",
     ("d-personal", "d-personal-extra", "d-personal-babu")),
    ("a-personal-spread", "Workload A (label skew, Dirichlet 0.1, 20 clients), 20 rounds, 3 seeds",
     ("a-personal", "a-personal-babu")),
]
# the methods that score each client's own model (docs/concepts/evaluation.md); the rest score the
# global one (FedBABU too: its personalisation is the fine-tuning after training, a row of its own)
PERSONALISED = {"fedper", "lgfedavg", "fedrep", "fedbabu", "ditto", "apfl", "fedrod"}


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


def _spread_rows(groups: Sequence) -> list[tuple[str, bool, tuple, tuple]]:
    """Per setting (and FedADC's per-client calibration beside its run, where it was on): its
    label, whether it scores per-client models, and (mean, 95% t half-width) over seeds of the
    final mean local accuracy and of its worst 10% of clients, in points."""
    from fedrift.report.paired import interval

    def over_seeds(runs: Sequence, key: str) -> tuple:
        mean, half = interval([100 * r.summary[key] for r in runs if isinstance(r.summary.get(key), (int, float))])
        return mean, half or 0.0

    rows = []
    for g in groups:
        done = g.done()
        name = g.algorithm.split(":")[0]
        label = g.algorithm.split(":eval.")[0]  # the fine-tuning after training is a row of its own
        rows.append((label, name in PERSONALISED and name != "fedbabu", over_seeds(done, "final_local_accuracy"),
                     over_seeds(done, "final_local_accuracy_worst10")))
        if any("personalized_accuracy_worst10" in r.summary for r in done):
            ev = done[0].config.get("eval") or {}
            tuned = "whole model fine-tuned" if ev.get("personalize_part") == "all" else "classifier calibrated"
            at = f" at lr {ev['personalize_lr']:g}" if ev.get("personalize_lr") else ""
            rows.append((f"{name} + {tuned} per client{at}", True, over_seeds(done, "personalized_accuracy"),
                         over_seeds(done, "personalized_accuracy_worst10")))
    seen, kept = set(), []
    for r in rows:  # a setting's global model run again beside another fine-tuning: drawn once
        if r[2][0] is not None and r[3][0] is not None and (r[2], r[3]) not in seen:
            seen.add((r[2], r[3]))
            kept.append(r)
    return sorted(kept, key=lambda r: r[3][0])


def spread(out: Path) -> list[Path]:
    """Per method: the clients' mean accuracy on their own test splits and that of the worst 10%
    of them (mean over seeds, 95% t interval), global remedies in grey, personalised in blue."""
    from fedrift.report.plots import new_figure, save
    from fedrift.report.table import load_groups

    made = []
    for name, title, folders in SPREADS:
        rows = _spread_rows([g for folder in folders for g in load_groups(RESULTS / folder)[0]])
        if not rows:
            raise SystemExit(f"figures.py: no completed runs in benchmarks/results/{', '.join(folders)}")
        fig = new_figure(7.5, 0.36 * len(rows) + 1.5)
        ax = fig.subplots()
        for i, (label, personal, (m, mh), (w, wh)) in enumerate(rows):
            colour = "#1f77b4" if personal else "#7f7f7f"
            ax.plot([w, m], [i, i], color=colour, lw=1, alpha=0.5)
            ax.errorbar(m, i, xerr=mh, fmt="o", color=colour, capsize=2, ms=5)
            ax.errorbar(w, i, xerr=wh, fmt="v", color=colour, capsize=2, ms=6, mfc="white")
        ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
        ax.set_xlabel("accuracy on the clients' own test splits (%): mean over seeds, 95% t interval")
        ax.grid(True, axis="x", alpha=0.3)
        ax.plot([], [], "o", color="black", label="mean over clients")
        ax.plot([], [], "v", color="black", mfc="white", label="worst 10% of clients")
        ax.legend(fontsize=8)
        ax.set_title(f"{title}\nglobal remedies grey, personalised blue; sorted by the worst 10%", fontsize=9)
        fig.tight_layout()
        png, svg = save(fig, out / name)
        svg.unlink()
        made.append(png)
    return made


def draw(out: Path = OUT) -> list[Path]:
    """Every figure in ``out``, quietly (the docs build's ``fedrift_figures`` calls this)."""
    return [*curves(out), gaps(out), *spread(out)]


def main(argv: Sequence[str]) -> int:
    for path in draw(Path(argv[0]) if argv else OUT):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
