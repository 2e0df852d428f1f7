"""Client samplers (registry ``SAMPLERS``): which clients train in a round."""

from __future__ import annotations

import numpy as np

from fedrift.engine import rng
from fedrift.registry import Registry

SAMPLERS: Registry = Registry("sampler")


@SAMPLERS.register("uniform", "m clients drawn uniformly without replacement each round")
def uniform(num_clients: int, m: int, seed: int, round_: int, label_counts: np.ndarray) -> list[int]:
    g = rng.generator(seed, rng.SAMPLING, round_)
    return sorted(int(k) for k in g.choice(num_clients, size=m, replace=False))


def cohort_size(num_clients: int, clients_per_round: int | None, participation: float | None) -> int:
    """m from a count or a fraction C (at least one client); the default is C = 0.2."""
    if clients_per_round is not None:
        return clients_per_round
    frac = 0.2 if participation is None else participation
    return max(1, int(round(frac * num_clients)))
