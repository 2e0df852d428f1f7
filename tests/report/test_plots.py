"""Figures: learning curves with a band over seeds, drift curves, partition bubbles, t-SNE."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest
from matplotlib.image import imread

from fedrift.report import plots
from fedrift.report.plots import curve_stats, drift_curves, has_drift, learning_curves, new_figure, partition_plots, save
from fedrift.report.table import load_groups
from fedrift.report.tsne import choose_runs, embed, run_features, tsne_plot


def check_png_svg(plot, min_size=(200, 300)):
    img = imread(plot.png)
    assert img.ndim == 3 and img.shape[0] >= min_size[0] and img.shape[1] >= min_size[1]
    assert float(img[..., :3].std()) > 0.01  # not blank
    root = ET.parse(plot.svg).getroot()
    assert root.tag.endswith("svg")


def legend_hits(fig) -> list[str]:
    """The lines (by label) whose data points, or points along their segments, lie under an axes
    legend of ``fig``, in display coordinates after a draw: measured here from the renderer's
    extents alone, not with the placement code's own test."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    hits = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        for line in ax.get_lines():
            xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
            t = np.linspace(0, 1, 11)[:, None, None]
            points = np.vstack([xy, (xy[:-1] * (1 - t) + xy[1:] * t).reshape(-1, 2)])
            under = ((points[:, 0] >= box.x0) & (points[:, 0] <= box.x1) & (points[:, 1] >= box.y0)
                     & (points[:, 1] <= box.y1))
            if under.any():
                hits.append(line.get_label())
    return hits


@pytest.fixture
def drawn(monkeypatch):
    """Every figure ``save`` writes, kept to be measured after."""
    figures = []

    def keep(fig, base):
        figures.append(fig)
        return save(fig, base)

    monkeypatch.setattr(plots, "save", keep)
    return figures


def crowded(loc):
    """Six phase-shifted sines with bands: at every x the lines spread over the whole y range,
    so no place inside the axes is free for a six-entry legend."""
    fig = new_figure(6.0, 3.6)
    ax = fig.subplots()
    x = np.linspace(0, 10, 120)
    for k in range(6):
        y = np.sin(x + k)
        ax.plot(x, y, label=f"setting {k} with a long name (n=3)", marker="o", ms=2)
        ax.fill_between(x, y - 0.1, y + 0.1, alpha=0.2)
    ax.legend(fontsize=8, loc=loc)
    fig.tight_layout()
    return fig, ax


def test_a_legend_covers_no_curve_even_on_a_crowded_plot(tmp_path):
    """Issue 72 item 6: the legend of a figure the report saves covers none of its curves, where
    matplotlib's own choice (loc="best", the least covered place inside) covers some."""
    fig, _ = crowded("best")
    assert legend_hits(fig), "the crowded plot has a free place after all: the test shows nothing"
    fig, ax = crowded("best")
    save(fig, tmp_path / "crowded")
    assert legend_hits(fig) == []
    renderer = fig.canvas.get_renderer()
    assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1  # beside the axes
    assert fig.get_figwidth() > 6.0  # widened for it, not the axes shrunk to make room
    check_png_svg(plots.Plot("", "", tmp_path / "crowded.png", tmp_path / "crowded.svg"))


def test_a_legend_stays_inside_where_a_corner_is_free(tmp_path):
    """Curves that climb leave the upper left free: the legend goes there, over nothing (R2's
    figure: the reference stays near 10%, under a legend in the lower right)."""
    fig = new_figure(6.0, 3.6)
    ax = fig.subplots()
    x = np.arange(1, 41)
    for k, top in enumerate((5, 30, 45)):
        ax.plot(x, 10 + top * (1 - np.exp(-x / 12)), label=f"method {k}")
    ax.legend(fontsize=8, loc="lower right")  # over the reference's curve, as the report's was
    assert legend_hits(fig)
    save(fig, tmp_path / "climb")
    assert legend_hits(fig) == []
    renderer = fig.canvas.get_renderer()
    box, axes = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert axes.x0 < box.x0 < axes.x0 + 20 and axes.y1 - 20 < box.y1 < axes.y1  # the upper left, inside
    assert fig.get_figwidth() == 6.0


def test_curve_stats_hand_values():
    curves = [[(1, 0.2), (2, 0.4)], [(1, 0.4), (2, 0.8)], [(1, 0.3)]]
    rounds, mean, low, high = curve_stats(curves, "minmax")
    assert rounds.tolist() == [1, 2]
    assert mean.tolist() == pytest.approx([0.3, 0.6]) and low.tolist() == [0.2, 0.4] and high.tolist() == [0.4, 0.8]
    _, mean, low, high = curve_stats(curves, "std")
    assert (high - mean).tolist() == pytest.approx([0.1, np.sqrt(0.08)])  # sample std of (.2,.4,.3) and (.4,.8)


def test_figures_of_the_grid(grid, tmp_path, drawn):
    root, _ = grid
    groups, _ = load_groups(root)
    assert has_drift(groups)
    for band in ("minmax", "std"):
        check_png_svg(learning_curves(groups, tmp_path / f"lc-{band}", band))
    check_png_svg(drift_curves(groups, tmp_path / "drift"))
    assert len(drawn) == 3 and all(legend_hits(fig) == [] for fig in drawn)  # no legend on a curve
    parts = partition_plots(groups, tmp_path)
    assert len(parts) == 1  # one partition config (seed 0's run drawn)
    check_png_svg(parts[0])


def test_tsne_of_final_model_features(grid, tmp_path):
    root, _ = grid
    groups, _ = load_groups(root)
    chosen = choose_runs(groups, ["fedprox:mu=0.1"])
    assert [(t, r.seed) for t, r in chosen] == [("fedprox:mu=0.1, seed 0", 0)]
    h, y = run_features(chosen[0][1], points=150, seed=0)
    assert h.shape == (150, 32) and y.shape == (150,) and len(set(y.tolist())) > 5  # MLP hidden [32]
    xy = embed(h, seed=0)
    assert xy.shape == (150, 2) and np.isfinite(xy).all()
    assert np.array_equal(xy, embed(h, seed=0))  # seeded
    check_png_svg(tsne_plot(chosen, tmp_path / "tsne", points=150))
    assert [t for t, _ in choose_runs(groups, None)] == ["fedavg, seed 0", "fedprox:mu=0.1, seed 0"]


def test_the_tsne_default_is_the_reference_beside_the_best_other_setting(tmp_path):
    from fedrift.report.table import summarize
    from fedrift.report.tsne import default_algorithms

    from .test_paired import write_run

    root = tmp_path / "runs"
    for name, alg, best in (("avg", {"name": "fedavg"}, 0.80), ("prox", {"name": "fedprox", "mu": 0.01}, 0.85),
                            ("gkd", {"name": "fedgkd"}, 0.90), ("csd", {"name": "fedcsd"}, 0.70)):
        write_run(root, name, 0, alg, 0.1, best, best)
        write_run(root, name + "1", 0, alg, 1.0, 1.0 - best, 1.0 - best)  # another alpha: not the one looked at
    groups, _ = load_groups(root)
    names, why = default_algorithms(groups, summarize(groups, reference="fedavg"))
    assert names == ["fedavg", "fedgkd"]  # at alpha 0.1 (the first swept value) fedgkd's best is highest
    assert "fedavg (the reference) and fedgkd, the setting with the highest mean best accuracy" in why
    assert "report.tsne=none" in why
    names, why = default_algorithms(groups, summarize(groups, reference="fedcsd"))
    assert names == ["fedcsd", "fedgkd"] and "fedcsd (the reference)" in why
    names, why = default_algorithms(groups, summarize(groups))  # no reference: the grid's first
    assert names == [groups[0].algorithm, "fedgkd"] and "(the grid's first)" in why


def _clients_csv(run_dir, rows):
    """A run's clients.csv: (round, client, model, n_test, correct) rows, as fedrift writes them."""
    lines = ["round,client,model,n_test,correct"] + [",".join(map(str, r)) for r in rows]
    (run_dir / "clients.csv").write_text("\n".join(lines) + "\n")


def _spread_runs(root):
    """fedavg and fedprox, two seeds each, with local_accuracy_worst10 per round and clients.csv
    (four clients; round 1, then the last round 2 the figure reads)."""
    import json

    from .test_paired import write_run

    last = {("avg", 0): (5, 10, 10, 10), ("avg", 1): (6, 10, 10, 10), ("prox", 0): (8, 9, 10, 10),
            ("prox", 1): (7, 9, 10, 10)}  # correct of 10 test samples each, at round 2
    for (name, seed), right in last.items():
        alg = {"name": "fedavg"} if name == "avg" else {"name": "fedprox", "mu": 0.01}
        write_run(root, name, seed, alg, 0.1, 0.8, 0.8)
        d = root / name / f"seed{seed}"
        worst = min(right) / 10
        (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in (
            {"round": 1, "test_accuracy": 0.5, "local_accuracy_worst10": worst / 2},
            {"round": 2, "test_accuracy": 0.8, "local_accuracy_worst10": worst})))
        _clients_csv(d, [(1, k, "global", 10, 1) for k in range(4)] + [(2, k, "global", 10, c) for k, c in enumerate(right)])
    return root


def test_client_accuracies_are_read_at_the_last_round_personal_first(tmp_path):
    from types import SimpleNamespace

    from fedrift.report.plots import read_client_accuracies

    run = SimpleNamespace(dir=tmp_path)
    assert read_client_accuracies(run) is None  # no clients.csv
    _clients_csv(tmp_path, [(1, 0, "global", 4, 1), (1, 1, "global", 4, 2), (2, 0, "global", 4, 3), (2, 1, "global", 5, 5),
                            (2, 2, "global", 0, 0),  # no local test sample: no accuracy
                            (2, 0, "calibrated", 4, 4), (2, 0, "global_proto", 4, 4),  # other models: not read
                            ("x", 0, "global", 4, 1), (2, 3, "global", 4, 9)])  # damaged rows: skipped
    assert read_client_accuracies(run) == ("global", [0.75, 1.0])
    _clients_csv(tmp_path, [(3, 0, "global", 4, 3), (3, 0, "personal", 4, 2), (3, 1, "personal", 2, 1), (2, 0, "global", 1, 1)])
    assert read_client_accuracies(run) == ("personal", [0.5, 0.5])  # the model local_accuracy is of
    (tmp_path / "clients.csv").write_bytes(b"\xff\xfe garbage\n")
    assert read_client_accuracies(run) is None


def test_worst10_curves_and_the_per_client_ecdf_by_hand(tmp_path, drawn):
    from fedrift.report.plots import client_accuracy, worst10_curves

    root = _spread_runs(tmp_path / "runs")
    groups, _ = load_groups(root)
    check_png_svg(worst10_curves(groups, tmp_path / "w10"))
    check_png_svg(client_accuracy(groups, tmp_path / "ecdf"))
    curves, ecdf = drawn
    lines = {line.get_label(): line for line in curves.axes[0].get_lines()}
    # fedavg: worst 50% and 60% at round 2, 25% and 30% at round 1: means 27.5, 55.0
    assert lines["fedavg (n=2)"].get_ydata().tolist() == pytest.approx([27.5, 55.0])
    assert lines["fedprox (n=2)"].get_ydata().tolist() == pytest.approx([37.5, 75.0])
    steps = {line.get_label(): line for line in ecdf.axes[0].get_lines() if not line.get_label().startswith("_")}
    avg = steps["fedavg (global, 8 clients, 2 seeds)"]  # both seeds' four clients pooled
    assert avg.get_xdata().tolist() == pytest.approx([50, 50, 60, 100, 100, 100, 100, 100, 100])
    assert avg.get_ydata().tolist() == pytest.approx([k / 8 for k in range(9)])
    assert steps["fedprox (global, 8 clients, 2 seeds)"].get_xdata().tolist()[:4] == pytest.approx([70, 70, 80, 90])
    assert all(legend_hits(fig) == [] for fig in drawn)
    # no clients.csv and no worst 10% in the metrics: no figure
    for d in root.glob("*/seed*"):
        (d / "clients.csv").unlink()
        (d / "metrics.jsonl").write_text('{"round": 2, "test_accuracy": 0.8}\n')
    groups, _ = load_groups(root)
    assert client_accuracy(groups, tmp_path / "none") is None and worst10_curves(groups, tmp_path / "none2") is None


def test_the_report_shows_the_two_figures_only_when_runs_have_them(tmp_path):
    import fedrift

    root = _spread_runs(tmp_path / "runs")
    fedrift.write_report(root, verbose=False, tsne="none")
    page = (root / "report.html").read_text()
    assert "<h3>Per-client accuracy</h3>" in page and "<h3>Worst 10% of clients: learning curves</h3>" in page
    assert "the clients of every completed seed pooled" in page
    assert page.index("<h3>Learning curves</h3>") < page.index("<h3>Worst 10% of clients") < page.index(
        "<h3>Per-client accuracy</h3>")
    assert (root / "figures" / "client_accuracy.png").is_file() and (root / "figures" / "worst10_curves.svg").is_file()
    for d in root.glob("*/seed*"):
        (d / "clients.csv").unlink()
        (d / "metrics.jsonl").write_text('{"round": 2, "test_accuracy": 0.8}\n')
    fedrift.write_report(root, verbose=False, tsne="none")
    page = (root / "report.html").read_text()
    assert "Per-client accuracy" not in page and "Worst 10% of clients" not in page
    assert not (root / "figures" / "client_accuracy.png").exists()  # the earlier report's figure removed


def test_the_grids_runs_give_both_figures(grid, tmp_path):
    from fedrift.report.plots import client_accuracy, worst10_curves

    groups, _ = load_groups(grid[0])
    check_png_svg(worst10_curves(groups, tmp_path / "w10"))
    check_png_svg(client_accuracy(groups, tmp_path / "ecdf"))
