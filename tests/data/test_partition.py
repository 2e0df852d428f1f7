"""Partitioners: coverage, sizes, determinism, skew, termination, refusals, plots."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fedrift.data import partition as partition_module
from fedrift.data.base import Dataset
from fedrift.data.partition import (
    PARTITIONS,
    DirichletParams,
    IidParams,
    NaturalParams,
    QuantityParams,
    ShardsParams,
    local_test_splits,
    partition_dataset,
    split_dirichlet,
    split_iid,
    split_quantity,
    split_shards,
)
from fedrift.data.partition_base import Partition
from fedrift.errors import ConfigError
from fedrift.report.partition_plot import bubble_plot, count_table, heterogeneity

SPLITS = {
    "iid": (split_iid, IidParams),
    "dirichlet": (split_dirichlet, DirichletParams),
    "shards": (split_shards, ShardsParams),
    "quantity": (split_quantity, QuantityParams),
}
FAST = settings(max_examples=25, deadline=None)


def make_labels(n: int, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, n)


def make_dataset(
    n_train: int = 600, n_test: int = 200, classes: int = 10, groups: int | None = None, seed: int = 0
) -> Dataset:
    rng = np.random.default_rng(seed)
    g_train = g_test = None
    if groups is not None:
        g_train = np.sort(rng.integers(0, groups, n_train))
        g_train[:groups] = np.arange(groups)  # every group has a training sample
        g_test = rng.integers(0, groups, n_test)
    return Dataset(
        name="tiny",
        x_train=torch.zeros(n_train, 3),
        y_train=torch.as_tensor(rng.integers(0, classes, n_train)),
        x_test=torch.zeros(n_test, 3),
        y_test=torch.as_tensor(rng.integers(0, classes, n_test)),
        num_classes=classes,
        train_groups=g_train,
        test_groups=g_test,
    )


def counts_of(parts: list[np.ndarray], labels: np.ndarray, classes: int) -> np.ndarray:
    return np.stack([np.bincount(labels[ix], minlength=classes) for ix in parts])


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    allix = np.concatenate(parts)
    assert allix.size == n
    assert np.array_equal(np.sort(allix), np.arange(n))
    for ix in parts:
        assert ix.dtype == np.int64
        assert np.all(np.diff(ix) > 0)  # sorted ascending, no repeats


# --------------------------------------------------------------------------------------
# Coverage and sizes


@FAST
@given(
    name=st.sampled_from(sorted(SPLITS)),
    n=st.integers(40, 400),
    clients=st.integers(1, 12),
    classes=st.integers(2, 6),
    seed=st.integers(0, 2**31),
)
def test_disjoint_and_complete(name: str, n: int, clients: int, classes: int, seed: int) -> None:
    split, cls = SPLITS[name]
    labels = make_labels(n, classes, seed)
    opts: dict = {"num_clients": clients}
    if name in ("dirichlet", "quantity"):
        opts |= {"min_size": min(10, n // clients), "alpha": 0.3}
    if name == "shards":
        opts["classes_per_client"] = min(2, len(np.unique(labels)))
        assume(clients * opts["classes_per_client"] >= len(np.unique(labels)))
    parts = split(labels, cls(**opts), seed)
    assert len(parts) == clients
    assert_exact_cover(parts, n)
    sizes = np.array([p.size for p in parts])
    assert sizes.min() >= opts.get("min_size", 1)


@FAST
@given(n=st.integers(1, 500), clients=st.integers(1, 50), seed=st.integers(0, 1000))
def test_iid_sizes_differ_by_at_most_one(n: int, clients: int, seed: int) -> None:
    clients = min(clients, n)
    parts = split_iid(np.zeros(n, dtype=np.int64), IidParams(num_clients=clients), seed)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert_exact_cover(parts, n)


@FAST
@given(
    name=st.sampled_from(["dirichlet", "quantity"]),
    alpha=st.sampled_from([0.01, 0.1, 1.0, 100.0]),
    min_size=st.integers(1, 30),
    clients=st.integers(1, 30),
    seed=st.integers(0, 1000),
)
def test_min_size_always_met(name: str, alpha: float, min_size: int, clients: int, seed: int) -> None:
    n = 600
    min_size = min(min_size, n // clients)
    split, cls = SPLITS[name]
    opts = cls(num_clients=clients, alpha=alpha, min_size=min_size, max_redraws=3)
    parts = split(make_labels(n, 10, seed), opts, seed)
    assert min(p.size for p in parts) >= min_size
    assert_exact_cover(parts, n)


@FAST
@given(
    n=st.integers(40, 400),
    clients=st.integers(1, 12),
    per_client=st.integers(1, 4),
    alpha=st.sampled_from([0.01, 0.3, 10.0]),
    seed=st.integers(0, 2**31),
)
@example(n=40, clients=11, per_client=4, alpha=0.01, seed=0)  # 44 shards of 40 samples: refused
def test_balance_and_sorted_cover_every_sample(n: int, clients: int, per_client: int, alpha: float, seed: int) -> None:
    labels = make_labels(n, 5, seed)
    min_size = min(10, n // clients)
    parts = split_dirichlet(labels, DirichletParams(num_clients=clients, alpha=alpha, min_size=min_size, max_redraws=3,
                                                    balance=True), seed)
    assert_exact_cover(parts, n)
    assert min(p.size for p in parts) >= min_size
    sorted_shards = ShardsParams(num_clients=clients, classes_per_client=per_client, mode="sorted")
    if clients * per_client > n:  # more shards than samples: refused in one line, naming what is allowed
        with pytest.raises(ConfigError, match="exceed the .* training samples"):
            split_shards(labels, sorted_shards, seed)
        return
    parts = split_shards(labels, sorted_shards, seed)
    assert_exact_cover(parts, n)
    run = n // (clients * per_client)  # runs of run or run + 1 samples, per_client of them each
    assert all(per_client * run <= p.size <= per_client * (run + 1) for p in parts)


def test_repair_with_no_redraws_still_meets_min_size() -> None:
    labels = make_labels(2000, 10)
    opts = DirichletParams(num_clients=100, alpha=0.01, min_size=20, max_redraws=0)
    parts = split_dirichlet(labels, opts, 3)
    assert min(p.size for p in parts) == 20  # repaired clients get exactly min_size
    assert_exact_cover(parts, 2000)


def test_exactly_n_over_min_size_clients() -> None:
    labels = make_labels(500, 5)
    parts = split_quantity(labels, QuantityParams(num_clients=50, min_size=10, max_redraws=2), 0)
    assert all(p.size == 10 for p in parts)
    assert_exact_cover(parts, 500)


# --------------------------------------------------------------------------------------
# Determinism


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_same_seed_same_split_other_seed_different(name: str) -> None:
    split, cls = SPLITS[name]
    labels = make_labels(1000)
    a = split(labels, cls(num_clients=10), 7)
    b = split(labels, cls(num_clients=10), 7)
    c = split(labels, cls(num_clients=10), 8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_factory_is_deterministic_including_test_splits(name: str) -> None:
    ds = make_dataset()
    a = partition_dataset(ds, name, None, 1)
    b = partition_dataset(ds, name, None, 1)
    c = partition_dataset(ds, name, None, 2)
    for x, y in zip(a.train + a.test, b.train + b.test):
        assert np.array_equal(x, y)
    assert any(not np.array_equal(x, y) for x, y in zip(a.train + a.test, c.train + c.test))


def test_global_rng_untouched() -> None:
    np.random.seed(123)
    before = np.random.random()
    np.random.seed(123)
    partition_dataset(make_dataset(), "dirichlet", None, 0)
    assert np.random.random() == before


# --------------------------------------------------------------------------------------
# Shapes of the skew


@FAST
@given(
    clients=st.integers(1, 40),
    per_client=st.integers(1, 10),
    classes=st.integers(1, 10),
    seed=st.integers(0, 10_000),
)
def test_shards_give_distinct_classes(clients: int, per_client: int, classes: int, seed: int) -> None:
    per_client = min(per_client, classes)
    labels = make_labels(2000, classes, seed)
    assume(clients * per_client >= classes)
    parts = split_shards(labels, ShardsParams(num_clients=clients, classes_per_client=per_client), seed)
    assert_exact_cover(parts, labels.size)
    for ix in parts:
        assert len(np.unique(labels[ix])) == per_client


def test_shards_near_equal_on_balanced_classes() -> None:
    labels = np.repeat(np.arange(10), 600)
    parts = split_shards(labels, ShardsParams(num_clients=100, classes_per_client=2), 0)
    assert {p.size for p in parts} == {60}  # 200 shards of 30
    pairs = {tuple(np.unique(labels[ix])) for ix in parts}
    assert len(pairs) > 15  # random pairings, not a fixed pattern


def test_shards_skewed_class_sizes() -> None:
    labels = np.concatenate([np.zeros(1000, np.int64), np.ones(12, np.int64), np.full(12, 2)])
    parts = split_shards(labels, ShardsParams(num_clients=10, classes_per_client=2), 0)
    assert_exact_cover(parts, labels.size)
    assert all(len(np.unique(labels[ix])) == 2 for ix in parts)


# The partitions of these settings as fedrift drew them before ``balance`` and ``mode`` existed:
# the defaults (balance false, mode classes) must keep drawing them, bit for bit.
PINNED_LABELS = [3, 0, 0, 0, 0, 3, 3, 2, 0, 0, 1, 1, 2, 1, 1, 0, 2, 2, 0, 0,
                 1, 1, 3, 2, 1, 1, 2, 2, 0, 2, 3, 3, 3, 1, 1, 2, 2, 2, 3, 1]
PINNED_DIRICHLET = [[21, 24, 25, 33, 34, 37, 39], [7, 10, 11, 12, 16, 17, 20, 23, 26, 27, 35, 36],
                    [0, 1, 2, 3, 4, 5, 6, 8, 9, 13, 14, 15, 18, 19, 22, 28, 29, 30, 31, 32, 38]]
PINNED_SHARDS = [[16, 17, 21, 23, 24, 27, 33, 34, 36, 37, 39], [0, 4, 6, 8, 18, 19, 22, 28, 32],
                 [5, 7, 12, 26, 29, 30, 31, 35, 38], [1, 2, 3, 9, 10, 11, 13, 14, 15, 20, 25]]


def test_defaults_draw_the_pinned_partitions() -> None:
    labels = np.array(PINNED_LABELS)
    for opts in (DirichletParams(num_clients=3, alpha=0.5, min_size=2),
                 DirichletParams(num_clients=3, alpha=0.5, min_size=2, balance=False)):
        assert [p.tolist() for p in split_dirichlet(labels, opts, 5)] == PINNED_DIRICHLET
    for opts in (ShardsParams(num_clients=4, classes_per_client=2),
                 ShardsParams(num_clients=4, classes_per_client=2, mode="classes")):
        assert [p.tolist() for p in split_shards(labels, opts, 5)] == PINNED_SHARDS


class _FixedShares:
    """A generator whose Dirichlet draws are given (one row per class); permutations are real."""

    def __init__(self, shares: list[list[float]]) -> None:
        self.shares, self.real = np.array(shares), np.random.default_rng(0)

    def permutation(self, n: int) -> np.ndarray:
        return self.real.permutation(n)

    def dirichlet(self, alpha: np.ndarray, size: int) -> np.ndarray:
        assert self.shares.shape == (size, alpha.size)
        return self.shares


def _dirichlet_with_shares(monkeypatch: pytest.MonkeyPatch, labels: np.ndarray, shares: list[list[float]],
                           balance: bool) -> np.ndarray:
    monkeypatch.setattr(partition_module, "partition_rng", lambda *a: _FixedShares(shares))
    opts = DirichletParams(num_clients=len(shares[0]), alpha=1.0, min_size=1, balance=balance)
    parts = split_dirichlet(labels, opts, 0)
    assert_exact_cover(parts, labels.size)
    return counts_of(parts, labels, len(shares))


def test_balance_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 of class 0, 4 of class 1, 2 clients: full at n / K = 6
    labels = np.array([0] * 8 + [1] * 4)
    shares = [[0.75, 0.25], [0.5, 0.5]]
    # unbalanced: class 0 cut 6 | 2, class 1 cut 2 | 2
    assert _dirichlet_with_shares(monkeypatch, labels, shares, False).tolist() == [[6, 2], [2, 2]]
    # balanced: client 0 holds 6 = n / K after class 0, so its share of class 1 is zeroed
    assert _dirichlet_with_shares(monkeypatch, labels, shares, True).tolist() == [[6, 0], [2, 4]]
    # a zeroed last client gets none, not the float cut's rounding sample: 3 | 7, then 7 >= 6
    labels = np.array([0] * 10 + [1] * 2)
    shares = [[0.3, 0.7], [1 / 3, 2 / 3]]
    assert _dirichlet_with_shares(monkeypatch, labels, shares, True).tolist() == [[3, 2], [7, 0]]
    # three clients, full at 22 / 3: after classes 0 and 1 they hold 4 | 9 | 5, so client 1's
    # share of class 2 is zeroed and clients 0 and 2 split it 0.4 : 0.4, renormalised to halves
    labels = np.array([0] * 9 + [1] * 9 + [2] * 4)
    shares = [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.4, 0.2, 0.4]]
    assert _dirichlet_with_shares(monkeypatch, labels, shares, False).tolist() == [[4, 0, 1], [5, 4, 1], [0, 5, 2]]
    assert _dirichlet_with_shares(monkeypatch, labels, shares, True).tolist() == [[4, 0, 2], [5, 4, 0], [0, 5, 2]]


def test_balance_keeps_sizes_nearer_even() -> None:
    labels = make_labels(3000)
    cv = {}
    for balance in (False, True):
        sizes = [np.std(s) / np.mean(s) for s in (
            [p.size for p in split_dirichlet(labels, DirichletParams(num_clients=20, alpha=0.3, balance=balance), seed)]
            for seed in range(5))]
        cv[balance] = float(np.mean(sizes))
    assert cv[True] < 0.7 * cv[False]


def test_sorted_shards_by_hand() -> None:
    # every label distinct: the label-sorted order is unique, so the runs are known exactly
    labels = np.random.default_rng(0).permutation(23)
    k, m = 4, 2
    parts = split_shards(labels, ShardsParams(num_clients=k, classes_per_client=m, mode="sorted"), 3)
    assert_exact_cover(parts, labels.size)
    runs = [np.sort(r).tolist() for r in np.array_split(np.argsort(labels), k * m)]  # sizes 3 3 3 3 3 3 3 2
    used = []
    for ix in parts:
        mine = [r for r in runs if set(r) <= set(ix.tolist())]
        assert len(mine) == m and sum(len(r) for r in mine) == ix.size  # exactly m whole runs
        used += mine
    assert sorted(used) == sorted(runs)
    assert {len(r) for r in runs} == {2, 3}


def test_sorted_shards_straddle_classes_and_may_repeat_one() -> None:
    labels = np.random.default_rng(1).permutation(np.repeat([0, 1, 2], [5, 5, 4]))
    opts = ShardsParams(num_clients=3, classes_per_client=2, mode="sorted")
    runs = np.array_split(np.sort(labels), 6)  # [000] [001] [11] [11] [22] [22]
    seen = set()
    for seed in range(30):
        parts = split_shards(labels, opts, seed)
        assert_exact_cover(parts, labels.size)
        for ix in parts:
            held = np.bincount(labels[ix], minlength=3)
            pairs = [(a, b) for a in range(6) for b in range(a + 1, 6)
                     if np.array_equal(np.bincount(np.concatenate([runs[a], runs[b]]), minlength=3), held)]
            assert pairs  # the labels of two runs of the sorted labels
            seen.add(int((held > 0).sum()))
    assert seen >= {1, 2, 3}  # one class twice (two runs of 1), two, or three (the straddling run)


def test_sorted_shards_refuse_more_shards_than_samples() -> None:
    with pytest.raises(ConfigError, match=r"^partition\.num_clients \* partition\.classes_per_client = 4 \* 3 = 12 "
                                          r"shards exceed the 10 .*allowed: classes_per_client <= 2 at 4 clients"):
        split_shards(make_labels(10, 2), ShardsParams(num_clients=4, classes_per_client=3, mode="sorted"), 0)
    parts = split_shards(make_labels(10, 2), ShardsParams(num_clients=5, classes_per_client=2, mode="sorted"), 0)
    assert [p.size for p in parts] == [2] * 5  # one sample a run
    with pytest.raises(ValidationError):
        ShardsParams(mode="equal")  # type: ignore[arg-type]


def mean_tv(alpha: float, seeds: range) -> float:
    labels = make_labels(3000)
    out = []
    for seed in seeds:
        parts = split_dirichlet(labels, DirichletParams(num_clients=20, alpha=alpha), seed)
        out.append(heterogeneity(counts_of(parts, labels, 10))["mean_tv"])
    return float(np.mean(out))


def test_label_skew_grows_as_alpha_falls() -> None:
    seeds = range(5)
    low, mid, high = mean_tv(0.05, seeds), mean_tv(0.5, seeds), mean_tv(5.0, seeds)
    assert low > mid + 0.1
    assert mid > high + 0.1


def test_quantity_skew_keeps_labels_iid_but_not_sizes() -> None:
    labels = make_labels(6000)
    parts = split_quantity(labels, QuantityParams(num_clients=10, alpha=0.5), 0)
    sizes = np.array([p.size for p in parts])
    assert sizes.max() > 2 * sizes.min()
    big = [p for p in parts if p.size >= 500]
    assert big and heterogeneity(counts_of(big, labels, 10))["mean_tv"] < 0.1


def test_iid_is_balanced() -> None:
    labels = make_labels(6000)
    parts = split_iid(labels, IidParams(num_clients=10), 0)
    assert heterogeneity(counts_of(parts, labels, 10))["mean_tv"] < 0.05


# --------------------------------------------------------------------------------------
# Termination and speed


def test_dirichlet_thousand_clients_tiny_alpha_terminates_fast() -> None:
    labels = make_labels(60_000)
    start = time.perf_counter()
    parts = split_dirichlet(labels, DirichletParams(num_clients=1000, alpha=0.01, min_size=10), 0)
    elapsed = time.perf_counter() - start
    assert elapsed < 10.0
    assert min(p.size for p in parts) >= 10
    assert_exact_cover(parts, 60_000)


def test_quantity_thousand_clients_tiny_alpha_terminates_fast() -> None:
    labels = make_labels(60_000)
    start = time.perf_counter()
    parts = split_quantity(labels, QuantityParams(num_clients=1000, alpha=0.01, min_size=10), 0)
    assert time.perf_counter() - start < 10.0
    assert min(p.size for p in parts) >= 10


# --------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_more_clients_than_samples(name: str) -> None:
    split, cls = SPLITS[name]
    message = r"partition\.num_clients: 11 clients .* only 10 samples; allowed: at most 10"
    with pytest.raises(ConfigError, match=message):
        split(make_labels(10, 2), cls(num_clients=11), 0)


@pytest.mark.parametrize("name", ["dirichlet", "quantity"])
def test_min_size_too_large(name: str) -> None:
    split, cls = SPLITS[name]
    with pytest.raises(ConfigError, match=r"partition\.num_clients \* partition\.min_size.*num_clients <= 9"):
        split(make_labels(99), cls(num_clients=10, min_size=10), 0)


def test_classes_per_client_above_classes() -> None:
    with pytest.raises(ConfigError, match=r"partition\.classes_per_client: 4 .* only 3 classes; allowed: at most 3"):
        split_shards(make_labels(300, 3), ShardsParams(num_clients=5, classes_per_client=4), 0)


def test_shards_too_few_clients_to_hold_every_class() -> None:
    with pytest.raises(ConfigError, match=r"partition\.num_clients: 2 clients .* allowed: at least 5 clients"):
        split_shards(make_labels(300, 10), ShardsParams(num_clients=2, classes_per_client=2), 0)


def test_shards_every_class_gets_a_shard() -> None:
    labels = np.array([0] * 1000 + [1] * 1000 + [2])
    parts = split_shards(labels, ShardsParams(num_clients=3, classes_per_client=1), 0)
    assert_exact_cover(parts, labels.size)
    assert sorted(p.size for p in parts) == [1, 1000, 1000]


def test_shards_not_enough_samples_per_class() -> None:
    labels = np.array([0] * 50 + [1] * 3)
    with pytest.raises(ConfigError, match=r"partition\.num_clients: 10 clients .* allowed: at most 3 clients"):
        split_shards(labels, ShardsParams(num_clients=10, classes_per_client=2), 0)


@pytest.mark.parametrize("cls", [DirichletParams, QuantityParams])
@pytest.mark.parametrize("alpha", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_alpha_refused_by_options(cls: type, alpha: float) -> None:
    with pytest.raises(ValidationError):
        cls(alpha=alpha)


def test_unknown_option_refused() -> None:
    with pytest.raises(ValidationError):
        IidParams(num_clients=5, alpha=0.1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        ShardsParams(classes_per_client=0)


def test_partition_dataset_validates_mapping_and_name() -> None:
    ds = make_dataset()
    p = partition_dataset(ds, "dirichlet", {"num_clients": 5, "alpha": 1.0}, 0)
    assert p.num_clients == 5 and p.options["alpha"] == 1.0
    with pytest.raises(ConfigError, match=r"partition\.alpha"):
        partition_dataset(ds, "dirichlet", {"alpha": 0}, 0)
    with pytest.raises(ConfigError, match=r"partition\.name: unknown partition 'nope'; allowed: devices, dirichlet"):
        partition_dataset(ds, "nope", None, 0)
    with pytest.raises(ConfigError, match=r"seed"):
        partition_dataset(ds, "iid", None, -1)


def test_registry_names() -> None:
    assert [e.name for e in PARTITIONS if e.source == "built in"] == ["devices", "dirichlet", "domain", "flwr", "iid", "natural", "quantity", "shards"]


# --------------------------------------------------------------------------------------
# Natural groups


def test_natural_uses_groups_exactly() -> None:
    ds = make_dataset(groups=7)
    p = partition_dataset(ds, "natural", NaturalParams(), 0)
    assert p.num_clients == 7
    assert_exact_cover(p.train, ds.num_train)
    for k in range(7):
        assert np.array_equal(p.train[k], np.flatnonzero(ds.train_groups == k))
        assert np.array_equal(p.test[k], np.flatnonzero(ds.test_groups == k))
    assert partition_dataset(ds, "natural", NaturalParams(num_clients=7), 0).num_clients == 7


def test_natural_group_ids_need_not_be_contiguous() -> None:
    ds = make_dataset(groups=4)
    assert ds.train_groups is not None and ds.test_groups is not None
    ds = dataclasses.replace(ds, train_groups=ds.train_groups * 10 + 5, test_groups=ds.test_groups * 10 + 5)
    p = partition_dataset(ds, "natural", None, 0)
    assert np.array_equal(p.train[2], np.flatnonzero(ds.train_groups == 25))
    assert np.array_equal(p.test[2], np.flatnonzero(ds.test_groups == 25))


def test_natural_wrong_count_and_no_groups() -> None:
    with pytest.raises(ConfigError, match=r"partition\.num_clients: 3 but the dataset has 7 natural groups"):
        partition_dataset(make_dataset(groups=7), "natural", NaturalParams(num_clients=3), 0)
    with pytest.raises(ConfigError, match=r"natural.*'tiny' has none.*synthetic"):
        partition_dataset(make_dataset(), "natural", None, 0)


# --------------------------------------------------------------------------------------
# Local test splits


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_local_test_follows_client_label_proportions(name: str) -> None:
    ds = make_dataset(n_train=2000, n_test=1000)
    p = partition_dataset(ds, name, {"num_clients": 10}, 0)
    y_train, y_test = ds.y_train.numpy(), ds.y_test.numpy()
    train_counts = p.counts(y_train, 10)
    test_counts = np.stack([np.bincount(y_test[ix], minlength=10) for ix in p.test])
    for k in range(10):
        n_k = train_counts[k].sum()
        size = max(10, int(np.floor(1000 * n_k / 2000 + 0.5)))
        assert test_counts[k].sum() == size
        expected = train_counts[k] * size / n_k
        assert np.all(np.abs(test_counts[k] - expected) < 1.0)  # largest remainder: within 1
        assert np.all(test_counts[k][train_counts[k] == 0] == 0)
        assert len(np.unique(p.test[k])) == p.test[k].size  # enough test samples: no repeats
        assert np.all(np.diff(p.test[k]) >= 0)


def test_local_test_min_size_and_replacement_when_short() -> None:
    train_labels = np.array([0] * 90 + [1] * 10)
    test_labels = np.array([0] * 50 + [1] * 2)
    parts = [np.arange(90, 100), np.arange(0, 90)]
    out = local_test_splits(train_labels, parts, test_labels, 5, np.random.default_rng(0))
    assert out[0].size == 5 and np.all(test_labels[out[0]] == 1)  # only 2 of class 1: repeats
    assert set(out[0].tolist()) == {50, 51}
    assert out[1].size == round(52 * 90 / 100)
    assert np.all(test_labels[out[1]] == 0) and len(set(out[1].tolist())) == out[1].size


def test_local_test_skips_classes_without_test_samples() -> None:
    train_labels = np.array([2] * 10 + [0] * 10)
    test_labels = np.array([0] * 20 + [1] * 20)
    parts = [np.arange(10), np.arange(10, 20)]
    out = local_test_splits(train_labels, parts, test_labels, 4, np.random.default_rng(0))
    assert out[0].size == 20 and set(test_labels[out[0]]) == {0, 1}  # global test distribution
    assert np.all(test_labels[out[1]] == 0)


# --------------------------------------------------------------------------------------
# Saving and showing


def test_save_load_round_trip(tmp_path: Path) -> None:
    p = partition_dataset(make_dataset(), "shards", ShardsParams(num_clients=6), 4)
    p.save(tmp_path / "partition.json")
    q = Partition.load(tmp_path / "partition.json")
    assert q.name == "shards"
    assert q.options == {"num_clients": 6, "min_local_test": 10, "classes_per_client": 2, "mode": "classes"}
    for x, y in zip(p.train + p.test, q.train + q.test):
        assert np.array_equal(x, y) and y.dtype == np.int64


def test_count_table_and_heterogeneity() -> None:
    counts = np.array([[3, 0], [1, 4]])
    table = count_table(counts)
    lines = table.splitlines()
    assert lines[0].split() == ["client", "0", "1", "total"]
    assert lines[-1].split() == ["total", "4", "4", "8"]
    assert lines[2].split() == ["0", "3", "0", "3"]
    big = count_table(np.ones((100, 3), dtype=np.int64), max_rows=10)
    assert "..." in big.splitlines() and len(big.splitlines()) == 10 + 1 + 4
    h = heterogeneity(counts)
    assert h["min_size"] == 3 and h["max_size"] == 5 and h["mean_size"] == 4.0
    assert h["mean_classes_per_client"] == 1.5
    assert h["mean_tv"] == pytest.approx(0.5 * (0.5 + 0.3))  # global (.5,.5); clients (1,0),(.2,.8)


def test_bubble_plot_writes_png_and_svg(tmp_path: Path) -> None:
    labels = make_labels(1000)
    counts = counts_of(split_dirichlet(labels, DirichletParams(num_clients=20), 0), labels, 10)
    bubble_plot(counts, tmp_path / "p.png", "dirichlet alpha=0.5")
    data = (tmp_path / "p.png").read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 1000
    bubble_plot(counts, tmp_path / "q.svg", "svg too")
    assert (tmp_path / "q.png").stat().st_size > 1000
    assert b"<svg" in (tmp_path / "q.svg").read_bytes()[:2000]


@pytest.mark.parametrize("name", ["iid", "dirichlet", "shards", "natural"])
def test_holdout_is_stratified_and_in_no_clients_data(name: str, tmp_path: Path) -> None:
    data = make_dataset(groups=6 if name == "natural" else None)
    options = {"num_clients": 6} if name != "natural" else {}
    p = partition_dataset(data, name, options, seed=3, holdout=0.2)
    held = set(p.holdout.tolist())
    owned = np.concatenate(p.train)
    assert not held & set(owned.tolist())  # never a client's
    assert sorted(held | set(owned.tolist())) == list(range(data.num_train))  # the rest is all given out
    y = data.y_train.numpy()
    for c in range(10):  # round(0.2 n_c) of every class
        assert int((y[p.holdout] == c).sum()) == round(0.2 * int((y == c).sum()))
    p.save(tmp_path / "p.json")
    assert np.array_equal(Partition.load(tmp_path / "p.json").holdout, p.holdout)
    again = partition_dataset(data, name, options, seed=3, holdout=0.2)
    assert np.array_equal(again.holdout, p.holdout)
    assert len(partition_dataset(data, name, options, seed=3).holdout) == 0
