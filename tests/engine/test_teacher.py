"""Teacher caching: outputs computed once per round equal outputs computed on every batch."""

import pytest
import torch
from algorithm_cases import NAMES, build, case

import fedrift

TEACHERS = [n for n in NAMES if build(n).teacher is not None]


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
