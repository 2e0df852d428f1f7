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


def _linear(params, x, mode="logits"):
    return x @ params["w"]


def test_the_memo_runs_a_model_once_per_sample_and_forgets_models_that_left():
    from fedrift.engine.teacher import TeacherMemo

    calls = []

    def apply(params, x, mode="logits"):
        calls.append(len(x))
        return _linear(params, x, mode)

    g = torch.Generator().manual_seed(0)
    data = torch.randn(10, 3, generator=g)
    a, b = {"w": torch.randn(3, 2, generator=g)}, {"w": torch.randn(3, 2, generator=g)}
    memo = TeacherMemo(num_rows=10)

    def table(models, rows):
        rows = torch.tensor(rows)
        x = data[rows]
        got = [memo.bind(apply, rows, x)(m, x) for m in models]
        memo.sweep()
        for m, out in zip(models, got):
            assert torch.equal(out, _linear(m, x))
        return got

    table([a], [0, 1, 2, 3])
    assert calls == [4]
    table([a, b], [2, 3, 4, 5])  # a has seen rows 2, 3: runs on 4, 5 only; b on all four
    assert calls == [4, 2, 4]
    # a model that arrives as new tensors with the same values is recognised
    table([{"w": a["w"].clone()}], [0, 1, 4, 5])
    assert calls == [4, 2, 4]
    assert memo.hits == 2 + 4 and memo.misses == 4 + 2 + 4
    table([a], [6])  # b left the teacher in the last round: forgotten
    assert len(memo.tables) == 1
    # anything but the bound chunk itself is just run
    rows = torch.tensor([0, 1])
    x = data[rows]
    memo.bind(apply, rows, x)(a, x + 1)
    assert calls[-1] == 2


def test_the_memo_keeps_to_its_budget():
    from fedrift.engine.teacher import TeacherMemo

    memo = TeacherMemo(num_rows=100, budget_bytes=100 * 2 * 4)  # room for one (100, 2) float table
    x = torch.randn(100, 3)
    rows = torch.arange(100)
    for seed in range(3):
        m = {"w": torch.randn(3, 2, generator=torch.Generator().manual_seed(seed))}
        assert torch.equal(memo.bind(_linear, rows, x)(m, x), _linear(m, x))
    assert len(memo.tables) == 1
