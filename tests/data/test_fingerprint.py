"""Data fingerprints (data/fingerprint.py): equal for the same data, different for rows
permuted, relabelled or cut; cheap on large data (a bounded number of rows hashed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fedrift
from fedrift.data.fingerprint import ROWS, client_fingerprints, dataset_fingerprint, difference, rows_fingerprint


@pytest.fixture(scope="module")
def digits():
    prep = fedrift.api.prepare({"data": {"name": "digits"}, "partition": {"name": "dirichlet", "alpha": 0.5, "num_clients": 6}})
    return prep.dataset, prep.partition


def test_the_same_data_has_the_same_fingerprints(digits):
    dataset, partition = digits
    again = fedrift.api.prepare({"data": {"name": "digits"}, "partition": {"name": "dirichlet", "alpha": 0.5, "num_clients": 6}})
    assert client_fingerprints(dataset, partition) == client_fingerprints(again.dataset, again.partition)
    assert dataset_fingerprint(dataset) == dataset_fingerprint(again.dataset)
    sizes = [int(f.split(":")[0]) for f in client_fingerprints(dataset, partition).values()]
    assert sizes == [len(partition.train[k]) for k in range(6)]


def test_what_differs_is_named(digits):
    dataset, partition = digits
    x, y, rows = dataset.x_train, dataset.y_train, partition.train[0]
    mine = rows_fingerprint(x, y, rows)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    # the node's partition is drawn from its own labels: a permuted copy gives other rows
    assert difference(rows_fingerprint(x[order], y[order], rows), mine)
    inputs = x.clone()
    inputs[rows[3]] += 1  # one input of the client's changed, labels kept
    assert "their inputs differ" in difference(rows_fingerprint(inputs, y, rows), mine)
    labels = y.clone()
    labels[rows[0]] = (labels[rows[0]] + 1) % 10
    assert "labels differ" in difference(rows_fingerprint(x, labels, rows), mine)
    assert difference(rows_fingerprint(x, y, rows[:-1]), mine) == f"{len(rows) - 1} samples where {len(rows)} were expected"
    assert difference(mine, mine) == ""


def test_a_large_client_hashes_a_bounded_sample_of_its_rows():
    x = torch.zeros(10 * ROWS, 3)
    y = torch.zeros(10 * ROWS, dtype=torch.int64)
    base = rows_fingerprint(x, y)
    spread = np.linspace(0, len(y) - 1, ROWS).astype(np.int64)
    x[spread[5]] = 1.0  # a hashed row
    assert difference(rows_fingerprint(x, y), base)
    x[spread[5]] = 0.0
    x[spread[5] + 1] = 1.0  # a row between two hashed ones: the labels and the count are all that see it
    assert rows_fingerprint(x, y) == base


def test_a_resume_on_data_changed_under_the_run_is_refused_unless_accepted(tmp_path, monkeypatch, caplog):
    """The files under data.root replaced (rows permuted) after a run stopped: its resume is
    refused in one line naming data.root; with data.accept_changed=true it continues, said."""
    from conftest import ctrl_c_in_round, tiny_config

    from fedrift.engine.checkpoint import CheckpointError
    from fedrift.deploy.loopback import gaussian_blobs

    arrays = gaussian_blobs(120, 40, dim=6, classes=3, spread=2.0)
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "data.npz", **arrays)
    cfg = tiny_config(tmp_path, data={"name": "npz", "root": str(tmp_path / "data")}, model={"name": "mlp", "hidden": [8]},
                      train={"rounds": 3}, engine={"checkpoint_every": 1, "executor": "sequential"})
    undo = ctrl_c_in_round(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        fedrift.run(cfg)
    undo()
    order = np.random.default_rng(0).permutation(len(arrays["y_train"]))
    np.savez(tmp_path / "data" / "data.npz", **{**arrays, "x_train": arrays["x_train"][order], "y_train": arrays["y_train"][order]})
    run_dir = tmp_path / "run"
    with pytest.raises(CheckpointError, match=rf"^data.root: the data read from {tmp_path / 'data'} differs from the data "
                                              r"the run started with \(train: .*\); a run resumes only on its own data; "
                                              r"allowed: .*data.accept_changed=true"):
        fedrift.resume(run_dir)
    got = fedrift.resume(run_dir, ["data.accept_changed=true"])
    assert got.summary["status"] == "completed" and got.summary["resumed_from_round"] == 1
    assert any("differs from the data the run started with" in r.getMessage() and "(data.accept_changed)" in r.getMessage()
               for r in caplog.records)
