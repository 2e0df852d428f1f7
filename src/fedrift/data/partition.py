"""Partitions (registry ``PARTITIONS``): which training samples each client holds.

Each partitioner's core is a pure function of plain numpy arrays,
``split_<name>(labels, options, seed) -> list of index arrays``, so it can be tested with
no dataset; the registered factory, ``factory(dataset, options, seed) -> Partition``, wraps
it and adds every client's local test split. All randomness comes from
``np.random.default_rng([seed, tag])`` with a fixed tag per partitioner and purpose (train
split, test split): no global RNG, and the test draws never shift the train split.

Impossible requests are refused with a :class:`ConfigError` naming the key to change.
Label-skew and quantity-skew draws that leave a client short re-draw up to ``max_redraws``
times, then repair the best draw deterministically, so a feasible request always finishes.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Annotated, Any, Callable, Literal, Mapping

import numpy as np
import torch
from pydantic import Field

from fedrift.data.base import Dataset
from fedrift.data.partition_base import Partition
from fedrift.errors import ConfigError
from fedrift.params import params
from fedrift.registry import Registry

PARTITIONS: Registry = Registry("partition")

Split = Callable[[np.ndarray, Any, int], list[np.ndarray]]

# ---------------------------------------------------------------------------------------
# Options


@params
class PartitionParams:
    """Options every label-driven partition has.

    num_clients: how many clients; min_local_test: the smallest local test split (a client's
    split is otherwise the global test set scaled by its share of the training samples).
    """

    num_clients: Annotated[int, Field(ge=1)] = 20
    min_local_test: Annotated[int, Field(ge=1)] = 10


@params
class IidParams(PartitionParams):
    """A seeded random equal split (sizes differ by at most one)."""


@params
class DirichletParams(PartitionParams):
    """Label skew: per class, client shares ~ Dir(alpha); smaller alpha, fewer classes each.

    min_size: samples every client must hold; max_redraws: fresh draws tried before the best
    one is repaired by moving samples from the largest clients.
    balance: false (default), the papers' definition: class c is cut by its drawn shares as
    they are. true, the balancing rule of the released codes (MOON's utils.py, FedDF's
    partition_data.py; flwr-datasets' DirichletPartitioner(self_balancing=True)): inside each
    draw, class after class in class order, a client already holding n / num_clients samples
    or more gets none of the class (its share is zeroed, the others renormalised), so sizes
    come out more even and full clients take no new classes. The same Dir(alpha) draws either
    way; the min_size/max_redraws rules apply to the balanced draw.
    """

    alpha: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 0.5
    min_size: Annotated[int, Field(ge=1)] = 10
    max_redraws: Annotated[int, Field(ge=0)] = 100
    balance: bool = False


@params
class ShardsParams(PartitionParams):
    """Shards: each client gets classes_per_client shards of the label-sorted training set.

    mode: ``classes`` (default), fedrift's own variant: every shard lies inside one class and
    a client's shards are of distinct classes, so each client holds exactly
    classes_per_client classes (shards per class in proportion to its size, near-equal).
    ``sorted``, McMahan et al.'s sort-and-partition (as flwr-datasets' ShardPartitioner): the
    samples sorted by label (ties in a seeded random order), cut into num_clients *
    classes_per_client consecutive runs of near-equal size (none dropped), dealt to the
    clients at random; a run may straddle two classes and a client may get two runs of one
    class.
    classes_per_client: shards per client; in ``classes`` mode they are of distinct classes,
    so it is the number of classes each client holds; in ``sorted`` mode it counts shards
    (runs), not distinct classes.
    """

    classes_per_client: Annotated[int, Field(ge=1)] = 2
    mode: Literal["classes", "sorted"] = "classes"


@params
class QuantityParams(PartitionParams):
    """Quantity skew: client sizes ~ Dir(alpha) * n, labels iid; same min_size/redraw rules."""

    alpha: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 0.5
    min_size: Annotated[int, Field(ge=1)] = 10
    max_redraws: Annotated[int, Field(ge=0)] = 100


@params
class NaturalParams:
    """num_clients: None takes every natural group; a number must equal the group count."""

    num_clients: Annotated[int, Field(ge=1)] | None = None


@params
class DomainParams:
    """Feature skew: each client's data from one domain of a multi-domain dataset.

    clients_per_domain: one count for every domain, or a list with one per domain (0: the
    domain is left out); clients are numbered domain by domain. alpha: None splits a
    domain's samples iid among its clients; a number, label skew inside the domain
    (per class, shares ~ Dir(alpha), with the min_size/max_redraws rules of dirichlet).
    """

    clients_per_domain: Annotated[int, Field(ge=1)] | list[Annotated[int, Field(ge=0)]] = 1
    alpha: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    min_size: Annotated[int, Field(ge=1)] = 10
    max_redraws: Annotated[int, Field(ge=0)] = 100
    min_local_test: Annotated[int, Field(ge=1)] = 10


# ---------------------------------------------------------------------------------------
# Shared helpers


def partition_rng(seed: int, name: str, purpose: str, *keys: int) -> np.random.Generator:
    """A Generator of its own per (seed, partitioner, purpose, keys); the tag is a stable CRC32."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed: {seed!r} is not allowed; allowed: an integer >= 0")
    return np.random.default_rng([int(seed), zlib.crc32(f"{name}/{purpose}".encode()), *keys])


def _as_labels(labels: Any) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    out = np.asarray(labels)
    if out.ndim != 1 or (out.size and (not np.issubdtype(out.dtype, np.integer) or out.min() < 0)):
        raise ValueError("labels must be a 1-D array of non-negative integers")
    return out.astype(np.int64, copy=False)


def labels_of(t: torch.Tensor) -> np.ndarray:
    """A dataset's label tensor as the 1-D int64 array the partitioners draw from (checked)."""
    return _as_labels(t.detach().cpu().numpy())


def _check_clients(num_clients: int, n: int) -> None:
    if num_clients > n:
        raise ConfigError(
            f"partition.num_clients: {num_clients} clients but the training set has only "
            f"{n} samples; allowed: at most {n}"
        )


def _check_min_size(num_clients: int, min_size: int, n: int) -> None:
    if num_clients * min_size > n:
        raise ConfigError(
            f"partition.num_clients * partition.min_size = {num_clients} * {min_size} = "
            f"{num_clients * min_size} exceeds the {n} training samples; allowed: "
            f"num_clients <= {n // min_size} at min_size {min_size}, "
            f"or min_size <= {n // num_clients} at {num_clients} clients"
        )


def _class_pools(labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Each class's indices in a seeded random order (class c is pool c, empty if absent)."""
    perm = rng.permutation(labels.size)
    order = perm[np.argsort(labels[perm], kind="stable")]
    sizes = np.bincount(labels, minlength=1)
    return np.split(order, np.cumsum(sizes)[:-1])


def _cut(shares: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Split ``totals[c]`` items by ``shares[c]`` (rows sum to 1) at the cumulative cut points.

    Returns counts of shape (len(totals), clients), as the reference code's
    ``np.split(idx, (cumsum(p) * len(idx)).astype(int)[:-1])`` would give.
    """
    cum = np.floor(np.cumsum(shares, axis=1) * totals[:, None]).astype(np.int64)
    cum = np.minimum(cum, totals[:, None])
    cum[:, -1] = totals
    return np.diff(cum, axis=1, prepend=0)


def _deficit(counts: np.ndarray, min_size: int) -> int:
    return int(np.maximum(min_size - counts.sum(axis=1), 0).sum())


def _draw_until_full(draw: Callable[[], np.ndarray], min_size: int, max_redraws: int) -> np.ndarray:
    """Draw client x class counts until every client has min_size; else repair the best draw.

    Redrawing while a client is short is the released codes' rule (MOON's and FedDF's code,
    flwr-datasets' DirichletPartitioner), so a draw that succeeds keeps the distribution of
    ``draw`` (the papers' per-class Dir(alpha) shares, or those with the codes' balancing
    rule); the repair bounds the work when it would not (many clients, tiny alpha), so it
    always terminates.
    """
    best, best_deficit = None, None
    for _ in range(max_redraws + 1):
        counts = draw()
        deficit = _deficit(counts, min_size)
        if deficit == 0:
            return counts
        if best_deficit is None or deficit < best_deficit:
            best, best_deficit = counts, deficit
    assert best is not None
    return _repair(best, min_size)


def _repair(counts: np.ndarray, min_size: int) -> np.ndarray:
    """Move samples from the largest clients to those below min_size, deterministically.

    A receiver takes, when it can, a class it already holds (from the largest client with
    samples to spare of such a class), else the largest client's most common class, so
    the label skew of the draw is kept as far as the sizes allow. Donors never fall below
    min_size; needs ``clients * min_size <= n``, which the callers check.
    """
    counts = counts.copy()
    sizes = counts.sum(axis=1)
    for r in np.flatnonzero(sizes < min_size):
        while sizes[r] < min_size:
            held = counts[r] > 0
            holders = (sizes > min_size) & (counts[:, held] > 0).any(axis=1)
            if holders.any():
                d = int(np.argmax(np.where(holders, sizes, -1)))
                c = int(np.argmax(np.where(held, counts[d], -1)))
            else:
                d = int(np.argmax(sizes))
                c = int(np.argmax(counts[d]))
            m = int(min(min_size - sizes[r], sizes[d] - min_size, counts[d, c]))
            counts[d, c] -= m
            counts[r, c] += m
            sizes[d] -= m
            sizes[r] += m
    return counts


def _materialize(pools: list[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
    """Client k gets the next counts[k, c] indices of pool c, for every c; sorted ascending."""
    pieces: list[list[np.ndarray]] = [[] for _ in range(counts.shape[0])]
    for c, pool in enumerate(pools):
        for k, chunk in enumerate(np.split(pool, np.cumsum(counts[:, c])[:-1])):
            if chunk.size:
                pieces[k].append(chunk)
    return [np.sort(np.concatenate(p)) if p else np.empty(0, np.int64) for p in pieces]


# ---------------------------------------------------------------------------------------
# The partitioners' cores


def split_iid(labels: np.ndarray, options: IidParams, seed: int) -> list[np.ndarray]:
    """A seeded random permutation cut into num_clients near-equal parts."""
    n = _as_labels(labels).size
    _check_clients(options.num_clients, n)
    perm = partition_rng(seed, "iid", "train").permutation(n)
    return [np.sort(part) for part in np.array_split(perm, options.num_clients)]


def split_dirichlet(labels: np.ndarray, options: DirichletParams, seed: int) -> list[np.ndarray]:
    """Label skew as the papers define it (Yurochkin et al., Hsu et al., MOON, FedDF): class
    c's shuffled indices are cut by the cumulative shares of p_c ~ Dir(alpha * 1) over
    clients. ``balance`` adds the released codes' balancing rule (MOON's and FedDF's code,
    flwr-datasets' ``self_balancing=True``): class after class, a client holding n / K
    samples or more gets a zero share of the rest; see :class:`DirichletParams`."""
    labels = _as_labels(labels)
    n, k = labels.size, options.num_clients
    _check_clients(k, n)
    _check_min_size(k, options.min_size, n)
    rng = partition_rng(seed, "dirichlet", "train")
    return _dirichlet_parts(labels, k, options.alpha, options.min_size, options.max_redraws, rng, options.balance)


def _dirichlet_parts(
    labels: np.ndarray, k: int, alpha: float, min_size: int, max_redraws: int, rng: np.random.Generator,
    balance: bool = False,
) -> list[np.ndarray]:
    """The Dirichlet label-skew draw of ``labels`` over ``k`` clients (the callers check sizes)."""
    pools = _class_pools(labels, rng)
    totals = np.array([p.size for p in pools], dtype=np.int64)

    def draw() -> np.ndarray:
        shares = rng.dirichlet(np.full(k, alpha), size=totals.size)
        if balance:
            return _balanced_cut(shares, totals, labels.size / k)
        return _cut(shares, totals).T  # clients x classes

    counts = _draw_until_full(draw, min_size, max_redraws)
    return _materialize(pools, counts)


def _balanced_cut(shares: np.ndarray, totals: np.ndarray, full: float) -> np.ndarray:
    """Client x class counts by the released codes' balancing rule, class after class.

    Before class c is cut, a client whose running size is ``full`` (n / K) or more has its
    share zeroed and the rest are renormalised (MOON's ``p * (len(idx_j) < N / n_parties)``;
    flwr-datasets zeroes only above n / K, which differs when a size equals it exactly). A
    zeroed client gets none of the class: the cumulative shares end at exactly 1 at the last
    open client, where the codes' float cut may hand the last client one sample. At least
    one client is always open (the classes before c hold fewer than n samples); if every
    open client's share underflowed to 0, they share the class equally.
    """
    k, classes = shares.shape[1], totals.size
    counts = np.zeros((k, classes), dtype=np.int64)
    sizes = np.zeros(k, dtype=np.int64)
    for c in range(classes):
        if totals[c] == 0:
            continue
        open_ = sizes < full
        p = np.where(open_, shares[c], 0.0)
        if p.sum() <= 0:
            p = open_.astype(np.float64)
        cum = np.cumsum(p / p.sum())
        cum[int(np.flatnonzero(p > 0)[-1]):] = 1.0
        ends = np.minimum(np.floor(cum * totals[c]).astype(np.int64), totals[c])
        counts[:, c] = np.diff(ends, prepend=0)
        sizes += counts[:, c]
    return counts


def split_quantity(labels: np.ndarray, options: QuantityParams, seed: int) -> list[np.ndarray]:
    """Quantity skew: a shuffled index list cut by cumulative shares p ~ Dir(alpha); labels
    are iid given the sizes."""
    n, k = _as_labels(labels).size, options.num_clients
    _check_clients(k, n)
    _check_min_size(k, options.min_size, n)
    rng = partition_rng(seed, "quantity", "train")
    perm = rng.permutation(n)
    total = np.array([n], dtype=np.int64)

    def draw() -> np.ndarray:
        return _cut(rng.dirichlet(np.full(k, options.alpha))[None, :], total).T

    counts = _draw_until_full(draw, options.min_size, options.max_redraws)
    return _materialize([perm], counts)


def split_shards(labels: np.ndarray, options: ShardsParams, seed: int) -> list[np.ndarray]:
    """Shards, num_clients * classes_per_client in all, classes_per_client to each client.

    ``mode: classes`` (fedrift's variant, not McMahan et al.'s): every shard inside one class,
    a client's shards of distinct classes, shards per class in proportion to the class's
    size so they are near-equal. ``mode: sorted`` is McMahan et al.'s sort-and-partition:
    see :func:`_sorted_shards`."""
    labels = _as_labels(labels)
    n, k, m = labels.size, options.num_clients, options.classes_per_client
    _check_clients(k, n)
    if options.mode == "sorted":
        return _sorted_shards(labels, k, m, seed)
    totals = np.bincount(labels, minlength=1)
    present = int((totals > 0).sum())
    if m > present:
        raise ConfigError(
            f"partition.classes_per_client: {m} but the training set has only {present} "
            f"classes; allowed: at most {present}"
        )
    if k * m < present:
        raise ConfigError(
            f"partition.num_clients: {k} clients with {m} classes each hold at most {k * m} "
            f"classes, fewer than the {present} in the training set, so samples would be left "
            f"out; allowed: at least {-(-present // m)} clients at classes_per_client {m}, or "
            f"partition.classes_per_client >= {-(-present // k)}"
        )
    caps = np.minimum(totals, k)  # a class gives each client at most one shard of >= 1 sample
    if caps.sum() < k * m:
        ks = np.arange(1, k + 1)
        ok = np.minimum(ks[:, None], totals[None, :]).sum(axis=1) >= ks * m
        most = int(ks[ok].max()) if ok.any() else 0
        raise ConfigError(
            f"partition.num_clients: {k} clients with {m} distinct classes each need {k * m} "
            f"shards, but the class sizes allow only {int(caps.sum())}; allowed: at most {most} "
            f"clients at classes_per_client {m}, or a smaller partition.classes_per_client"
        )
    rng = partition_rng(seed, "shards", "train")
    pools = _class_pools(labels, rng)
    shards = _shard_counts(totals, caps, k * m)
    owners = _assign_shards(shards, k, m, rng)
    pieces: list[list[np.ndarray]] = [[] for _ in range(k)]
    for c, who in enumerate(owners):
        for client, shard in zip(who, np.array_split(pools[c], shards[c]) if shards[c] else []):
            pieces[client].append(shard)
    return [np.sort(np.concatenate(p)) for p in pieces]


def _sorted_shards(labels: np.ndarray, k: int, m: int, seed: int) -> list[np.ndarray]:
    """McMahan et al.'s sort-and-partition: the indices sorted by label, ties in a seeded
    random order, cut into k * m consecutive runs by ``np.array_split`` (sizes differ by at
    most one; no sample is dropped, where flwr-datasets' ShardPartitioner drops the last
    n mod (k * m)), and the runs dealt to the clients by a seeded permutation, m each."""
    n = labels.size
    if k * m > n:
        raise ConfigError(
            f"partition.num_clients * partition.classes_per_client = {k} * {m} = {k * m} shards "
            f"exceed the {n} training samples (mode sorted); allowed: classes_per_client <= {n // k} "
            f"at {k} clients, or num_clients <= {n // m} at classes_per_client {m}"
        )
    rng = partition_rng(seed, "shards", "sorted")
    runs = np.array_split(np.concatenate(_class_pools(labels, rng)), k * m)
    dealt = rng.permutation(k * m).reshape(k, m)
    return [np.sort(np.concatenate([runs[r] for r in row])) for row in dealt]


def _shard_counts(totals: np.ndarray, caps: np.ndarray, num_shards: int) -> np.ndarray:
    """Shards per class: every present class at least one (so no sample is dropped), at
    most its cap, otherwise proportional to class size, so shards are near-equal.

    Water-filling: find lam with sum(clip(lam * n_c, 1, cap_c)) = num_shards by bisection,
    floor, then hand out the few shards left one at a time to the class whose shards
    are largest (D'Hondt), which keeps sizes as even as the bounds allow.
    """
    present = totals > 0
    low = present.astype(np.int64)
    lo, hi = 0.0, float(np.max(caps[present] / totals[present]))
    for _ in range(100):
        lam = 0.5 * (lo + hi)
        if np.clip(lam * totals, low, caps).sum() < num_shards:
            lo = lam
        else:
            hi = lam
    out = np.clip(np.floor(lo * totals).astype(np.int64), low, caps)
    while (left := num_shards - int(out.sum())) != 0:
        if left > 0:
            size = np.where(out < caps, totals / (out + 1), -1.0)
            out[int(np.argmax(size))] += 1
        else:
            size = np.where(out > low, totals / np.maximum(out, 1), np.inf)
            out[int(np.argmin(size))] -= 1
    return out


def _realizable(degrees: np.ndarray, cap: np.ndarray, m: int) -> bool:
    """Gale-Ryser: can classes with these shard counts still go to clients with these free
    slots, one shard per client per class? Only t < m can fail, since every cap <= m."""
    d = np.sort(degrees[degrees > 0])[::-1]
    if int(d.sum()) != int(cap.sum()):
        return False
    t = np.arange(1, min(d.size, m) + 1)
    return bool(np.all(np.cumsum(d)[: t.size] <= np.minimum(cap[None, :], t[:, None]).sum(axis=1)))


def _assign_shards(
    shards: np.ndarray, k: int, m: int, rng: np.random.Generator, tries: int = 10
) -> list[np.ndarray]:
    """Which clients get class c's shards, each client m shards of distinct classes.

    Classes go in a random order, each to clients drawn at random (weighted by free slots);
    a draw is kept only if the rest stays realizable (Gale-Ryser), and after ``tries``
    refused draws the class goes to the clients with the most free slots, which always
    keeps it realizable. So the result is random, valid, and found in bounded time.
    """
    cap = np.full(k, m, dtype=np.int64)
    remaining = shards.copy()
    owners = [np.empty(0, dtype=np.int64) for _ in range(shards.size)]
    for c in rng.permutation(np.flatnonzero(shards > 0)):
        need = int(shards[c])
        remaining[c] = 0
        for _ in range(tries):
            pick = rng.choice(k, size=need, replace=False, p=cap / cap.sum())
            cap[pick] -= 1
            if _realizable(remaining, cap, m):
                break
            cap[pick] += 1
        else:
            pick = np.lexsort((rng.random(k), -cap))[:need]
            cap[pick] -= 1
        owners[c] = pick
    return owners


def split_natural(
    train_groups: np.ndarray, test_groups: np.ndarray | None, options: NaturalParams
) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Client k = the k-th natural group id (ascending), with its own test samples."""
    train_groups = _as_labels(train_groups)
    ids, inverse = np.unique(train_groups, return_inverse=True)
    if options.num_clients is not None and options.num_clients != ids.size:
        raise ConfigError(
            f"partition.num_clients: {options.num_clients} but the dataset has {ids.size} "
            f"natural groups; allowed: {ids.size} or null (all groups)"
        )
    order = np.argsort(inverse, kind="stable")
    train = np.split(order, np.cumsum(np.bincount(inverse, minlength=ids.size))[:-1])
    train = [t.astype(np.int64) for t in train]
    if test_groups is None:
        return train, None
    test_groups = _as_labels(test_groups)
    slot = np.searchsorted(ids, test_groups)
    known = (slot < ids.size) & (ids[np.minimum(slot, ids.size - 1)] == test_groups)
    where = np.flatnonzero(known)
    order = where[np.argsort(slot[where], kind="stable")]
    test = np.split(order, np.cumsum(np.bincount(slot[where], minlength=ids.size))[:-1])
    return train, [t.astype(np.int64) for t in test]


def domain_clients(options: DomainParams, names: tuple[str, ...]) -> list[int]:
    """Clients of each domain, checked against the dataset's domains."""
    per = options.clients_per_domain
    if isinstance(per, int):
        return [per] * len(names)
    if len(per) != len(names) or sum(per) == 0:
        raise ConfigError(
            f"partition.clients_per_domain: {per} but the dataset has {len(names)} domains "
            f"({', '.join(names)}); allowed: one count, or a list of {len(names)} counts, not all 0"
        )
    return list(per)


def split_domain(
    labels: np.ndarray, domains: np.ndarray, names: tuple[str, ...], options: DomainParams, seed: int
) -> list[np.ndarray]:
    """Domain d's training samples cut among its clients: a seeded permutation in near-equal
    parts (alpha None) or a Dirichlet label-skew draw; each domain draws from a generator of
    its own, so one domain's count or alpha never changes another domain's clients."""
    labels, domains = _as_labels(labels), _as_labels(domains)
    out: list[np.ndarray] = []
    for d, k in enumerate(domain_clients(options, names)):
        if k == 0:
            continue
        ix = np.flatnonzero(domains == d)
        need = k if options.alpha is None else k * options.min_size
        if need > ix.size:
            what = "clients" if options.alpha is None else f"clients x partition.min_size {options.min_size}"
            raise ConfigError(
                f"partition.clients_per_domain: {k} {what} need {need} samples but domain "
                f"{names[d]!r} has {ix.size} training samples; allowed: fewer clients for it"
                + ("" if options.alpha is None else " or a smaller min_size")
            )
        rng = partition_rng(seed, "domain", "train", d)
        if options.alpha is None:
            parts = np.array_split(rng.permutation(ix.size), k)
        else:
            parts = _dirichlet_parts(labels[ix], k, options.alpha, options.min_size, options.max_redraws, rng)
        out += [np.sort(ix[p]).astype(np.int64) for p in parts]
    return out


# ---------------------------------------------------------------------------------------
# Local test splits


def _largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integers proportional to ``weights`` summing to ``total`` (ties to the lower index)."""
    scaled = weights.astype(np.int64) * total
    out, rem = np.divmod(scaled, int(weights.sum()))
    out[np.argsort(-rem, kind="stable")[: total - int(out.sum())]] += 1
    return out


def local_test_splits(
    train_labels: np.ndarray,
    train: list[np.ndarray],
    test_labels: np.ndarray,
    min_local_test: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Each client's test split, with its training label proportions, from the global test set.

    Size max(min_local_test, round(n_test * n_k / n_train)); per class drawn without
    replacement, and with replacement only past a class's test samples. Classes with no
    test samples are left out of the proportions (a client holding only such classes gets
    the global test distribution). Splits of different clients may overlap.
    """
    train_labels, test_labels = _as_labels(train_labels), _as_labels(test_labels)
    if test_labels.size == 0:
        return [np.empty(0, dtype=np.int64) for _ in train]
    classes = int(max(train_labels.max(initial=0), test_labels.max(initial=0))) + 1
    per_class = np.bincount(test_labels, minlength=classes)
    pools = np.split(np.argsort(test_labels, kind="stable"), np.cumsum(per_class)[:-1])
    available = np.array([p.size for p in pools], dtype=np.int64)
    n_train, n_test = max(train_labels.size, 1), test_labels.size
    out = []
    for ix in train:
        size = max(min_local_test, int(np.floor(n_test * ix.size / n_train + 0.5)))
        weights = np.where(available > 0, np.bincount(train_labels[ix], minlength=classes), 0)
        if weights.sum() == 0:
            weights = available
        parts = []
        for c in np.flatnonzero(alloc := _largest_remainder(weights, size)):
            pool, want = pools[c], int(alloc[c])
            if want <= pool.size:
                parts.append(rng.choice(pool, size=want, replace=False))
            else:
                parts.append(pool)
                parts.append(rng.choice(pool, size=want - pool.size, replace=True))
        out.append(np.sort(np.concatenate(parts)).astype(np.int64))
    return out


# ---------------------------------------------------------------------------------------
# Registry entries


def _label_partition(name: str, split: Split) -> Callable[[Dataset, Any, int], Partition]:
    """Wrap a label-array core as ``factory(dataset, options, seed) -> Partition``."""

    def factory(dataset: Dataset, options: Any, seed: int) -> Partition:
        y_train = labels_of(dataset.y_train)
        train = split(y_train, options, seed)
        y_test = labels_of(dataset.y_test)
        test = local_test_splits(y_train, train, y_test, options.min_local_test, partition_rng(seed, name, "test"))
        return Partition(name=name, train=train, test=test, options=dataclasses.asdict(options))

    factory.__name__ = f"{name}_partition"
    return factory


PARTITIONS.register("iid", "IID: a seeded random equal split", IidParams)(_label_partition("iid", split_iid))
PARTITIONS.register(
    "dirichlet",
    "label skew: per class, client shares ~ Dir(alpha), as the papers define it (Hsu et al., MOON, FedDF); "
    "balance: the released codes' rule that stops filling clients above n / num_clients",
    DirichletParams,
)(_label_partition("dirichlet", split_dirichlet))
PARTITIONS.register(
    "shards",
    "label shards: classes_per_client shards each, of distinct classes (mode classes, fedrift's variant), "
    "or McMahan et al.'s sort-and-partition (mode sorted: runs of the label-sorted data dealt at random)",
    ShardsParams,
)(_label_partition("shards", split_shards))
PARTITIONS.register(
    "quantity", "quantity skew: client sizes ~ Dir(alpha) * n, labels iid", QuantityParams
)(_label_partition("quantity", split_quantity))


@PARTITIONS.register(
    "natural", "the dataset's own groups (writers, devices): client k = group k", NaturalParams
)
def natural_partition(dataset: Dataset, options: NaturalParams, seed: int) -> Partition:
    """Client k holds group k's training samples and its own test samples."""
    if dataset.train_groups is None:
        raise ConfigError(
            f"partition.name: natural needs a dataset with natural client groups, and "
            f"{dataset.name!r} has none; allowed: a dataset with groups, such as synthetic"
        )
    train, test = split_natural(dataset.train_groups, dataset.test_groups, options)
    if test is None:  # groups for training only: fall back to label-proportional splits
        y_train, y_test = labels_of(dataset.y_train), labels_of(dataset.y_test)
        least = PartitionParams().min_local_test
        test = local_test_splits(y_train, train, y_test, least, partition_rng(seed, "natural", "test"))
    return Partition(name="natural", train=train, test=test, options=dataclasses.asdict(options))


@PARTITIONS.register(
    "domain", "feature skew: each client's data from one domain (clients_per_domain), optional label skew inside",
    DomainParams,
)
def domain_partition(dataset: Dataset, options: DomainParams, seed: int) -> Partition:
    """Clients domain by domain. A client's local test split has its label proportions and
    comes from its own domain's test samples when the dataset marks them, else from the
    global test set (every domain), as the label partitions' splits do."""
    if dataset.train_domains is None:
        raise ConfigError(
            f"partition.name: domain needs a dataset with domains, and {dataset.name!r} has none; "
            f"allowed: a multi-domain dataset (digits_domains, office_caltech10)"
        )
    names = dataset.domain_names
    y_train, y_test = labels_of(dataset.y_train), labels_of(dataset.y_test)
    train = split_domain(y_train, dataset.train_domains, names, options, seed)
    per = domain_clients(options, names)
    owner = np.repeat(np.arange(len(names)), per)  # client -> domain
    test: list[np.ndarray] = [np.empty(0, np.int64)] * len(train)
    for d in np.unique(owner):
        mine = np.flatnonzero(owner == d)
        rng = partition_rng(seed, "domain", "test", int(d))
        if dataset.test_domains is None:
            splits = local_test_splits(y_train, [train[k] for k in mine], y_test, options.min_local_test, rng)
        else:
            dtr, dte = np.flatnonzero(dataset.train_domains == d), np.flatnonzero(dataset.test_domains == d)
            local = [np.searchsorted(dtr, train[k]) for k in mine]
            splits = [dte[s] for s in local_test_splits(y_train[dtr], local, y_test[dte], options.min_local_test, rng)]
        for k, s in zip(mine, splits):
            test[k] = s
    opts = dataclasses.asdict(options) | {"domains": [names[d] for d in owner]}
    return Partition(name="domain", train=train, test=test, options=opts)


def partition_dataset(
    dataset: Dataset, name: str, options: Any = None, seed: int = 0, holdout: float = 0.0, val_share: float = 0.0
) -> Partition:
    """Partition ``dataset`` with registry entry ``name``.

    ``options`` is an instance of the entry's params class (None: its defaults; a mapping
    is validated as a config section would be). ``holdout``: the share of the training set
    the server keeps (stratified by class, seeded); the partition splits the rest, so no
    client ever holds a held-out sample. ``val_share``: the share of each client's samples
    set aside as its validation split (:func:`split_validation`), after the partition is
    drawn, so the partition itself does not depend on it.
    """
    part = _partition(dataset, name, options, seed, holdout)
    if val_share <= 0:
        return part
    train, val = split_validation(labels_of(dataset.y_train), part.train, val_share, seed)
    if not any(len(v) for v in val):
        sizes = part.sizes()
        raise ConfigError(
            f"partition.val_share: {val_share} gives no client a validation sample (clients hold "
            f"{int(sizes.min())} to {int(sizes.max())} samples); allowed: a larger share, or 0 for no validation split"
        )
    return dataclasses.replace(part, train=train, val=val)


def _partition(dataset: Dataset, name: str, options: Any, seed: int, holdout: float) -> Partition:
    """The entry's split of the training samples the server does not hold."""
    entry = PARTITIONS.get(name, "partition.name")
    if options is None:
        options = entry.params()
    elif isinstance(options, Mapping):
        from fedrift.config import validate_options

        options = validate_options("partition", entry.params, dict(options))
    elif not isinstance(options, entry.params):
        raise TypeError(f"partition {name!r} takes {entry.params.__name__}, got {type(options).__name__}")
    if holdout <= 0:
        return entry.factory(dataset, options, seed)
    held = split_holdout(labels_of(dataset.y_train), holdout, partition_rng(seed, "holdout", "server"))
    keep = np.setdiff1d(np.arange(dataset.num_train), held)
    groups = None if dataset.train_groups is None else dataset.train_groups[keep]
    domains = None if dataset.train_domains is None else dataset.train_domains[keep]
    rest = dataclasses.replace(
        dataset, x_train=dataset.x_train[keep], y_train=dataset.y_train[keep], train_groups=groups, train_domains=domains
    )
    part = entry.factory(rest, options, seed)
    return dataclasses.replace(part, train=[keep[ix] for ix in part.train], holdout=held)


def split_validation(
    labels: np.ndarray, train: list[np.ndarray], share: float, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's training samples split into (train, validation), stratified per client.

    Client k with n_k samples gives ``floor(share * n_k + 1/2)`` of them (at most n_k - 1:
    it keeps one to train on) to validation, spread over its classes in proportion to its
    class counts (largest remainder, so class c gives floor or ceil of its exact share),
    drawn at random within each class by a generator of its own per (seed, client): a pure
    function of seed and the partition. The remaining training samples keep their order.
    """
    labels = _as_labels(labels)
    keep, val = [], []
    for k, ix in enumerate(train):
        ix = np.asarray(ix, dtype=np.int64)
        take = min(ix.size - 1, int(np.floor(share * ix.size + 0.5))) if ix.size > 1 else 0
        if take <= 0:
            keep.append(ix)
            val.append(np.zeros(0, dtype=np.int64))
            continue
        rng = partition_rng(seed, "validation", "client", k)
        own = labels[ix]
        classes, counts = np.unique(own, return_counts=True)
        alloc = _largest_remainder(counts, take)
        picked = [rng.choice(ix[own == c], size=int(a), replace=False) for c, a in zip(classes, alloc) if a]
        chosen = np.sort(np.concatenate(picked)).astype(np.int64)
        keep.append(ix[~np.isin(ix, chosen)])
        val.append(chosen)
    return keep, val


def split_holdout(labels: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of ``round(share * n_c)`` samples of every class c (at least one of a
    class with two or more samples), drawn without replacement."""
    out = []
    for c in np.unique(labels):
        ix = np.flatnonzero(labels == c)
        take = min(len(ix) - 1, max(1, round(share * len(ix)))) if len(ix) > 1 else 0
        out.append(rng.choice(ix, size=take, replace=False))
    return np.sort(np.concatenate(out)).astype(np.int64) if out else np.zeros(0, dtype=np.int64)


__all__ = [
    "PARTITIONS",
    "DirichletParams",
    "DomainParams",
    "IidParams",
    "NaturalParams",
    "PartitionParams",
    "QuantityParams",
    "ShardsParams",
    "labels_of",
    "local_test_splits",
    "partition_dataset",
    "partition_rng",
    "split_dirichlet",
    "split_domain",
    "split_holdout",
    "split_iid",
    "split_natural",
    "split_quantity",
    "split_shards",
    "split_validation",
]
