import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrift.data.partition import split_shards
from fedrift.engine.sampling import SAMPLERS, class_coverage, cohort_size, uniform


def test_uniform_is_seeded_sorted_and_without_replacement():
    a = uniform(50, 10, seed=3, round_=7, label_counts=None)
    assert a == uniform(50, 10, seed=3, round_=7, label_counts=None) and a == sorted(set(a)) and len(a) == 10
    assert a != uniform(50, 10, seed=3, round_=8, label_counts=None)


def test_cohort_size():
    assert cohort_size(20, 4, None) == 4
    assert cohort_size(20, None, 0.2) == 4
    assert cohort_size(20, None, 0.01) == 1
    assert cohort_size(20, None, None) == 4


def _shard_counts(num_clients, classes_per_client, seed):
    labels = np.repeat(np.arange(10), 100)
    from fedrift.data.partition import ShardsParams

    parts = split_shards(labels, ShardsParams(num_clients=num_clients, classes_per_client=classes_per_client), seed)
    return np.stack([np.bincount(labels[ix], minlength=10) for ix in parts])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), round_=st.integers(1, 500), m=st.integers(10, 20))
def test_coverage_always_covers_when_m_is_at_least_the_number_of_classes(seed, round_, m):
    counts = _shard_counts(50, 1, seed)  # one class per client: only an exact cover works
    pick = class_coverage(50, m, seed, round_, counts)
    assert len(pick) == m == len(set(pick))
    assert (counts[pick].sum(0) > 0).all()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), round_=st.integers(1, 500))
def test_coverage_finds_fedadc_five_of_fifty_two_class_cohorts(seed, round_):
    counts = _shard_counts(50, 2, seed)  # FedADC's shards, 5 per round: a perfect cover is needed
    pick = class_coverage(50, 5, seed, round_, counts)
    assert (counts[pick].sum(0) > 0).all()


def test_coverage_returns_the_best_it_can_when_impossible():
    counts = np.zeros((6, 4), dtype=int)
    counts[np.arange(6), [0, 0, 1, 1, 2, 3]] = 5
    pick = class_coverage(6, 2, seed=0, round_=1, label_counts=counts)  # 4 classes, 2 one-class clients
    assert (counts[pick].sum(0) > 0).sum() == 2 and len(set(pick)) == 2
    assert "class_coverage" in SAMPLERS
