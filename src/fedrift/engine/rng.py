"""Every random draw is a pure function of (seed, purpose, round, client, ...).

Reorder the work, change the executor, or skip a client, and no other draw moves: this is
what makes all executors see the same batches and reruns give identical metrics.
"""

from __future__ import annotations

import numpy as np

# Purpose tags keep independent streams apart.
SAMPLING = 1
BATCHES = 2


def generator(seed: int, purpose: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, purpose, *keys])
