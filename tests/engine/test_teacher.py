"""Teacher caching: outputs computed once per round equal outputs computed on every batch."""

import pytest
import torch
from algorithm_cases import NAMES, case

import fedrift
from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Setup
from fedrift.config import validate_options

# a model with a projection head and server-held data, so that every algorithm can be built
SETUP = Setup(num_classes=10, num_clients=6, feature_dim=16, lr=0.05, momentum=0.9, weight_decay=0.0,
              clip_grad_norm=None, seed=0, projection_dim=16,
              holdout_x=torch.zeros(4, 64), holdout_y=torch.zeros(4, dtype=torch.int64))


def _has_teacher(name: str) -> bool:
    entry = ALGORITHMS.get(name)
    options = {k: v for k, v in case(name)["algorithm"].items() if k != "name"}
    return entry.factory(validate_options("algorithm", entry.params, options), SETUP).teacher is not None


TEACHERS = [n for n in NAMES if _has_teacher(n)]


def test_the_distillation_methods_have_a_cacheable_teacher():
    assert {"fedgkd", "fedgkd_vote", "fedgkd_plus", "fedcsd", "fedadc_plus", "fedntd", "moon"} <= set(TEACHERS)


@pytest.mark.parametrize("executor", ["sequential", "batched"])
@pytest.mark.parametrize("name", TEACHERS)
def test_cached_equals_per_batch(tiny, tmp_path, name, executor):
    runs = {}
    for cache in (True, False):
        cfg = tiny(engine={"executor": executor, "teacher_cache": cache}, train={"rounds": 3},
                   output={"dir": str(tmp_path / str(cache))}, **case(name))
        runs[cache] = fedrift.run(cfg)
    for k, v in runs[True].global_state.items():
        torch.testing.assert_close(v, runs[False].global_state[k], rtol=1e-5, atol=1e-6)
    for a, b in zip(runs[True].history, runs[False].history):
        assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=0.01)
        assert a["bytes_down"] == b["bytes_down"]  # the cache is local work, never communication
