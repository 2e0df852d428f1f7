"""A small real comparison, run once per session and shared by the report tests."""

from __future__ import annotations

import pytest

import fedrift
from conftest import grid_config

ALGORITHMS = ["fedavg", "fedprox:mu=0.1"]
SEEDS = [0, 1]


@pytest.fixture(scope="session")
def grid(tmp_path_factory):
    """2 algorithms x 2 seeds, 3 rounds, drift diagnostics on; report with t-SNE on 200 points."""
    root = tmp_path_factory.mktemp("grid") / "cmp"
    cfg = grid_config(root.parent, train={"rounds": 3}, eval={"drift": True})
    rows = fedrift.compare(cfg, algorithms=ALGORITHMS, seeds=SEEDS, out=root, verbose=False,
                           report_options={"tsne_points": 200, "at_rounds": [2]})
    return root, rows
