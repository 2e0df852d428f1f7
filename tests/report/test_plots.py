"""Figures: learning curves with a band over seeds, drift curves, partition bubbles, t-SNE."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest
from matplotlib.image import imread

from fedrift.report.plots import curve_stats, drift_curves, has_drift, learning_curves, partition_plots
from fedrift.report.table import load_groups
from fedrift.report.tsne import choose_runs, embed, run_features, tsne_plot


def check_png_svg(plot, min_size=(200, 300)):
    img = imread(plot.png)
    assert img.ndim == 3 and img.shape[0] >= min_size[0] and img.shape[1] >= min_size[1]
    assert float(img[..., :3].std()) > 0.01  # not blank
    root = ET.parse(plot.svg).getroot()
    assert root.tag.endswith("svg")


def test_curve_stats_hand_values():
    curves = [[(1, 0.2), (2, 0.4)], [(1, 0.4), (2, 0.8)], [(1, 0.3)]]
    rounds, mean, low, high = curve_stats(curves, "minmax")
    assert rounds.tolist() == [1, 2]
    assert mean.tolist() == pytest.approx([0.3, 0.6]) and low.tolist() == [0.2, 0.4] and high.tolist() == [0.4, 0.8]
    _, mean, low, high = curve_stats(curves, "std")
    assert (high - mean).tolist() == pytest.approx([0.1, np.sqrt(0.08)])  # sample std of (.2,.4,.3) and (.4,.8)


def test_figures_of_the_grid(grid, tmp_path):
    root, _ = grid
    groups, _ = load_groups(root)
    assert has_drift(groups)
    for band in ("minmax", "std"):
        check_png_svg(learning_curves(groups, tmp_path / f"lc-{band}", band))
    check_png_svg(drift_curves(groups, tmp_path / "drift"))
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
