import numpy as np

from fedrift.engine.batches import num_steps, schedule


def test_each_epoch_sees_every_sample_once_and_keeps_the_last_small_batch():
    s = schedule(n=10, batch_size=4, epochs=3, steps=None, seed=0, round_=1, client=7)
    assert [len(b) for b in s] == [4, 4, 2] * 3
    for e in range(3):
        assert sorted(np.concatenate(s[3 * e : 3 * e + 3]).tolist()) == list(range(10))
    assert not np.array_equal(np.concatenate(s[0:3]), np.concatenate(s[3:6]))  # reshuffled per epoch


def test_schedule_is_a_pure_function_of_seed_round_client():
    a = schedule(50, 8, 2, None, seed=1, round_=3, client=4)
    b = schedule(50, 8, 2, None, seed=1, round_=3, client=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    for other in (dict(seed=2, round_=3, client=4), dict(seed=1, round_=4, client=4), dict(seed=1, round_=3, client=5)):
        c = schedule(50, 8, 2, None, **other)
        assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_step_budget_overrides_epochs():
    s = schedule(n=5, batch_size=2, epochs=1, steps=7, seed=0, round_=1, client=0)
    assert len(s) == 7 == num_steps(5, 2, 1, 7)
    assert num_steps(5, 2, 3, None) == 9
    assert [len(b) for b in s] == [2, 2, 1, 2, 2, 1, 2]
