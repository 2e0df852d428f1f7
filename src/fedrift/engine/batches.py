"""Local batch schedules: which of a client's samples each local step sees."""

from __future__ import annotations

import math

import numpy as np

from fedrift.functional import rng


def num_steps(n: int, batch_size: int, epochs: int, steps: int | None) -> int:
    """H_k: ``steps`` if given, else epochs x ceil(n / batch_size) (the last batch is kept)."""
    return steps if steps is not None else epochs * math.ceil(n / batch_size)


def schedule_table(
    n: int, batch_size: int, epochs: int, steps: int | None, seed: int, round_: int, client: int
) -> np.ndarray:
    """Positions (0..n-1) per local step, one row per step, ``-1`` after a short batch's end:
    a fresh permutation per epoch, cut into batches of ``min(batch_size, n)``.

    The last, smaller batch of an epoch is kept, so every sample weighs the same; with a
    fixed ``steps`` budget, epochs repeat until it is spent.
    """
    total = num_steps(n, batch_size, epochs, steps)
    width = max(1, min(batch_size, n))
    per_epoch = math.ceil(n / width)
    g = rng.generator(seed, rng.BATCHES, round_, client)
    epochs_drawn = math.ceil(total / per_epoch)
    table = np.full((epochs_drawn * per_epoch, width), -1, dtype=np.int64)
    flat = table.reshape(-1, per_epoch * width)  # one row per epoch
    # one independent permutation per row, in one call (a loop of permutation() cost 3x more)
    flat[:, :n] = g.permuted(np.tile(np.arange(n, dtype=np.int64), (epochs_drawn, 1)), axis=1)
    return table[:total]


def schedule(
    n: int, batch_size: int, epochs: int, steps: int | None, seed: int, round_: int, client: int
) -> list[np.ndarray]:
    """``schedule_table`` as a list of each step's positions."""
    return [row[row >= 0] for row in schedule_table(n, batch_size, epochs, steps, seed, round_, client)]
