"""Cross-device scale: a round costs what its participants cost, not what N costs."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch

import fedrift
from agreement import BITS, agree, untimed
from fedrift.engine.build import prepare
from fedrift.data.partition_base import Partition, Ragged
from fedrift.engine import server
from fedrift.engine.federation import Federation
from fedrift.engine.sampling import eval_clients


def _devices(tiny, n: int, **sections):
    return tiny(partition={"name": "devices", "num_clients": n, "samples": 8, "classes_per_client": 2},
                **sections)


def test_the_federation_holds_arrays_not_an_object_per_client(tiny):
    prep = prepare(_devices(tiny, 50_000))
    fed = Federation(prep.dataset, prep.partition, prep.device)
    assert isinstance(fed.train, Ragged) and isinstance(fed.test, Ragged)
    for name, value in vars(fed).items():
        assert not (isinstance(value, (list, tuple, dict)) and len(value) >= 1000), name
    k = 31_337
    assert torch.equal(fed.indices(k), torch.from_numpy(prep.partition.train[k]))
    assert torch.equal(fed.test_indices(k), torch.from_numpy(prep.partition.test[k]))
    assert fed.indices(k).untyped_storage().data_ptr() == fed.indices(0).untyped_storage().data_ptr()  # views
    y = prep.dataset.y_train.numpy()
    assert np.array_equal(fed.label_counts_np[k], np.bincount(y[prep.partition.train[k]], minlength=10))


def test_round_time_does_not_grow_with_the_number_of_clients(tiny, tmp_path):
    """Same round work (20 clients of 2 steps) at N = 100 and N = 100,000, SCAFFOLD with its
    states on disk: the median round time may differ by noise, not by N."""
    def median_round(n: int) -> float:
        cfg = _devices(tiny, n, algorithm={"name": "scaffold"}, output={"dir": str(tmp_path / f"n{n}")},
                       train={"rounds": 9, "clients_per_round": 20, "local_steps": 2, "batch_size": 8},
                       engine={"executor": "sequential", "client_state": "disk"})
        r = fedrift.run(cfg)
        assert r.summary["num_clients"] == n
        return statistics.median(row["seconds"] for row in r.history[1:])

    small, large = median_round(100), median_round(100_000)
    assert large < 3 * small + 0.01, (small, large)


def test_the_evaluation_panel_is_every_client_up_to_the_sample_size_else_a_seeded_sample():
    assert eval_clients(7, 1000, seed=3) == list(range(7))
    assert eval_clients(1000, 1000, seed=3) == list(range(1000))
    panel = eval_clients(1_000_000, 500, seed=3)
    assert len(panel) == len(set(panel)) == 500 and panel == sorted(panel) and 0 <= panel[0] and panel[-1] < 10**6
    assert panel == eval_clients(1_000_000, 500, seed=3) and panel != eval_clients(1_000_000, 500, seed=4)


@pytest.mark.agreement
def test_personal_models_are_evaluated_on_the_panel(tiny, monkeypatch):
    base = tiny(algorithm={"name": "fedproto"}, train={"rounds": 2, "clients_per_round": 6})
    full = fedrift.run(base)
    same = fedrift.run({**base, "eval": {"clients_sample": 6}, "output": {**base["output"], "overwrite": True}})
    agree(untimed(full.history), untimed(same.history), BITS)

    seen: list[tuple[int, list[torch.Tensor] | None]] = []
    evaluate_personal = server.evaluate_personal

    def record(apply, models, local, *args, **kwargs):
        models = list(models)
        seen.append((len(models), local))
        return evaluate_personal(apply, models, local, *args, **kwargs)

    monkeypatch.setattr(server, "evaluate_personal", record)
    r = fedrift.run({**base, "eval": {"clients_sample": 4}, "output": {**base["output"], "overwrite": True}})
    part = Partition.load(r.output_dir / "partition.json")
    panel = eval_clients(6, 4, seed=0)
    assert len(panel) == 4 and seen and all(n == 4 for n, _ in seen)
    local = seen[0][1]
    assert local is not None and [t.tolist() for t in local] == [part.test[k].tolist() for k in panel]
