"""Client samplers (registry ``SAMPLERS``): which clients train in a round."""

from __future__ import annotations

import numpy as np

from fedrift.functional import rng
from fedrift.errors import ConfigError
from fedrift.registry import Registry

SAMPLERS: Registry = Registry("sampler")


@SAMPLERS.register("uniform", "m clients drawn uniformly without replacement each round")
def uniform(num_clients: int, m: int, seed: int, round_: int, label_counts: np.ndarray, retries: int = 0) -> list[int]:
    g = rng.generator(seed, rng.SAMPLING, round_)
    return sorted(int(k) for k in g.choice(num_clients, size=m, replace=False))


def cohort_size(num_clients: int, clients_per_round: int | None, participation: float | None) -> int:
    """m from a count or a fraction C (at least one client); the default is C = 0.2. A count
    above the partition's clients is refused (``fedrift.api`` asks before writing anything)."""
    if clients_per_round is not None:
        if clients_per_round > num_clients:
            raise ConfigError(
                f"train.clients_per_round: {clients_per_round} but the partition has {num_clients} clients; "
                f"allowed: 1..{num_clients}"
            )
        return clients_per_round
    frac = 0.2 if participation is None else participation
    return max(1, int(round(frac * num_clients)))


@SAMPLERS.register(
    "class_coverage",
    "uniform, but the round's clients must hold every class between them (FedADC's selection)",
)
def class_coverage(
    num_clients: int, m: int, seed: int, round_: int, label_counts: np.ndarray, retries: int = 100
) -> list[int]:
    """Uniform draws rejected until the cohort's labels cover every class held by anyone.

    After ``retries`` rejected draws, randomised greedy covers are tried (each pick adds the
    most uncovered classes, ties broken at random, free slots filled uniformly); the best
    coverage found is returned. Whenever m >= the number of classes a cover exists and the
    greedy one fits, so the result always covers then.
    """
    g = rng.generator(seed, rng.SAMPLING, round_)
    holds = np.asarray(label_counts) > 0
    target = int(holds.any(0).sum())
    best, best_cov = None, -1
    for _ in range(retries):
        pick = g.choice(num_clients, size=m, replace=False)
        cov = int(holds[pick].any(0).sum())
        if cov == target:
            return sorted(int(k) for k in pick)
        if cov > best_cov:
            best, best_cov = pick, cov
    for _ in range(retries):
        pick = _greedy_cover(holds, m, g)
        cov = int(holds[pick].any(0).sum())
        if cov > best_cov:
            best, best_cov = pick, cov
        if cov == target:
            break
    return sorted(int(k) for k in best)


def _greedy_cover(holds: np.ndarray, m: int, g: np.random.Generator) -> np.ndarray:
    chosen: list[int] = []
    covered = np.zeros(holds.shape[1], dtype=bool)
    free = np.ones(holds.shape[0], dtype=bool)
    while len(chosen) < m:
        gain = (holds & ~covered).sum(1) * free
        if gain.max() == 0:
            break
        k = int(g.choice(np.flatnonzero(gain == gain.max())))
        chosen.append(k)
        free[k] = False
        covered |= holds[k]
    rest = g.choice(np.flatnonzero(free), size=m - len(chosen), replace=False)
    return np.concatenate([np.asarray(chosen, dtype=np.int64), rest.astype(np.int64)])


def eval_clients(num_clients: int, sample: int, seed: int) -> list[int]:
    """The clients whose own models are evaluated (personal models, personalisation): all of
    them, in order, up to ``sample`` clients; else ``sample`` of them drawn without
    replacement by the seed (once per run, so every round sees the same panel), sorted."""
    if num_clients <= sample:
        return list(range(num_clients))
    g = rng.generator(seed, rng.EVAL_CLIENTS)
    return sorted(int(k) for k in g.choice(num_clients, size=sample, replace=False))
