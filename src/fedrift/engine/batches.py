"""Local batch schedules: which of a client's samples each local step sees."""

from __future__ import annotations

import math

import numpy as np

from fedrift.engine import rng


def num_steps(n: int, batch_size: int, epochs: int, steps: int | None) -> int:
    """H_k: ``steps`` if given, else epochs x ceil(n / batch_size) (the last batch is kept)."""
    return steps if steps is not None else epochs * math.ceil(n / batch_size)


def schedule(
    n: int, batch_size: int, epochs: int, steps: int | None, seed: int, round_: int, client: int
) -> list[np.ndarray]:
    """Positions (0..n-1) per local step: a fresh permutation per epoch, cut into batches.

    The last, smaller batch of an epoch is kept, so every sample weighs the same; with a
    fixed ``steps`` budget, epochs repeat until it is spent.
    """
    total = num_steps(n, batch_size, epochs, steps)
    g = rng.generator(seed, rng.BATCHES, round_, client)
    out: list[np.ndarray] = []
    while len(out) < total:
        perm = g.permutation(n)
        out.extend(perm[i : i + batch_size] for i in range(0, n, batch_size))
    return out[:total]
